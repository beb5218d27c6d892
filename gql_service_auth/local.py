"""Share access tokens between the processes of one host, through a directory: no server.

Needs the ``[local]`` extra: ``pip install 'gql-service-auth[local]'``.

>>> store = LocalTokenStore("/var/lib/myapp/tokens")  # doctest: +SKIP
>>> transport = OAuth2Transport(url, token_url=..., ..., token_store=store)  # doctest: +SKIP

or ``SERVICE_TOKEN_STORE_URL=file:///var/lib/myapp/tokens`` for ``from_env()``. It serves
the processes of one user on one host (cron runs, gunicorn, uvicorn or Celery workers) as
:mod:`gql_service_auth.redis` serves a fleet, with the same guarantees, from one SQLite
database (the standard library's ``sqlite3``), ``tokens-v1.sqlite3`` in the directory:

- Each operation is one short transaction (``BEGIN IMMEDIATE`` for writes), atomic: a
  process killed mid-write leaves the previous state. A write keeps whichever token expires
  later; a refused token is deleted only while it is the stored one (by fingerprint); the
  fetch lock has an owner and a time to live its owner extends, so a holder killed mid-fetch
  costs the others the lock's time to live at most; a failed fetch's reason is kept 5 s.
- Nothing on disk names the credentials or holds a token in the clear: entries are named by
  an HMAC tag and sealed with AES-GCM as in Redis (``_stores/sealed.py``).
- Private: the directory (and any missing parent) is created with mode 0700 and the
  database with 0600 (SQLite gives its journal the database's mode). A directory or database
  another user owns, or that group or others may access, a database that is a symbolic
  link, or a directory that is another user's link, is refused when used: the process
  fetches its token itself, after a ``token_store_failed`` event that says what to do.
- SQLite calls block: they run one at a time on a daemon thread of the store's own, never on
  a caller's event loop, each bounded by ``timeout`` once it runs and holds SQLite's write
  lock, and by ``connect_timeout`` until then (SQLite's busy timeout is below it). A
  forked child opens a connection of its own. A ``fork()`` waits for the SQLite call under
  way, if any (1 s at most): SQLite's locks are not inherited, but its memory of them is.
  A child forked while a call went on past that does not use the store.
- A file that is no database at all (damaged) fails the call under way, and is replaced at
  once, atomically, by an empty database; damaged or undecryptable entries read as absent. A
  connection whose file was replaced reopens. A database of another program, or of another
  schema, is left alone and the store fails: a later schema takes another file name, so
  versions running side by side (a rolling deploy) each keep their own file.

Expiry. Redis times every entry by its one clock; here each process reads its host's wall
clock, which may be set back or forward. So an entry keeps the seconds it had left when
written, with the wall time, the ``time.monotonic()`` and the boot (Linux's ``boot_id``) of
the write. Its age is the larger of the wall time and the monotonic time elapsed, the latter
within the same boot only, and only forwards: CLOCK_MONOTONIC is one clock for the whole
system, which no setting of the clock moves. An entry whose wall time lies ahead, with no
monotonic time to go by, is expired. So a reboot or a setting of the clock can make an entry
look older, never younger: it costs a token request, never a token sent past its expiry.
Where no boot identity is known (not Linux), the wall clock alone counts, as Redis's does.

Network file systems. SQLite's locking relies on the file system's POSIX locks, which many
NFS and SMB setups do not honour: processes on two hosts may then write at once and damage
the database (the store then replaces it, at the cost of token requests). Use a local
directory on each host, or Redis for many hosts. WAL mode is not used: it needs memory
shared through a file, which a network file system does not share either.
"""

from __future__ import annotations

try:
    from ._stores.sealed import Hidden, Sealer  # cryptography
except ImportError as exc:  # pragma: no cover - the extra is installed for the tests
    raise ImportError(
        "gql_service_auth.local needs the local extra: pip install 'gql-service-auth[local]'"
    ) from exc

