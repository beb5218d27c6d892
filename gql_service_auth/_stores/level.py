"""Where a token manager's tokens come from: the token endpoint, or a store in front of it.

The manager asks a :class:`TokenSource` for each token it needs, the same way whether a
shared store (:mod:`gql_service_auth._stores.protocol`) is in use or not: :data:`ENDPOINT`
asks the token endpoint, and :class:`SharedLevel` consults the store first.

The two levels. Each process keeps its token in memory, and the per-request path reads
only that. The store is consulted when the manager would otherwise ask the token
endpoint: no token yet, a token due for renewal, or a refused one. Then
:class:`SharedLevel`:

1. drops a refused token from the store, if it is still the stored one, so that the
   first process refused renews it and the others read the renewal;
2. reads the store, and takes a stored token that will do: any usable one for a process
   with none; one not due for renewal itself for a renewal ahead of expiry; after a
   refusal, only one requested after the refusal (a revocation covers every token
   issued before it, a peer's newer one too);
3. else takes the store's lock, reads once more, fetches from the token endpoint and
   writes the token (the store keeps the newer of two writes), then releases the lock;
   the lock lives a couple of seconds and its holder extends it while it fetches, so
   a holder that dies costs the others little;
4. while another process holds the lock, polls the store with jitter until its token
   lands, or its holder gives up the lock: having failed (its waiters then fail with its
   error rather than each asking again in turn), or having died (one waiter takes over).

All of it is bounded by the fetch's own deadline, store or not. A store that fails or
is slow never fails a request: each call is bounded by the store's ``timeout`` (and, for
a store that has one, its ``connect_timeout`` to be ready first), and on any failure the
process fetches the token itself, and every transport on that store leaves it alone for
its ``cooldown``, after one ``token_store_failed`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .._core.budget import (
    LEDGERS,
    GuardedFetch,
    refusal_from,
    refusal_text,
    refuses_credentials,
    remembered,
    spent,
)
from .._core.constants import (
    MAX_SERVER_TEXT,
    STORE_LOCK_TTL,
    STORE_POLL_MAX,
    STORE_POLL_MIN,
)
from .._core.errors import TokenRequestError
from .._core.events import AuthEvent
from .._core.provenance import Origin, Refusal
from .._core.redact import redact_text
from .._core.token import TokenFetcher, TokenResponse, expiry_guard, renewal_margin
from .health import HEALTHS
from .protocol import StoredToken, StoreFault, StoreTimeout, TokenIdentity, TokenStore

_T = TypeVar("_T")

_GUARD_MARGIN = 1.0
"""Seconds the guard on a self-bounded store call allows past the store's own bounds."""


def _loaded(stored: StoredToken) -> TokenResponse:
    return TokenResponse(stored.access_token, stored.expires_in, lifetime=stored.lifetime)


class StoreUnavailable(Exception):
    """A store call failed or timed out (internal: the caller fetches for itself).

    Attributes:
        error: The exception's class name.
        detail: What failed, in words, with no secret.
    """

    def __init__(self, error: str, detail: str) -> None:
        super().__init__(error)
        self.error = error
        self.detail = detail


def _describe(error: TokenRequestError) -> str:
    """``error`` as a failure text for :meth:`TokenStore.unlock`: our own words only."""
    return json.dumps(
        {
            "reason": error.reason,
            "status": error.status,
            "error": error.error,
            "retryable": error.retryable,
            "retry_after": error.retry_after,
            "hint": error.hint,
            "attempts": error.attempts,
        }
    )


def _failure_error(text: str) -> TokenRequestError:
    """The error of the process whose fetch this process waited on, from its text."""
    try:
        fields = json.loads(text)
        status, code = fields.get("status"), fields.get("error")
        error = TokenRequestError(
            f"{fields['reason']} (in another process sharing the token store, whose token "
            "request this process waited on)",
            status=status if isinstance(status, int) else None,
            error=code if isinstance(code, str) else None,
            retryable=fields.get("retryable") is True,
            retry_after=fields.get("retry_after"),
            hint=fields.get("hint"),
        )
        error.attempts = int(fields.get("attempts") or 1)
    except (ValueError, TypeError, KeyError, AttributeError):
        error = TokenRequestError(
            "the token request of another process sharing the token store failed",
            retryable=True,
        )
    return error


