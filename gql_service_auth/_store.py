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
is slow never fails a request: each call is bounded by the store's ``timeout``, and on
any failure the process fetches the token itself, and every transport on that store
leaves it alone for its ``cooldown``, after one ``token_store_failed`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import secrets
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from ._constants import (
    EXPIRY_GUARD,
    MAX_SERVER_TEXT,
    STORE_LOCK_TTL,
    STORE_POLL_MAX,
    STORE_POLL_MIN,
)
from ._errors import TokenRequestError
from ._events import AuthEvent
from ._redact import redact_text
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
        lifetime: Seconds it was issued for, so every reader renews it at the same point;
            with ``expires_in``, it tells when the token was requested.
        replaces: For a token fetched because the API refused another, a fingerprint of
            that one (no secret: a hash), so that the processes refused with it take this
            one; ``None`` otherwise.
    """

    access_token: str
    expires_in: float
    lifetime: float
    replaces: str | None = None

    def __repr__(self) -> str:
        return (
            f"StoredToken(access_token='***', expires_in={self.expires_in:.3f}, "
            f"lifetime={self.lifetime:.3f}, replaces={self.replaces!r})"
        )


class TokenStore(Protocol):
    """A store of access tokens shared by processes, such as Redis.

    The methods are coroutines called on the event loop of a token fetch, which runs on a
    short-lived thread of its own: an implementation must not keep state bound to the
    calling loop. Any exception a method raises, and any call that outlasts ``timeout``,
    counts as the store being unavailable: the process then fetches its token itself.
    Two attributes are optional: a store whose ``closed`` is true is skipped quietly, and
    its ``location`` (a text with no secret, such as ``redis://host:6379/0``) names it in
    ``token_store_failed`` events.

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

    async def lock(self, identity: TokenIdentity, owner: str, ttl: float) -> str | None:
        """Take the fetch lock of ``identity`` for ``owner`` and ``ttl`` seconds, if free.

        A lock ``owner`` holds already is extended to ``ttl`` from now; a lock that is not
        released or extended expires, and a lock found without an expiry is taken over.

        Returns:
            ``None`` when ``owner`` holds the lock now; else the owner value of its holder.
        """
        ...

    async def unlock(
        self, identity: TokenIdentity, owner: str, failure: str | None = None
    ) -> None:
        """Release the lock if ``owner`` still holds it.

        Args:
            failure: Why ``owner``'s fetch failed, for the processes that waited on it
                (:meth:`failure`); a short text, with no secret. ``None``: it did not fail.
        """
        ...

    async def failure(self, identity: TokenIdentity, owner: str) -> str | None:
        """The ``failure`` that ``owner`` released the lock with a moment ago, else ``None``.

        Kept a few seconds at least: long enough for the waiters to read it.
        """
        ...


# Shown as gql_service_auth.X, where users import them from (see _errors.py).
for _public in (TokenIdentity, StoredToken, TokenStore):
    _public.__module__ = "gql_service_auth"


def refusal_fingerprint(access_token: str) -> str:
    """What a stored token records of the refused token it replaces: a hash, not the token."""
    digest = hashlib.sha256(b"gql-service-auth refused token\0" + access_token.encode())
    return digest.hexdigest()[:32]


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


class _Health:
    """Whether a store is resting after a failure: one per store, shared by its transports."""

    __slots__ = ("rest_until",)

    def __init__(self) -> None:
        self.rest_until = 0.0  # time.monotonic(): the cool-down is in real time


_healths: weakref.WeakKeyDictionary[object, _Health] = weakref.WeakKeyDictionary()
_healths_lock = threading.Lock()


def _health_of(store: TokenStore) -> _Health:
    # 50 transports on one store learn of an outage once, not once each.
    with _healths_lock:
        try:
            health = _healths.get(store)
            if health is None:
                health = _healths[store] = _Health()
        except TypeError:  # a store that cannot be weakly referenced rests on its own
            health = _Health()
    return health


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
        self._health = _health_of(store)
        #: Seconds the fetch lock lives unless its holder extends it (see STORE_LOCK_TTL).
        self.lock_ttl = STORE_LOCK_TTL

    def __repr__(self) -> str:
        return f"<SharedLevel store={type(self._store).__name__}>"

    def _closed(self) -> bool:
        return bool(getattr(self._store, "closed", False))

    def _takes(
        self,
        stored: StoredToken | None,
        read_at: float,
        *,
        refused: str | None,
        refused_at: float | None,
        renewing: str | None,
    ) -> bool:
        """Whether a stored token, read at ``read_at``, may be used rather than fetched."""
        if stored is None or stored.access_token in (refused, renewing):
            return False
        lifetime = stored.lifetime
        # Usable for a while, not for the moment it takes to be sent: two guards.
        least = 2 * min(EXPIRY_GUARD, lifetime / 10)
        if renewing is not None:
            # A renewal ahead of expiry wants a token not due for renewal itself (by the
            # manager's rule, see TokenManager._new_token); a process with no usable
            # token takes any usable one, and renews it in the background as usual.
            least = max(least, min(self._refresh_margin, lifetime / 2))
        if stored.expires_in <= least:
            return False
        if refused is not None:
            # After a refusal, a token that replaced that very token (the fleet's shared
            # token, revoked: one renewal serves every process), or one requested after
            # the refusal. Not any other: the revocation that refused ours may have
            # covered a peer's newer token too (renewed ahead of expiry, say). When it was
            # requested follows from its lifetime and time left, on the store's clock.
            if stored.replaces == refusal_fingerprint(refused):
                return True
            return refused_at is not None and read_at - (lifetime - stored.expires_in) > refused_at
        return True

    async def _call(self, call: Awaitable[_T]) -> _T:
        try:
            return await asyncio.wait_for(call, self._store.timeout)
        except asyncio.TimeoutError:
            raise StoreUnavailable(
                "TimeoutError", f"no answer within {self._store.timeout:g} s"
            ) from None
        except Exception as exc:
            detail = redact_text(str(exc)[:MAX_SERVER_TEXT], [self._identity.client_secret])
            raise StoreUnavailable(type(exc).__name__, str(detail)) from None

    def _failed(self, error: StoreUnavailable) -> None:
        health, now = self._health, time.monotonic()
        if self._closed() or now < health.rest_until:
            return  # closed on purpose, or another transport on this store said so already
        cooldown = self._store.cooldown
        health.rest_until = now + cooldown
        self._emit(
            AuthEvent(
                "token_store_failed",
                error=error.error,
                wait=cooldown,
                store=str(getattr(self._store, "location", None) or type(self._store).__name__),
                detail=error.detail,
            )
        )

    async def obtain(
        self,
        fetch: TokenFetcher,
        *,
        refused: str | None = None,
        refused_at: float | None = None,
        renewing: str | None = None,
    ) -> tuple[TokenResponse, bool]:
        """A token through the store, or from ``fetch`` when the store cannot help.

        Args:
            fetch: Asks the token endpoint.
            refused: The value of a token the API refused, else ``None``.
            refused_at: When (``time.monotonic()``) it was refused: only a token
                requested after that is taken from the store.
            renewing: The value of the token renewed ahead of expiry, else ``None``: only
                a stored token not due for renewal is taken.

        Returns:
            The token, and whether it was read from the store.

        Raises:
            TokenRequestError: ``fetch`` failed, or the fetch of the process whose lock
                this one waited on failed.
        """
        # A store closed on purpose is gone, not failing: no warning, no cool-down.
        if time.monotonic() < self._health.rest_until or self._closed():
            return await fetch(), False

        def takes(stored: StoredToken | None, read_at: float) -> bool:
            return self._takes(
                stored, read_at, refused=refused, refused_at=refused_at, renewing=renewing
            )

        identity, store = self._identity, self._store
        # Chosen here, not by the store: a lock call that timed out may still have taken
        # the lock, and only its owner value can release it.
        owner = secrets.token_hex(16)
        locked = False  # a lock call went out with this owner: release it whatever happened
        try:
            try:
                if refused is not None:
                    await self._call(store.discard(identity, refused))
                found = await self._read(takes)
                if found is not None:
                    return found, True
                waited_on: list[str] = []  # holders whose fetch this process waited for
                while True:
                    locked = True
                    holder = await self._call(store.lock(identity, owner, self.lock_ttl))
                    if holder is None:
                        break
                    locked = False
                    await self._learn_failure(waited_on, holder)
                    if holder not in waited_on:
                        waited_on.append(holder)
                    # Jittered, so waiters that began together do not poll together. The
                    # wait is bounded by the fetch's own deadline (TokenManager._fly).
                    await asyncio.sleep(random.uniform(STORE_POLL_MIN, STORE_POLL_MAX))
                    found = await self._read(takes)
                    if found is not None:
                        return found, True
                # Ours now. Whoever held it before either failed, and this process
                # learns why rather than trying again at once, or wrote a token that
                # landed between the read and the lock.
                await self._learn_failure(waited_on, None)
                found = await self._read(takes)
                if found is not None:
                    return found, True
            except StoreUnavailable as error:
                self._failed(error)
                if locked:
                    # Alongside the fetch, not before it: the store may be the slow part.
                    # A release that fails leaves the lock to expire within lock_ttl.
                    locked = False
                    releasing = asyncio.ensure_future(self._release(owner))
                    try:
                        return await fetch(), False
                    finally:
                        await releasing
                return await fetch(), False
            started = time.monotonic()
            try:
                response = await self._fetch_holding(fetch, owner)
            except TokenRequestError as failed:
                locked = False
                await self._release(owner, _describe(failed))
                raise
            await self._save(response, started, refused)
            return response, False
        finally:
            if locked:
                await self._release(owner)

    async def _read(
        self, takes: Callable[[StoredToken | None, float], bool]
    ) -> TokenResponse | None:
        read_at = time.monotonic()
        stored = await self._call(self._store.load(self._identity))
        if stored is not None and takes(stored, read_at):
            return _loaded(stored)
        return None

    async def _learn_failure(self, waited_on: list[str], holder: str | None) -> None:
        """Raise the error of a holder this process waited on that gave up its lock failing."""
        for each in [h for h in waited_on if h != holder]:
            waited_on.remove(each)
            failure = await self._call(self._store.failure(self._identity, each))
            if failure is not None:
                raise _failure_error(failure)

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
                holder = await self._call(self._store.lock(self._identity, owner, self.lock_ttl))
            except StoreUnavailable:
                return  # the lock lapses: at worst another process fetches too
            if holder is not None:
                return  # lost it (it lapsed meanwhile): the fetch goes on all the same

    async def _save(self, response: TokenResponse, started: float, refused: str | None) -> None:
        lifetime = response.expires_in
        if lifetime is None or lifetime <= 0:
            lifetime = self._default_expires_in  # as the token manager does
        # Stored with the time left since the request was sent: readers tell from the
        # lifetime and time left when it was requested (see _takes).
        left = lifetime - (time.monotonic() - started)
        if left > 0:
            replaces = refusal_fingerprint(refused) if refused is not None else None
            token = StoredToken(response.access_token, left, lifetime, replaces)
            try:
                await self._call(self._store.save(self._identity, token))
            except StoreUnavailable as error:
                self._failed(error)
            del token

    async def _release(self, owner: str, failure: str | None = None) -> None:
        # On failure, the lock expires by itself, within lock_ttl.
        with contextlib.suppress(StoreUnavailable):
            await self._call(self._store.unlock(self._identity, owner, failure))
