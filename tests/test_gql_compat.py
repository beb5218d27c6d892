"""Code written for gql's AIOHTTPTransport keeps working: yarl URLs, and bare HTTP 401s.

Also gql's positional arguments, a session driven by another thread running its loop,
variables that contain themselves, and a query made while the caller handles its own
error: each as with gql's own transport. gql's own aiohttp tests run against both
transports too (``make gql-suite``); these tests pin the behaviours that made them fail,
through gql's ``Client`` and the emulator.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gql import Client, FileVar, GraphQLRequest, gql
from gql.transport.exceptions import (
    TransportConnectionFailed,
    TransportQueryError,
    TransportServerError,
)
from support import (
    ANSWER,
    CARRIER_RENAMED,
    COUNT,
    GQL_401,
    KINDS,
    STACK_REASONS,
    UPLOAD,
    build_transport,
    connected,
    finish,
    start_thread,
)
from yarl import URL

from gql_service_auth import (
    ApiKeyRejectedError,
    ApiKeyRejectedHTTPError,
    ApiKeyTransport,
    ConfigurationError,
    OAuth2Transport,
    UnauthenticatedError,
    UnauthenticatedHTTPError,
)
from gql_service_auth.emulator import Emulator


def _bare_401(emulator: Emulator) -> None:
    """Refuse credentials with HTTP 401 and no body; OAuth2 tokens, even fresh, too."""
    emulator.unauthenticated_status, emulator.unauthenticated_body = 401, False
    emulator.refuse_all_tokens = True


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
async def test_url_and_token_url_may_be_yarl_urls(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    make_oauth2: Callable[..., OAuth2Transport],
) -> None:
    """A yarl.URL works for url and token_url, and is kept as given, as gql keeps it."""
    url, token_url = URL(emulator.graphql_url), URL(emulator.token_url)
    api_key = ApiKeyTransport(
        url,
        client_id=emulator.recent_client.client_id,
        client_secret=emulator.recent_client.client_secret,
    )
    oauth2 = make_oauth2(url=url, token_url=token_url)
    for transport in (api_key, oauth2):
        async with Client(transport=transport) as session:
            assert (await session.execute(COUNT))["carriers"]["totalCount"] == 25
        assert transport.url is url
        assert repr(transport).endswith(f"url={str(url)!r}>")
    assert oauth2.token_url is token_url
    assert emulator.counters.token_requests == 1


@pytest.mark.parametrize("field", ["url", "token_url"])
def test_a_yarl_url_over_plain_http_to_a_remote_host_is_refused(field: str) -> None:
    """The plain-http check holds for yarl URLs; allow_insecure_http still lifts it."""
    urls = {"url": URL("https://api.example.com/graphql"), "token_url": URL("https://a.example")}
    urls[field] = urls[field].with_scheme("http")
    with pytest.raises(ConfigurationError, match=f"plain http to .*example.*{field}"):
        OAuth2Transport(
            urls["url"], token_url=urls["token_url"], client_id="id", client_secret="s"
        )
    OAuth2Transport(
        urls["url"],
        token_url=urls["token_url"],
        client_id="id",
        client_secret="s",
        allow_insecure_http=True,
    )


@pytest.mark.parametrize("url", [URL("/graphql"), URL("ftp://127.0.0.1/graphql"), 42])
def test_a_relative_or_odd_url_is_refused(url: object) -> None:
    """A relative yarl.URL, another scheme, or neither str nor URL: a ConfigurationError."""
    with pytest.raises(ConfigurationError, match="url must be"):
        ApiKeyTransport(url, client_id="id", client_secret="s")  # type: ignore[arg-type]


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
async def test_a_bare_401_to_the_api_key_is_gqls_error_and_ours(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """Caught as gql's TransportServerError (code 401, gql's text) and as ApiKeyRejectedError."""
    _bare_401(emulator)
    async with Client(transport=make_api_key(emulator.legacy_client)) as session:
        with pytest.raises(TransportServerError) as info:  # as code written for gql catches it
            await session.execute(COUNT)
    caught = info.value
    assert caught.code == 401
    assert GQL_401 in str(caught)
    assert isinstance(caught, ApiKeyRejectedHTTPError)
    assert isinstance(caught, ApiKeyRejectedError)
    assert "registered before 2024-05-13" in str(caught)
    assert caught.errors is None
    assert isinstance(caught.__cause__, TransportServerError)
    assert emulator.counters.graphql_requests == 1


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
async def test_a_bare_401_to_an_api_key_batch_is_gqls_error_and_ours(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """A batch refused with a bare 401 raises the same error as a single request."""
    _bare_401(emulator)
    async with Client(transport=make_api_key(emulator.legacy_client)) as session:
        with pytest.raises(ApiKeyRejectedHTTPError) as caught:
            await session.execute_batch([GraphQLRequest(COUNT), GraphQLRequest(COUNT)])
    assert (caught.value.code, GQL_401 in str(caught.value)) == (401, True)


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
async def test_a_bare_401_after_spent_renewals_is_gqls_error_and_ours(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Once renewals are spent, the last bare 401 ends the call as both kinds of error."""
    _bare_401(emulator)
    async with Client(transport=make_oauth2(max_renewals=1)) as session:
        with pytest.raises(TransportServerError) as info:
            await session.execute(COUNT)
    caught = info.value
    assert caught.code == 401
    assert GQL_401 in str(caught)
    assert isinstance(caught, UnauthenticatedHTTPError)
    assert not isinstance(caught, ApiKeyRejectedError)
    assert "after 1 renewal(s)" in str(caught)
    assert emulator.counters.graphql_requests == 2
    assert emulator.counters.token_requests == 2


