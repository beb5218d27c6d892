"""One token fetch in progress, and the ways to wait for it: from any event loop, or blocking.

A fetch runs on a daemon thread with an event loop of its own (see ``_core/tokens.py``) and
publishes its outcome as a ``concurrent.futures.Future``. Waiters never run it: a
coroutine on any asyncio loop awaits it, a sync caller blocks on it, and a waiter that
gives up leaves it to finish for the others.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from .diagnosis import proxy_clause, token_unreachable_hint
from .errors import TokenRequestError
from .events import AuthEvent
from .loop_thread import close_own_loop
from .telemetry import current_context
from .token import AccessToken, TokenResponse

_POLL_INTERVAL = 0.05
"""Seconds between a waiter's own checks of a fetch, besides the fetch's wake-up call."""


@dataclass(eq=False, slots=True)
class Flight:
    """One token fetch in progress, awaitable from any event loop."""

    future: concurrent.futures.Future[AccessToken]
    reason: str
    #: Runs on its caller's loop, for that caller only (no thread could be started).
    private: bool = False
    #: The OpenTelemetry context of the caller that started it, for the fetch's span.
    trace_parent: Any = None


Fly = Callable[[Flight], Coroutine[Any, Any, None]]
"""Carries one flight out: fetches, and publishes the outcome on its future."""


def launch(reason: str, fly: Fly, *, background: bool) -> Flight | None:
    """A new flight, carried out by ``fly`` on a daemon thread with a loop of its own.

    Returns:
        ``None`` when no thread could be started for a ``background`` flight. Else the
        flight; ``private`` when no thread could be started (a pids limit, or Python 3.12+
        at interpreter shutdown): its caller then fetches for itself, on its own loop. Not
        shared, so a loop that stops can strand no one else.
    """
    future: concurrent.futures.Future[AccessToken] = concurrent.futures.Future()
    # A running future cannot be cancelled, so no waiter can cancel it for the others.
    future.set_running_or_notify_cancel()
    flight = Flight(future, reason, trace_parent=current_context())
    thread = threading.Thread(
        target=run_on_own_loop, args=(fly, flight), name="gql-service-auth-token", daemon=True
    )
    try:
        thread.start()
    except RuntimeError:
        if background:
            return None
        flight.private = True
    return flight


def run_on_own_loop(fly: Fly, flight: Flight) -> None:
    """``fly(flight)`` on a loop of its own, closed afterwards.

    Not asyncio.run: its teardown waits for the loop's default executor, where aiohttp's
    resolver may still be stuck in getaddrinfo long after the fetch timed out; and
    libraries (nest_asyncio) replace it with one that needs a main thread. ``fly``
    publishes the outcome inside the fetch, before any teardown.
    """
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(fly(flight))
    finally:
        close_own_loop(loop)


def _settle(waiter: asyncio.Future[AccessToken], done: concurrent.futures.Future[Any]) -> None:
    # Runs on the waiter's loop. A waiter cancelled meanwhile is left alone, so no
    # exception is ever set on a future that nobody will read.
    if waiter.done():
        return
    error = done.exception()
    if error is None:
        waiter.set_result(done.result())
    else:
        waiter.set_exception(own_copy(error))


def own_copy(error: BaseException) -> BaseException:
    """A copy of a fetch's error for one waiter.

    Raising one object in many callers would give it the ``__context__`` of whichever
    raised it last, so one caller's exception in flight would show in another's chain.
    Built without calling ``__init__``, which subclasses may give other arguments.
    """
    cls = type(error)
    try:
        clone = cls.__new__(cls, *error.args)
        clone.args = error.args
        clone.__dict__.update(vars(error))
    except Exception:  # pragma: no cover - an exception type that cannot be copied
        return error
    notes = getattr(error, "__notes__", None)
    if isinstance(notes, list):
        clone.__notes__ = list(notes)  # type: ignore[attr-defined]
    clone.__cause__ = error.__cause__
    clone.__suppress_context__ = error.__suppress_context__
    return clone.with_traceback(error.__traceback__)


async def wait_async(flight: Flight) -> AccessToken:
    """The outcome of ``flight``, awaited on the running asyncio loop."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[AccessToken] = loop.create_future()

    def relay(done: concurrent.futures.Future[AccessToken]) -> None:
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle, waiter, done)

    def poll() -> None:
        # A timer fires on the selector's timeout, where a wake-up through the loop's
        # self-pipe can be lost: a forked child that closes the loop it inherited
        # unregisters that pipe from the epoll instance it shares with its parent.
        if waiter.done():
            return
        if flight.future.done():
            _settle(waiter, flight.future)
        else:
            loop.call_later(_POLL_INTERVAL, poll)

    flight.future.add_done_callback(relay)
    loop.call_later(_POLL_INTERVAL, poll)
    return await waiter


