"""A token store: a second level, shared by processes, under each process's token cache.

A fleet of processes with the same credentials needs one token, not one per process:
identity providers count every token request against a quota (Auth0), cap each client's
share of the token rate limit (Okta), or answer 429 when tokens are not cached (Entra
ID). :class:`TokenStore` is the protocol a shared store implements; the Redis one is in
:mod:`gql_service_auth.redis`, and how a token manager uses one is in
:mod:`gql_service_auth._stores.level`. Nothing here knows Redis or gql.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from .._core import fork as _fork
from .._core.constants import STORE_IDENTITIES_KEPT
from .._core.errors import ConfigurationError
from .._core.loop_thread import LoopThread

_T = TypeVar("_T")
_V = TypeVar("_V")


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
    Three attributes are optional: a store whose ``closed`` is true is skipped quietly;
    its ``location`` (a text with no secret, such as ``redis://host:6379/0``) names it in
    ``token_store_failed`` events; and a store with a ``connect_timeout`` bounds its calls
    itself, each by ``connect_timeout`` to be ready (connected, its turn come) and then by
    ``timeout`` to answer, so that its set-up and queue do not count against ``timeout``.

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


class StoreTimeout(TimeoutError):
    """A store call that was not ready, or did not answer, in time; says which (internal)."""


class StoreFault(Exception):
    """A store's error with its cause and fix in words (internal).

    Attributes:
        error: The class name of the error behind it, as events name it.
    """

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


class Turn:
    """A store call's side on the store's loop (see :func:`call_on_thread`).

    Attributes:
        abandoned: Whether its caller gave up on it (a bound ran out, or it was
            cancelled): an outcome it raises now is nobody's to read.
    """

    def __init__(self) -> None:
        self.began: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.abandoned = False

    def start(self) -> None:
        """The store is ready and this call's turn has come: ``timeout`` starts now."""
        if not self.began.done():
            self.began.set_result(None)


async def call_on_thread(
    loop: LoopThread,
    body: Callable[[Turn], Coroutine[Any, Any, _T]],
    *,
    connect_timeout: float,
    timeout: float,
) -> _T:
    """Run ``body(turn)`` on ``loop``: ``connect_timeout`` to call ``turn.start()``, then
    ``timeout`` to finish.

    ``body`` sets its store up, or waits for a set-up under way, and for its turn (a
    connection included), then calls ``turn.start()`` and makes its call: a first call
    that connects, or a call queued behind a burst, is not cut off by the short bound
    meant for one round trip. Cancelling the caller, or a bound that runs out, cancels
    ``body``.

    Raises:
        StoreTimeout: a bound ran out; its message says which.
        LoopClosed: the loop is closed.
    """
    turn = Turn()
    submitted = loop.submit(body(turn))
    outcome: asyncio.Future[Any] = asyncio.wrap_future(submitted)
    outcome.add_done_callback(outcome_read)  # read from ``submitted``, whatever this copy holds
    ready: asyncio.Future[Any] = asyncio.wrap_future(turn.began)
    try:
        # Each bound is judged by the store's thread's own futures, not by their copies on
        # this loop: a busy loop (a hundred callers, a loaded host) hears late of a call
        # that was done in time, and a call that is done is never thrown away.
        await asyncio.wait(
            {outcome, ready}, timeout=connect_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if not submitted.done() and not turn.began.done():
            raise StoreTimeout(f"not connected within {connect_timeout:g} s (connect_timeout)")
        if not submitted.done():
            await asyncio.wait({outcome}, timeout=timeout)
            if not submitted.done():
                raise StoreTimeout(f"no answer within {timeout:g} s")
        if submitted.cancelled():  # by close(): as asyncio's own cancellation would be
            raise asyncio.CancelledError
        result: _T = submitted.result()
        return result
    finally:
        ready.cancel()
        if not outcome.done():
            turn.abandoned = True
            outcome.cancel()  # cancels the call on the store's loop too


def outcome_read(future: asyncio.Future[Any] | concurrent.futures.Future[Any]) -> None:
    """A done callback: the future's error counts as read (no "exception was never
    retrieved" at collection), for a future whose outcome is read elsewhere or by nobody
    (a set-up every caller gave up on, a background prepare())."""
    if not future.cancelled():
        future.exception()


class Remembered(Generic[_V]):
    """What a store derived for each identity (names, keys), for the most recent ones only.

    A process that serves many tenants, or whose secrets rotate, would otherwise keep an
    entry, secret-derived keys in it, for every identity it ever served. Thread-safe.

    Args:
        derive: Makes the entry of an identity; called again for one forgotten.
        size: How many are kept.
    """

    def __init__(
        self, derive: Callable[[TokenIdentity], _V], size: int = STORE_IDENTITIES_KEPT
    ) -> None:
        self._derive = derive
        self._size = size
        self._kept: OrderedDict[TokenIdentity, _V] = OrderedDict()
        self._lock = threading.Lock()
        _fork.reset_in_child(self)

    def __repr__(self) -> str:
        return f"<remembered: {len(self._kept)} of {self._size}>"

    def __len__(self) -> int:
        return len(self._kept)

    def of(self, identity: TokenIdentity) -> _V:
        with self._lock:
            value = self._kept.get(identity)
            if value is not None:
                self._kept.move_to_end(identity)
                return value
        value = self._derive(identity)  # outside the lock: derivation takes a moment
        with self._lock:
            self._kept[identity] = value
            self._kept.move_to_end(identity)
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)
        return value

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork


