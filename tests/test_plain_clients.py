"""The auth objects on plain requests and httpx (and httpx2) clients, without gql."""

from __future__ import annotations

import asyncio
import contextlib
import copy as copy_module
import importlib.util
import json
import pickle
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
import requests
from gql import Client, GraphQLRequest
from support import (
    COUNT,
    HANG_GUARD,
    NO_WAIT,
    UNAUTHENTICATED_ERROR,
    bare_401s,
    closed_port,
    finish,
    in_child,
    poll,
    serving,
    set_http_proxy,
    shown,
    start_thread,
)

from gql_service_auth import ConfigurationError, TokenRequestError
from gql_service_auth import aiohttp as service_aiohttp
from gql_service_auth import httpx as service_httpx
from gql_service_auth import requests as service_requests
from gql_service_auth.emulator import Emulator

QUERY = {"query": "{ carriers(first: 1) { totalCount } }"}
AUTH_KINDS = ["api_key", "oauth2"]
ANSWER = {"data": {"carriers": {"totalCount": 25}}}

# httpx, and httpx2 where installed (noxfile.py leaves it out on one Python).
MODULES = [httpx]
if importlib.util.find_spec("httpx2") is not None:
    import httpx2

    MODULES.append(httpx2)


def test_a_requests_session_renews_a_revoked_token_and_sends_again(emulator: Emulator) -> None:
    with requests.Session() as session:
        session.auth = service_requests.OAuth2Auth.from_env(emulator.environ(), retry=NO_WAIT)
        assert session.post(emulator.graphql_url, json=QUERY).json() == ANSWER
        emulator.revoke_tokens()
        answer = session.post(emulator.graphql_url, json=QUERY)
    assert answer.json() == ANSWER
    assert [r.status_code for r in answer.history] == [200]  # the refused answer
    assert emulator.counters.token_requests == 2
    assert "Bearer" in answer.request.headers["Authorization"]


def test_a_streamed_requests_response_is_left_to_the_caller(emulator: Emulator) -> None:
    """stream=True: the auth reads nothing of a 200, so the caller reads it all, raw; a
    401 is small, and read: a revoked token is still renewed and the request sent again."""
    with requests.Session() as session:
        session.auth = service_requests.OAuth2Auth.from_env(emulator.environ(), retry=NO_WAIT)
        with session.post(emulator.graphql_url, json=QUERY, stream=True) as answer:
            assert json.loads(answer.raw.read()) == ANSWER
        bare_401s(emulator)
        emulator.revoke_tokens()
        with session.post(emulator.graphql_url, json=QUERY, stream=True) as answer:
            assert json.loads(answer.raw.read()) == ANSWER
    assert emulator.counters.token_requests == 2
    assert emulator.counters.graphql_requests == 3


def test_a_requests_session_sends_the_api_key(emulator: Emulator) -> None:
    with requests.Session() as session:
        session.auth = service_requests.ApiKeyAuth.from_env(emulator.environ())
        assert session.post(emulator.graphql_url, json=QUERY).json() == ANSWER
    assert emulator.counters.token_requests == 0


@pytest.mark.parametrize("module", MODULES, ids=lambda module: module.__name__)
def test_an_httpx_client_renews_a_revoked_token_and_sends_again(
    emulator: Emulator, module: Any
) -> None:
    auth = service_httpx.OAuth2Auth.from_env(emulator.environ(), retry=NO_WAIT)
    with module.Client(auth=auth) as client:
        assert client.post(emulator.graphql_url, json=QUERY).json() == ANSWER
        emulator.revoke_tokens()
        answer = client.post(emulator.graphql_url, json=QUERY)
    assert answer.json() == ANSWER
    assert len(answer.history) == 1
    assert emulator.counters.token_requests == 2


@pytest.mark.parametrize("module", MODULES, ids=lambda module: module.__name__)
def test_an_async_httpx_client_and_a_sync_one_share_the_auth_and_its_token(
    emulator: Emulator, module: Any
) -> None:
    auth = service_httpx.OAuth2Auth.from_env(emulator.environ(), retry=NO_WAIT)

    async def ask() -> Any:
        async with module.AsyncClient(auth=auth) as client:
            return (await client.post(emulator.graphql_url, json=QUERY)).json()

    assert asyncio.run(ask()) == ANSWER
    with module.Client(auth=service_httpx.ApiKeyAuth.from_env(emulator.environ())) as client:
        assert client.post(emulator.graphql_url, json=QUERY).json() == ANSWER
    with module.Client(auth=auth) as client:
        assert client.post(emulator.graphql_url, json=QUERY).json() == ANSWER
    assert emulator.counters.token_requests == 1


