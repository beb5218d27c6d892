"""A token shared by the processes of one host through a directory: LocalTokenStore.

Against the emulator on 127.0.0.1 (real clock: a stored token's freshness is real time)
and a store in the test's own ``tmp_path``. Transports built by ``with_store`` keep their
tokens to themselves, as other processes would; tests/test_local_store_processes.py runs
real processes.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import pickle
import re
import sqlite3
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import (
    HANG_GUARD,
    SLOW_MACHINE,
    blocking_execute,
    execute_on_threads,
    identity_of,
    in_child,
    query,
    run_python,
    with_store,
)

from gql_service_auth import (
    AuthEvent,
    ConfigurationError,
    OAuth2Transport,
    StoredToken,
    TokenIdentity,
)
from gql_service_auth.emulator import Emulator
from gql_service_auth.local import LocalTokenStore, shared_store

DATABASE = "tokens-v1.sqlite3"
TOKEN_PATTERN = re.compile(rb"emu-token-[A-Za-z0-9_-]{20,}")
IDENTITY = TokenIdentity("https://auth.test/token", "id", "secret-value-123")


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalTokenStore]:
    """A LocalTokenStore in a directory of the test's own, closed after it.

    Not the 0.25 s default timeout: tests that count token requests must not fall back
    because a loaded machine was slow; tests of timeouts open their own.
    """
    with LocalTokenStore(tmp_path / "store", timeout=SLOW_MACHINE) as store:
        yield store


def rows(directory: Path, sql: str) -> list[tuple[object, ...]]:
    """``sql`` run on the store's database by a connection of the test's own."""
    connection = sqlite3.connect(directory / DATABASE, isolation_level=None)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


# The protocol, as the Redis store keeps it.


async def test_a_late_write_never_replaces_a_newer_token(local: LocalTokenStore) -> None:
    """Writes are newer-only: a token that expires sooner is not stored."""
    assert await local.save(IDENTITY, StoredToken("newer", 60.0, 60.0, "fp-of-old", 1.5))
    assert not await local.save(IDENTITY, StoredToken("older", 30.0, 60.0))
    loaded = await local.load(IDENTITY)
    assert loaded is not None
    assert (loaded.access_token, loaded.replaces, loaded.replaced_before) == (
        "newer",
        "fp-of-old",
        1.5,
    )
    assert 59.0 < loaded.expires_in <= 60.0
    assert loaded.lifetime == 60.0
    assert await local.save(IDENTITY, StoredToken("longer", 90.0, 90.0))


async def test_a_refused_token_is_deleted_only_while_it_is_the_stored_one(
    local: LocalTokenStore,
) -> None:
    """Compare-and-delete by fingerprint: a refusal of an older token leaves a newer one."""
    await local.save(IDENTITY, StoredToken("current", 60.0, 60.0))
    assert not await local.discard(IDENTITY, "older")
    assert await local.load(IDENTITY) is not None
    assert await local.discard(IDENTITY, "current")
    assert await local.load(IDENTITY) is None


async def test_the_lock_is_extended_by_its_owner_and_taken_over_once_expired(
    local: LocalTokenStore, tmp_path: Path
) -> None:
    """Only the owner releases or extends the lock; an expired or damaged one is taken over."""
    assert await local.lock(IDENTITY, "owner-1", 0.15) is None
    assert await local.lock(IDENTITY, "owner-2", 5.0) == "owner-1"
    await local.unlock(IDENTITY, "owner-2")
    assert await local.lock(IDENTITY, "owner-1", 0.15) is None  # extended
    await asyncio.sleep(0.2)
    assert await local.lock(IDENTITY, "owner-2", 5.0) is None  # owner-1's lapsed
    await local.unlock(IDENTITY, "owner-1")
    assert await local.lock(IDENTITY, "owner-3", 5.0) == "owner-2"
    # A lock whose expiry cannot be read (Redis: one without a time to live) is taken over.
    rows(tmp_path / "store", "UPDATE entries SET ttl = NULL WHERE kind = 'lock'")
    assert await local.lock(IDENTITY, "owner-3", 5.0) is None
    await local.unlock(IDENTITY, "owner-3")
    assert await local.lock(IDENTITY, "owner-4", 5.0) is None


async def test_a_failed_fetch_is_told_to_the_waiters_of_its_owner(
    local: LocalTokenStore,
) -> None:
    """unlock(failure) releases the lock and keeps the failure for that owner's waiters."""
    assert await local.lock(IDENTITY, "owner-1", 5.0) is None
    await local.unlock(IDENTITY, "owner-1", '{"reason": "token endpoint down"}')
    assert await local.failure(IDENTITY, "owner-1") == '{"reason": "token endpoint down"}'
    assert await local.failure(IDENTITY, "owner-2") is None
    assert await local.lock(IDENTITY, "owner-2", 5.0) is None
    await local.unlock(IDENTITY, "owner-2")
    assert await local.failure(IDENTITY, "owner-2") is None


