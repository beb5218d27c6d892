"""The token store's life: close() at any moment, exit, collection, restarts, finalizers.

Against a real ``redis-server`` on 127.0.0.1 (conftest.py) and the emulator on the real
clock. The scripts run in a fresh interpreter with ``-X dev -W error``: whatever they
leave behind shows on stderr, which must stay empty.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from gql import Client
from redis_server import RedisServer
from support import (
    CHILD_PRELUDE,
    COUNT,
    SLOW_MACHINE,
    child_env,
    query,
    quiet,
    run_script,
    with_store,
)

from gql_service_auth import (
    AuthEvent,
    OAuth2Transport,
    TokenIdentity,
)
from gql_service_auth.emulator import Emulator
from gql_service_auth.redis import RedisTokenStore


@pytest.mark.parametrize("connected", [True, False], ids=["during-a-read", "during-connect"])
async def test_closing_the_store_during_a_call_fails_no_query(
    live_emulator: Emulator, own_redis: RedisServer, connected: bool
) -> None:
    """close() while a Redis call hangs (a read, or the first connect): a direct fetch."""
    events: list[AuthEvent] = []
    store = RedisTokenStore.from_url(own_redis.url, timeout=3.0)
    transport = with_store(live_emulator, store, events)
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


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_closing_the_store_while_fetches_start_fails_no_query(
    live_emulator: Emulator, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queries on 16 threads; the store is closed as their fetches begin: 0 failures."""
    thread_errors: list[str] = []
    monkeypatch.setattr(
        threading, "excepthook", lambda args: thread_errors.append(args.exc_type.__name__)
    )
    failures: list[str] = []
    for delay in (0.0, 0.002, 0.005, 0.01, 0.02, 0.03):
        store = RedisTokenStore.from_url(redis_server.url, timeout=SLOW_MACHINE)
        transports = [with_store(live_emulator, store) for _ in range(16)]
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
    print("redis port", redis_server.port, "emulator", live_emulator.port)
    print(failures, thread_errors)
    assert failures == []
    assert thread_errors == []


def test_exit_with_an_open_store_is_silent(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """A program that exits with its store open prints nothing on stderr."""
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
        child_env(live_emulator, redis_server.url),
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert quiet(done.stderr) == ""


def test_a_collected_store_is_silent(live_emulator: Emulator, redis_server: RedisServer) -> None:
    """Stores dropped and collected, three times over: nothing on stderr."""
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
        child_env(live_emulator, redis_server.url),
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert quiet(done.stderr) == ""


def test_exit_during_a_hung_redis_call_is_silent(
    live_emulator: Emulator, own_redis: RedisServer
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
            child_env(live_emulator, own_redis.url),
        )
    finally:
        own_redis.resume()
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    # The library's own warning (logging's last resort) is expected; nothing else.
    stderr = quiet(done.stderr)  # dev mode's notes of slow steps are the machine's
    other = [line for line in stderr.splitlines() if not line.startswith("gql_service_auth.")]
    assert other == []


def test_a_store_call_from_a_loop_that_closes_is_silent(
    live_emulator: Emulator, own_redis: RedisServer
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
        child_env(live_emulator, own_redis.url),
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert quiet(done.stderr) == ""


def test_a_store_finalized_on_its_own_thread(
    live_emulator: Emulator, redis_server: RedisServer
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
        {**child_env(live_emulator, redis_server.url), "REDIS_PORT": str(redis_server.port)},
    )
    print(done.stdout, done.stderr)
    assert "cannot join current thread" not in done.stderr
    assert "took 1.0" not in done.stderr


async def test_the_store_recovers_after_a_redis_restart(
    live_emulator: Emulator, own_redis: RedisServer
) -> None:
    """Redis restarted empty under the store: a direct fetch, then Redis after the cool-down."""
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(own_redis.url, cooldown=0.5) as store:
        await query(with_store(live_emulator, store, events))
        own_redis.stop()
        own_redis.start()
        await query(with_store(live_emulator, store, events))  # stale connection: fall back
        await asyncio.sleep(0.6)
        await query(with_store(live_emulator, store, events))  # cool-down over: Redis again
        await query(with_store(live_emulator, store, events))
    names = [e.name for e in events]
    print(names, live_emulator.counters.token_requests)
    assert names[-1] == "token_loaded"
    assert live_emulator.counters.token_requests <= 3
