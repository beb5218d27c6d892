"""Credentials from a source that can change: read again when they may have changed, the
last good pair kept when the source fails.

The service replaces a lost or leaked secret with new credentials created in the console;
a long-running process must take them up without a restart. A
:class:`CredentialsSource` says where they are (a mounted file, a secret manager) and how
to notice cheaply that they may have changed (:meth:`CredentialsSource.stamp`).
:class:`RotatingCredentials` reads it when a transport is made, then again:

- every ``check_every`` seconds, as one watcher thread of the process schedules it;
- at each token fetch (see ``_core/rotating_source.py``), which waits for it a bounded
  time;
- at once after the authorization server answered ``invalid_client``, or the service
  refused an API key.

Each read runs on a thread of its own, one at a time per source, never on a request's
path: a read may block, a secret manager's call may take a while, and a source that hangs
holds up no other. A changed stamp must hold still a moment before the source is read.

Whoever holds the credentials listens for a change (:meth:`RotatingCredentials.listen`):
an API key's header is swapped, a token manager renews in the background, keeping the
old credentials' token in use until the new one lands. Reading is I/O done by the
source; nothing here opens a file.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Protocol, TypeAlias, runtime_checkable

from . import fork as _fork
from .credentials import ClientCredentials
from .errors import ConfigurationError
from .events import AuthEvent, Emitter, Subscribers


@runtime_checkable
class CredentialsSource(Protocol):
    """Where credentials that can change are read from: a file, a secret manager...

    Attributes:
        check_every: Seconds between two checks of :meth:`stamp` (and reads, when it
            changed) by the process's watcher thread.
    """

    check_every: float

    def read(self) -> tuple[str, str]:
        """The Client Id and Client Secret now.

        Called on a thread of the package's (never an event loop's), so it may block.
        Raise on failure: the last good credentials stay in use. The exception's message
        must not hold the secret.
        """
        ...

    def stamp(self) -> Hashable | None:
        """A cheap mark that changes whenever :meth:`read` may answer differently (a
        file's inode, size and modification time); ``None`` when there is none, and each
        check reads."""
        ...


SETTLE = 0.5
"""Seconds a changed stamp must hold still before the source is read (see refresh)."""

CALLBACK_CHECK_EVERY = 60.0
"""Seconds between two calls of a credentials callback by the watcher, by default."""


def checked_period(check_every: object) -> float:
    """``check_every`` in seconds, refused unless a finite number above 0."""
    if isinstance(check_every, bool) or not isinstance(check_every, int | float):
        raise ConfigurationError("check_every must be a number of seconds")
    if not check_every > 0 or check_every == float("inf"):
        raise ConfigurationError("check_every must be a finite number of seconds above 0")
    return float(check_every)


class CredentialsCallback:
    """Credentials from a function of yours: a secret manager's client, say.

    Args:
        read: Returns ``(client_id, client_secret)``. Called on a thread of the package's,
            never an event loop's: it may block, but should end within seconds. It may
            raise: the credentials read last stay in use. Its exception's message must
            not hold the secret (only its class is shown).
        check_every: Seconds between two calls by the process's watcher thread (besides
            one at each token fetch, and when the credentials are refused).

    Raises:
        ConfigurationError: ``read`` is not callable; ``check_every`` is no number of
            seconds above 0.
    """

    __slots__ = ("check_every", "read")

    def __init__(
        self,
        read: Callable[[], tuple[str, str]],
        *,
        check_every: float = CALLBACK_CHECK_EVERY,
    ):
        if not callable(read):
            raise ConfigurationError(f"read must be callable, not {type(read).__name__}")
        self.read = read
        self.check_every = checked_period(check_every)

    def __repr__(self) -> str:
        name = getattr(self.read, "__qualname__", type(self.read).__name__)
        return f"CredentialsCallback({name})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CredentialsCallback):
            return NotImplemented
        return (self.read, self.check_every) == (other.read, other.check_every)

    def __hash__(self) -> int:
        return hash((CredentialsCallback, self.read, self.check_every))

    def stamp(self) -> Hashable | None:
        return None


def refused(credentials: Credentials) -> None:
    """The service or the authorization server refused ``credentials``: if they can
    change, the watcher reads them again at once."""
    if isinstance(credentials, RotatingCredentials):
        credentials.check_soon()


def credentials_of(
    client_id: str | None,
    client_secret: str | None,
    credentials: CredentialsGiven | None,
    emit: Emitter | None = None,
) -> ClientCredentials | RotatingCredentials:
    """The credentials a constructor was given: ``client_id`` and ``client_secret``, or a
    source (a bare callable is a :class:`CredentialsCallback`).

    Raises:
        ConfigurationError: both ways given or neither, or the source's first read failed.
    """
    if credentials is None:
        if client_id is None or client_secret is None:
            raise ConfigurationError(
                "give client_id and client_secret, or credentials= (a CredentialsFile, "
                "CredentialsFiles or CredentialsCallback) for credentials that can change"
            )
        return ClientCredentials(client_id, client_secret)
    if client_id is not None or client_secret is not None:
        raise ConfigurationError(
            "give either credentials= or client_id and client_secret, not both"
        )
    if isinstance(credentials, RotatingCredentials):
        credentials = credentials.source
    if not isinstance(credentials, CredentialsSource) and callable(credentials):
        credentials = CredentialsCallback(credentials)
    return _of_source(credentials, emit)


_BY_SOURCE: weakref.WeakValueDictionary[object, RotatingCredentials] = (
    weakref.WeakValueDictionary()
)
_BY_SOURCE_LOCK = threading.Lock()


def _of_source(source: CredentialsSource, emit: Emitter | None) -> RotatingCredentials:
    """The process's credentials of ``source``: one per source (equal sources, one file),
    read and watched once for every transport; ``emit`` hears their events too."""
    try:
        with _BY_SOURCE_LOCK:
            shared = _BY_SOURCE.get(source)
    except TypeError:  # an unhashable source: its own
        return RotatingCredentials(source, emit)
    if shared is None:
        made = RotatingCredentials(source, emit)
        with _BY_SOURCE_LOCK:
            shared = _BY_SOURCE.setdefault(source, made)
    if emit is not None:
        shared.subscribe(emit)
    return shared


def _why(exc: BaseException, source: object) -> str:
    """What a failed read says, without anything that could be the secret: of the
    package's own file sources, a file's error and name and their messages; of anything
    else (a callable's exception may quote what it read), only the class."""
    if not getattr(source, "explains_errors", False):
        return type(exc).__name__
    if isinstance(exc, OSError):
        name = f" ({exc.filename})" if exc.filename else ""
        return f"{type(exc).__name__}: {exc.strerror or 'failed'}{name}"
    if isinstance(exc, ConfigurationError):
        return str(exc)
    return type(exc).__name__


class RotatingCredentials:
    """Credentials read from a :class:`CredentialsSource`: what :class:`ClientCredentials`
    offers, for the pair read last, with a watch on the source.

    ``repr`` shows the Client Id only; ``vars()`` fails (slots), so no secret shows.

    Args:
        source: Where the credentials are read.
        emit: Hears ``credentials_changed`` and ``credentials_source_failed``.

    Raises:
        ConfigurationError: the first read failed; the message says why, never the secret.
    """

    __slots__ = (
        "__weakref__",
        "_emit",
        "_failing",
        "_in_flight",
        "_in_flight_forced",
        "_listeners",
        "_lock",
        "_pair",
        "_source",
        "_stamp",
        "_state",
        "next_check",
    )

    def __init__(self, source: CredentialsSource, emit: Emitter | None = None) -> None:
        check_every = getattr(source, "check_every", None)
        if not callable(getattr(source, "read", None)) or not callable(
            getattr(source, "stamp", None)
        ):
            raise ConfigurationError(
                "credentials must be a CredentialsSource (CredentialsFile, CredentialsFiles, "
                f"CredentialsCallback) or a callable, not {type(source).__name__}"
            )
        if (
            isinstance(check_every, bool)
            or not isinstance(check_every, int | float)
            or not check_every > 0
        ):
            raise ConfigurationError("the credentials source's check_every must be seconds > 0")
        self._source = source
        self._emit = Subscribers()
        if emit is not None:
            self._emit.add(emit)
        #: Held while the source is read (which may block); _state, a moment at a time.
        self._lock = threading.Lock()
        self._state = threading.Lock()
        self._listeners: list[Callable[[], Callable[[], None] | None]] = []
        self._failing = False
        #: The read under way on a thread of its own, if any (see read_soon).
        self._in_flight: Future[bool] | None = None
        self._in_flight_forced = False
        why = ""
        try:
            self._stamp = source.stamp()
            self._pair = _pair(source.read())
        except Exception as exc:
            why = _why(exc, source)
        if why:
            # Raised here, out of the except block: the source's error (a decoder's, a
            # callable's careless message) may hold the secret, and is no context of ours.
            raise ConfigurationError(f"could not read the credentials from {source!r}: {why}")
        #: When the watcher checks the source next (``time.monotonic``).
        self.next_check = time.monotonic() + float(check_every)
        _fork.reset_in_child(self)
        WATCHER.add(self)

    def __repr__(self) -> str:
        return f"RotatingCredentials(client_id={self._pair.client_id!r}, source={self._source!r})"

    def __reduce__(self) -> tuple[object, ...]:
        # A copy reads the source anew, in the process it lands in (or joins the one
        # there of the same source).
        return _of_source, (self._source, None)

    @property
    def source(self) -> CredentialsSource:
        """Where the credentials are read."""
        return self._source

    @property
    def current(self) -> ClientCredentials:
        """The credentials read last (the last good ones when the source fails)."""
        return self._pair

    @property
    def client_id(self) -> str:
        return self._pair.client_id

    @property
    def client_secret(self) -> str:
        return self._pair.client_secret

    def api_key_authorization(self) -> str:
        return self._pair.api_key_authorization()

    def basic_authorization(self) -> str:
        return self._pair.basic_authorization()

    def subscribe(self, emit: Emitter) -> None:
        """Pass the events of these credentials to ``emit``'s hook too, while it lives."""
        self._emit.add(emit)

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each change, for as long as its object lives (a bound
        method is held weakly: a transport that is gone stops listening)."""
        ref: Callable[[], Callable[[], None] | None]
        if hasattr(listener, "__self__") and hasattr(listener, "__func__"):
            ref = weakref.WeakMethod(listener)
        else:
            ref = lambda: listener  # noqa: E731
        with self._state:
            self._listeners.append(ref)

    def refresh(self, *, force: bool = False) -> bool:
        """Read the source if its stamp changed (or ``force``); whether the credentials
        changed. A failed read keeps the last good credentials and says so once, until a
        read succeeds again. Blocks: call it from a thread of the package's own.

        A stamp that changed is taken again a moment later (:data:`SETTLE`, or the
        period if shorter), and the source read once it holds still: a file written in
        place, or two files replaced one after the other, is not read half-way. A forced
        read (after a refusal) reads at once.
        """
        if not force and not self._settled():
            return False
        with self._lock:
            event = self._read()
        changed = event is not None and event.name == "credentials_changed"
        with self._state:
            listeners = [ref() for ref in self._listeners] if changed else []
            self._listeners = [ref for ref in self._listeners if ref() is not None]
        # Told outside the lock: a hook or a listener may read the credentials again. The
        # listeners first: once credentials_changed is logged, the new ones are in use.
        for listener in listeners:
            if listener is not None:
                listener()
        if event is not None:
            self._emit(event)
        return changed

    def check_soon(self) -> None:
        """Have the source read at once, whatever its stamp says (the service refused the
        key: the source may have changed in a way its stamp misses)."""
        self.read_soon(force=True)

    def read_soon(self, *, force: bool = False) -> Future[bool]:
        """:meth:`refresh` on a thread of its own; whether the credentials changed.

        A source that blocks (a secret manager that hangs) holds that thread only, never
        the watcher or a token fetch, which wait for it a bounded time; while it reads,
        callers join that read rather than start another. A forced read asked for while
        a plain one runs (which may read nothing) follows it, on the same thread.
        """
        with self._state:
            running = self._in_flight
            if running is not None and not running.done():
                if not force or self._in_flight_forced:
                    return running
            else:
                running = None
            future: Future[bool] = Future()
            self._in_flight, self._in_flight_forced = future, force

        def read() -> None:
            try:
                if running is not None:
                    running.result()  # one read at a time: this one after it
                future.set_result(self.refresh(force=force))
            except BaseException:  # a listener's bug, or a source's SystemExit
                # Told as a failed read; never printed by the thread's excepthook, whose
                # traceback would show a careless message.
                future.set_result(False)

        threading.Thread(
            target=read, name="gql-service-auth-credentials-read", daemon=True
        ).start()
        return future

    def _settled(self) -> bool:
        """Whether the source is to be read: no stamp, or a stamp that changed and then
        held still for a moment. A stamp that fails is a change: the read says why."""
        try:
            stamp = self._source.stamp()
            if stamp is None:
                return True
            if stamp == self._stamp:
                return False
            time.sleep(min(SETTLE, float(self._source.check_every)))
            return bool(self._source.stamp() == stamp)
        except BaseException:  # told by the read that follows
            return True

    def _read(self) -> AuthEvent | None:
        """Read the source; what to tell of it, if anything. Called with the lock held."""
        before = self._pair
        try:
            stamp = self._source.stamp()
            pair = _pair(self._source.read())
        except BaseException as exc:  # any failure (SystemExit too) keeps the last good pair
            if self._failing:
                return None
            self._failing = True
            return AuthEvent(
                "credentials_source_failed",
                error=type(exc).__name__,
                detail=f"{self._source!r}: {_why(exc, self._source)}; the credentials read "
                f"last (client_id={before.client_id}) stay in use",
            )
        self._failing = False
        self._stamp = stamp
        if pair == before:
            return None
        self._pair = pair
        return AuthEvent(
            "credentials_changed",
            detail=f"{self._source!r}: client_id={pair.client_id}"
            + ("" if pair.client_id != before.client_id else " (a new secret)"),
        )

    def _after_fork_in_child(self) -> None:
        # A reading thread may have held them at the fork; it is not in the child.
        self._lock = threading.Lock()
        self._state = threading.Lock()
        self._in_flight = None


def _pair(read: object) -> ClientCredentials:
    """What a source read, checked as credentials."""
    if isinstance(read, ClientCredentials):
        return read
    if not isinstance(read, tuple) or len(read) != 2:
        raise ConfigurationError(
            "a credentials source must return a (client_id, client_secret) tuple, "
            f"not {type(read).__name__}"
        )
    return ClientCredentials(read[0], read[1])


# Real unions, not strings: typing.get_type_hints() of the public constructors joins them
# with None.
Credentials: TypeAlias = ClientCredentials | RotatingCredentials
"""Credentials given as they are, or read from a source that can change."""

CredentialsGiven: TypeAlias = CredentialsSource | Callable[[], tuple[str, str]]
"""What ``credentials=`` takes: a source, or a callable returning ``(client_id,
client_secret)`` (a :class:`CredentialsCallback`)."""


class _Watcher:
    """The one thread of a process that checks every credentials source on its period.

    It holds the credentials weakly, and ends when none is left; a forked child starts
    its own for the credentials it inherited.
    """

    def __init__(self) -> None:
        self._watched: weakref.WeakSet[RotatingCredentials] = weakref.WeakSet()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        _fork.reset_in_child(self)

    def add(self, credentials: RotatingCredentials) -> None:
        with self._wake:
            self._watched.add(credentials)
            self._start()
            self._wake.notify()  # it may be due before the watcher's next wake-up

    def _start(self) -> None:
        # Called with the condition held.
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="gql-service-auth-credentials", daemon=True
            )
            self._thread.start()

    def _due(self) -> list[RotatingCredentials]:
        """The credentials to check now; waits until some are due, or none is left."""
        with self._wake:
            while True:
                now = time.monotonic()
                due = [c for c in self._watched if c.next_check <= now]
                if due or not self._watched:
                    if not due:
                        self._thread = None  # nothing left to watch: the thread ends
                    return due
                soonest = min((c.next_check for c in self._watched), default=now)
                self._wake.wait(min(max(soonest - now, 0.0), 60.0))

    def _run(self) -> None:
        while due := self._due():
            for credentials in due:
                period = float(credentials.source.check_every)
                credentials.next_check = time.monotonic() + period
                # On a thread of its own: one source that blocks holds up no other.
                credentials.read_soon()
            del due, credentials

    def _after_fork_in_child(self) -> None:
        self._wake = threading.Condition()
        self._thread = None
        # Started once every object of the package has dropped its parent's state (locks
        # held by threads the child does not have): the thread may use them at once.
        _fork.after_reset(self._restart)

    def _restart(self) -> None:
        if self._watched:
            with self._wake:
                self._start()


WATCHER = _Watcher()


CredentialsSource.__module__ = "gql_service_auth"
CredentialsCallback.__module__ = "gql_service_auth"
