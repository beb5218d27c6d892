"""gql's httpx transports, authenticating; and auth objects for plain httpx code.

Needs the ``[httpx]`` extra: ``pip install 'gql-service-auth[httpx]'``. Works with
whichever of httpx and httpx2 gql imported (gql prefers httpx2 when it is installed).

- :class:`ApiKeyHTTPXTransport` and :class:`OAuth2HTTPXTransport` subclass gql's
  ``HTTPXTransport``; :class:`ApiKeyHTTPXAsyncTransport` and
  :class:`OAuth2HTTPXAsyncTransport` its ``HTTPXAsyncTransport`` (asyncio or trio).
  Swap the class, keep every argument: the keywords gql hands to the httpx client
  (``timeout``, ``verify``, ``proxy``...) included.
- :class:`ApiKeyAuth` and :class:`OAuth2Auth` are ``httpx.Auth`` objects for code that
  uses httpx directly: ``httpx.Client(auth=OAuth2Auth(...))``.

The transports sign their requests with those auth objects (the client's ``auth``), and
turn what gql would report (an error wrapped in ``TransportConnectionFailed``, a refused
answer) into the package's errors, with gql's bases, as the aiohttp transports do.
"""

from __future__ import annotations

from ._core.rotation import CredentialsGiven

try:
    from gql.transport.httpx import HTTPXAsyncTransport, HTTPXTransport
    from gql.transport.httpx import httpx as _gql_httpx  # type: ignore[attr-defined]

    from ._stacks import httpx_auth as _auth
    from ._stacks.httpx_auth import ApiKeyAuth as _ApiKeyAuth
    from ._stacks.httpx_auth import OAuth2Auth as _OAuth2Auth
except ImportError as exc:  # pragma: no cover - the extra is installed for the tests
    raise ImportError(
        "gql_service_auth.httpx needs the httpx extra: pip install 'gql-service-auth[httpx]'"
    ) from exc

import importlib
import json
import sys
from collections.abc import Callable, Mapping
from functools import partial
from ssl import SSLContext
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, TypedDict

from gql.graphql_request import GraphQLRequest
from graphql import ExecutionResult
from yarl import URL

from ._core.config import check_url, environment_proxy, proxy_login
from ._core.errors import ConfigurationError
from ._core.fork import DropsClientInChild
from ._core.redact import forgets_on_error
from ._stacks.aiohttp_token_post import ssl_of_verify
from ._stacks.gql import callers_own
from ._stacks.http_auth import (
    OAuth2Rules,
    api_key_call,
    api_key_call_async,
    check_proxy,
    oauth2_call,
    oauth2_call_async,
)
from ._stacks.options import TokenOptions, oauth2_settings, token_options
from ._stacks.readiness import ChecksAsync, ChecksBlocking
from ._stacks.stack_transports import ApiKeyTransportParts, OAuth2TransportParts
from ._stacks.unanswered import register

# What httpx raises when no answer came, which the transports explain (see
# _stacks/unanswered.py).
register(
    (
        _gql_httpx.NetworkError,
        _gql_httpx.TimeoutException,
        _gql_httpx.ProxyError,
        _gql_httpx.RemoteProtocolError,
    ),
    (_gql_httpx.TimeoutException,),
    connect=(_gql_httpx.ConnectError,),
)

_TIMEOUT_PHASES: Final = {
    "ConnectTimeout": "connect",
    "ReadTimeout": "read",
    "WriteTimeout": "write",
    "PoolTimeout": "pool",
}

# At run time: typing.get_type_hints() of the constructors resolves Unpack.
if sys.version_info >= (3, 11):
    from typing import Unpack
else:
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from ._stacks.httpx_auth import ApiKeyAuth, OAuth2Auth
else:

    def __getattr__(name: str) -> object:
        # The auth objects are for clients the user builds, of httpx or httpx2: naming
        # them makes them fit both, importing the library gql did not (PEP 562). A
        # transport's user never pays for it; see _stacks/httpx_auth.fit_every_library.
        # Unpickling one names it here too (their __module__ is this module's). Hidden
        # from type checkers, which would otherwise take any misspelt name for an object.
        if name in ("ApiKeyAuth", "OAuth2Auth"):
            _auth.fit_every_library()
            globals().update(ApiKeyAuth=_ApiKeyAuth, OAuth2Auth=_OAuth2Auth)
            return globals()[name]
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})


