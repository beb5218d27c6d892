"""Building transports: from the environment, and refusing bad or unsafe settings."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from gql import Client
from support import (
    COUNT,
    ONE_ATTEMPT,
    STACK_REASONS,
    query,
    unfolded,
)

from gql_service_auth import (
    ApiKeyRejectedError,
    ApiKeyTransport,
    ConfigurationError,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
)
from gql_service_auth.emulator import Emulator
from gql_service_auth.httpx import OAuth2Auth as HTTPXOAuth2Auth
from gql_service_auth.httpx import OAuth2HTTPXTransport
from gql_service_auth.requests import OAuth2Auth as RequestsOAuth2Auth
from gql_service_auth.requests import OAuth2RequestsTransport

SECRET = "s3cr3t-value"


async def test_oauth2_from_env(emulator: Emulator) -> None:
    """OAuth2Transport.from_env reads the four SERVICE_* variables and works."""
    environ = emulator.environ(emulator.legacy_client)
    transport = OAuth2Transport.from_env(environ)
    assert transport.url == emulator.graphql_url
    assert transport.token_url == emulator.token_url
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
    assert emulator.counters.token_requests == 1


async def test_api_key_from_env(emulator: Emulator) -> None:
    """ApiKeyTransport.from_env needs no SERVICE_AUTH_URL."""
    environ = emulator.environ()
    del environ["SERVICE_AUTH_URL"]
    async with Client(transport=ApiKeyTransport.from_env(environ)) as session:
        await session.execute(COUNT)


_API = "https://api.example.com/graphql"
_TOKEN = "https://auth.example.com/oauth2/token"


def _transport(cls: Callable[..., object]) -> Callable[..., object]:
    def build(**options: Any) -> object:
        return cls(_API, token_url=_TOKEN, client_id="id", client_secret=SECRET, **options)

    build.__name__ = cls.__name__
    return build


def _auth(cls: Callable[..., object], stack: str) -> Callable[..., object]:
    def build(**options: Any) -> object:
        return cls(_TOKEN, "id", SECRET, url=_API, **options)

    build.__name__ = f"{stack} OAuth2Auth"
    return build


OAUTH2_BUILDERS = [
    _transport(OAuth2Transport),
    _transport(OAuth2RequestsTransport),
    _transport(OAuth2HTTPXTransport),
    _auth(RequestsOAuth2Auth, "requests"),
    _auth(HTTPXOAuth2Auth, "httpx"),
]
"""Every kind of OAuth2 object, each built with the given token keywords."""


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an environ argument, the process environment is read."""
    monkeypatch.setenv("SERVICE_BASE_URL", "https://api.example.com/")
    monkeypatch.setenv("SERVICE_CLIENT_ID", "id")
    monkeypatch.setenv("SERVICE_CLIENT_SECRET", SECRET)
    assert ApiKeyTransport.from_env().url == "https://api.example.com/graphql"


def test_from_env_passes_keywords_through() -> None:
    """Keywords given to from_env reach the constructor."""
    environ = {
        "SERVICE_BASE_URL": "https://api.example.com",
        "SERVICE_AUTH_URL": "https://auth.example.com",
        "SERVICE_CLIENT_ID": "id",
        "SERVICE_CLIENT_SECRET": SECRET,
    }
    transport = OAuth2Transport.from_env(environ, headers={"X-Team": "a"}, max_renewals=2)
    assert transport.headers == {"X-Team": "a"}
    assert transport.token_url == "https://auth.example.com/oauth2/token"


async def test_from_env_keywords_win_over_the_environment(emulator: Emulator) -> None:
    """url, token_url, client_id and client_secret given by keyword replace their variable."""
    environ = {
        "SERVICE_BASE_URL": emulator.base_url,
        "SERVICE_CLIENT_ID": "env-id",
        "SERVICE_CLIENT_SECRET": "env-secret",
    }
    transport = OAuth2Transport.from_env(
        environ, token_url=emulator.token_url, client_secret=SECRET, retry=ONE_ATTEMPT
    )
    assert transport.token_url == emulator.token_url  # no SERVICE_AUTH_URL read
    # What the token request sends (the emulator knows neither, and refuses them).
    with pytest.raises(TokenRequestError):
        await query(transport)
    (sent,) = [r.form for r in emulator.requests if r.path == "/oauth2/token"]
    assert sent["client_secret"] == SECRET
    assert sent["client_id"] == "env-id"
    environ["SERVICE_AUTH_URL"] = "https://other.example.com"
    transport = OAuth2Transport.from_env(
        environ, url="https://api.example.com/v2/graphql", token_url="https://a.example.com/t"
    )
    assert (transport.url, transport.token_url) == (
        "https://api.example.com/v2/graphql",
        "https://a.example.com/t",
    )
    api_key = ApiKeyTransport.from_env(
        {}, url="https://x.example.com/graphql", client_id="i", client_secret=SECRET
    )
    assert api_key.url == "https://x.example.com/graphql"


