"""The SQLite database of the local token store (``local.py``): files, clocks, operations.

Blocking, and used on the store's own thread only. It knows no encryption: it keeps what
``local.py`` sealed, under the tag ``local.py`` derived, and answers each operation of the
token store protocol with the semantics of the Redis store's scripts (``redis_scripts.py``),
each in one short transaction (``BEGIN IMMEDIATE`` for writes, so a write is atomic).

Each entry keeps the seconds it had left when written, and the wall time, the monotonic
time and the boot of the write (:func:`_left` says how its age follows from them).

fork(). SQLite keeps the locks its connections hold on a file in the process's memory,
shared by every connection to that file, and a child inherits that memory but not the
locks. A child forked while a store's thread is inside a SQLite call would take its own
connection's locks for held ones, and never write again (seen: 6 to 9 forks in 100 under
constant writes). So each call holds its database's ``gate``, and a fork waits for every
gate, up to :data:`FORK_WAIT`. A child forked while a call went on past that does not use
SQLite at all: its stores fail, and it fetches its own tokens.
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

_T = TypeVar("_T")

DATABASE = "tokens-v1.sqlite3"
"""The database's file name in the store's directory. A later schema takes another name, so
that two versions running side by side (a rolling deploy) each keep their own file, rather
than each replacing the other's."""

FORK_WAIT = 1.0
"""Seconds a fork() waits for the SQLite calls under way in the process (see above)."""

_SIDE_FILES = ("-journal", "-wal", "-shm")
_APPLICATION_ID = 0x67736131  # "gsa1" in SQLite's header: a database of this store
_SCHEMA_VERSION = 1
_SCHEMA = """CREATE TABLE entries (
  tag TEXT NOT NULL, kind TEXT NOT NULL, owner TEXT, value TEXT, fp TEXT, life REAL,
  replaces TEXT, ttl REAL, wall REAL, mono REAL, boot TEXT, PRIMARY KEY (tag, kind)
) WITHOUT ROWID"""
_COLUMNS = "owner, value, fp, life, replaces, ttl, wall, mono, boot"

MAX_TTL = 366 * 24 * 3600.0
"""The longest an entry is kept, whatever a token's ``expires_in``: a year."""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            return file.read(64).strip()
    except (OSError, ValueError):
        return ""  # not Linux: the wall clock alone tells an entry's age


_BOOT = _boot_id()


class _Now(NamedTuple):
    wall: float
    mono: float
    boot: str


def _now() -> _Now:
    return _Now(time.time(), time.monotonic(), _BOOT)


def _left(row: tuple[Any, ...], now: _Now) -> float:
    """Seconds an entry (a row of ``_COLUMNS``) has left; 0 or less: expired, or damaged.

    Its age is the larger of the wall time and the monotonic time elapsed since its write.
    The monotonic clock (CLOCK_MONOTONIC: one for the whole system on Linux and macOS, and
    deaf to settings of the clock) counts within one known boot only, and only forwards;
    the wall clock may have been set back or forward. Taking the larger, a reboot or a
    setting of the clock can make an entry look older, never younger. When the wall clock
    says the write lies ahead and the monotonic one cannot say, the entry is expired.
    """
    try:
        ttl, wall, mono, boot = float(row[5]), float(row[6]), float(row[7]), row[8]
    except (TypeError, ValueError):
        return 0.0
    elapsed = now.wall - wall
    if boot and boot == now.boot and now.mono >= mono:
        elapsed = max(elapsed, now.mono - mono)
    elif elapsed < 0:
        return 0.0
    left = ttl - elapsed
    return left if math.isfinite(left) else 0.0


class _NotOurs(sqlite3.DatabaseError):
    """A database, but not one of this store (another program's, or another schema)."""