@contextlib.contextmanager
def another_service() -> Iterator[tuple[str, list[str | None]]]:
    """Another service on 127.0.0.1 that the same client calls: its URL, and the
    ``Authorization`` each request brought it."""
    from aiohttp import web

    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"ok": True})

    with serving(lambda app: app.router.add_route("*", "/{tail:.*}", answer)) as url:
        yield f"{url}/v1/items", seen


def _auth(module: Any, kind: str, emulator: Emulator, **kwargs: Any) -> Any:
    if kind == "api_key":
        return module.ApiKeyAuth.from_env(emulator.environ(), **kwargs)
    return module.OAuth2Auth.from_env(emulator.environ(), retry=NO_WAIT, **kwargs)


@pytest.mark.parametrize("kind", AUTH_KINDS)
def test_a_requests_session_signs_only_the_requests_to_its_service(
    emulator: Emulator, kind: str
) -> None:
    """The session also calls another host: that one gets no credential, and no token is
    fetched for it."""
    with another_service() as (other_url, seen), requests.Session() as session:
        session.auth = _auth(service_requests, kind, emulator)
        assert session.post(other_url, json={}).json() == {"ok": True}
        assert session.post(emulator.graphql_url, json=QUERY).json() == ANSWER
    assert seen == [None]
    assert emulator.counters.token_requests == (1 if kind == "oauth2" else 0)


@pytest.mark.parametrize("module", MODULES, ids=lambda module: module.__name__)
@pytest.mark.parametrize("kind", AUTH_KINDS)
async def test_httpx_clients_sign_only_the_requests_to_their_service(
    emulator: Emulator, kind: str, module: Any
) -> None:
    """Sync and async clients that also call another host send it no credential."""
    auth = _auth(service_httpx, kind, emulator)
    with another_service() as (other_url, seen):
        async with module.AsyncClient(auth=auth) as client:
            assert (await client.post(other_url, json={})).json() == {"ok": True}
            assert (await client.post(emulator.graphql_url, json=QUERY)).json() == ANSWER
        with module.Client(auth=auth) as sync_client:
            assert sync_client.post(other_url, json={}).json() == {"ok": True}
    assert seen == [None, None]
    assert emulator.counters.token_requests == (1 if kind == "oauth2" else 0)


@pytest.mark.parametrize("kind", AUTH_KINDS)
def test_an_auth_told_to_sign_every_origin_signs_another_host(
    emulator: Emulator, kind: str
) -> None:
    """sign_any_origin=True: the wider scope, asked for explicitly."""
    with another_service() as (other_url, seen), requests.Session() as session:
        session.auth = _auth(service_requests, kind, emulator, sign_any_origin=True)
        session.post(other_url, json={})
    (header,) = seen
    assert header is not None
    assert header.startswith("Bearer " if kind == "oauth2" else "SERVICE-API-KEY ")


@pytest.mark.parametrize("module", [service_requests, service_httpx], ids=["requests", "httpx"])
def test_an_auth_without_its_services_url_is_refused_with_the_ways_to_give_it(
    emulator: Emulator, module: Any
) -> None:
    """No url= (nor SERVICE_BASE_URL for from_env), no sign_any_origin: a clear error."""
    client = emulator.recent_client
    with pytest.raises(ConfigurationError, match=r"pass url=.*SERVICE_BASE_URL.*sign_any_origin"):
        module.ApiKeyAuth(client.client_id, client.client_secret)
    with pytest.raises(ConfigurationError, match="pass url="):
        module.OAuth2Auth(emulator.token_url, client.client_id, client.client_secret)
    environ = {k: v for k, v in emulator.environ().items() if k != "SERVICE_BASE_URL"}
    with pytest.raises(ConfigurationError, match="SERVICE_BASE_URL"):
        module.OAuth2Auth.from_env(environ)
    assert module.OAuth2Auth.from_env(environ, sign_any_origin=True) is not None
    with pytest.raises(ConfigurationError, match="url= or sign_any_origin=True, not both"):
        module.ApiKeyAuth(
            client.client_id, client.client_secret, url=emulator.graphql_url, sign_any_origin=True
        )


