"""Access tokens and the token manager: fetch, cache, single-flight, refresh ahead.

Nothing here knows gql or an HTTP library. The manager is given a :class:`TokenFetcher`
(any coroutine that returns a :class:`TokenResponse`), so another HTTP stack or a shared
token store can sit under it later without a change here.

Concurrency model. gql's sync ``Client.execute`` runs each call on a loop of the calling
thread and abandons that loop when ``execute_timeout`` strikes, so a fetch run on a
caller's loop can be left pending forever, and a forked child inherits fetches whose
thread it does not have. So no fetch runs on a caller's loop: each runs in a short-lived
daemon thread with an event loop of its own, bounded in time, and is
published as a ``concurrent.futures.Future`` that a coroutine on any loop can await.
Callers only wait; a caller that is cancelled or times out leaves the fetch to finish
for the others. The state is guarded by a ``threading.Lock`` held only for a few
attribute reads and writes, never across an ``await``.

Renewal never makes a request wait while a usable token exists. From ``renew_at`` on,
the first request that notices starts one fetch in the background and goes on with the
current token, as do all requests until the new token lands. Being on a thread of its
own, the fetch outlives the per-call loop of gql's sync ``Client.execute`` that started
it. A failed renewal leaves the current token in use and is tried again after a backoff,
until the token reaches ``usable_until``: only then does a request wait for a fetch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator, Hashable, Mapping
from typing import Any, Literal, SupportsIndex, TypeVar

from .._stores.level import ENDPOINT, TokenSource
from . import fork as _fork
from .constants import FETCH_GRACE, RENEWAL_RETRY_MIN
from .errors import TokenRequestError
from .events import AuthEvent, Emitter, Subscribers
from .flight import (
    Flight,
    failure_event,
    fetch_failure,
    landed_events,
    launch,
    outcome,
    outcome_blocking,
)
from .ledger import NotNow, Pause, Refusals, RenewalFailures, RenewalPaused, RenewalSpent
from .plan import (
    Fail,
    Join,
    State,
    Use,
    plan_after_failure,
    plan_get,
    plan_renewal,
    renews_landed,
)
from .provenance import Origin
from .redact import clear_locals
from .telemetry import Reading, fetch_span, hold
from .token import AccessToken, Clock, TokenFetcher, TokenResponse, access_token, waits_on

_Slept = TypeVar("_Slept")

_Steps = Generator[Flight, AccessToken, AccessToken | NotNow]

# fmt: off
_SETTINGS = ("_fetch", "_source", "_refresh_margin", "_default_expires_in", "_fetch_timeout",
             "_cooldown", "_max_attempts", "_renewal_backoff", "_clock", "_emit", "_server",
             "_token_url", "_route", "_labels")
# fmt: on
"""What a copy of a manager keeps (all that ``__init__`` was given): no token, no state."""

_MAX_STEPS = 4
"""Fetches one call may wait for: its own, an upload's renewal of it, and both again when a
token read from a shared store turns out older than the refusal it was to answer."""


class TokenManager:
    """Hands out a valid access token, fetching one only when needed, once for all callers.

    One manager may serve many transports of a process (see ``_core/sharing.py``): given a
    :class:`~.events.Subscribers` as ``emit``, it passes its events to each.

    Args:
        fetch: Obtains a new token; called at most once at a time, whatever the number of
            callers, loops or threads. It runs on a thread and event loop of its own.
        refresh_margin: Seconds before expiry at which a token is renewed in the
            background; capped at half the token's lifetime, so a 10 s token is renewed
            after 5 s.
        default_expires_in: Seconds a token is trusted when the server gives no usable
            ``expires_in`` (none, unreadable, or 0 and less).
        fetch_timeout: Seconds after which a fetch is cut off, whatever ``fetch`` does.
        cooldown: Seconds renewals pause after the n-th consecutive refusal of a token
            that no answer had accepted; ``None`` never pauses.
        max_attempts: The most requests ``fetch`` makes for one token, shown in
            ``token_request_failed`` events; ``None`` when unknown.
        renewal_backoff: Seconds to wait after the n-th consecutive failed background
            renewal before the next; whatever it says, the next comes no sooner than
            ``RENEWAL_RETRY_MIN`` and before the token stops being usable.
        clock: Monotonic clock in seconds, for token lifetimes.
        emit: Receives the life-cycle events; called on the fetch's thread for fetch
            events.
        source: Where tokens come from, given ``fetch``: the token endpoint (the default),
            or a store shared with other processes in front of it (see ``_stores/level.py``).
        server: Host and port of the token endpoint, for the fetch's span.
    """

    #: Set on a manager the transports of a process share: how a copy rejoins the one of
    #: the process it lands in (a function and its key, see ``_core/sharing.py``).
    shared_as: tuple[Callable[..., TokenManager], Hashable] | None = None

    def __init__(
        self,
        fetch: TokenFetcher,
        *,
        refresh_margin: float,
        default_expires_in: float,
        fetch_timeout: float,
        cooldown: Callable[[int], float] | None = None,
        max_attempts: int | None = None,
        renewal_backoff: Callable[[int], float] | None = None,
        clock: Clock = time.monotonic,
        emit: Callable[[AuthEvent], None] | None = None,
        source: TokenSource = ENDPOINT,
        server: tuple[str, int | None] | None = None,
        token_url: str | None = None,
        route: Callable[[str], str | None] | None = None,
        labels: Callable[[], Mapping[str, str | int]] | None = None,
    ) -> None:
        self._fetch = fetch
        #: The attributes of its token.remaining_life points, read at each collection
        #: (credentials that change, change them); ``None``: not in the gauge.
        self._labels = labels
        self._server = server
        #: Where a fetch that fails for want of an answer says it went (see _core/diagnosis.py).
        self._token_url = token_url
        self._route = route
        self._source = source
        self._renewal_backoff = renewal_backoff
        self._refresh_margin = refresh_margin
        self._default_expires_in = default_expires_in
        self._fetch_timeout = fetch_timeout
        self._cooldown = cooldown
        self._max_attempts = max_attempts
        self._clock = clock
        self._emit = emit or Emitter(None)
        self._reset()
        _fork.reset_in_child(self)
        self._serve()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._token: AccessToken | None = None
        self._flight: Flight | None = None
        self._generation = 0
        #: A renewal is due once the fetch in flight lands: it may be of credentials that
        #: changed while it flew (see :meth:`renew_soon`).
        self._again = False
        #: What refusals say: drops, pauses, the renewal after a running refusal.
        self._refusals = Refusals(
            cooldown=self._cooldown, weighs_provenance=self._source.shared, clock=self._clock
        )
        #: Background renewals that failed in a row, and when (manager's clock) the next
        #: may start; read without the lock on the per-request path, past renew_at only.
        self._renewals = RenewalFailures(self._renewal_backoff)

    def __repr__(self) -> str:
        return f"<TokenManager generation={self._generation}>"

    # Copied (pickle, deepcopy) with its settings, no token, flight or lock: it starts cold.
    def __getstate__(self) -> dict[str, Any]:
        return {name: self.__dict__[name] for name in _SETTINGS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
        _fork.reset_in_child(self)
        self._serve()

    def _serve(self) -> None:
        if self._labels is not None:
            hold(self)
        # A source of credentials that can change asks the manager to renew when they do.
        serve = getattr(self._source, "serve", None)
        if serve is not None:
            serve(self)

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        if self.shared_as is None:
            return super().__reduce_ex__(protocol)
        rejoin, key = self.shared_as
        return rejoin, (key, self.__getstate__())

    def subscribe(self, emitter: Emitter) -> None:
        """Pass the events of this manager to ``emitter``'s hook too, while it lives."""
        if isinstance(self._emit, Subscribers):
            self._emit.add(emitter)

    def remaining_life(self) -> Reading | None:
        """The seconds the token in hand has left, with the gauge's attributes; ``None``
        with no token, one past its expiry (a manager at rest, whose token nobody renews),
        or outside the gauge."""
        token, labels = self._token, self._labels
        if token is None or labels is None:
            return None
        left = token.expires_at - self._clock()
        return (left, labels()) if left > 0 else None

    def spent(self) -> bool:
        """Whether the manager has had a token (or resumed a pause), has none usable now,
        and fetches none."""
        token = self._token
        return (
            (self._generation > 0 or self._refusals.renewing_after_refusal)
            and self._flight is None
            and (token is None or self._clock() >= token.usable_until)
        )

    def pause_reader(self) -> Callable[[], Pause | None]:
        """Reads what refusals taught this manager, for the next one of its credentials
        (see ``_core/sharing.py``): it holds the ledger, not the manager, so it reads it once
        the manager is gone."""
        return self._refusals.pause

    def resume(self, pause: Pause) -> None:
        """Go on from what :meth:`pause_reader` read of an earlier manager of the same
        credentials."""
        with self._lock:
            self._refusals.resume(pause)

    def _after_fork_in_child(self) -> None:
        # The fetch's thread, and any thread that held the lock, are not in the child. A
        # token is a value and stays usable; the next caller fetches if it must.
        self._lock = threading.Lock()
        self._flight = None

    @property
    def token(self) -> AccessToken | None:
        """The cached token, fresh or not; ``None`` before the first fetch."""
        return self._token

    @property
    def generation(self) -> int:
        """The generation of the newest token obtained; 0 before the first."""
        return self._generation

    def fresh(self, min_ttl: float = 0.0) -> AccessToken | None:
        """The cached token if it may be sent now, else ``None``; never waits.

        Past the token's ``renew_at``, the token is still returned while usable, and a
        renewal is started in the background unless one runs or a failed one is backing
        off.

        The per-request fast path: it reads one attribute without the lock, since
        assignment is atomic and a token that turns stale a moment later is caught by the
        reactive renewal.

        Args:
            min_ttl: Seconds of validity the caller needs beyond now (an upload that
                cannot be re-sent asks for more).
        """
        token = self._token
        if token is None:
            return None
        now = self._clock()
        if now < token.renew_at:
            # Before renew_at a token has more than min_ttl left unless it is an upload's.
            if not min_ttl or token.expires_at - now >= min_ttl:
                return token
        elif now < token.usable_until:
            if self._flight is None and now >= self._renewals.next_at:
                self._renew_ahead(token, now)
            if not min_ttl or token.expires_at - now >= min_ttl:
                return token
        return None

    def _renew_ahead(self, token: AccessToken, now: float) -> None:
        """Start a background renewal of ``token``, unless one runs or backs off."""
        with self._lock:
            if self._token is not token or self._flight is not None:
                return
            if now >= self._renewals.next_at and self._take_off(token, background=True) is None:
                # No thread to be had: not tried again by every request meanwhile.
                self._renewals.next_at = now + RENEWAL_RETRY_MIN

    def renew_soon(self) -> None:
        """Renew now in the background: the credentials changed (see ``_core/rotation.py``).

        The token in hand stays in use until the new one lands, as for a renewal ahead of
        expiry: the old credentials stay valid until they are deleted. A fetch in flight
        may carry the old ones, so the renewal follows it.
        """
        with self._lock:
            if self._flight is not None:
                self._again = True
            elif self._token is not None:
                self._take_off(self._token, background=True)

    def waits(self, sleep: Callable[[float], _Slept]) -> Callable[[float], _Slept]:
        """``sleep`` as waits on this manager's clock take it (see :func:`waits_on`)."""
        return waits_on(self._clock, sleep)

    def pause_remaining(self) -> float:
        """Seconds until renewals resume after refused fresh tokens; 0 when not paused."""
        return self._refusals.pause_remaining()

    async def get(self, *, min_ttl: float = 0.0, after: int = 0) -> AccessToken | NotNow:
        """A token to use now: the cached one while usable, else a new one; or why not now.

        Concurrent callers with no usable token share one fetch, whatever their loop or
        thread, and join a background renewal already under way. A caller that is
        cancelled does not cancel the fetch.

        Args:
            min_ttl: Seconds of validity wished for beyond now; a fetched token is
                returned even if its lifetime is shorter, since asking again would not
                help. When renewals fail (the renewal waited for, or one lately, which
                is backing off), the usable token in hand is returned instead of an error.
            after: The generation of a token the API refused: only a newer token will
                do, and the renewal after it is shared with every request it refused.

        Returns:
            The token; or :class:`RenewalSpent`: the renewal after ``after`` was refused
            too; or :class:`RenewalPaused`: fresh tokens keep being refused, and no fetch
            is started now (never with ``after=0``, ``min_ttl=0`` and no refusal yet).

        Raises:
            TokenRequestError: the fetch failed, and no usable token is left. The next
                call starts a new fetch.
        """
        steps = self._steps(min_ttl, after)
        try:
            flight = next(steps)
            for _ in range(_MAX_STEPS):
                try:
                    token = await outcome(flight, self._fly)
                except TokenRequestError as error:
                    flight = steps.throw(error)
                else:
                    flight = steps.send(token)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            steps.close()
        raise AssertionError("unreachable: a call waits for at most four fetches")

    def get_blocking(self, *, min_ttl: float = 0.0, after: int = 0) -> AccessToken | NotNow:
        """:meth:`get` for code without an event loop: blocks the calling thread.

        The same rules, the same single fetch shared with every caller (coroutines and
        threads alike); each wait is bounded by the fetch's own deadline.
        """
        steps = self._steps(min_ttl, after)
        try:
            flight = next(steps)
            for _ in range(_MAX_STEPS):
                try:
                    token = outcome_blocking(flight, self._fly, self._fetch_timeout + FETCH_GRACE)
                except TokenRequestError as error:
                    flight = steps.throw(error)
                else:
                    flight = steps.send(token)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            steps.close()
        raise AssertionError("unreachable: a call waits for at most four fetches")

    def _steps(self, min_ttl: float, after: int) -> _Steps:
        """What :meth:`get` decides, as steps: each fetch yielded is waited for by the
        caller's driver, which sends back its token or throws in its error."""
        token = yield from self._get_steps(min_ttl, after)
        if isinstance(token, AccessToken) and after and self.standing(token) == "older":
            # Read from a shared store by a renewal that began before the refusal: the
            # revocation behind the refusal may have covered it too. Renewed once more,
            # now with the refusal known, and shared by every request it refused.
            with self._lock:
                if self._token is token:
                    self._token = None
                    self._refusals.renewing_after_refusal = True
            token = yield from self._get_steps(min_ttl, token.generation)
        return token

    def _state(self) -> State:
        """What :mod:`.plan` decides on; read with the lock held."""
        return State(
            self._token,
            self._flight is not None,
            self._generation,
            self._clock(),
            self._renewals.next_at,
            self._refusals,
        )

    def _get_steps(self, min_ttl: float, after: int) -> _Steps:
        token = self.fresh(min_ttl)
        if token is not None and token.generation > after:
            return token
        with self._lock:
            plan = plan_get(self._state(), min_ttl=min_ttl, after=after)
            if isinstance(plan, Use):
                return plan.token
            if isinstance(plan, RenewalSpent | RenewalPaused):
                return plan
            flight = self._flight if isinstance(plan, Join) else self._take_off(self._token)
            assert flight is not None  # a foreground flight always takes off
        try:
            token = yield flight
        except TokenRequestError:
            with self._lock:
                after_failure = plan_after_failure(self._state(), min_ttl=min_ttl, after=after)
            if isinstance(after_failure, Fail):
                raise
            # Outside the except block: the fetch's error is no context of a success.
            return after_failure.token
        if renews_landed(token, min_ttl=min_ttl, now=self._clock()):
            return (yield from self._renewed_steps(token, min_ttl, after))
        return token

    def _renewed_steps(self, token: AccessToken, min_ttl: float, after: int) -> _Steps:
        with self._lock:
            plan = plan_renewal(self._state(), token, after=after)
            if isinstance(plan, Use):
                return plan.token
            flight = self._flight if isinstance(plan, Join) else self._take_off(token)
            assert flight is not None
        try:
            return (yield flight)
        except TokenRequestError:
            with self._lock:
                # Only a caller wishing for more lifetime waits for this renewal.
                after_failure = plan_after_failure(self._state(), min_ttl=min_ttl, after=after)
            if isinstance(after_failure, Fail):
                raise
        return after_failure.token

    @property
    def refusal_answer(self) -> object:
        """What the adapter kept of the last refusal that dropped a token, or ``None``."""
        return self._refusals.answer

    def confirm(self, token: AccessToken) -> None:
        """Record that an answer accepted ``token``: refusals of fresh tokens stop counting.

        Called on every accepted answer: the check before the lock costs a request next
        to nothing, and a stale read of ``confirmed`` costs one locked call more.
        """
        if token.generation <= self._refusals.confirmed:
            return
        with self._lock:
            self._refusals.confirm(token.generation)

    def refused_while_running(self, token: AccessToken) -> bool:
        """Drop ``token``, refused by a resolver while an operation ran, if renewing may help.

        The API accepted the token to start the operation, so this is no refused fresh
        token and never pauses renewals. A token that expired as the operation ran is worth
        renewing once; but when the token that renewal brought is refused the same way
        before any answer accepted it, the refusal is about the operation, not the token:
        it is kept for the requests it serves, and not renewed for such refusals until an
        answer has accepted it (then it may have expired in its turn) or it is replaced.

        Returns:
            Whether a renewal may help (``token`` was dropped, unless a newer one already
            replaced it).
        """
        with self._lock:
            may_help, dropped = self._refusals.refused_while_running(token, current=self._token)
            if dropped:
                self._token = None
        if dropped:
            self._emit(AuthEvent("token_rejected"))
        return may_help

    def invalidate(self, token: AccessToken, *, answer: object = None) -> bool:
        """Drop ``token`` because the API refused it, unless a newer one already replaced it.

        Many requests that fail with the same token cause one renewal: the first call
        drops it, the others find it already gone and renew nothing. A refused token that
        no answer had accepted counts towards the pause of renewals, unless it had expired
        by then (it waited in a queue longer than it lived).

        Args:
            token: The token refused.
            answer: What the adapter keeps of the refusal, to end calls made while
                renewals are paused as this one ended (see :attr:`refusal_answer`).

        Returns:
            Whether ``token`` was the cached token.
        """
        expired = self.expired(token)
        with self._lock:
            dropped = self._refusals.refused(
                token, current=self._token, answer=answer, expired=expired
            )
            if dropped:
                self._token = None
        if dropped:
            self._emit(AuthEvent("token_rejected"))
        return dropped

    def waited_for(self) -> tuple[str, str | None] | None:
        """Where a call that timed out was waiting for its token: the token URL and the
        proxy on the way, when no usable token is in hand and a fetch is under way;
        ``None`` otherwise (the call waited for the API)."""
        if self._flight is None or self.fresh(0.0) is not None or self._token_url is None:
            return None
        return self._token_url, self._route(self._token_url) if self._route else None

    def expired(self, token: AccessToken) -> bool:
        """Whether ``token`` is past the last moment it is sent: a refusal of it says
        nothing of the credentials, only that the request waited too long on its way."""
        return self._clock() >= token.usable_until

    def standing(self, token: AccessToken) -> Literal["newer", "replacement", "older"]:
        """How ``token`` stands to the latest refusal (see :meth:`Refusals.standing`)."""
        return self._refusals.standing(token)

    def loaded(self, token: AccessToken) -> bool:
        """Whether ``token`` was read from a shared store rather than fetched here."""
        return self._refusals.loaded(token)

    def _take_off(self, stale: AccessToken | None, *, background: bool = False) -> Flight | None:
        # Called with the lock held. None: a background renewal found no thread to run on;
        # a request fetches in the foreground once the token is no longer usable.
        if self._refusals.renewing_after_refusal:
            reason = "rejected"
        elif stale is None and self._generation == 0:
            reason = "initial"
        elif background or (stale is not None and self._clock() < stale.usable_until):
            reason = "expiring"  # ahead of time: an upload's, if not in the background
        else:
            reason = "expired"  # requests wait for it
        flight = launch(reason, self._fly, background=background)
        if flight is not None and not flight.private:
            self._flight = flight
        return flight

    async def _fly(self, flight: Flight) -> None:
        """Fetch once, bounded in time, and publish the outcome whatever happens."""
        try:
            with fetch_span(flight.reason, flight.trace_parent, self._server):
                await self._fly_traced(flight)
        finally:
            if not flight.future.done():  # the fetch never ran: its waiters must hear
                self._land(flight, None, None)

    async def _fly_traced(self, flight: Flight) -> None:
        began = time.monotonic()
        origin: Origin | None = None  # set for a token read from a shared store
        # One deadline, shared store or not: waiting on another process's fetch is fetching.
        limit = self._fetch_timeout
        try:
            started = self._clock()
            refused = self._refusals.refused_token
            # A renewal ahead of expiry: a stored token due for renewal will not do.
            renewing = self._token if flight.reason == "expiring" else None
            response, origin = await asyncio.wait_for(
                self._source.obtain(
                    self._fetch,
                    refused=refused.value if refused is not None else None,
                    refusal=self._refusals.latest,
                    replacing=self._refusals.latest if flight.reason == "rejected" else None,
                    renewing=renewing.value if renewing is not None else None,
                ),
                limit,
            )
            del refused, renewing
        except BaseException as exc:
            # The fetch's frames are done: their locals (the grant's form, aiohttp's
            # headers) go, since crash reporters read the locals of tracebacks.
            clear_locals(exc)
            error = fetch_failure(exc, limit, self._token_url, self._route)
            # Events go out before the outcome is published, so a caller that has its
            # token or its error can count on the hook having seen the fetch.
            try:
                renewal = self._renewal_failed(flight)
                # A fetch the budget kept from going (see _core/budget.py) was told once,
                # there: a wave of callers meeting it a thousand times logs nothing more.
                if not (isinstance(error, TokenRequestError) and error._not_sent):
                    self._emit(
                        failure_event(
                            flight.reason,
                            exc,
                            error,
                            duration=time.monotonic() - began,
                            renewal=renewal,
                            max_attempts=self._max_attempts,
                        )
                    )
            finally:
                self._land(flight, None, error)
            if not isinstance(exc, Exception):
                raise
            return
        try:
            duration = time.monotonic() - began
            for event in landed_events(flight.reason, response, origin is not None, duration):
                self._emit(event)
        finally:
            requested = origin.requested_at if origin is not None else began
            self._land(flight, response, None, started=started, requested=requested, origin=origin)

    def _renewal_failed(self, flight: Flight) -> tuple[float, float, int] | None:
        """Back off after a failed renewal of a token that is still usable (see
        :meth:`RenewalFailures.failed`): in the background, or one an upload waited for,
        the token in use stays in use, and the next renewal waits out the backoff."""
        if flight.reason != "expiring":
            return None
        with self._lock:
            return self._renewals.failed(self._token, self._clock())

    def _land(
        self,
        flight: Flight,
        response: TokenResponse | None,
        error: BaseException | None,
        *,
        started: float = 0.0,
        requested: float = 0.0,
        origin: Origin | None = None,
    ) -> None:
        """Publish a fetch's outcome; clear the flight first so no stale error is re-raised."""
        token = None
        with self._lock:
            current = self._flight is flight
            if current:
                self._flight = None
            if response is not None:
                self._generation += 1
                token = self._new_token(response, started, self._generation)
                in_hand = current or flight.private
                self._refusals.landed(token, requested=requested, origin=origin, in_hand=in_hand)
                if in_hand:
                    self._token = token
                    self._renewals.succeeded()
            self._refusals.fetch_ended()
            if self._again and current and self._token is not None:
                self._again = False
                self._take_off(self._token, background=True)
        if token is not None:
            flight.future.set_result(token)
        else:
            flight.future.set_exception(error or TokenRequestError("the token fetch failed"))

    def _new_token(self, response: TokenResponse, started: float, generation: int) -> AccessToken:
        return access_token(
            response,
            started=started,
            generation=generation,
            refresh_margin=self._refresh_margin,
            default_expires_in=self._default_expires_in,
        )