def _damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` says the file is no database at all (not busy, not I/O)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if isinstance(code, int):
        return code & 0xFF in (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB
    return type(exc) is sqlite3.DatabaseError  # what sqlite3 raises for those two


def _refuse_shared(path: str, status: os.stat_result, what: str, advice: str) -> None:
    if not hasattr(os, "getuid"):  # pragma: no cover - Windows: no POSIX modes
        return
    if stat.S_ISLNK(status.st_mode):
        raise PermissionError(f"the token store {what} {path} is a symbolic link: {advice}")
    if status.st_uid != os.getuid():
        raise PermissionError(
            f"the token store {what} {path} belongs to another user (uid {status.st_uid}): "
            f"{advice}"
        )
    if status.st_mode & 0o077:
        raise PermissionError(
            f"the token store {what} {path} is accessible to other users "
            f"(mode {stat.S_IMODE(status.st_mode):04o}): {advice}"
        )


_call = threading.local()
"""The call under way on this thread (its store's thread): ``started``, told when it holds
SQLite's write lock, so that the wait for the lock, behind other processes' writes,
counts as its wait for a turn, not as the call (see ``Database.run``)."""


@contextlib.contextmanager
def _writing(connection: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, holding SQLite's write lock from its start."""
    connection.execute("BEGIN IMMEDIATE")
    started = getattr(_call, "started", None)
    if started is not None:
        started()
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        # A COMMIT that found readers past the busy timeout leaves the transaction open.
        if connection.in_transaction:
            connection.rollback()
        raise


def _get(connection: sqlite3.Connection, tag: str, kind: str) -> tuple[Any, ...] | None:
    # fetchall: a statement stepped to its end releases its read lock at once.
    rows = connection.execute(
        f"SELECT {_COLUMNS} FROM entries WHERE tag = ? AND kind = ?", (tag, kind)
    ).fetchall()
    return tuple(rows[0]) if rows else None


def _put(connection: sqlite3.Connection, tag: str, kind: str, ttl: float, **fields: Any) -> None:
    names = ("owner", "value", "fp", "life", "replaces")
    connection.execute(
        f"INSERT OR REPLACE INTO entries (tag, kind, {', '.join(names)}, ttl, wall, mono, "
        "boot) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (tag, kind, *(fields.get(name) for name in names), ttl, *_now()),
    )


# The operations: each is one transaction, on the entries of one identity's tag.


def read_token(connection: sqlite3.Connection, tag: str) -> tuple[Any, Any, Any, float] | None:
    """The sealed value, lifetime, sealed ``replaces`` and seconds left of a live token."""
    row = _get(connection, tag, "token")
    left = 0.0 if row is None else _left(row, _now())
    return None if row is None or left <= 0 else (row[1], row[3], row[4], left)


def save_token(connection: sqlite3.Connection, tag: str, ttl: float, **fields: Any) -> bool:
    """Store a token unless the stored one lives longer (a fetch that lands late)."""
    with _writing(connection):
        stored = _get(connection, tag, "token")
        if stored is not None and _left(stored, _now()) >= ttl:
            return False
        _put(connection, tag, "token", ttl, **fields)
        return True


def discard_token(connection: sqlite3.Connection, tag: str, fingerprint: str) -> bool:
    """Delete the stored token if it has this fingerprint (compare-and-delete)."""
    with _writing(connection):
        deleted = connection.execute(
            "DELETE FROM entries WHERE tag = ? AND kind = 'token' AND fp = ?", (tag, fingerprint)
        )
        return deleted.rowcount > 0


def _holder(row: tuple[Any, ...] | None, owner: str) -> str | None:
    """Who holds a lock entry, unless it is free (absent, expired, damaged) or ``owner``'s."""
    if row is None or not isinstance(row[0], str) or row[0] == owner or _left(row, _now()) <= 0:
        return None
    return row[0]


def take_lock(connection: sqlite3.Connection, tag: str, owner: str, ttl: float) -> str | None:
    """Take the lock if free, expired or damaged, extend it if ``owner``'s; else its holder."""
    # Read first: waiters poll every few tens of milliseconds, without the write lock.
    holder = _holder(_get(connection, tag, "lock"), owner)
    if holder is not None:
        return holder
    with _writing(connection):
        holder = _holder(_get(connection, tag, "lock"), owner)
        if holder is None:
            _put(connection, tag, "lock", ttl, owner=owner)
        return holder


def release_lock(
    connection: sqlite3.Connection, tag: str, owner: str, failure: str | None, ttl: float
) -> None:
    """Release the lock if ``owner`` holds it; keep ``failure`` (sealed) ``ttl`` seconds."""
    with _writing(connection):
        connection.execute(
            "DELETE FROM entries WHERE tag = ? AND kind = 'lock' AND owner = ?", (tag, owner)
        )
        if failure is not None:
            _put(connection, tag, "failed", ttl, owner=owner, value=failure)


def read_failure(connection: sqlite3.Connection, tag: str, owner: str) -> Any:
    """The sealed failure ``owner`` released the lock with, if still kept; else ``None``."""
    row = _get(connection, tag, "failed")
    if row is None or row[0] != owner or _left(row, _now()) <= 0:
        return None
    return row[1]


def note_refusal(
    connection: sqlite3.Connection, tag: str, kind: str, sealed: str, ttl: float
) -> None:
    """Keep a refusal of the credentials (sealed) ``ttl`` seconds, for the fleet; ``kind``
    names the secret refused (``refused:<mark>``): a ``store_key`` gives every secret of a
    client id one tag."""
    with _writing(connection):
        _put(connection, tag, kind, ttl, value=sealed)


def admit(
    connection: sqlite3.Connection, tag: str, kind: str, window: float | None
) -> tuple[tuple[Any, float] | None, tuple[int, float] | None]:
    """The sealed refusal of ``kind`` kept and its seconds left; else, with a ``window``,
    one more token request counted (see :func:`_spend`). ``None`` for what does not
    apply."""
    row = _get(connection, tag, kind)
    left = 0.0 if row is None else _left(row, _now())
    if row is not None and left > 0:
        return (row[1], left), None
    return None, (None if window is None else _spend(connection, tag, window))


def _spend(connection: sqlite3.Connection, tag: str, window: float) -> tuple[int, float]:
    """Count one token request in the current window (one starts with the first request
    after the last ended); the requests counted in it, and its seconds left."""
    with _writing(connection):
        row = _get(connection, tag, "spent")
        left = 0.0 if row is None else _left(row, _now())
        try:
            count = int(row[0]) + 1 if row is not None and left > 0 else 1
        except (TypeError, ValueError):  # a damaged entry: a new window
            count = 1
        if count == 1:
            _put(connection, tag, "spent", window, owner="1")
            return 1, window
        connection.execute(
            "UPDATE entries SET owner = ? WHERE tag = ? AND kind = 'spent'", (str(count), tag)
        )
        return count, left


def _prepare(connection: sqlite3.Connection) -> None:
    """Check that the database is this store's, making an empty one so.

    Raises:
        _NotOurs: another program's database, or another schema.
        sqlite3.DatabaseError: no database at all (SQLITE_NOTADB, SQLITE_CORRUPT).
    """

    def marks() -> tuple[Any, ...]:
        return tuple(
            connection.execute(f"PRAGMA {name}").fetchall()[0][0]
            for name in ("application_id", "user_version")
        )

    if marks() == (_APPLICATION_ID, _SCHEMA_VERSION):
        return
    with _writing(connection):  # one process makes it; the others find it made
        found = marks()
        if found == (_APPLICATION_ID, _SCHEMA_VERSION):
            return
        tables = connection.execute("SELECT count(*) FROM sqlite_master").fetchall()[0][0]
        if found != (0, 0) or tables:
            raise _NotOurs(
                "it is a database of another program, or of another version of "
                "gql-service-auth, and is left as it is: give the store a directory of its own"
            )
        connection.execute(_SCHEMA)
        connection.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
        connection.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")


class Database:
    """The SQLite connection of a store and the checks of its files; on its thread only.

    Args:
        directory: The store's directory, absolute.
        busy: SQLite's busy timeout, in seconds: below the store's ``connect_timeout``,
            which bounds a call's wait for its turn.
    """

    def __init__(self, directory: str, busy: float) -> None:
        self.directory = directory
        self.path = os.path.join(directory, DATABASE)
        self.busy = busy
        self.connection: sqlite3.Connection | None = None
        self.opened: tuple[int, int] | None = None  # (device, inode) of its file
        self.gate = threading.Lock()  # held by each call, and by a fork (see above)
        _gated.add(self)

    def __repr__(self) -> str:
        return f"<database {self.path!r} open={self.connection is not None}>"

    def close(self) -> None:
        with self.gate:
            self._close()

    def _close(self) -> None:
        connection, self.connection, self.opened = self.connection, None, None
        if connection is not None:
            connection.close()

    def run(
        self, work: Callable[[sqlite3.Connection], _T], started: Callable[[], None] | None = None
    ) -> _T:
        """``work(connection)`` on the database, opened or reopened as needed.

        ``started`` is called once ``work`` holds the write lock, or once it is done if it
        needs none: a wait for the lock behind other processes is a wait for a turn.

        Raises:
            PermissionError: the directory or the file is not private to this user.
            sqlite3.DatabaseError: the file was no database at all, and was replaced by an
                empty one; it is another program's or schema's database, left alone; or
                SQLite's own error (a lock held past the busy timeout).
            RuntimeError: this process was forked during a SQLite call (see above).
        """
        with self.gate:
            if _forked_mid_call:
                raise RuntimeError(
                    "this process was forked while a SQLite call of a token store went on, "
                    "which leaves SQLite's locks unusable in it: it fetches its own tokens"
                )
            found = self._checked()
            _call.started = started
            try:
                answer = work(self._connection(found))
                if started is not None:
                    started()
                return answer
            except _NotOurs as exc:
                raise sqlite3.DatabaseError(f"the token store file {self.path}: {exc}") from None
            except sqlite3.DatabaseError as exc:
                if not _damaged(exc):
                    raise
                self._replace(found)
                raise sqlite3.DatabaseError(
                    f"the token store file {self.path} was not a database ({exc}): it was "
                    "replaced by an empty one"
                ) from None
            finally:
                _call.started = None

    def _checked(self) -> tuple[int, int]:
        """Make what is missing, refuse what others may use; the file's (device, inode)."""
        advice = "use a directory of your own; it is created with mode 0700"
        try:
            link = os.lstat(self.directory)
        except FileNotFoundError:
            _make_directories(self.directory)
            link = os.lstat(self.directory)
        if stat.S_ISLNK(link.st_mode) and hasattr(os, "getuid") and link.st_uid != os.getuid():
            # A link of the user's own to a directory of theirs will do; not another user's.
            raise PermissionError(
                f"the token store directory {self.directory} is a symbolic link another user "
                f"made (uid {link.st_uid}): {advice}"
            )
        status = os.stat(self.directory)
        if not stat.S_ISDIR(status.st_mode):
            raise NotADirectoryError(
                f"the token store path {self.directory} is not a directory: give it a "
                "directory of its own"
            )
        _refuse_shared(self.directory, status, "directory", advice)
        try:
            status = os.lstat(self.path)
        except FileNotFoundError:
            # Made here, not by SQLite, which would take its mode from the umask.
            with contextlib.suppress(FileExistsError):  # another process was first
                flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                os.close(os.open(self.path, flags, 0o600))
            status = os.lstat(self.path)
        _refuse_shared(self.path, status, "database", "remove it; it is made with mode 0600")
        return status.st_dev, status.st_ino

    def _connection(self, found: tuple[int, int]) -> sqlite3.Connection:
        if self.connection is not None and found == self.opened:
            return self.connection
        # Its file was replaced (or this is the first call): writes must not go on into
        # a file no other process reads.
        self._close()
        connection = sqlite3.connect(self.path, timeout=self.busy, isolation_level=None)
        try:
            # A power cut may lose the last write, or damage the file, which is then
            # replaced: a token request, for fewer syncs within each call's bound.
            connection.execute("PRAGMA synchronous = NORMAL")
            _prepare(connection)
        except BaseException:
            connection.close()
            raise
        self.connection, self.opened = connection, found
        return connection

    def _replace(self, damaged: tuple[int, int]) -> None:
        """Put an empty database in place of the ``damaged`` file, unless another process
        did so already: made aside, synced, then renamed over it (atomic), under a lock on
        the directory, so that two processes that found it damaged replace it once."""
        self._close()
        handle, temporary = tempfile.mkstemp(prefix=".tokens-", suffix=".tmp", dir=self.directory)
        try:
            fresh = sqlite3.connect(temporary, isolation_level=None)
            try:
                _prepare(fresh)
            finally:
                fresh.close()
            os.fsync(handle)
            with _locked(self.directory, self.busy) as directory:
                try:
                    status = os.lstat(self.path)
                except FileNotFoundError:
                    return  # gone: the next call makes it
                if (status.st_dev, status.st_ino) != damaged:
                    return  # another process replaced it already
                # A journal left next to the damaged file would be played into the new one.
                for suffix in _SIDE_FILES:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.path + suffix)
                os.replace(temporary, self.path)
                with contextlib.suppress(OSError):
                    os.fsync(directory)
        finally:
            os.close(handle)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)


def _make_directories(path: str) -> None:
    """Make ``path`` and its missing parents, each with mode 0700 (``os.makedirs`` gives
    the parents the umask's mode)."""
    missing: list[str] = []
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process was first
            os.mkdir(directory, 0o700)


@contextlib.contextmanager
def _locked(directory: str, wait: float) -> Iterator[int]:
    """The directory open, and locked against the other processes' replacements (flock:
    released by the kernel if its holder dies), for up to ``wait`` seconds; unlocked
    where the file system has no such locks."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        deadline = time.monotonic() + wait
        while fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the token store {directory} stayed locked") from None
                time.sleep(0.01)
            except OSError:
                break  # no locks here (some network file systems): the rename is atomic
        yield handle
    finally:
        os.close(handle)  # releases the lock


# fork(): see the module docstring.

_gated: weakref.WeakSet[Database] = weakref.WeakSet()
_held: list[threading.Lock] = []
_missed: list[Database] = []  # whose call went on past FORK_WAIT
_forked_mid_call = False


def _before_fork() -> None:
    if _forked_mid_call:
        return  # this process uses no SQLite: nothing to wait for
    deadline = time.monotonic() + FORK_WAIT
    for database in list(_gated):
        if database.gate.acquire(timeout=max(0.0, deadline - time.monotonic())):
            _held.append(database.gate)
        else:
            _missed.append(database)


def _after_fork_in_parent() -> None:
    while _held:
        _held.pop().release()
    _missed.clear()


def _after_fork_in_child() -> None:
    global _forked_mid_call
    if _missed:
        _forked_mid_call = True
        for database in _missed:
            # Held by a thread the child does not have: a lock of its own, or every
            # later fork here would wait for it.
            database.gate = threading.Lock()
    _after_fork_in_parent()


if hasattr(os, "register_at_fork"):  # pragma: no branch - absent only on Windows
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