async def test_damaged_or_foreign_entries_read_as_absent(
    local: LocalTokenStore, tmp_path: Path
) -> None:
    """An entry that does not open (damaged, another store_key) is absent; a newer one
    replaces it."""
    await local.save(IDENTITY, StoredToken("first", 60.0, 60.0))
    with LocalTokenStore(tmp_path / "store", store_key=b"k" * 32) as other:
        assert await other.load(IDENTITY) is None
    rows(tmp_path / "store", "UPDATE entries SET value = 'garbage'")
    assert await local.load(IDENTITY) is None
    assert await local.save(IDENTITY, StoredToken("second", 120.0, 120.0))
    rows(tmp_path / "store", "UPDATE entries SET ttl = 'garbage', life = 'x'")
    assert await local.load(IDENTITY) is None
    assert await local.save(IDENTITY, StoredToken("third", 30.0, 30.0))
    loaded = await local.load(IDENTITY)
    assert loaded is not None
    assert loaded.access_token == "third"


@pytest.mark.parametrize(
    ("change", "seconds_left"),
    [
        ("wall = wall - 50", 10.0),  # the wall clock says older: it is older
        ("mono = mono - 50", 10.0),  # the monotonic clock says older: it is older
        ("wall = wall + 3600", 60.0),  # the clock was set back: the monotonic one counts
        ("wall = wall + 3600, boot = 'another boot'", None),  # and cannot: expired
        ("wall = wall - 10, mono = mono + 3600, boot = 'another boot'", 50.0),
    ],
)
async def test_a_token_looks_older_never_younger_when_a_clock_is_set(
    local: LocalTokenStore, tmp_path: Path, change: str, seconds_left: float | None
) -> None:
    """Age is the larger of wall and monotonic time elapsed; the latter within one boot only."""
    await local.save(IDENTITY, StoredToken("token", 60.0, 60.0))
    rows(tmp_path / "store", f"UPDATE entries SET {change}")
    loaded = await local.load(IDENTITY)
    if seconds_left is None:
        assert loaded is None
    else:
        assert loaded is not None
        assert seconds_left - 1.0 < loaded.expires_in <= seconds_left


# Transports on the store, in one process.


async def test_transports_with_one_store_make_one_token_request(
    live_emulator: Emulator, local: LocalTokenStore
) -> None:
    """A second transport with the same credentials reads the first one's token."""
    events: list[AuthEvent] = []
    await query(with_store(live_emulator, local, events))
    await query(with_store(live_emulator, local, events), times=10)
    assert live_emulator.counters.token_requests == 1
    assert [e.name for e in events] == ["token_fetched", "token_loaded"]


async def test_from_env_shares_one_local_store_per_url_per_process(
    live_emulator: Emulator, tmp_path: Path
) -> None:
    """SERVICE_TOKEN_STORE_URL=file:///... gives from_env() the process's store for that URL."""
    url = (tmp_path / "a store").as_uri()  # file:///.../a%20store
    environ = {
        **live_emulator.environ(),
        "SERVICE_TOKEN_STORE_URL": url,
        # Not the 0.25 s default, which a loaded machine overruns (a token request more).
        "SERVICE_TOKEN_STORE_TIMEOUT": str(SLOW_MACHINE),
    }
    store = shared_store(url, timeout=SLOW_MACHINE)
    try:
        assert shared_store(url, timeout=SLOW_MACHINE) is store
        assert store.location == url
        assert pickle.loads(pickle.dumps(store)) is store
        events: list[AuthEvent] = []
        for _ in range(2):  # each stands in for a process of its own
            transport = OAuth2Transport.from_env(
                environ, on_event=events.append, share_tokens=False
            )
            await query(transport)
        assert (tmp_path / "a store" / DATABASE).exists()
        assert live_emulator.counters.token_requests == 1
        assert [e.name for e in events] == ["token_fetched", "token_loaded"]
    finally:
        store.close()
    reopened = shared_store(url, timeout=SLOW_MACHINE)
    try:
        assert reopened is not store
    finally:
        reopened.close()


