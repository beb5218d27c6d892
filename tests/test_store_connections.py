"""The Redis store's connections: set up apart from its calls, healed when Redis, a proxy or
a failover closes or demotes them, and explained when the deployment is misconfigured.

Against real redis-servers on 127.0.0.1 (tests/redis_server.py). The deployments that need
more than one server (a cluster, Sentinel, TLS, a failover behind one address) are in
test_store_deployments.py.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from redis_server import RedisServer, command
from support import (
    HANG_GUARD,
    SLOW_MACHINE,
    closed_port,
    identity_of,
    query,
    tenants,
    token_requests_of,
    wait_until,
    with_store,
)

from gql_service_auth import (
    AuthEvent,
    ConfigurationError,
    OAuth2Transport,
    RetryPolicy,
    StoredToken,
)
from gql_service_auth._stores.local_db import DATABASE
from gql_service_auth.cli import main
from gql_service_auth.emulator import Emulator
from gql_service_auth.local import LocalTokenStore
from gql_service_auth.redis import RedisTokenStore, shared_store


def clients_of(port: int) -> int:
    """The client connections a Redis has, the asking one excluded."""
    answer = command(port, "CLIENT", "LIST").decode()
    return answer.count("id=") - 1


# URL forms.


@pytest.mark.parametrize(
    ("url", "location"),
    [
        ("redis+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2", "redis+cluster://10.0.0.1:7000,10.0.0.2:6379"),
        ("rediss+cluster://clustercfg.example.com:6379?ssl_ca_certs=/ca.pem", "rediss+cluster://clustercfg.example.com:6379"),
        ("redis+sentinel://:pw@s1:26379,s2/tokens/2", "redis+sentinel://s1:26379,s2:26379/tokens/2"),
        ("rediss+sentinel://s1/tokens?sentinel_password=x", "rediss+sentinel://s1:26379/tokens/0"),
        ("rediss://default:pw@[::1]:6380/1", "rediss://[::1]:6380/1"),
    ],
)  # fmt: skip
def test_each_url_form_names_where_it_leads_without_its_secrets(url: str, location: str) -> None:
    with RedisTokenStore.from_url(url) as store:
        assert store.location == location
        assert "p%40ss" not in repr(store)
        assert ":pw" not in repr(store)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://10.0.0.1:7000/3", "database 0 only"),
        ("redis+sentinel://s1:26379", "names the service"),
        ("redis+sentinel://s1:26379/", "names the service"),
        ("redis+cluster://:secret@:7000", "cannot be read"),
        ("sentinel://s1:26379/tokens", "must start with"),
        # A password with an unescaped "/": its rest would pass for the service, or a host.
        ("redis+sentinel://user:12345/secret9@127.0.0.1:1/tokens", "cannot be read"),
        ("redis://user:12/secret9@127.0.0.1:6379", "cannot be read"),
        ("redis+sentinel://u:secret#x@h:1/t", "cannot be read"),
        ("redis://tok:x@secret?more@127.0.0.1:1/0", "cannot be read"),
        ("unix://:pa/secret@/tmp/x.sock", "cannot be read"),
    ],
)
def test_a_url_of_no_known_form_is_refused_without_quoting_it(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as refused:
        RedisTokenStore.from_url(url)
    assert "secret" not in str(refused.value)
    assert refused.value.__context__ is None  # redis-py's message may quote the password


async def test_from_env_takes_the_connect_timeout_from_the_environment(
    live_emulator: Emulator, own_redis: RedisServer
) -> None:
    """SERVICE_TOKEN_STORE_CONNECT_TIMEOUT bounds the set-up of a Redis that answers nothing."""
    environ = {
        **live_emulator.environ(),
        "SERVICE_TOKEN_STORE_URL": own_redis.url,
        "SERVICE_TOKEN_STORE_CONNECT_TIMEOUT": "0.3",
    }
    events: list[AuthEvent] = []
    own_redis.pause()
    try:
        transport = OAuth2Transport.from_env(environ, on_event=events.append, share_tokens=False)
        await query(transport)
    finally:
        own_redis.resume()
        shared_store(own_redis.url, connect_timeout=0.3).close()
    assert [e.name for e in events] == ["token_store_failed", "token_fetched"]
    assert events[0].detail == "not connected within 0.3 s (connect_timeout)"
    environ["SERVICE_TOKEN_STORE_CONNECT_TIMEOUT"] = "soon"
    with pytest.raises(ConfigurationError, match="SERVICE_TOKEN_STORE_CONNECT_TIMEOUT"):
        OAuth2Transport.from_env(environ=environ)


def test_from_env_reads_the_cluster_and_sentinel_forms(emulator: Emulator) -> None:
    for url in ("redis+cluster://127.0.0.1:1", "rediss+sentinel://127.0.0.1:1/tokens"):
        environ = {**emulator.environ(), "SERVICE_TOKEN_STORE_URL": url}
        OAuth2Transport.from_env(environ=environ)  # not refused
        shared_store(url).close()


def test_a_store_from_a_url_pickles_with_its_connect_timeout() -> None:
    with RedisTokenStore.from_url("redis+cluster://127.0.0.1:1", connect_timeout=4.0) as store:
        again = pickle.loads(pickle.dumps(store))
        try:
            assert (again.location, again.connect_timeout) == (store.location, 4.0)
        finally:
            again.close()


# Connecting is not a call.


async def test_a_first_call_that_connects_slowly_is_not_cut_by_the_call_timeout(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """Set-up (connection, scripts) slower than the call bound: still shared, no failure.

    The store's client is built on a Redis whose scripts must be loaded on connecting; a
    latency that only the set-up pays is simulated by holding the first connection's
    set-up until the call bound has long passed.
    """
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(redis_server.url, timeout=0.05) as store:
        running = store._running
        held = asyncio.Event()
        original = running._set_up

        async def slow_set_up(client: object) -> None:
            # Far past the call's 0.05 s, well within connect_timeout (2 s).
            await asyncio.sleep(0.3)
            held.set()
            await original(client)  # type: ignore[arg-type]

        running._set_up = slow_set_up  # type: ignore[method-assign]
        await query(with_store(live_emulator, store, events))
        await query(with_store(live_emulator, store, events))
    assert held.is_set()
    assert [e.name for e in events] == ["token_fetched", "token_loaded"]


async def test_the_set_up_loads_every_script_a_call_may_run(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """A script first met in a call costs it a NOSCRIPT and a load: two more round trips,
    which a Redis far away makes longer than the call's 0.25 s (the budget's scripts were
    missing, and the first fetch through such a Redis lost the store)."""
    import hashlib

    from gql_service_auth._stores import redis_scripts

    sources = [
        value
        for name, value in vars(redis_scripts).items()
        if name.isupper() and isinstance(value, str) and "redis.call" in value
    ]
    assert len(sources) >= 8
    command(redis_server.port, "SCRIPT", "FLUSH")
    with RedisTokenStore.from_url(redis_server.url) as store:
        await query(with_store(live_emulator, store))
        digests = [hashlib.sha1(source.encode()).hexdigest() for source in sources]
        answer = command(redis_server.port, "SCRIPT", "EXISTS", *digests)
    assert answer == b"*%d\r\n" % len(digests) + b":1\r\n" * len(digests)


# Connections closed or demoted under the store.


async def test_connections_killed_by_redis_cost_no_outage(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """CLIENT KILL of every connection: the next call heals and succeeds, no cool-down."""
    events: list[AuthEvent] = []
    first, second = tenants(live_emulator, 2)
    with RedisTokenStore.from_url(redis_server.url, timeout=SLOW_MACHINE) as store:
        await query(with_store(live_emulator, store, events, client=first))
        assert clients_of(redis_server.port) >= 1
        command(redis_server.port, "CLIENT", "KILL", "TYPE", "normal")
        await query(with_store(live_emulator, store, events, client=second))
        await query(with_store(live_emulator, store, events, client=second))
    assert [e.name for e in events] == ["token_fetched", "token_fetched", "token_loaded"]


async def test_connections_redis_closed_while_idle_cost_no_outage(
    live_emulator: Emulator, own_redis: RedisServer
) -> None:
    """Redis's own idle timeout (as Azure's, or a proxy's) closes the store's connection
    between two renewals: the next call heals and succeeds."""
    own_redis.stop()
    own_redis.start("--timeout", "1")
    events: list[AuthEvent] = []
    first, second = tenants(live_emulator, 2)
    with RedisTokenStore.from_url(own_redis.url, timeout=SLOW_MACHINE) as store:
        await query(with_store(live_emulator, store, events, client=first))
        # Redis closes it after a second or more idle (its clock checks ten times a second).
        await wait_until(lambda: clients_of(own_redis.port) == 0)
        await query(with_store(live_emulator, store, events, client=second))
    assert [e.name for e in events] == ["token_fetched", "token_fetched"]
    assert token_requests_of(live_emulator, second) == 1


# What a misconfiguration says.


async def test_an_acl_without_a_command_says_which_acl_the_store_needs(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    rule = "on >acl-test-password resetkeys ~gql-service-auth:* -@all +select +script|load"
    assert b"+OK" in command(redis_server.port, "ACL", "SETUSER", "partial", *rule.split())
    try:
        url = redis_server.url.replace("redis://", "redis://partial:acl-test-password@")
        events: list[AuthEvent] = []
        with RedisTokenStore.from_url(url, timeout=SLOW_MACHINE) as store:
            await query(with_store(live_emulator, store, events))
        failed = events[0]
        assert failed.name == "token_store_failed"
        assert failed.error == "NoPermissionError"
        assert "its ACL needs ~<prefix>:*" in failed.detail
        assert "+evalsha" in failed.detail
        assert "acl-test-password" not in str(failed)
    finally:
        command(redis_server.port, "ACL", "DELUSER", "partial")


def test_the_docs_acl_line_is_the_one_the_warning_gives() -> None:
    from gql_service_auth._stores.redis_faults import ACL_COMMANDS

    page = Path(__file__).parents[1].joinpath("docs", "tokens.md").read_text()
    line = re.search(r"^ACL SETUSER gql-service-auth .*$", page, re.MULTILINE)
    assert line is not None
    assert line.group(0).endswith(ACL_COMMANDS)


# Many identities, bounded memory.


async def test_a_store_remembers_a_bounded_number_of_identities(
    live_emulator: Emulator, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Keys derived from 300 tenants' secrets: only the most recent 128 are kept."""
    with (
        RedisTokenStore.from_url(redis_server.url, timeout=SLOW_MACHINE) as redis_store,
        LocalTokenStore(tmp_path, timeout=SLOW_MACHINE) as local_store,
    ):
        for store in (redis_store, local_store):
            identities = [identity_of(live_emulator, c) for c in tenants(live_emulator, 300)]
            for identity in identities:
                await store.save(identity, StoredToken(f"token-of-{identity.client_id}", 60, 60))
            remembered = store._keys if store is redis_store else store._sealers  # type: ignore[attr-defined]
            assert len(remembered) == 128
            # One forgotten is derived again, and opens what was sealed for it.
            found = await store.load(identities[0])
            assert found is not None
            assert found.access_token == f"token-of-{identities[0].client_id}"