import asyncio
import json
import math
import os
import sqlite3
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from ._core import fork as _fork
from ._core.config import shown_url
from ._core.constants import STORE_CONNECT_TIMEOUT, STORE_COOLDOWN, STORE_TIMEOUT
from ._core.errors import ConfigurationError
from ._core.loop_thread import LoopClosed, LoopThread
from ._stores import local_db as db
from ._stores.protocol import (
    Remembered,
    StoredToken,
    StoreOnItsThread,
    StoresByUrl,
    Timeouts,
    TokenIdentity,
    Turn,
    call_on_thread,
    checked_seconds,
)

__all__ = ["LocalTokenStore"]

_T = TypeVar("_T")

_FAILURE_TTL = 5.0
"""How long a failed fetch's reason is kept for its waiters, who poll every 80 ms at most."""

_BUSY_SHARE = 0.8
"""SQLite's busy timeout, as a share of the store's ``connect_timeout``: a write lock held
elsewhere past it ends the call in SQLite's own error, within the caller's bound. The wait
for the lock is a wait for a turn, behind other processes' writes: 64 processes starting
together on a busy host wait in that queue longer than one call's ``timeout``."""


def _aad(tag: str, kind: str) -> bytes:
    """What a sealed value is bound to: its identity and its kind of entry."""
    return f"gql-service-auth:local:{tag}:{kind}".encode()


def _refused(sealer: Sealer, identity: TokenIdentity) -> str:
    """The kind of entry of a refusal of ``identity``'s secret: with ``store_key``, the
    secrets of a client id share a tag, and one's refusal is no other's."""
    return "refused:" + sealer.fingerprint(identity.client_secret)[:16]


class _Running:
    """What a store runs on: its thread, and the database used there."""

    def __init__(self, directory: str, busy: float) -> None:
        self.database = db.Database(directory, busy)
        self.failed: Exception | None = None
        self.loop = LoopThread("gql-service-auth-local", self._close)

    def __repr__(self) -> str:
        return f"<running {self.loop!r}>"

    async def ready(self) -> None:
        """Open the database (checked, made if missing), if it is not open. On the loop.

        A failure is kept for the next call to report (:meth:`unreported`), even once the
        next opening succeeds: a file found damaged and replaced by :meth:`prepare`, in
        the background, is still said once, by the first call.
        """
        if self.database.connection is None:
            try:
                self.database.run(_nothing)
            except Exception as exc:
                self.failed = exc
                raise

    def unreported(self) -> None:
        """Raise the failure of an opening that no call has reported yet."""
        failed, self.failed = self.failed, None
        if failed is not None:
            raise failed

    async def _close(self) -> None:
        self.database.close()


def _nothing(connection: sqlite3.Connection) -> None:
    return None


def _directory_of(url: str) -> str:
    """The directory a ``file://`` URL names; ConfigurationError for any other URL, which
    quotes it (a password in it masked)."""
    example = "file:///var/lib/myapp/tokens"
    if not isinstance(url, str) or not url.startswith("file://"):
        raise ConfigurationError(
            f"{shown_url(url)} is no local token store URL: it starts with file:// and names "
            f"a directory by its absolute path, as {example}"
        )
    parts = urlsplit(url)
    path = unquote(parts.path)
    if parts.netloc.lower() not in ("", "localhost"):
        raise ConfigurationError(
            f"{shown_url(url)} names the host {parts.hostname or parts.netloc!r}, not a "
            f"directory: a local token store URL has three slashes, then the directory's "
            f"absolute path ({example})"
        )
    if parts.query or parts.fragment:
        raise ConfigurationError(
            f"{shown_url(url)} has a query or a fragment, which a local token store URL "
            f"has not: {example}"
        )
    if not path.startswith("/") or "\0" in path:
        raise ConfigurationError(
            f"{shown_url(url)} names no absolute path: {example} (three slashes)"
        )
    if path.lstrip("/").startswith("~"):
        raise ConfigurationError(
            f"{shown_url(url)}: a file:// URL does not expand ~: name the directory by its "
            "absolute path, as file:///home/me/.cache/myapp/tokens"
        )
    # normpath keeps a leading "//" (POSIX leaves its meaning open): one "/" here.
    return os.path.normpath("/" + path.lstrip("/"))


