"""One token per set of credentials in a process, whatever the code around it does.

Transports built one per call (a helper that makes a client for each query), one per
thread, or on two stacks side by side ask the token endpoint once between them: each
transport whose token requests would be the same uses one token manager, found here by
a :class:`SharingKey`. Identity providers bill and throttle token requests; a process
that asks for a token per call runs into their quotas.

What makes two token requests the same is everything that changes the request or where it
goes: the credentials and token parameters (a
:class:`~gql_service_auth._stores.protocol.TokenIdentity`, the secret included, so that a
different secret never gets another's token), the HTTP settings of the request (TLS
verification, proxy, connector), the retry policy, the renewal settings, the clock, and
the shared store under it. What belongs to each transport stays with it: its ``on_event``
hook (every transport sharing a token hears its events, see
:class:`~.events.Subscribers`), ``max_renewals``, and everything about the GraphQL
requests themselves.

Retention. gql's ``Client`` and its session refer to each other, so a transport dropped
by its caller lives until the cyclic garbage collector runs, or longer: a registry of
weak references alone would lose the token of a per-call transport at every collection.
So the registry keeps the latest :data:`~.constants.SHARED_TOKENS_KEPT` managers
strongly for as long as their token is usable, whatever the collector does, and every
manager a live transport uses weakly. Nothing else accumulates. A forked child keeps the
managers, whose tokens are values; each drops its flight and lock there (see
``_core/tokens.py``), as this registry drops its lock.

Refusals. A manager whose token the API refused holds no usable token, and goes like any
other; but what the refusals taught it (fresh tokens refused in a row, and the pause of
renewals they impose) must outlive it, or transports built per call for credentials an
API refuses would each fetch and renew anew, without bound. So as such a manager goes
(no transport uses it, and the registry let it go), the registry keeps its
:class:`~.ledger.Pause`, and the next manager of the same credentials, API, retry policy
and clock (a :class:`PauseKey`) goes on from it: calls fail at once while the pause lasts,
and the first after it renews, the pauses growing on, as with one long-lived transport.
What is kept holds no secret: a keyed digest names the credentials, and the pause holds
counts, times and a redacted answer; the manager, its secret and its key go. At most
:data:`~.constants.SHARED_PAUSES_KEPT` are kept, the least recently left going first; a
forked child keeps them, as it keeps the managers; ``share_tokens=False`` keeps its own.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import astuple, dataclass, field
from types import MethodType
from typing import TYPE_CHECKING, Any

from yarl import URL

from .._stores.protocol import TokenIdentity
from . import fork as _fork
from .constants import SHARED_PAUSES_KEPT, SHARED_TOKENS_KEPT
from .ledger import Pause
from .oauth2 import RetryPolicy

if TYPE_CHECKING:  # built by settings.token_manager, with the first OAuth2 transport
    from .rotating_source import RotatingIdentity
    from .tokens import TokenManager

_DIGEST_KEY = secrets.token_bytes(32)
"""Keys the digests that name credentials in a :class:`PauseKey`: worthless outside this
process, so a digest tells nothing of the secret it covers."""


class Same:
    """Compares by identity: an object whose equality means nothing here (a clock, a
    store, an ``SSLContext``) is part of a key as itself."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> tuple[int, ...]:
        # A bound method is made anew at each access (``clock=clocks.now``): it is the
        # same when its object and function are.
        obj = self.obj
        if isinstance(obj, MethodType):
            return id(obj.__self__), id(obj.__func__)
        return (id(obj),)

    def __repr__(self) -> str:
        return f"<same {type(self.obj).__name__}>"


