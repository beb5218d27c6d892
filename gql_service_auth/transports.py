"""gql transports that authenticate to the service: drop-in ``AIOHTTPTransport`` subclasses.

They only attach the ``Authorization`` header to each request and react to the service's
``UNAUTHENTICATED`` answers; tokens are the business of
:class:`~gql_service_auth._tokens.TokenManager`, which knows nothing of gql.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from ssl import SSLContext
from typing import TYPE_CHECKING, Any, Final, TypedDict, TypeVar

import aiohttp
from aiohttp import ClientResponseError
from aiohttp.client_reqrep import Fingerprint
from aiohttp.typedefs import LooseCookies, LooseHeaders
from gql.graphql_request import GraphQLRequest
from gql.transport.aiohttp import AIOHTTPTransport
from gql.transport.exceptions import TransportServerError
from graphql import ExecutionResult
from multidict import CIMultiDict
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
)

from ._config import check_url, join_url, read_env
from ._constants import (
    DEFAULT_EXPIRES_IN,
    DEFAULT_MAX_RENEWALS,
    DEFAULT_REFRESH_MARGIN,
    ENV_AUTH_URL,
    ENV_BASE_URL,
    ENV_CLIENT_ID,
    ENV_CLIENT_SECRET,
    GRAPHQL_PATH,
    TOKEN_PATH,
    UNAUTHENTICATED,
)
from ._credentials import ClientCredentials
from ._errors import ApiKeyRejectedError, ConfigurationError, UnauthenticatedError
from ._events import AuthEvent, Emitter, EventHook
from ._oauth2 import AiohttpFormPoster, ClientAuthMethod, ClientCredentialsGrant, RetryPolicy
from ._tokens import AccessToken, Clock, TokenManager

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import Self, Unpack
    else:
        from typing_extensions import Self, Unpack

__all__ = [
    "AIOHTTPTransportOptions",
    "ApiKeyOptions",
    "ApiKeyTransport",
    "OAuth2Options",
    "OAuth2Transport",
]

_T = TypeVar("_T")


class AIOHTTPTransportOptions(TypedDict, total=False):
    """The keywords of gql's ``AIOHTTPTransport``, all passed through unchanged.

    ``auth`` is left out on purpose: aiohttp cannot combine it with the ``Authorization``
    header these transports send, so it is refused.
    """

    headers: LooseHeaders | None
    cookies: LooseCookies | None
    ssl: SSLContext | bool | Fingerprint
    timeout: int | None
    ssl_close_timeout: int | float | None
    json_serialize: Callable[..., str]
    json_deserialize: Callable[..., Any]
    client_session_args: dict[str, Any] | None


class OAuth2Options(AIOHTTPTransportOptions, total=False):
    """The optional keywords of :class:`OAuth2Transport`, for :meth:`OAuth2Transport.from_env`."""

    scope: str | Sequence[str] | None
    token_params: Mapping[str, str] | None
    token_auth_method: ClientAuthMethod
    refresh_margin: float
    default_expires_in: float
    max_renewals: int
    retry: RetryPolicy | None
    on_event: EventHook | None
    clock: Clock | None
    allow_insecure_http: bool


class ApiKeyOptions(AIOHTTPTransportOptions, total=False):
    """The optional keywords of :class:`ApiKeyTransport`, for :meth:`ApiKeyTransport.from_env`."""

    allow_insecure_http: bool


_API_KEY_REFUSED: Final = (
    "the service refused the API key (UNAUTHENTICATED). Either client_id or client_secret "
    "is wrong, or the credentials were registered before 2024-05-13: such credentials "
    "cannot be used as an API key. Use OAuth2Transport with the same credentials, or "
    "create new credentials in the console to use the API key"
)


class _Refused(Exception):
    """The service refused the token and the request may be sent again."""

    def __init__(self, outcome: object) -> None:
        super().__init__("refused")
        self.outcome = outcome


def _is_refusal(errors: object) -> bool:
    """Whether a GraphQL ``errors`` member refuses the credentials.

    Tolerates any shape: the member is only trusted where it is a list of objects.
    """
    if not isinstance(errors, list):
        return False
    for error in errors:
        if isinstance(error, Mapping):
            extensions = error.get("extensions")
            if isinstance(extensions, Mapping) and extensions.get("code") == UNAUTHENTICATED:
                return True
    return False


def _with_authorization(
    extra_args: Mapping[str, Any] | None, authorization: str
) -> dict[str, Any]:
    """The aiohttp ``post`` arguments of one request, with its ``Authorization`` header.

    Set per request, never on the shared session, so concurrent requests with different
    tokens cannot see each other's header.
    """
    if not extra_args:
        return {"headers": {"Authorization": authorization}}
    args = dict(extra_args)
    headers = CIMultiDict(args.get("headers") or {})
    headers["Authorization"] = authorization
    args["headers"] = headers
    return args


def _scrubbed(exc: TransportServerError) -> TransportServerError:
    # gql chains aiohttp's ClientResponseError, whose repr shows the request's headers,
    # Authorization included. The message and status code are all a caller needs.
    if isinstance(exc.__cause__, ClientResponseError) or isinstance(
        exc.__context__, ClientResponseError
    ):
        exc.__cause__ = None
        exc.__context__ = None
        exc.__suppress_context__ = True
    return exc


def _bare_401(exc: TransportServerError) -> None:
    """Accept an HTTP 401 without a GraphQL body as a refusal; re-raise anything else.

    Call it from the ``except`` block: the error is scrubbed first, because whatever is
    raised next keeps it as ``__context__``, where a crash reporter would look.
    """
    _scrubbed(exc)
    if exc.code != 401:
        raise exc


def _check_number(name: str, value: object, *, positive: bool = False) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        bound = "more than 0" if positive else "at least 0"
        raise ConfigurationError(f"{name} must be a finite number of seconds, {bound}")


class _AuthenticatingTransport(AIOHTTPTransport):
    """What both transports share: argument checks and sending with a given header."""

    def __init__(self, url: str, *, allow_insecure_http: bool, options: Mapping[str, Any]) -> None:
        self._per_thread = threading.local()
        if options.get("auth") is not None:
            raise ConfigurationError(
                "auth= cannot be used with this transport: it sends its own Authorization "
                "header, which aiohttp cannot combine with auth"
            )
        headers = options.get("headers")
        if headers and "Authorization" in CIMultiDict(headers):
            raise ConfigurationError(
                "headers must not contain Authorization: the transport sets it on every request"
            )
        check_url(url, what="url", allow_insecure_http=allow_insecure_http)
        super().__init__(url, **options)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} url={self.url!r}>"

    # gql's sync Client.execute connects, executes and closes in the calling thread, on that
    # thread's event loop. With one session attribute, a second thread's connect() raised
    # TransportAlreadyConnected, or its queries ran on the other thread's session and loop.
    # One aiohttp session per thread lets threads share the transport, and so its token.
    @property
    def session(self) -> aiohttp.ClientSession | None:
        """This thread's aiohttp session, or ``None`` when this thread is not connected."""
        return getattr(self._per_thread, "session", None)

    @session.setter
    def session(self, value: aiohttp.ClientSession | None) -> None:
        self._per_thread.session = value