__all__ = [
    "ApiKeyAuth",
    "ApiKeyHTTPXAsyncTransport",
    "ApiKeyHTTPXTransport",
    "HTTPXClientOptions",
    "OAuth2Auth",
    "OAuth2HTTPXAsyncTransport",
    "OAuth2HTTPXOptions",
    "OAuth2HTTPXTransport",
]


class HTTPXClientOptions(TypedDict, total=False):
    """The keywords gql's HTTPX transports hand to the httpx client (their ``**kwargs``),
    for type checkers: ``httpx.Client``'s and ``httpx.AsyncClient``'s. ``auth`` must stay
    ``None``: the transport signs its requests itself."""

    auth: None
    params: Any
    headers: Any
    cookies: Any
    verify: bool | str | SSLContext
    cert: Any
    trust_env: bool
    http1: bool
    http2: bool
    proxy: Any
    mounts: Any
    timeout: Any
    follow_redirects: bool
    limits: Any
    max_redirects: int
    event_hooks: Any
    base_url: Any
    transport: Any
    default_encoding: Any


class OAuth2HTTPXOptions(HTTPXClientOptions, TokenOptions, total=False):
    """The keywords of the OAuth2 HTTPX transports after ``url`` and gql's JSON functions:
    the client's (:class:`HTTPXClientOptions`) and the token's
    (:class:`~gql_service_auth.TokenOptions`)."""


def _client_args(url: object, kwargs: dict[str, Any], allow: bool) -> None:
    """Refuse what would fight the transport's own signing; check where it goes."""
    if kwargs.get("auth") is not None:
        raise ConfigurationError(
            "auth= cannot be used with this transport: it signs its requests itself"
        )
    headers = kwargs.get("headers")
    names = headers.keys() if isinstance(headers, Mapping) else (k for k, _ in headers or ())
    if any(str(name).lower() == "authorization" for name in names):
        raise ConfigurationError(
            "headers must not contain Authorization: the transport sets it on every request"
        )
    check_url(str(url), what="url", allow_insecure_http=allow)
    check_proxy(url, _proxy_url(kwargs.get("proxy")), "proxy=", allow)


def _own_header(extra_args: dict[str, Any] | None) -> tuple[dict[str, Any] | None, bool]:
    """``extra_args`` (see :func:`~gql_service_auth._stacks.gql.callers_own`), with
    ``auth=None`` for a call that carries the caller's own ``Authorization`` (unless it
    names an auth of its own): the transport's auth neither replaces nor re-sends it, and
    need not look for one in every request's headers. And whether it carries one."""
    args, given = callers_own(extra_args)
    if given and args is not None and "auth" not in args:
        args = {**args, "auth": None}
    return args, given


def _oauth2_args(extra_args: dict[str, Any] | None) -> dict[str, Any] | None:
    """An OAuth2 call's ``extra_args`` (see :func:`_own_header`), its request marked as
    the transport's gql call (``GQL_CALL`` in its ``extensions``): gql reads the answer
    whole next, and the auth reads it for a refusal whatever its content type."""
    if not extra_args:
        return _GQL_CALL_ARGS
    args, given = _own_header(extra_args)
    if given or args is None:  # sent as it is, by no auth of ours
        return args
    extensions = args.get("extensions") or {}
    return {**args, "extensions": {**extensions, _auth.GQL_CALL: True}}


# Shared by the calls without extra_args: gql and httpx copy what they read of it.
_GQL_CALL_ARGS: Final[dict[str, Any]] = {"extensions": MappingProxyType({_auth.GQL_CALL: True})}


def _proxy_url(proxy: object) -> str | None:
    """The URL of httpx's ``proxy=`` (a str, a URL of httpx or yarl, or an ``httpx.Proxy``,
    which keeps its login apart), login included."""
    if proxy is None:
        return None
    text = str(getattr(proxy, "url", proxy))
    login = getattr(proxy, "auth", None)
    if login:
        text = str(URL(text).with_user(login[0]).with_password(login[1]))
    return text


def _call_timeout(extra_args: Mapping[str, Any] | None) -> object:
    """A call's own timeout, which gql hands httpx's ``post`` through ``extra_args``."""
    return extra_args.get("timeout") if extra_args else None


def _pattern(mount: tuple[Any, Any]) -> Any:
    return mount[0]