@pytest.mark.parametrize("timeout", [None, "3"])
async def test_from_env_gives_its_store_the_timeout_the_environment_sets(
    live_emulator: Emulator, tmp_path: Path, timeout: str | None
) -> None:
    """SERVICE_TOKEN_STORE_TIMEOUT=3: a call held up by another process's write for longer
    than the 0.25 s default waits for it, and the stored token is used, not fetched again."""
    directory = tmp_path / "store"
    environ = {**live_emulator.environ(), "SERVICE_TOKEN_STORE_URL": directory.as_uri()}
    if timeout is not None:
        environ["SERVICE_TOKEN_STORE_TIMEOUT"] = timeout
    events: list[AuthEvent] = []

    def transport() -> OAuth2Transport:  # each stands in for a process of its own
        return OAuth2Transport.from_env(environ, on_event=events.append, share_tokens=False)

    try:
        await query(transport())  # fetched, and stored
        writer = sqlite3.connect(directory / DATABASE, isolation_level=None)
        writer.execute("BEGIN EXCLUSIVE")  # another process writing: no reader gets in
        try:
            loading = asyncio.ensure_future(query(transport()))
            if timeout is None:
                await loading  # the writer outlasts the default budget: it ran out
            else:
                await asyncio.sleep(4 * 0.25)  # four times the default budget
        finally:
            writer.execute("ROLLBACK")
            writer.close()
        await loading
    finally:
        shared_store(directory.as_uri(), timeout=float(timeout or 0.25)).close()
    names = [e.name for e in events]
    if timeout is None:
        assert names == ["token_fetched", "token_store_failed", "token_fetched"]
    else:
        assert names == ["token_fetched", "token_loaded"]
        assert live_emulator.counters.token_requests == 1


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf", "nan", "1e999"])
def test_a_store_timeout_that_is_no_number_of_seconds_is_refused(
    live_emulator: Emulator, tmp_path: Path, value: str
) -> None:
    """from_env() refuses a SERVICE_TOKEN_STORE_TIMEOUT it cannot use, naming the variable."""
    environ = {
        **live_emulator.environ(),
        "SERVICE_TOKEN_STORE_URL": (tmp_path / "store").as_uri(),
        "SERVICE_TOKEN_STORE_TIMEOUT": value,
    }
    with pytest.raises(ConfigurationError, match="SERVICE_TOKEN_STORE_TIMEOUT must be a finite"):
        OAuth2Transport.from_env(environ)


def test_from_env_takes_urls_of_one_directory_for_one_store(tmp_path: Path) -> None:
    """Spellings of one directory's URL share its store: slashes, localhost, dot segments."""
    url = (tmp_path / "store").as_uri()
    store = shared_store(url)
    try:
        for spelling in (
            url + "/",
            url.replace("file://", "file://localhost"),
            url.replace("/store", "//store"),
            url.replace("/store", "/./x/../store"),
            url.replace("file://", "file:////"),
            url.replace("file://", "file://LOCALHOST"),
        ):
            assert shared_store(spelling) is store, spelling
        assert store.location == url
    finally:
        store.close()


def test_a_url_with_a_tilde_is_refused_not_taken_literally() -> None:
    """file:///~/tokens would name a directory "~" under /, not the home directory."""
    with pytest.raises(ConfigurationError, match="does not expand ~"):
        shared_store("file:///~/tokens")


@pytest.mark.parametrize(
    "url",
    [
        "file://host.example/srv/tokens",
        "file:relative/dir",
        "file://localhost",
        "file:///srv/tokens?mode=shared",
        "file:///srv/to%00kens",
        "http://127.0.0.1/srv/tokens",
    ],
)
def test_a_url_that_is_no_absolute_local_path_is_refused(url: str) -> None:
    """from_url takes file:// URLs of an absolute path on this host only."""
    with pytest.raises(ConfigurationError, match=r"file:///"):
        LocalTokenStore.from_url(url)


def test_a_store_url_of_another_scheme_names_the_accepted_forms(
    live_emulator: Emulator,
) -> None:
    """from_env() with an unknown SERVICE_TOKEN_STORE_URL says which forms work."""
    environ = {**live_emulator.environ(), "SERVICE_TOKEN_STORE_URL": "sqlite:///srv/tokens"}
    with pytest.raises(ConfigurationError, match=r"file:///.*redis://"):
        OAuth2Transport.from_env(environ)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    """A short store_key, a bad timeout or a path that is none fail at construction."""
    with pytest.raises(ConfigurationError, match="store_key"):
        LocalTokenStore(tmp_path, store_key=b"short")
    with pytest.raises(ConfigurationError, match="timeout"):
        LocalTokenStore(tmp_path, timeout=0)
    with pytest.raises(ConfigurationError, match="path"):
        LocalTokenStore("")


