"""What a call to the API raises when no GraphQL answer came, on every stack.

gql raises ``TransportServerError`` for an HTTP error status, ``TransportConnectionFailed``
for a failed connection or a stack's timeout, and its client a bare ``TimeoutError`` at
``execute_timeout``: their messages name neither the setting at fault nor the bound that
ran out. :func:`explained` turns them into the package's errors of the same classes (see
:mod:`gql_service_auth._core.errors`), worded by :mod:`gql_service_auth._core.diagnosis`.
It runs on the failure path only: a call that succeeds pays nothing for it.

Each stack module registers the errors of its HTTP client that mean "no answer"
(:func:`register`), and its transports say which timeout applied and which proxy the
request went through (:class:`ServiceEndpoint`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
import time
from collections.abc import Callable
from typing import Final, Protocol, runtime_checkable

from gql.transport.exceptions import TransportConnectionFailed, TransportServerError

from .._core.config import environment_proxy_logins
from .._core.diagnosis import (
    answered_in_plain,
    chain_links,
    deadline_message,
    http_status_message,
    unreachable_message,
)
from .._core.errors import (
    GqlServiceAuthError,
    ServiceHTTPError,
    ServiceTimeoutError,
    ServiceUnreachableError,
)
from .._core.redact import redact_chain

_NETWORK: tuple[type[BaseException], ...] = (asyncio.TimeoutError, TimeoutError)
_TIMEOUTS: tuple[type[BaseException], ...] = (asyncio.TimeoutError, TimeoutError)
_TLS: tuple[type[BaseException], ...] = (ssl.SSLError, ssl.CertificateError)
_CONNECT: tuple[type[BaseException], ...] = (ConnectionRefusedError, socket.gaierror)


def register(
    network: tuple[type[BaseException], ...],
    timeouts: tuple[type[BaseException], ...],
    *,
    tls: tuple[type[BaseException], ...] = (),
    connect: tuple[type[BaseException], ...] = (),
) -> None:
    """Errors of a stack's client that mean no answer came: ``timeouts`` in time, ``tls``
    a failed TLS check, ``connect`` no connection made; any other of ``network`` a
    connection that failed once made."""
    global _NETWORK, _TIMEOUTS, _TLS, _CONNECT
    _NETWORK = (*_NETWORK, *network)
    _TIMEOUTS = (*_TIMEOUTS, *timeouts)
    _TLS = (*_TLS, *tls)
    _CONNECT = (*_CONNECT, *connect)


@runtime_checkable
class ServiceEndpoint(Protocol):
    """What a transport tells of the request that got no answer."""

    @property
    def url(self) -> object:
        """The API's URL."""

    def _unanswered_timeout(self, cause: BaseException, given: object) -> float | None:
        """The timeout, in seconds, that ran out for ``cause``; ``None`` when unknown.
        ``given``: the call's own (requests' ``timeout=``, httpx's in ``extra_args``)."""

    def _unanswered_proxy(self) -> str | None:
        """The proxy the API's requests go through, named without credentials. (A
        transport may also tell the logins of its own proxies, which an answer may quote,
        by an ``_unanswered_proxy_logins()`` method.)"""