@pytest.mark.parametrize("kind", ["api_key", "oauth2"])
async def test_a_reconnecting_session_does_not_retry_a_bare_401(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    make_oauth2: Callable[..., OAuth2Transport],
    kind: str,
) -> None:
    """gql's reconnecting session, which retries most errors 5 times, sends no more."""
    _bare_401(emulator)
    transport = make_api_key(emulator.legacy_client) if kind == "api_key" else make_oauth2()
    client = Client(transport=transport)
    session = await client.connect_async(reconnecting=True)
    try:
        with pytest.raises(TransportServerError) as caught:
            await session.execute(COUNT)
    finally:
        await client.close_async()
    # What gql's retry condition looks at: a TransportQueryError is never retried.
    assert isinstance(caught.value, TransportQueryError)
    assert caught.value.code == 401
    assert emulator.counters.graphql_requests == (1 if kind == "api_key" else 2)


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["sub"])
@pytest.mark.parametrize("kind", ["api_key", "oauth2"])
async def test_a_401_to_a_subscription_is_gqls_error_and_ours(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    make_oauth2: Callable[..., OAuth2Transport],
    kind: str,
) -> None:
    """gql raises TransportServerError for a 401 to a subscription; ours is that too."""
    _bare_401(emulator)
    transport = make_api_key(emulator.legacy_client) if kind == "api_key" else make_oauth2()
    expected = ApiKeyRejectedHTTPError if kind == "api_key" else UnauthenticatedHTTPError
    async with Client(transport=transport) as session:
        with pytest.raises(expected) as caught:
            async for _ in session.subscribe(CARRIER_RENAMED):
                pass
    assert (caught.value.code, GQL_401 in str(caught.value)) == (401, True)
    assert emulator.counters.graphql_requests == 1