def wait_blocking(flight: Flight, timeout: float) -> AccessToken:
    """The outcome of ``flight``, waited for by blocking the calling thread.

    The fetch publishes an outcome within its own deadline; ``timeout`` is a second bound,
    so that no caller ever waits without end on a fetch that a bug left unpublished. A
    failure is raised as this caller's own copy, outside any ``except`` block: the shared
    error never takes a ``__context__`` from one of the threads that raised it.
    """
    try:
        error = flight.future.exception(timeout)
    except concurrent.futures.TimeoutError:
        error = TokenRequestError(
            f"no token within {timeout:g} s",
            retryable=True,
            hint="The token endpoint is too slow; check token_url and the network",
        )
    else:
        if error is None:
            return flight.future.result()
        error = own_copy(error)
    raise error


async def outcome(flight: Flight, fly: Fly) -> AccessToken:
    """The token ``flight`` lands, or its error, for a caller on an asyncio loop: waited
    for; a ``private`` flight (no thread could be had) is its one waiter's to carry out."""
    if flight.private:
        await fly(flight)
        return flight.future.result()
    return await wait_async(flight)


def outcome_blocking(flight: Flight, fly: Fly, timeout: float) -> AccessToken:
    """:func:`outcome` for a caller without an event loop, blocking it up to ``timeout``;
    a ``private`` flight is carried out on a loop of its own, unless this thread runs one."""
    if flight.private:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            run_on_own_loop(fly, flight)
            return flight.future.result()
        raise no_thread_here()  # nor a loop of its own, on a thread running one
    return wait_blocking(flight, timeout)


def no_thread_here() -> TokenRequestError:
    """The error of a blocking wait that must fetch itself, on a thread running a loop."""
    return TokenRequestError(
        "no thread could be started for the token fetch, and this thread runs an event loop",
        retryable=True,
        hint="Await get() on this loop, or call from a thread without a running loop",
    )


def fetch_failure(
    exc: BaseException,
    limit: float,
    token_url: str | None = None,
    route: Callable[[str], str | None] | None = None,
) -> BaseException:
    """The error a fetch that raised ``exc`` publishes: a ``TokenRequestError``, or ``exc``.

    ``token_url`` and ``route`` (the proxy a request to it goes through, named) say where
    a fetch that ran out of time went.
    """
    if isinstance(exc, asyncio.TimeoutError):
        proxy = route(token_url) if route is not None and token_url else None
        return TokenRequestError(
            f"no token from {token_url or 'the token endpoint'}{proxy_clause(proxy)} within "
            f"{limit:g} s (RetryPolicy.timeout, and a grace)",
            retryable=True,
            hint=token_unreachable_hint(proxy),
        )
    if isinstance(exc, asyncio.CancelledError):
        # Only a fetch that fell back to a caller's loop can be cancelled: by that loop
        # shutting down. Its other waiters may call again.
        return TokenRequestError(
            "the token fetch was cancelled", retryable=True, hint="Call again"
        )
    if not isinstance(exc, TokenRequestError) and isinstance(exc, Exception):
        error = TokenRequestError(
            f"the token fetch failed ({type(exc).__name__})",
            retryable=True,
            hint="This is a bug or an unexpected environment; call again",
        )
        error.__cause__ = exc
        return error
    return exc


def failure_event(
    reason: str,
    exc: BaseException,
    error: BaseException,
    *,
    duration: float,
    renewal: tuple[float, float, int] | None,
    max_attempts: int | None,
) -> AuthEvent:
    """The event of a fetch that raised ``exc`` and publishes ``error``.

    ``renewal`` is what a failed renewal of a usable token left (seconds left, seconds
    until the next try, failures in a row): the token in use stays in use, and no request
    failed. ``None``: requests waited for this fetch, and fail with it.
    """
    status = getattr(error, "status", None)
    name = getattr(error, "error", None) or type(exc).__name__
    if renewal is not None:
        left, wait, failures = renewal
        return AuthEvent(
            "token_renewal_failed",
            reason=reason,
            attempt=failures,
            wait=wait,
            duration=duration,
            expires_in=left,
            status=status,
            error=name,
        )
    # Only the fetcher's own error counted its requests; a cut-off fetch did not.
    attempts = exc.attempts if isinstance(exc, TokenRequestError) else None
    return AuthEvent(
        "token_request_failed",
        reason=reason,
        attempt=attempts,
        max_attempts=max_attempts if attempts is not None else None,
        duration=duration,
        status=status,
        error=name,
    )


def landed_events(
    reason: str, response: TokenResponse, loaded: bool, duration: float
) -> list[AuthEvent]:
    """The events of a fetch that landed a token, fetched or ``loaded`` from a shared
    store: one saying so, after one for an ``expires_in`` that is ignored (0 or less)."""
    landed = AuthEvent(
        "token_loaded" if loaded else "token_fetched",
        reason=reason,
        duration=duration,
        expires_in=response.expires_in,
    )
    if response.expires_in is not None and response.expires_in <= 0:
        return [AuthEvent("token_expires_in_ignored", expires_in=response.expires_in), landed]
    return [landed]
