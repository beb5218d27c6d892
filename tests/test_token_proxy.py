"""The token request's proxy: it goes where the GraphQL traffic goes, or where it is told.

A real forward proxy (proxy.py, from the test extra) runs on 127.0.0.1 as a subprocess.
It adds ``Via: 1.1 proxy.py ...`` to what it forwards, so the emulator's record of a
request tells whether it came through the proxy; its access log names what it forwarded.
"""

from __future__ import annotations

import functools
import secrets
import socket
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gql import Client
from gql.transport.exceptions import TransportConnectionFailed
from support import (
    COUNT,
    STACK_REASONS,
    Proxy,
    closed_port,
    exception_chain,
    running_proxy,
    set_http_proxy,
    via_proxy,
    wait_until,
)
from yarl import URL

from gql_service_auth import (
    ApiKeyTransport,
    ConfigurationError,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
)
from gql_service_auth.emulator import Emulator

_UNROUTABLE_PROXY = "http://192.0.2.1:3128"  # TEST-NET-1, never connected to: refused first

pytestmark = pytest.mark.stacks("aiohttp", reason=STACK_REASONS["kw"])


def _leak_shaped() -> str:
    """A password the autouse leak scanner (conftest.py) recognises wherever it shows."""
    return "emu-secret-" + secrets.token_urlsafe(18)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """One open proxy for the module's tests (each has its own emulator and port)."""
    with running_proxy(tmp_path_factory.mktemp("proxy")) as running:
        yield running


@pytest.fixture
def proxy_login() -> tuple[str, str]:
    """The user name and password the authenticating proxy asks for."""
    return "tester", _leak_shaped()


@pytest.fixture
def auth_proxy(tmp_path: Path, proxy_login: tuple[str, str]) -> Iterator[Proxy]:
    """A proxy that answers 407 without the right Proxy-Authorization."""
    user, password = proxy_login
    with running_proxy(tmp_path / "auth-proxy", "--basic-auth", f"{user}:{password}") as running:
        yield running


async def _query(transport: OAuth2Transport) -> None:
    async with Client(transport=transport) as session:
        await session.execute(COUNT)


async def test_token_proxy_carries_the_token_request(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], proxy: Proxy
) -> None:
    """token_proxy= sends the token request, and only it, through the proxy."""
    await _query(make_oauth2(token_proxy=proxy.url))
    assert emulator.counters.token_requests == 1
    assert via_proxy(emulator, "/oauth2/token") == [True]
    assert via_proxy(emulator, "/graphql") == [False]
    await wait_until(lambda: proxy.forwarded(emulator, "/oauth2/token"))


async def test_token_proxy_passes_through_from_env(
    emulator: Emulator, service_env: dict[str, str], proxy: Proxy
) -> None:
    """from_env() passes token_proxy= on to the constructor."""
    transport = OAuth2Transport.from_env(service_env, token_proxy=URL(proxy.url))
    await _query(transport)
    assert via_proxy(emulator, "/oauth2/token") == [True]