def test_the_store_shows_no_key_and_copies_share_it(tmp_path: Path) -> None:
    """repr and vars() hide store_key; copies are the store; a pickled one reopens its path."""
    with LocalTokenStore(tmp_path / "store", store_key="store-key-material-789") as store:
        shown = repr(store) + repr(vars(store))
        assert "store-key-material" not in shown
        assert repr(store) == f"<LocalTokenStore {(tmp_path / 'store').as_uri()}>"
        assert copy.copy(store) is store
        assert copy.deepcopy(store) is store
        with pickle.loads(pickle.dumps(store)) as thawed:
            assert thawed is not store
            assert thawed.location == store.location


def test_without_the_extra_the_import_error_names_it() -> None:
    """Without cryptography, importing gql_service_auth.local says which extra to install."""
    done = run_python(
        """
        import sys; sys.modules['cryptography'] = None
        try:
            import gql_service_auth.local
        except ImportError as exc:
            print(exc)
        """
    )
    assert "pip install 'gql-service-auth[local]'" in done.stdout


# Files: permissions, secrets, damage.


async def test_the_directory_and_its_files_are_private(
    live_emulator: Emulator, tmp_path: Path
) -> None:
    """The directory (and missing parents) is made 0700, the database and journal 0600."""
    directory = tmp_path / "missing" / "store"
    umask = os.umask(0o022)  # the usual umask, which SQLite alone would follow
    try:
        with LocalTokenStore(directory, timeout=SLOW_MACHINE) as store:
            await query(with_store(live_emulator, store))
            # A journal exists while a write is under way: hold one open and look.
            writer = sqlite3.connect(directory / DATABASE, isolation_level=None)
            try:
                writer.execute("BEGIN IMMEDIATE")
                writer.execute("UPDATE entries SET life = life + 1")
                journal = directory / f"{DATABASE}-journal"
                assert journal.exists()
                assert stat.S_IMODE(journal.stat().st_mode) == 0o600
            finally:
                writer.execute("ROLLBACK")
                writer.close()
    finally:
        os.umask(umask)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(directory.parent.stat().st_mode) == 0o700  # not the umask's 0755
    assert [p.name for p in directory.iterdir()] == [DATABASE]
    assert stat.S_IMODE((directory / DATABASE).stat().st_mode) == 0o600


def loosen_directory(directory: Path) -> str:
    directory.chmod(0o755)
    return f"the token store directory {directory} is accessible to other users (mode 0755)"


def loosen_database(directory: Path) -> str:
    (directory / DATABASE).chmod(0o640)
    return f"the token store database {directory / DATABASE} is accessible to other users"


def give_away(directory: Path) -> str:
    if os.getuid() != 0:
        pytest.skip("only root can give a directory to another user")
    os.chown(directory, 65534, -1)
    return f"the token store directory {directory} belongs to another user"


def link_database(directory: Path) -> str:
    database = directory / DATABASE
    elsewhere = directory / "elsewhere.sqlite3"
    database.rename(elsewhere)
    database.symlink_to(elsewhere)
    return f"the token store database {database} is a symbolic link"


@pytest.mark.parametrize("loosen", [loosen_directory, loosen_database, give_away, link_database])
async def test_a_store_others_can_reach_is_refused_and_queries_succeed(
    live_emulator: Emulator, tmp_path: Path, loosen: Callable[[Path], str]
) -> None:
    """Another user's or a shared directory or database: one token_store_failed, no failure."""
    directory = tmp_path / "store"
    events: list[AuthEvent] = []
    with LocalTokenStore(directory, timeout=SLOW_MACHINE) as store:
        assert await store.load(IDENTITY) is None  # makes the directory and the database
        expected = loosen(directory)
        await query(with_store(live_emulator, store, events), times=3)
        await query(with_store(live_emulator, store, events), times=3)
    failed = [e for e in events if e.name == "token_store_failed"]
    assert len(failed) == 1
    assert failed[0].error == "PermissionError"
    assert failed[0].store == directory.as_uri()
    assert expected in str(failed[0].detail)
    assert "use a directory of your own" in str(failed[0].detail) or "remove it" in str(
        failed[0].detail
    )
    assert live_emulator.counters.token_requests == 2  # each for itself, as without a store


