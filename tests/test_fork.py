"""fork(): a child of a process using a transport or a store works on its own.

The child never waits on its parent's fetch or renewal, never uses or closes its parent's
connections, and renews through the same proxy; the parent goes on unharmed. Children are
forked from the test (``in_child``, bounded) or from a script in a fresh interpreter.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from gql import Client
from redis_server import RedisServer
from support import (
    ANSWER,
    CHILD_PRELUDE,
    COUNT,
    KINDS,
    STACK_REASONS,
    bare_401s,
    blocking_execute,
    build_transport,
    child_env,
    connected,
    finish,
    in_child,
    poll,
    renewed,
    run_python,
    run_script,
    running_proxy,
    start_thread,
    sync_execute,
)

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import Emulator, ManualClock


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
@pytest.mark.usefixtures("no_resource_left_open")
def test_a_forked_child_does_not_wait_on_the_parents_fetch(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Forked while another thread's fetch is in flight, the child's first query succeeds."""
    emulator.token_latency = 0.5
    transport = make_oauth2()
    fetching = start_thread(lambda: sync_execute(transport, 5))
    try:
        assert poll(lambda: emulator.counters.token_requests == 1)
        child = in_child(lambda: sync_execute(transport, 5), timeout=8)
    finally:
        finish(fetching)
    assert child == (0, "ok")


