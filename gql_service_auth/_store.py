"""A token store: a second level, shared by processes, under each process's token cache.

A fleet of processes with the same credentials needs one token, not one per process:
identity providers count every token request against a quota (Auth0), cap each client's
share of the token rate limit (Okta), or answer 429 when tokens are not cached (Entra
ID). :class:`TokenStore` is the protocol a shared store implements; the Redis one is in
:mod:`gql_service_auth.redis`. Nothing here knows Redis or gql.

The two levels. Each process keeps its token in memory, and the per-request path reads
only that. The store is consulted when the manager would otherwise ask the token
endpoint: no token yet, a token due for renewal, or a refused one. Then
:class:`SharedLevel`:

1. drops a refused token from the store, if it is still the stored one, so that the
   first process refused renews it and the others read the renewal;
2. reads the store, and takes a stored token that is not itself due for renewal;
3. else takes the store's lock, reads once more, fetches from the token endpoint and
   writes the token (the store keeps the newer of two writes), then releases the lock;
4. while another process holds the lock, polls the store with jitter until its token
   lands, or the lock expires (its holder died) and this process takes it.

A store that fails or is slow never fails a request: each call is bounded by the store's
``timeout``, and on any failure the process fetches the token itself and leaves the
store alone for its ``cooldown``, with a ``token_store_failed`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from ._constants import EXPIRY_GUARD, STORE_POLL_MAX, STORE_POLL_MIN
from ._events import AuthEvent
from ._tokens import TokenFetcher, TokenResponse

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, repr=False)
class TokenIdentity:
    """What a stored token belongs to: a store keeps one token per identity.

    Two transports share a token exactly when all of these are equal. ``client_secret``
    is there for stores that derive their keys from it; it is never shown.

    Attributes:
        token_url: The token endpoint.
        client_id: The Client Id.
        client_secret: The Client Secret; never shown by ``repr``.
        scope: The scope requested, ``None`` when none.
        token_params: Further form fields of the token request, sorted by name.
        auth_method: How the client authenticates at the token endpoint.
    """

    token_url: str
    client_id: str
    client_secret: str = field(compare=True)
    scope: str | None = None
    token_params: tuple[tuple[str, str], ...] = ()
    auth_method: str = "client_secret_post"

    @classmethod
    def of(
        cls,
        *,
        token_url: str,
        client_id: str,
        client_secret: str,
        scope: str | None,
        token_params: Mapping[str, str],
        auth_method: str,
    ) -> TokenIdentity:
        """An identity with the token parameters in a canonical order."""
        return cls(
            token_url,
            client_id,
            client_secret,
            scope,
            tuple(sorted(token_params.items())),
            auth_method,
        )

    def __repr__(self) -> str:
        return (
            f"TokenIdentity(token_url={self.token_url!r}, client_id={self.client_id!r}, "
            f"client_secret='***', scope={self.scope!r}, auth_method={self.auth_method!r})"
        )


@dataclass(frozen=True, slots=True, repr=False)
class StoredToken:
    """A token as a store holds it.

    Attributes:
        access_token: The token; never shown by ``repr``.
        expires_in: Seconds it has left, by the store's clock when read (Redis ``PTTL``),
            so that the clocks of the hosts that share it do not matter.
        lifetime: Seconds it was issued for, so every reader renews it at the same point.
    """

    access_token: str
    expires_in: float
    lifetime: float

    def __repr__(self) -> str:
        return (
            f"StoredToken(access_token='***', expires_in={self.expires_in:.3f}, "
            f"lifetime={self.lifetime:.3f})"
        )


class TokenStore(Protocol):
    """A store of access tokens shared by processes, such as Redis.

    The methods are coroutines called on the event loop of a token fetch, which runs on a
    short-lived thread of its own: an implementation must not keep state bound to the
    calling loop. Any exception a method raises, and any call that outlasts ``timeout``,
    counts as the store being unavailable: the process then fetches its token itself.

    Attributes:
        timeout: Seconds each call may take before the store counts as unavailable.
        cooldown: Seconds the store is left alone after it failed.
    """

    @property
    def timeout(self) -> float: ...

    @property
    def cooldown(self) -> float: ...

    async def load(self, identity: TokenIdentity) -> StoredToken | None:
        """The stored token of ``identity``, or ``None`` when there is none."""
        ...

    async def save(self, identity: TokenIdentity, token: StoredToken) -> bool:
        """Store ``token`` unless the stored one expires later; whether it was stored."""
        ...

    async def discard(self, identity: TokenIdentity, access_token: str) -> bool:
        """Delete the stored token if it is ``access_token``; whether it was deleted."""
        ...

    async def lock(self, identity: TokenIdentity, owner: str, ttl: float) -> float:
        """Take the lock of ``identity`` for ``owner`` and ``ttl`` seconds, if it is free.

        Returns:
            0 when it was free and is now ``owner``'s; else the seconds the holder's lock
            has left, by the store's clock (``math.inf`` for a lock that never expires).
            A lock that is not released expires.
        """
        ...

    async def unlock(self, identity: TokenIdentity, owner: str) -> None:
        """Release the lock if ``owner`` still holds it."""
        ...


# Shown as gql_service_auth.X, where users import them from (see _errors.py).
for _public in (TokenIdentity, StoredToken, TokenStore):
    _public.__module__ = "gql_service_auth"


def _loaded(stored: StoredToken) -> TokenResponse:
    return TokenResponse(stored.access_token, stored.expires_in, lifetime=stored.lifetime)


class StoreUnavailable(Exception):
    """A store call failed or timed out (internal: the caller fetches for itself)."""


class SharedLevel:
    """The store's side of a token fetch: read, or lock, fetch and write (module docstring).

    Args:
        store: The shared store.
        identity: Whose token this process needs.
        refresh_margin: As the token manager's: a stored token with no more than
            ``min(refresh_margin, lifetime / 2)`` left is due for renewal, not taken.
        default_expires_in: The lifetime stored for a token the server gave none.
        lock_ttl: Seconds the lock is taken for: the longest a fetch may take, so that a
            holder that dies costs the others at most this long.
        emit: Receives ``token_store_failed`` events.
    """

    def __init__(
        self,
        store: TokenStore,
        identity: TokenIdentity,
        *,
        refresh_margin: float,
        default_expires_in: float,
        lock_ttl: float,
        emit: Callable[[AuthEvent], None],
    ) -> None:
        self._store = store
        self._identity = identity
        self._refresh_margin = refresh_margin
        self._default_expires_in = default_expires_in
        self.lock_ttl = lock_ttl
        self._emit = emit
        self._skip_until = 0.0  # time.monotonic(): the store's cool-down is in real time

    def __repr__(self) -> str:
        return f"<SharedLevel store={type(self._store).__name__}>"

    @property
    def budget(self) -> float:
        """The longest a fetch through the store may take, besides the fetch itself."""
        # Waiting out a dead holder's lock, then the lock of the waiter that took over
        # from it, and a few calls of the store around them.
        return 2 * self.lock_ttl + 6 * self._store.timeout

    def _takes(self, stored: StoredToken | None, avoid: tuple[str | None, ...]) -> bool:
        """Whether a stored token may be used as it is, rather than renewed."""
        if stored is None or stored.access_token in avoid:
            return False
        lifetime = stored.lifetime
        # Due for renewal by the manager's rule (see TokenManager._new_token); and, with
        # refresh_margin 0, not within two guards of expiry, so that a token taken is
        # still usable for a while rather than for the moment it takes to be sent.
        due = max(min(self._refresh_margin, lifetime / 2), 2 * min(EXPIRY_GUARD, lifetime / 10))
        return stored.expires_in > due

    async def _call(self, call: Awaitable[_T]) -> _T:
        try:
            return await asyncio.wait_for(call, self._store.timeout)
        except (Exception, asyncio.TimeoutError) as exc:
            raise StoreUnavailable(type(exc).__name__) from None

    def _failed(self, error: StoreUnavailable) -> None:
        cooldown = self._store.cooldown
        self._skip_until = time.monotonic() + cooldown
        self._emit(AuthEvent("token_store_failed", error=str(error), wait=cooldown))

    async def obtain(
        self, fetch: TokenFetcher, refused: str | None, held: str | None = None
    ) -> tuple[TokenResponse, bool]:
        """A token through the store, or from ``fetch`` when the store cannot help.

        Args:
            fetch: Asks the token endpoint.
            refused: The value of a token the API refused, else ``None``.
            held: The value of the token the process is renewing, else ``None``: the
                store's copy of it is not taken back, even if not quite due by the
                store's clock.

        Returns:
            The token, and whether it was read from the store.
        """
        # A store closed on purpose is gone, not failing: no warning, no cool-down.
        if time.monotonic() < self._skip_until or getattr(self._store, "closed", False):
            return await fetch(), False
        avoid = (refused, held)
        identity, store = self._identity, self._store
        # Chosen here, not by the store: a lock call that timed out may still have taken
        # the lock, and only its owner value can release it.
        owner = secrets.token_hex(16)
        locked = False  # a lock call went out with this owner: release it whatever happened
        try:
            try:
                if refused is not None:
                    await self._call(store.discard(identity, refused))
                stored = await self._call(store.load(identity))
                if self._takes(stored, avoid):
                    assert stored is not None
                    return _loaded(stored), True
                # A lock that never expires (not one of ours) is waited out this long.
                deadline = time.monotonic() + self.lock_ttl
                while True:
                    locked = True
                    left = await self._call(store.lock(identity, owner, self.lock_ttl))
                    if not left:
                        # A holder may have written between the read and the lock.
                        stored = await self._call(store.load(identity))
                        if self._takes(stored, avoid):
                            assert stored is not None
                            return _loaded(stored), True
                        break
                    locked = False
                    if left != math.inf:
                        # Until the holder's lock expires, by the store's clock: a holder
                        # that died is taken over by one waiter, whose lock the others
                        # then wait for in turn, rather than all fetching at once.
                        deadline = time.monotonic() + left + 2 * STORE_POLL_MAX
                    if time.monotonic() >= deadline:
                        break  # a lock without an end: fetch unlocked
                    # Jittered, so waiters that began together do not poll together.
                    await asyncio.sleep(random.uniform(STORE_POLL_MIN, STORE_POLL_MAX))
                    stored = await self._call(store.load(identity))
                    if self._takes(stored, avoid):
                        assert stored is not None
                        return _loaded(stored), True
            except StoreUnavailable as error:
                self._failed(error)
                if locked:
                    # Alongside the fetch, not before it: Redis may be the slow part. A
                    # release that fails leaves the lock to expire within lock_ttl.
                    locked = False
                    releasing = asyncio.ensure_future(self._release(owner))
                    try:
                        return await fetch(), False
                    finally:
                        await releasing
                return await fetch(), False
            started = time.monotonic()
            response = await fetch()
            lifetime = response.expires_in
            if lifetime is None or lifetime <= 0:
                lifetime = self._default_expires_in  # as the token manager does
            left = lifetime - (time.monotonic() - started)
            if left > 0:
                token = StoredToken(response.access_token, left, lifetime)
                try:
                    await self._call(store.save(identity, token))
                except StoreUnavailable as error:
                    self._failed(error)
                del token
            return response, False
        finally:
            if locked:
                await self._release(owner)

    async def _release(self, owner: str) -> None:
        # On failure, the lock expires by itself, within lock_ttl.
        with contextlib.suppress(StoreUnavailable):
            await self._call(self._store.unlock(self._identity, owner))