async def test_the_store_directory_holds_no_client_id_secret_or_token(
    live_emulator: Emulator, local: LocalTokenStore, tmp_path: Path
) -> None:
    """Every byte of every file, after tokens, locks and failures: no credential, no token."""
    transport = with_store(live_emulator, local)
    await query(transport)
    identity = identity_of(live_emulator)
    failure = "failure-text-of-the-holder"
    assert await local.lock(identity, "holder", 5.0) is None
    await local.unlock(identity, "holder", failure)
    assert await local.lock(identity, "another-holder", 5.0) is None
    assert transport.token is not None
    token = transport.token.value
    assert await local.save(identity, StoredToken(token + "2", 7200.0, 7200.0, "fp", 1.0))
    kinds = rows(tmp_path / "store", "SELECT kind FROM entries ORDER BY kind")
    assert kinds == [("failed",), ("lock",), ("spent",), ("token",)]
    client = live_emulator.recent_client
    needles: list[bytes] = []
    for secret in (client.client_id, client.client_secret, token, failure):
        raw = secret.encode()
        encoded = [base64.b64encode(raw), base64.urlsafe_b64encode(raw), raw.hex().encode()]
        needles += [raw, *(e.rstrip(b"=") for e in encoded), raw.hex().upper().encode()]
    files = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert files
    for path in files:
        blob = path.read_bytes()
        assert TOKEN_PATTERN.search(blob) is None, path
        assert not [n for n in needles if n in blob], path