@pytest.mark.usefixtures("no_resource_left_open")
def test_a_forked_child_renews_for_itself_while_the_parents_renewal_runs(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Forked mid-renewal: the child's query goes out with the token at once, and the child
    renews on its own thread, not waiting for the parent's renewal it has no thread of."""
    transport = make_oauth2()
    assert sync_execute(transport, 5) == ANSWER
    clock.advance(3600 - 60 + 1)
    emulator.token_latency = 0.5
    assert sync_execute(transport, 5) == ANSWER  # starts the parent's background renewal
    assert poll(lambda: emulator.counters.token_requests == 2)

    def child() -> None:
        assert sync_execute(transport, 5) == ANSWER
        assert poll(renewed(transport, 2))

    assert in_child(child, timeout=8) == (0, "ok")
    assert poll(renewed(transport, 2))
    assert emulator.counters.token_requests == 3  # first, the parent's and the child's renewal


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
def test_a_forked_child_does_not_reuse_the_parents_connected_session(
    emulator: Emulator, kind: str
) -> None:
    """Forked inside a connected session on the forking thread, the child's own query succeeds."""
    transport = build_transport(kind, emulator)
    with connected(Client(transport=transport, execute_timeout=3)) as (loop, session):
        loop.run_until_complete(session.execute(COUNT))
        child = in_child(lambda: sync_execute(transport, 5), timeout=8)
        try:  # the parent's session must be unharmed by whatever the child did
            after: object = loop.run_until_complete(session.execute(COUNT))
        except Exception as exc:  # shown by the assertion below
            after = exc
    assert (child, after) == ((0, "ok"), ANSWER)


FORKED_CHILD_EXITS = """
import asyncio, os, sys
from gql import Client, gql
from gql_service_auth import {cls}
from gql_service_auth.emulator import Emulator, ManualClock

COUNT = gql("query {{ carriers(first: 1) {{ totalCount }} }}")

async def main(transport, emulator):
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        pid = os.fork()
        if pid == 0:
            return "child"
        _, status = os.waitpid(pid, 0)
        emulator.revoke_tokens()  # OAuth2: a renewal, woken up from the fetch's thread
        await asyncio.wait_for(session.execute(COUNT), 5)  # the parent still works
        return f"parent: child exited {{os.waitstatus_to_exitcode(status)}}"

with Emulator().run_in_thread() as emulator:
    client = emulator.recent_client
    extra = {{"token_url": emulator.token_url}} if "{cls}" == "OAuth2Transport" else {{}}
    transport = {cls}(
        emulator.graphql_url,
        client_id=client.client_id,
        client_secret=client.client_secret,
        **extra,
    )
    loop = asyncio.new_event_loop()
    who = loop.run_until_complete(main(transport, emulator))
    if who == "child":
        print(asyncio.run(Client(transport=transport).execute_async(COUNT)), flush=True)
        sys.exit(0)  # a normal exit, as gunicorn and Celery workers make: finalizers run
    print(who, flush=True)
"""


@pytest.mark.parametrize("cls", ["ApiKeyTransport", "OAuth2Transport"])
@pytest.mark.usefixtures("no_resource_left_open")
def test_a_forked_child_exits_without_touching_its_parents_connections(cls: str) -> None:
    """A child that inherited connected sessions exits normally: no warning, parent unharmed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, 3.12+
        done = subprocess.run(
            [sys.executable, "-c", FORKED_CHILD_EXITS.format(cls=cls)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert "parent: child exited 0" in done.stdout
    assert "totalCount" in done.stdout
    assert "Unclosed" not in done.stderr


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
async def test_fork_while_a_background_renewal_is_in_flight(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The child neither waits on the parent's flight nor is stuck: it renews on its own."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        clock.advance(3600 - 60 + 1)  # past renew_at
        # Longer than any query on a loaded machine: a query that waited for a renewal
        # would come back after it landed.
        emulator.token_latency = 5.0
        await session.execute(COUNT)  # the background renewal is in flight

        def child() -> None:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(_child_query(transport))
                assert not renewed(transport, 2)(), "the child waited for a renewal"
                # Its own renewal started: it lands in the child (5 s of token latency).
                assert poll(renewed(transport, 2))
            finally:
                loop.close()

        code, how = await asyncio.to_thread(in_child, child, 90)
    assert (code, how) == (0, "ok")


async def _child_query(transport: OAuth2Transport) -> None:
    async with Client(transport=transport) as session:
        await session.execute(COUNT)


def test_a_forked_child_renews_through_the_token_proxy_after_a_bare_401(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], tmp_path: Path
) -> None:
    """The child's renewal goes through the proxy, as the parent's; neither disturbs the other."""

    def query_succeeds() -> None:
        result = blocking_execute(transport)
        assert isinstance(result, dict), repr(result)

    bare_401s(emulator)
    with running_proxy(tmp_path / "proxy") as proxy:
        transport = make_oauth2(token_proxy=proxy.url)
        query_succeeds()
        emulator.revoke_tokens()
        child = in_child(query_succeeds, timeout=20)
        query_succeeds()  # the parent's token was revoked too: it renews on its own
    assert child == (0, "ok")
    via = ["proxy.py" in r.headers.get("Via", "") for r in emulator.requests if "token" in r.path]
    assert via == [True, True, True]
    assert emulator.counters.unauthenticated_responses == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_closes_the_connection_of_a_given_client(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """A child's close() of a store on the user's client closes its own connection only."""
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
        {**child_env(live_emulator, redis_server.url), "REDIS_PORT": str(redis_server.port)},
    )
    print(done.stdout, done.stderr)
    assert "connections closed 1" in done.stdout  # the child's own; the parent's is left


FORK_DURING_THE_FIRST_FETCH = """
import importlib.abc, os, sys, threading, time
importing = threading.Event()

class SlowAiohttp(importlib.abc.MetaPathFinder):
    # aiohttp takes tens of ms to import; here 0.5 s, so that the fork lands inside it.
    def find_spec(self, name, path, target=None):
        if name == "aiohttp.client":
            importing.set()
            time.sleep(0.5)
        return None

sys.meta_path.insert(0, SlowAiohttp())
from gql import Client, gql
from gql_service_auth.requests import OAuth2RequestsTransport

COUNT = gql("query { carriers(first: 1) { totalCount } }")

def query():
    Client(transport=OAuth2RequestsTransport.from_env(share_tokens=False)).execute(COUNT)

first = threading.Thread(target=query, daemon=True)
first.start()  # its token fetch imports aiohttp on the fetch's own thread
assert importing.wait(30)
pid = os.fork()
if pid == 0:
    try:
        query()
    except BaseException as exc:
        print(f"child: {type(exc).__name__}: {exc}", flush=True)
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
first.join(30)
print(f"child exited {os.waitstatus_to_exitcode(status)}", flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_fork_while_the_first_fetch_imports_aiohttp_leaves_the_child_whole(
    live_emulator: Emulator,
) -> None:
    """The requests and httpx stacks import aiohttp at their first token fetch, on the
    fetch's thread: a process forked during that import (a pre-forking server whose
    master made a query) gets the module whole, and its child fetches tokens."""
    done = run_python(FORK_DURING_THE_FIRST_FETCH, live_emulator.environ())
    assert done.stdout.strip() == "child exited 0", done.stdout + done.stderr


FORK_DURING_THE_FIRST_TRANSPORT = """
import importlib.abc, os, signal, sys, threading, time
importing = threading.Event()

class SlowLevel(importlib.abc.MetaPathFinder):
    # The token machinery takes a few ms to import; here 0.5 s, so that the fork lands in it.
    def find_spec(self, name, path, target=None):
        if name == "gql_service_auth._stores.level":
            importing.set()
            time.sleep(0.5)
        return None

sys.meta_path.insert(0, SlowLevel())
from gql_service_auth.httpx import OAuth2HTTPXTransport

def build():
    OAuth2HTTPXTransport("https://api.example.com/graphql",
                         token_url="https://auth.example.com/oauth2/token",
                         client_id="id", client_secret="secret")

first = threading.Thread(target=build, daemon=True)
first.start()  # the first OAuth2 transport imports the token machinery on this thread
assert importing.wait(30)
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a child stuck on a half-imported module would be killed here
    build()
    os._exit(0)
_, status = os.waitpid(pid, 0)
first.join(30)
print(f"child exited {os.waitstatus_to_exitcode(status)}", flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_fork_while_the_first_transport_imports_the_token_machinery_leaves_the_child_whole() -> (
    None
):
    """The first OAuth2 transport or auth object imports the token manager: a process
    forked while another thread does (a pre-forking server) waits for the import to end,
    and its child builds transports too."""
    done = run_python(FORK_DURING_THE_FIRST_TRANSPORT)
    assert done.stdout.strip() == "child exited 0", done.stdout + done.stderr


FORK_DURING_A_FIRST_USE = """
import os, signal, sys, threading
import gql_service_auth

held, release = threading.Event(), threading.Event()

def first_use_in_progress():
    # What a thread importing a top-level name holds while it imports.
    with gql_service_auth._FIRST_USE:
        held.set()
        release.wait(30)

threading.Thread(target=first_use_in_progress, daemon=True).start()
assert held.wait(30)
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a child stuck on the parent's lock would be killed here
    from gql_service_auth import ConfigurationError
    print(ConfigurationError.__name__, flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
release.set()
print(f"child exited {os.waitstatus_to_exitcode(status)}", flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_forked_during_a_first_use_of_a_name_can_use_names() -> None:
    """The package imports its top-level names on first use, one at a time under a lock:
    a child forked while another thread held it (a pre-forking server) uses them too."""
    done = run_python(FORK_DURING_A_FIRST_USE)
    assert done.stdout.split() == ["ConfigurationError", "child", "exited", "0"], (
        done.stdout + done.stderr
    )