async def test_trust_env_of_the_graphql_session_sends_the_token_request_through_http_proxy(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """client_session_args={"trust_env": True} applies to the token request by default."""
    set_http_proxy(monkeypatch, proxy.url)
    await _query(make_oauth2(client_session_args={"trust_env": True}))
    assert via_proxy(emulator, "/oauth2/token") == [True]
    assert via_proxy(emulator, "/graphql") == [True]
    await wait_until(lambda: proxy.forwarded(emulator, "/oauth2/token"))


async def test_no_proxy_is_honoured_for_the_token_request(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With trust_env, a token host listed in NO_PROXY is reached directly."""
    set_http_proxy(monkeypatch, proxy.url, no_proxy="127.0.0.1")
    await _query(make_oauth2(client_session_args={"trust_env": True}))
    assert emulator.counters.token_requests == 1
    assert via_proxy(emulator, "/oauth2/token") == [False]
    assert not proxy.forwarded(emulator, "/oauth2/token")


async def test_without_trust_env_the_token_request_ignores_http_proxy(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By default, as in aiohttp, HTTP_PROXY is not read: the token request goes directly."""
    set_http_proxy(monkeypatch, proxy.url)
    await _query(make_oauth2())
    assert emulator.counters.token_requests == 1
    assert via_proxy(emulator, "/oauth2/token") == [False]


async def test_the_graphql_sessions_proxy_is_followed_by_default(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], proxy: Proxy
) -> None:
    """client_session_args={"proxy": ...} carries the token request too."""
    await _query(make_oauth2(client_session_args={"proxy": proxy.url}))
    assert via_proxy(emulator, "/oauth2/token") == [True]
    assert via_proxy(emulator, "/graphql") == [True]


async def test_token_session_args_replace_what_client_session_args_say(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """token_session_args={} sends the token request directly, however the GraphQL goes."""
    set_http_proxy(monkeypatch, proxy.url)
    transport = make_oauth2(
        client_session_args={"proxy": proxy.url, "trust_env": True}, token_session_args={}
    )
    await _query(transport)
    assert via_proxy(emulator, "/oauth2/token") == [False]
    assert via_proxy(emulator, "/graphql") == [True]


async def test_trust_env_in_token_session_args(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """token_session_args={"trust_env": True} proxies the token request alone."""
    set_http_proxy(monkeypatch, proxy.url)
    await _query(make_oauth2(token_session_args={"trust_env": True}))
    assert via_proxy(emulator, "/oauth2/token") == [True]
    assert via_proxy(emulator, "/graphql") == [False]


async def test_proxy_credentials_in_the_url_or_as_proxy_auth(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    auth_proxy: Proxy,
    proxy_login: tuple[str, str],
) -> None:
    """A proxy that asks for credentials gets them, from the URL or from proxy_auth."""
    user, password = proxy_login
    with_login = URL(auth_proxy.url).with_user(user).with_password(password)
    transport = make_oauth2(token_proxy=str(with_login))
    assert password not in repr(transport)
    await _query(transport)
    emulator.revoke_tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # BasicAuth, from aiohttp 3.14
        login = aiohttp.BasicAuth(user, password)
    # Were it passed on as aiohttp's proxy_auth, aiohttp 3.14 would warn, and the warnings
    # filter would turn that into an error.
    args: Any = {"proxy": auth_proxy.url, "proxy_auth": login}
    await _query(make_oauth2(token_session_args=args))
    assert via_proxy(emulator, "/oauth2/token") == [True, True]


async def test_a_proxy_refusing_its_credentials_is_reported_without_them(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], auth_proxy: Proxy
) -> None:
    """A 407 ends in a TokenRequestError that points at the proxy and never shows its password."""
    wrong = URL(auth_proxy.url).with_user("tester").with_password(_leak_shaped())
    transport = make_oauth2(token_proxy=str(wrong))
    with pytest.raises(TokenRequestError) as caught:
        await _query(transport)
    assert caught.value.status == 407
    assert "proxy" in str(caught.value).lower()
    assert emulator.counters.token_requests == 0


async def test_an_unreachable_proxy_is_retried_then_reported_without_its_password(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A proxy that refuses connections is a retryable failure whose message names the proxy."""
    policy = RetryPolicy(attempts=2, wait_initial=0, wait_max=0, wait_jitter=0)
    with closed_port() as port:
        closed = f"http://tester:{_leak_shaped()}@127.0.0.1:{port}"
        with pytest.raises(TokenRequestError) as caught:
            await _query(make_oauth2(token_proxy=closed, retry=policy))
    assert caught.value.retryable
    assert caught.value.attempts == 2
    assert "token_proxy" in str(caught.value)
    assert emulator.counters.token_requests == 0


async def test_a_connector_factory_is_called_for_each_fetch(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], proxy: Proxy
) -> None:
    """token_session_args["connector"] makes a new connector on the fetch's loop, each time."""
    made: list[aiohttp.BaseConnector] = []

    def connector() -> aiohttp.BaseConnector:
        made.append(aiohttp.TCPConnector(family=socket.AF_INET, limit=1))
        return made[-1]

    transport = make_oauth2(token_session_args={"connector": connector, "proxy": proxy.url})
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        await session.execute(COUNT)
    assert len(made) == 2
    assert all(c.closed for c in made)
    assert via_proxy(emulator, "/oauth2/token") == [True, True]


async def test_a_connector_factory_returning_one_instance_fails_clearly(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The second fetch of a factory that returns its first, closed, connector says so."""
    single: list[aiohttp.BaseConnector] = []

    def connector() -> aiohttp.BaseConnector:
        if not single:
            single.append(aiohttp.TCPConnector())
        return single[0]

    transport = make_oauth2(token_session_args={"connector": connector})
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        with pytest.raises(TokenRequestError, match="closed connector") as caught:
            await session.execute(COUNT)
    assert not caught.value.retryable
    assert emulator.counters.token_requests == 1


async def test_a_connector_instance_is_refused_with_what_to_pass_instead(
    make_oauth2: Callable[..., OAuth2Transport],
) -> None:
    """A connector belongs to the loop it was made on: a factory is asked for instead."""
    connector = aiohttp.TCPConnector()
    try:
        with pytest.raises(ConfigurationError, match=r"functools\.partial\(aiohttp\.TCPConnector"):
            make_oauth2(token_session_args={"connector": connector})
    finally:
        await connector.close()
    make_oauth2(token_session_args={"connector": functools.partial(aiohttp.TCPConnector)})


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"headers": {"X-Team": "billing"}}, "token_params"),
        ({"auth": "user:password"}, "more than the client credentials"),
        ({"cookies": {"session": "abc"}}, "more than the client credentials"),
        ({"cookie_jar": None}, "more than the client credentials"),
        ({"base_url": "http://127.0.0.1"}, "token_url"),
        ({"raise_for_status": True}, "RFC 6749"),
        ({"timeout": 3}, "RetryPolicy"),
        ({"ssl": False}, "ssl="),
        ({"loop": None}, "event loop of their own"),
        ({"connector_owner": False}, "closes the connector"),
        ({"json_serialize": str}, "it accepts connector, max_field_size"),
        ({"trust_env": "yes"}, "must be a bool"),
        ({"read_bufsize": 0}, "at least 1"),
        ({"trace_configs": ["trace"]}, "TraceConfig"),
        ({"proxy": 3128}, "str or a yarl.URL"),
        ({"proxy": "socks5://127.0.0.1:1080"}, "connector factory"),
        ({"proxy": "http://127.0.0.1:3128", "proxy_auth": ("u", "p")}, "aiohttp.BasicAuth"),
        ({"trust_env": True, "proxy_auth": ("u", "p")}, "needs a proxy"),
    ],
)
def test_bad_token_session_args_are_refused(
    make_oauth2: Callable[..., OAuth2Transport], args: dict[str, Any], says: str
) -> None:
    """A key that cannot work, or would change what the token request means, is refused."""
    with pytest.raises(ConfigurationError) as caught:
        make_oauth2(token_session_args=args)
    assert says in str(caught.value)
    assert "token_session_args" in str(caught.value)


def test_a_proxy_given_twice_is_refused(make_oauth2: Callable[..., OAuth2Transport]) -> None:
    """token_proxy= and token_session_args["proxy"] cannot both be given."""
    with pytest.raises(ConfigurationError, match="given twice"):
        make_oauth2(token_proxy=_UNROUTABLE_PROXY, token_session_args={"proxy": _UNROUTABLE_PROXY})


def test_token_session_args_must_be_a_mapping(make_oauth2: Callable[..., OAuth2Transport]) -> None:
    """A list of pairs, or anything else, is refused with the type named."""
    with pytest.raises(ConfigurationError, match="not list"):
        make_oauth2(token_session_args=[("trust_env", True)])


def test_a_malformed_proxy_url_is_refused_without_showing_it(
    make_oauth2: Callable[..., OAuth2Transport],
) -> None:
    """A proxy URL may hold a password, so a message about it never quotes it."""
    password = _leak_shaped()
    with pytest.raises(ConfigurationError, match="token_proxy is not a valid URL"):
        make_oauth2(token_proxy=f"http://user:{password}@[::1")
    with pytest.raises(ConfigurationError, match="http:// or https:// proxy URL"):
        make_oauth2(token_proxy=f"ftp://user:{password}@127.0.0.1:21")


def test_plain_http_token_url_through_a_remote_proxy_needs_allow_insecure_http(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """An http:// token URL shows the secret to the proxy: loopback only, unless allowed."""
    remote = URL(_UNROUTABLE_PROXY).with_user("tester").with_password(_leak_shaped())
    with pytest.raises(ConfigurationError, match="allow_insecure_http=True") as caught:
        make_oauth2(token_proxy=remote)
    assert "192.0.2.1" in str(caught.value)
    with pytest.raises(ConfigurationError, match=r"client_session_args\['proxy'\]"):
        make_oauth2(client_session_args={"proxy": _UNROUTABLE_PROXY})
    make_oauth2(token_proxy=remote, allow_insecure_http=True)
    make_oauth2(token_proxy="https://192.0.2.1:3128")  # TLS to the proxy itself
    make_oauth2(
        token_url="https://auth.example.com/oauth2/token", token_proxy=_UNROUTABLE_PROXY
    )  # a CONNECT tunnel: the proxy sees only TLS


async def test_plain_http_token_url_through_a_remote_environment_proxy_is_refused(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With trust_env, an HTTP_PROXY that is not loopback gets no clear-text credentials."""
    set_http_proxy(monkeypatch, _UNROUTABLE_PROXY)
    transport = make_oauth2(client_session_args={"trust_env": True})
    with pytest.raises(TokenRequestError, match="NO_PROXY") as caught:
        await _query(transport)
    assert not caught.value.retryable
    assert caught.value.attempts == 1
    assert emulator.counters.token_requests == 0


async def test_a_tunnel_refused_by_the_proxy_is_reported_without_its_password(
    make_oauth2: Callable[..., OAuth2Transport], auth_proxy: Proxy
) -> None:
    """An https token URL goes through a CONNECT tunnel; a 407 to it shows no credential."""
    wrong = URL(auth_proxy.url).with_user("tester").with_password(_leak_shaped())
    policy = RetryPolicy(attempts=1, wait_initial=0, wait_max=0, wait_jitter=0)
    transport = make_oauth2(
        token_url="https://127.0.0.1:9/oauth2/token", token_proxy=wrong, retry=policy
    )
    with pytest.raises(TokenRequestError) as caught:
        await _query(transport)
    assert isinstance(caught.value.__cause__, aiohttp.ClientHttpProxyError)
    assert caught.value.__cause__.status == 407
    assert "token_proxy" in str(caught.value)


async def test_a_tunnel_refused_to_the_graphql_request_shows_no_proxy_password(
    emulator: Emulator, auth_proxy: Proxy
) -> None:
    """The same scrubbing covers the GraphQL session's proxy (client_session_args)."""
    wrong = URL(auth_proxy.url).with_user("tester").with_password(_leak_shaped())
    transport = ApiKeyTransport(
        "https://127.0.0.1:9/graphql",
        client_id=emulator.recent_client.client_id,
        client_secret=emulator.recent_client.client_secret,
        client_session_args={"proxy": str(wrong)},
    )
    with pytest.raises(TransportConnectionFailed) as caught:
        await _query(transport)
    assert any(isinstance(e, aiohttp.ClientHttpProxyError) for e in exception_chain(caught.value))