@dataclass(frozen=True, slots=True, repr=False)
class SharingKey:
    """What makes the token requests of two transports the same; never shown.

    Attributes:
        api: The API the tokens are sent to (:func:`api_endpoint`; for an auth object,
            the origin of each request): what one API refuses must not drop or pause the
            tokens of another.
        identity: The credentials and token parameters.
        destination: Where the request goes and how (the poster's ``sharing_key``).
        policy: The token endpoint's retries, and the pauses of renewals.
        refresh_margin: When tokens are renewed.
        default_expires_in: How long a token with no lifetime is trusted.
        clock: The clock of token lifetimes.
        store: The shared store under the token, if any.
    """

    api: str | None
    identity: TokenIdentity | RotatingIdentity
    destination: Hashable
    policy: RetryPolicy
    refresh_margin: float
    default_expires_in: float
    clock: Same
    store: Same = field(default=Same(None))

    def __repr__(self) -> str:
        return f"<SharingKey {self.identity!r}>"

    def pause_key(self) -> PauseKey:
        """What this key's refusals are remembered by, once its manager is gone."""
        # Every field of the identity, the secret included, so that another secret never
        # goes on from this one's pause; keyed, so that the digest reveals none of them.
        # A source of credentials that can change is named by its repr and hash: equal
        # sources (one file) share a pause, two callables of one name do not.
        fields = json.dumps(astuple(self.identity), default=_named).encode()
        digest = hashlib.blake2b(fields, key=_DIGEST_KEY).hexdigest()
        return PauseKey(self.api, digest, self.policy, self.clock)


@dataclass(frozen=True, slots=True, repr=False)
class PauseKey:
    """What the refusals of an API are about: a set of credentials there, named with no
    secret, and the policy and clock the pause is computed and read on.

    Where the token request goes (``destination``, which may carry a proxy's credentials)
    and the store under the token are left out: neither changes what the API refuses.

    Attributes:
        api: As :attr:`SharingKey.api`.
        identity: A keyed digest of :attr:`SharingKey.identity`, its secret included.
        policy: As :attr:`SharingKey.policy`: how the pauses grow.
        clock: As :attr:`SharingKey.clock`: the clock a pause ends on.
    """

    api: str | None
    identity: str
    policy: RetryPolicy
    clock: Same

    def __repr__(self) -> str:
        return f"<PauseKey {self.api!r}>"


def api_endpoint(url: str | URL | None, *, path: bool = True) -> str | None:
    """The API at ``url``, as sharing tells APIs apart: scheme, host, port and (for a
    transport, whose URL is its API's) path, with no user, query or fragment. The path
    counts where it can: one gateway may front several APIs. An auth object signs requests
    to any path, so its APIs are told apart by origin alone (``path=False``): a token per
    path would cost a token request per resource of a REST API."""
    if url is None:
        return None
    parsed = URL(str(url))
    if not parsed.is_absolute():
        return str(parsed.with_query(None).with_fragment(None))
    return f"{parsed.origin()}{parsed.raw_path if path else ''}"


def _named(source: object) -> str:
    """A source of credentials in a pause key's digest."""
    try:
        return f"{source!r}#{hash(source)}"
    except TypeError:
        return f"{source!r}@{id(source)}"


