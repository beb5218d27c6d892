"""Bare HTTP 401s as gql's errors, and the token request's proxy, at their boundaries.

Batches refused with a bare 401 (renewed and re-sent, or ending in gql's
``TransportServerError``), refusals of both kinds mixed in one call or among concurrent
callers and threads, and what a proxy's credentials can reach (an answer echoing them,
characters aiohttp cannot send, the locals of a refused constructor). Servers run on
127.0.0.1 and are stopped by each test.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import pickle
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gql import Client, GraphQLRequest, gql
from gql.transport.exceptions import TransportError, TransportQueryError, TransportServerError
from support import COUNT, RENAME, UNAUTHENTICATED_ERROR, closed_port, secrets_shown
from yarl import URL

from gql_service_auth import (
    ApiKeyRejectedHTTPError,
    ApiKeyTransport,
    ConfigurationError,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
    UnauthenticatedError,
    UnauthenticatedHTTPError,
)
from gql_service_auth.emulator import Emulator

GQL_401 = "401, message='Unauthorized'"
SUBSCRIPTION = gql("subscription { carrierRenamed { id } }")
ONE_ATTEMPT = RetryPolicy(attempts=1, wait_initial=0, wait_max=0, wait_jitter=0)
# Matches the autouse leak scanner of conftest.py wherever it shows.
PROXY_PASSWORD = "emu-secret-Pr0xyPassw0rdForTheReview"
CLIENT_SECRET = "emu-secret-TheClientSecretOfTheReview"
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
_TESTS = str(Path(__file__).parent)


def _bare_401s(emulator: Emulator) -> None:
    """Refusals are HTTP 401 with no body from now on."""
    emulator.unauthenticated_status, emulator.unauthenticated_body = 401, False


def _shown(exc: BaseException, secrets: Iterable[str]) -> list[str]:
    """Where a secret shows in ``exc``'s chain, the tests' own frames left out."""
    return secrets_shown(exc, secrets, own=_TESTS)


def _proxy_secrets(user: str, password: str) -> list[str]:
    return [password, base64.b64encode(f"{user}:{password}".encode()).decode()]


@pytest.fixture(autouse=True)
def no_proxy_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


# -- 1. Batches refused with a bare 401 ----------------------------------------------------


async def test_an_oauth2_batch_refused_with_a_bare_401_is_renewed_and_resent_once(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The known gap: a bare 401 to a batch renews the token and re-sends it, once."""
    _bare_401s(emulator)
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        results = await session.execute_batch([GraphQLRequest(RENAME), GraphQLRequest(COUNT)])
    assert results[0]["renameCarrier"]["name"] == "Renamed"
    assert results[1]["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 2
    assert emulator.counters.graphql_requests == 3  # the query, the refused batch, its re-send
    assert emulator.counters.mutations_run == 1


@pytest.mark.parametrize("max_renewals", [0, 1, 2])
async def test_an_oauth2_batch_refused_until_renewals_are_spent_is_gqls_error_and_ours(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], max_renewals: int
) -> None:
    """The bare 401 that ends a batch is gql's TransportServerError (401, gql's text) too."""
    _bare_401s(emulator)
    emulator.refuse_all_tokens = True
    async with Client(transport=make_oauth2(max_renewals=max_renewals)) as session:
        with pytest.raises(TransportServerError) as info:
            await session.execute_batch([GraphQLRequest(RENAME), GraphQLRequest(COUNT)])
    caught = info.value
    assert isinstance(caught, UnauthenticatedHTTPError)
    assert isinstance(caught, TransportQueryError)  # what gql's reconnecting session spares
    assert (caught.code, caught.errors) == (401, None)
    assert str(caught).startswith(GQL_401)
    assert f"after {max_renewals} renewal(s)" in str(caught)
    assert isinstance(caught.__cause__, TransportServerError)
    assert emulator.counters.graphql_requests == max_renewals + 1
    assert emulator.counters.token_requests == max_renewals + 1
    assert emulator.counters.mutations_run == 0