class LocalTokenStore(StoreOnItsThread):
    """A :class:`~gql_service_auth.TokenStore` in a directory, for the processes of one host.

    Give it to :class:`~gql_service_auth.OAuth2Transport` as ``token_store=``; one store
    may serve many transports, even with different credentials. It is used only when a
    process needs a new token, never per request. Its SQLite calls run on a thread of its
    own, one at a time, so no caller's event loop ever waits on the disk; a forked child
    opens a connection of its own. See the module docstring for what it keeps, and why
    not on a network file system.

    Args:
        path: The directory (``str`` or path-like): made with mode 0700 if missing, and
            refused when used if another user owns it or others may access it.
        store_key: Key material for the entries' names and the encryption (at least 16
            bytes), in place of the client secret: processes that share it share tokens
            whatever client secret each holds (a secret being rotated). ``None`` derives
            the keys from the client secret.
        timeout: Seconds each call may take once it runs; past it, the process fetches
            its token itself.
        connect_timeout: Seconds a call may wait to run: for the database to be opened
            and for the calls before it (a burst of tenants) to be done.
        cooldown: Seconds the store is left alone after a failed or slow call.

    Raises:
        ConfigurationError: a bad argument.
    """

    _running: _Running

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        store_key: bytes | str | None = None,
        timeout: float = STORE_TIMEOUT,
        connect_timeout: float = STORE_CONNECT_TIMEOUT,
        cooldown: float = STORE_COOLDOWN,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ConfigurationError("path must be a directory, as a str or a path-like")
        directory = os.path.abspath(os.fspath(path))
        if not isinstance(directory, str) or "\0" in directory:
            raise ConfigurationError("path must be a directory, as a str or a path-like")
        if isinstance(store_key, str):
            store_key = store_key.encode()
        if store_key is not None and (not isinstance(store_key, bytes) or len(store_key) < 16):
            raise ConfigurationError("store_key must be bytes or str of at least 16 bytes")
        bounds = checked_seconds(
            timeout=timeout, connect_timeout=connect_timeout, cooldown=cooldown
        )
        self._directory = directory
        self._store_key = Hidden(store_key)
        self._timeout = bounds["timeout"]
        self._connect_timeout = bounds["connect_timeout"]
        self._cooldown = bounds["cooldown"]
        self._location = Path(directory).as_uri()
        self._shared_url: str | None = None
        self._sealers: Remembered[Sealer] = Remembered(self._derive_sealer)
        self._closed = False
        self._start()
        _fork.reset_in_child(self)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        store_key: bytes | str | None = None,
        timeout: float = STORE_TIMEOUT,
        connect_timeout: float = STORE_CONNECT_TIMEOUT,
        cooldown: float = STORE_COOLDOWN,
    ) -> LocalTokenStore:
        """A store in the directory a ``file://`` URL names, as ``file:///var/lib/app/tokens``.

        The host is empty or ``localhost``; the path is absolute, percent-decoded.

        Args:
            url: The URL.
            store_key, timeout, connect_timeout, cooldown: As for the constructor.

        Raises:
            ConfigurationError: not such a URL, or a bad argument.
        """
        return cls(
            _directory_of(url),
            store_key=store_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            cooldown=cooldown,
        )

    def _start(self) -> None:
        self._running = _Running(self._directory, self._connect_timeout * _BUSY_SHARE)
        # Closes the database and stops the thread when the store is collected, or at exit.
        self._finalizer = weakref.finalize(self, self._running.loop.shut)

    def __repr__(self) -> str:
        return f"<LocalTokenStore {self._location}>"

    # A copy of a transport shares its store; a pickled one gets a store of the same
    # directory in the process that unpickles it.
    def __copy__(self) -> LocalTokenStore:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> LocalTokenStore:
        return self

    def __reduce__(self) -> tuple[Callable[..., LocalTokenStore], tuple[Any, ...]]:
        timeouts = (self._timeout, self._connect_timeout)
        if self._shared_url is not None:
            return _shared_again, (self._shared_url, timeouts)
        return _restore, (self._directory, self._store_key.value, timeouts, self._cooldown)

    async def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """``work(connection)`` on the store's thread; the caller's loop waits for nothing.

        The calls run one at a time: ``connect_timeout`` bounds the wait for the database
        to open and for the calls queued before this one, ``timeout`` this one's own run
        (SQLite's busy timeout is below it). Nothing run there refers to the store, so the
        store is never collected (and its finalizer never run) on its own thread.
        """
        running = self._running

        async def body(turn: Turn) -> _T:
            try:
                await running.ready()
            finally:
                running.unreported()  # this call's own failure, or a prepare()'s
            # Its turn starts once it holds SQLite's write lock (or is done, for a read):
            # the wait behind other processes' writes is a queue, not the call.
            return running.database.run(work, started=turn.start)

        try:
            return await call_on_thread(
                running.loop, body, connect_timeout=self._connect_timeout, timeout=self._timeout
            )
        except asyncio.CancelledError:
            task = asyncio.current_task()
            cancelling = getattr(task, "cancelling", None)
            if running.loop.closing and not (cancelling and cancelling()):
                # Cancelled by close(), not by the caller: to the caller an error of the
                # store like any other, so that it fetches its token itself.
                raise LoopClosed("the token store was closed") from None
            raise

    def _derive_sealer(self, identity: TokenIdentity) -> Sealer:
        return Sealer(identity, self._store_key.value or identity.client_secret.encode())

    def _sealer(self, identity: TokenIdentity) -> Sealer:
        return self._sealers.of(identity)

    # The TokenStore protocol.

    async def load(self, identity: TokenIdentity) -> StoredToken | None:
        """The stored token of ``identity``, with its time left (see the module docstring)."""
        sealer = self._sealer(identity)
        tag = sealer.tag
        found = await self._run(lambda connection: db.read_token(connection, tag))
        if found is None:
            return None
        value, life, replaces, left = found
        aad = _aad(tag, "token")
        try:
            access_token = sealer.open(value, aad)
            lifetime = float(life)
            fingerprint, before = None, None
            if replaces is not None:
                opened = sealer.open(replaces, aad + b":replaces")
                if opened is not None:
                    fingerprint, before = json.loads(opened)
                    before = float(before) if before is not None else None
        except (ValueError, TypeError):  # UnicodeDecodeError and JSONDecodeError too
            # Damaged, or not ours: as good as absent; a fetch's newer token replaces it.
            return None
        if access_token is None or not math.isfinite(lifetime):
            return None
        return StoredToken(access_token, left, lifetime, fingerprint, before)

    async def save(self, identity: TokenIdentity, token: StoredToken) -> bool:
        """Store ``token`` unless the stored one expires later."""
        sealer = self._sealer(identity)
        tag, aad = sealer.tag, _aad(sealer.tag, "token")
        ttl = min(max(token.expires_in, 0.001), db.MAX_TTL)
        fields: dict[str, Any] = {
            "value": sealer.seal(token.access_token, aad),
            "fp": sealer.fingerprint(token.access_token),
            "life": min(token.lifetime, db.MAX_TTL),
        }
        if token.replaces:
            replaced = json.dumps([token.replaces, token.replaced_before])
            fields["replaces"] = sealer.seal(replaced, aad + b":replaces")
        return await self._run(lambda connection: db.save_token(connection, tag, ttl, **fields))

    async def discard(self, identity: TokenIdentity, access_token: str) -> bool:
        """Delete the stored token if it is ``access_token`` (compared by fingerprint)."""
        sealer = self._sealer(identity)
        tag, fingerprint = sealer.tag, sealer.fingerprint(access_token)
        return await self._run(lambda connection: db.discard_token(connection, tag, fingerprint))

    async def lock(self, identity: TokenIdentity, owner: str, ttl: float) -> str | None:
        """Take (or, for its owner, extend) the fetch lock for ``ttl`` seconds.

        A lock that expired, or whose entry is damaged, is taken over.

        Returns:
            ``None`` when ``owner`` holds it now; else the holder's owner value.
        """
        tag, seconds = self._sealer(identity).tag, min(max(ttl, 0.001), db.MAX_TTL)
        return await self._run(lambda connection: db.take_lock(connection, tag, owner, seconds))

    async def unlock(
        self, identity: TokenIdentity, owner: str, failure: str | None = None
    ) -> None:
        """Release the fetch lock if ``owner`` still holds it; publish ``failure``, if any.

        The failure is kept, encrypted as tokens are, for a few seconds.
        """
        sealer = self._sealer(identity)
        tag = sealer.tag
        sealed = sealer.seal(failure, _aad(tag, "failed")) if failure is not None else None
        await self._run(
            lambda connection: db.release_lock(connection, tag, owner, sealed, _FAILURE_TTL)
        )

    async def failure(self, identity: TokenIdentity, owner: str) -> str | None:
        """Why ``owner``'s fetch failed, if it released the lock so a moment ago."""
        sealer = self._sealer(identity)
        tag = sealer.tag
        value = await self._run(lambda connection: db.read_failure(connection, tag, owner))
        return sealer.open(value, _aad(tag, "failed")) if isinstance(value, str) else None

    # The fleet's share of token budgets (see gql_service_auth.TokenBudget): optional in
    # the TokenStore protocol, looked up by name.

    async def note_refusal(self, identity: TokenIdentity, text: str, seconds: float) -> None:
        """Keep, ``seconds`` long and encrypted, that the token endpoint refused these
        credentials (``text``, with no secret): other processes do not ask meanwhile."""
        sealer = self._sealer(identity)
        tag, kind = sealer.tag, _refused(sealer, identity)
        sealed = sealer.seal(text, _aad(tag, "refused"))
        ttl = min(max(seconds, 0.001), db.MAX_TTL)
        await self._run(lambda connection: db.note_refusal(connection, tag, kind, sealed, ttl))

    async def admit(
        self, identity: TokenIdentity, window: float | None
    ) -> tuple[tuple[str, float] | None, tuple[int, float] | None]:
        """In one call: the refusal kept for these credentials, with its seconds left;
        else, with a ``window``, one more token request counted in the window of that
        many seconds shared by every process, with the requests counted and the window's
        seconds left (``None`` for what does not apply)."""
        sealer = self._sealer(identity)
        tag, kind = sealer.tag, _refused(sealer, identity)
        seconds = None if window is None else min(max(window, 0.001), db.MAX_TTL)
        refused, counted = await self._run(
            lambda connection: db.admit(connection, tag, kind, seconds)
        )
        if refused is not None:
            text = (
                sealer.open(refused[0], _aad(tag, "refused"))
                if isinstance(refused[0], str)
                else None
            )
            return (None if text is None else (text, refused[1])), None
        return None, counted

    # Life cycle.

    def _after_fork_in_child(self) -> None:
        # The store's thread is not in the child, and SQLite forbids using a connection
        # across fork(): both stay referenced, unused; the child opens its own on first use.
        self._finalizer.detach()
        _fork.keep_orphan(self._running)
        self._start()


