"""Access tokens and the token manager: fetch, cache, single-flight, early renewal.

Nothing here knows gql or an HTTP library. The manager is given a :class:`TokenFetcher`
(any coroutine that returns a :class:`TokenResponse`), so another HTTP stack or a shared
token store can sit under it later without a change here.

Concurrency model. gql's sync ``Client.execute`` runs each call in the calling thread's
event loop, so one transport (and its cached token) is used from several loops and
threads. An ``asyncio.Lock`` belongs to one loop, so the state is guarded by a
``threading.Lock`` held only for a few attribute reads and writes (never across an
``await``), and an in-flight fetch is published as a ``concurrent.futures.Future`` that
a coroutine on any loop can await.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ._constants import BEARER_SCHEME
from ._errors import TokenRequestError
from ._events import AuthEvent, Emitter


class Clock(Protocol):
    """A monotonic clock in seconds, like :func:`time.monotonic`; injectable for tests."""

    def __call__(self) -> float: ...


@dataclass(frozen=True, slots=True, repr=False)
class TokenResponse:
    """A successful token endpoint answer (RFC 6749 section 5.1), already validated.

    Attributes:
        access_token: The token; never shown by ``repr``.
        expires_in: Lifetime in seconds from the server, or ``None`` when it sent none.
        token_type: The server's ``token_type``, or ``None``.
        scope: The granted scope, or ``None``.
    """

    access_token: str
    expires_in: float | None = None
    token_type: str | None = None
    scope: str | None = None

    def __repr__(self) -> str:
        return (
            f"TokenResponse(access_token='***', expires_in={self.expires_in!r}, "
            f"token_type={self.token_type!r}, scope={self.scope!r})"
        )


class TokenFetcher(Protocol):
    """Obtains a new token from an authorization server.

    Raises:
        TokenRequestError: no token could be had; the fetcher has done its own retries.
    """

    def __call__(self) -> Awaitable[TokenResponse]: ...


@dataclass(frozen=True, slots=True, repr=False)
class AccessToken:
    """A cached access token with the times, on the manager's clock, that rule its use.

    Attributes:
        value: The token itself; never shown by ``repr``.
        generation: 1 for the first token a manager obtained, 2 for the next, and so on.
        obtained_at: When the request that produced it was sent.
        renew_at: From then on, a new token is fetched before use.
        expires_at: When the server will stop accepting it, as far as we know.
    """

    value: str = field(compare=False)
    generation: int
    obtained_at: float
    renew_at: float
    expires_at: float

    @property
    def authorization(self) -> str:
        """The ``Authorization`` header value for this token (contract method 2)."""
        # Built per call: a cached copy would be one more place holding the token, for a
        # saving of a fraction of a microsecond.
        return f"{BEARER_SCHEME} {self.value}"

    def __repr__(self) -> str:
        return (
            f"AccessToken(generation={self.generation}, obtained_at={self.obtained_at:.3f}, "
            f"renew_at={self.renew_at:.3f}, expires_at={self.expires_at:.3f}, value='***')"
        )


class _FlightAborted(Exception):
    """The fetch a caller waited on was cancelled or abandoned; the caller starts another."""


@dataclass(eq=False, slots=True)
class _Flight:
    """One token fetch in progress, awaitable from any event loop."""

    future: concurrent.futures.Future[AccessToken]
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic() after which waiters on other loops give up on it
    reason: str


# A caller joins at most this many fetches before giving up: each fetch that aborts under
# it (its loop shut down, say) is replaced by one on the caller's own loop, so a second
# abort means the caller's own loop is going away.
_MAX_FLIGHTS_PER_CALL = 3


class TokenManager:
    """Hands out a valid access token, fetching one only when needed, once for all callers.

    Args:
        fetch: Obtains a new token; called at most once at a time, whatever the number of
            callers, loops or threads.
        refresh_margin: Seconds before expiry at which a token is renewed; capped at half
            the token's lifetime, so a 10 s token is still used for 5 s.
        default_expires_in: Seconds a token is trusted when the server gives no
            ``expires_in``.
        fetch_timeout: Seconds a fetch may take, retries included; a caller on another
            event loop stops waiting on a fetch after that and starts its own.
        clock: Monotonic clock in seconds.
        emit: Receives the life-cycle events.
    """

    def __init__(
        self,
        fetch: TokenFetcher,
        *,
        refresh_margin: float,
        default_expires_in: float,
        fetch_timeout: float,
        clock: Clock = time.monotonic,
        emit: Callable[[AuthEvent], None] | None = None,
    ) -> None:
        self._fetch = fetch
        self._refresh_margin = refresh_margin
        self._default_expires_in = default_expires_in
        self._fetch_timeout = fetch_timeout
        self._clock = clock
        self._emit = emit or Emitter(None)
        self._lock = threading.Lock()
        self._token: AccessToken | None = None
        self._flight: _Flight | None = None
        self._generation = 0
        self._rejected = False
        # Strong references to running fetch tasks: the event loop keeps only weak ones.
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<TokenManager generation={self._generation}>"

    @property
    def token(self) -> AccessToken | None:
        """The cached token, fresh or not; ``None`` before the first fetch."""
        return self._token

    def is_fresh(self, token: AccessToken, *, min_ttl: float = 0.0) -> bool:
        """Whether ``token`` may be used now without renewing it first.

        Args:
            token: A token from this manager.
            min_ttl: Seconds of validity the caller needs beyond now (an upload that
                cannot be re-sent asks for more).
        """
        now = self._clock()
        return now < token.renew_at and token.expires_at - now >= min_ttl

    def fresh(self, *, min_ttl: float = 0.0) -> AccessToken | None:
        """The cached token if it may be used now, else ``None``; never waits.

        The per-request fast path: it reads one attribute without the lock, since
        assignment is atomic and a token that turns stale a moment later is caught by the
        reactive renewal.
        """
        token = self._token
        if token is not None and self.is_fresh(token, min_ttl=min_ttl):
            return token
        return None

    async def get(self, *, min_ttl: float = 0.0) -> AccessToken:
        """A token to use now: the cached one while fresh, else a new one.

        Concurrent callers on an empty or stale cache share one fetch. A caller that is
        cancelled does not cancel the fetch for the others.

        Args:
            min_ttl: Seconds of validity needed beyond now; a fetched token is returned
                even if its lifetime is shorter, since asking again would not help.

        Raises:
            TokenRequestError: the fetch failed. The next call starts a new fetch.
        """
        token = self.fresh(min_ttl=min_ttl)
        if token is not None:
            return token
        for _ in range(_MAX_FLIGHTS_PER_CALL):
            with self._lock:
                token = self._token
                if token is not None and self.is_fresh(token, min_ttl=min_ttl):
                    return token
                flight = self._flight or self._take_off(token)
            try:
                return await self._wait(flight)
            except _FlightAborted:
                continue
        raise TokenRequestError(
            "the token fetch was interrupted repeatedly",
            retryable=True,
            hint="The event loop running it was shutting down; call again",
        )

    def invalidate(self, token: AccessToken) -> bool:
        """Drop ``token`` because the API refused it, unless a newer one already replaced it.

        Many requests that fail with the same token cause one renewal: the first call
        drops it, the others find it already gone and renew nothing.

        Returns:
            Whether ``token`` was the cached token.
        """
        with self._lock:
            if self._token is not token:
                return False
            self._token = None
            self._rejected = True
        self._emit(AuthEvent("token_rejected"))
        return True

    def _take_off(self, stale: AccessToken | None) -> _Flight:
        # Called with the lock held.
        if self._rejected:
            reason = "rejected"
        elif stale is None and self._generation == 0:
            reason = "initial"
        else:
            reason = "expiring"
        loop = asyncio.get_running_loop()
        future: concurrent.futures.Future[AccessToken] = concurrent.futures.Future()
        # A running future cannot be cancelled, so a cancelled waiter cannot cancel it
        # through asyncio.wrap_future's cancellation chaining.
        future.set_running_or_notify_cancel()
        flight = _Flight(future, loop, time.monotonic() + self._fetch_timeout, reason)
        self._flight = flight
        task = loop.create_task(self._run(flight))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return flight

    async def _wait(self, flight: _Flight) -> AccessToken:
        waiter = asyncio.shield(asyncio.wrap_future(flight.future))
        if asyncio.get_running_loop() is flight.loop:
            # The fetch runs on this loop and is bounded by its own timeout.
            return await waiter
        # The fetch runs on another loop, which may stop running (a sync Client.execute
        # that was interrupted) and leave it pending forever: wait only as long as a fetch
        # may take, then take over.
        try:
            return await asyncio.wait_for(waiter, max(flight.deadline - time.monotonic(), 0))
        except asyncio.TimeoutError:
            with self._lock:
                if self._flight is flight:
                    self._flight = None
            raise _FlightAborted from None

    async def _run(self, flight: _Flight) -> None:
        started = self._clock()
        began = time.monotonic()
        try:
            response = await self._fetch()
        except asyncio.CancelledError:
            self._land(flight, None, _FlightAborted())
            raise
        except Exception as exc:
            self._land(flight, None, exc)
            self._emit(
                AuthEvent(
                    "token_request_failed",
                    reason=flight.reason,
                    duration=time.monotonic() - began,
                    status=getattr(exc, "status", None),
                    error=getattr(exc, "error", None) or type(exc).__name__,
                )
            )
            return
        token = self._land(flight, response, None, started=started)
        assert token is not None
        self._emit(
            AuthEvent(
                "token_fetched",
                reason=flight.reason,
                duration=time.monotonic() - began,
                expires_in=response.expires_in,
            )
        )

    def _land(
        self,
        flight: _Flight,
        response: TokenResponse | None,
        error: BaseException | None,
        *,
        started: float = 0.0,
    ) -> AccessToken | None:
        """Publish a fetch's outcome; clear the flight first so no stale error is re-raised."""
        token = None
        with self._lock:
            current = self._flight is flight
            if current:
                self._flight = None
            if response is not None:
                self._generation += 1
                token = self._new_token(response, started, self._generation)
                # A fetch abandoned by its waiters must not replace what a newer one brought.
                if current:
                    self._token = token
                    self._rejected = False
        if token is not None:
            flight.future.set_result(token)
        else:
            flight.future.set_exception(error or _FlightAborted())
        return token

    def _new_token(self, response: TokenResponse, started: float, generation: int) -> AccessToken:
        lifetime = response.expires_in
        if lifetime is None:
            lifetime = self._default_expires_in
        lifetime = max(lifetime, 0.0)
        # Renew ahead of expiry so no request is sent with a token about to lapse, but
        # never more than half-way through the lifetime, so short tokens are still reused.
        margin = min(self._refresh_margin, lifetime / 2)
        # Times count from when the request was sent, not when the answer came: the server
        # started the lifetime somewhere in between, so this errs on the early side.
        return AccessToken(
            value=response.access_token,
            generation=generation,
            obtained_at=started,
            renew_at=started + lifetime - margin,
            expires_at=started + lifetime,
        )