async def test_queries_batched_by_gql_and_refused_with_a_bare_401_share_one_renewal(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Client(batch_interval=...) groups concurrent queries; the refused batch renews once."""
    _bare_401s(emulator)
    async with Client(transport=make_oauth2(), batch_interval=0.05) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        emulator.reset_counters()
        results = await asyncio.wait_for(
            asyncio.gather(*(session.execute(COUNT) for _ in range(5))), timeout=10
        )
    assert all(r["carriers"]["totalCount"] == 25 for r in results)
    assert emulator.counters.token_requests == 1
    assert emulator.counters.graphql_requests == 2  # one batch, refused, then re-sent


async def test_queries_batched_by_gql_all_get_the_http_error_when_renewals_are_spent(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Every caller of a batch refused to the end catches it as gql's error and ours."""
    _bare_401s(emulator)
    emulator.refuse_all_tokens = True
    async with Client(transport=make_oauth2(), batch_interval=0.05) as session:
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(session.execute(COUNT) for _ in range(4)), return_exceptions=True),
            timeout=10,
        )
    assert all(isinstance(o, UnauthenticatedHTTPError) and o.code == 401 for o in outcomes)
    assert emulator.counters.graphql_requests == 2


async def test_a_reconnecting_batching_session_does_not_retry_a_bare_401(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """gql's reconnecting session retries most errors 5 times; not ours, batched or not."""
    _bare_401s(emulator)
    emulator.refuse_all_tokens = True
    client = Client(transport=make_oauth2(), batch_interval=0.01)
    session = await client.connect_async(reconnecting=True)
    try:
        with pytest.raises(TransportServerError) as caught:
            await asyncio.wait_for(session.execute(COUNT), timeout=10)
        with pytest.raises(UnauthenticatedHTTPError):
            await asyncio.wait_for(session.execute_batch([GraphQLRequest(COUNT)]), timeout=10)
    finally:
        await client.close_async()
    assert caught.value.code == 401
    assert emulator.counters.graphql_requests == 4  # 2 per call: the send and one re-send


async def test_an_api_key_batch_refused_with_a_bare_401_in_a_reconnecting_session(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """The API key's bare-401 error is never retried by gql, batched or not."""
    _bare_401s(emulator)
    client = Client(transport=make_api_key(emulator.legacy_client), batch_interval=0.01)
    session = await client.connect_async(reconnecting=True)
    try:
        with pytest.raises(ApiKeyRejectedHTTPError) as caught:
            await asyncio.wait_for(session.execute(COUNT), timeout=10)
    finally:
        await client.close_async()
    assert caught.value.code == 401
    assert emulator.counters.graphql_requests == 1


async def test_a_call_failing_fast_while_bare_401s_pause_renewals_is_gqls_error_too(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The next call after renewals were spent on bare 401s ends at once, in the pause they
    caused: code written for gql, which saw a TransportServerError (401) for the first,
    must catch the second as one too, not as a TransportQueryError without errors."""
    _bare_401s(emulator)
    emulator.refuse_all_tokens = True
    policy = RetryPolicy(wait_initial=5, wait_max=5, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(TransportServerError) as first:
            await session.execute(COUNT)
        with pytest.raises(TransportServerError) as paused:
            await session.execute(COUNT)
        with pytest.raises(TransportServerError):
            async for _ in session.subscribe(SUBSCRIPTION):
                pass
    assert isinstance(first.value, UnauthenticatedHTTPError)
    assert isinstance(paused.value, UnauthenticatedHTTPError)
    assert paused.value.code == 401
    assert str(paused.value).startswith(GQL_401)
    assert "paused" in str(paused.value)
    assert emulator.counters.graphql_requests == 2  # nothing sent while paused
    assert emulator.counters.token_requests == 2


async def test_a_call_failing_fast_while_body_refusals_pause_renewals_stays_a_query_error(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The same pause after UNAUTHENTICATED bodies: no HTTP error, as before."""
    emulator.refuse_all_tokens = True
    policy = RetryPolicy(wait_initial=5, wait_max=5, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(UnauthenticatedError):
            await session.execute(COUNT)
        with pytest.raises(UnauthenticatedError, match="paused") as paused:
            await session.execute(COUNT)
    assert not isinstance(paused.value, TransportServerError)


# -- 2. A mutation refused with a bare 401 runs once ----------------------------------------


async def test_a_mutation_refused_with_a_bare_401_is_resent_and_runs_once(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A bare 401 comes before anything ran: the mutation is re-sent, and runs once."""
    _bare_401s(emulator)
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        result = await session.execute(RENAME)
    assert result["renameCarrier"]["name"] == "Renamed"
    assert emulator.counters.mutations_run == 1
    assert emulator.counters.graphql_requests == 3


# -- 3. Both kinds of refusal in one call, or among concurrent callers --------------------


async def test_the_last_refusal_decides_the_errors_kind_body_then_bare(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """UNAUTHENTICATED in a body, then a bare 401 after the renewal: the HTTP error."""
    async with Client(transport=make_oauth2(max_renewals=1)) as session:
        await session.execute(COUNT)
        emulator.fail_graphql_requests(1, body={"data": None, "errors": [UNAUTHENTICATED_ERROR]})
        _bare_401s(emulator)
        emulator.refuse_all_tokens = True
        with pytest.raises(TransportServerError) as caught:
            await session.execute(COUNT)
    assert isinstance(caught.value, UnauthenticatedHTTPError)
    assert caught.value.code == 401


async def test_the_last_refusal_decides_the_errors_kind_bare_then_body(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A bare 401, then UNAUTHENTICATED in a body: the service's errors, not an HTTP error."""
    async with Client(transport=make_oauth2(max_renewals=1)) as session:
        await session.execute(COUNT)
        emulator.fail_graphql_requests(1, status=401, body=b"")
        emulator.refuse_all_tokens = True
        with pytest.raises(UnauthenticatedError) as caught:
            await session.execute(COUNT)
    assert not isinstance(caught.value, TransportServerError)
    assert caught.value.errors is not None


async def test_concurrent_refusals_of_both_kinds_share_one_renewal(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """20 callers refused with one token, half in a body and half bare, renew it once."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        emulator.fail_graphql_requests(10, body={"data": None, "errors": [UNAUTHENTICATED_ERROR]})
        _bare_401s(emulator)  # what the other ten meet
        emulator.graphql_latency = 0.02  # so all 20 are in flight with the revoked token
        results = await asyncio.wait_for(
            asyncio.gather(*(session.execute(COUNT) for _ in range(20))), timeout=10
        )
    assert len(results) == 20
    assert emulator.counters.token_requests == 2


def _blocking_execute(transport: OAuth2Transport) -> object:
    """gql's blocking ``Client.execute`` on a loop of this thread, closed afterwards."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Client(transport=transport, execute_timeout=10).execute(COUNT)
    except Exception as exc:  # reported by the caller's assertion
        return exc
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_threads_refused_with_a_bare_401_share_one_renewal(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """gql's blocking execute on 6 threads, one transport: one renewal for the bare 401s."""
    _bare_401s(emulator)
    transport = make_oauth2()
    assert isinstance(_blocking_execute(transport), dict)
    emulator.revoke_tokens()
    emulator.graphql_latency = 0.02
    barrier = threading.Barrier(6)
    outcomes: list[object] = []

    def call() -> None:
        barrier.wait(timeout=10)
        outcomes.append(_blocking_execute(transport))

    threads = [threading.Thread(target=call, daemon=True) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads)
    assert [type(o).__name__ for o in outcomes] == ["dict"] * 6
    assert emulator.counters.token_requests == 2


# -- 4. The new errors as values -------------------------------------------------------------


@pytest.mark.parametrize("kind", [UnauthenticatedHTTPError, ApiKeyRejectedHTTPError])
@pytest.mark.parametrize(
    "duplicate", [copy.copy, copy.deepcopy, lambda e: pickle.loads(pickle.dumps(e))]
)
def test_the_http_errors_survive_copy_and_pickle(
    kind: type[UnauthenticatedHTTPError], duplicate: Callable[[Any], Any]
) -> None:
    """A copy (a worker process, a task queue) is caught by the same except clauses."""
    error = kind(f"{GQL_401}, url='http://127.0.0.1/graphql': refused")
    copied = duplicate(error)
    assert type(copied) is kind
    assert isinstance(copied, (TransportServerError, TransportQueryError, TransportError))
    assert (copied.code, copied.errors, str(copied)) == (401, None, str(error))


# -- 5. What a proxy's credentials can reach -------------------------------------------------


@contextlib.asynccontextmanager
async def _echoing_proxy(
    answer: Callable[[str, Mapping[str, str]], bytes],
) -> AsyncIterator[str]:
    """A raw "proxy" on 127.0.0.1 answering ``answer(request_line, headers)``; yields its URL.

    Plain-http requests through a proxy reach it whole, ``Proxy-Authorization`` included:
    what a misbehaving proxy, or a debugging page behind it, may quote back.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            fields = (line.partition(":") for line in lines[1:] if line)
            headers = {name.strip().lower(): value.strip() for name, _, value in fields}
            await reader.readexactly(int(headers.get("content-length") or 0))
            writer.write(answer(lines[0], headers))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def _echo(field: str) -> Callable[[str, Mapping[str, str]], bytes]:
    """An answer quoting the request's Proxy-Authorization in ``field`` of an RFC 6749 error."""

    def answer(request_line: str, headers: Mapping[str, str]) -> bytes:
        quoted = f"refused {headers.get('proxy-authorization')} for {request_line}"
        status, extra = "407 Proxy Authentication Required", ""
        document = {"error": "access_denied", "error_description": "denied"}
        if field == "Location":
            status, extra = "307 Temporary Redirect", f"Location: http://127.0.0.1/{quoted}\r\n"
        elif field == "token_type":
            status = "200 OK"
            document = {"access_token": "emu-token-abc", "token_type": quoted}
        else:
            document[field] = quoted
        body = json.dumps(document).encode()
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode("latin-1") + body

    return answer


@pytest.mark.parametrize(
    "field", ["error_description", "error", "error_uri", "Location", "token_type"]
)
async def test_proxy_credentials_echoed_back_never_reach_the_error(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], field: str
) -> None:
    """An answer quoting Proxy-Authorization: the error shows neither password nor Basic."""
    async with _echoing_proxy(_echo(field)) as proxy:
        login = URL(proxy).with_user("tester").with_password(PROXY_PASSWORD)
        transport = make_oauth2(token_proxy=login, retry=ONE_ATTEMPT)
        with pytest.raises(TokenRequestError) as caught:
            async with Client(transport=transport) as session:
                await session.execute(COUNT)
    assert _shown(caught.value, _proxy_secrets("tester", PROXY_PASSWORD)) == []


async def test_credentials_of_the_environments_proxy_echoed_back_never_reach_the_error(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same with trust_env, the proxy and its credentials in HTTP_PROXY."""
    async with _echoing_proxy(_echo("error_description")) as proxy:
        login = URL(proxy).with_user("tester").with_password(PROXY_PASSWORD)
        monkeypatch.setenv("http_proxy", str(login))
        transport = make_oauth2(client_session_args={"trust_env": True}, retry=ONE_ATTEMPT)
        with pytest.raises(TokenRequestError) as caught:
            async with Client(transport=transport) as session:
                await session.execute(COUNT)
    assert caught.value.status == 407
    assert _shown(caught.value, _proxy_secrets("tester", PROXY_PASSWORD)) == []


# aiohttp sends proxy credentials as latin-1: a password beyond it fails in
# UnicodeEncodeError, whose args hold the whole "user:password" it could not encode.
NOT_LATIN_1 = PROXY_PASSWORD + "\u20ac"


@pytest.mark.parametrize("how", ["token_proxy", "proxy_auth", "client_session_args"])
def test_proxy_credentials_aiohttp_cannot_send_are_refused_without_showing_them(
    make_oauth2: Callable[..., OAuth2Transport], how: str
) -> None:
    """Refused when the transport is built, by a message that names the argument only."""
    proxy = "http://127.0.0.1:3128"
    kwargs: dict[str, Any] = {
        "token_proxy": {"token_proxy": f"http://tester:{NOT_LATIN_1}@127.0.0.1:3128"},
        "proxy_auth": {
            "token_session_args": {"proxy": proxy, "proxy_auth": _basic_auth(NOT_LATIN_1)}
        },
        "client_session_args": {
            "client_session_args": {"proxy": f"http://tester:{NOT_LATIN_1}@127.0.0.1:3128"}
        },
    }[how]
    with pytest.raises(ConfigurationError, match="latin-1") as caught:
        make_oauth2(**kwargs)
    assert _shown(caught.value, [PROXY_PASSWORD]) == []


def _basic_auth(password: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # BasicAuth, from aiohttp 3.14
        return aiohttp.BasicAuth("tester", password)


async def test_an_environment_proxy_password_aiohttp_cannot_send_is_not_shown(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY is read at fetch time: the failure there shows no password either."""
    monkeypatch.setenv("http_proxy", f"http://tester:{NOT_LATIN_1}@127.0.0.1:9")
    transport = make_oauth2(client_session_args={"trust_env": True}, retry=ONE_ATTEMPT)
    with pytest.raises(TokenRequestError) as caught:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
    assert _shown(caught.value, [PROXY_PASSWORD]) == []
    assert emulator.counters.token_requests == 0


async def test_a_graphql_proxy_password_aiohttp_cannot_send_is_not_shown(
    emulator: Emulator,
) -> None:
    """The GraphQL session's own proxy (client_session_args), with the API key."""
    transport = ApiKeyTransport(
        emulator.graphql_url,
        client_id=emulator.recent_client.client_id,
        client_secret=emulator.recent_client.client_secret,
        client_session_args={"proxy": f"http://tester:{NOT_LATIN_1}@127.0.0.1:9"},
    )
    with pytest.raises(TransportError) as caught:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
    assert _shown(caught.value, [PROXY_PASSWORD]) == []


@pytest.mark.parametrize("args", [[("trust_env", True)], "trust_env=1", 5])
def test_client_session_args_that_are_not_a_mapping_are_a_configuration_error(
    make_oauth2: Callable[..., OAuth2Transport], args: object
) -> None:
    """Read at construction for the token session's defaults: refused by name, not with
    an AttributeError from inside the package."""
    with pytest.raises(ConfigurationError, match="client_session_args must be a dict"):
        make_oauth2(client_session_args=args)


async def test_yarl_urls_with_a_query_or_a_fragment_work_for_url_and_token_url(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """aiohttp drops the fragment and sends the query; the checks let both through."""
    url = URL(emulator.graphql_url).with_query(tenant="a").with_fragment("x")
    token_url = URL(emulator.token_url).with_query(tenant="a").with_fragment("y")
    async with Client(transport=make_oauth2(url=url, token_url=token_url)) as session:
        assert (await session.execute(COUNT))["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 1


@pytest.mark.parametrize("field", ["url", "token_url"])
@pytest.mark.parametrize("userinfo", [f"u:{PROXY_PASSWORD}", f":{PROXY_PASSWORD}"])
def test_a_yarl_url_with_credentials_is_refused_without_showing_them(
    field: str, userinfo: str
) -> None:
    """A password in a yarl.URL shows nowhere: not in the message, not in frame locals."""
    urls = {"url": "http://127.0.0.1/graphql", "token_url": "http://127.0.0.1/oauth2/token"}
    urls[field] = urls[field].replace("//", f"//{userinfo}@")
    with pytest.raises(ConfigurationError, match="must not carry credentials") as caught:
        OAuth2Transport(
            URL(urls["url"]),
            token_url=URL(urls["token_url"]),
            client_id="review-client",
            client_secret=CLIENT_SECRET,
        )
    assert _shown(caught.value, [PROXY_PASSWORD, CLIENT_SECRET]) == []


# -- 6. A refused constructor keeps no credential in its traceback's locals -----------------

_BAD_SETTINGS: dict[str, dict[str, Any]] = {
    "remote proxy for http": {"token_proxy": f"http://u:{PROXY_PASSWORD}@192.0.2.1:3128"},
    "refused key": {
        "token_session_args": {"proxy": f"http://u:{PROXY_PASSWORD}@127.0.0.1:1", "headers": {}}
    },
    "graphql proxy, remote": {
        "client_session_args": {"proxy": f"http://u:{PROXY_PASSWORD}@192.0.2.1:3128"}
    },
    "bad max_renewals": {
        "token_proxy": f"http://u:{PROXY_PASSWORD}@127.0.0.1:1",
        "max_renewals": -1,
    },
    "bad url": {"url": "ftp://127.0.0.1/graphql", "token_proxy": f"http://u:{PROXY_PASSWORD}@h:1"},
    "auth given": {"auth": object(), "token_proxy": f"http://u:{PROXY_PASSWORD}@127.0.0.1:1"},
}


@pytest.mark.parametrize("case", sorted(_BAD_SETTINGS))
def test_a_refused_oauth2_constructor_leaves_no_credential_in_its_frames(case: str) -> None:
    """Crash reporters read every frame's locals: the library's hold no secret afterwards."""
    settings = dict(_BAD_SETTINGS[case])
    url = settings.pop("url", "http://127.0.0.1:1/graphql")
    with pytest.raises(ConfigurationError) as caught:
        OAuth2Transport(
            url,
            token_url="http://127.0.0.1:1/oauth2/token",
            client_id="review-client",
            client_secret=CLIENT_SECRET,
            **settings,
        )
    assert _shown(caught.value, [CLIENT_SECRET, PROXY_PASSWORD]) == []


def test_a_refused_api_key_constructor_leaves_no_credential_in_its_frames() -> None:
    with pytest.raises(ConfigurationError) as caught:
        ApiKeyTransport(
            "ftp://127.0.0.1/graphql", client_id="review-client", client_secret=CLIENT_SECRET
        )
    assert _shown(caught.value, [CLIENT_SECRET]) == []


@pytest.mark.parametrize("cls", [ApiKeyTransport, OAuth2Transport])
def test_from_env_refused_leaves_neither_the_secret_nor_the_environment_in_its_frames(
    cls: type[ApiKeyTransport] | type[OAuth2Transport],
) -> None:
    """A missing variable: from_env's frames held the whole environment, secret included."""
    environ = {"SERVICE_CLIENT_SECRET": CLIENT_SECRET, "SERVICE_CLIENT_ID": "review-client"}
    with pytest.raises(ConfigurationError, match="SERVICE_BASE_URL") as caught:
        cls.from_env(environ)
    assert _shown(caught.value, [CLIENT_SECRET]) == []


@pytest.mark.parametrize("cls", [ApiKeyTransport, OAuth2Transport])
def test_the_repr_of_a_transport_whose_constructor_failed_does_not_raise(
    cls: type[ApiKeyTransport] | type[OAuth2Transport],
) -> None:
    """A debugger or a crash reporter shows the half-built ``self`` of a failed __init__."""
    assert repr(cls.__new__(cls)) == f"<{cls.__name__} url='None'>"


# -- 7. Connector factories and the fetch's own event loop ---------------------------------


async def test_a_connector_factory_handing_out_a_connector_of_the_callers_loop_fails_clearly(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The fetch runs on a loop of its own: a connector of the caller's loop is refused as
    such, and left open for its owner, rather than closed from the fetch's thread."""
    mine = aiohttp.TCPConnector()  # bound to this test's loop
    try:
        transport = make_oauth2(token_session_args={"connector": lambda: mine})
        with pytest.raises(TokenRequestError, match="another event loop") as caught:
            async with Client(transport=transport) as session:
                await session.execute(COUNT)
        assert not caught.value.retryable
        assert "functools.partial" in str(caught.value)
        assert not mine.closed
    finally:
        await mine.close()
    assert emulator.counters.token_requests == 0


def _raising_trace() -> Any:
    """A TraceConfig whose request-start callback fails, as a metrics client that is down."""

    async def on_request_start(*_: object) -> None:
        raise RuntimeError("metrics backend down")

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request_start)
    return trace


@pytest.mark.parametrize("method", ["client_secret_post", "client_secret_basic"])
async def test_a_failing_trace_callback_of_the_token_session_leaves_no_secret_in_frames(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], method: str
) -> None:
    """aiohttp's frames between our fetch and the callback held the form and headers."""
    transport = make_oauth2(
        token_session_args={"trace_configs": [_raising_trace()]},
        token_auth_method=method,
        retry=ONE_ATTEMPT,
    )
    with pytest.raises(TokenRequestError) as caught:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
    client = emulator.recent_client
    basic = base64.b64encode(f"{client.client_id}:{client.client_secret}".encode()).decode()
    assert _shown(caught.value, [client.client_secret, basic]) == []


@pytest.mark.parametrize("kind", ["api_key", "oauth2"])
async def test_a_failing_trace_callback_of_the_graphql_session_leaves_no_credential_in_frames(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    make_oauth2: Callable[..., OAuth2Transport],
    kind: str,
) -> None:
    """The same through gql's TransportConnectionFailed, for the GraphQL request's headers."""
    args = {"client_session_args": {"trace_configs": [_raising_trace()]}}
    transport = make_api_key(**args) if kind == "api_key" else make_oauth2(**args)
    async with Client(transport=transport) as session:
        with pytest.raises(TransportError) as caught:
            await session.execute(COUNT)
        token = transport.token.value if isinstance(transport, OAuth2Transport) else ""
    assert _shown(caught.value, [emulator.recent_client.client_secret, token]) == []


# -- 8. Across fork: a child renews after a bare 401, through the token's proxy ----------------


def test_a_forked_child_renews_through_the_token_proxy_after_a_bare_401(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], tmp_path: Path
) -> None:
    """The child's renewal goes through the proxy, as the parent's; neither disturbs the other."""
    from test_runtime_boundaries import _in_child
    from test_token_proxy import _running_proxy

    def query_succeeds() -> None:
        result = _blocking_execute(transport)
        assert isinstance(result, dict), repr(result)

    _bare_401s(emulator)
    with _running_proxy(tmp_path / "proxy") as proxy:
        transport = make_oauth2(token_proxy=proxy.url)
        query_succeeds()
        emulator.revoke_tokens()
        child = _in_child(query_succeeds, timeout=20)
        query_succeeds()  # the parent's token was revoked too: it renews on its own
    assert child == (0, "ok")
    via = ["proxy.py" in r.headers.get("Via", "") for r in emulator.requests if "token" in r.path]
    assert via == [True, True, True]
    assert emulator.counters.unauthenticated_responses == 2


# -- 9. Proxy failures, scanned down to the frames' locals -----------------------------------


@pytest.mark.parametrize("how", ["url", "proxy_auth"])
@pytest.mark.parametrize("failure", ["407", "407 to CONNECT", "unreachable"])
async def test_a_failing_proxy_shows_its_password_nowhere_in_the_chain_or_its_frames(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    tmp_path: Path,
    how: str,
    failure: str,
) -> None:
    """proxy.py asking for other credentials, or no proxy listening at all."""
    from test_token_proxy import _running_proxy

    wrong = "emu-secret-WrongProxyPasswordGiven"
    with contextlib.ExitStack() as stack:
        if failure == "unreachable":
            proxy = f"http://127.0.0.1:{stack.enter_context(closed_port())}"
        else:
            running = stack.enter_context(
                _running_proxy(tmp_path / "proxy", "--basic-auth", f"tester:{PROXY_PASSWORD}")
            )
            proxy = running.url
        token_url = "https://127.0.0.1:9/oauth2/token" if failure == "407 to CONNECT" else None
        extra: dict[str, Any] = {"token_url": token_url} if token_url else {}
        if how == "url":
            extra["token_proxy"] = URL(proxy).with_user("tester").with_password(wrong)
        else:
            extra["token_session_args"] = {"proxy": proxy, "proxy_auth": _basic_auth(wrong)}
        transport = make_oauth2(retry=ONE_ATTEMPT, **extra)
        with pytest.raises(TokenRequestError) as caught:
            async with Client(transport=transport) as session:
                await session.execute(COUNT)
    assert _shown(caught.value, _proxy_secrets("tester", wrong)) == []
    assert emulator.counters.token_requests == 0