@pytest.mark.parametrize(
    ("variable", "value", "path"),
    [
        ("SERVICE_BASE_URL", "https://{host}/graphql", "/graphql"),
        ("SERVICE_BASE_URL", "https://{host}/graphql/", "/graphql"),
        ("SERVICE_AUTH_URL", "https://{host}/oauth2/token", "/oauth2/token"),
    ],
)
def test_url_already_ending_in_the_path_is_used_as_it_is_and_said_once(
    caplog: pytest.LogCaptureFixture, variable: str, value: str, path: str
) -> None:
    """A variable holding the endpoint's full URL does not get the path twice; one INFO says so."""
    caplog.set_level(logging.INFO, logger="gql_service_auth")
    # A host of its own per test: the note is logged once per variable and value.
    host = f"{variable.lower().replace('_', '-')}-{len(value)}.example.com"
    environ = {
        "SERVICE_BASE_URL": "https://api.example.com",
        "SERVICE_AUTH_URL": "https://auth.example.com",
        "SERVICE_CLIENT_ID": "id",
        "SERVICE_CLIENT_SECRET": SECRET,
        variable: value.format(host=host),
    }
    for _ in range(3):
        transport = OAuth2Transport.from_env(environ)
    endpoint = transport.url if variable == "SERVICE_BASE_URL" else transport.token_url
    assert endpoint == f"https://{host}{path}"
    notes = [r.getMessage() for r in caplog.records if "url_path_already_present" in r.msg]
    assert notes == [f"gql_service_auth.url_path_already_present variable={variable} path={path}"]


@pytest.mark.parametrize(
    "missing",
    ["SERVICE_BASE_URL", "SERVICE_AUTH_URL", "SERVICE_CLIENT_ID", "SERVICE_CLIENT_SECRET"],
)
@pytest.mark.parametrize("value", [None, "", "   "])
def test_missing_variable_is_named(missing: str, value: str | None) -> None:
    """A missing or empty variable raises ConfigurationError naming it."""
    environ = {
        "SERVICE_BASE_URL": "https://api.example.com",
        "SERVICE_AUTH_URL": "https://auth.example.com",
        "SERVICE_CLIENT_ID": "id",
        "SERVICE_CLIENT_SECRET": SECRET,
    }
    if value is None:
        del environ[missing]
    else:
        environ[missing] = value
    with pytest.raises(ConfigurationError, match=missing):
        OAuth2Transport.from_env(environ)


async def test_constructor_never_reads_the_environment(
    emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Explicit arguments win; SERVICE_* variables are ignored by __init__."""
    monkeypatch.setenv("SERVICE_CLIENT_ID", "from-env")
    transport = ApiKeyTransport(emulator.graphql_url, client_id="a", client_secret=SECRET)
    with pytest.raises(ApiKeyRejectedError):  # the emulator knows no client "a"
        await query(transport)
    (sent,) = [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"]
    assert sent == f"SERVICE-API-KEY a:{SECRET}"
    assert "from-env" not in sent


@pytest.mark.parametrize("field", ["url", "token_url"])
def test_plain_http_to_a_remote_host_is_refused(field: str) -> None:
    """Credentials over http:// to a non-loopback host need an explicit opt-in."""
    urls = {"url": "https://api.example.com/graphql", "token_url": "https://a.example.com/t"}
    urls[field] = urls[field].replace("https://", "http://")
    with pytest.raises(ConfigurationError, match="allow_insecure_http=True"):
        OAuth2Transport(urls.pop("url"), client_id="id", client_secret=SECRET, **urls)
    OAuth2Transport(
        urls.pop("url", "http://api.example.com/graphql"),
        token_url=urls.get("token_url", "http://a.example.com/t"),
        client_id="id",
        client_secret=SECRET,
        allow_insecure_http=True,
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/graphql",
        "http://127.8.9.1/graphql",
        "http://localhost/graphql",
        "http://[::1]:80/graphql",
    ],
)
def test_plain_http_to_loopback_is_allowed(url: str) -> None:
    """Loopback addresses need no opt-in: nothing leaves the machine."""
    ApiKeyTransport(url, client_id="id", client_secret=SECRET)


