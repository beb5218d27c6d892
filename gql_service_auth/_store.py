"""A token store: a second level, shared by processes, under each process's token cache.

A fleet of processes with the same credentials needs one token, not one per process:
identity providers count every token request against a quota (Auth0), cap each client's
share of the token rate limit (Okta), or answer 429 when tokens are not cached (Entra
ID). :class:`TokenStore` is the protocol a shared store implements; the Redis one is in
:mod:`gql_service_auth.redis`, and how a token manager uses one is in
:mod:`gql_service_auth._token_source`. Nothing here knows Redis or gql.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from . import _fork
from ._loop_thread import LoopThread

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
        # A repeated field comes as a list (RFC 8707's resource): a tuple, to be compared.
        params = ((k, tuple(v) if isinstance(v, list) else v) for k, v in token_params.items())
        return cls(token_url, client_id, client_secret, scope, tuple(sorted(params)), auth_method)

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
        replaced_before: Seconds by which that one was requested before this one, if
            known: the processes refused with a token no newer take this one too.
    """

    access_token: str
    expires_in: float
    lifetime: float
    replaces: str | None = None
    replaced_before: float | None = None

    def __repr__(self) -> str:
        return (
            f"StoredToken(access_token='***', expires_in={self.expires_in:.3f}, "
            f"lifetime={self.lifetime:.3f}, replaces={self.replaces!r}, "
            f"replaced_before={self.replaced_before!r})"
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


_Store = TypeVar("_Store", bound="StoreOnItsThread")


class _OnItsThread(Protocol):
    """What a store runs on: its loop thread, and what lives there."""

    @property
    def loop(self) -> LoopThread: ...


class StoreOnItsThread(TokenStore):
    """The life cycle of a store that runs its calls on a loop thread of its own (Redis,
    local): closing, context managers, and the settings a token manager reads.

    A subclass sets ``_timeout``, ``_cooldown``, ``_location``, ``_closed``, ``_running``
    (whose ``loop`` is the :class:`~._loop_thread.LoopThread`) and ``_finalizer`` (closes
    what lives on that loop and stops it, once).
    """

    _timeout: float
    _cooldown: float
    _location: str
    _closed: bool
    _running: _OnItsThread
    _finalizer: weakref.finalize[Any, Any]

    @property
    def closed(self) -> bool:
        """Whether the store was closed: transports then fetch for themselves, quietly."""
        return self._closed or self._running.loop.closing

    @property
    def location(self) -> str:
        """Where the store is, with no user, password or option."""
        return self._location

    @property
    def timeout(self) -> float:
        """Seconds each call may take."""
        return self._timeout

    @property
    def cooldown(self) -> float:
        """Seconds the store is left alone after a failed or slow call."""
        return self._cooldown

    def close(self) -> None:
        """Close the store and stop its thread; the store is then unusable.

        A store shared by :meth:`OAuth2Transport.from_env` is closed for all its
        transports; the next ``from_env()`` opens another. Transports that still use it
        fetch their tokens themselves. Thread-safe, and bounded (about 2 s at most, even
        for a hung server or file system). A store collected, or open at exit, is closed
        the same way.
        """
        self._closed = True
        self._finalizer()

    async def aclose(self) -> None:
        """:meth:`close`, without blocking the calling event loop."""
        await asyncio.to_thread(self.close)

    def __enter__(self: _Store) -> _Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self: _Store) -> _Store:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


_S = TypeVar("_S")


class StoresByUrl(Generic[_S]):
    """The process's one store per URL and timeout, for ``from_env()``: transports built
    one per job share it, rather than each opening a store. One that was closed is replaced.

    Args:
        open_store: Opens the store of a URL with a timeout (and marks it as the shared one).
        closed: Whether a store was closed.
    """

    def __init__(
        self, open_store: Callable[[str, float], _S], closed: Callable[[_S], bool]
    ) -> None:
        self._open = open_store
        self._closed = closed
        self._by_url: dict[tuple[str, float], _S] = {}
        self._lock = threading.Lock()
        _fork.reset_in_child(self)

    def __repr__(self) -> str:
        return f"<shared stores: {len(self._by_url)}>"  # the URLs may hold passwords

    def get(self, url: str, timeout: float) -> _S:
        """The store of ``url`` whose calls may take ``timeout`` seconds, opened on first use."""
        with self._lock:
            store = self._by_url.get((url, timeout))
            if store is None or self._closed(store):
                store = self._by_url[url, timeout] = self._open(url, timeout)
            return store

    def _after_fork_in_child(self) -> None:
        # The stores reset themselves in the child; another thread may have held the lock.
        self._lock = threading.Lock()


# Shown as gql_service_auth.X, where users import them from (see _errors.py).
for _public in (TokenIdentity, StoredToken, TokenStore):
    _public.__module__ = "gql_service_auth"