def _in_chain(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first error of ``kinds`` in ``exc``'s chain (see ``chain_links``)."""
    return next((link for link in chain_links(exc) if isinstance(link, kinds)), None)


def how(failure: BaseException) -> str:
    """How a request that got no answer failed (see ``unreachable_message``)."""
    if _in_chain(failure, _TIMEOUTS) is not None:
        return "timeout"
    tls = _in_chain(failure, _TLS)
    if tls is not None:
        return "plain" if answered_in_plain(tls) else "tls"
    if _in_chain(failure, _CONNECT) is not None:
        return "connect"
    return "dropped"


def explained(
    failure: BaseException, transport: ServiceEndpoint, given_timeout: object = None
) -> BaseException:
    """The error to raise for ``failure`` of a call to ``transport``'s API: the package's
    own, naming what to check, or ``failure`` itself when it says enough already (the
    package's errors, a refusal, a bug's error). Raise it outside gql's ``except`` block,
    or from it: its ``__cause__`` is set to gql's cause (the stack's error) and the context
    suppressed."""
    if isinstance(failure, GqlServiceAuthError):
        return failure
    url = str(transport.url)
    error: BaseException
    if isinstance(failure, TransportServerError) and failure.code is not None:
        if failure.code == 401:
            return failure
        error = ServiceHTTPError(
            http_status_message(str(failure), url, failure.code), failure.code
        )
    elif isinstance(failure, TransportConnectionFailed):
        cause = _in_chain(failure, _NETWORK)
        if cause is None:
            return failure
        kind = how(failure)
        timeout = _in_chain(failure, _TIMEOUTS) if kind == "timeout" else None
        error = ServiceUnreachableError(
            unreachable_message(
                str(failure),
                url,
                timeout=transport._unanswered_timeout(timeout, given_timeout) if timeout else None,
                failure=kind,
                proxy=transport._unanswered_proxy(),
            )
        )
    else:
        return failure
    # The stack's error, as gql's had it: code written for gql reads the response there
    # (``exc.__cause__.response`` on requests and httpx); gql's message leads ours. A proxy
    # may have quoted the login it was sent, in the answer the chain keeps.
    error.__cause__ = failure.__cause__ or failure
    error.__suppress_context__ = True
    logins = getattr(transport, "_unanswered_proxy_logins", None)
    redact_chain(error, [*environment_proxy_logins(), *(logins() if logins else [])])
    return error


def past_deadline(
    failure: BaseException,
    started: float,
    transport: ServiceEndpoint,
    token_wait: Callable[[], tuple[str, str | None] | None] | None = None,
) -> ServiceTimeoutError | None:
    """The error of a call that gql's ``execute_timeout`` ended, or ``None`` for any other
    failure, which goes on as it is: a cancellation of any other kind among them (a task
    cancelled, a deadline of the caller's own, such as a trio ``move_on_after``, whose
    scope must see its cancellation to move on).

    gql's client runs the call in ``anyio.fail_after(execute_timeout)`` and raises a bare
    ``TimeoutError`` once it fires; this is that ``TimeoutError``, with the URL and the
    bound in its message. It is gql's deadline when the call's own caller is gql's
    session, and the call has run as long as that session's ``execute_timeout`` (the
    caller's deadline, if any, may be the one that passed). ``started``:
    ``time.monotonic()`` when the call began. ``token_wait()``: the token URL and its
    proxy, when the call was still waiting for a token.
    """
    try:
        import anyio
    except ImportError:  # pragma: no cover - gql 4 depends on anyio
        return None
    try:
        if not isinstance(failure, anyio.get_cancelled_exc_class()):
            return None
        if anyio.current_effective_deadline() > anyio.current_time():
            return None  # no deadline passed: cancelled for another reason
    except Exception:  # no event loop anyio knows of
        return None
    elapsed = time.monotonic() - started
    timeout = _gql_execute_timeout()
    if timeout is None or elapsed < timeout - max(_SLACK, timeout * _SLACK_SHARE):
        return None  # a deadline of the caller's: its scope's to handle
    waited = token_wait() if token_wait is not None else None
    if waited is not None:
        token_url, proxy = waited
        message = deadline_message(str(transport.url), timeout, token_url=token_url, proxy=proxy)
    else:
        message = deadline_message(
            str(transport.url), timeout, proxy=transport._unanswered_proxy()
        )
    error = ServiceTimeoutError(message)
    error.__suppress_context__ = True
    return error


_SLACK: Final = 0.25
_SLACK_SHARE: Final = 0.1
"""How much earlier than gql's deadline the call may have started: gql enters its
``fail_after`` and calls the transport with no wait between, but a busy host may preempt
the thread there. A deadline of the caller's that passes in the last tenth of
``execute_timeout`` (or its last 0.25 s) is taken for gql's."""

_FRAMES: Final = 12
"""Frames looked up for gql's session: the package's own few wrappers lie in between."""


def _gql_execute_timeout() -> float | None:
    """The ``execute_timeout`` of the gql session whose ``_execute`` awaits this call, or
    ``None`` when no gql session does (the caller awaits the transport itself).

    Read off the calling frames, once, on the failure path only: gql hands a transport
    no handle on its client, and its deadline's scope is anonymous.
    """
    try:
        from gql.client import AsyncClientSession

        code = AsyncClientSession._execute.__code__
    except (ImportError, AttributeError):  # pragma: no cover - another gql
        return None
    frame = sys._getframe(1)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        if frame.f_code is code:
            client = getattr(frame.f_locals.get("self"), "client", None)
            timeout = getattr(client, "execute_timeout", None)
            return float(timeout) if isinstance(timeout, int | float) else None
        frame = frame.f_back  # type: ignore[assignment]
    return None
