"""Resetting process-local state in the child of a ``fork()``.

gunicorn with ``--preload``, multiprocessing's fork start method and Celery's prefork pool
copy a process with whatever it held: a token fetch in flight on a thread that does not
exist in the child, a lock another thread held, aiohttp sessions whose sockets the parent
still uses. Objects that hold such state register here and drop it in the child, as
redis-py's connection pools do.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

_T = TypeVar("_T")


class ForkAware(Protocol):
    """An object that drops its process-local state in a forked child."""

    def _after_fork_in_child(self) -> None: ...


_registered: weakref.WeakSet[ForkAware] = weakref.WeakSet()

# What a forked child inherited and must neither use nor close: sockets and threads of the
# parent (aiohttp connectors, a Redis client and its loop thread). Their sockets are
# registered in an epoll instance parent and child share, so closing them in the child
# would unregister them for the parent too. They stay referenced, unused, for the child's
# life.
_orphans: list[object] = []


def keep_orphan(obj: object) -> None:
    """Keep ``obj``, inherited from the parent, referenced and untouched in this child."""
    _orphans.append(obj)


def reset_in_child(obj: ForkAware) -> None:
    """Call ``obj._after_fork_in_child()`` in the child of every later ``fork()``."""
    _registered.add(obj)


_then: list[Callable[[], None]] = []


def after_reset(call: Callable[[], None]) -> None:
    """Call ``call()`` in this child once every registered object has reset itself: a
    thread started then finds no lock held by a thread the child does not have."""
    _then.append(call)


def _after_fork_in_child() -> None:
    # Only the forking thread exists here, so nothing else touches these objects now.
    for obj in list(_registered):
        obj._after_fork_in_child()
    calls = _then[:]
    _then.clear()
    for call in calls:
        call()


if hasattr(os, "register_at_fork"):  # pragma: no branch - absent only on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)


_IMPORTERS: set[Callable[[], Any]] = set()
_IMPORTERS_LOCK = threading.Lock()


def imported(importer: Callable[[], _T]) -> _T:
    """``importer()``, which imports modules the package loads on first use (aiohttp for
    the first token fetch, the token machinery for the first OAuth2 transport).

    A process that forks while another thread runs such an import would leave the child a
    half-initialised module whose lock no thread there releases: the child's own first use
    would wait forever. So from the first call on, a fork first runs ``importer`` too
    (``os.register_at_fork``): importing a module another thread is importing waits for it.
    """
    if importer not in _IMPORTERS:
        with _IMPORTERS_LOCK:
            if importer not in _IMPORTERS and hasattr(os, "register_at_fork"):
                os.register_at_fork(before=importer)
            _IMPORTERS.add(importer)
    return importer()


class DropsClientInChild:
    """A gql transport whose HTTP client (``_client_attribute``) a forked child leaves to
    its parent: its pooled connections are the parent's sockets. A connected transport is
    connected anew in the child, so a session opened before the fork goes on working."""

    _client_attribute = "session"

    def _forget_client_in_children(self) -> None:
        reset_in_child(self)

    def _after_fork_in_child(self) -> None:
        client = getattr(self, self._client_attribute, None)
        if client is not None:
            keep_orphan(client)
            setattr(self, self._client_attribute, None)
            self._connect_in_child()

    def _connect_in_child(self) -> None:
        self.connect()  # type: ignore[attr-defined]  # gql's sync connect

    # pickle and copy.deepcopy copy the settings, and the copy connects anew, as the aiohttp
    # transports' do: an HTTP client holds sockets and locks (httpx's cannot be copied at
    # all). The last answer's headers, which may quote a credential, are no part of
    # __dict__: the transports hold them in a slot.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state[self._client_attribute] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        reset_in_child(self)
