"""Real processes sharing one token through a LocalTokenStore: one-shot runs, workers, a kill.

Each process is a fresh interpreter (tests/fleet_worker.py, or a script) on the emulator on
127.0.0.1, real clock, with the store in the test's own ``tmp_path``.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import (
    HANG_GUARD,
    SLOW_MACHINE,
    Fleet,
    execute_on_threads,
    fleet_config,
    quiet,
    run_python,
    with_store,
)

from gql_service_auth import AuthEvent, RetryPolicy
from gql_service_auth.emulator import Emulator
from gql_service_auth.local import LocalTokenStore

ONE_SHOT = """
import json
from gql import Client, gql
from gql_service_auth import OAuth2Transport

names = []
transport = OAuth2Transport.from_env(on_event=lambda event: names.append(event.name))
Client(transport=transport).execute(gql("query { carriers(first: 1) { totalCount } }"))
print(json.dumps(names))
"""
"""A cron run: a transport from the environment, one query, exit."""


@pytest.fixture
def fleet() -> Iterator[list[Fleet]]:
    """Fleets a test starts, closed after it whatever happens."""
    started: list[Fleet] = []
    yield started
    for each in started:
        each.close()


def test_twenty_one_shot_processes_in_a_row_make_one_token_request(
    live_emulator: Emulator, tmp_path: Path
) -> None:
    """20 cron runs, each from_env() with SERVICE_TOKEN_STORE_URL=file:///...: 1 request."""
    environ = {
        **live_emulator.environ(),
        "SERVICE_TOKEN_STORE_URL": (tmp_path / "store").as_uri(),
        # A busy host's setting: a new process's first call opens SQLite on a new thread,
        # which on a loaded machine overran the 0.25 s default (a token request more).
        "SERVICE_TOKEN_STORE_TIMEOUT": str(SLOW_MACHINE),
    }
    runs = [run_python(ONE_SHOT, environ) for _ in range(20)]
    assert [(r.returncode, quiet(r.stderr)) for r in runs] == [(0, "")] * 20
    names = [json.loads(r.stdout) for r in runs]
    assert names == [["token_fetched"]] + [["token_loaded"]] * 19
    assert live_emulator.counters.token_requests == 1


def test_four_processes_of_fifty_queries_on_a_cold_store_make_one_token_request(
    live_emulator: Emulator, tmp_path: Path, fleet: list[Fleet]
) -> None:
    """4 processes x 50 concurrent queries, started together on a slow endpoint: 1 request."""
    live_emulator.token_latency = 0.3  # the fetch outlasts the others' start: they overlap
    config = fleet_config(
        live_emulator,
        None,
        store_url=(tmp_path / "store").as_uri(),
        concurrency=50,
        store_timeout=SLOW_MACHINE,
    )
    fleet.append(Fleet(4, **config))
    outcomes = fleet[0].run()
    assert [o["failures"] for o in outcomes] == [[]] * 4
    assert [o["queries"] for o in outcomes] == [50] * 4
    assert live_emulator.counters.token_requests == 1
    assert sum(o["events"].get("token_fetched", 0) for o in outcomes) == 1
    assert sum(o["events"].get("token_loaded", 0) for o in outcomes) == 3


def test_a_lock_holder_killed_mid_fetch_is_taken_over_within_the_locks_ttl(
    live_emulator: Emulator, tmp_path: Path, fleet: list[Fleet]
) -> None:
    """SIGKILLed while it fetches: another process gets a token once its lock lapses (2 s),
    for one more token request."""
    url = (tmp_path / "store").as_uri()
    config = fleet_config(
        live_emulator,
        None,
        store_url=url,
        concurrency=1,
        retry_timeout=1.0,
        store_timeout=SLOW_MACHINE,
    )
    fleet.append(Fleet(1, **config))
    holder = fleet[0].processes[0]
    live_emulator.freeze_token_endpoint(30)
    try:
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
        deadline = time.monotonic() + 10
        while live_emulator.counters.token_requests == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert live_emulator.counters.token_requests == 1  # it holds the lock, and waits
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        killed = time.monotonic()
    finally:
        live_emulator.freeze_token_endpoint(0)
    database = sqlite3.connect(tmp_path / "store" / "tokens-v1.sqlite3")
    try:
        locks = database.execute("SELECT count(*) FROM entries WHERE kind = 'lock'").fetchall()
    finally:
        database.close()
    assert locks == [(1,)]  # the dead holder's
    events: list[AuthEvent] = []
    with LocalTokenStore.from_url(url, timeout=SLOW_MACHINE) as store:
        # A deadline far past the dead holder's lock: the taker waits it out, then fetches.
        retry = RetryPolicy(timeout=HANG_GUARD)
        taker = with_store(live_emulator, store, events, retry=retry)
        assert execute_on_threads(taker) == []
    took = time.monotonic() - killed
    # It waited for the lock (2 s at most), not for its deadline: a margin between the two
    # that no loaded machine takes.
    assert 0.5 < took < HANG_GUARD / 2
    assert live_emulator.counters.token_requests == 2
    assert [e.name for e in events] == ["token_fetched"]