def _environment_proxy(url: str) -> str | None:
    """The proxy this httpx sends a request to ``url`` through, from the environment, as
    its client picks it: its own mounts of ``HTTP_PROXY``/``NO_PROXY``, the most specific
    first (httpx versions read a ``NO_PROXY`` CIDR block differently). httpx's helpers are
    private: on any surprise, the environment as urllib reads it."""
    try:
        utils: Any = importlib.import_module(f"{_gql_httpx.__name__}._utils")
        target = _gql_httpx.URL(url)
        found = utils.get_environment_proxies().items()
        mounts = sorted(((utils.URLPattern(key), proxy) for key, proxy in found), key=_pattern)
        proxy = next((proxy for pattern, proxy in mounts if pattern.matches(target)), None)
    except Exception:
        return environment_proxy(url)
    if proxy is None:
        return None
    named = URL(str(proxy))
    return environment_proxy(url) or f"{named.host}:{named.port} (the environment's proxy)"


class _Endpoint:
    """What an httpx transport tells of a request that got no answer (see
    :class:`~gql_service_auth._stacks.unanswered.ServiceEndpoint`)."""

    url: Any
    kwargs: dict[str, Any]

    def _unanswered_timeout(self, cause: BaseException, given: object) -> float | None:
        # The call's timeout (extra_args), else the client's, for the phase that ran out.
        if given is not None:
            timeout: Any = _gql_httpx.Timeout(given)  # type: ignore[arg-type]
        else:
            timeout = getattr(getattr(self, "client", None), "timeout", None)
            if timeout is None:
                timeout = _gql_httpx.Timeout(self.kwargs.get("timeout", 5.0))
        phase = _TIMEOUT_PHASES.get(type(cause).__name__, "read")
        seconds = getattr(timeout, phase, None)
        return float(seconds) if isinstance(seconds, int | float) else None

    def _unanswered_proxy_logins(self) -> list[str]:
        proxy = self.kwargs.get("proxy")
        return proxy_login(getattr(proxy, "url", proxy)) if proxy is not None else []

    def _unanswered_proxy(self) -> str | None:
        proxy = self.kwargs.get("proxy")
        if proxy is not None:
            named = URL(str(getattr(proxy, "url", proxy)))
            where = f"{named.host}:{named.port}" if named.port else str(named.host)
            return f"{where} (proxy=)"
        if not self.kwargs.get("trust_env", True):
            return None
        return _environment_proxy(str(self.url))


class _ChecksBlocking(ChecksBlocking):
    """``check()`` of the sync httpx transports: its timeout goes to httpx's ``post``."""

    def _check_timeout_args(self, timeout: float) -> dict[str, Any]:
        return {"extra_args": {"timeout": timeout}}


class _ApiKeySettings(_Endpoint, ApiKeyTransportParts, DropsClientInChild):
    """The constructor and ``from_env`` of the API key transports."""

    kwargs: dict[str, Any]
    _client_attribute = "client"

    @forgets_on_error
    def __init__(
        self,
        url: str | Any,
        json_serialize: Callable[..., str] = json.dumps,
        json_deserialize: Callable[..., Any] = json.loads,
        *,
        client_id: str | None = None,
        client_secret: str | None = None,
        credentials: CredentialsGiven | None = None,
        allow_insecure_http: bool = False,
        **keywords: Unpack[HTTPXClientOptions],
    ) -> None:
        kwargs: dict[str, Any] = dict(keywords)
        signer = _ApiKeyAuth._for_transport(
            client_id, client_secret, str(url), allow_insecure_http, credentials
        )
        _client_args(url, kwargs, allow_insecure_http)
        kwargs["auth"] = signer
        super().__init__(url, json_serialize, json_deserialize, **kwargs)  # type: ignore[call-arg]
        self._signer = signer
        self._forget_client_in_children()


class _OAuth2Settings(_Endpoint, OAuth2TransportParts, DropsClientInChild):
    """The constructor, ``from_env`` and ``token`` of the OAuth2 transports."""

    kwargs: dict[str, Any]
    _client_attribute = "client"

    @forgets_on_error
    def __init__(
        self,
        url: str | Any,
        json_serialize: Callable[..., str] = json.dumps,
        json_deserialize: Callable[..., Any] = json.loads,
        *,
        token_url: str | URL,
        client_id: str | None = None,
        client_secret: str | None = None,
        **keywords: Unpack[OAuth2HTTPXOptions],
    ) -> None:
        kwargs: dict[str, Any] = dict(keywords)
        options = token_options(kwargs)
        _client_args(url, kwargs, options.get("allow_insecure_http", False))
        inherited: dict[str, Any] = {"trust_env": kwargs.get("trust_env", True)}
        proxy = _proxy_url(kwargs.get("proxy"))
        if proxy is not None:
            inherited["proxy"] = proxy
        verify: bool | str | SSLContext = kwargs.get("verify", True)
        rules = oauth2_settings(
            token_url,
            client_id,
            client_secret,
            options,
            caller=f"{type(self).__name__}.__init__",
            ssl=ssl_of_verify(verify),
            verify=verify,
            inherited=inherited,
            inherited_from="the client's proxy and trust_env",
        ).rules(url)
        kwargs["auth"] = _OAuth2Auth._of(token_url, rules, url)
        super().__init__(url, json_serialize, json_deserialize, **kwargs)  # type: ignore[call-arg]
        self.token_url = token_url
        self._rules: OAuth2Rules = rules
        self._forget_client_in_children()