def _restore(
    directory: str, store_key: bytes | None, timeouts: Timeouts, cooldown: float
) -> LocalTokenStore:
    timeout, connect_timeout = timeouts
    return LocalTokenStore(
        directory,
        store_key=store_key,
        timeout=timeout,
        connect_timeout=connect_timeout,
        cooldown=cooldown,
    )


def _open_shared(url: str, timeouts: Timeouts) -> LocalTokenStore:
    timeout, connect_timeout = timeouts
    store = LocalTokenStore.from_url(url, timeout=timeout, connect_timeout=connect_timeout)
    store._shared_url = url
    store.prepare()
    return store


_SHARED = StoresByUrl(_open_shared, lambda store: store.closed)


def _shared_again(url: str, timeouts: Timeouts) -> LocalTokenStore:
    """Unpickled, a shared store is the process's shared store of that URL and timeouts."""
    return shared_store(url, timeout=timeouts[0], connect_timeout=timeouts[1])


def shared_store(
    url: str, *, timeout: float = STORE_TIMEOUT, connect_timeout: float = STORE_CONNECT_TIMEOUT
) -> LocalTokenStore:
    """The process's one store for the ``file://`` ``url`` and its timeouts, opened on
    first use, and set up at once, in the background.

    ``from_env()``'s: transports built one per job share it, rather than each opening a
    database and a thread. One that was closed is replaced. A forked child keeps it: the
    store resets itself there. Closed at exit, as every store is.

    Raises:
        ConfigurationError: ``url`` is no ``file://`` URL of an absolute path.
    """
    # Keyed by the directory: file:///a/b/, file://localhost/a/b and file:///a//b are one.
    return _SHARED.get(Path(_directory_of(url)).as_uri(), (timeout, connect_timeout))
