"""The auth objects on plain requests and httpx (and httpx2) clients, without gql."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
from gql import Client, GraphQLRequest
from support import (
    COUNT,
    NO_WAIT,
    bare_401s,
    finish,
    in_child,
    poll,
    serving,
    start_thread,
)

from gql_service_auth import ConfigurationError, TokenRequestError
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
