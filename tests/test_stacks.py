"""The same promises on every stack: aiohttp, requests, httpx (sync, asyncio, trio).

Each test runs on every way of ``ways.EVERY_WAY``, through gql's client, against the
emulator on 127.0.0.1, and checks what the service saw (its counters) and what the caller
got. A test of one stack's own behaviour says so, and runs on those stacks alone.
"""

from __future__ import annotations

import copy
import io
import logging
import pickle
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
import yarl
from gql import Client, FileVar, GraphQLRequest
from gql.transport import httpx as gql_httpx
from gql.transport.exceptions import (
    TransportConnectionFailed,
    TransportQueryError,
    TransportServerError,
)
from support import (
    COUNT,
    NO_WAIT,
    ONE_ATTEMPT,
    RENAME,
    UPLOAD,
    bare_401s,
    collect_garbage,
    exception_chain,
    refused_tenant_cost,
    serving,
    shown,
    tenants,
    upload,
)
from ways import AIOHTTP, EVERY_WAY, WAYS, Call, Way, calls

from gql_service_auth import (
    ApiKeyRejectedError,
    ApiKeyRejectedHTTPError,
    AuthEvent,
    RetryPolicy,
    TokenRequestError,
    UnauthenticatedError,
    UnauthenticatedHTTPError,
)
from gql_service_auth._core.sharing import SHARED
from gql_service_auth.emulator import ClientRecord, Emulator, ManualClock

ANSWER = {"carriers": {"totalCount": 25}}


@pytest.fixture(params=EVERY_WAY, ids=lambda way: way.name)
def way(request: pytest.FixtureRequest) -> Way:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def oauth2(
    emulator: Emulator, clock: ManualClock, events: list[AuthEvent], way: Way
) -> Callable[..., Any]:
    def make(**kwargs: Any) -> Any:
        client = kwargs.pop("client", emulator.recent_client)
        kwargs.setdefault("retry", NO_WAIT)
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("on_event", events.append)
        return way.oauth2(
            kwargs.pop("url", emulator.graphql_url),
            token_url=emulator.token_url,
            client_id=client.client_id,
            client_secret=kwargs.pop("client_secret", client.client_secret),
            **kwargs,
        )

    return make


def _of_method(way: Way, method: str, emulator: Emulator, oauth2: Callable[[], Any]) -> Any:
    """The way's API key transport for the emulator's recent client, or ``oauth2()``."""
    if method != "api_key":
        return oauth2()
    client = emulator.recent_client
    return way.api_key(
        emulator.graphql_url, client_id=client.client_id, client_secret=client.client_secret
    )