@pytest.mark.parametrize(
    "url",
    ["ftp://api.example.com/graphql", "api.example.com/graphql", "https://u:p@api.example.com/"],
)
def test_malformed_urls_are_refused(url: str) -> None:
    """Only http(s) URLs without embedded credentials are accepted."""
    with pytest.raises(ConfigurationError):
        ApiKeyTransport(url, client_id="id", client_secret=SECRET)


def test_auth_keyword_is_refused() -> None:
    """auth= cannot be combined with the transport's own Authorization header."""
    with pytest.raises(ConfigurationError, match="auth="):
        ApiKeyTransport(
            "https://api.example.com/graphql",
            client_id="id",
            client_secret=SECRET,
            auth=("user", "password"),  # type: ignore[call-arg]
        )


def test_authorization_in_headers_is_refused() -> None:
    """A default Authorization header would fight the transport's own."""
    with pytest.raises(ConfigurationError, match="Authorization"):
        OAuth2Transport(
            "https://api.example.com/graphql",
            token_url="https://auth.example.com/oauth2/token",
            client_id="id",
            client_secret=SECRET,
            headers={"authorization": "Bearer x"},
        )


@pytest.mark.parametrize(
    ("client_id", "client_secret", "match"),
    [
        ("", SECRET, "client_id is empty"),
        ("id", "", "client_secret is empty"),
        ("a:b", SECRET, "must not contain ':'"),
        ("id", SECRET + "\n", "client_secret has surrounding whitespace"),
        ("id", 42, "client_secret must be a str"),
    ],
)
def test_bad_credentials_are_refused_without_echoing_them(
    client_id: Any, client_secret: Any, match: str
) -> None:
    """Malformed credentials raise ConfigurationError whose message holds no secret."""
    with pytest.raises(ConfigurationError, match=match) as caught:
        ApiKeyTransport(
            "https://api.example.com/graphql", client_id=client_id, client_secret=client_secret
        )
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("refresh_margin", -1),
        ("refresh_margin", float("nan")),
        ("default_expires_in", 0),
        ("default_expires_in", True),
        ("max_renewals", -1),
        ("max_renewals", 1.5),
        ("token_auth_method", "private_key_jwt"),
        ("token_params", {"client_secret": "x"}),
        ("token_store", "redis://127.0.0.1:6379/0"),
        ("retry", 3),
        ("retry", 0),
        ("scope", 5),
        ("scope", ["read", 5]),
        ("on_event", 5),
        ("clock", 5.0),
        ("share_tokens", "no"),
    ],
)
@pytest.mark.parametrize("build", OAUTH2_BUILDERS, ids=lambda build: build.__name__)
def test_bad_oauth2_settings_are_refused(
    keyword: str, value: object, build: Callable[..., object]
) -> None:
    """Out-of-range settings raise ConfigurationError naming the setting, whatever the stack
    or the kind of object: the options are checked in one place."""
    with pytest.raises(ConfigurationError, match=keyword):
        build(**{keyword: value})


@pytest.mark.parametrize(
    "build", OAUTH2_BUILDERS[:1] + OAUTH2_BUILDERS[-2:], ids=lambda build: build.__name__
)
def test_a_misspelt_token_keyword_is_a_type_error_naming_it(
    build: Callable[..., object],
) -> None:
    """The aiohttp transport and the auth objects take the token's keywords as
    ``**options``: one that is none of them fails as Python's own check would. (The requests
    and httpx transports hand other keywords to their client, as gql's do.)"""
    with pytest.raises(TypeError, match=r"__init__\(\) got an unexpected keyword argument 'scop'"):
        build(scop="read")


def test_a_misspelt_keyword_is_named_before_any_setting_it_failed_to_give() -> None:
    """A misspelt ``sign_any_origin`` is the TypeError, not "pass url= or sign_any_origin"."""
    for auth in (RequestsOAuth2Auth, HTTPXOAuth2Auth):
        with pytest.raises(TypeError, match="'sign_any_orign'"):
            auth("https://auth.example.com/oauth2/token", "id", SECRET, sign_any_orign=True)