class ApiKeyTransport(_AuthenticatingTransport):
    """A gql ``AIOHTTPTransport`` that authenticates with the service's API key.

    Sends ``Authorization: SERVICE-API-KEY <client_id>:<client_secret>`` on every request;
    no token is ever requested. Credentials registered before 2024-05-13 cannot be used
    this way: use :class:`OAuth2Transport` for them.

    Args:
        url: The GraphQL endpoint, ``{base_url}/graphql``.
        client_id: The Client Id from the console.
        client_secret: The Client Secret from the console; never shown.
        allow_insecure_http: Allow a plain ``http://`` URL to a host that is not loopback.
        **kwargs: Any keyword of gql's ``AIOHTTPTransport`` except ``auth``.

    Raises:
        ConfigurationError: bad credentials format, unsafe URL, ``auth`` given, or an
            ``Authorization`` entry in ``headers``.
    """

    def __init__(
        self,
        url: str,
        *,
        client_id: str,
        client_secret: str,
        allow_insecure_http: bool = False,
        **kwargs: Unpack[AIOHTTPTransportOptions],
    ) -> None:
        self._credentials = ClientCredentials(client_id, client_secret)
        super().__init__(url, allow_insecure_http=allow_insecure_http, options=kwargs)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, **kwargs: Unpack[ApiKeyOptions]
    ) -> Self:
        """Build the transport from the ``SERVICE_*`` environment variables.

        Reads ``SERVICE_BASE_URL`` (``/graphql`` is appended), ``SERVICE_CLIENT_ID`` and
        ``SERVICE_CLIENT_SECRET``.

        Args:
            environ: Where to read the variables; the process environment by default.
            **kwargs: Passed to the constructor.

        Raises:
            ConfigurationError: a variable is missing or empty; the message names it.
        """
        return cls(
            join_url(read_env(environ, ENV_BASE_URL), GRAPHQL_PATH),
            client_id=read_env(environ, ENV_CLIENT_ID),
            client_secret=read_env(environ, ENV_CLIENT_SECRET),
            **kwargs,
        )

    def _refused(
        self, errors: list[Any] | None, data: Any, extensions: Any
    ) -> ApiKeyRejectedError:
        return ApiKeyRejectedError(
            _API_KEY_REFUSED, errors=errors, data=data, extensions=extensions
        )

    async def execute(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
        upload_files: bool = False,
    ) -> ExecutionResult:
        """Execute ``request`` with the API key; see gql's ``AIOHTTPTransport.execute``.

        Raises:
            ApiKeyRejectedError: the service refused the key. Not retried: it cannot change.
        """
        authorization = _with_authorization(extra_args, self._credentials.api_key_authorization())
        try:
            result = await super().execute(
                request, extra_args=authorization, upload_files=upload_files
            )
        except TransportServerError as exc:
            _bare_401(exc)
            raise self._refused(None, None, None) from None
        if _is_refusal(result.errors):
            raise self._refused(result.errors, result.data, result.extensions)
        return result

    async def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with the API key; see gql's ``AIOHTTPTransport.execute_batch``.

        Raises:
            ApiKeyRejectedError: the service refused the key for any request of the batch.
        """
        authorization = _with_authorization(extra_args, self._credentials.api_key_authorization())
        try:
            results = await super().execute_batch(reqs, extra_args=authorization)
        except TransportServerError as exc:
            _bare_401(exc)
            raise self._refused(None, None, None) from None
        for result in results:
            if _is_refusal(result.errors):
                raise self._refused(result.errors, result.data, result.extensions)
        return results

    async def subscribe(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
    ) -> AsyncGenerator[ExecutionResult, None]:
        """Subscribe over HTTP multipart with the API key; see gql's ``subscribe``."""
        try:
            async for result in super().subscribe(
                request,
                extra_args=_with_authorization(
                    extra_args, self._credentials.api_key_authorization()
                ),
            ):
                yield result
        except TransportServerError as exc:
            raise _scrubbed(exc) from None