@pytest.mark.parametrize("when", ["before its first use", "while it is open"])
async def test_a_corrupt_store_file_fails_no_query_and_is_replaced(
    live_emulator: Emulator, tmp_path: Path, when: str
) -> None:
    """Garbage in the database: queries succeed, one token_store_failed, then it works again."""
    directory = tmp_path / "store"
    events: list[AuthEvent] = []
    with LocalTokenStore(directory, timeout=SLOW_MACHINE) as store:
        assert await store.load(IDENTITY) is None  # made, and open
        if when == "before its first use":
            store.close()
            store = LocalTokenStore(directory, timeout=SLOW_MACHINE)
        with (directory / DATABASE).open("r+b") as file:  # in place: the same file
            file.write(b"not a database, " * 256)
        await query(with_store(live_emulator, store, events), times=5)
        store.close()
    assert [e.name for e in events].count("token_store_failed") == 1
    failed = next(e for e in events if e.name == "token_store_failed")
    assert "replaced by an empty one" in str(failed.detail)
    assert rows(directory, "PRAGMA application_id") == [(0x67736131,)]
    # Another process: it stores its token, and a process after it loads that one.
    with LocalTokenStore(directory, timeout=SLOW_MACHINE) as later:
        await query(with_store(live_emulator, later, events))
    environ = {**live_emulator.environ(), "SERVICE_TOKEN_STORE_URL": directory.as_uri()}
    done = run_python(
        """
        from gql import Client, gql
        from gql_service_auth import OAuth2Transport
        names = []
        transport = OAuth2Transport.from_env(on_event=lambda e: names.append(e.name))
        Client(transport=transport).execute(gql("query { carriers(first: 1) { totalCount } }"))
        print(names)
        """,
        environ,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['token_loaded']"
    assert live_emulator.counters.token_requests == 2


async def test_another_programs_database_is_left_alone_and_fails_no_query(
    live_emulator: Emulator, tmp_path: Path
) -> None:
    """A database of another program (or of another schema of ours) under the store's name:
    not replaced, not written; one token_store_failed that says so; queries succeed."""
    directory = tmp_path / "store"
    directory.mkdir(mode=0o700)
    other = sqlite3.connect(directory / DATABASE, isolation_level=None)
    other.execute("CREATE TABLE notes (text TEXT)")
    other.execute("INSERT INTO notes VALUES ('theirs')")
    other.close()
    (directory / DATABASE).chmod(0o600)
    before = (directory / DATABASE).read_bytes()
    events: list[AuthEvent] = []
    with LocalTokenStore(directory, timeout=SLOW_MACHINE) as store:
        await query(with_store(live_emulator, store, events), times=3)
    assert (directory / DATABASE).read_bytes() == before
    failed = [e for e in events if e.name == "token_store_failed"]
    assert len(failed) == 1
    assert "another program, or of another version" in str(failed[0].detail)
    assert "left as it is" in str(failed[0].detail)


async def test_a_link_of_ones_own_to_a_private_directory_is_used(
    live_emulator: Emulator, tmp_path: Path
) -> None:
    """A store path that is the user's own symbolic link to their own private directory."""
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with LocalTokenStore(tmp_path / "link", timeout=SLOW_MACHINE) as store:
        events: list[AuthEvent] = []
        await query(with_store(live_emulator, store, events))
    assert [e.name for e in events] == ["token_fetched"]
    assert (target / DATABASE).exists()


async def test_a_connection_reopens_a_file_another_process_replaced(tmp_path: Path) -> None:
    """A store whose file was replaced reads and writes the new one, not the unlinked one."""
    directory = tmp_path / "store"
    with (
        LocalTokenStore(directory, timeout=SLOW_MACHINE) as one,
        LocalTokenStore(directory, timeout=SLOW_MACHINE) as other,
    ):
        assert await one.save(IDENTITY, StoredToken("first", 60.0, 60.0))
        garbage = directory / "garbage"
        garbage.write_bytes(b"\0garbage" * 512)
        garbage.chmod(0o600)
        os.replace(garbage, directory / DATABASE)
        with pytest.raises(sqlite3.DatabaseError, match="replaced by an empty one"):
            await other.load(IDENTITY)
        assert await one.load(IDENTITY) is None  # not "first", from the unlinked file
        assert await one.save(IDENTITY, StoredToken("second", 60.0, 60.0))
        loaded = await other.load(IDENTITY)
        assert loaded is not None
        assert loaded.access_token == "second"


# Threads, loops and fork().


async def test_blocking_sqlite_calls_stay_off_the_callers_loop(
    live_emulator: Emulator, tmp_path: Path
) -> None:
    """SQLite's lock held elsewhere: the loop runs on while a call waits for it, the call
    ends within timeout, and a query on the same loop succeeds."""
    directory = tmp_path / "store"
    events: list[AuthEvent] = []
    # SQLite waits up to 1.6 s: 0.8 of connect_timeout (2 s), which bounds a wait for a turn.
    with LocalTokenStore(directory, timeout=2.0) as store:
        assert await store.load(IDENTITY) is None  # made, and open
        holder = sqlite3.connect(directory / DATABASE, isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")  # no reader, no writer gets in
            waiting = asyncio.ensure_future(store.load(IDENTITY))
            await asyncio.sleep(0.1)
            # This loop lets the lock go while the call waits for it: a call blocking the
            # loop in SQLite would have ended in "database is locked" before this ran.
            assert not waiting.done()
            holder.execute("ROLLBACK")
            assert await waiting is None
            holder.execute("BEGIN EXCLUSIVE")  # and now held until the query is over
            await asyncio.wait_for(query(with_store(live_emulator, store, events)), HANG_GUARD)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    assert [e.name for e in events] == ["token_store_failed", "token_fetched"]
    assert events[0].error in ("OperationalError", "TimeoutError")  # "database is locked"


def test_blocking_execute_on_many_threads_shares_one_token(
    live_emulator: Emulator, local: LocalTokenStore
) -> None:
    """gql's sync execute, a loop per call on 8 threads, with two transports: one request."""
    first, second = with_store(live_emulator, local), with_store(live_emulator, local)
    assert execute_on_threads(first, threads=8) == []
    assert execute_on_threads(second, threads=8) == []
    assert live_emulator.counters.token_requests == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_uses_the_store_with_a_connection_of_its_own(
    live_emulator: Emulator, local: LocalTokenStore
) -> None:
    """After fork(), the child reads the parent's token through a thread and connection of
    its own (the parent's thread is not in the child; its connection is bound to it)."""
    transport = with_store(live_emulator, local)
    assert execute_on_threads(transport) == []
    assert transport.token is not None
    parents = transport.token.value

    def child() -> None:
        events: list[AuthEvent] = []
        own = with_store(live_emulator, local, events)
        outcome = blocking_execute(own)
        assert not isinstance(outcome, Exception), repr(outcome)
        assert [e.name for e in events] == ["token_loaded"], [e.name for e in events]
        assert own.token is not None
        assert own.token.value == parents

    assert in_child(child, timeout=20) == (0, "ok")
    assert live_emulator.counters.token_requests == 1
    # The parent's store still works after the child's exit.
    assert execute_on_threads(with_store(live_emulator, local)) == []
    assert live_emulator.counters.token_requests == 1
