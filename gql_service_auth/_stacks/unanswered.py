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
import time
from typing import Protocol, runtime_checkable

from gql.transport.exceptions import TransportConnectionFailed, TransportServerError

from .._core.diagnosis import deadline_message, http_status_message, unreachable_message
from .._core.errors import (
    GqlServiceAuthError,
    ServiceHTTPError,
    ServiceTimeoutError,
    ServiceUnreachableError,
)

_NETWORK: tuple[type[BaseException], ...] = (asyncio.TimeoutError, TimeoutError)
_TIMEOUTS: tuple[type[BaseException], ...] = (asyncio.TimeoutError, TimeoutError)


def register(
    network: tuple[type[BaseException], ...], timeouts: tuple[type[BaseException], ...]
) -> None:
    """Errors of a stack's client that mean no answer came (``timeouts``: in time)."""
    global _NETWORK, _TIMEOUTS
    _NETWORK = (*_NETWORK, *network)
    _TIMEOUTS = (*_TIMEOUTS, *timeouts)


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
        """The proxy the API's requests go through, named without credentials."""


def _in_chain(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, kinds):
            return link
        link = link.__cause__ or link.__context__
    return None


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
        timed_out = _in_chain(failure, _TIMEOUTS) is not None
        error = ServiceUnreachableError(
            unreachable_message(
                str(failure),
                url,
                timeout=transport._unanswered_timeout(cause, given_timeout) if timed_out else None,
                timed_out=timed_out,
                proxy=transport._unanswered_proxy(),
            )
        )
    else:
        return failure
    # The stack's error, as gql's had it: code written for gql reads the response there
    # (``exc.__cause__.response`` on requests and httpx); gql's message leads ours.
    error.__cause__ = failure.__cause__ or failure
    error.__suppress_context__ = True
    return error


def past_deadline(
    failure: BaseException,
    started: float,
    transport: ServiceEndpoint,
    token_url: str | None = None,
) -> ServiceTimeoutError | None:
    """The error of a call cancelled because a deadline around it passed (gql's
    ``execute_timeout``, an anyio or trio scope's), or ``None`` for any other failure,
    which goes on as it is (a cancellation of another kind among them).

    Raising it in place of the cancellation is what the deadline's own scope would do
    (gql's ``fail_after`` raises a ``TimeoutError``), with the URL and the bound in the
    message. ``started``: ``time.monotonic()`` when the call began. ``token_url``: the
    call was still waiting for its token.
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
    error = ServiceTimeoutError(
        deadline_message(
            str(transport.url),
            time.monotonic() - started,
            token_url=token_url,
            proxy=None if token_url else transport._unanswered_proxy(),
        )
    )
    error.__suppress_context__ = True
    return error
