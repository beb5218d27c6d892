"""fork() while a local store's thread is inside a SQLite call.

SQLite keeps the locks of a file in the process's memory: a child inherits that memory but
not the locks. Another process holding a read transaction makes a write here hold SQLite's
write lock while it waits to commit; a fork then lands inside that call, every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import blocking_execute, in_child, with_store

from gql_service_auth import AuthEvent, StoredToken, TokenIdentity
from gql_service_auth._stores.local_db import FORK_WAIT
from gql_service_auth.emulator import Emulator
from gql_service_auth.local import LocalTokenStore

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")

DATABASE = "tokens-v1.sqlite3"
IDENTITY = TokenIdentity("https://auth.test/token", "id", "secret-value-123")
READER = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN")
connection.execute("SELECT count(*) FROM entries").fetchall()
print("reading", flush=True)
time.sleep(float(sys.argv[2]))
"""


@contextlib.contextmanager
def reader_holding(database: Path, seconds: float) -> Iterator[None]:
    """Another process in a read transaction on ``database`` for ``seconds``."""
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(database), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "reading"
        yield
    finally:
        try:
            reader.wait(timeout=seconds + 10)
        finally:
            reader.kill()
            reader.wait()
            if reader.stdout is not None:
                reader.stdout.close()


@contextlib.contextmanager
def writing_on_a_thread(store: LocalTokenStore, token: str) -> Iterator[list[object]]:
    """``store.save`` of ``token`` on a thread, under way (waiting to commit) when entered."""
    outcome: list[object] = []

    def write() -> None:
        outcome.append(asyncio.run(store.save(IDENTITY, StoredToken(token, 60.0, 60.0))))

    thread = threading.Thread(target=write)
    thread.start()
    time.sleep(0.3)  # the write holds SQLite's write lock, waiting for the reader
    try:
        yield outcome
    finally:
        thread.join(timeout=20)


def test_a_fork_waits_for_the_write_under_way_and_the_child_writes_after_it(
    tmp_path: Path,
) -> None:
    """The child sees the write the fork waited for, and writes; then so does the parent."""
    directory = tmp_path / "store"
    with LocalTokenStore(directory, timeout=2.0) as store:
        assert asyncio.run(store.load(IDENTITY)) is None  # made, and open
        with reader_holding(directory / DATABASE, 0.8), writing_on_a_thread(store, "parent's"):

            def child() -> None:
                async def use() -> None:
                    loaded = await store.load(IDENTITY)
                    assert loaded is not None, "the fork did not wait for the write"
                    assert loaded.access_token == "parent's"
                    assert await store.save(IDENTITY, StoredToken("child's", 120.0, 120.0))

                asyncio.run(asyncio.wait_for(use(), 10))

            assert in_child(child, timeout=30) == (0, "ok")
        loaded = asyncio.run(store.load(IDENTITY))
        assert loaded is not None
        assert loaded.access_token == "child's"
        assert asyncio.run(store.save(IDENTITY, StoredToken("parent's again", 600.0, 600.0)))


def test_a_child_forked_during_a_call_past_the_wait_fetches_its_own_token(
    live_emulator: Emulator, tmp_path: Path
) -> None:
    """A call longer than the fork's 1 s wait: the child's queries succeed without the
    store, after one token_store_failed that says why; the parent's store goes on."""
    directory = tmp_path / "store"
    # SQLite waits 2.4 s: 0.8 of connect_timeout, the bound of a wait for a turn.
    with LocalTokenStore(directory, timeout=3.0, connect_timeout=3.0) as store:
        assert asyncio.run(store.load(IDENTITY)) is None
        with (
            reader_holding(directory / DATABASE, 2.0),
            writing_on_a_thread(store, "parent's") as written,
        ):

            def child() -> None:
                events: list[AuthEvent] = []
                outcome = blocking_execute(with_store(live_emulator, store, events))
                assert not isinstance(outcome, Exception), repr(outcome)
                names = [e.name for e in events]
                assert names == ["token_store_failed", "token_fetched"], names
                assert "forked while a SQLite call" in str(events[0].detail)
                # A fork here has nothing to wait for: the call its parent's thread
                # was in is no thread of this process.
                began = time.monotonic()
                assert in_child(lambda: None, timeout=10) == (0, "ok")
                assert time.monotonic() - began < FORK_WAIT / 2

            assert in_child(child, timeout=30) == (0, "ok")
        assert written == [True]
        loaded = asyncio.run(store.load(IDENTITY))
        assert loaded is not None
        assert loaded.access_token == "parent's"
    assert live_emulator.counters.token_requests == 1