_API_KEY_DOC = """A gql ``{base}`` that authenticates with the service's API key.

    Sends ``Authorization: SERVICE-API-KEY <client_id>:<client_secret>`` on every request,
    through an :class:`ApiKeyAuth` set as the client's ``auth``. Credentials registered
    before 2024-05-13 cannot be used this way: use :class:`{oauth2}` for them.

    After ``url`` come gql's ``{base}`` arguments (``json_serialize``,
    ``json_deserialize``, and keywords for the httpx client, except ``auth``, which must
    not be given).

    Args:
        url: The GraphQL endpoint, ``{{base_url}}/graphql``.
        client_id: The Client Id from the console.
        client_secret: The Client Secret from the console; never shown.
        credentials: In place of ``client_id`` and ``client_secret``: credentials that
            can change without a restart (a :class:`~gql_service_auth.CredentialsFile`,
            :class:`~gql_service_auth.CredentialsFiles`,
            :class:`~gql_service_auth.CredentialsCallback`, or a callable returning
            ``(client_id, client_secret)``); see docs/rotating-credentials.md.
        allow_insecure_http: Allow a plain ``http://`` URL to a host that is not loopback.

    Raises:
        ConfigurationError: bad credentials, an unsafe URL, ``auth`` given, or an
            ``Authorization`` entry in ``headers``.
    """

_OAUTH2_DOC = """A gql ``{base}`` that authenticates with OAuth 2.0 client credentials.

    The same promises as :class:`~gql_service_auth.OAuth2Transport`: one token fetch
    shared by every caller, renewal ahead of expiry in the background, and renewal and
    re-send when the service answers ``UNAUTHENTICATED`` (or HTTP 401 without a GraphQL
    body) to a request that ran nothing, up to ``max_renewals`` times. Requests are signed
    by an :class:`OAuth2Auth`, the client's ``auth``, so a re-send happens inside httpx,
    before gql reads the answer. An upload whose files can seek is re-sent whole; one with
    a file that cannot seek asks for a token valid ``refresh_margin`` seconds more, and is
    never re-sent.

    After ``url`` come gql's ``{base}`` arguments (``json_serialize``,
    ``json_deserialize``, and keywords for the httpx client, except ``auth``, which must
    not be given); ``verify`` applies to the token endpoint too.

    The keywords of the token and its renewal (``token_url``, ``client_id``,
    ``client_secret``, ``scope``, ``token_params``, ``token_auth_method``,
    ``refresh_margin``, ``default_expires_in``, ``max_renewals``, ``retry``, ``on_event``,
    ``clock``, ``allow_insecure_http``, ``token_session_args``, ``token_proxy``,
    ``token_store``, ``share_tokens``) are :class:`~gql_service_auth.TokenOptions`.
    The token request is made with aiohttp on a thread of its own; with
    ``token_session_args=None`` it follows the client's ``proxy`` (a URL) and
    ``trust_env`` (``True`` unless given), as httpx does.

    Args:
        url: The GraphQL endpoint, ``{{base_url}}/graphql``.

    Raises:
        ConfigurationError: a bad argument; the message says which.
    """


