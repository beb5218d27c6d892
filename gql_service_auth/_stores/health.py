"""The health of each shared token store a process uses, shared by its transports.

A store that fails is left alone for its ``cooldown`` by every transport on it (see
``level.py``), after one ``token_store_failed`` event; and it counts as not shared, in the
store.sharing gauge, from a failed call until a call succeeds.
"""

from __future__ import annotations

import itertools
import threading
import weakref

from .._core import fork as _fork
from .._core.telemetry import NAMESPACE, Reading, class_name, observe
from .protocol import TokenStore

# Numbers of store failures, one counter for the process: next() on it is atomic, and a
# Health holds only plain values, so a transport copied or pickled with its store copies
# it (itertools objects warn when copied on Python 3.12 and 3.13, and cannot be from 3.14).
_FAILURE_NUMBERS = itertools.count(1)


class Health:
    """Whether a store is resting after a failure: one per store, shared by its transports.

    Attributes:
        rest_until: ``time.monotonic()`` until which the store is left alone: the
            cool-down is in real time.
        error: The class name of the last failure, until a fetch through the store
            succeeds with no call of it failing: the token in hand was not shared until
            then (the store is asked once per token lifetime, so longer than it rests).
        failures: The number of the latest failure, by which a fetch tells whether one
            of its calls failed (another transport's may have too: the store stays
            unshared); drawn from the process's counter, so that failures on two threads
            at once both change it.
        location: The store as events and the store.sharing gauge name it.
    """

    __slots__ = ("error", "failures", "location", "rest_until")

    def __init__(self, location: str) -> None:
        self.rest_until = 0.0
        self.error: str | None = None
        self.failures = 0
        self.location = location

    def failed(self, error: str) -> None:
        """Note a failure of the store, of class ``error``."""
        self.error, self.failures = error, next(_FAILURE_NUMBERS)


class Healths:
    """The health of each store in use, so that its transports learn of an outage once."""

    def __init__(self) -> None:
        self._by_store: weakref.WeakKeyDictionary[object, Health] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        _fork.reset_in_child(self)

    def of(self, store: TokenStore) -> Health:
        with self._lock:
            try:
                health = self._by_store.get(store)
                if health is None:
                    health = self._by_store[store] = Health(_location(store))
            except TypeError:  # a store that cannot be weakly referenced rests on its own
                health = Health(_location(store))
        return health

    def readings(self) -> list[Reading]:
        """The store.sharing gauge: 1 per store in use, 0 with the failure's class name
        per store whose last call failed (its transports fetch their own tokens)."""
        with self._lock:
            healths = list(self._by_store.items())
        points: list[Reading] = []
        for store, health in healths:
            if getattr(store, "closed", False):
                continue  # closed on purpose: no longer a store in use
            attributes: dict[str, str | int] = {f"{NAMESPACE}.store": health.location}
            if health.error is None:
                points.append((1.0, attributes))
            else:
                attributes["error.type"] = class_name(health.error)
                points.append((0.0, attributes))
        return points

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork


HEALTHS = Healths()
observe("store.sharing", HEALTHS.readings)


def _location(store: TokenStore) -> str:
    """How events and metrics name ``store``: for Redis, its URL with no password."""
    return str(getattr(store, "location", None) or type(store).__name__)