@pytest.mark.parametrize(
    "url", ["https://bücher.example/graphql", "https://xn--bcher-kva.example/graphql"]
)
def test_an_international_host_is_the_same_origin_however_it_is_spelt(
    emulator: Emulator, url: str
) -> None:
    """requests spells the host in punycode, httpx in Unicode: either way it is signed."""
    environ = emulator.environ()
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=ANSWER)

    auth = service_httpx.ApiKeyAuth.from_env(environ, url=url)
    with httpx.Client(auth=auth, transport=httpx.MockTransport(record)) as client:
        client.post("https://bücher.example/graphql", json=QUERY)  # no network: a mock
    prepared = requests.Request(
        "POST",
        "https://bücher.example/graphql",
        json=QUERY,
        auth=service_requests.ApiKeyAuth.from_env(environ, url=url),
    ).prepare()
    assert "SERVICE-API-KEY" in sent[0].headers["Authorization"]
    assert "SERVICE-API-KEY" in prepared.headers["Authorization"]


def test_a_name_another_idna_reads_otherwise_is_another_host(emulator: Emulator) -> None:
    """faß.de is xn--fa-hia.de to requests and httpx (IDNA 2008), and fass.de another
    domain, which gets no credential."""
    environ = emulator.environ()
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=ANSWER)

    auth = service_httpx.ApiKeyAuth.from_env(environ, url="https://faß.de/graphql")
    with httpx.Client(auth=auth, transport=httpx.MockTransport(record)) as client:
        client.post("https://faß.de/graphql", json=QUERY)  # no network: a mock
        client.post("https://fass.de/graphql", json=QUERY)
    assert ["Authorization" in request.headers for request in sent] == [True, False]
    requests_auth = service_requests.ApiKeyAuth.from_env(environ, url="https://faß.de/graphql")
    signed = [
        "Authorization"
        in requests.Request("POST", url, json=QUERY, auth=requests_auth).prepare().headers
        for url in ("https://faß.de/graphql", "https://fass.de/graphql")
    ]
    assert signed == [True, False]


def test_credentials_never_go_over_plain_http_to_another_host(emulator: Emulator) -> None:
    """Signing every origin, a plain-http request to another host is refused; the
    service's URL in plain http to another host is refused when the auth is built."""
    environ = emulator.environ()
    auth = service_httpx.OAuth2Auth.from_env(environ, retry=NO_WAIT, sign_any_origin=True)
    sent: list[object] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=ANSWER)

    with (
        httpx.Client(auth=auth, transport=httpx.MockTransport(record)) as client,
        pytest.raises(ConfigurationError, match=r"over http to api\.example\.com"),
    ):
        client.post("http://api.example.com/graphql", json=QUERY)
    with pytest.raises(ConfigurationError, match="http"):
        requests.Request(
            "POST",
            "http://api.example.com/graphql",
            json=QUERY,
            auth=service_requests.ApiKeyAuth.from_env(environ, sign_any_origin=True),
        ).prepare()
    for module in (service_requests, service_httpx):
        with pytest.raises(
            ConfigurationError, match=r"over plain http to api\.example\.com \(url\)"
        ):
            module.ApiKeyAuth.from_env(environ, url="http://api.example.com/graphql")
    assert sent == []
    assert emulator.counters.token_requests == 0


def test_a_plain_http_request_is_refused_again_at_each_send(emulator: Emulator) -> None:
    """What an auth decides of an origin is kept for the next requests, but a refusal is
    not a decision kept: every request to the origin is refused."""
    auth = service_httpx.OAuth2Auth.from_env(
        emulator.environ(), retry=NO_WAIT, sign_any_origin=True
    )
    sent: list[httpx.Request] = []
    with httpx.Client(auth=auth, transport=_answering(sent)) as client:
        for _ in range(2):
            with pytest.raises(ConfigurationError, match=r"over http to api\.example\.com"):
                client.post("http://api.example.com/graphql", json=QUERY)
    assert sent == []
    assert emulator.counters.token_requests == 0


