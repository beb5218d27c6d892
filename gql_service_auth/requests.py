"""gql's requests transport, authenticating; and auth objects for plain requests code.

Needs the ``[requests]`` extra: ``pip install 'gql-service-auth[requests]'``.

- :class:`ApiKeyRequestsTransport` and :class:`OAuth2RequestsTransport` subclass gql's
  ``RequestsHTTPTransport``: swap the class, keep every argument.
- :class:`ApiKeyAuth` and :class:`OAuth2Auth` are ``requests.auth.AuthBase`` objects for
  code that uses requests directly: ``session.auth = OAuth2Auth(...)``.

The transports sign their requests with those auth objects, and turn what gql would
report (an error wrapped in ``TransportConnectionFailed``, a refused answer) into the
package's errors, with gql's bases, as the aiohttp transports raise them.
"""

from __future__ import annotations

from ._core.rotation import CredentialsGiven

try:
    from gql.transport.requests import RequestsHTTPTransport
    from requests.exceptions import ConnectionError as _ConnectionError
    from requests.exceptions import ConnectTimeout as _ConnectTimeout
    from requests.exceptions import SSLError as _SSLError
    from requests.exceptions import Timeout as _Timeout
    from requests.utils import select_proxy
    from urllib3.exceptions import NewConnectionError as _NewConnectionError

    from ._stacks.requests_auth import ApiKeyAuth, OAuth2Auth
except ImportError as exc:  # pragma: no cover - the extra is installed for the tests
    raise ImportError(
        "gql_service_auth.requests needs the requests extra: "
        "pip install 'gql-service-auth[requests]'"
    ) from exc

import json
import sys
from collections.abc import Callable, Collection, Mapping
from functools import partial
from http.cookiejar import CookieJar
from typing import Any, TypedDict

from gql.graphql_request import GraphQLRequest
from graphql import ExecutionResult
from yarl import URL

from ._core.config import check_url, environment_proxy, proxy_login
from ._core.errors import ConfigurationError
from ._core.fork import DropsClientInChild
from ._core.redact import forgets_on_error
from ._stacks.aiohttp_token_post import ssl_of_verify
from ._stacks.gql import callers_own
from ._stacks.http_auth import api_key_call, check_proxy, oauth2_call
from ._stacks.options import TokenOptions, oauth2_settings, token_options
from ._stacks.readiness import ChecksBlocking
from ._stacks.stack_transports import ApiKeyTransportParts, OAuth2TransportParts
from ._stacks.unanswered import register

# What requests raises when no answer came, which the transports explain (see
# _stacks/unanswered.py); a ConnectTimeout is both.
register(
    (_ConnectionError, _Timeout),
    (_Timeout,),
    tls=(_SSLError,),
    connect=(_NewConnectionError,),
)

# At run time: typing.get_type_hints() of the constructors resolves Unpack.
if sys.version_info >= (3, 11):
    from typing import Unpack
else:
    from typing_extensions import Unpack

__all__ = [
    "ApiKeyAuth",
    "ApiKeyRequestsTransport",
    "OAuth2Auth",
    "OAuth2RequestsOptions",
    "OAuth2RequestsTransport",
    "RequestsOptions",
]

_RETRY_CODES = RequestsHTTPTransport._default_retry_codes


def _checked(
    url: str,
    headers: Mapping[str, Any] | None,
    auth: object,
    allow: bool,
    proxies: object,
) -> None:
    if auth is not None:
        raise ConfigurationError(
            "auth= cannot be used with this transport: it signs its requests itself"
        )
    if headers and any(str(name).lower() == "authorization" for name in headers):
        raise ConfigurationError(
            "headers must not contain Authorization: the transport sets it on every request"
        )
    check_url(url, what="url", allow_insecure_http=allow)
    check_proxy(url, _proxy_for(url, proxies), "proxies=", allow)


