"""gql transports that authenticate to the service: drop-in ``AIOHTTPTransport`` subclasses.

They only attach the ``Authorization`` header to each request and react to the service's
``UNAUTHENTICATED`` answers; tokens are the business of
:class:`~gql_service_auth._tokens.TokenManager`, which knows nothing of gql.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar

# aiohttp's LooseCookies names these in strings: typing.get_type_hints() of the options
# and constructors (pydantic, cattrs, IDEs) looks them up in this module.
from http.cookies import BaseCookie, Morsel  # noqa: F401
from ssl import SSLContext
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypedDict, TypeVar, cast

import aiohttp
from aiohttp.client_reqrep import Fingerprint
from aiohttp.typedefs import LooseCookies, LooseHeaders
from gql.graphql_request import GraphQLRequest
from gql.transport.aiohttp import AIOHTTPTransport
from gql.transport.exceptions import TransportError, TransportServerError
from gql.transport.file_upload import FileVar
from graphql import DocumentNode, ExecutionResult, OperationDefinitionNode
from multidict import CIMultiDict, CIMultiDictProxy
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
)
from yarl import URL

from . import _fork
from ._config import check_url, env_url, read_env
from ._constants import (
    DEFAULT_EXPIRES_IN,
    DEFAULT_MAX_RENEWALS,
    DEFAULT_REFRESH_MARGIN,
    ENV_AUTH_URL,
    ENV_BASE_URL,
    ENV_CLIENT_ID,
    ENV_CLIENT_SECRET,
    ENV_TOKEN_STORE_URL,
    FETCH_GRACE,
    GRAPHQL_PATH,
    MAX_SERVER_TEXT,
    TOKEN_PATH,
    UNAUTHENTICATED,
)
from ._credentials import ClientCredentials
from ._errors import (
    ApiKeyRejectedError,
    ApiKeyRejectedHTTPError,
    ConfigurationError,
    UnauthenticatedError,
    UnauthenticatedHTTPError,
)
from ._events import AuthEvent, Emitter, EventHook
from ._oauth2 import AiohttpFormPoster, ClientAuthMethod, ClientCredentialsGrant, RetryPolicy
from ._redact import clear_locals, redact_chain, redact_text
from ._store import SharedLevel, TokenIdentity, TokenStore
from ._token import AccessToken, Clock
from ._token_session import TokenSessionArgs, resolve_token_session
from ._tokens import RenewalPaused, RenewalSpent, TokenManager

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
_R = TypeVar("_R")
_P = ParamSpec("_P")


def _forgets_arguments_on_error(method: Callable[_P, _T]) -> Callable[_P, _T]:
    """``method``, whose failures keep none of its arguments in their traceback's locals.

    A constructor's arguments hold the client secret and a proxy's password, and a
    refused one (a ConfigurationError) keeps every library frame it went through, with
    their locals, in its traceback: crash reporters such as Sentry capture those. Here
    those frames are cleared, and this one lets go of the arguments before re-raising.
    """

    @functools.wraps(method)
    def forgetting(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            del args, kwargs
            clear_locals(exc)
            raise

    return forgetting


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
    token_session_args: TokenSessionArgs | None
    token_proxy: str | URL | None
    token_store: TokenStore | None


class ApiKeyOptions(AIOHTTPTransportOptions, total=False):
    """The optional keywords of :class:`ApiKeyTransport`, for :meth:`ApiKeyTransport.from_env`."""

    allow_insecure_http: bool


_API_KEY_ADVICE: Final = (
    "Either client_id or client_secret is wrong, or the credentials were registered before "
    "2024-05-13: such credentials cannot be used as an API key. Use OAuth2Transport with the "
    "same credentials, or create new credentials in the console to use the API key"
)

# gql's transport keeps the files of an upload in one attribute per transport, opened
# before the request and closed in a `finally` after it: concurrent uploads closed each
# other's files. Each asyncio task has its own context, so here each upload has its own.
_UPLOAD_FILES: ContextVar[tuple[object, dict[str, FileVar]] | None] = ContextVar(
    "gql_service_auth_upload_files", default=None
)

# Connectors a forked child inherited with its parent's sessions. Their sockets are the
# parent's, registered in an epoll instance parent and child share: closing them here
# would unregister them for the parent too. They stay referenced, unused, for the
# child's life.
_FORK_ORPHANS: list[aiohttp.BaseConnector] = []

# What a request sends, read off gql's GraphQLRequest before the first await: gql 3
# style calls (execute(doc, variable_values=...)) rewrite a shared request in place.
_Snapshot = tuple[DocumentNode, "dict[str, Any] | None", "str | None", "dict[str, Any] | None"]


def _snapshot(request: GraphQLRequest) -> _Snapshot:
    variables, extensions = request.variable_values, request.extensions
    return (
        request.document,
        _copied(variables) if variables else variables,
        request.operation_name,
        _copied(extensions) if extensions else extensions,
    )


def _copied(value: Any) -> Any:
    """``value`` with its dicts, lists and tuples copied, so the caller's changes miss it.

    Leaves are kept as they are: a ``FileVar`` must stay the object whose stream is sent.
    Shared parts stay shared and cycles stay cycles, for the serializer to refuse as it
    would the original; nesting too deep to copy is sent as it is.
    """
    try:
        return _copy_into(value, {})
    except RecursionError:
        return value


def _copy_into(value: Any, memo: dict[int, Any]) -> Any:
    if not isinstance(value, (dict, list, tuple)):
        return value
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, dict):
        copied: dict[Any, Any] = {}
        memo[id(value)] = copied
        for key, item in value.items():
            copied[key] = _copy_into(item, memo)
        return copied
    items: list[Any] = []
    memo[id(value)] = items
    for item in value:
        items.append(_copy_into(item, memo))
    if isinstance(value, tuple):
        memo[id(value)] = result = tuple(items)  # a cycle through a tuple keeps the list
        return result
    return items


def _rebuild(snapshot: _Snapshot) -> GraphQLRequest:
    document, variables, operation_name, extensions = snapshot
    return GraphQLRequest(
        document, variable_values=variables, operation_name=operation_name, extensions=extensions
    )


def _is_query(snapshot: _Snapshot) -> bool:
    """Whether the operation a request runs is a query, which has no side effects."""
    document, _, operation_name, _ = snapshot
    operations = [
        d
        for d in document.definitions
        if isinstance(d, OperationDefinitionNode)
        and (not operation_name or (d.name is not None and d.name.value == operation_name))
    ]
    return len(operations) == 1 and operations[0].operation.value == "query"


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


def _refusal_message(errors: object) -> str | None:
    """The ``message`` of the first refusal in ``errors``, shortened; ``None`` if it has none."""
    for error in errors if isinstance(errors, list) else ():
        if _is_refusal([error]):
            message = error.get("message")
            if isinstance(message, str) and message.strip():
                message = message.strip()
                if len(message) > MAX_SERVER_TEXT:
                    message = message[:MAX_SERVER_TEXT] + "..."
                return message
    return None


def _during_execution(errors: object) -> bool:
    """Whether an error was raised while the operation ran: it has a ``path``.

    GraphQL gives a field error the path of its field; an error raised before execution
    (a refused token, a syntax error) has none. A field error on a non-null field reaches
    the root, so an operation that ran side effects can still answer ``data: null``.
    """
    # Any path at all counts, whatever its shape: a wrong guess here re-runs a mutation.
    return isinstance(errors, list) and any(
        isinstance(error, Mapping) and error.get("path") is not None for error in errors
    )


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


class _SharedArgs:
    """The aiohttp ``post`` arguments of every request sent with one token.

    Built once per token, and shared by the requests that pass no ``extra_args``: building
    a dict and a ``CIMultiDict`` per request cost more than the rest of this layer.
    Read-only all the way down (aiohttp copies request headers into a new ``CIMultiDict``),
    so concurrent requests cannot see each other's header; a new token gets new arguments.
    Its ``repr`` hides the header, which ``vars(transport)`` would show.
    """

    __slots__ = ("args", "token")

    def __init__(self, token: AccessToken) -> None:
        #: The token these arguments carry; compared by identity.
        self.token = token
        headers = CIMultiDictProxy(CIMultiDict({"Authorization": token.authorization}))
        # gql annotates extra_args as a dict, and only reads it.
        self.args = cast("dict[str, Any]", MappingProxyType({"headers": headers}))

    def __repr__(self) -> str:
        return "<_SharedArgs Authorization='***'>"

    def __reduce__(self) -> Any:
        raise TypeError("_SharedArgs is rebuilt, not copied")


class _Bare401:
    """An HTTP 401 without a GraphQL body: gql's error for it, rid of credentials.

    Kept so that the error that ends the request carries gql's message, ``code`` and
    chain, as code written for gql's transport expects (see :func:`_http_401`).
    """

    __slots__ = ("error",)

    def __init__(self, error: TransportServerError) -> None:
        self.error = error


def _bare_401(exc: TransportError, secrets: Sequence[str]) -> _Bare401:
    """Accept an HTTP 401 without a GraphQL body as a refusal; re-raise anything else.

    Call it from the ``except`` block. Whatever is raised keeps aiohttp's record of the
    request in its chain, and what the server echoed, so the chain is first rid of the
    credential headers and of ``secrets`` (see :mod:`gql_service_auth._redact`).
    """
    redact_chain(exc, secrets)
    clear_locals(exc)  # gql's post_args and aiohttp's headers hold the credential
    del secrets  # and so would this frame, which a re-raise puts in the traceback
    if isinstance(exc, TransportServerError) and exc.code == 401:
        return _Bare401(exc)
    raise exc


async def _sent(sending: Awaitable[_T], secrets: Sequence[str]) -> _T | _Bare401:
    """The answer of ``sending``, or the HTTP 401 it met without a GraphQL body."""
    try:
        return await sending
    except TransportError as exc:
        try:
            return _bare_401(exc, secrets)
        finally:
            del secrets  # this frame is in the traceback too
    except BaseException as exc:  # cancelled (gql's execute_timeout), or a bug
        del secrets
        clear_locals(exc)
        raise


_HTTPErrorT = TypeVar("_HTTPErrorT", bound=UnauthenticatedHTTPError)


def _http_401(kind: type[_HTTPErrorT], bare: _Bare401, explanation: str) -> _HTTPErrorT:
    """The error that ends a request refused with a bare HTTP 401.

    gql's message comes first, as code written for gql's transport may match it
    (``"401, message='Unauthorized'"``); gql's error, already rid of credentials, is
    the cause. Set here rather than by ``raise ... from``: the callers raise it outside
    their ``except`` blocks, to keep internal signals out of the chain.
    """
    error = kind(f"{bare.error}: {explanation}")
    error.__cause__ = bare.error
    return error


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
    """What both transports share: argument checks, sessions per event loop, copying."""

    def __init__(
        self,
        url: str | URL,
        headers: LooseHeaders | None,
        cookies: LooseCookies | None,
        auth: object,
        ssl: SSLContext | bool | Fingerprint,
        timeout: int | None,
        ssl_close_timeout: int | float | None,
        json_serialize: Callable[..., str],
        json_deserialize: Callable[..., Any],
        client_session_args: dict[str, Any] | None,
        *,
        allow_insecure_http: bool,
    ) -> None:
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        if auth is not None:
            raise ConfigurationError(
                "auth= cannot be used with this transport: it sends its own Authorization "
                "header, which aiohttp cannot combine with auth"
            )
        if headers and "Authorization" in CIMultiDict(headers):
            raise ConfigurationError(
                "headers must not contain Authorization: the transport sets it on every request"
            )
        check_url(url, what="url", allow_insecure_http=allow_insecure_http)
        # gql annotates url as str, but keeps it as given and hands it to aiohttp, which
        # takes a yarl.URL too: gql's own tests pass one (aiohttp's TestServer.make_url).
        super().__init__(
            url,  # type: ignore[arg-type]
            headers=headers,
            cookies=cookies,
            ssl=ssl,
            timeout=timeout,
            ssl_close_timeout=ssl_close_timeout,
            json_serialize=json_serialize,
            json_deserialize=json_deserialize,
            client_session_args=client_session_args,
        )
        _fork.reset_in_child(self)

    def __repr__(self) -> str:
        # getattr: a constructor that failed leaves an instance without url, which a
        # debugger or a crash reporter may still show.
        return f"<{type(self).__name__} url={str(getattr(self, 'url', None))!r}>"

    # gql's sync Client.execute connects, executes and closes on the calling thread's event
    # loop, so one transport serves several loops. An aiohttp session belongs to the loop
    # it was made on: one per loop lets loops and threads share the transport (and so its
    # token), and a loop handed to another thread keeps its session.
    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The running event loop's aiohttp session, or ``None`` when it is not connected."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        return self._sessions.get(loop)

    @session.setter
    def session(self, value: aiohttp.ClientSession | None) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if value is None:
                return  # gql's __init__ clears the session before any loop exists
            raise
        if value is None:
            self._sessions.pop(loop, None)
        else:
            self._sessions[loop] = value

    @property
    def files(self) -> dict[str, FileVar]:
        """The files of the upload the current task is sending (gql reads and sets it)."""
        held = _UPLOAD_FILES.get()
        return held[1] if held is not None and held[0] is self else {}

    @files.setter
    def files(self, value: dict[str, FileVar]) -> None:
        _UPLOAD_FILES.set((self, value))

    # pickle and copy.deepcopy copy the settings, never the sessions (bound to a loop) nor
    # the last answer's headers; the token manager drops its own runtime state.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_sessions"] = {}
        state.pop("response_headers", None)
        state.pop("_bare_refusal", None)
        state.pop("_shared_args", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _fork.reset_in_child(self)

    def _after_fork_in_child(self) -> None:
        for session in self._sessions.values():
            connector = session.connector
            session.detach()  # closed, as far as the session goes, with nothing shut down
            if connector is not None:
                # Its finalizer would close the parent's transports (above); marked closed,
                # it leaves them alone. A private flag, the one aiohttp's own close() sets.
                if hasattr(connector, "_closed"):
                    connector._closed = True
                _FORK_ORPHANS.append(connector)
        self._sessions = {}


class ApiKeyTransport(_AuthenticatingTransport):
    """A gql ``AIOHTTPTransport`` that authenticates with the service's API key.

    Sends ``Authorization: SERVICE-API-KEY <client_id>:<client_secret>`` on every request;
    no token is ever requested. Credentials registered before 2024-05-13 cannot be used
    this way: use :class:`OAuth2Transport` for them.

    Args:
        url: The GraphQL endpoint, ``{base_url}/graphql``: a str or a ``yarl.URL``.
        headers, cookies, auth, ssl, timeout, ssl_close_timeout, json_serialize,
            json_deserialize, client_session_args: gql's ``AIOHTTPTransport`` arguments,
            in gql's order; ``auth`` must stay ``None``.
        client_id: The Client Id from the console.
        client_secret: The Client Secret from the console; never shown.
        allow_insecure_http: Allow a plain ``http://`` URL to a host that is not loopback.

    Raises:
        ConfigurationError: bad credentials format, unsafe URL, ``auth`` given, or an
            ``Authorization`` entry in ``headers``.
    """

    @_forgets_arguments_on_error
    def __init__(
        self,
        url: str | URL,
        headers: LooseHeaders | None = None,
        cookies: LooseCookies | None = None,
        auth: None = None,
        ssl: SSLContext | bool | Fingerprint = True,
        timeout: int | None = None,
        ssl_close_timeout: int | float | None = 10,
        json_serialize: Callable[..., str] = json.dumps,
        json_deserialize: Callable[..., Any] = json.loads,
        client_session_args: dict[str, Any] | None = None,
        *,
        client_id: str,
        client_secret: str,
        allow_insecure_http: bool = False,
    ) -> None:
        self._credentials = ClientCredentials(client_id, client_secret)
        super().__init__(
            url, headers, cookies, auth, ssl, timeout, ssl_close_timeout, json_serialize,
            json_deserialize, client_session_args, allow_insecure_http=allow_insecure_http,
        )  # fmt: skip

    async def connect(self) -> None:
        """Open this event loop's aiohttp session, which sends the API key on every request.

        The key never changes, so it is one of the new session's default headers, set
        before the session serves any request: aiohttp merges a per-request header into
        the defaults on every request, which costs more than the rest of this layer. The
        session is this loop's alone, and shows no header in its ``repr``.
        """
        await super().connect()
        session = self.session
        assert session is not None
        session.headers["Authorization"] = self._credentials.api_key_authorization()

    @classmethod
    @_forgets_arguments_on_error
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        url: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        **kwargs: Unpack[ApiKeyOptions],
    ) -> Self:
        """Build the transport from the ``SERVICE_*`` environment variables.

        Reads ``SERVICE_BASE_URL`` (``/graphql`` is appended unless it ends with it),
        ``SERVICE_CLIENT_ID`` and ``SERVICE_CLIENT_SECRET``. A setting given by keyword
        wins: its variable is then not read.

        Args:
            environ: Where to read the variables; the process environment by default.
            url: The GraphQL endpoint; ``None`` reads ``SERVICE_BASE_URL``.
            client_id: The Client Id; ``None`` reads ``SERVICE_CLIENT_ID``.
            client_secret: The Client Secret; ``None`` reads ``SERVICE_CLIENT_SECRET``.
            **kwargs: Passed to the constructor.

        Raises:
            ConfigurationError: a variable is missing or empty; the message names it.
        """
        return cls(
            url if url is not None else env_url(environ, ENV_BASE_URL, GRAPHQL_PATH),
            client_id=client_id if client_id is not None else read_env(environ, ENV_CLIENT_ID),
            client_secret=(
                client_secret
                if client_secret is not None
                else read_env(environ, ENV_CLIENT_SECRET)
            ),
            **kwargs,
        )

    def _refused(self, answer: ExecutionResult | _Bare401) -> ApiKeyRejectedError:
        if isinstance(answer, _Bare401):
            return _http_401(
                ApiKeyRejectedHTTPError,
                answer,
                f"the service refused the API key (HTTP 401). {_API_KEY_ADVICE}",
            )
        # The service may quote the key it refused; the error must not.
        errors, data, extensions = _answer_parts(answer, [self._credentials.client_secret])
        # What the service said tells a wrong secret from the 2024-05-13 rule; the
        # message must say it, since most people read only the message.
        said = _refusal_message(errors)
        message = "the service refused the API key (UNAUTHENTICATED)"
        if said is not None:
            message += f"; server said: {said!r}"
        return ApiKeyRejectedError(
            f"{message}. {_API_KEY_ADVICE}", errors=errors, data=data, extensions=extensions
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
        # Without extra_args, the header is the session's own (see connect).
        args = (
            _with_authorization(extra_args, self._credentials.api_key_authorization())
            if extra_args
            else None
        )
        try:
            result = await super().execute(request, extra_args=args, upload_files=upload_files)
        except TransportError as exc:
            del args  # the request is over; the traceback keeps this frame's locals
            raise self._refused(_bare_401(exc, [self._credentials.client_secret])) from exc
        except BaseException as exc:  # cancelled (gql's execute_timeout), or a bug
            del args
            clear_locals(exc)
            raise
        else:
            del args  # the traceback of a refusal keeps this frame's locals
        if result.errors:  # the fast path skips even the calls otherwise
            if _is_refusal(result.errors):
                error = self._refused(result)
                del result  # an answer that may quote the key
                raise error
            _scrubbed(result, [self._credentials.client_secret])
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
        args = _with_authorization(extra_args, self._credentials.api_key_authorization())
        try:
            results = await super().execute_batch(reqs, extra_args=args)
        except TransportError as exc:
            args.clear()  # the request is over; the traceback keeps this frame's locals
            raise self._refused(_bare_401(exc, [self._credentials.client_secret])) from exc
        except BaseException as exc:  # cancelled (gql's execute_timeout), or a bug
            args.clear()
            clear_locals(exc)
            raise
        refused = next((result for result in results if _is_refusal(result.errors)), None)
        if refused is not None:
            error = self._refused(refused)
            args.clear()  # as in execute
            del results, refused
            raise error
        return _scrubbed(results, [self._credentials.client_secret])

    async def subscribe(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
    ) -> AsyncGenerator[ExecutionResult, None]:
        """Subscribe over HTTP multipart with the API key; see gql's ``subscribe``."""
        args = _with_authorization(extra_args, self._credentials.api_key_authorization())
        try:
            async for result in super().subscribe(request, extra_args=args):
                yield _scrubbed(result, [self._credentials.client_secret])
        except BaseException as exc:
            args.clear()  # the traceback keeps this frame's locals
            redact_chain(exc, [self._credentials.client_secret])
            clear_locals(exc)
            # gql raises this for any 401 to a subscription, body or not: a refusal.
            if isinstance(exc, TransportServerError) and exc.code == 401:
                raise self._refused(_Bare401(exc)) from exc
            raise


