"""A token shared by processes through Redis: RedisTokenStore against a real redis-server.

Every test runs gql's ``Client`` against the emulator on 127.0.0.1 and a real Redis on
127.0.0.1 (see conftest.py). The fleet tests start real processes (tests/fleet_worker.py).
The emulator runs on the real clock here: a stored token's freshness is Redis's ``PTTL``.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import logging
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import support
from gql import Client
from redis_server import RedisServer, command
from support import (
    COUNT,
    HANG_GUARD,
    SLOW_MACHINE,
    Fleet,
    closed_port,
    execute_on_threads,
    identity_of,
    query,
    token_of_its_own,
    wait_until,
    with_store,
)

from gql_service_auth import (
    AuthEvent,
    ConfigurationError,
    OAuth2Transport,
    RetryPolicy,
    StoredToken,
    TokenIdentity,
)
from gql_service_auth.emulator import Emulator
from gql_service_auth.redis import RedisTokenStore

TOKEN_PATTERN = re.compile(rb"emu-token-[A-Za-z0-9_-]{20,}")


def fleet_config(live_emulator: Emulator, redis_url: str, **more: Any) -> dict[str, Any]:
    more.setdefault("store_timeout", SLOW_MACHINE)
    return support.fleet_config(live_emulator, redis_url, **more)


@pytest.fixture
def fleet() -> Iterator[list[Fleet]]:
    """Fleets a test starts, closed after it whatever happens."""
    started: list[Fleet] = []
    yield started
    for each in started:
        each.close()


# In one process: two levels.


async def test_transports_with_one_store_make_one_token_request(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """A second transport with the same credentials reads the first one's token from Redis."""
    events: list[AuthEvent] = []
    await query(with_store(live_emulator, store, events))
    await query(with_store(live_emulator, store, events), times=10)
    assert live_emulator.counters.token_requests == 1
    assert [e.name for e in events] == ["token_fetched", "token_loaded"]


async def test_the_request_path_never_touches_redis(
    live_emulator: Emulator, store: RedisTokenStore, redis_server: RedisServer
) -> None:
    """With a token in hand, queries go on while Redis is frozen; Redis is read once per token."""
    transport = with_store(live_emulator, store)
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        redis_server.pause()
        try:
            await asyncio.gather(*(session.execute(COUNT) for _ in range(50)))
        finally:
            redis_server.resume()
    assert live_emulator.counters.graphql_requests == 51