def answers(results: list[object]) -> list[object]:
    """``results``, with any exception raised so the test shows it."""
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def test_concurrent_callers_share_one_token_fetch(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    emulator.token_latency = 0.2  # every caller arrives while the fetch is under way
    assert answers(way.run(oauth2(), calls(COUNT, 8))) == [ANSWER] * 8
    assert emulator.counters.token_requests == 1


def test_revoked_token_is_renewed_once_and_the_requests_sent_again(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    transport = oauth2()
    way.one(transport, Call(COUNT))
    emulator.revoke_tokens()
    assert answers(way.run(transport, calls(COUNT, 6))) == [ANSWER] * 6
    counters = emulator.counters
    assert counters.token_requests == 2
    # Each request refused (all of them, or those sent before the renewal landed) went
    # again once, with the one renewed token.
    assert counters.unauthenticated_responses >= 1
    assert counters.graphql_requests == 1 + 6 + counters.unauthenticated_responses


def test_token_is_renewed_ahead_of_expiry_without_a_refusal(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator, clock: ManualClock
) -> None:
    emulator.token_ttl = 100
    transport = oauth2(refresh_margin=10)
    way.one(transport, Call(COUNT))
    clock.advance(95)
    way.one(transport, Call(COUNT))  # starts the renewal, sent with the current token
    clock.advance(10)  # past the first token's expiry
    way.one(transport, Call(COUNT))
    assert emulator.counters.token_requests == 2
    assert emulator.counters.unauthenticated_responses == 0


def test_a_mutation_refused_while_it_ran_is_never_sent_twice(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    transport = oauth2()
    emulator.refuse_fields(1)
    with pytest.raises(UnauthenticatedError, match="may have changed something"):
        way.one(transport, Call(RENAME))
    assert emulator.counters.mutations_run == 1
    assert emulator.counters.graphql_requests == 1
    assert way.one(transport, Call(COUNT)) == ANSWER  # the next call renews


def test_a_query_refused_while_it_ran_is_sent_again(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    emulator.refuse_fields(1)
    assert way.one(oauth2(), Call(COUNT)) == ANSWER
    assert emulator.counters.graphql_requests == 2


def test_a_batch_refused_before_it_ran_is_sent_again_whole(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    transport = oauth2()
    way.one(transport, Call(COUNT))
    emulator.revoke_tokens()
    batch = [GraphQLRequest(COUNT), GraphQLRequest(COUNT)]
    assert way.one(transport, Call(batch)) == [ANSWER, ANSWER]
    assert emulator.counters.token_requests == 2


def test_a_refused_upload_is_sent_again_whole_or_not_at_all(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    # timeout: were a body that cannot be rewound sent again, it would hang until it.
    transport = oauth2(timeout=10) if way.name == "requests" else oauth2()
    way.one(transport, Call(COUNT))
    emulator.revoke_tokens()
    data = b"0123456789" * 1000
    sending = Call(upload(data), {"upload_files": True})
    if way.replays_uploads:  # httpx seeks the file back: the re-send is whole
        assert way.one(transport, sending) == {
            "uploadDocument": {"filename": "note.txt", "size": len(data)}
        }
    else:  # gql's MultipartEncoder cannot be rewound: the token is dropped, no re-send
        with pytest.raises(UnauthenticatedError, match="uploads files"):
            way.one(transport, sending)
        assert emulator.counters.graphql_requests == 2
        assert way.one(transport, Call(upload(data), {"upload_files": True})) == {
            "uploadDocument": {"filename": "note.txt", "size": len(data)}
        }
    assert emulator.counters.mutations_run == 1


class _OneWay(io.RawIOBase):
    """A file that reads once and cannot seek, as a pipe or a socket."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = min(len(buffer), len(self._data))
        buffer[:size], self._data = self._data[:size], self._data[size:]
        return size


@pytest.mark.parametrize("way", [w for w in WAYS if w.replays_uploads], ids=lambda w: w.name)
def test_an_upload_that_cannot_seek_is_never_sent_again_empty(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    transport = oauth2()
    way.one(transport, Call(COUNT))
    emulator.revoke_tokens()
    file = FileVar(_OneWay(b"x" * 5000), filename="pipe.bin")
    request = GraphQLRequest(UPLOAD, variable_values={"file": file})
    with pytest.raises(UnauthenticatedError, match="uploads files"):
        way.one(transport, Call(request, {"upload_files": True}))
    assert emulator.counters.graphql_requests == 2
    assert emulator.counters.mutations_run == 0


def test_renewals_are_bounded_and_end_with_gqls_401_error(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    bare_401s(emulator)
    emulator.refuse_all_tokens = True
    with pytest.raises(UnauthenticatedHTTPError) as caught:
        way.one(oauth2(max_renewals=2), Call(COUNT))
    assert isinstance(caught.value, TransportQueryError)
    assert isinstance(caught.value, TransportServerError)
    assert caught.value.code == 401
    assert emulator.counters.graphql_requests == 3


def test_a_call_failing_fast_in_a_pause_after_bare_401s_is_gqls_401_error_too(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    """Renewals spent on bare 401s pause them: the next call fails at once, and as gql's
    401 error (UnauthenticatedHTTPError), as the calls that met the 401s did (before, on
    requests and httpx: an UnauthenticatedError, which code catching gql's 401 missed)."""
    bare_401s(emulator)
    emulator.refuse_all_tokens = True
    transport = oauth2(retry=RetryPolicy(wait_initial=5, wait_max=5, wait_jitter=0))
    with pytest.raises(UnauthenticatedHTTPError):
        way.one(transport, Call(COUNT))
    with pytest.raises(UnauthenticatedHTTPError, match="paused") as paused:
        way.one(transport, Call(COUNT))
    assert paused.value.code == 401
    assert isinstance(paused.value.__cause__, TransportServerError)
    assert emulator.counters.graphql_requests == 2  # nothing sent while paused


def test_a_token_endpoint_failure_is_a_token_request_error_not_a_connection_failure(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    with pytest.raises(TokenRequestError) as caught:
        way.one(oauth2(client_secret="wrong-secret", retry=ONE_ATTEMPT), Call(COUNT))
    assert not isinstance(caught.value, TransportConnectionFailed)
    assert isinstance(caught.value, TransportQueryError)  # what except clauses catch
    assert emulator.counters.graphql_requests == 0


@pytest.mark.parametrize("batch", [False, True], ids=["execute", "batch"])
@pytest.mark.parametrize("method", ["api_key", "oauth2"])
def test_the_callers_own_authorization_is_sent_as_it_is_and_never_again(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator, method: str, batch: bool
) -> None:
    """Given in extra_args (any case): neither replaced nor sent again, on every stack."""
    headers = {"authorization": "Bearer not-ours"}
    own = Call([GraphQLRequest(COUNT)] if batch else COUNT, {"extra_args": {"headers": headers}})
    transport = _of_method(way, method, emulator, lambda: oauth2())
    with pytest.raises(TransportQueryError) as caught:
        way.one(transport, own)
    assert not isinstance(caught.value, UnauthenticatedError | ApiKeyRejectedError)
    assert emulator.counters.token_requests == 0
    assert [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"] == [
        "Bearer not-ours"
    ]


# requests takes its headers as a mapping only.
@pytest.mark.parametrize(
    "way", [w for w in EVERY_WAY if w.name != "requests"], ids=lambda w: w.name
)
@pytest.mark.parametrize("own", [False, True], ids=["other-headers", "own-authorization"])
def test_headers_given_as_an_iterator_arrive_whole(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator, own: bool
) -> None:
    """Headers in extra_args as an iterator of pairs are read once, and all sent."""
    pairs = [("X-Trace", "t-1")] + ([("Authorization", "Bearer not-ours")] if own else [])
    call = Call(COUNT, {"extra_args": {"headers": iter(pairs)}})
    if own:
        with pytest.raises(TransportQueryError):
            way.one(oauth2(), call)
    else:
        assert way.one(oauth2(), call) == ANSWER
    (sent,) = [r.headers for r in emulator.requests if r.path == "/graphql"]
    assert sent["X-Trace"] == "t-1"
    assert sent["Authorization"].startswith("Bearer not-ours" if own else "Bearer ")


@pytest.mark.parametrize("way", [w for w in WAYS if w.loop is None], ids=lambda w: w.name)
@pytest.mark.parametrize("method", ["api_key", "oauth2"])
def test_the_transports_own_client_signs_only_its_apis_origin(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator, method: str
) -> None:
    """A request the caller sends through the transport's client to another origin
    (localhost is not 127.0.0.1) goes unsigned."""
    transport = _of_method(way, method, emulator, lambda: oauth2())
    other = emulator.graphql_url.replace("127.0.0.1", "localhost")
    with Client(transport=transport):
        http = transport.session if way.name == "requests" else transport.client
        http.post(other, json={"query": "{ carriers(first: 1) { totalCount } }"})
    (sent,) = [r.headers for r in emulator.requests if r.path == "/graphql"]
    assert "Authorization" not in sent
    assert emulator.counters.token_requests == 0


@pytest.mark.parametrize("method", ["api_key", "oauth2"])
def test_a_connected_transport_copies_and_pickles_and_the_copies_work(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator, method: str
) -> None:
    """copy.deepcopy and pickle of a transport in use copy its settings; each copy
    connects anew and shares the token (httpx's could not be copied while connected)."""
    transport = _of_method(
        way, method, emulator, lambda: oauth2(clock=time.monotonic, on_event=None)
    )
    copies: list[Any] = []

    def copy_it() -> object:
        copies.extend([copy.deepcopy(transport), pickle.loads(pickle.dumps(transport))])
        return ANSWER

    way.run(transport, [Call(COUNT), Call(COUNT)])
    if way.loop is None:  # connected: a sync session stays open between calls
        with Client(transport=transport) as session:
            session.execute(COUNT)
            copy_it()
    else:
        copy_it()
    for copied in copies:
        assert way.one(copied, Call(COUNT)) == ANSWER
    assert emulator.counters.token_requests == (1 if method == "oauth2" else 0)


def test_api_key_is_sent_and_a_refused_one_explained(way: Way, emulator: Emulator) -> None:
    def api_key(client: Any) -> Any:
        return way.api_key(
            emulator.graphql_url, client_id=client.client_id, client_secret=client.client_secret
        )

    assert way.one(api_key(emulator.recent_client), Call(COUNT)) == ANSWER
    # The advice names the OAuth2 transport of the caller's own stack.
    advice = f"2024-05-13.*Use {way.oauth2.__name__} with the same credentials"
    with pytest.raises(ApiKeyRejectedError, match=advice):
        way.one(api_key(emulator.legacy_client), Call(COUNT))
    bare_401s(emulator)
    with pytest.raises(ApiKeyRejectedHTTPError, match=advice) as caught:
        way.one(api_key(emulator.legacy_client), Call(COUNT))
    assert caught.value.code == 401
    assert emulator.counters.token_requests == 0


def test_no_secret_shows_in_a_server_error(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    transport = oauth2()
    way.one(transport, Call(COUNT))
    emulator.fail_graphql_requests(1, 500, body="upstream failed")
    with pytest.raises(TransportServerError) as caught:
        way.one(transport, Call(COUNT))
    token = transport.token.value
    assert shown(caught.value, [token, emulator.recent_client.client_secret]) == []


@pytest.mark.parametrize("way", [w for w in WAYS if w.loop is None], ids=lambda w: w.name)
def test_a_sync_call_works_where_an_event_loop_runs(way: Way, oauth2: Callable[..., Any]) -> None:
    """As in Jupyter, whose cells run inside a running asyncio loop."""
    import asyncio

    async def cell() -> object:
        return Client(transport=oauth2()).execute(COUNT)

    assert asyncio.run(cell()) == ANSWER


def test_a_refusal_with_data_under_any_content_type_never_runs_a_mutation_twice(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    """gql reads a GraphQL answer whatever its content type: so does the decision."""
    refusal = {
        "data": None,
        "errors": [{"message": "no", "path": ["renameCarrier"], **_UNAUTHENTICATED}],
    }
    emulator.fail_graphql_requests(1, 401, body=refusal, headers={"Content-Type": "text/plain"})
    with pytest.raises(UnauthenticatedError, match="may have changed something"):
        way.one(oauth2(), Call(RENAME))
    assert emulator.counters.graphql_requests == 1


_UNAUTHENTICATED = {"extensions": {"code": "UNAUTHENTICATED"}}


@pytest.mark.parametrize("content_type", ["multipart/mixed; boundary=x", "text/event-stream"])
def test_a_refusal_under_a_stream_content_type_is_read_as_gql_reads_it(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator, content_type: str
) -> None:
    """A transport's call is read whole by gql, whatever its content type: a refusal
    before the query ran is renewed and sent again on every stack, as any other."""
    transport = oauth2()
    way.one(transport, Call(COUNT))
    refusal = {"data": None, "errors": [{"message": "expired", **_UNAUTHENTICATED}]}
    emulator.fail_graphql_requests(1, body=refusal, headers={"Content-Type": content_type})
    assert answers(way.run(transport, [Call(COUNT)])) == [ANSWER]
    assert emulator.counters.token_requests == 2
    assert emulator.counters.graphql_requests == 3


def test_a_transport_keeps_no_secret_where_vars_shows_it(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    client = emulator.recent_client
    api_key = way.api_key(
        emulator.graphql_url, client_id=client.client_id, client_secret=client.client_secret
    )
    transport = oauth2()
    way.one(transport, Call(COUNT))
    way.one(api_key, Call(COUNT))
    for shown_object in (api_key, transport):
        text = repr(vars(shown_object)) + repr(shown_object)
        assert client.client_secret not in text
        assert transport.token.value not in text


def test_an_answer_quoting_the_credential_in_a_header_shows_it_nowhere_in_vars(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    """A server that echoes the Authorization it was sent in a header of its answer: gql's
    response_headers still give it to the caller who reads them, but vars() of the
    transport, and its copies, do not show it (before: vars() held the last answer's
    headers, on every stack)."""
    from aiohttp import web

    async def echo(request: web.Request) -> web.Response:
        await request.read()
        sent = request.headers.get("Authorization", "")
        return web.json_response({"data": ANSWER}, headers={"X-Echo": sent})

    client = emulator.recent_client
    with serving(lambda app: app.router.add_post("/graphql", echo)) as base:
        api_key = way.api_key(
            f"{base}/graphql", client_id=client.client_id, client_secret=client.client_secret
        )
        transport = oauth2(url=f"{base}/graphql")
        for built in (api_key, transport):
            assert way.one(built, Call(COUNT)) == ANSWER
            echoed = built.response_headers["X-Echo"]
            assert echoed.startswith(("Bearer ", "SERVICE-API-KEY "))
            for shown_object in (built, copy.copy(built)):
                assert echoed not in repr(vars(shown_object)), shown_object
                assert echoed.split(" ", 1)[1] not in repr(vars(shown_object))


def test_the_same_events_and_log_records_as_on_aiohttp(
    way: Way,
    oauth2: Callable[..., Any],
    emulator: Emulator,
    events: list[AuthEvent],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A revoked token: fetched, refused, renewed for the refusal, the request sent again."""
    caplog.set_level(logging.DEBUG, logger="gql_service_auth")
    transport = oauth2()
    way.one(transport, Call(COUNT))
    emulator.revoke_tokens()
    way.one(transport, Call(COUNT))
    # The fetch's thread logs a token just after handing it over: wait for the last one.
    deadline = time.monotonic() + 10
    while len(_ours(caplog)) < len(events) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(e.name, e.reason) for e in events] == [
        ("token_fetched", "initial"),
        ("token_rejected", None),
        ("request_retry_scheduled", None),
        ("token_fetched", "rejected"),
    ]
    assert sorted(r.getMessage().split(" ", 1)[0] for r in _ours(caplog)) == sorted(
        f"gql_service_auth.{e.name}" for e in events
    )
    secrets = [transport.token.value, emulator.recent_client.client_secret]
    assert not [r for r in caplog.records if any(s in r.getMessage() for s in secrets)]


def _ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gql_service_auth"]


def _forbidden(text: str) -> dict[str, object]:
    error = {"message": f"not allowed for {text}", "extensions": {"code": "FORBIDDEN"}}
    return {"data": None, "errors": [error]}


def test_a_credential_quoted_back_by_the_api_is_scrubbed_from_the_error(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    client = emulator.recent_client
    api_key = way.api_key(
        emulator.graphql_url, client_id=client.client_id, client_secret=client.client_secret
    )
    quoted = f"{client.client_id}:{client.client_secret}"
    emulator.fail_graphql_requests(1, body=_forbidden(quoted))
    with pytest.raises(TransportQueryError) as caught:
        way.one(api_key, Call(COUNT))
    assert "***" in str(caught.value)
    assert shown(caught.value, [client.client_secret]) == []
    transport = oauth2()
    way.one(transport, Call(COUNT))
    token = transport.token.value
    emulator.fail_graphql_requests(1, body=[_forbidden(f"Bearer {token}")])
    with pytest.raises(TransportQueryError) as caught:
        way.one(transport, Call([GraphQLRequest(COUNT)]))
    assert "***" in str(caught.value)
    assert shown(caught.value, [token, client.client_secret]) == []


def test_a_timed_out_call_leaves_no_credential_in_its_chain(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    """The stack's own timeout cuts the request: its chain's frames hold no credential."""
    transport = oauth2(timeout=0.3)
    way.one(transport, Call(COUNT))  # a token first, so the GraphQL request times out
    emulator.graphql_latency = 2.0
    (outcome,) = way.run(transport, [Call(COUNT)])
    assert isinstance(outcome, Exception)
    # gql wraps httpx's ReadTimeout in TransportConnectionFailed; requests' is raised as is.
    chain = [type(e).__name__ for e in exception_chain(outcome)]
    assert any("Timeout" in name for name in chain), chain
    token = transport.token.value
    assert shown(outcome, [token, emulator.recent_client.client_secret]) == []


_REFUSED = {"data": None, "errors": [{"message": "expired", **_UNAUTHENTICATED}]}


# httpx's alone: follow_redirects= is its keyword; requests re-sends through the connection,
# which follows no redirect; aiohttp's transports end a call refused through a redirect
# (tests/test_redirects.py).
@pytest.mark.parametrize("way", [w for w in WAYS if w.name != "requests"], ids=lambda w: w.name)
def test_a_resend_redirected_to_another_host_is_not_taken_for_a_refusal_of_the_new_token(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    """The stack drops our credentials on the way to another host: what that host answers
    says nothing of the renewed token, which is neither dropped nor renewed again."""
    with Emulator(host="127.0.0.2").run_in_thread() as other:
        transport = oauth2(follow_redirects=True, max_renewals=2)
        way.one(transport, Call(COUNT))
        emulator.fail_graphql_requests(1, body=_REFUSED)
        emulator.fail_graphql_requests(5, 307, body=b"", headers={"Location": other.graphql_url})
        with pytest.raises(TransportQueryError):  # the other host refuses a request without
            way.one(transport, Call(COUNT))
        assert [("Authorization" in r.headers) for r in other.requests] == [False]
    assert emulator.counters.token_requests == 2  # the first, and one renewal: no more


# The stacks that send the request a redirect led to alone (not aiohttp's transports,
# which end a call refused through a redirect: tests/test_redirects.py).
@pytest.mark.parametrize("way", WAYS, ids=lambda w: w.name)
def test_a_resend_redirected_on_the_same_host_carries_the_renewed_token(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    transport = oauth2(follow_redirects=True) if way.name != "requests" else oauth2()
    way.one(transport, Call(COUNT))
    refused = transport.token.value
    emulator.revoke_tokens()
    emulator.fail_graphql_requests(1, body=_REFUSED)
    emulator.fail_graphql_requests(
        1, 307, body=b"", headers={"Location": emulator.graphql_url + "?moved=1"}
    )
    assert way.one(transport, Call(COUNT)) == ANSWER
    sent = [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"]
    assert [refused in header for header in sent] == [True, True, False, False]
    assert emulator.counters.token_requests == 2


@pytest.mark.parametrize("way", [w for w in WAYS if w.loop == "trio"], ids=lambda w: w.name)
def test_callers_waiting_for_a_token_leave_trios_worker_threads_to_the_application(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    """Under trio a wait for the token holds a thread: not one of the 40 the application's
    own ``to_thread`` calls share."""
    transport = oauth2()
    order: list[str] = []
    emulator.freeze_token_endpoint(2.0)

    async def main() -> None:
        with trio.fail_after(30):
            await in_trio()

    async def in_trio() -> None:
        async with Client(transport=transport) as session, trio.open_nursery() as nursery:

            async def query() -> None:
                await session.execute(COUNT)
                if "query" not in order:
                    order.append("query")

            for _ in range(60):  # more than trio's default limit of 40 worker threads
                nursery.start_soon(query)
            await trio.sleep(0.5)  # all of them waiting for the one fetch
            await trio.to_thread.run_sync(lambda: None)
            order.append("application's thread")

    trio.run(main)
    assert order == ["application's thread", "query"]
    assert emulator.counters.token_requests == 1


def test_transports_built_per_call_cost_what_one_transport_costs_while_fresh_tokens_are_refused(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator, clock: ManualClock
) -> None:
    """A transport per call for credentials an API refuses, other tenants' built and used
    in between: the token requests of one long-lived transport (before: 2 per call)."""

    def build(client: ClientRecord, **kwargs: Any) -> Any:
        return oauth2(client=client, **kwargs)

    def call(transport: Any) -> object:
        (outcome,) = way.run(transport, [Call(COUNT)])
        return outcome

    def cost(*, per_call: bool) -> int:
        return refused_tenant_cost(build, call, emulator, clock, per_call=per_call, calls=12)

    assert cost(per_call=True) == cost(per_call=False) == 8


def test_transports_refused_with_bare_401s_leave_no_token_manager_behind(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator
) -> None:
    """Per-call transports of tenants an API refuses with bare 401s: what their refusals
    taught is kept, and their token managers (secret, tokens, responses) go (before: one
    kept for good per tenant, through the kept 401 response)."""
    with Emulator().run_in_thread() as elsewhere:
        bare_401s(elsewhere)  # knows none of these tokens: every one refused, no body
        for client in tenants(emulator, 12):
            (outcome,) = way.run(oauth2(client=client, url=elsewhere.graphql_url), [Call(COUNT)])
            assert isinstance(outcome, UnauthenticatedHTTPError), outcome
            del outcome
            collect_garbage()
    assert len(SHARED) <= 1  # the last, until the next transport is built


def test_the_transports_take_the_api_url_as_their_stacks_url_object(
    way: Way, emulator: Emulator
) -> None:
    """gql's httpx transports take an httpx.URL, and its aiohttp one a yarl.URL: ours, API
    key included, take them too."""
    if way.name == "requests":
        url: Any = emulator.graphql_url
    elif way is AIOHTTP:
        url = yarl.URL(emulator.graphql_url)
    else:  # httpx2's where installed: gql imports it first
        url = gql_httpx.httpx.URL(emulator.graphql_url)
    client = emulator.recent_client
    transport = way.api_key(url, client_id=client.client_id, client_secret=client.client_secret)
    assert way.one(transport, Call(COUNT)) == ANSWER