class OAuth2Transport(_AuthenticatingTransport):
    """A gql ``AIOHTTPTransport`` that authenticates with OAuth 2.0 client-credentials tokens.

    The first request fetches a token; concurrent requests share one fetch; a token is
    renewed ``refresh_margin`` seconds before it expires; and when the service answers
    ``UNAUTHENTICATED`` (or HTTP 401 without a body) to a request that ran nothing, the
    token is renewed and the request sent again, up to ``max_renewals`` times.

    Args:
        url: The GraphQL endpoint, ``{base_url}/graphql``.
        token_url: The token endpoint, ``{auth_url}/oauth2/token``.
        client_id: The Client Id from the console.
        client_secret: The Client Secret from the console; never shown.
        scope: Scope to request, a string or a sequence joined by spaces; ``None`` sends none.
        token_params: Further form fields for the token request (``audience``...).
        token_auth_method: ``"client_secret_post"`` (form fields, as the contract says) or
            ``"client_secret_basic"`` (HTTP Basic).
        refresh_margin: Seconds before expiry at which a token is renewed, capped at half
            its lifetime. An upload, which cannot be sent twice, asks for a token valid at
            least this long.
        default_expires_in: Seconds a token is trusted when the server gives no
            ``expires_in``.
        max_renewals: Renewals, and so re-sends, per request after a refusal; 0 never
            re-sends.
        retry: Bounds and backoff of the token endpoint's retries and of re-sends;
            ``None`` means ``RetryPolicy()``.
        on_event: Called with each :class:`~gql_service_auth.AuthEvent` (token fetched,
            retry scheduled...), e.g. to count renewals.
        clock: Monotonic clock in seconds for token lifetimes; ``time.monotonic`` when ``None``.
        allow_insecure_http: Allow plain ``http://`` URLs to hosts that are not loopback.
        **kwargs: Any keyword of gql's ``AIOHTTPTransport`` except ``auth``. ``ssl`` also
            applies to the token endpoint; ``headers``, ``cookies`` and
            ``client_session_args`` do not.

    Raises:
        ConfigurationError: a bad argument; the message says which.
    """

    def __init__(
        self,
        url: str,
        *,
        token_url: str,
        client_id: str,
        client_secret: str,
        scope: str | Sequence[str] | None = None,
        token_params: Mapping[str, str] | None = None,
        token_auth_method: ClientAuthMethod = "client_secret_post",
        refresh_margin: float = DEFAULT_REFRESH_MARGIN,
        default_expires_in: float = DEFAULT_EXPIRES_IN,
        max_renewals: int = DEFAULT_MAX_RENEWALS,
        retry: RetryPolicy | None = None,
        on_event: EventHook | None = None,
        clock: Clock | None = None,
        allow_insecure_http: bool = False,
        **kwargs: Unpack[AIOHTTPTransportOptions],
    ) -> None:
        credentials = ClientCredentials(client_id, client_secret)
        check_url(token_url, what="token_url", allow_insecure_http=allow_insecure_http)
        _check_number("refresh_margin", refresh_margin)
        _check_number("default_expires_in", default_expires_in, positive=True)
        if isinstance(max_renewals, bool) or not isinstance(max_renewals, int) or max_renewals < 0:
            raise ConfigurationError("max_renewals must be an int of at least 0")
        if scope is not None and not isinstance(scope, str):
            scope = " ".join(scope)  # RFC 6749 section 3.3: space-delimited
        super().__init__(url, allow_insecure_http=allow_insecure_http, options=kwargs)
        self.token_url = token_url
        self._policy = retry or RetryPolicy()
        self._max_renewals = max_renewals
        self._refresh_margin = float(refresh_margin)
        self._emit = Emitter(on_event)
        grant = ClientCredentialsGrant(
            token_url,
            credentials,
            scope=scope,
            extra_params=dict(token_params or {}),
            auth_method=token_auth_method,
            policy=self._policy,
            post=AiohttpFormPoster(ssl=self.ssl),
            emit=self._emit,
        )
        self._tokens = TokenManager(
            grant,
            refresh_margin=float(refresh_margin),
            default_expires_in=float(default_expires_in),
            # Room for the grant's own bound plus a last request that started just before it.
            fetch_timeout=2 * self._policy.timeout,
            clock=clock or time.monotonic,
            emit=self._emit,
        )

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, **kwargs: Unpack[OAuth2Options]
    ) -> Self:
        """Build the transport from the ``SERVICE_*`` environment variables.

        Reads ``SERVICE_BASE_URL`` and ``SERVICE_AUTH_URL`` (``/graphql`` and
        ``/oauth2/token`` are appended), ``SERVICE_CLIENT_ID`` and ``SERVICE_CLIENT_SECRET``.

        Args:
            environ: Where to read the variables; the process environment by default.
            **kwargs: Passed to the constructor.

        Raises:
            ConfigurationError: a variable is missing or empty; the message names it.
        """
        return cls(
            join_url(read_env(environ, ENV_BASE_URL), GRAPHQL_PATH),
            token_url=join_url(read_env(environ, ENV_AUTH_URL), TOKEN_PATH),
            client_id=read_env(environ, ENV_CLIENT_ID),
            client_secret=read_env(environ, ENV_CLIENT_SECRET),
            **kwargs,
        )

    @property
    def token(self) -> AccessToken | None:
        """The cached access token (its ``repr`` hides the value), or ``None`` before the first."""
        return self._tokens.token

    async def execute(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
        upload_files: bool = False,
    ) -> ExecutionResult:
        """Execute ``request`` with a valid token; see gql's ``AIOHTTPTransport.execute``.

        Raises:
            UnauthenticatedError: the service kept refusing renewed tokens, or refused an
                upload or a request that returned data, which are never sent twice.
            TokenRequestError: no token could be obtained.
        """
        parent = super().execute

        def send(authorization: str) -> Awaitable[ExecutionResult]:
            return parent(
                request,
                extra_args=_with_authorization(extra_args, authorization),
                upload_files=upload_files,
            )

        if upload_files:
            # The file streams are consumed by the first send: ask for a token that will
            # outlive the upload, and never send it again.
            return await self._send_with_renewal(
                send, _single, min_ttl=self._refresh_margin, resendable=False
            )
        return await self._send_with_renewal(send, _single)

    async def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with a valid token; see gql's ``AIOHTTPTransport.execute_batch``.

        A refused batch is sent again only when every answer refused the token and none
        carries data, so no operation of it can have run.
        """
        parent = super().execute_batch

        def send(authorization: str) -> Awaitable[list[ExecutionResult]]:
            return parent(reqs, extra_args=_with_authorization(extra_args, authorization))

        return await self._send_with_renewal(send, _batch)

    async def subscribe(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
    ) -> AsyncGenerator[ExecutionResult, None]:
        """Subscribe over HTTP multipart with a valid token; see gql's ``subscribe``.

        A stream is never re-sent; a refusal drops the token so the next call renews it.
        """
        token = await self._tokens.get()
        try:
            async for result in super().subscribe(
                request, extra_args=_with_authorization(extra_args, token.authorization)
            ):
                if _is_refusal(result.errors):
                    self._tokens.invalidate(token)
                yield result
        except TransportServerError as exc:
            if exc.code == 401:
                self._tokens.invalidate(token)
            raise _scrubbed(exc) from None

    async def _send_with_renewal(
        self,
        send: Callable[[str], Awaitable[_T]],
        inspect: Callable[[_T], tuple[bool, bool]],
        *,
        min_ttl: float = 0.0,
        resendable: bool = True,
    ) -> _T:
        """Send with a valid token; on a refusal, drop the token and re-send, within bounds.

        ``inspect`` tells of an answer whether it refuses the token and whether it may be
        sent again: the service refuses a token before running anything, so an answer
        without data proves nothing ran (the contract's rule, and the only reason a
        mutation may be re-sent).
        """
        # Fast path, inlined: almost every request succeeds on its first send with a cached
        # token, and each coroutine layer or tenacity loop here costs microseconds a query.
        token = self._tokens.fresh(min_ttl=min_ttl) or await self._tokens.get(min_ttl=min_ttl)
        try:
            outcome: _T | None = await send(token.authorization)
        except TransportServerError as exc:
            _bare_401(exc)
            outcome = None
        try:
            return self._accept(token, outcome, inspect, resendable)
        except _Refused as first:
            refusal = first
        # Slow path. Tenacity's first "attempt" replays the refusal in hand, so the bound
        # and the backoff count the original send.
        replayed = False
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._max_renewals + 1),
            wait=self._policy.backoff(),
            retry=retry_if_exception_type(_Refused),
            before_sleep=self._before_resend,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if not replayed:
                        replayed = True
                        raise refusal
                    token = await self._tokens.get(min_ttl=min_ttl)
                    try:
                        outcome = await send(token.authorization)
                    except TransportServerError as exc:
                        _bare_401(exc)
                        outcome = None
                    return self._accept(token, outcome, inspect, resendable)
        except _Refused as refused:
            raise _exhausted(refused.outcome, self._max_renewals) from None
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover

    def _accept(
        self,
        token: AccessToken,
        outcome: _T | None,
        inspect: Callable[[_T], tuple[bool, bool]],
        resendable: bool,
    ) -> _T:
        """The answer, unless it refuses ``token`` (``None``: a bare HTTP 401).

        Raises:
            _Refused: the token was refused and the request may be sent again.
            UnauthenticatedError: the token was refused and the request must not be re-sent.
        """
        if outcome is None:
            safe = True
        else:
            refused, safe = inspect(outcome)
            if not refused:
                return outcome
        # Only the first of many requests refused with this token renews it.
        self._tokens.invalidate(token)
        if not (resendable and safe):
            raise _not_resent(outcome, upload=not resendable)
        raise _Refused(outcome)

    def _before_resend(self, state: RetryCallState) -> None:
        self._emit(
            AuthEvent(
                "request_retry_scheduled", attempt=state.attempt_number, wait=state.upcoming_sleep
            )
        )


def _single(result: ExecutionResult) -> tuple[bool, bool]:
    return _is_refusal(result.errors), result.data is None


def _batch(results: list[ExecutionResult]) -> tuple[bool, bool]:
    refusals = [_is_refusal(result.errors) for result in results]
    return any(refusals), all(refusals) and all(result.data is None for result in results)


def _answer_parts(answer: object) -> tuple[list[Any] | None, Any, Any]:
    if isinstance(answer, list):
        answer = next((r for r in answer if _is_refusal(r.errors)), None)
    if isinstance(answer, ExecutionResult):
        return answer.errors, answer.data, answer.extensions
    return None, None, None


def _exhausted(answer: object, renewals: int) -> UnauthenticatedError:
    errors, data, extensions = _answer_parts(answer)
    return UnauthenticatedError(
        f"the service refused the access token (UNAUTHENTICATED) after {renewals} renewal(s). "
        "The authorization server issues tokens the API does not accept: check that url "
        "and token_url belong to the same environment (SERVICE_BASE_URL, SERVICE_AUTH_URL) "
        "and that the credentials' project may use the API",
        errors=errors,
        data=data,
        extensions=extensions,
    )


def _not_resent(answer: object, *, upload: bool) -> UnauthenticatedError:
    errors, data, extensions = _answer_parts(answer)
    why = (
        "it uploads files, whose streams were consumed by the first send"
        if upload
        else "the answer carried data, so part of it may have run"
    )
    return UnauthenticatedError(
        f"the service refused the access token (UNAUTHENTICATED); the request was not sent "
        f"again because {why}. The token was dropped, so calling again uses a new one",
        errors=errors,
        data=data,
        extensions=extensions,
    )
