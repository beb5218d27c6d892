"""The token request's proxy on gql's requests and httpx transports.

It goes where the stack's own requests go: through requests' ``proxies=`` or httpx's
``proxy=``, or through the environment's proxy variables (both stacks read them by
default), honouring ``NO_PROXY``; ``token_proxy=`` sends it alone through a proxy. A
real forward proxy (proxy.py) runs on 127.0.0.1 and adds ``Via: 1.1 proxy.py`` to what it
forwards, so the emulator's record of each request tells which way it came.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import COUNT, Proxy, running_proxy, set_http_proxy, via_proxy
from ways import WAYS, Call, Way

from gql_service_auth import ConfigurationError
from gql_service_auth.emulator import Emulator


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    with running_proxy(tmp_path_factory.mktemp("proxy")) as running:
        yield running


@pytest.fixture(params=WAYS, ids=lambda way: way.name)
def way(request: pytest.FixtureRequest) -> Way:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def oauth2(emulator: Emulator, way: Way) -> Callable[..., Any]:
    def make(**kwargs: Any) -> Any:
        client = emulator.recent_client
        return way.oauth2(
            emulator.graphql_url,
            token_url=emulator.token_url,
            client_id=client.client_id,
            client_secret=client.client_secret,
            **kwargs,
        )

    return make


def _stack_proxy(way: Way, url: str) -> dict[str, Any]:
    """The keyword with which the stack's own requests go through ``url``."""
    if way.name == "requests":
        return {"proxies": {"http": url, "https": url}}
    return {"proxy": url}


def test_the_stacks_own_proxy_carries_the_token_request(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator, proxy: Proxy
) -> None:
    """requests' proxies= and httpx's proxy= apply to the token request too."""
    way.one(oauth2(**_stack_proxy(way, proxy.url)), Call(COUNT))
    assert via_proxy(emulator, "/oauth2/token") == [True]
    assert via_proxy(emulator, "/graphql") == [True]


def test_the_environments_proxy_carries_the_token_request(
    way: Way,
    oauth2: Callable[..., Any],
    emulator: Emulator,
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both stacks read HTTP_PROXY by default, and so does their token request."""
    set_http_proxy(monkeypatch, proxy.url)
    way.one(oauth2(), Call(COUNT))
    assert via_proxy(emulator, "/oauth2/token") == [True]
    assert via_proxy(emulator, "/graphql") == [True]


def test_no_proxy_is_honoured_for_the_token_request(
    way: Way,
    oauth2: Callable[..., Any],
    emulator: Emulator,
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_http_proxy(monkeypatch, proxy.url, no_proxy="127.0.0.1")
    way.one(oauth2(), Call(COUNT))
    assert via_proxy(emulator, "/oauth2/token") == [False]
    assert via_proxy(emulator, "/graphql") == [False]


def test_token_proxy_carries_the_token_request_alone(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator, proxy: Proxy
) -> None:
    way.one(oauth2(token_proxy=proxy.url), Call(COUNT))
    assert via_proxy(emulator, "/oauth2/token") == [True]
    assert via_proxy(emulator, "/graphql") == [False]


def test_token_session_args_send_the_token_request_directly(
    way: Way,
    oauth2: Callable[..., Any],
    emulator: Emulator,
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """token_session_args={} replaces what the stack says, as on the aiohttp transport."""
    set_http_proxy(monkeypatch, proxy.url)
    way.one(oauth2(token_session_args={}), Call(COUNT))
    assert via_proxy(emulator, "/oauth2/token") == [False]
    assert via_proxy(emulator, "/graphql") == [True]


@pytest.mark.parametrize("method", ["api_key", "oauth2"])
def test_a_remote_environment_proxy_gets_no_clear_text_credentials(
    way: Way,
    oauth2: Callable[..., Any],
    emulator: Emulator,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
) -> None:
    """Plain http to loopback through a proxy that is not loopback is refused, not sent:
    requests and httpx follow HTTP_PROXY by default, and the proxy would read the key or
    token of every request, and the secret of the token request."""
    set_http_proxy(monkeypatch, "http://192.0.2.1:3128")  # TEST-NET-1: never reached
    client = emulator.recent_client
    transport = (
        way.api_key(
            emulator.graphql_url, client_id=client.client_id, client_secret=client.client_secret
        )
        if method == "api_key"
        else oauth2()
    )
    with pytest.raises(ConfigurationError, match="NO_PROXY"):
        way.one(transport, Call(COUNT))
    assert emulator.counters.token_requests == 0
    assert emulator.counters.graphql_requests == 0


def test_a_remote_proxy_given_to_the_stack_gets_no_clear_text_credentials(
    way: Way, oauth2: Callable[..., Any]
) -> None:
    with pytest.raises(ConfigurationError, match=r"192\.0\.2\.1"):
        oauth2(**_stack_proxy(way, "http://192.0.2.1:3128"))
    oauth2(**_stack_proxy(way, "http://192.0.2.1:3128"), allow_insecure_http=True)


def test_the_token_request_follows_the_stacks_proxy_in_any_form_it_takes(
    way: Way, oauth2: Callable[..., Any], emulator: Emulator, proxy: Proxy
) -> None:
    """requests' per-host keys (scheme://host, all://host); httpx's Proxy objects."""
    host = emulator.token_url.split("/")[2].split(":")[0]
    if way.name == "requests":
        keyword: dict[str, Any] = {"proxies": {f"all://{host}": proxy.url}}
    else:
        keyword = {"proxy": importlib.import_module(_gql_httpx_module()).Proxy(proxy.url)}
    way.one(oauth2(**keyword), Call(COUNT))
    assert via_proxy(emulator, "/oauth2/token") == [True]
    assert via_proxy(emulator, "/graphql") == [True]


def _gql_httpx_module() -> str:
    """The httpx gql imported (httpx2 when installed): its Proxy is the one its client takes."""
    from gql.transport import httpx as gql_httpx

    return gql_httpx.httpx.__name__  # type: ignore[attr-defined,no-any-return]