# Checking a store from the command line.


def test_the_store_command_tries_a_url_end_to_end(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["store", redis_server.url]) == 0
    out = capsys.readouterr().out
    for step in ("connect", "lock", "save", "load", "discard", "unlock"):
        assert re.search(rf"^  {step} +ok ", out, re.MULTILINE), out
    assert [name for name, _ in redis_server.dump()] == [], "left behind"


def test_the_store_command_says_why_a_store_fails(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # A plain Redis named as a cluster: the fix is said.
    cluster_url = f"redis+cluster://127.0.0.1:{redis_server.port}"
    assert main(["store", cluster_url]) == 3
    assert "this Redis is not a cluster: name it with a redis://" in capsys.readouterr().out
    with closed_port() as port:
        assert main(["store", f"redis://127.0.0.1:{port}/0"], environ={}) == 3
    assert "connect  FAILED" in capsys.readouterr().out
    assert main(["store"], environ={}) == 2
    assert "SERVICE_TOKEN_STORE_URL" in capsys.readouterr().err


def test_the_store_command_reads_the_url_and_bounds_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    environ = {
        "SERVICE_TOKEN_STORE_URL": (tmp_path / "tokens").as_uri(),
        "SERVICE_TOKEN_STORE_CONNECT_TIMEOUT": "5",
    }
    assert main(["store"], environ=environ) == 0
    assert f"token store {(tmp_path / 'tokens').as_uri()}" in capsys.readouterr().out
    assert os.listdir(tmp_path / "tokens")


# The local store and many tenants.


async def test_a_warm_local_store_serves_a_burst_of_100_tenants_with_no_token_request(
    live_emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A multi-tenant worker restarting on a busy host: 100 tenants' first queries at once,
    every token already in the directory, and opening SQLite slower than a call's bound
    (a busy disk, simulated). Each call keeps its bound; opening the database and the wait
    behind the other tenants are connect_timeout's, not the call's."""
    clients = tenants(live_emulator, 100)
    # 100 fetches at once, each on a thread of its own: on a busy host they take longer
    # than the store tests' 2.5 s bound of a fetch, which is no subject here.
    patient = RetryPolicy(wait_initial=0, wait_max=0, wait_jitter=0, timeout=SLOW_MACHINE)
    with LocalTokenStore(tmp_path, timeout=SLOW_MACHINE) as warming:
        await asyncio.gather(
            *(query(with_store(live_emulator, warming, client=c, retry=patient)) for c in clients)
        )
    live_emulator.reset_counters()
    connect = sqlite3.connect

    def slow_disk(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        time.sleep(1.5)
        return connect(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", slow_disk)
    events: list[AuthEvent] = []
    # The restarted process: a store of its own on the same directory. A call's bound is 1 s,
    # not the default 0.25 s: 100 threads at once, on a busy host, wait for the GIL longer
    # than that (one call of 100 did, in a make test with nothing else running).
    with LocalTokenStore(tmp_path, timeout=1.0, connect_timeout=SLOW_MACHINE) as store:
        transports = [
            with_store(live_emulator, store, events, client=c, retry=patient) for c in clients
        ]
        await asyncio.gather(*(query(transport) for transport in transports))
    assert live_emulator.counters.token_requests == 0
    assert [e.name for e in events] == ["token_loaded"] * 100


async def test_a_burst_to_a_redis_far_away_grows_the_pool_rather_than_fail(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """8 tenants' first queries at once, 100 ms round trips, default bounds: each call's
    connection opens before its 0.25 s start, so none is cut off while connecting."""
    from redis_deployments import TcpProxy

    clients = tenants(live_emulator, 8)
    events: list[AuthEvent] = []
    with (
        TcpProxy(redis_server.port, delay=0.05) as far,
        RedisTokenStore.from_url(f"redis://127.0.0.1:{far.port}/0") as store,
    ):
        transports = [with_store(live_emulator, store, events, client=c) for c in clients]
        await asyncio.gather(*(query(transport) for transport in transports))
    assert [e.name for e in events] == ["token_fetched"] * 8


async def test_a_set_up_slower_than_connect_timeout_still_ends_and_serves_later_calls(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """300 ms round trips: connecting takes several, past a connect_timeout of 0.5 s. The first
    call gives up (and its process fetches), but the set-up goes on, and the calls after
    it use the connection it opened rather than start again from nothing."""
    from redis_deployments import TcpProxy

    first, second = tenants(live_emulator, 2)
    events: list[AuthEvent] = []
    with (
        TcpProxy(redis_server.port, delay=0.15) as far,
        RedisTokenStore.from_url(
            f"redis://127.0.0.1:{far.port}/0",
            connect_timeout=0.5,
            timeout=SLOW_MACHINE,
            cooldown=0,
        ) as store,
    ):
        await query(with_store(live_emulator, store, events, client=first))
        assert events[0].detail == "not connected within 0.5 s (connect_timeout)"
        setting_up = store._running.setting_up
        assert setting_up is not None
        await wait_until(setting_up.done)
        assert setting_up.exception() is None
        events.clear()
        # Its calls, a round trip of 300 ms each, may outlast the tests' fetch deadline.
        patient = RetryPolicy(timeout=HANG_GUARD)
        await query(with_store(live_emulator, store, events, client=second, retry=patient))
    assert [e.name for e in events] == ["token_fetched"]


async def test_a_local_write_waiting_behind_another_process_is_not_cut_by_the_call_timeout(
    emulator: Emulator, tmp_path: Path
) -> None:
    """64 processes starting together queue on SQLite's write lock: the wait for it is a
    wait for a turn (connect_timeout), and the write itself keeps its 0.25 s."""
    with LocalTokenStore(tmp_path, connect_timeout=SLOW_MACHINE) as store:
        identity = identity_of(emulator)
        assert await store.load(identity) is None  # made, and open
        another_process = sqlite3.connect(tmp_path / DATABASE, isolation_level=None)
        try:
            another_process.execute("BEGIN IMMEDIATE")  # its write under way
            saving = asyncio.ensure_future(store.save(identity, StoredToken("t", 60, 60)))
            await asyncio.sleep(0.5)  # longer than the call's 0.25 s
            another_process.execute("COMMIT")
            assert await saving is True
        finally:
            another_process.close()