class ApiKeyHTTPXTransport(_ChecksBlocking, _ApiKeySettings, HTTPXTransport):
    __doc__ = _API_KEY_DOC.format(base="HTTPXTransport", oauth2="OAuth2HTTPXTransport")

    @forgets_on_error
    def execute(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
        upload_files: bool = False,
    ) -> ExecutionResult:
        """Execute ``request`` with the API key; see gql's ``HTTPXTransport.execute``.

        Raises:
            ApiKeyRejectedError: the service refused the key. Not retried: it cannot change.
        """
        parent = super().execute
        args, given = _own_header(extra_args)
        return api_key_call(
            partial(parent, request, extra_args=args, upload_files=upload_files),
            self._signer._rules,
            "OAuth2HTTPXTransport",
            given=given,
            transport=self,
            given_timeout=_call_timeout(extra_args),
        )

    @forgets_on_error
    def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with the API key; see gql's ``execute_batch``."""
        parent = super().execute_batch
        args, given = _own_header(extra_args)
        return api_key_call(
            partial(parent, reqs, extra_args=args),
            self._signer._rules,
            "OAuth2HTTPXTransport",
            given=given,
            transport=self,
            given_timeout=_call_timeout(extra_args),
        )


class ApiKeyHTTPXAsyncTransport(ChecksAsync, _ApiKeySettings, HTTPXAsyncTransport):
    __doc__ = _API_KEY_DOC.format(base="HTTPXAsyncTransport", oauth2="OAuth2HTTPXAsyncTransport")

    @forgets_on_error
    async def execute(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
        upload_files: bool = False,
    ) -> ExecutionResult:
        """Execute ``request`` with the API key; see gql's ``HTTPXAsyncTransport.execute``.

        Raises:
            ApiKeyRejectedError: the service refused the key. Not retried: it cannot change.
        """
        parent = super().execute
        args, given = _own_header(extra_args)
        return await api_key_call_async(
            partial(parent, request, extra_args=args, upload_files=upload_files),
            self._signer._rules,
            "OAuth2HTTPXAsyncTransport",
            given=given,
            transport=self,
            given_timeout=_call_timeout(extra_args),
        )

    @forgets_on_error
    async def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with the API key; see gql's ``execute_batch``."""
        parent = super().execute_batch
        args, given = _own_header(extra_args)
        return await api_key_call_async(
            partial(parent, reqs, extra_args=args),
            self._signer._rules,
            "OAuth2HTTPXAsyncTransport",
            given=given,
            transport=self,
            given_timeout=_call_timeout(extra_args),
        )


class OAuth2HTTPXTransport(_ChecksBlocking, _OAuth2Settings, HTTPXTransport):
    __doc__ = _OAUTH2_DOC.format(base="HTTPXTransport")

    @forgets_on_error
    def execute(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
        upload_files: bool = False,
    ) -> ExecutionResult:
        """Execute ``request`` with a valid token; see gql's ``HTTPXTransport.execute``.

        Raises:
            UnauthenticatedError: the service kept refusing renewed tokens, or refused a
                request that is never sent twice.
            TokenRequestError: no token could be obtained.
        """
        parent = super().execute
        args = _oauth2_args(extra_args)
        return oauth2_call(
            partial(parent, request, extra_args=args, upload_files=upload_files),
            self._rules,
            self,
            _call_timeout(extra_args),
        )

    @forgets_on_error
    def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with a valid token; see gql's ``execute_batch``. A refused
        batch is sent again only when no operation of it can have run."""
        parent = super().execute_batch
        args = _oauth2_args(extra_args)
        return oauth2_call(
            partial(parent, reqs, extra_args=args), self._rules, self, _call_timeout(extra_args)
        )


class OAuth2HTTPXAsyncTransport(ChecksAsync, _OAuth2Settings, HTTPXAsyncTransport):
    __doc__ = _OAUTH2_DOC.format(base="HTTPXAsyncTransport")

    def _connect_in_child(self) -> None:
        self.client = _gql_httpx.AsyncClient(**self.kwargs)  # what gql's connect makes

    @forgets_on_error
    async def execute(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
        upload_files: bool = False,
    ) -> ExecutionResult:
        """Execute ``request`` with a valid token; see gql's ``HTTPXAsyncTransport.execute``.

        Raises:
            UnauthenticatedError: the service kept refusing renewed tokens, or refused a
                request that is never sent twice.
            TokenRequestError: no token could be obtained.
        """
        parent = super().execute
        args = _oauth2_args(extra_args)
        return await oauth2_call_async(
            partial(parent, request, extra_args=args, upload_files=upload_files),
            self._rules,
            self,
            _call_timeout(extra_args),
        )

    @forgets_on_error
    async def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with a valid token; see gql's ``execute_batch``. A refused
        batch is sent again only when no operation of it can have run."""
        parent = super().execute_batch
        args = _oauth2_args(extra_args)
        return await oauth2_call_async(
            partial(parent, reqs, extra_args=args), self._rules, self, _call_timeout(extra_args)
        )