def test_a_copy_of_an_auth_reads_the_environments_proxy_again(
    emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An auth decides once per origin whether plain http to it is safe (a loopback host,
    no remote proxy in the environment). A copy may land in another environment, whose
    proxy would read the token in clear text: it decides again."""
    auth = service_httpx.OAuth2Auth.from_env(emulator.environ(), retry=NO_WAIT)
    sent: list[httpx.Request] = []
    with httpx.Client(auth=auth, transport=_answering(sent)) as client:
        client.post(emulator.graphql_url, json=QUERY)
    set_http_proxy(monkeypatch, "http://192.0.2.1:3128")  # TEST-NET-1: never reached
    for copy in (pickle.loads(pickle.dumps(auth)), copy_module.deepcopy(auth)):
        with (
            httpx.Client(auth=copy, transport=_answering(sent), trust_env=False) as client,
            pytest.raises(ConfigurationError, match="NO_PROXY"),
        ):
            client.post(emulator.graphql_url, json=QUERY)
    assert len(sent) == 1


def _answering(sent: list[httpx.Request]) -> httpx.MockTransport:
    """A transport that answers every request with a GraphQL answer, and keeps it."""

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=ANSWER)

    return httpx.MockTransport(answer)


def test_a_failed_token_request_is_raised_to_plain_clients_as_it_is(emulator: Emulator) -> None:
    environ = emulator.environ() | {"SERVICE_CLIENT_SECRET": "wrong"}
    auth = service_requests.OAuth2Auth.from_env(environ, retry=NO_WAIT)
    with requests.Session() as session:
        session.auth = auth
        with pytest.raises(TokenRequestError):
            session.post(emulator.graphql_url, json=QUERY)
    assert emulator.counters.graphql_requests == 0


@pytest.mark.parametrize(
    "build",
    [
        service_requests.OAuth2RequestsTransport.from_env,
        service_httpx.OAuth2HTTPXTransport.from_env,
    ],
    ids=["requests", "httpx"],
)
def test_a_child_forked_while_the_parent_fetches_gets_a_token_of_its_own(
    emulator: Emulator, build: Any
) -> None:
    transport = build(emulator.environ(), retry=NO_WAIT)
    emulator.token_latency = 0.5
    parent = start_thread(lambda: Client(transport=transport).execute(COUNT))
    assert poll(lambda: emulator.counters.token_requests == 1)

    def child() -> None:
        # The parent's fetch and its thread are not here: waiting on them would hang. The
        # transport, connected by the parent's thread, has a client of its own here.
        assert transport.execute(GraphQLRequest(COUNT)).data == ANSWER["data"]

    assert in_child(child, timeout=20) == (0, "ok")
    assert finish(parent) == ANSWER["data"]
    assert emulator.counters.token_requests == 2


@pytest.mark.parametrize(
    "build",
    [
        service_requests.OAuth2RequestsTransport.from_env,
        service_httpx.OAuth2HTTPXTransport.from_env,
    ],
    ids=["requests", "httpx"],
)
def test_a_session_opened_before_a_fork_goes_on_working_in_the_child(
    emulator: Emulator, build: Any
) -> None:
    transport = build(emulator.environ(), retry=NO_WAIT)
    with Client(transport=transport) as session:
        assert session.execute(COUNT) == ANSWER["data"]

        def child() -> None:
            # A client of its own: the parent's pooled connections stay the parent's.
            assert session.execute(COUNT) == ANSWER["data"]

        assert in_child(child, timeout=20) == (0, "ok")
        assert session.execute(COUNT) == ANSWER["data"]


# aiohttp: client middlewares (aiohttp 3.12 and later), on plain sessions and on gql's own
# AIOHTTPTransport through client_session_args.


def _middleware(kind: str, emulator: Emulator, **kwargs: Any) -> Any:
    if kind == "api_key":
        return service_aiohttp.ApiKeyMiddleware.from_env(emulator.environ(), **kwargs)
    return service_aiohttp.OAuth2Middleware.from_env(emulator.environ(), retry=NO_WAIT, **kwargs)


async def test_an_aiohttp_session_renews_a_revoked_token_and_sends_again(
    emulator: Emulator,
) -> None:
    middleware = _middleware("oauth2", emulator)
    async with aiohttp.ClientSession(middlewares=(middleware,)) as session:
        async with session.post(emulator.graphql_url, json=QUERY) as answer:
            assert await answer.json() == ANSWER
        emulator.revoke_tokens()
        async with session.post(emulator.graphql_url, json=QUERY) as answer:
            assert await answer.json() == ANSWER
    assert emulator.counters.token_requests == 2
    assert emulator.counters.unauthenticated_responses == 1
    assert emulator.counters.graphql_requests == 3


async def test_an_aiohttp_session_sends_the_api_key(emulator: Emulator) -> None:
    middleware = _middleware("api_key", emulator)
    async with (
        aiohttp.ClientSession(middlewares=(middleware,)) as session,
        session.post(emulator.graphql_url, json=QUERY) as answer,
    ):
        assert await answer.json() == ANSWER
    assert emulator.counters.token_requests == 0


@pytest.mark.parametrize("kind", AUTH_KINDS)
async def test_an_aiohttp_session_signs_only_the_requests_to_its_service(
    emulator: Emulator, kind: str
) -> None:
    with another_service() as (other_url, seen):
        async with aiohttp.ClientSession(middlewares=(_middleware(kind, emulator),)) as session:
            async with session.post(other_url, json={}) as answer:
                assert await answer.json() == {"ok": True}
            async with session.post(emulator.graphql_url, json=QUERY) as answer:
                assert await answer.json() == ANSWER
    assert seen == [None]
    assert emulator.counters.token_requests == (1 if kind == "oauth2" else 0)


async def test_an_aiohttp_request_with_its_own_authorization_is_left_alone(
    emulator: Emulator,
) -> None:
    """The caller's own header is neither replaced nor re-sent, and no token is fetched."""
    async with aiohttp.ClientSession(middlewares=(_middleware("oauth2", emulator),)) as session:
        headers = {"Authorization": "Bearer not-ours"}
        async with session.post(emulator.graphql_url, json=QUERY, headers=headers) as answer:
            assert answer.status == 200
            assert (await answer.json())["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    assert emulator.counters.token_requests == 0
    assert emulator.counters.graphql_requests == 1


async def test_a_mutation_refused_through_the_middleware_runs_once(emulator: Emulator) -> None:
    """Refused before it ran: sent again once, and it runs once."""
    rename = {"query": 'mutation { renameCarrier(id: "carrier-001", name: "Renamed") { name } }'}
    async with aiohttp.ClientSession(middlewares=(_middleware("oauth2", emulator),)) as session:
        async with session.post(emulator.graphql_url, json=QUERY) as answer:
            await answer.read()
        emulator.revoke_tokens()
        async with session.post(emulator.graphql_url, json=rename) as answer:
            assert (await answer.json())["data"]["renameCarrier"]["name"] == "Renamed"
    assert emulator.counters.mutations_run == 1
    assert emulator.counters.token_requests == 2


async def test_an_aiohttp_upload_refused_through_the_middleware_is_not_sent_again(
    emulator: Emulator,
) -> None:
    """A multipart body is never sent twice: the refusal comes back as the service sent it."""
    operations = {
        "query": "mutation ($file: Upload!) { uploadDocument(file: $file) { size } }",
        "variables": {"file": None},
    }
    async with aiohttp.ClientSession(middlewares=(_middleware("oauth2", emulator),)) as session:
        async with session.post(emulator.graphql_url, json=QUERY) as answer:
            await answer.read()
        emulator.revoke_tokens()
        form = aiohttp.FormData()
        form.add_field("operations", json.dumps(operations))
        form.add_field("map", json.dumps({"0": ["variables.file"]}))
        form.add_field("0", b"hello", filename="a.txt")
        async with session.post(emulator.graphql_url, data=form) as answer:
            refused = await answer.json()
    assert refused["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    assert emulator.counters.graphql_requests == 2
    assert emulator.counters.mutations_run == 0


async def test_gqls_own_aiohttp_transport_with_the_middleware_renews_and_sends_again(
    emulator: Emulator,
) -> None:
    """gql's AIOHTTPTransport, unchanged, signed by the middleware in its session."""
    from gql.transport.aiohttp import AIOHTTPTransport

    middleware = _middleware("oauth2", emulator)
    transport = AIOHTTPTransport(
        url=emulator.graphql_url, client_session_args={"middlewares": (middleware,)}
    )
    async with Client(transport=transport) as session:
        assert await session.execute(COUNT) == ANSWER["data"]
        emulator.revoke_tokens()
        assert await session.execute(COUNT) == ANSWER["data"]
    assert emulator.counters.token_requests == 2


async def test_the_middleware_refuses_a_remote_proxy_in_clear_text(emulator: Emulator) -> None:
    """Plain http to loopback through a proxy on another machine is refused, not sent."""
    async with aiohttp.ClientSession(middlewares=(_middleware("api_key", emulator),)) as session:
        with pytest.raises(ConfigurationError, match=r"192\.0\.2\.1"):
            await session.post(emulator.graphql_url, json=QUERY, proxy="http://192.0.2.1:3128")
    assert emulator.counters.graphql_requests == 0


def test_one_middleware_serves_several_event_loops_with_one_token(emulator: Emulator) -> None:
    middleware = _middleware("oauth2", emulator)

    async def ask() -> Any:
        async with (
            aiohttp.ClientSession(middlewares=(middleware,)) as session,
            session.post(emulator.graphql_url, json=QUERY) as answer,
        ):
            return await answer.json()

    assert asyncio.run(ask()) == ANSWER
    assert asyncio.run(ask()) == ANSWER
    assert emulator.counters.token_requests == 1


@pytest.mark.parametrize("kind", AUTH_KINDS)
async def test_an_aiohttp_error_built_from_a_signed_response_quotes_no_credential(
    emulator: Emulator, kind: str
) -> None:
    """raise_for_status's error keeps the request's headers (a live view): the credential
    is taken out of them once the request is sent."""
    emulator.fail_graphql_requests(1, status=500)
    middleware = _middleware(kind, emulator)
    async with aiohttp.ClientSession(middlewares=(middleware,), raise_for_status=True) as session:
        with pytest.raises(aiohttp.ClientResponseError) as caught:
            await session.post(emulator.graphql_url, json=QUERY)
    assert "Authorization" not in caught.value.request_info.headers
    secrets = [emulator.recent_client.client_secret]
    if kind == "oauth2":
        secrets.append(middleware.token.value)
    assert shown(caught.value, secrets) == []


class _Stopped(Exception):
    """Raised by :func:`_signed_to` after the signer: the request goes nowhere."""


async def _signed_to(middleware: Any, url: str, *, ws: bool = False) -> bool:
    """Whether ``middleware`` signs a request to ``url``; no network: a middleware after it
    notes the header and stops the request."""
    seen: list[bool] = []

    async def note(request: Any, handler: Any) -> Any:
        seen.append("Authorization" in request.headers)
        raise _Stopped

    async with aiohttp.ClientSession(middlewares=(middleware, note)) as session:
        with pytest.raises(_Stopped):
            await (session.ws_connect(url) if ws else session.get(url))
    return seen[0]


@pytest.mark.parametrize("kind", AUTH_KINDS)
async def test_the_middleware_signs_its_services_international_name_and_no_other(
    emulator: Emulator, kind: str
) -> None:
    """Names encoded as aiohttp sends them (IDNA 2008): faß.de is xn--fa-hia.de, and
    fass.de another domain."""
    for url in ("https://faß.de/graphql", "https://xn--fa-hia.de/graphql"):
        middleware = _middleware(kind, emulator, url=url)
        assert await _signed_to(middleware, "https://faß.de/graphql")
        assert await _signed_to(middleware, "https://xn--fa-hia.de/graphql")
        assert not await _signed_to(middleware, "https://fass.de/graphql")


async def test_a_middleware_signing_any_origin_signs_a_secure_websocket(
    emulator: Emulator,
) -> None:
    """wss is TLS, as https is; plain ws to another host is refused like plain http."""
    middleware = _middleware("api_key", emulator, sign_any_origin=True)
    assert await _signed_to(middleware, "wss://api.example.com/graphql", ws=True)
    with pytest.raises(ConfigurationError, match=r"over ws to api\.example\.com"):
        await _signed_to(middleware, "ws://api.example.com/graphql", ws=True)


async def test_the_middlewares_token_is_the_last_origin_it_signed(emulator: Emulator) -> None:
    middleware = _middleware("oauth2", emulator, sign_any_origin=True)
    await _signed_to(middleware, "https://a.example/graphql")
    first = middleware.token
    await _signed_to(middleware, "https://b.example/graphql")
    assert middleware.token is not first
    await _signed_to(middleware, "https://a.example/graphql")
    assert middleware.token is first


@pytest.mark.parametrize("kind", AUTH_KINDS)
async def test_an_environment_proxy_the_session_does_not_use_is_no_reason_to_refuse(
    emulator: Emulator, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp follows http_proxy only with trust_env: the middleware checks the proxy the
    request goes through, not the environment's."""
    set_http_proxy(monkeypatch, "http://192.0.2.1:3128")  # TEST-NET-1: never reached
    async with (
        aiohttp.ClientSession(middlewares=(_middleware(kind, emulator),)) as session,
        session.post(emulator.graphql_url, json=QUERY) as answer,
    ):
        assert await answer.json() == ANSWER
    async with aiohttp.ClientSession(
        middlewares=(_middleware(kind, emulator),), trust_env=True
    ) as session:
        with pytest.raises(ConfigurationError, match=r"192\.0\.2\.1"):
            await session.post(emulator.graphql_url, json=QUERY)


async def test_a_json_answer_the_middleware_read_can_still_be_streamed(
    emulator: Emulator,
) -> None:
    """The middleware reads a JSON answer for a refusal; the caller's code that reads
    ``content`` (iter_chunked, a streaming parser) still gets all of it."""
    async with (
        aiohttp.ClientSession(middlewares=(_middleware("oauth2", emulator),)) as session,
        session.post(emulator.graphql_url, json=QUERY) as answer,
    ):
        chunks = [chunk async for chunk in answer.content.iter_chunked(7)]
        assert json.loads(b"".join(chunks)) == ANSWER
        assert await answer.json() == ANSWER


@contextlib.contextmanager
def held_stream(status: int, content_type: str) -> Iterator[tuple[str, threading.Event]]:
    """A server whose first answer (``status``, ``content_type``) sends one chunk and holds
    the rest until the event is set; later answers are GraphQL's. Its URL and the event."""
    from aiohttp import web

    go_on = threading.Event()
    answered: list[int] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        answered.append(1)
        if len(answered) > 1:
            return web.json_response(ANSWER)
        return await _held_events(request, go_on, status, content_type)

    with serving(lambda app: app.router.add_route("*", "/graphql", answer)) as url:
        try:
            yield url + "/graphql", go_on
        finally:
            go_on.set()


async def test_a_download_is_handed_back_before_its_end(emulator: Emulator) -> None:
    """A body that is no JSON is the caller's to read: the response comes back unread."""
    with held_stream(200, "application/octet-stream") as (url, go_on):
        middleware = _middleware("oauth2", emulator, url=url)
        async with aiohttp.ClientSession(middlewares=(middleware,)) as session:
            answer = await asyncio.wait_for(session.post(url, json=QUERY), HANG_GUARD)
            assert await answer.content.readexactly(11) == b"data: one\n\n"
            go_on.set()
            assert await answer.read() == b"data: two\n\n"
            answer.release()


async def test_a_refused_stream_is_let_go_before_the_request_goes_again(
    emulator: Emulator,
) -> None:
    """A bare 401 as a stream is not read, but its connection goes before the re-send:
    with one connection allowed, the re-send would wait for it forever."""
    with held_stream(401, "text/event-stream") as (url, _):
        middleware = _middleware("oauth2", emulator, url=url)
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(
            middlewares=(middleware,), connector=connector
        ) as session:
            answer = await asyncio.wait_for(session.post(url, json=QUERY), HANG_GUARD)
            assert await answer.json() == ANSWER
    assert emulator.counters.token_requests == 2


async def test_an_api_key_error_keeps_no_secret_in_its_frames(emulator: Emulator) -> None:
    """A connection refused under the middleware: no frame of the chain holds the key."""
    with closed_port() as port:
        url = f"http://127.0.0.1:{port}/graphql"
        middleware = _middleware("api_key", emulator, url=url)
        async with aiohttp.ClientSession(middlewares=(middleware,)) as session:
            with pytest.raises(aiohttp.ClientConnectionError) as caught:
                await session.post(url, json=QUERY)
    assert shown(caught.value, [emulator.recent_client.client_secret]) == []


@pytest.mark.parametrize("module", MODULES, ids=lambda module: module.__name__)
@pytest.mark.parametrize("kind", AUTH_KINDS)
def test_an_httpx_request_sent_again_is_signed_again(
    emulator: Emulator, kind: str, module: Any
) -> None:
    """The same request object sent twice (``client.send``), its token revoked between:
    the auth signs it again, as its own, and renews the token; it was taken for the
    caller's own header and sent with the revoked token."""
    with module.Client(auth=_auth(service_httpx, kind, emulator)) as client:
        request = client.build_request("POST", emulator.graphql_url, json=QUERY)
        assert client.send(request).json() == ANSWER
        emulator.revoke_tokens()
        assert client.send(request).json() == ANSWER
    assert emulator.counters.token_requests == (2 if kind == "oauth2" else 0)


@pytest.mark.parametrize("share_tokens", [True, False])
def test_an_origin_in_use_keeps_its_token_while_the_client_calls_many_hosts(
    emulator: Emulator, share_tokens: bool
) -> None:
    """Signing every origin, an auth keeps rules for a few APIs and decisions for more
    origins: one in use keeps its token manager, and so its token, however many other
    hosts its client calls in between."""
    tokens_seen: set[str] = set()

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "busy.example":
            tokens_seen.add(request.headers["Authorization"])
        return httpx.Response(200, json=ANSWER)

    auth = service_httpx.OAuth2Auth.from_env(
        emulator.environ(), retry=NO_WAIT, sign_any_origin=True, share_tokens=share_tokens
    )
    others = 100  # more than the decisions kept (64) and the rules (16)
    with httpx.Client(auth=auth, transport=httpx.MockTransport(answer)) as client:
        for i in range(others):
            client.post("https://busy.example/graphql", json=QUERY)
            client.post(f"https://other{i}.example/graphql", json=QUERY)
    assert len(tokens_seen) == 1
    assert emulator.counters.token_requests == 1 + others


async def test_a_stream_through_a_transports_client_is_handed_back_before_its_end(
    emulator: Emulator,
) -> None:
    """``transport.client.stream()`` to the service: the answer comes back as its first
    part arrives, not once it ends (a server-sent events stream may never end)."""
    with held_stream(200, "text/event-stream") as (url, go_on):
        transport = service_httpx.OAuth2HTTPXAsyncTransport.from_env(
            emulator.environ(), url=url, retry=NO_WAIT
        )
        async with Client(transport=transport):
            # Buffered whole, the answer would wait for go_on, set below: the read timeout
            # ends that wait.
            client = transport.client
            async with client.stream("POST", url, json=QUERY, timeout=HANG_GUARD / 2) as response:
                lines = response.aiter_lines()
                assert await anext(lines) == "data: one"
                go_on.set()
                assert [line async for line in lines if line] == ["data: two"]


async def _held_events(
    request: Any, go_on: threading.Event, status: int, content_type: str
) -> Any:
    """An answer of ``status`` and ``content_type`` that sends one event, and the next once
    ``go_on`` is set (within HANG_GUARD)."""
    from aiohttp import web

    response = web.StreamResponse(status=status, headers={"Content-Type": content_type})
    await response.prepare(request)
    await response.write(b"data: one\n\n")
    await asyncio.get_running_loop().run_in_executor(None, go_on.wait, HANG_GUARD)
    await response.write(b"data: two\n\n")
    await response.write_eof()
    return response


@contextlib.contextmanager
def api_with_events() -> Iterator[tuple[str, threading.Event]]:
    """An API on 127.0.0.1: ``/graphql`` answers every query; ``/refused`` refuses every
    token; ``/events`` sends one event and holds the next until the event is set. Its base
    URL and the event."""
    from aiohttp import web

    go_on = threading.Event()

    async def graphql(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(ANSWER)

    async def refused(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"data": None, "errors": [UNAUTHENTICATED_ERROR]})

    async def events(request: web.Request) -> web.StreamResponse:
        return await _held_events(request, go_on, 200, "text/event-stream")

    def routes(app: web.Application) -> None:
        app.router.add_post("/graphql", graphql)
        app.router.add_post("/refused", refused)
        app.router.add_get("/events", events)

    with serving(routes) as base:
        try:
            yield base, go_on
        finally:
            go_on.set()


def test_a_stream_opened_with_a_transports_client_during_its_call_is_handed_back_at_once(
    emulator: Emulator,
) -> None:
    """A response hook streams through the transport's own client while the transport's
    gql call runs: only the call's own answer is read whole; the stream comes back at its
    first event."""
    with api_with_events() as (base, go_on):
        streamed: list[str] = []

        def hook(response: Any) -> None:
            if streamed or not response.request.url.path.endswith("/graphql"):
                return
            # Read whole first, the stream would wait for go_on: the read timeout ends that.
            with transport.client.stream("GET", base + "/events", timeout=HANG_GUARD / 2) as r:
                lines = (line for line in r.iter_lines() if line)
                streamed.append(next(lines))
                go_on.set()
                streamed.extend(lines)

        transport = service_httpx.OAuth2HTTPXTransport.from_env(
            emulator.environ(),
            url=base + "/graphql",
            retry=NO_WAIT,
            event_hooks={"response": [hook]},
        )
        with Client(transport=transport) as session:
            assert session.execute(COUNT) == ANSWER["data"]
    assert streamed == ["data: one", "data: two"]


def test_another_transports_refusal_during_a_call_is_not_the_calls(emulator: Emulator) -> None:
    """A response hook of transport A's call posts through transport B's client, which the
    API refuses to the end: B's refusal is B's caller's, and A's call gets its answer."""
    with api_with_events() as (base, _):
        refusals: list[int] = []

        def hook(response: Any) -> None:
            if not refusals and response.request.url.path.endswith("/graphql"):
                refusals.append(other.client.post(base + "/refused", json=QUERY).status_code)

        environ = emulator.environ()
        other = service_httpx.OAuth2HTTPXTransport.from_env(environ, url=base + "/graphql")
        transport = service_httpx.OAuth2HTTPXTransport.from_env(
            environ, url=base + "/graphql", retry=NO_WAIT, event_hooks={"response": [hook]}
        )
        with Client(transport=other), Client(transport=transport) as session:
            assert session.execute(COUNT) == ANSWER["data"]
    assert refusals == [200]