def _proxy_for(url: object, proxies: object) -> str | None:
    """The proxy of requests' ``proxies=`` for ``url``, chosen as requests chooses it
    (``scheme://host``, ``all://host``, ``scheme``, ``all``)."""
    if not isinstance(proxies, Mapping):
        return None
    chosen = select_proxy(str(url), dict(proxies))
    return str(chosen) if chosen else None


class RequestsOptions(TypedDict, total=False):
    """The keywords gql's ``RequestsHTTPTransport`` hands to requests with each request
    (its ``**kwargs``), for type checkers: those of ``requests.Session.request`` that gql
    does not set itself."""

    params: Any
    data: Any
    files: Any
    json: Any
    allow_redirects: bool
    proxies: Mapping[str, str] | None
    hooks: Any
    stream: bool | None
    cert: str | tuple[str, str] | None


class OAuth2RequestsOptions(RequestsOptions, TokenOptions, total=False):
    """The keywords of :class:`OAuth2RequestsTransport` after gql's named ones: requests'
    (:class:`RequestsOptions`) and the token's (:class:`~gql_service_auth.TokenOptions`)."""


def _call_timeout(timeout: object, extra_args: Mapping[str, Any] | None) -> object:
    """A call's own timeout: ``extra_args``' wins over ``timeout=``, as gql merges them."""
    if extra_args and "timeout" in extra_args:
        return extra_args["timeout"]
    return timeout


class _Endpoint(ChecksBlocking):
    """What a requests transport tells of a request that got no answer (see
    :class:`~gql_service_auth._stacks.unanswered.ServiceEndpoint`), and its ``check()``."""

    def _check_timeout_args(self, timeout: float) -> dict[str, Any]:
        return {"timeout": timeout}

    url: str
    default_timeout: Any
    session: Any
    kwargs: dict[str, Any]

    def _unanswered_timeout(self, cause: BaseException, given: object) -> float | None:
        # The call's timeout, else the transport's: a number, or requests' (connect, read).
        timeout = given if given is not None else self.default_timeout
        if isinstance(timeout, tuple) and len(timeout) == 2:
            timeout = timeout[0] if isinstance(cause, _ConnectTimeout) else timeout[1]
        return float(timeout) if isinstance(timeout, int | float) else None

    def _unanswered_proxy_logins(self) -> list[str]:
        proxies = getattr(self.session, "proxies", None) or self.kwargs.get("proxies") or {}
        return [login for proxy in dict(proxies).values() for login in proxy_login(proxy)]

    def _unanswered_proxy(self) -> str | None:
        session = self.session
        explicit = _proxy_for(
            self.url, getattr(session, "proxies", None) or self.kwargs.get("proxies")
        )
        if explicit:
            named = URL(explicit if "://" in explicit else f"http://{explicit}")
            return f"{named.host}:{named.port} (proxies=)"
        return environment_proxy(str(self.url), getattr(session, "trust_env", True))