class SharedTokens:
    """The token managers of a process, by :class:`SharingKey` (see module docstring).

    Args:
        kept: How many managers are kept while their token is usable, with no transport
            left to use them; the least recently asked for goes first.
        paused: How many pauses of managers that are gone are kept; the least recently
            left goes first.
    """

    def __init__(self, kept: int = SHARED_TOKENS_KEPT, paused: int = SHARED_PAUSES_KEPT) -> None:
        self._limit = kept
        self._paused_limit = paused
        self._live: weakref.WeakValueDictionary[SharingKey, TokenManager] = (
            weakref.WeakValueDictionary()
        )
        self._kept: OrderedDict[SharingKey, TokenManager] = OrderedDict()
        self._paused: OrderedDict[PauseKey, Pause] = OrderedDict()
        # What managers leave as they go, put here by their finalizers: at any moment, on
        # any thread, one holding the lock included, so nothing more is done there
        # (deque.append is atomic); taken in under the lock by the next build.
        self._departed: deque[tuple[int, PauseKey, Pause | None]] = deque()
        # The finalizer of the latest manager built for each pause key, while it may run.
        self._leaving: dict[PauseKey, weakref.finalize[..., TokenManager]] = {}
        self._era = 0  # one more at each clear(): what managers built before leave is dropped
        self._lock = threading.Lock()
        _fork.reset_in_child(self)

    def __repr__(self) -> str:
        live, kept, paused = len(self._live), len(self._kept), len(self._paused)
        return f"<SharedTokens live={live} kept={kept} paused={paused}>"

    def __len__(self) -> int:
        """How many managers are held, strongly or by a live transport."""
        return len(self._live)

    def manager(self, key: SharingKey, build: Callable[[], TokenManager]) -> TokenManager:
        """The manager of ``key``: the one transports use already, else ``build()``'s,
        going on from the pause the last one left, if it left one."""
        with self._lock:
            manager = self._live.get(key)
            if manager is None:
                manager = build()
                manager.shared_as = (rejoin, key)
                self._inherit(key.pause_key(), manager)
                self._live[key] = manager
            self._keep(key, manager)
        return manager

    def _inherit(self, pause_key: PauseKey, manager: TokenManager) -> None:
        """Give the new ``manager`` the pause left for ``pause_key``, and have it leave
        its own as it goes, whenever that is."""
        previous = self._leaving.get(pause_key)
        if previous is not None and previous.peek() is None:
            # Its manager is gone, but the collector (on another thread) may not have run
            # its finalizer yet: calling it runs it now unless it ran, once either way.
            previous()
        self._take_in_departed()
        inherited = self._paused.pop(pause_key, None)
        if inherited is not None:
            manager.resume(inherited)
        # Read as the manager goes: one let go while a transport used it learns more
        # before it goes, and its last word is the one that counts.
        finalizer = weakref.finalize(
            manager, _left, self._departed, self._era, pause_key, manager.pause_reader()
        )
        finalizer.atexit = False
        self._leaving[pause_key] = finalizer

    def _take_in_departed(self) -> None:
        paused, departed, leaving = self._paused, self._departed, self._leaving
        while departed:
            era, pause_key, pause = departed.popleft()
            finalizer = leaving.get(pause_key)
            if finalizer is not None and not finalizer.alive:
                del leaving[pause_key]
            if pause is not None and era == self._era:
                paused[pause_key] = pause
                paused.move_to_end(pause_key)
        while len(paused) > self._paused_limit:
            paused.popitem(last=False)

    def _keep(self, key: SharingKey, manager: TokenManager) -> None:
        kept = self._kept
        kept[key] = manager
        kept.move_to_end(key)
        # Tidied when a transport is built, never per request: at most `kept` entries.
        for other_key, other in list(kept.items()):
            if other is not manager and _spent(other):
                del kept[other_key]
        while len(kept) > self._limit:
            kept.popitem(last=False)

    def clear(self) -> None:
        """Forget every manager and pause: transports built from now on fetch tokens anew.

        Transports built before keep the manager they have, and what it learns.
        """
        with self._lock:
            self._live.clear()
            self._kept.clear()
            self._paused.clear()
            self._departed.clear()
            self._leaving.clear()
            self._era += 1

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork


def _left(
    departed: deque[tuple[int, PauseKey, Pause | None]],
    era: int,
    pause_key: PauseKey,
    read: Callable[[], Pause | None],
) -> None:
    """A manager went: what its refusals taught, if anything, for its successor."""
    departed.append((era, pause_key, read()))


def _spent(manager: TokenManager) -> bool:
    try:
        return manager.spent()
    except Exception:  # a user's clock that fails now (a test's, torn down): let it go
        return True


SHARED = SharedTokens()
"""The process's shared tokens."""


def rejoin(key: SharingKey, state: dict[str, Any]) -> TokenManager:
    """A shared manager copied or unpickled: the process's manager of ``key``, or, if it
    has none, one with the copied settings, shared from then on."""

    from .tokens import TokenManager  # loaded here when a copy comes first

    def restored() -> TokenManager:
        manager = TokenManager.__new__(TokenManager)
        manager.__setstate__(state)
        return manager

    return SHARED.manager(key, restored)
