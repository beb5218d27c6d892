"""aiohttp plumbing of the aiohttp transports, which the decision core never sees.

Sessions per event loop, the files of each upload per task, the post arguments shared by
the requests of one credential, and what a forked child does with its parent's connectors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from ssl import SSLContext
from time import monotonic
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import aiohttp
from aiohttp.client_reqrep import Fingerprint
from aiohttp.typedefs import LooseCookies, LooseHeaders
from gql.graphql_request import GraphQLRequest
from gql.transport.aiohttp import AIOHTTPTransport
from gql.transport.exceptions import TransportClosed, TransportConnectionFailed, TransportError
from gql.transport.file_upload import FileVar, close_files
from graphql import ExecutionResult
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from .._core import fork as _fork
from .._core.config import check_url, environment_proxy, proxy_login
from .._core.errors import ConfigurationError
from .._core.rotation import Credentials
from .._core.telemetry import Method

# Imported for what it does: it registers how aiohttp errors are scrubbed.
from . import aiohttp_redact  # noqa: F401
from .failures import count
from .gql import AnswerHeadersApart, Bare401, as_given, bare_401, stream_as_given
from .readiness import ChecksAsync
from .unanswered import explained, past_deadline, register

# What aiohttp raises when no answer came, which the transports explain (see
# _stacks/unanswered.py); its ServerTimeoutError is an asyncio.TimeoutError too.
register(
    (aiohttp.ClientConnectionError, aiohttp.ClientHttpProxyError),
    (),
    tls=(aiohttp.ClientSSLError, aiohttp.ServerFingerprintMismatch),
    connect=(aiohttp.ClientConnectorError,),
)

if TYPE_CHECKING:
    from aiohttp.client import _RequestContextManager

_C = TypeVar("_C")
_E = TypeVar("_E", bound=BaseException)
_R = TypeVar("_R")

# gql's transport keeps the files of an upload in one attribute per transport, opened
# before the request and closed in a `finally` after it: concurrent uploads closed each
# other's files. Each asyncio task has its own context, so here each upload has its own.
_UPLOAD_FILES: ContextVar[tuple[object, dict[str, FileVar]] | None] = ContextVar(
    "gql_service_auth_upload_files", default=None
)


def with_authorization(extra_args: Mapping[str, Any] | None, authorization: str) -> dict[str, Any]:
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


def transport_error(exc: Exception) -> TransportError:
    """``exc`` as gql's ``execute`` raises it: its own errors as they are, any other one
    of the stack as ``TransportConnectionFailed`` caused by it."""
    if isinstance(exc, TransportError):
        return exc
    failed = TransportConnectionFailed(str(exc))
    failed.__cause__ = exc  # what `raise failed from exc` sets
    failed.__suppress_context__ = True
    return failed


class SharedArgs:
    """The aiohttp ``post`` arguments of every request sent with one credential.

    Built once per token (or once for an API key), and shared by the requests that pass no
    ``extra_args``: building a dict and a ``CIMultiDict`` per request cost more than the
    rest of this layer. Never written: gql copies ``args`` into each request's arguments,
    and aiohttp copies the read-only headers into a new ``CIMultiDict``, so concurrent
    requests cannot see each other's header; a new token gets new arguments. (A plain dict,
    not a ``MappingProxyType``: gql's ``dict.update`` reads a proxy key by key, which
    figure 1 of ``make bench`` showed.) Its ``repr`` hides the header, which
    ``vars(transport)`` would show.

    The credential is never a default header of the session: aiohttp copies a session's
    default headers into the ``CONNECT`` request it sends a forward proxy, in clear text,
    and into any request a user makes with ``transport.session``.
    """

    __slots__ = ("args", "source")

    def __init__(self, source: object, authorization: str) -> None:
        #: What the header was made from (a token, the credentials); compared by identity.
        self.source = source
        headers = CIMultiDictProxy(CIMultiDict({"Authorization": authorization}))
        self.args: dict[str, Any] = {"headers": headers}

    def __repr__(self) -> str:
        return "<SharedArgs Authorization='***'>"

    def __reduce__(self) -> Any:
        raise TypeError("SharedArgs is rebuilt, not copied")


class AuthenticatingTransport(ChecksAsync, AnswerHeadersApart, AIOHTTPTransport):
    """What both transports share: argument checks, sessions per event loop, copying, the
    calls that carry the caller's own ``Authorization``, and ``check()``."""

    # The post arguments of the credential last sent without extra_args (see SharedArgs).
    _shared_args: SharedArgs | None = None
    _credentials: Credentials
    #: How its failed requests are counted (see _stacks/failures.py).
    _method: ClassVar[Method] = "api_key"

    # A call whose extra_args carry the caller's own Authorization (see
    # _stacks/gql.callers_own) is gql's own, as given: neither signed nor sent again, its
    # answer scrubbed of the client secret.
    async def _execute_given(
        self, request: GraphQLRequest, extra_args: dict[str, Any] | None, upload_files: bool
    ) -> ExecutionResult:
        parent = AIOHTTPTransport.execute(
            self, request, extra_args=extra_args, upload_files=upload_files
        )
        return await as_given(parent, [self._credentials.client_secret])

    async def _batch_given(
        self, reqs: list[GraphQLRequest], extra_args: dict[str, Any] | None
    ) -> list[ExecutionResult]:
        parent = AIOHTTPTransport.execute_batch(self, reqs, extra_args)
        return await as_given(parent, [self._credentials.client_secret])

    async def _batch_as_given(
        self, reqs: list[GraphQLRequest], extra_args: dict[str, Any] | None
    ) -> list[ExecutionResult]:
        """:meth:`_batch_given`, a failure explained and counted as ``execute``'s is."""
        started = monotonic()
        try:
            return await self._batch_given(reqs, extra_args)
        except BaseException as exc:
            failure = self._unanswered(exc, started)
            if failure is exc:
                raise
            raise failure  # noqa: B904 - its cause is set: gql's error, or none

    def _subscribe_given(
        self, request: GraphQLRequest, extra_args: dict[str, Any] | None
    ) -> AsyncGenerator[ExecutionResult, None]:
        parent = AIOHTTPTransport.subscribe(self, request, extra_args=extra_args)
        return stream_as_given(parent, [self._credentials.client_secret])

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

    # What a request that got no answer names (see _stacks/unanswered.py).
    def _unanswered_timeout(self, cause: BaseException, given: object) -> float | None:
        # The call's own (extra_args), else the one its session has (gql sets the
        # transport's timeout there unless client_session_args gives one).
        timeout = given
        if timeout is None:
            session = self.session
            timeout = getattr(session, "timeout", None) if session is not None else None
        if timeout is None and self.timeout is not None:
            return float(self.timeout)
        total = getattr(timeout, "total", timeout)
        return float(total) if isinstance(total, int | float) else None

    def _unanswered_proxy_logins(self) -> list[str]:
        args = self.client_session_args or {}
        logins = proxy_login(args["proxy"]) if args.get("proxy") is not None else []
        auth = args.get("proxy_auth")
        if auth is not None and getattr(auth, "password", None):
            logins += [auth.password, f"{auth.login}:{auth.password}", auth.encode().split()[-1]]
        return logins

    def _unanswered_proxy(self) -> str | None:
        args = self.client_session_args or {}
        proxy = args.get("proxy")
        if proxy is not None:
            named = URL(str(proxy))
            return f"{named.host}:{named.port} (client_session_args['proxy'])"
        return environment_proxy(str(self.url), bool(args.get("trust_env", False)))

    def _unanswered(
        self,
        failure: BaseException,
        started: float,
        token_wait: Callable[[], tuple[str, str | None] | None] | None = None,
        given_timeout: object = None,
    ) -> BaseException:
        """What a call that raised ``failure`` raises: the error of gql's deadline that
        passed while it waited, the package's error for no GraphQL answer, or ``failure``;
        counted among the failed requests when it is the package's."""
        late = past_deadline(failure, started, self, token_wait)
        raised = late if late is not None else explained(failure, self, given_timeout)
        return self._counted(raised)

    def _counted(self, failure: _E) -> _E:
        """``failure``, which a call raises, counted among the failed requests if ours."""
        count(failure, self._method)
        return failure

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

    def _post(
        self,
        request: GraphQLRequest | list[GraphQLRequest],
        extra_args: dict[str, Any] | None,
        upload_files: bool,
        credential: _C,
        header_of: Callable[[_C], str],
    ) -> _RequestContextManager:
        """gql's ``AIOHTTPTransport.execute`` up to its post, with ``credential``'s header.

        The fast path of a request sends with gql's own steps (``_prepare_request``,
        ``session.post``, ``_prepare_result``, :func:`transport_error`,
        :meth:`_close_upload`) rather than by awaiting gql's ``execute``, and keeps the
        boundary of :func:`~gql_service_auth._core.redact.forgets_on_error` in its own body:
        every coroutine a request goes through is resumed at each of the request's waits,
        and each of those two layers cost about 1 µs of CPU per request in figure 1 of
        ``make bench``. gql's own suite runs against these classes. The header and the
        post arguments stay in this frame, which has returned before any await.
        """
        if extra_args:
            args = with_authorization(extra_args, header_of(credential))
        else:
            shared = self._shared_args
            if shared is None or shared.source is not credential:
                # Rebound once per credential: what requests in flight read never changes.
                shared = self._shared_args = SharedArgs(credential, header_of(credential))
            args = shared.args
        # The session property's read, in line: a call less per request.
        session = self._sessions.get(asyncio.get_running_loop())
        if session is None:
            raise TransportClosed("Transport is not connected")
        post_args = self._prepare_request(request, args, upload_files)
        try:
            # Inside gql's try there: aiohttp checks the arguments (extra_args') here.
            return session.post(self.url, ssl=self.ssl, **post_args)
        except Exception as exc:
            if upload_files:
                self._close_upload()
            raise transport_error(exc) from exc

    async def _send_once(
        self,
        request: GraphQLRequest | list[GraphQLRequest],
        extra_args: dict[str, Any] | None,
        upload_files: bool,
        credential: _C,
        header_of: Callable[[_C], str],
        read: Callable[[aiohttp.ClientResponse], Awaitable[_R]],
        secrets: Sequence[str],
    ) -> tuple[_R | Bare401, bool]:
        """One send of ``request`` (a batch: a list) with ``credential``'s header.

        Returns the answer ``read`` gives (``_prepare_result``, or ``_prepare_batch_result``
        bound to the batch) or the bare 401 it met, its chain rid of ``secrets``; and
        whether it came back through a redirect (rule 5 of
        :mod:`gql_service_auth._core.refusal`). Any other failure is raised as gql's
        ``execute`` raises it. The sends past a request's first: ``execute`` has this in
        line for its first (see :meth:`_post`).
        """
        posting = self._post(request, extra_args, upload_files, credential, header_of)
        redirected = False
        try:
            async with posting as response:
                # getattr: a response_class of the caller's may be a stand-in.
                redirected = bool(getattr(response, "history", ()))
                answer: _R | Bare401 = await read(response)
        except Exception as exc:
            answer = bare_401(transport_error(exc), secrets)
        finally:
            if upload_files:
                self._close_upload()
        return answer, redirected

    def _close_upload(self) -> None:
        """Close the files of the upload this task sent, as gql's ``execute`` does."""
        close_files(list(self.files.values()))

    @property
    def files(self) -> dict[str, FileVar]:
        """The files of the upload the current task is sending (gql reads and sets it)."""
        held = _UPLOAD_FILES.get()
        return held[1] if held is not None and held[0] is self else {}

    @files.setter
    def files(self, value: dict[str, FileVar]) -> None:
        _UPLOAD_FILES.set((self, value))

    # pickle and copy.deepcopy copy the settings, never the sessions (bound to a loop), the
    # last answer's headers (a slot: see AnswerHeadersApart) nor a credential's post
    # arguments; the token manager drops its own runtime state.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_sessions"] = {}
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
                _fork.keep_orphan(connector)
        self._sessions = {}