class ApiKeyRequestsTransport(
    _Endpoint, ApiKeyTransportParts, DropsClientInChild, RequestsHTTPTransport
):
    """A gql ``RequestsHTTPTransport`` that authenticates with the service's API key.

    Sends ``Authorization: SERVICE-API-KEY <client_id>:<client_secret>`` on every request,
    through an :class:`ApiKeyAuth`. Credentials registered before 2024-05-13 cannot be
    used this way: use :class:`OAuth2RequestsTransport` for them.

    After ``url`` come gql's ``RequestsHTTPTransport`` arguments, in gql's order
    (``headers``, ``cookies``, ``auth``, ``use_json``, ``timeout``, ``verify``, ``retries``,
    ``method``, ``retry_backoff_factor``, ``retry_status_forcelist``, ``json_serialize``,
    ``json_deserialize``, and its other keywords); ``auth`` must stay ``None``.
    ``retries`` makes urllib3 send a request again on 429 and 5xx answers, mutations
    included: that is gql's.

    Args:
        url: The GraphQL endpoint, ``{base_url}/graphql``.
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

    @forgets_on_error
    def __init__(
        self,
        url: str,
        headers: dict[str, Any] | None = None,
        cookies: dict[str, Any] | CookieJar | None = None,
        auth: None = None,
        use_json: bool = True,
        timeout: int | None = None,
        verify: bool | str = True,
        retries: int = 0,
        method: str = "POST",
        retry_backoff_factor: float = 0.1,
        retry_status_forcelist: Collection[int] = _RETRY_CODES,
        json_serialize: Callable[..., str] = json.dumps,
        json_deserialize: Callable[..., Any] = json.loads,
        *,
        client_id: str | None = None,
        client_secret: str | None = None,
        credentials: CredentialsGiven | None = None,
        allow_insecure_http: bool = False,
        **kwargs: Unpack[RequestsOptions],
    ) -> None:
        signer = ApiKeyAuth(
            client_id,
            client_secret,
            credentials=credentials,
            url=str(url),
            allow_insecure_http=allow_insecure_http,
        )
        _checked(url, headers, auth, allow_insecure_http, kwargs.get("proxies"))
        super().__init__(
            url, headers, cookies, signer, use_json, timeout, verify, retries, method,
            retry_backoff_factor, retry_status_forcelist, json_serialize, json_deserialize,
            **kwargs,
        )  # fmt: skip
        self._signer = signer
        self._forget_client_in_children()

    @forgets_on_error
    def execute(
        self,
        request: GraphQLRequest,
        timeout: int | None = None,
        extra_args: dict[str, Any] | None = None,
        upload_files: bool = False,
    ) -> ExecutionResult:
        """Execute ``request`` with the API key; see gql's ``RequestsHTTPTransport.execute``.

        Raises:
            ApiKeyRejectedError: the service refused the key. Not retried: it cannot change.
        """
        parent = super().execute
        args, given = callers_own(extra_args)
        return api_key_call(
            partial(parent, request, timeout, args, upload_files),
            self._signer._rules,
            "OAuth2RequestsTransport",
            given=given,
            transport=self,
            given_timeout=_call_timeout(timeout, extra_args),
        )

    @forgets_on_error
    def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        timeout: int | None = None,
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with the API key; see gql's ``execute_batch``.

        Raises:
            ApiKeyRejectedError: the service refused the key for any request of the batch.
        """
        parent = super().execute_batch
        args, given = callers_own(extra_args)
        return api_key_call(
            partial(parent, reqs, timeout, args),
            self._signer._rules,
            "OAuth2RequestsTransport",
            given=given,
            transport=self,
            given_timeout=_call_timeout(timeout, extra_args),
        )