def _pair(value: object, first: type) -> tuple[Any, float] | None:
    """``(value, seconds)`` as a store's optional budget calls answer, or ``None`` for
    anything else: a store of another shape counts for nothing, and fails no fetch."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        return None
    head, seconds = value
    if not isinstance(head, first) or isinstance(head, bool):
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        return None
    return head, min(float(seconds), 366 * 24 * 3600.0)


class TokenSource(Protocol):
    """Where a token manager's tokens come from, given the token endpoint's ``fetch``: the
    endpoint itself (:data:`ENDPOINT`), or a shared store in front of it
    (:class:`SharedLevel`). The manager asks it the same way in both cases."""

    #: Whether its tokens may come from other processes: a refusal is then weighed against
    #: where each token came from (see :mod:`gql_service_auth._core.provenance`).
    shared: bool

    async def obtain(
        self,
        fetch: TokenFetcher,
        *,
        refused: str | None = None,
        refusal: Refusal | None = None,
        replacing: Refusal | None = None,
        renewing: str | None = None,
    ) -> tuple[TokenResponse, Origin | None]:
        """A token, and where it came from when not from ``fetch`` (see
        :meth:`SharedLevel.obtain` for the arguments)."""
        ...


class _Endpoint:
    """No shared store: every token comes from the token endpoint, whatever it is for."""

    shared = False

    async def obtain(
        self,
        fetch: TokenFetcher,
        *,
        refused: str | None = None,
        refusal: Refusal | None = None,
        replacing: Refusal | None = None,
        renewing: str | None = None,
    ) -> tuple[TokenResponse, Origin | None]:
        return await fetch(), None

    def __repr__(self) -> str:
        return "<token endpoint>"


ENDPOINT: TokenSource = _Endpoint()
"""The token source of a manager without a shared store."""


@dataclass(slots=True)
class _LockCall:
    """Whether a lock call went out with this fetch's owner value: then it is released,
    whatever happened (a call that timed out may have taken the lock)."""

    sent: bool = False


class SharedLevel:
    """The store's side of a token fetch: read, or lock, fetch and write (module docstring).

    Args:
        store: The shared store.
        identity: Whose token this process needs.
        refresh_margin: As the token manager's: a stored token with no more than
            ``min(refresh_margin, lifetime / 2)`` left is due for renewal, and a renewal
            ahead of expiry does not take it.
        default_expires_in: The lifetime stored for a token the server gave none.
        emit: Receives ``token_store_failed`` events.
    """

    shared = True

    def __init__(
        self,
        store: TokenStore,
        identity: TokenIdentity,
        *,
        refresh_margin: float,
        default_expires_in: float,
        emit: Callable[[AuthEvent], None],
    ) -> None:
        self._store = store
        self._identity = identity
        self._refresh_margin = refresh_margin
        self._default_expires_in = default_expires_in
        self._emit = emit
        self._health = HEALTHS.of(store)
        #: Seconds the fetch lock lives unless its holder extends it (see STORE_LOCK_TTL).
        self.lock_ttl = STORE_LOCK_TTL
        # A store that can connect ahead of its first call does so now, in the background:
        # by the first token this process needs, the set-up is done or under way.
        prepare = getattr(store, "prepare", None)
        if callable(prepare) and not self._closed():
            with contextlib.suppress(Exception):  # a store that fails, fails in its calls
                prepare()

    def __repr__(self) -> str:
        return f"<SharedLevel store={type(self._store).__name__}>"

    def _closed(self) -> bool:
        return bool(getattr(self._store, "closed", False))

    def _takes(
        self,
        stored: StoredToken,
        origin: Origin,
        *,
        refused: str | None,
        refusal: Refusal | None,
        renewing: str | None,
    ) -> bool:
        """Whether a stored token may be used rather than fetched."""
        if stored.access_token in (refused, renewing):
            return False
        lifetime = stored.lifetime
        # Usable for a while, not for the moment it takes to be sent: two guards.
        least = 2 * expiry_guard(lifetime)
        if renewing is not None:
            # A renewal ahead of expiry wants a token not due for renewal itself; a process
            # with no usable token takes any usable one, and renews it in the background.
            least = max(least, renewal_margin(self._refresh_margin, lifetime))
        # After a refusal, a token that replaced that very token (the fleet's shared token,
        # revoked: one renewal serves every process), or one requested after the refusal;
        # not one from before it, which the revocation behind it may have covered too (a
        # peer's token renewed ahead of expiry, say).
        return stored.expires_in > least and origin.answers(refusal) != "older"

    async def _call(self, call: Callable[[], Awaitable[_T]]) -> _T:
        # The call is made in here: a store whose method is missing, or takes other
        # arguments, is a store that failed like any other.
        store = self._store
        # A store with a connect_timeout bounds its own calls, each step by its own bound
        # (see TokenStore): this is a guard behind them, never the first to run out.
        connect_timeout = getattr(store, "connect_timeout", None)
        limit = store.timeout
        if isinstance(connect_timeout, (int, float)) and connect_timeout > 0:
            limit += connect_timeout + _GUARD_MARGIN
        try:
            return await asyncio.wait_for(call(), limit)
        except StoreTimeout as exc:
            raise StoreUnavailable("TimeoutError", str(exc)) from None
        except asyncio.TimeoutError:
            raise StoreUnavailable("TimeoutError", f"no answer within {limit:g} s") from None
        except Exception as exc:
            detail = redact_text(str(exc)[:MAX_SERVER_TEXT], [self._identity.client_secret])
            error = exc.error if isinstance(exc, StoreFault) else type(exc).__name__
            raise StoreUnavailable(error, str(detail)) from None

    def _failed(self, error: StoreUnavailable) -> None:
        health, now = self._health, time.monotonic()
        if self._closed():
            return  # closed on purpose
        health.failed(error.error)
        if now < health.rest_until:
            return  # another transport on this store said so already
        cooldown = self._store.cooldown
        health.rest_until = now + cooldown
        self._emit(
            AuthEvent(
                "token_store_failed",
                error=error.error,
                wait=cooldown,
                store=health.location,
                detail=error.detail,
            )
        )

    async def obtain(
        self,
        fetch: TokenFetcher,
        *,
        refused: str | None = None,
        refusal: Refusal | None = None,
        replacing: Refusal | None = None,
        renewing: str | None = None,
    ) -> tuple[TokenResponse, Origin | None]:
        """A token through the store, or from ``fetch`` when the store cannot help.

        Args:
            fetch: Asks the token endpoint.
            refused: The value of a token the API refused, to drop from the store.
            refusal: The latest refusal: a stored token from before it is not taken,
                unless it replaced that very token.
            replacing: The refusal this fetch answers, if it answers one: a token fetched
                is stored as its replacement (a renewal ahead of expiry replaces none).
            renewing: The value of the token renewed ahead of expiry, else ``None``: only
                a stored token not due for renewal is taken.

        Returns:
            The token, and where a token read from the store comes from (``None``: fetched).

        Raises:
            TokenRequestError: ``fetch`` failed, or the fetch of the process whose lock
                this one waited on failed.
        """
        # A store closed on purpose is gone, not failing: no warning, no cool-down.
        if time.monotonic() < self._health.rest_until or self._closed():
            return await fetch(), None
        failures = self._health.failures
        got = await self._shared(fetch, refused, refusal, replacing, renewing)
        if self._health.failures == failures:
            self._health.error = None  # no call of this fetch failed: shared again
        return got

    async def _shared(
        self,
        fetch: TokenFetcher,
        refused: str | None,
        refusal: Refusal | None,
        replacing: Refusal | None,
        renewing: str | None,
    ) -> tuple[TokenResponse, Origin | None]:
        """:meth:`obtain` through the store, which is not resting."""

        def takes(stored: StoredToken, origin: Origin) -> bool:
            return self._takes(stored, origin, refused=refused, refusal=refusal, renewing=renewing)

        # Chosen here, not by the store: a lock call that timed out may still have taken
        # the lock, and only its owner value can release it.
        owner = secrets.token_hex(16)
        lock = _LockCall()  # sent: release it whatever happened
        try:
            try:
                found = await self._read_or_lock(takes, refused, owner, lock)
                if found is not None:
                    return found
            except StoreUnavailable as error:
                self._failed(error)
                if lock.sent:
                    # Alongside the fetch, not before it: the store may be the slow part.
                    # A release that fails leaves the lock to expire within lock_ttl.
                    lock.sent = False
                    releasing = asyncio.ensure_future(self._release(owner))
                    try:
                        return await fetch(), None
                    finally:
                        await releasing
                return await fetch(), None
            guard = fetch if isinstance(fetch, GuardedFetch) else None
            if guard is not None:
                await self._fleet_admits(guard)
            started = time.monotonic()
            try:
                response = await self._fetch_holding(fetch, owner)
            except TokenRequestError as failed:
                lock.sent = False
                # Only a failure every process would meet is shared (the endpoint down or
                # hung); one of credentials (a secret being rotated, with store_key) is not
                # handed to the waiters, whose credentials may differ: a refusal is kept
                # by the identity, which has the secret in it (_fleet_refused).
                # Kept before the lock goes: a waiter that takes it reads the refusal.
                if guard is not None:
                    await self._fleet_refused(guard, failed)
                await self._release(owner, _describe(failed) if failed.retryable else None)
                raise
            await self._save(response, started, replacing)
            return response, None
        finally:
            if lock.sent:
                await self._release(owner)

    async def _fleet_admits(self, guard: GuardedFetch) -> None:
        """Raise the refusal another process of the fleet was told, or the budget's error
        once the fleet spent it; count this fetch in the fleet's window. A store without
        these calls (optional in the protocol), or one failing, leaves the process's own
        count alone in charge."""
        store, identity, budget = self._store, self._identity, guard.budget
        if not callable(getattr(store, "admit", None)):
            return
        window = None if budget is None else budget.window
        try:
            # One call, one round trip: a Redis far away costs a fetch one more, not two.
            answer = await self._call(lambda: store.admit(identity, window))  # type: ignore[attr-defined]
        except StoreUnavailable as error:
            self._failed(error)
            return
        found, counted = answer if isinstance(answer, tuple) and len(answer) == 2 else (None, None)
        found, counted = _pair(found, str), _pair(counted, int)
        refusal = None if found is None else refusal_from(found[0], identity.client_secret)
        if found is not None and refusal is not None:
            LEDGERS.of(guard.key).hold(refusal, guard.clock() + found[1])
            raise remembered(refusal, found[1], elsewhere=True)
        if budget is not None and counted is not None and counted[0] > budget.requests:
            denied = spent(budget, counted[1], int(counted[0]) - 1)
            guard.tell_denied(denied)
            raise denied

    async def _fleet_refused(self, guard: GuardedFetch, failed: TokenRequestError) -> None:
        """Keep a refusal of the credentials in the store, for the back-off this process
        keeps it: the other processes do not ask meanwhile."""
        store, identity = self._store, self._identity
        wait = LEDGERS.of(guard.key).refused_for(guard.clock())
        if not refuses_credentials(failed) or wait <= 0:
            return
        if not callable(getattr(store, "note_refusal", None)):
            return
        text = refusal_text(failed, identity.client_secret)
        try:
            await self._call(lambda: store.note_refusal(identity, text, wait))  # type: ignore[attr-defined]
        except StoreUnavailable as error:
            self._failed(error)

    async def _read_or_lock(
        self,
        takes: Callable[[StoredToken, Origin], bool],
        refused: str | None,
        owner: str,
        lock: _LockCall,
    ) -> tuple[TokenResponse, Origin] | None:
        """A stored token to take, or ``None`` once this process holds the lock (as
        ``owner``) and fetches: the refused token dropped first, then read, and read again
        after each wait for another process's fetch."""
        identity, store = self._identity, self._store
        if refused is not None:
            await self._call(lambda: store.discard(identity, refused))
        found = await self._read(takes)
        if found is not None:
            return found
        waited_on: list[str] = []  # holders whose fetch this process waited for
        while True:
            lock.sent = True
            holder = await self._call(lambda: store.lock(identity, owner, self.lock_ttl))
            if holder is None:
                break
            lock.sent = False
            await self._learn_failure(waited_on, holder)
            if holder not in waited_on:
                waited_on.append(holder)
            # Jittered, so waiters that began together do not poll together. The
            # wait is bounded by the fetch's own deadline (TokenManager._fly).
            await asyncio.sleep(random.uniform(STORE_POLL_MIN, STORE_POLL_MAX))
            found = await self._read(takes)
            if found is not None:
                return found
        # Ours now. Whoever held it before either failed, and this process learns why
        # rather than trying again at once, or wrote a token that landed between the read
        # and the lock.
        await self._learn_failure(waited_on, None)
        return await self._read(takes)

    async def _read(
        self, takes: Callable[[StoredToken, Origin], bool]
    ) -> tuple[TokenResponse, Origin] | None:
        read_at = time.monotonic()
        stored = await self._call(lambda: self._store.load(self._identity))
        if stored is None:
            return None
        # When it was requested follows from its lifetime and time left, on the store's
        # clock. read_at is taken before the read, which errs on the early side; but the
        # writer measured the time left before its write ran, which may have been as
        # late as the store's timeout: the token may be that much older than it looks.
        requested = read_at - (stored.lifetime - stored.expires_in)
        origin = Origin(requested, stored.replaces, stored.replaced_before, self._store.timeout)
        if not takes(stored, origin):
            return None
        return _loaded(stored), origin

    async def _learn_failure(self, waited_on: list[str], holder: str | None) -> None:
        """Raise the error of a holder this process waited on that gave up its lock failing."""
        for each in [h for h in waited_on if h != holder]:
            waited_on.remove(each)
            failure = await self._failure_of(each)
            if failure is not None:
                raise _failure_error(failure)

    async def _failure_of(self, holder: str) -> str | None:
        return await self._call(lambda: self._store.failure(self._identity, holder))

    async def _fetch_holding(self, fetch: TokenFetcher, owner: str) -> TokenResponse:
        """``fetch()``, extending the lock meanwhile, so a holder that dies costs little.

        The lock lives ``lock_ttl`` (a couple of seconds), not as long as a fetch may take:
        the waiters of a holder killed mid-fetch take over within that, and still have
        time to fetch before their own deadline.
        """
        keeper = asyncio.ensure_future(self._keep_locked(owner))
        try:
            return await fetch()
        finally:
            keeper.cancel()
            await asyncio.wait({keeper})

    async def _keep_locked(self, owner: str) -> None:
        while True:
            await asyncio.sleep(self.lock_ttl / 3)
            try:
                holder = await self._call(
                    lambda: self._store.lock(self._identity, owner, self.lock_ttl)
                )
            except StoreUnavailable:
                return  # the lock lapses: at worst another process fetches too
            if holder is not None:
                return  # lost it (it lapsed meanwhile): the fetch goes on all the same

    async def _save(
        self, response: TokenResponse, started: float, replacing: Refusal | None
    ) -> None:
        lifetime = response.expires_in
        if lifetime is None or lifetime <= 0:
            lifetime = self._default_expires_in  # as the token manager does
        # Stored with the time left since the request was sent: readers tell from the
        # lifetime and time left when it was requested (see _takes).
        left = lifetime - (time.monotonic() - started)
        if left > 0:
            # It replaces the token refused, requested that long before it.
            replaces = before = None
            if replacing is not None:
                replaces = replacing.fingerprint
                if replacing.requested_at is not None:
                    before = started - replacing.requested_at
            token = StoredToken(response.access_token, left, lifetime, replaces, before)
            try:
                await self._call(lambda: self._store.save(self._identity, token))
            except StoreUnavailable as error:
                self._failed(error)
            del token

    async def _release(self, owner: str, failure: str | None = None) -> None:
        try:
            await self._call(lambda: self._store.unlock(self._identity, owner, failure))
        except StoreUnavailable as error:
            self._failed(error)  # the lock expires by itself, within lock_ttl