async def test_different_scopes_do_not_share_a_token(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """The key covers the scope (and token URL, client id, parameters, auth method)."""
    await query(with_store(live_emulator, store, scope="read"))
    await query(with_store(live_emulator, store, scope="write"))
    await query(with_store(live_emulator, store, scope="read"))
    assert live_emulator.counters.token_requests == 2


async def test_a_refusal_replaces_the_stored_token_once(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """After a revocation, the first transport refused renews; the second reads its renewal."""
    first, second = with_store(live_emulator, store), with_store(live_emulator, store)
    await query(first)
    await query(second)
    live_emulator.revoke_tokens()
    await query(first)
    await query(second)
    assert live_emulator.counters.token_requests == 2
    assert first.token is not None
    assert second.token is not None
    assert first.token.value == second.token.value


async def test_a_token_due_for_renewal_is_renewed_once_for_all(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """Past half a 1 s token's life, one transport renews it and the other reads the renewal."""
    live_emulator.token_ttl = 1.0
    first, second = with_store(live_emulator, store), with_store(live_emulator, store)
    await query(first)
    await query(second)
    await asyncio.sleep(0.6)
    await query(first)
    await wait_until(lambda: live_emulator.counters.token_requests == 2)
    await wait_until(lambda: first.token is not None and first.token.generation == 2)
    await query(second)
    await wait_until(lambda: second.token is not None and second.token.generation == 2)
    assert live_emulator.counters.token_requests == 2


async def test_a_late_write_never_replaces_a_newer_token(
    redis_server: RedisServer, store: RedisTokenStore
) -> None:
    """Writes are newer-only, by Redis's clock: a token that expires sooner is not stored."""
    identity = TokenIdentity("https://auth.test/token", "id", "secret-value-123")
    assert await store.save(identity, StoredToken("newer", 60.0, 60.0))
    assert not await store.save(identity, StoredToken("older", 30.0, 60.0))
    loaded = await store.load(identity)
    assert loaded is not None
    assert loaded.access_token == "newer"
    assert 59.0 < loaded.expires_in <= 60.0


async def test_a_refused_token_is_deleted_only_while_it_is_the_stored_one(
    store: RedisTokenStore,
) -> None:
    """Compare-and-delete by fingerprint: a refusal of an older token leaves a newer one."""
    identity = TokenIdentity("https://auth.test/token", "id", "secret-value-123")
    await store.save(identity, StoredToken("current", 60.0, 60.0))
    assert not await store.discard(identity, "older")
    assert await store.discard(identity, "current")
    assert await store.load(identity) is None


async def test_only_the_lock_owner_releases_it(store: RedisTokenStore) -> None:
    """The lock is taken with an owner value, released by compare-and-delete.

    A waiter learns who holds it; the holder extends it by taking it again.
    """
    identity = TokenIdentity("https://auth.test/token", "id", "secret-value-123")
    assert await store.lock(identity, "owner-1", 5.0) is None
    assert await store.lock(identity, "owner-2", 5.0) == "owner-1"
    await store.unlock(identity, "owner-2")
    assert await store.lock(identity, "owner-2", 5.0) == "owner-1"
    assert await store.lock(identity, "owner-1", 5.0) is None
    await store.unlock(identity, "owner-1")
    assert await store.lock(identity, "owner-2", 5.0) is None


async def test_another_store_key_cannot_read_the_token(redis_server: RedisServer) -> None:
    """store_key replaces the client secret as key material: other material reads nothing."""
    identity = TokenIdentity("https://auth.test/token", "id", "secret-value-123")
    with (
        RedisTokenStore.from_url(
            redis_server.url, store_key=b"k" * 32, timeout=SLOW_MACHINE
        ) as one,
        RedisTokenStore.from_url(
            redis_server.url, store_key=b"k" * 32, timeout=SLOW_MACHINE
        ) as same,
        RedisTokenStore.from_url(
            redis_server.url, store_key=b"x" * 32, timeout=SLOW_MACHINE
        ) as other,
    ):
        await one.save(identity, StoredToken("shared", 60.0, 60.0))
        rotated = TokenIdentity("https://auth.test/token", "id", "rotated-secret-456")
        loaded = await same.load(rotated)
        assert loaded is not None
        assert loaded.access_token == "shared"
        assert await other.load(identity) is None


async def test_redis_holds_no_client_id_secret_or_token(
    live_emulator: Emulator, store: RedisTokenStore, redis_server: RedisServer
) -> None:
    """A scan of every key and value finds no client id, no secret, no plaintext token."""
    transport = with_store(live_emulator, store)
    await query(transport)
    assert transport.token is not None
    dump = redis_server.dump()
    assert dump, "the token was not stored"
    client = live_emulator.recent_client
    for name, value in dump:
        for blob in (name, value):
            assert client.client_id.encode() not in blob
            assert client.client_secret.encode() not in blob
            assert transport.token.value.encode() not in blob
            assert TOKEN_PATTERN.search(blob) is None
    # The token, and the fleet's count of token requests (see TokenBudget).
    names = sorted(n.rpartition(b":")[2] for n, _ in dump)
    assert names == [b"spent", b"token"]
    assert all(
        re.fullmatch(rb"gql-service-auth:\{[0-9a-f]{32}\}:(token|spent)", n) for n, _ in dump
    )


def test_the_store_shows_no_url_password_or_key(redis_server: RedisServer) -> None:
    """repr and vars() of a store hide the URL (it may hold a password) and the key."""
    url = redis_server.url.replace("redis://", "redis://user:hunter2-password@")
    with RedisTokenStore.from_url(
        url, store_key="store-key-material-789", timeout=SLOW_MACHINE
    ) as store:
        shown = repr(store) + repr(vars(store))
    assert "hunter2" not in shown
    assert "store-key-material" not in shown


def test_bad_arguments_are_refused() -> None:
    """A URL of another scheme, a short store_key or a bad timeout fails at construction."""
    with pytest.raises(ConfigurationError, match="redis://"):
        RedisTokenStore.from_url("http://127.0.0.1:6379")
    with pytest.raises(ConfigurationError, match="store_key"):
        RedisTokenStore.from_url("redis://127.0.0.1:6379", store_key=b"short")
    with pytest.raises(ConfigurationError, match="timeout"):
        RedisTokenStore.from_url("redis://127.0.0.1:6379", timeout=0)
    with pytest.raises(ConfigurationError, match="RedisCluster"):
        RedisTokenStore("redis://127.0.0.1:6379")  # type: ignore[arg-type]


async def test_a_client_built_by_the_user_works(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """RedisTokenStore(client) uses a redis.asyncio.Redis the user built."""
    import redis.asyncio

    client = redis.asyncio.Redis(port=redis_server.port)
    with RedisTokenStore(client, timeout=SLOW_MACHINE) as store:
        await query(with_store(live_emulator, store))
        await query(with_store(live_emulator, store))
    assert live_emulator.counters.token_requests == 1


async def test_from_env_reads_the_store_url(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """SERVICE_TOKEN_STORE_URL gives from_env() a RedisTokenStore."""
    environ = {**live_emulator.environ(), "SERVICE_TOKEN_STORE_URL": redis_server.url}
    events: list[AuthEvent] = []
    # Not shared in the process: each stands in for a process of its own.
    first = OAuth2Transport.from_env(environ, on_event=events.append, share_tokens=False)
    await query(first)
    await query(OAuth2Transport.from_env(environ, on_event=events.append, share_tokens=False))
    # One request, and one more only if a loaded machine kept Redis past its 0.25 s.
    names = [e.name for e in events]
    # The store is this Redis: the token is there, or the store that failed names it.
    failed = {e.store for e in events if e.name == "token_store_failed"}
    assert redis_server.dump() != [] or failed == {redis_server.url}
    assert live_emulator.counters.token_requests == 1 + names.count("token_store_failed")
    assert names.count("token_loaded") + names.count("token_store_failed") == 1


async def test_a_least_privilege_acl_user_suffices(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """The docs' ACL line gives the store all it needs, a database number included."""
    from redis_server import command

    page = Path(__file__).parents[1].joinpath("docs", "tokens.md").read_text()
    line = re.search(r"^ACL SETUSER (gql-service-auth .*)$", page, re.MULTILINE)
    assert line is not None
    rule = line.group(1).replace("<password>", "acl-test-password")
    assert b"+OK" in command(redis_server.port, "ACL", "SETUSER", *rule.split())
    try:
        # A database other than 0: redis-py selects it on connecting (SELECT).
        url = redis_server.url.replace("redis://", "redis://gql-service-auth:acl-test-password@")
        url = url.removesuffix("/0") + "/3"
        events: list[AuthEvent] = []
        with RedisTokenStore.from_url(url, timeout=SLOW_MACHINE) as store:
            await query(with_store(live_emulator, store, events))
            await query(with_store(live_emulator, store, events))
        assert [e.name for e in events] == ["token_fetched", "token_loaded"]
    finally:
        command(redis_server.port, "ACL", "DELUSER", "gql-service-auth")


# Redis down or slow.


async def test_redis_down_never_fails_a_query(
    live_emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """With nothing listening, queries succeed, one event and warning say so, then a cooldown."""
    events: list[AuthEvent] = []
    with (
        closed_port() as port,
        RedisTokenStore.from_url(f"redis://127.0.0.1:{port}/0") as store,
    ):
        transport = with_store(live_emulator, store, events)
        await query(transport, times=5)
        live_emulator.revoke_tokens()
        await query(transport, times=5)
    failed = [e for e in events if e.name == "token_store_failed"]
    assert len(failed) == 1  # the second fetch came within the cool-down: Redis left alone
    assert failed[0].wait == 10.0
    assert live_emulator.counters.token_requests == 2
    warnings = [r for r in caplog.records if "token_store_failed" in r.getMessage()]
    assert warnings
    assert warnings[0].levelno == logging.WARNING


@pytest.mark.parametrize("frozen", ["before connecting", "once connected"])
async def test_a_frozen_redis_costs_one_bound(
    live_emulator: Emulator, own_redis: RedisServer, frozen: str
) -> None:
    """A Redis that answers nothing costs the bound of the step it froze in (the set-up's
    connect_timeout, or a call's timeout), then the process fetches itself."""
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(own_redis.url, timeout=0.2, connect_timeout=0.3) as store:
        if frozen == "once connected":
            await store.load(identity_of(live_emulator, live_emulator.legacy_client))
        own_redis.pause()
        try:
            await query(with_store(live_emulator, store, events), times=10)
        finally:
            own_redis.resume()
    assert [e.name for e in events] == ["token_store_failed", "token_fetched"]
    assert events[0].error == "TimeoutError"
    # The store's own bound ended it, not a Redis socket timeout (redis-py's is a guard).
    if frozen == "once connected":
        assert events[0].detail == "no answer within 0.2 s"
    else:
        assert events[0].detail == "not connected within 0.3 s (connect_timeout)"


# Threads, loops and fork.


def test_blocking_execute_on_many_threads_shares_one_token(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """gql's sync execute, a loop per call on 8 threads, with two transports: one request."""
    first, second = with_store(live_emulator, store), with_store(live_emulator, store)
    assert execute_on_threads(first, threads=8) == []
    assert execute_on_threads(second, threads=8) == []
    assert live_emulator.counters.token_requests == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_uses_the_store_with_a_client_of_its_own(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """After fork(), the child's store reads the parent's token through its own connection."""
    transport = with_store(live_emulator, store)
    assert execute_on_threads(transport) == []
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            child = with_store(live_emulator, store)
            Client(transport=child).execute(COUNT)
            code = 0 if child.token and child.token.value == transport.token.value else 2  # type: ignore[union-attr]
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"\0"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert live_emulator.counters.token_requests == 1
    # The parent's store still works after the child's exit.
    assert execute_on_threads(with_store(live_emulator, store)) == []
    assert live_emulator.counters.token_requests == 1


# Fleets of processes.


def test_a_fleet_on_a_cold_cache_makes_one_token_request(
    live_emulator: Emulator, redis_server: RedisServer, fleet: list[Fleet]
) -> None:
    """6 processes x 50 concurrent queries, all starting at once: exactly one token request."""
    fleet.append(Fleet(6, **fleet_config(live_emulator, redis_server.url, concurrency=50)))
    outcomes = fleet[0].run()
    assert [o["failures"] for o in outcomes] == [[]] * 6
    assert live_emulator.counters.token_requests == 1
    assert sum(o["events"].get("token_fetched", 0) for o in outcomes) == 1
    assert sum(o["events"].get("token_loaded", 0) for o in outcomes) == 5


def test_a_fleet_wide_revocation_costs_one_renewal(
    live_emulator: Emulator, redis_server: RedisServer, fleet: list[Fleet]
) -> None:
    """Every process refused at once: one renews, the others read its token."""
    fleet.append(Fleet(5, **fleet_config(live_emulator, redis_server.url, concurrency=20)))
    fleet[0].run()
    live_emulator.revoke_tokens()
    outcomes = fleet[0].run()
    assert [o["failures"] for o in outcomes] == [[]] * 5
    assert live_emulator.counters.token_requests == 2


def test_a_killed_lock_holder_is_taken_over_when_its_lock_expires(
    live_emulator: Emulator, redis_server: RedisServer, fleet: list[Fleet]
) -> None:
    """A process killed mid-fetch holds the lock until it expires; then another fetches."""
    config = fleet_config(live_emulator, redis_server.url, concurrency=1, retry_timeout=1.0)
    fleet.append(Fleet(1, **config))
    holder = fleet[0].processes[0]
    live_emulator.freeze_token_endpoint(30)
    assert holder.stdin is not None
    holder.stdin.write("go\n")
    holder.stdin.flush()
    deadline = time.monotonic() + 10
    while live_emulator.counters.token_requests == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert any(name.endswith(b":lock") for name, _ in redis_server.dump())
    live_emulator.freeze_token_endpoint(0)
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(redis_server.url, timeout=SLOW_MACHINE) as store:
        # A deadline far past the dead holder's lock (2 s at most): the taker waits it out.
        taker = with_store(live_emulator, store, events, retry=RetryPolicy(timeout=HANG_GUARD))
        began = time.monotonic()
        assert execute_on_threads(taker) == []
        assert time.monotonic() - began < HANG_GUARD / 2  # the lock's end, not the deadline
    assert live_emulator.counters.token_requests == 2
    assert [e.name for e in events] == ["token_fetched"]


def test_redis_killed_and_restarted_fails_no_query(
    live_emulator: Emulator, own_redis: RedisServer, fleet: list[Fleet]
) -> None:
    """Processes query on 1 s tokens while Redis dies and comes back: 0 failures, bounded cost."""
    live_emulator.token_ttl = 1.0
    config = fleet_config(
        live_emulator, own_redis.url, concurrency=5, seconds=3.0, cooldown=0.5, store_timeout=0.25
    )
    fleet.append(Fleet(4, **config))
    killer = threading.Timer(0.8, own_redis.stop)
    killer.start()
    restarter = threading.Timer(1.6, own_redis.start)
    restarter.start()
    outcomes = fleet[0].run()
    killer.join()
    restarter.join()
    assert [o["failures"] for o in outcomes] == [[]] * 4
    assert all(o["queries"] >= 5 for o in outcomes)  # each of the 5 loops went on
    # The store's 0.25 s timeout plus one fetch, not a query stuck on the dead Redis until
    # its execute_timeout (30 s): a gap between the two that no loaded machine takes.
    assert max(o["slowest"] for o in outcomes) < 10
    # 3 s of 1 s tokens renewed at half-life: about 6 with a store, at most 4 x 7 without.
    assert live_emulator.counters.token_requests <= 4 * 7
    assert sum(o["events"].get("token_store_failed", 0) for o in outcomes) >= 1


async def test_a_redis_cluster_client_works(
    live_emulator: Emulator, own_redis: RedisServer
) -> None:
    """On a cluster (one node, every slot), the hash-tagged keys let the scripts run."""
    from redis.asyncio.cluster import RedisCluster
    from redis_server import command, free_port

    own_redis.stop()
    # A node's cluster bus listens on its port + 10000, which must be a port too.
    own_redis.port = free_port(with_bus=True)
    own_redis.start("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
    assert b"+OK" in command(own_redis.port, "CLUSTER", "ADDSLOTS", *map(str, range(16384)))
    await wait_until(lambda: b"cluster_state:ok" in command(own_redis.port, "CLUSTER", "INFO"))
    events: list[AuthEvent] = []
    with RedisTokenStore(
        RedisCluster(host="127.0.0.1", port=own_redis.port), timeout=SLOW_MACHINE
    ) as store:
        first, second = (
            with_store(live_emulator, store, events),
            with_store(live_emulator, store, events),
        )
        await query(first)
        await query(second)
        live_emulator.revoke_tokens()
        await query(first)
        await query(second)
    assert live_emulator.counters.token_requests == 2
    fetches = [e.name for e in events if e.name in ("token_fetched", "token_loaded")]
    assert fetches == ["token_fetched", "token_loaded"] * 2


def test_a_copied_transport_shares_the_store_and_a_pickled_one_reconnects(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """deepcopy shares the store; pickle rebuilds it from its URL; a client's store refuses."""

    import redis.asyncio

    with RedisTokenStore.from_url(redis_server.url, timeout=SLOW_MACHINE) as store:
        transport = with_store(live_emulator, store)
        assert execute_on_threads(transport) == []
        assert execute_on_threads(copy.deepcopy(transport)) == []
        thawed = pickle.loads(pickle.dumps(transport))
        assert execute_on_threads(thawed) == []
        assert live_emulator.counters.token_requests == 1
        del thawed  # and its own store, rebuilt from the URL, closed when collected
        gc.collect()
    with (
        RedisTokenStore(redis.asyncio.Redis(port=redis_server.port)) as given,
        pytest.raises(TypeError, match="from_url"),
    ):
        pickle.dumps(given)


def test_a_token_store_that_is_not_one_is_refused(live_emulator: Emulator) -> None:
    """token_store= must have the protocol's methods; the message names the missing one."""
    with pytest.raises(ConfigurationError, match=r"has no load\(\)"):
        with_store(live_emulator, "redis://127.0.0.1:6379")  # type: ignore[arg-type]


class RacingStore(RedisTokenStore):
    """A RedisTokenStore where another process acts just before each lock call."""

    before_lock: Any = None
    slow_lock = 0.0

    async def lock(self, identity: TokenIdentity, owner: str, ttl: float) -> str | None:
        if self.before_lock is not None:
            await self.before_lock(identity)
        taken = await super().lock(identity, owner, ttl)
        await asyncio.sleep(self.slow_lock)  # the answer is lost on the way back
        return taken


def racing_store(
    url: str, timeout: float = SLOW_MACHINE, connect_timeout: float = SLOW_MACHINE
) -> RacingStore:
    store = RedisTokenStore.from_url(url, timeout=timeout, connect_timeout=connect_timeout)
    store.__class__ = RacingStore
    return store  # type: ignore[return-value]


async def test_the_lock_is_released_when_a_token_landed_before_it(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """A token written between the read and the lock is used, and the lock released."""
    written = await token_of_its_own(live_emulator)  # the token another process fetched
    live_emulator.reset_counters()
    with racing_store(redis_server.url) as store:

        async def another_process_writes(identity: TokenIdentity) -> None:
            store.before_lock = None
            await store.save(identity, StoredToken(written, 60.0, 60.0))

        store.before_lock = another_process_writes
        transport = with_store(live_emulator, store)
        await query(transport)
        assert transport.token is not None
        assert transport.token.value == written
        assert [name for name, _ in redis_server.dump() if name.endswith(b":lock")] == []
    assert live_emulator.counters.token_requests == 0


async def test_a_lock_call_that_timed_out_is_released(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """A lock taken whose answer came too late is released, so nobody waits out its lifetime."""
    events: list[AuthEvent] = []
    with racing_store(redis_server.url, timeout=0.25, connect_timeout=0.25) as store:
        # The lock's answer never comes back: the call's guard, past the store's own
        # bounds, ends it (the guard allows a second past timeout and connect_timeout).
        store.slow_lock = HANG_GUARD
        await query(with_store(live_emulator, store, events))
        await wait_until(
            lambda: not [n for n, _ in redis_server.dump() if n.endswith(b":lock")], timeout=2
        )
    assert [e.name for e in events] == ["token_store_failed", "token_fetched"]


def test_without_the_extra_the_import_error_names_it() -> None:
    """Without redis-py, importing gql_service_auth.redis says which extra to install."""
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "try:\n"
        "    import gql_service_auth.redis\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'gql-service-auth[redis]'" in done.stdout


def test_nothing_else_imports_redis() -> None:
    """The transports work without redis-py: only gql_service_auth.redis imports it."""
    code = (
        "import sys; import gql_service_auth.transports, gql_service_auth.cli\n"
        "import gql_service_auth.pytest_plugin, gql_service_auth.emulator\n"
        "extra = ('redis', 'redis.', 'cryptography')\n"
        "print(sorted(m for m in sys.modules if m.startswith(extra)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("latency", [0.0, 0.3])
async def test_waiters_of_a_dead_holder_take_over_one_at_a_time(
    live_emulator: Emulator, store: RedisTokenStore, latency: float
) -> None:
    """A holder died with the lock as 6 transports started cold: after it, one fetch only.

    Waiters wait for the lock's end by Redis's clock: the one that takes it over fetches,
    and the others wait for its lock in turn rather than all fetching at once.
    """
    live_emulator.token_latency = latency
    events: list[AuthEvent] = []
    # A deadline past the dead lock's 2 s, with room for the taker's fetch on a slow machine.
    retry = RetryPolicy(wait_initial=0, wait_max=0, wait_jitter=0, timeout=5.0)
    transports = [with_store(live_emulator, store, events, retry=retry) for _ in range(6)]
    # The lock a process killed right after taking it leaves behind, for as long as a
    # fetch lock lives (2 s, docs/tokens.md says).
    assert await store.lock(identity_of(live_emulator), "dead-owner", 2.0) is None
    await asyncio.wait_for(asyncio.gather(*(query(t, 5) for t in transports)), 30)
    # Before waiters waited by Redis's clock, 5 or 6. A PTTL of 0, the dead lock's last
    # millisecond, once passed for a lock taken too, and made 2 under CPU load.
    assert live_emulator.counters.token_requests == 1
    assert [e.name for e in events].count("token_loaded") == 5


async def test_a_closed_store_is_left_alone_quietly(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """After close(), transports fetch for themselves, with no store warning."""
    events: list[AuthEvent] = []
    store = RedisTokenStore.from_url(redis_server.url, timeout=SLOW_MACHINE)
    transport = with_store(live_emulator, store, events)
    await query(transport)
    store.close()
    for _ in range(3):
        live_emulator.revoke_tokens()
        await query(transport)
    assert live_emulator.counters.token_requests == 4
    assert "token_store_failed" not in [e.name for e in events]


async def test_a_stored_token_keeps_the_guard_and_margin_of_its_whole_lifetime(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """Read with 0.6 s left of 1 s, a token is renewed 0.5 s and not sent 0.1 s before expiry.

    As in the process that fetched it; computed from the time left, they would be 0.3 s
    and 0.06 s, and a token read late would be sent in its last moments.
    """
    fetched = with_store(live_emulator, None)
    await query(fetched)
    assert fetched.token is not None
    reader = with_store(live_emulator, store)
    await store.save(identity_of(live_emulator), StoredToken(fetched.token.value, 0.6, 1.0))
    await query(reader)  # loads it, and sends it: it has 0.5 s left before its guard
    token = reader.token
    assert token is not None
    assert token.value == fetched.token.value
    assert token.expires_at - token.usable_until == pytest.approx(0.1)
    assert token.expires_at - token.renew_at == pytest.approx(0.5)


async def test_a_renewal_never_reads_back_the_token_it_renews(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """Readers of 2 s tokens load each new token once, not the old one again first."""
    live_emulator.token_ttl = 2.0
    events: list[AuthEvent] = []
    transports = [with_store(live_emulator, store, events) for _ in range(3)]

    async def loop(transport: OAuth2Transport, until: float) -> None:
        async with Client(transport=transport) as session:
            while time.monotonic() < until:
                await session.execute(COUNT)
                await asyncio.sleep(0.02)

    until = time.monotonic() + 3.5
    await asyncio.gather(*(loop(t, until) for t in transports))
    names = [e.name for e in events]
    fetched, loaded = names.count("token_fetched"), names.count("token_loaded")
    assert fetched >= 2
    # Each token is fetched by one transport and loaded once by each of the two others.
    assert loaded <= 2 * fetched + 1


async def test_a_huge_expires_in_does_not_poison_the_store(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """A server's absurd (but finite) expires_in must not leave Redis stuck for this identity."""
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(redis_server.url, cooldown=0, timeout=SLOW_MACHINE) as store:
        live_emulator.expires_in_override = 1e16  # finite: the grant accepts it
        await query(with_store(live_emulator, store, events))
        live_emulator.expires_in_override = None
        dump = redis_server.dump()
        ttls = [command(redis_server.port, "PTTL", name.decode()) for name, _ in dump]
        print("keys after the huge token:", [n for n, _ in dump], ttls)
        # The server now sends ordinary tokens; revoke the absurd one.
        live_emulator.revoke_tokens()
        for _ in range(3):
            await query(with_store(live_emulator, store, events))
    names = [e.name for e in events]
    print(names, live_emulator.counters.token_requests)
    assert all(b":-1" not in t for t in ttls), f"a key without expiry was left: {ttls}"
    assert "token_store_failed" not in names
    # 1 huge + 1 renewal after the revocation, then the others read it
    assert live_emulator.counters.token_requests == 2


async def test_timed_out_calls_leave_no_reply_behind(redis_server: RedisServer) -> None:
    """Calls to a slow Redis that time out leave no late reply for the next call to read."""
    ident = TokenIdentity("https://auth.test/token", "id", "secret-value-123")
    mismatches = []
    with RedisTokenStore.from_url(redis_server.url, timeout=0.25, cooldown=0) as store:
        await store.load(ident)
        for round_ in range(5):
            blocker = threading.Thread(
                target=command, args=(redis_server.port, "DEBUG", "SLEEP", "0.4")
            )
            blocker.start()
            await asyncio.sleep(0.05)
            for call in (store.load(ident), store.save(ident, StoredToken("tok", 60, 60))):
                try:
                    await asyncio.wait_for(call, 0.25)
                except BaseException as exc:
                    print(round_, type(exc).__name__)
            blocker.join()
            # Redis is quick again: a lock nobody holds must be taken, and released.
            if await store.lock(ident, "owner", 5.0):
                mismatches.append((round_, "lock refused"))
            else:
                await store.unlock(ident, "owner")
            if await store.lock(ident, "other", 5.0):
                mismatches.append((round_, "lock stuck"))
            redis_server.flush()
    assert mismatches == []


@pytest.mark.parametrize("shared", [True, False], ids=["store", "nostore"])
async def test_field_refusals_cost_no_more_with_a_store(
    live_emulator: Emulator, redis_server: RedisServer, shared: bool
) -> None:
    """Refusals inside resolvers, on 4 transports: no more token requests with a store."""
    events: list[AuthEvent] = []
    outcomes: list[str] = []
    with RedisTokenStore.from_url(redis_server.url, timeout=2.0) as opened:
        store = opened if shared else None
        transports = [with_store(live_emulator, store, events) for _ in range(4)]
        for t in transports:
            await query(t)
        base = live_emulator.counters.token_requests
        for _ in range(3):
            for t in transports:
                live_emulator.refuse_fields(1)
                try:
                    await query(t)
                    outcomes.append("ok")
                except Exception as exc:
                    outcomes.append(type(exc).__name__)
                await query(t)  # an accepted answer in between
    extra = live_emulator.counters.token_requests - base
    print("shared" if shared else "alone", "initial", base, "extra", extra, outcomes)
    if shared:
        assert base == 1
    assert "TokenRequestError" not in outcomes


async def test_processes_with_another_store_key_do_not_interfere(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """Stores with another store_key on one Redis keep their tokens apart."""
    events: list[AuthEvent] = []
    with (
        RedisTokenStore.from_url(
            redis_server.url, store_key=b"a" * 32, timeout=SLOW_MACHINE
        ) as one,
        RedisTokenStore.from_url(
            redis_server.url, store_key=b"b" * 32, timeout=SLOW_MACHINE
        ) as other,
    ):
        await query(with_store(live_emulator, one, events))
        await query(with_store(live_emulator, other, events))
        await query(with_store(live_emulator, one, events))
        await query(with_store(live_emulator, other, events))
    names = [e.name for e in events]
    print(names)
    assert names == ["token_fetched", "token_fetched", "token_loaded", "token_loaded"]
    assert len([n for n, _ in redis_server.dump() if n.endswith(b":token")]) == 2