@pytest.mark.parametrize(
    "kwargs",
    [{"attempts": 0}, {"timeout": 0}, {"wait_max": -1}, {"wait_jitter": float("inf")}],
)
def test_bad_retry_policy_is_refused(kwargs: dict[str, Any]) -> None:
    """RetryPolicy bounds must be finite and positive."""
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)


def test_reprs_show_no_secret() -> None:
    """Transports and their parts print without the secret, attribute by attribute too."""
    oauth2 = OAuth2Transport(
        "https://api.example.com/graphql",
        token_url="https://auth.example.com/oauth2/token",
        client_id="id",
        client_secret=SECRET,
    )
    api_key = ApiKeyTransport(
        "https://api.example.com/graphql", client_id="id", client_secret=SECRET
    )
    # As a debugger or a crash reporter would show them.
    texts = [repr(oauth2), str(oauth2), repr(api_key), str(api_key)]
    texts += [repr(vars(oauth2)), repr(vars(api_key))]
    texts += [unfolded(oauth2), unfolded(api_key)]  # the token cache, and what they hold
    assert all(SECRET not in text for text in texts)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://user:hunter2-pw@api.example.com/graphql",
        "http://:hunter2-pw@/graphql",
        "http://[::1",
    ],
)
def test_a_refused_url_never_shows_its_password(url: str) -> None:
    """The message, and every error chained to it, leaves a URL's password out."""
    with pytest.raises(ConfigurationError) as caught:
        ApiKeyTransport(url, client_id="id", client_secret=SECRET)
    chain = [caught.value, caught.value.__cause__, caught.value.__context__]
    assert not any("hunter2" in repr(error) for error in chain if error is not None)
    assert caught.value.__context__ is None


def test_the_retry_backoff_doubles_up_to_its_cap_plus_jitter() -> None:
    """wait_before(n): wait_initial, doubling up to wait_max, plus up to wait_jitter."""
    policy = RetryPolicy(wait_initial=0.1, wait_max=1.0, wait_jitter=0)
    assert [policy.wait_before(n) for n in range(1, 7)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    )
    assert policy.wait_before(10_000) == 1.0
    jittered = RetryPolicy(wait_initial=0.1, wait_max=1.0, wait_jitter=0.5)
    assert all(0.1 <= jittered.wait_before(1) <= 0.6 for _ in range(100))


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["kw"])
@pytest.mark.parametrize("args", [[("trust_env", True)], "trust_env=1", 5])
def test_client_session_args_that_are_not_a_mapping_are_a_configuration_error(
    make_oauth2: Callable[..., OAuth2Transport], args: object
) -> None:
    """Read at construction for the token session's defaults: refused by name, not with
    an AttributeError from inside the package."""
    with pytest.raises(ConfigurationError, match="client_session_args must be a dict"):
        make_oauth2(client_session_args=args)


@pytest.mark.parametrize("cls", [ApiKeyTransport, OAuth2Transport])
def test_the_repr_of_a_transport_whose_constructor_failed_does_not_raise(
    cls: type[ApiKeyTransport] | type[OAuth2Transport],
) -> None:
    """A debugger or a crash reporter shows the half-built ``self`` of a failed __init__."""
    assert repr(cls.__new__(cls)) == f"<{cls.__name__} url='None'>"


def test_a_query_in_the_base_url_stays_after_the_path(emulator: Emulator) -> None:
    """?key=1 must not become ?key=1/graphql, whose path is / (the service answers 404)."""
    environ = {
        **emulator.environ(),
        "SERVICE_BASE_URL": emulator.base_url + "/?key=1",
        "SERVICE_AUTH_URL": emulator.auth_url + "?key=2",
    }
    transport = OAuth2Transport.from_env(environ)
    assert str(transport.url) == emulator.base_url + "/graphql?key=1"
    assert str(transport.token_url) == emulator.auth_url + "/oauth2/token?key=2"
    api_key = ApiKeyTransport.from_env(
        {**environ, "SERVICE_BASE_URL": emulator.base_url + "/graphql/?key=1"}
    )
    assert str(api_key.url) == emulator.base_url + "/graphql?key=1"
