"""The shared Redis token store at its boundaries: probes from the adversarial review.

close() racing fetches, a huge expires_in, exits and collections with calls in flight,
fork with a client of the user's, secrets in every failure path. Each test is bounded in
time; Redis servers come from conftest's fixtures (127.0.0.1).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from gql import Client
from redis_server import RedisServer, command
from support import COUNT, fleet_config, query, secrets_shown, with_store

from gql_service_auth import (
    AuthEvent,
    OAuth2Transport,
    StoredToken,
    TokenIdentity,
    TokenRequestError,
)
from gql_service_auth.emulator import Emulator
from gql_service_auth.redis import RedisTokenStore

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator().run_in_thread() as running:
        yield running


def quiet(stderr: str) -> str:
    """``stderr`` without asyncio's debug-mode notes of slow steps (a loaded machine)."""
    return "\n".join(
        line
        for line in stderr.splitlines()
        if not re.match(r"Executing <.*> took [0-9.]+ seconds$", line)
    )


def run_script(
    code: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


# 1. A huge expires_in: the save script fails half-way and leaves a key with no TTL.


async def test_a_huge_expires_in_does_not_poison_the_store(
    emulator: Emulator, redis_server: RedisServer
) -> None:
    """A server's absurd (but finite) expires_in must not leave Redis stuck for this identity."""
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(redis_server.url, cooldown=0) as store:
        emulator.expires_in_override = 1e16  # finite: the grant accepts it
        await query(with_store(emulator, store, events))
        emulator.expires_in_override = None
        dump = redis_server.dump()
        ttls = [command(redis_server.port, "PTTL", name.decode()) for name, _ in dump]
        print("keys after the huge token:", [n for n, _ in dump], ttls)
        # The server now sends ordinary tokens; revoke the absurd one.
        emulator.revoke_tokens()
        for _ in range(3):
            await query(with_store(emulator, store, events))
    names = [e.name for e in events]
    print(names, emulator.counters.token_requests)
    assert all(b":-1" not in t for t in ttls), f"a key without expiry was left: {ttls}"
    assert "token_store_failed" not in names
    # 1 huge + 1 renewal after the revocation, then the others read it
    assert emulator.counters.token_requests == 2


# 2. close() while a Redis call is in flight.


@pytest.mark.parametrize("connected", [True, False], ids=["during-a-read", "during-connect"])
async def test_closing_the_store_during_a_call_fails_no_query(
    emulator: Emulator, own_redis: RedisServer, connected: bool
) -> None:
    """close() while a Redis call hangs (a read, or the first connect): a direct fetch."""
    events: list[AuthEvent] = []
    store = RedisTokenStore.from_url(own_redis.url, timeout=3.0)
    transport = with_store(emulator, store, events)
    if connected:  # the hang is then on a read, not on connect
        identity = TokenIdentity("https://auth.test/token", "id", "secret-value-123")
        assert await store.load(identity) is None
    own_redis.pause()
    try:
        closer = threading.Timer(0.5, store.close)
        closer.start()
        try:
            await asyncio.wait_for(query(transport), 15)
            outcome = "ok"
        except Exception as exc:  # reported below
            outcome = f"{type(exc).__name__}: {exc}"
        closer.join()
    finally:
        own_redis.resume()
    assert outcome == "ok", [(e.name, e.error) for e in events]


# 3. Interpreter exit, collection, loops that close: -X dev -W error, stderr must be empty.

CHILD_PRELUDE = """
import asyncio, gc, json, os, sys, time, threading
sys.path.insert(0, "tests")
from gql import Client
from support import COUNT
from gql_service_auth import OAuth2Transport, RetryPolicy
from gql_service_auth.redis import RedisTokenStore
cfg = json.loads(os.environ["CFG"])
def transport(store, **kw):
    return OAuth2Transport(cfg["graphql_url"], token_url=cfg["token_url"],
        client_id=cfg["client_id"], client_secret=cfg["client_secret"],
        retry=RetryPolicy(wait_initial=0, wait_max=0, wait_jitter=0, timeout=2.0),
        token_store=store, **kw)
"""


def child_env(emulator: Emulator, redis_url: str) -> dict[str, str]:
    return {"CFG": json.dumps(fleet_config(emulator, redis_url))}


def test_exit_with_an_open_store_is_silent(emulator: Emulator, redis_server: RedisServer) -> None:
    done = run_script(
        CHILD_PRELUDE
        + """
store = RedisTokenStore.from_url(cfg["redis_url"], timeout=5.0)
t = transport(store)
loop = asyncio.new_event_loop(); asyncio.set_event_loop(loop)
Client(transport=t).execute(COUNT)   # gql's sync execute never closes a loop it makes
asyncio.set_event_loop(None); loop.close()
t2 = transport(store)
async def main():
    async with Client(transport=t2) as s:
        await s.execute(COUNT)
asyncio.run(main())
print("done")
""",
        child_env(emulator, redis_server.url),
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert quiet(done.stderr) == ""


def test_a_collected_store_is_silent(emulator: Emulator, redis_server: RedisServer) -> None:
    done = run_script(
        CHILD_PRELUDE
        + """
for _ in range(3):
    store = RedisTokenStore.from_url(cfg["redis_url"], timeout=5.0)
    t = transport(store)
    asyncio.run(Client(transport=t).execute_async(COUNT))
    del t, store
    gc.collect()
print(threading.active_count())
""",
        child_env(emulator, redis_server.url),
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert quiet(done.stderr) == ""


def test_exit_during_a_hung_redis_call_is_silent(
    emulator: Emulator, own_redis: RedisServer
) -> None:
    """The process exits while a token fetch waits on a frozen Redis (timeout 5 s)."""
    own_redis.pause()
    try:
        done = run_script(
            CHILD_PRELUDE
            + """
store = RedisTokenStore.from_url(cfg["redis_url"], timeout=5.0)
t = transport(store)
def run():
    asyncio.run(Client(transport=t).execute_async(COUNT))
threading.Thread(target=run, daemon=True).start()
time.sleep(1.0)
print("exiting")
""",
            child_env(emulator, own_redis.url),
        )
    finally:
        own_redis.resume()
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    # The library's own warning (logging's last resort) is expected; nothing else.
    other = [line for line in done.stderr.splitlines() if not line.startswith("gql_service_auth.")]
    assert other == []


def test_a_store_call_from_a_loop_that_closes_is_silent(
    emulator: Emulator, own_redis: RedisServer
) -> None:
    """A caller's loop closes with a store call in flight; Redis answers later."""
    own_redis.pause()
    threading.Timer(1.0, own_redis.resume).start()
    done = run_script(
        CHILD_PRELUDE
        + """
from gql_service_auth import TokenIdentity
store = RedisTokenStore.from_url(cfg["redis_url"], timeout=5.0)
ident = TokenIdentity("https://auth.test/token", "id", "secret-value-123")
loop = asyncio.new_event_loop()
task = loop.create_task(store.load(ident))
loop.run_until_complete(asyncio.sleep(0.2))
task.cancel()
loop.run_until_complete(asyncio.sleep(0))
loop.close()
del task, loop
time.sleep(2.0)   # Redis resumes and answers meanwhile
async def again():
    return await store.load(ident)
print("again", asyncio.run(again()))
del store
gc.collect()
time.sleep(0.5)
print("end")
""",
        child_env(emulator, own_redis.url),
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert quiet(done.stderr) == ""


# 4. Concurrency: threads and coroutines on two transports sharing one store.


def sync_on_threads(transports: list[OAuth2Transport], per: int) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(transports) * per, timeout=10)

    def target(t: OAuth2Transport) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            barrier.wait()
            Client(transport=t, execute_timeout=20).execute(COUNT)
        except BaseException as exc:
            errors.append(exc)
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    threads = [threading.Thread(target=target, args=(t,)) for t in transports for _ in range(per)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not any(th.is_alive() for th in threads)
    return errors


@pytest.mark.parametrize("latency", [0.0, 0.4])
def test_threads_on_two_transports_cold_cache(
    emulator: Emulator, redis_server: RedisServer, latency: float
) -> None:
    emulator.token_latency = latency
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(redis_server.url) as store:
        transports = [with_store(emulator, store, events) for _ in range(2)]
        errors = sync_on_threads(transports, 12)
    print(errors, emulator.counters.token_requests, [e.name for e in events])
    assert errors == []
    assert emulator.counters.token_requests == 1
    assert sorted(e.name for e in events) == ["token_fetched", "token_loaded"]


async def test_coroutines_on_many_transports_after_revocation(
    emulator: Emulator, redis_server: RedisServer
) -> None:
    """8 transports x 30 queries; revoke; again: one fetch each time, no failure."""
    emulator.token_latency = 0.2
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(redis_server.url) as store:
        transports = [with_store(emulator, store, events) for _ in range(8)]
        await asyncio.wait_for(asyncio.gather(*(query(t, 30) for t in transports)), 30)
        assert emulator.counters.token_requests == 1
        emulator.revoke_tokens()
        await asyncio.wait_for(asyncio.gather(*(query(t, 30) for t in transports)), 30)
    names = [e.name for e in events]
    print(
        emulator.counters.token_requests, names.count("token_fetched"), names.count("token_loaded")
    )
    assert emulator.counters.token_requests == 2
    assert "token_store_failed" not in names


# 5. The token endpoint fails while others wait for the lock.


@pytest.mark.parametrize(("status", "count"), [(503, 2), (400, 1)])
async def test_waiters_share_the_outcome_of_the_holders_fetch(
    emulator: Emulator, redis_server: RedisServer, status: int, count: int
) -> None:
    """Transports waiting on another's fetch get its token; not its credentials' error."""
    emulator.token_latency = 0.3
    emulator.fail_token_requests(count, status)
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(redis_server.url) as store:
        holder = with_store(emulator, store, events)
        waiters = [with_store(emulator, store, events) for _ in range(4)]

        async def guarded(t: OAuth2Transport) -> str:
            try:
                await query(t, 5)
                return "ok"
            except Exception as exc:
                return type(exc).__name__

        first = asyncio.ensure_future(guarded(holder))
        await asyncio.sleep(0.1)  # the holder has the lock
        outcomes = await asyncio.wait_for(
            asyncio.gather(first, *(guarded(t) for t in waiters)), 30
        )
    # 503s are retried by the holder, within its fetch: everyone succeeds on its token. A
    # 400 fails the holder's own callers only, as without a store: a failure of the
    # holder's credentials is not shared (another process may hold another secret).
    assert outcomes[1:] == ["ok"] * 4
    assert emulator.counters.token_requests == count + 1


# 6. Clock: 1 s tokens, refresh_margin 0, continuous load on 4 transports.


@pytest.mark.parametrize("margin", [0.0, 60.0])
async def test_one_second_tokens_under_load(
    emulator: Emulator, redis_server: RedisServer, margin: float
) -> None:
    """1 s tokens, 4 transports x 5 loops for 2.5 s: none sent expired, whatever the margin."""
    shared = True
    emulator.token_ttl = 1.0
    events: list[AuthEvent] = []
    failures: list[str] = []
    with RedisTokenStore.from_url(redis_server.url, timeout=2.0) as opened:
        store = opened if shared else None
        transports = [with_store(emulator, store, events, refresh_margin=margin) for _ in range(4)]

        async def worker(session: Any, until: float) -> None:
            while time.monotonic() < until:
                try:
                    await session.execute(COUNT)
                except Exception as exc:
                    failures.append(type(exc).__name__)
                await asyncio.sleep(0.01)

        async def per_transport(t: OAuth2Transport, until: float) -> None:
            async with Client(transport=t) as session:
                await asyncio.gather(*(worker(session, until) for _ in range(5)))

        until = time.monotonic() + 2.5
        await asyncio.wait_for(asyncio.gather(*(per_transport(t, until) for t in transports)), 30)
    names = [e.name for e in events]
    print(
        "failures",
        failures,
        "token requests",
        emulator.counters.token_requests,
        "graphql",
        emulator.counters.graphql_requests,
        "unauthenticated",
        emulator.counters.unauthenticated_responses,
        {n: names.count(n) for n in set(names)},
    )
    print(
        "loaded with seconds left:",
        sorted(round(e.expires_in, 3) for e in events if e.name == "token_loaded")[:8],
    )
    assert failures == []
    # Refusals of tokens that expired in flight on a loaded machine are re-sent; the
    # guard itself is checked without timing in test_token_store.py.
    # 2.5 s of 1 s tokens renewed at half-life: 6 for the fleet (1 + 2.5 / 0.5), 7 with one
    # at the window's end, and one more per time Redis was slower than its timeout; without
    # a store, 4 transports would make up to 24.
    if shared:
        slow = names.count("token_store_failed")
        assert emulator.counters.token_requests <= 7 + slow


# 7. close() racing with fetches that are starting.


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_closing_the_store_while_fetches_start_fails_no_query(
    emulator: Emulator, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queries on 16 threads; the store is closed as their fetches begin: 0 failures."""
    thread_errors: list[str] = []
    monkeypatch.setattr(
        threading, "excepthook", lambda args: thread_errors.append(args.exc_type.__name__)
    )
    failures: list[str] = []
    for delay in (0.0, 0.002, 0.005, 0.01, 0.02, 0.03):
        store = RedisTokenStore.from_url(redis_server.url)
        transports = [with_store(emulator, store) for _ in range(16)]
        errors: list[BaseException] = []

        def target(t: OAuth2Transport, errors: list[BaseException] = errors) -> None:
            try:
                asyncio.run(Client(transport=t, execute_timeout=20).execute_async(COUNT))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=target, args=(t,)) for t in transports]
        for th in threads:
            th.start()
        time.sleep(delay)
        store.close()
        for th in threads:
            th.join(30)
        failures += [f"{delay}: {type(e).__name__}: {e}" for e in errors]
        redis_server.flush()
    print("redis port", redis_server.port, "emulator", emulator.port)
    print(failures, thread_errors)
    assert failures == []
    assert thread_errors == []


# 8. A slow Redis: calls that time out must not leave replies for the next call.


async def test_timed_out_calls_leave_no_reply_behind(redis_server: RedisServer) -> None:
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


# 9. Secrets: a Redis URL password, the store_key, the client secret, in any failure path.

REDIS_PASSWORD = "hunter2-redis-password-8c1f"
STORE_KEY = "store-key-material-5a7e-0011"


@pytest.mark.parametrize(
    "url_of",
    [
        lambda port: f"redis://user:{REDIS_PASSWORD}@127.0.0.1:{port}/0",  # ACL refuses
        lambda port: f"redis://user:{REDIS_PASSWORD}@127.0.0.1:{port}/notadb",
    ],
    ids=["wrong-password", "bad-db"],
)
async def test_no_secret_in_the_error_when_redis_and_the_token_endpoint_fail(
    emulator: Emulator,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    url_of: Any,
) -> None:
    emulator.fail_token_requests(1, 401, body={"error": "invalid_client"})
    events: list[AuthEvent] = []
    client = emulator.recent_client
    with RedisTokenStore.from_url(url_of(redis_server.port), store_key=STORE_KEY) as store:
        transport = with_store(emulator, store, events)
        with pytest.raises(TokenRequestError) as info:
            await query(transport)
        shown = repr(store) + repr(vars(store)) + repr(transport) + repr(vars(transport))
        shown += repr(vars(transport._tokens)) + repr(vars(transport._tokens._shared))
    exc = info.value
    secrets = [REDIS_PASSWORD, STORE_KEY, client.client_secret]
    where = secrets_shown(exc, secrets, own=HERE)
    chain = []
    link: BaseException | None = exc
    while link is not None:
        chain.append(f"{type(link).__name__}: {link}")
        link = link.__cause__ or link.__context__
    print([(e.name, e.error) for e in events])
    print("chain:", chain)
    print("shown at:", where)
    logs = "".join(r.getMessage() + repr(r.__dict__) for r in caplog.records)
    assert not any(s in logs for s in secrets)
    assert not any(s in shown for s in secrets)
    assert where == []


# 10. Refusals while running (field-level UNAUTHENTICATED), across transports.


@pytest.mark.parametrize("shared", [True, False], ids=["store", "nostore"])
async def test_field_refusals_cost_no_more_with_a_store(
    emulator: Emulator, redis_server: RedisServer, shared: bool
) -> None:
    events: list[AuthEvent] = []
    outcomes: list[str] = []
    with RedisTokenStore.from_url(redis_server.url, timeout=2.0) as opened:
        store = opened if shared else None
        transports = [with_store(emulator, store, events) for _ in range(4)]
        for t in transports:
            await query(t)
        base = emulator.counters.token_requests
        for _ in range(3):
            for t in transports:
                emulator.refuse_fields(1)
                try:
                    await query(t)
                    outcomes.append("ok")
                except Exception as exc:
                    outcomes.append(type(exc).__name__)
                await query(t)  # an accepted answer in between
    extra = emulator.counters.token_requests - base
    print("shared" if shared else "alone", "initial", base, "extra", extra, outcomes)
    if shared:
        assert base == 1
    assert "TokenRequestError" not in outcomes


# 11. Redis restarted (state lost) under the store; another store_key on the same Redis.


async def test_the_store_recovers_after_a_redis_restart(
    emulator: Emulator, own_redis: RedisServer
) -> None:
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(own_redis.url, cooldown=0.5) as store:
        await query(with_store(emulator, store, events))
        own_redis.stop()
        own_redis.start()
        await query(with_store(emulator, store, events))  # stale connection: fall back
        await asyncio.sleep(0.6)
        await query(with_store(emulator, store, events))  # cool-down over: Redis again
        await query(with_store(emulator, store, events))
    names = [e.name for e in events]
    print(names, emulator.counters.token_requests)
    assert names[-1] == "token_loaded"
    assert emulator.counters.token_requests <= 3


async def test_processes_with_another_store_key_do_not_interfere(
    emulator: Emulator, redis_server: RedisServer
) -> None:
    events: list[AuthEvent] = []
    with (
        RedisTokenStore.from_url(redis_server.url, store_key=b"a" * 32) as one,
        RedisTokenStore.from_url(redis_server.url, store_key=b"b" * 32) as other,
    ):
        await query(with_store(emulator, one, events))
        await query(with_store(emulator, other, events))
        await query(with_store(emulator, one, events))
        await query(with_store(emulator, other, events))
    names = [e.name for e in events]
    print(names)
    assert names == ["token_fetched", "token_fetched", "token_loaded", "token_loaded"]
    assert len(redis_server.dump()) == 2


# 12. pickle / copy.deepcopy of a transport with a store.


def test_deepcopy_of_a_transport_with_a_store(redis_server: RedisServer) -> None:
    """pickle and copy.deepcopy of a transport work with a store, and the copy shares it."""
    with RedisTokenStore.from_url(redis_server.url) as store:
        kw = dict(token_url="https://auth.example/token", client_id="cid", client_secret="s" * 20)
        shared = OAuth2Transport("https://api.example/graphql", token_store=store, **kw)
        copied = copy.deepcopy(shared)
        assert copied._tokens._shared._store is store
        thawed = pickle.loads(pickle.dumps(shared))
        assert isinstance(thawed._tokens._shared._store, RedisTokenStore)
        thawed._tokens._shared._store.close()


# 13. fork() with RedisTokenStore(client): the child's close() leaves its connection open.


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_closes_the_connection_of_a_given_client(
    emulator: Emulator, redis_server: RedisServer
) -> None:
    done = run_script(
        CHILD_PRELUDE
        + """
import redis.asyncio
from redis_server import command
port = int(os.environ["REDIS_PORT"])
def clients():
    return command(port, "CLIENT", "LIST").count(b"cmd=") - 1   # minus this probe
store = RedisTokenStore(redis.asyncio.Redis(port=port, socket_timeout=0.25))
asyncio.run(Client(transport=transport(store)).execute_async(COUNT))
pid = os.fork()
if pid == 0:
    asyncio.run(Client(transport=transport(store)).execute_async(COUNT))
    before = clients()
    store.close()
    gc.collect()
    time.sleep(0.2)
    print("child: connections closed", before - clients(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
store.close()
""",
        {**child_env(emulator, redis_server.url), "REDIS_PORT": str(redis_server.port)},
    )
    print(done.stdout, done.stderr)
    assert "connections closed 1" in done.stdout  # the child's own; the parent's is left


# 14. A store finalized on its own thread.


def test_a_store_finalized_on_its_own_thread(
    emulator: Emulator, redis_server: RedisServer
) -> None:
    """The caller's loop goes away with a call in flight; the last reference to the store
    is then the call's own closure, dropped on the store's thread when Redis answers."""
    done = run_script(
        CHILD_PRELUDE
        + """
from gql_service_auth import TokenIdentity
from redis_server import command
port = int(os.environ["REDIS_PORT"])
ident = TokenIdentity("https://auth.test/token", "id", "secret-value-123")
store = RedisTokenStore.from_url(cfg["redis_url"], timeout=5.0)
async def main():
    await store.load(ident)
    threading.Thread(target=command, args=(port, "DEBUG", "SLEEP", "0.3")).start()
    await asyncio.sleep(0.05)
    task = asyncio.ensure_future(store.load(ident))
    await asyncio.sleep(0.05)
    return task
loop = asyncio.new_event_loop()
task = loop.run_until_complete(main())
task.cancel()
loop.close()          # the cancellation never ran: the store's task goes on
del task, loop, main, store
time.sleep(2.0)
print("end", flush=True)
""",
        {**child_env(emulator, redis_server.url), "REDIS_PORT": str(redis_server.port)},
    )
    print(done.stdout, done.stderr)
    assert "cannot join current thread" not in done.stderr
    assert "took 1.0" not in done.stderr