class OAuth2RequestsTransport(
    _Endpoint, OAuth2TransportParts, DropsClientInChild, RequestsHTTPTransport
):
    """A gql ``RequestsHTTPTransport`` that authenticates with OAuth 2.0 client credentials.

    The same promises as :class:`~gql_service_auth.OAuth2Transport`, without an event
    loop: one token fetch shared by every caller and thread, renewal ahead of expiry in
    the background, and renewal and re-send when the service answers ``UNAUTHENTICATED``
    (or HTTP 401 without a GraphQL body) to a request that ran nothing, up to
    ``max_renewals`` times. Requests are signed by an :class:`OAuth2Auth`, inside
    requests, so a re-send happens before gql reads the answer. An upload's body (gql's
    ``MultipartEncoder``) cannot be sent twice: an upload asks for a token valid at
    least ``refresh_margin`` seconds, and is never re-sent.

    After ``url`` come gql's ``RequestsHTTPTransport`` arguments, in gql's order
    (``headers``, ``cookies``, ``auth``, ``use_json``, ``timeout``, ``verify``, ``retries``,
    ``method``, ``retry_backoff_factor``, ``retry_status_forcelist``, ``json_serialize``,
    ``json_deserialize``, and its other keywords); ``auth`` must stay ``None``. ``verify``
    applies to the token endpoint too. ``retries`` makes urllib3 send a request again on
    429 and 5xx answers, mutations included: that is gql's, below any auth.

    The keywords of the token and its renewal (``token_url``, ``client_id``,
    ``client_secret``, ``scope``, ``token_params``, ``token_auth_method``,
    ``refresh_margin``, ``default_expires_in``, ``max_renewals``, ``retry``, ``on_event``,
    ``clock``, ``allow_insecure_http``, ``token_session_args``, ``token_proxy``,
    ``token_store``, ``share_tokens``) are :class:`~gql_service_auth.TokenOptions`.
    The token request is made with aiohttp on a thread of its own; with
    ``token_session_args=None`` it takes proxies from the environment, as requests does,
    and the proxy of ``proxies=`` (a keyword requests takes) for the token URL's scheme.

    Args:
        url: The GraphQL endpoint, ``{base_url}/graphql``.

    Raises:
        ConfigurationError: a bad argument; the message says which.
    """

    @forgets_on_error
    def __init__(
        self,
        url: str,
        headers: dict[str, Any] | None = None,
        cookies: dict[str, Any] | CookieJar | None = None,
        auth: None = None,
        use_json: bool = True,
        timeout: int | None = None,
        verify: bool | str = True,
        retries: int = 0,
        method: str = "POST",
        retry_backoff_factor: float = 0.1,
        retry_status_forcelist: Collection[int] = _RETRY_CODES,
        json_serialize: Callable[..., str] = json.dumps,
        json_deserialize: Callable[..., Any] = json.loads,
        *,
        token_url: str | URL,
        client_id: str | None = None,
        client_secret: str | None = None,
        **keywords: Unpack[OAuth2RequestsOptions],
    ) -> None:
        kwargs: dict[str, Any] = dict(keywords)
        options = token_options(kwargs)
        allow_insecure_http = options.get("allow_insecure_http", False)
        _checked(url, headers, auth, allow_insecure_http, kwargs.get("proxies"))
        inherited: dict[str, Any] = {"trust_env": True}
        proxy = _proxy_for(token_url, kwargs.get("proxies"))
        if proxy:
            inherited["proxy"] = proxy
        rules = oauth2_settings(
            token_url,
            client_id,
            client_secret,
            options,
            caller=f"{type(self).__name__}.__init__",
            ssl=ssl_of_verify(verify),
            verify=verify,
            inherited=inherited,
            inherited_from="proxies",
        ).rules(url)
        signer = OAuth2Auth._of(token_url, rules, url)
        super().__init__(
            url, headers, cookies, signer, use_json, timeout, verify, retries, method,
            retry_backoff_factor, retry_status_forcelist, json_serialize, json_deserialize,
            **kwargs,
        )  # fmt: skip
        self.token_url = token_url
        self._rules = rules
        self._forget_client_in_children()

    @forgets_on_error
    def execute(
        self,
        request: GraphQLRequest,
        timeout: int | None = None,
        extra_args: dict[str, Any] | None = None,
        upload_files: bool = False,
    ) -> ExecutionResult:
        """Execute ``request`` with a valid token; see gql's ``RequestsHTTPTransport.execute``.

        Raises:
            UnauthenticatedError: the service kept refusing renewed tokens, or refused a
                request that is never sent twice: an upload, an answer with data, or a
                mutation refused while it ran.
            TokenRequestError: no token could be obtained.
        """
        parent = super().execute
        args, _ = callers_own(extra_args)
        return oauth2_call(
            partial(parent, request, timeout, args, upload_files),
            self._rules,
            self,
            _call_timeout(timeout, extra_args),
        )

    @forgets_on_error
    def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        timeout: int | None = None,
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with a valid token; see gql's ``execute_batch``.

        A refused batch is sent again only when no operation of it can have run.
        """
        parent = super().execute_batch
        args, _ = callers_own(extra_args)
        return oauth2_call(
            partial(parent, reqs, timeout, args),
            self._rules,
            self,
            _call_timeout(timeout, extra_args),
        )