class OAuth2Transport(_AuthenticatingTransport):
    """A gql ``AIOHTTPTransport`` that authenticates with OAuth 2.0 client-credentials tokens.

    The first request fetches a token; concurrent requests share one fetch; a token is
    renewed ``refresh_margin`` seconds before it expires; and when the service answers
    ``UNAUTHENTICATED`` (or HTTP 401 without a body) to a request that ran nothing, the
    token is renewed and the request sent again, up to ``max_renewals`` times.

    Args:
        url: The GraphQL endpoint, ``{base_url}/graphql``: a str or a ``yarl.URL``.
        headers, cookies, auth, ssl, timeout, ssl_close_timeout, json_serialize,
            json_deserialize, client_session_args: gql's ``AIOHTTPTransport`` arguments,
            in gql's order; ``auth`` must stay ``None``. ``ssl`` also applies to the
            token endpoint; ``headers`` and ``cookies`` do not, nor does
            ``client_session_args`` beyond what ``token_session_args`` says.
        token_url: The token endpoint, ``{auth_url}/oauth2/token``: a str or a ``yarl.URL``.
        client_id: The Client Id from the console.
        client_secret: The Client Secret from the console; never shown.
        scope: Scope to request, a string or a sequence joined by spaces; ``None`` sends none.
        token_params: Further form fields for the token request (``audience``...).
        token_auth_method: ``"client_secret_post"`` (form fields, as the contract says) or
            ``"client_secret_basic"`` (HTTP Basic).
        refresh_margin: Seconds before expiry at which a token is renewed, capped at half
            its lifetime. An upload, which cannot be sent twice, asks for a token valid at
            least this long.
        default_expires_in: Seconds a token is trusted when the server gives no usable
            ``expires_in`` (none, unreadable, or 0 and less).
        max_renewals: Renewals, and so re-sends, per request after a refusal; 0 never
            re-sends. Requests refused with the same token share one renewal.
        retry: Bounds and backoff of the token endpoint's retries, and the pause of
            renewals while fresh tokens keep being refused; ``None`` means
            ``RetryPolicy()``.
        on_event: Called with each :class:`~gql_service_auth.AuthEvent` (token fetched,
            retry scheduled...), e.g. to count renewals.
        clock: Monotonic clock in seconds for token lifetimes; ``time.monotonic`` when ``None``.
        allow_insecure_http: Allow plain ``http://`` URLs to hosts that are not loopback,
            and a plain ``http://`` ``token_url`` through an ``http://`` proxy that is not.
        token_session_args: aiohttp ``ClientSession`` keywords for the token request's
            own session (see :class:`~gql_service_auth.TokenSessionArgs`): ``trust_env``,
            ``proxy``, ``proxy_auth``, ``connector`` (a callable returning a new
            connector, as the fetch runs on an event loop of its own), ``trace_configs``,
            ``read_bufsize``, ``max_line_size``, ``max_field_size``; any other key is
            refused. ``None`` takes ``trust_env``, ``proxy`` and ``proxy_auth`` from
            ``client_session_args``, so the token request goes where the GraphQL
            requests go; ``{}`` sends it directly whatever ``client_session_args`` says.
        token_proxy: The token request's proxy, an ``http://`` or ``https://`` URL (a
            ``str`` or ``yarl.URL``, credentials in it as ``user:password@``), in place of
            any other; ``None`` keeps what ``token_session_args`` says. Never shown in a
            ``repr`` or message.
        token_store: A store that shares tokens with other processes, such as
            :class:`~gql_service_auth.redis.RedisTokenStore`: a process then asks the
            token endpoint only when no other process has a token it can use. ``None``
            keeps tokens in this process only.

    Raises:
        ConfigurationError: a bad argument; the message says which.
    """

    # The last refusal that dropped a token, when it was a bare HTTP 401 (else None): a call
    # that fails at once while renewals are paused ends as that one did, gql's 401 error too.
    _bare_refusal: _Bare401 | None = None
    # The post arguments of the token last sent without extra_args (see _SharedArgs).
    _shared_args: _SharedArgs | None = None

    @_forgets_arguments_on_error
    def __init__(
        self,
        url: str | URL,
        headers: LooseHeaders | None = None,
        cookies: LooseCookies | None = None,
        auth: None = None,
        ssl: SSLContext | bool | Fingerprint = True,
        timeout: int | None = None,
        ssl_close_timeout: int | float | None = 10,
        json_serialize: Callable[..., str] = json.dumps,
        json_deserialize: Callable[..., Any] = json.loads,
        client_session_args: dict[str, Any] | None = None,
        *,
        token_url: str | URL,
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
        token_session_args: TokenSessionArgs | None = None,
        token_proxy: str | URL | None = None,
        token_store: TokenStore | None = None,
    ) -> None:
        credentials = ClientCredentials(client_id, client_secret)
        check_url(token_url, what="token_url", allow_insecure_http=allow_insecure_http)
        token_session = resolve_token_session(
            token_session_args,
            client_session_args=client_session_args,
            token_proxy=token_proxy,
            token_url=token_url,
            allow_insecure_http=allow_insecure_http,
        )
        _check_number("refresh_margin", refresh_margin)
        _check_number("default_expires_in", default_expires_in, positive=True)
        if isinstance(max_renewals, bool) or not isinstance(max_renewals, int) or max_renewals < 0:
            raise ConfigurationError("max_renewals must be an int of at least 0")
        if scope is not None and not isinstance(scope, str):
            scope = " ".join(scope)  # RFC 6749 section 3.3: space-delimited
        super().__init__(
            url, headers, cookies, auth, ssl, timeout, ssl_close_timeout, json_serialize,
            json_deserialize, client_session_args, allow_insecure_http=allow_insecure_http,
        )  # fmt: skip
        self.token_url = token_url
        self._credentials = credentials
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
            post=AiohttpFormPoster(ssl=self.ssl, session=token_session),
            emit=self._emit,
        )
        shared = None
        if token_store is not None:
            for method in ("load", "save", "discard", "lock", "unlock", "failure"):
                if not callable(getattr(token_store, method, None)):
                    raise ConfigurationError(
                        f"token_store must be a TokenStore; {type(token_store).__name__} "
                        f"has no {method}()"
                    )
            identity = TokenIdentity.of(
                token_url=str(token_url),
                client_id=credentials.client_id,
                client_secret=credentials.client_secret,
                scope=scope,
                token_params=dict(token_params or {}),
                auth_method=token_auth_method,
            )
            shared = SharedLevel(
                token_store,
                identity,
                refresh_margin=float(refresh_margin),
                default_expires_in=float(default_expires_in),
                emit=self._emit,
            )
            del identity
        self._tokens = TokenManager(
            grant,
            refresh_margin=float(refresh_margin),
            default_expires_in=float(default_expires_in),
            fetch_timeout=self._policy.timeout + FETCH_GRACE,
            cooldown=self._policy.pause_after,
            max_attempts=self._policy.attempts,
            clock=clock or time.monotonic,
            emit=self._emit,
            shared=shared,
        )

    @classmethod
    @_forgets_arguments_on_error
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        url: str | None = None,
        token_url: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        **kwargs: Unpack[OAuth2Options],
    ) -> Self:
        """Build the transport from the ``SERVICE_*`` environment variables.

        Reads ``SERVICE_BASE_URL`` and ``SERVICE_AUTH_URL`` (``/graphql`` and
        ``/oauth2/token`` are appended unless they end with them), ``SERVICE_CLIENT_ID``
        and ``SERVICE_CLIENT_SECRET``, and, if set, ``SERVICE_TOKEN_STORE_URL``: a Redis
        URL whose :class:`~gql_service_auth.redis.RedisTokenStore` becomes the
        ``token_store`` (the ``[redis]`` extra). A setting given by keyword wins: its
        variable is then not read.

        Args:
            environ: Where to read the variables; the process environment by default.
            url: The GraphQL endpoint; ``None`` reads ``SERVICE_BASE_URL``.
            token_url: The token endpoint; ``None`` reads ``SERVICE_AUTH_URL``.
            client_id: The Client Id; ``None`` reads ``SERVICE_CLIENT_ID``.
            client_secret: The Client Secret; ``None`` reads ``SERVICE_CLIENT_SECRET``.
            **kwargs: Passed to the constructor.

        Raises:
            ConfigurationError: a variable is missing or empty; the message names it.
            ImportError: ``SERVICE_TOKEN_STORE_URL`` is set, and the ``[redis]`` extra is
                not installed.
        """
        store_url = environ.get(ENV_TOKEN_STORE_URL, "").strip()
        if "token_store" not in kwargs and store_url:
            # Imported only here: the extra's module is the one place that needs redis.
            from .redis import shared_store

            # One per URL per process: a transport per job must not open a store per job.
            kwargs["token_store"] = shared_store(store_url)
        del store_url
        return cls(
            url if url is not None else env_url(environ, ENV_BASE_URL, GRAPHQL_PATH),
            token_url=(
                token_url if token_url is not None else env_url(environ, ENV_AUTH_URL, TOKEN_PATH)
            ),
            client_id=client_id if client_id is not None else read_env(environ, ENV_CLIENT_ID),
            client_secret=(
                client_secret
                if client_secret is not None
                else read_env(environ, ENV_CLIENT_SECRET)
            ),
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

        What is sent is read off ``request`` when the call starts, as gql's own transport
        does, so concurrent callers each send their own request, re-sends included.

        Raises:
            UnauthenticatedError: the service kept refusing renewed tokens, or refused a
                request that is never sent twice: an upload, an answer with data, or a
                mutation refused while it ran.
            TokenRequestError: no token could be obtained.
        """
        snapshot = _snapshot(request)
        # An upload's file streams are consumed by the first send, which is never
        # repeated: it asks for a token that will outlive it.
        min_ttl = self._refresh_margin if upload_files else 0.0
        token = self._tokens.fresh(min_ttl)
        first: tuple[AccessToken, ExecutionResult | _Bare401] | None = None
        if token is not None:
            # Fast path, inlined: almost every request succeeds on its first send with a
            # cached token, and each coroutine layer or closure here costs a query time.
            # No await comes before gql serialises the request, so the caller's object
            # is what the snapshot holds.
            if extra_args:
                args = _with_authorization(extra_args, token.authorization)
            else:
                shared = self._shared_args
                if shared is None or shared.token is not token:
                    # Rebound once per token: what requests in flight read never changes.
                    shared = self._shared_args = _SharedArgs(token)
                args = shared.args
                del shared
            result: ExecutionResult | _Bare401
            try:
                answer = await super().execute(request, extra_args=args, upload_files=upload_files)
            except TransportError as exc:
                del args  # the request is over; the traceback keeps this frame's locals
                result = _bare_401(exc, [self._credentials.client_secret, token.value])
            except BaseException as exc:  # cancelled (gql's execute_timeout), or a bug
                del args
                clear_locals(exc)
                raise
            else:
                del args  # a refusal goes on below, and may end in a traceback
                errors = answer.errors
                if not errors or not _is_refusal(errors):
                    if token.generation > self._tokens.confirmed:
                        self._tokens.confirm(token)
                    if errors:
                        _scrubbed(answer, [self._credentials.client_secret, token.value])
                    return answer
                result = answer
                del answer, errors  # the refusal may quote the token
            first = (token, result)
            del result  # the refusal may quote the token; a traceback keeps locals
        # The slow path is a coroutine of its own: its closures would make this one's
        # variables cells, which every request then pays for.
        rest = self._execute_with_renewal(snapshot, extra_args, upload_files, min_ttl, first)
        del first  # a traceback keeps this frame's locals; that coroutine drops its own
        return await rest

    async def _execute_with_renewal(
        self,
        snapshot: _Snapshot,
        extra_args: dict[str, Any] | None,
        upload_files: bool,
        min_ttl: float,
        first: tuple[AccessToken, ExecutionResult | _Bare401] | None,
    ) -> ExecutionResult:
        """``execute`` past its fast path: no usable token, or the first send refused."""
        parent = super().execute

        def send(authorization: str, payload: GraphQLRequest) -> Awaitable[ExecutionResult]:
            return parent(
                payload,
                extra_args=_with_authorization(extra_args, authorization),
                upload_files=upload_files,
            )

        def verdict(result: ExecutionResult | _Bare401) -> tuple[bool, str | None]:
            return _verdict(result, snapshot, upload=upload_files)

        try:
            return await self._send_with_renewal(
                lambda: _rebuild(snapshot), send, verdict, first=first, min_ttl=min_ttl
            )
        except UnauthenticatedError:
            del first  # the raw answer may quote the token; the traceback keeps locals
            raise

    async def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with a valid token; see gql's ``AIOHTTPTransport.execute_batch``.

        A refused batch is sent again only when no operation of it can have run: every
        answer refused the token before execution, and none carries data.
        """
        snapshots = [_snapshot(req) for req in reqs]
        parent = super().execute_batch

        def send(
            authorization: str, payload: list[GraphQLRequest]
        ) -> Awaitable[list[ExecutionResult]]:
            return parent(payload, extra_args=_with_authorization(extra_args, authorization))

        return await self._send_with_renewal(
            lambda: [_rebuild(s) for s in snapshots], send, _batch_verdict, first=None
        )

    async def subscribe(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
    ) -> AsyncGenerator[ExecutionResult, None]:
        """Subscribe over HTTP multipart with a valid token; see gql's ``subscribe``.

        A stream is never re-sent; a refusal drops the token so the next call renews it.
        """
        request = _rebuild(_snapshot(request))
        token = await self._token()
        try:
            async for result in super().subscribe(
                request, extra_args=_with_authorization(extra_args, token.authorization)
            ):
                if _is_refusal(result.errors):
                    self._tokens.invalidate(token)
                    self._bare_refusal = None
                yield _scrubbed(result, [self._credentials.client_secret, token.value])
        except BaseException as exc:
            redact_chain(exc, [self._credentials.client_secret, token.value])
            clear_locals(exc)
            # gql raises this for any 401 to a subscription, body or not: a refusal.
            if isinstance(exc, TransportServerError) and exc.code == 401:
                self._tokens.invalidate(token)
                self._bare_refusal = bare = _Bare401(exc)
                why = "it is a subscription, whose stream is never sent twice"
                raise _not_resent(bare, why, [], dropped=True) from exc
            raise

    async def _token(self, *, min_ttl: float = 0.0) -> AccessToken:
        """A token for a new request; fails at once while renewals are paused."""
        try:
            return await self._tokens.get(min_ttl=min_ttl)
        except RenewalPaused as paused:
            error = _paused(paused, self._bare_refusal)
        raise error  # outside the except block: the internal signal stays out of the chain

    async def _send_with_renewal(
        self,
        rebuild: Callable[[], _R],
        send: Callable[[str, _R], Awaitable[_T]],
        verdict: Callable[[_T | _Bare401], tuple[bool, str | None]],
        *,
        first: tuple[AccessToken, _T | _Bare401] | None,
        min_ttl: float = 0.0,
    ) -> _T:
        """Send with a valid token; on a refusal, drop the token and re-send, within bounds.

        What is sent is ``rebuild()``, the snapshot taken when the call started: the
        caller's object may be rewritten by other calls while this one waits. ``first``
        is the token and answer of a send already made (``None``: no send yet).
        ``verdict`` tells of an answer (or a bare HTTP 401) whether it refuses the token
        and, if so, why it must not be sent again (``None``: it may be).
        """
        payload = rebuild()
        if first is None:
            token = await self._token(min_ttl=min_ttl)
            outcome = await _sent(
                send(token.authorization, payload),
                [self._credentials.client_secret, token.value],
            )
        else:
            token, outcome = first
        try:
            return self._accept(token, outcome, verdict)
        except _Refused:
            pass
        # Tenacity's first "attempt" replays the refusal in hand, so the bound counts the
        # original send; it waits out any pause of renewals before each re-send.
        refused_generation = token.generation
        last = outcome
        # One send more, once, when a re-send's token was read from a shared store and is
        # refused too: a revocation covered it that this process could not tell of (another
        # after the one it replaced, or a write that reached the store late), and a fresh
        # fetch follows. Decided when the token is handed out, not when its answer comes:
        # by then other requests' refusals may have changed what is known.
        extra = 0

        def stop(state: RetryCallState) -> bool:
            return state.attempt_number >= self._max_renewals + 1 + extra

        def before_resend(state: RetryCallState) -> None:
            self._emit(
                AuthEvent(
                    "request_retry_scheduled",
                    attempt=state.attempt_number,
                    max_attempts=self._max_renewals + 1 + extra,
                    wait=state.upcoming_sleep,
                )
            )

        retrying = AsyncRetrying(
            stop=stop,
            wait=lambda _: self._tokens.pause_remaining(),
            retry=retry_if_exception_type(_Refused),
            before_sleep=before_resend,
            reraise=True,
        )
        replayed = False
        try:
            async for attempt in retrying:
                with attempt:
                    if not replayed:
                        replayed = True
                        raise _Refused(last)
                    try:
                        token = await self._tokens.get(min_ttl=min_ttl, after=refused_generation)
                        loaded = self._tokens.loaded(token)
                    except (RenewalSpent, RenewalPaused):
                        # The renewal this request would share was refused as well, or
                        # fresh tokens keep being refused: this attempt is spent unsent.
                        refused_generation = max(refused_generation, self._tokens.generation)
                        raise _Refused(last) from None
                    outcome = await _sent(
                        send(token.authorization, payload),
                        [self._credentials.client_secret, token.value],
                    )
                    refused_generation = token.generation
                    last = outcome
                    if loaded and not extra:
                        extra = 1  # counts only if this answer refuses it
                    return self._accept(token, outcome, verdict)
        except _Refused:
            pass
        # Raised outside the except block, so _Refused, which holds the raw answer, is not
        # kept as the error's __context__; the raw answers leave the frame's locals too.
        secrets = [self._credentials.client_secret, token.value]
        error = _exhausted(last, self._max_renewals, secrets)
        del last, outcome, first, secrets
        raise error

    def _accept(
        self,
        token: AccessToken,
        outcome: _T | _Bare401,
        verdict: Callable[[_T | _Bare401], tuple[bool, str | None]],
    ) -> _T:
        """The answer, unless it refuses ``token``.

        Raises:
            _Refused: the token was refused and the request may be sent again.
            UnauthenticatedError: the token was refused and the request must not be re-sent.
        """
        dropped = True
        refused, why_not = verdict(outcome)
        if not refused and not isinstance(outcome, _Bare401):
            if token.generation > self._tokens.confirmed:
                self._tokens.confirm(token)
            return _scrubbed(outcome, [self._credentials.client_secret, token.value])
        answers = outcome if isinstance(outcome, list) else [outcome]
        if any(isinstance(a, ExecutionResult) and _during_execution(a.errors) for a in answers):
            # Refused while it ran: accepted to start with, so no fresh token refused.
            dropped = self._tokens.refused_while_running(token)
            if not dropped and why_not is None:
                why_not = (
                    "the service refused it while it ran, with a token already renewed for "
                    "that very reason: the refusal is about the operation, not the token"
                )
        else:
            # Only the first of many requests refused with this token renews it.
            self._tokens.invalidate(token)
            self._bare_refusal = outcome if isinstance(outcome, _Bare401) else None
        if why_not is not None:
            secrets = [self._credentials.client_secret, token.value]
            error = _not_resent(outcome, why_not, secrets, dropped=dropped)
            del secrets
            raise error
        raise _Refused(outcome)


def _verdict(
    result: ExecutionResult | _Bare401, snapshot: _Snapshot, *, upload: bool
) -> tuple[bool, str | None]:
    """Whether ``result`` refuses the token, and why the request must not be re-sent."""
    if not isinstance(result, _Bare401) and not _is_refusal(result.errors):
        return False, None
    if upload:
        return True, "it uploads files, whose streams were consumed by the first send"
    if isinstance(result, _Bare401):
        return True, None  # refused before anything could run
    if _during_execution(result.errors):
        # Refused while it ran: a query has no side effects and may run again; a mutation
        # (or a subscription) may have changed something already.
        if _is_query(snapshot):
            return True, None
        return True, "the service refused it while it ran, so it may have changed something"
    if result.data is not None:
        return True, "the answer carried data, so part of it may have run"
    return True, None


def _batch_verdict(results: list[ExecutionResult] | _Bare401) -> tuple[bool, str | None]:
    if isinstance(results, _Bare401):
        return True, None  # refused before anything could run
    refusals = [_is_refusal(result.errors) for result in results]
    if not any(refusals):
        return False, None
    if all(refusals) and not any(
        result.data is not None or _during_execution(result.errors) for result in results
    ):
        return True, None
    return True, "part of the batch may have run"


def _scrubbed(answer: _T, secrets: list[str]) -> _T:
    """``answer`` (one result or a batch's) with credentials scrubbed from its errors.

    An answer that is not a refusal goes back to gql, whose client raises
    ``TransportQueryError`` for its ``errors``, with the first as message: a service that
    quotes the API key or the token it was sent in another error (``FORBIDDEN``...) must
    not put it there. Answers without errors are left alone, untouched and uncopied.
    """
    for result in answer if isinstance(answer, list) else (answer,):
        if isinstance(result, ExecutionResult) and result.errors:
            result.errors = cast(Any, redact_text(result.errors, secrets))
            result.data = cast(Any, redact_text(result.data, secrets))
            result.extensions = cast(Any, redact_text(result.extensions, secrets))
    return answer


def _answer_parts(answer: object, secrets: list[str]) -> tuple[list[Any] | None, Any, Any]:
    """The ``errors``, ``data`` and ``extensions`` of a refusal, with any secret scrubbed."""
    if isinstance(answer, list):
        answer = next((r for r in answer if _is_refusal(r.errors)), None)
    if not isinstance(answer, ExecutionResult):
        return None, None, None
    errors = redact_text(answer.errors, secrets)
    return (
        errors if isinstance(errors, list) else None,
        redact_text(answer.data, secrets),
        redact_text(answer.extensions, secrets),
    )


def _exhausted(answer: object, renewals: int, secrets: list[str]) -> UnauthenticatedError:
    how = "HTTP 401" if isinstance(answer, _Bare401) else "UNAUTHENTICATED"
    message = (
        f"the service refused the access token ({how}) after {renewals} renewal(s). "
        "The authorization server issues tokens the API does not accept: check that url "
        "and token_url belong to the same environment (SERVICE_BASE_URL, SERVICE_AUTH_URL) "
        "and that the credentials' project may use the API"
    )
    if isinstance(answer, _Bare401):
        return _http_401(UnauthenticatedHTTPError, answer, message)
    errors, data, extensions = _answer_parts(answer, secrets)
    return UnauthenticatedError(
        message,
        errors=errors,
        data=data,
        extensions=extensions,
    )


def _not_resent(
    answer: object, why: str, secrets: list[str], *, dropped: bool
) -> UnauthenticatedError:
    errors, data, extensions = _answer_parts(answer, secrets)
    token = (
        "The token was dropped, so calling again uses a new one"
        if dropped
        else "The token was kept: the service accepts it for other operations"
    )
    how = "HTTP 401" if isinstance(answer, _Bare401) else "UNAUTHENTICATED"
    message = (
        f"the service refused the access token ({how}); the request was not sent "
        f"again because {why}. {token}"
    )
    if isinstance(answer, _Bare401):
        return _http_401(UnauthenticatedHTTPError, answer, message)
    return UnauthenticatedError(
        message,
        errors=errors,
        data=data,
        extensions=extensions,
    )


def _paused(paused: RenewalPaused, bare: _Bare401 | None) -> UnauthenticatedError:
    """The error of a call that fails at once while renewals are paused.

    When the refusals that caused the pause were bare HTTP 401s, it is gql's 401 error
    too, as the calls that met them ended: code written for gql catches both alike.
    """
    message = (
        f"the service refused the last {paused.refusals} access tokens before accepting "
        f"any request with them; renewals are paused for {paused.remaining:.1f} s to spare "
        "the authorization server. Check that url and token_url belong to the same "
        "environment (SERVICE_BASE_URL, SERVICE_AUTH_URL) and that the credentials' "
        "project may use the API"
    )
    if bare is not None:
        return _http_401(UnauthenticatedHTTPError, bare, message)
    return UnauthenticatedError(message)