async def test_unauthenticated_in_a_graphql_body_stays_a_query_error_only(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A refusal the body explains (status 401 or not) is not a gql TransportServerError."""
    emulator.unauthenticated_status, emulator.refuse_all_tokens = 401, True
    async with Client(transport=make_oauth2(max_renewals=0)) as session:
        with pytest.raises(UnauthenticatedError) as caught:
            await session.execute(COUNT)
    assert not isinstance(caught.value, TransportServerError)
    assert caught.value.errors is not None


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_gqls_positional_arguments_are_accepted_in_gqls_order(
    emulator: Emulator, kind: str
) -> None:
    """headers, cookies, auth, ssl, timeout... given positionally as to gql reach the request."""
    gql_args = ({"X-Trace": "1"}, {"trace": "c"}, None, True, 10, 10, json.dumps, json.loads, None)
    client = emulator.recent_client
    keywords = {"client_id": client.client_id, "client_secret": client.client_secret}
    if kind == "oauth2":
        keywords |= {"token_url": emulator.token_url}
    cls = ApiKeyTransport if kind == "api_key" else OAuth2Transport
    transport = cls(emulator.graphql_url, *gql_args, **keywords)
    async with Client(transport=transport) as session:
        assert await session.execute(COUNT) == ANSWER
    sent = [r.headers for r in emulator.requests if r.path == "/graphql"]
    assert [(h.get("X-Trace"), h.get("Cookie")) for h in sent] == [("1", "trace=c")]


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
async def test_yarl_urls_with_a_query_or_a_fragment_work_for_url_and_token_url(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """aiohttp drops the fragment and sends the query; the checks let both through."""
    url = URL(emulator.graphql_url).with_query(tenant="a").with_fragment("x")
    token_url = URL(emulator.token_url).with_query(tenant="a").with_fragment("y")
    async with Client(transport=make_oauth2(url=url, token_url=token_url)) as session:
        assert (await session.execute(COUNT))["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 1


@pytest.mark.parametrize("kind", ["gql", *KINDS])
@pytest.mark.usefixtures("no_resource_left_open")
def test_a_session_connected_on_a_loop_serves_another_thread_running_that_loop(
    emulator: Emulator, kind: str
) -> None:
    """Connected on loop L in one thread, the session executes when another thread runs L."""
    with connected(Client(transport=build_transport(kind, emulator))) as (loop, session):
        result = finish(start_thread(lambda: loop.run_until_complete(session.execute(COUNT))))
    assert result == ANSWER


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
@pytest.mark.parametrize("kind", ["gql", *KINDS])
@pytest.mark.usefixtures("no_resource_left_open")
def test_closing_on_the_loop_from_another_thread_closes_the_session(
    emulator: Emulator, kind: str
) -> None:
    """Connected on loop L in one thread and closed on L by another, no session stays open."""
    transport = build_transport(kind, emulator)
    client = Client(transport=transport)

    async def session_of_this_loop() -> aiohttp.ClientSession | None:
        return transport.session

    with connected(client) as (loop, _):
        opened = loop.run_until_complete(session_of_this_loop())
        assert opened is not None
        try:
            assert (
                finish(start_thread(lambda: loop.run_until_complete(client.close_async()))) is None
            )
            assert opened.closed
        finally:
            loop.run_until_complete(opened.close())  # a no-op once closed


class _Frozen(Exception):
    """A caller's own exception that refuses changes, holding a cycle."""

    def __setattr__(self, name: str, value: object) -> None:
        if name not in ("__traceback__", "__context__", "__cause__", "__suppress_context__"):
            raise AttributeError("frozen")
        super().__setattr__(name, value)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_query_made_while_the_caller_handles_its_own_error_fails_as_usual(
    emulator: Emulator, kind: str
) -> None:
    """Inside the caller's except block (a cyclic, read-only error), a 502 is still gql's."""
    cyclic: list[object] = []
    cyclic.append(cyclic)
    emulator.fail_graphql_requests(1, 502, body=b"bad gateway")
    async with Client(transport=build_transport(kind, emulator)) as session:
        try:
            raise _Frozen("the caller's own", cyclic)
        except _Frozen:
            with pytest.raises(TransportServerError):
                await session.execute(COUNT)


@pytest.mark.parametrize("kind", ["gql", *KINDS])
@pytest.mark.usefixtures("no_resource_left_open")
async def test_cyclic_variables_fail_as_they_do_with_gqls_transport(
    emulator: Emulator, kind: str
) -> None:
    """Variables that contain themselves fail with the error gql's own transport raises."""
    variables: dict[str, Any] = {"id": "carrier-001"}
    variables["self"] = variables
    request = GraphQLRequest(
        gql("query ($id: ID!) { carrier(id: $id) { id } }"), variable_values=variables
    )
    async with Client(transport=build_transport(kind, emulator)) as session:
        with pytest.raises(Exception, match=r"[Cc]ircular") as info:
            await session.execute(request)
    assert not isinstance(info.value, RecursionError)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_failure_handled_inside_a_batch_error_leaves_the_batching_session_alive(
    emulator: Emulator, kind: str
) -> None:
    """A failed call made while handling a batched call's error: later batches still run."""

    async def scenario() -> object:
        async with (
            Client(transport=build_transport(kind, emulator), batch_interval=0.01) as batched,
            Client(transport=build_transport(kind, emulator)) as plain,
        ):
            await batched.execute(COUNT)
            await plain.execute(COUNT)
            emulator.fail_graphql_requests(1, 500, body={"oops": 1})
            try:
                await batched.execute(COUNT)
            except TransportServerError:
                emulator.fail_graphql_requests(1, 500, body={"oops": 2})
                with pytest.raises(TransportServerError):
                    await plain.execute(COUNT)
            # gql's batching task caught the first error and waits on: its frame is not ours.
            return await batched.execute(COUNT)

    # Bounded as a whole: a dead batching task also hangs the session's close.
    assert await asyncio.wait_for(scenario(), 20) == ANSWER


async def _first_query_for_a_token(session: Any, kind: str) -> None:
    """An OAuth2 transport's first call fetches a token; the next takes the fast path."""
    if kind.endswith("oauth2"):
        await session.execute(COUNT)


@pytest.mark.parametrize("kind", ["gql", *KINDS])
@pytest.mark.parametrize("extra", [{"bogus": 1}, {"ssl": False}], ids=["unknown", "ssl-twice"])
async def test_extra_args_aiohttp_refuses_raise_what_gql_raises(
    emulator: Emulator, kind: str, extra: dict[str, Any]
) -> None:
    """aiohttp refuses a keyword as the post is made: TransportConnectionFailed, as gql."""
    async with Client(transport=build_transport(kind, emulator)) as session:
        await _first_query_for_a_token(session, kind)
        with pytest.raises(TransportConnectionFailed):
            await session.execute(COUNT, extra_args=dict(extra))


@pytest.mark.parametrize("kind", ["gql", *KINDS])
async def test_an_upload_whose_post_is_refused_closes_its_file(
    emulator: Emulator, kind: str, tmp_path: Path
) -> None:
    """gql closes the files it opened whatever the post raised; so do ours."""
    path = tmp_path / "note.txt"
    path.write_bytes(b"hello")
    file = FileVar(str(path), content_type="text/plain")
    async with Client(transport=build_transport(kind, emulator)) as session:
        await _first_query_for_a_token(session, kind)
        with pytest.raises(TransportConnectionFailed):
            await session.execute(
                GraphQLRequest(UPLOAD, variable_values={"file": file}),
                upload_files=True,
                extra_args={"bogus": 1},
            )
    opened = file._file_opened
    if opened:
        file.f.close()  # the leak must not fail later tests with a ResourceWarning
    assert not opened, "the upload's file was left open"