def checked_seconds(**values: object) -> dict[str, float]:
    """Each of a store's bounds as a float; ConfigurationError for one that is not a
    number of seconds (``cooldown`` may be 0, the others must be more, and finite)."""
    checked = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigurationError(f"{name} must be a number of seconds, at least 0")
        if name != "cooldown" and not 0 < value < math.inf:
            raise ConfigurationError(f"{name} must be more than 0 seconds, and finite")
        checked[name] = float(value)
    return checked


_Store = TypeVar("_Store", bound="StoreOnItsThread")


class _OnItsThread(Protocol):
    """What a store runs on: its loop thread, and what lives there."""

    @property
    def loop(self) -> LoopThread: ...

    async def ready(self) -> None:
        """Set up what lives on the loop (once; again after a failure), on the loop."""
        ...


class StoreOnItsThread(TokenStore):
    """The life cycle of a store that runs its calls on a loop thread of its own (Redis,
    local): closing, context managers, and the settings a token manager reads.

    A subclass sets ``_timeout``, ``_connect_timeout``, ``_cooldown``, ``_location``,
    ``_closed``, ``_running`` (whose ``loop`` is the
    :class:`~gql_service_auth._core.loop_thread.LoopThread`) and ``_finalizer`` (closes what
    lives on that loop and stops it, once).
    """

    _timeout: float
    _connect_timeout: float
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
    def connect_timeout(self) -> float:
        """Seconds a call may wait to be ready (the store set up, its turn come) before
        ``timeout`` starts."""
        return self._connect_timeout

    @property
    def cooldown(self) -> float:
        """Seconds the store is left alone after a failed or slow call."""
        return self._cooldown

    def prepare(self) -> None:
        """Start setting the store up now, in the background, rather than on first need.

        Connecting (TLS, discovering a cluster, loading scripts; opening SQLite) then
        overlaps the rest of the process's start-up. Returns at once; a failure is not
        raised (the first call meets it, and tries again). Transports call it when they
        are given the store.
        """
        if self.closed:
            return
        running = self._running  # not the store: nothing on its loop may refer to it
        with contextlib.suppress(RuntimeError):  # closed meanwhile (LoopClosed)
            running.loop.submit(running.ready()).add_done_callback(outcome_read)

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


Timeouts = tuple[float, float]
"""A store's ``timeout`` and ``connect_timeout``."""


class StoresByUrl(Generic[_S]):
    """The process's one store per URL and timeouts, for ``from_env()``: transports built
    one per job share it, rather than each opening a store. One that was closed is replaced.

    Args:
        open_store: Opens the store of a URL with its timeouts (and marks it as the shared
            one).
        closed: Whether a store was closed.
    """

    def __init__(
        self, open_store: Callable[[str, Timeouts], _S], closed: Callable[[_S], bool]
    ) -> None:
        self._open = open_store
        self._closed = closed
        self._by_url: dict[tuple[str, Timeouts], _S] = {}
        self._lock = threading.Lock()
        _fork.reset_in_child(self)

    def __repr__(self) -> str:
        return f"<shared stores: {len(self._by_url)}>"  # the URLs may hold passwords

    def get(self, url: str, timeouts: Timeouts) -> _S:
        """The store of ``url`` with those timeouts, opened on first use."""
        with self._lock:
            store = self._by_url.get((url, timeouts))
            if store is None or self._closed(store):
                store = self._by_url[url, timeouts] = self._open(url, timeouts)
            return store

    def _after_fork_in_child(self) -> None:
        # The stores reset themselves in the child; another thread may have held the lock.
        self._lock = threading.Lock()


# Shown as gql_service_auth.X, where users import them from (see _core/errors.py).
for _public in (TokenIdentity, StoredToken, TokenStore):
    _public.__module__ = "gql_service_auth"
