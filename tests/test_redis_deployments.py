"""The Redis deployment shapes of redis_deployments.py do what they say, seen by redis-py."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.retry import Retry as SyncRetry
from redis_deployments import (
    Link,
    RedisClusterSet,
    ReplyError,
    SentinelSet,
    TcpProxy,
    call,
    client_ids,
    client_kill_all,
    idle_closing_redis,
    role,
    start_primary_and_replica,
    start_tls_redis,
    switch_primary,
    tls_materials,
    tls_supported,
    wait_for,
)
from redis_server import RedisServer, ping

NO_RETRY = Retry(NoBackoff(), 0)
"""redis-py retries a failed command 3 times on a fresh connection by default, which
would hide the cut a test makes."""
NO_SYNC_RETRY = SyncRetry(NoBackoff(), 0)


def ping_on(connection: redis.Connection) -> Any:
    """PING on this very connection (no pool to swap it for a fresh one)."""
    connection.send_command("PING")
    return connection.read_response()


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """Every redis-server process started during the test."""
    processes: list[subprocess.Popen[bytes]] = []
    real_start = RedisServer.start

    def start(self: RedisServer, *extra: str) -> None:
        try:
            real_start(self, *extra)
        finally:
            if self.process is not None:
                processes.append(self.process)

    monkeypatch.setattr(RedisServer, "start", start)
    return processes


@pytest.fixture
def tls_binary(redis_binary: str) -> str:
    if not tls_supported(redis_binary):
        pytest.skip(f"{redis_binary} was built without TLS")
    return redis_binary


@pytest.fixture
def second_redis(redis_binary: str, tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(redis_binary, tmp_path)
    server.start()
    yield server
    server.stop()


async def test_the_cluster_serves_a_key_from_each_node(redis_binary: str, tmp_path: Path) -> None:
    with RedisClusterSet(redis_binary, tmp_path) as cluster:
        assert len(set(cluster.ports)) == 3
        hosts = ",".join(f"127.0.0.1:{port}" for port in cluster.ports)
        assert cluster.url == f"redis+cluster://{hosts}"
        assert cluster.node_urls == [f"redis://127.0.0.1:{port}/0" for port in cluster.ports]
        keys = {port: cluster.key_on(port) for port in cluster.ports}
        async with RedisCluster(host="127.0.0.1", port=cluster.ports[0]) as client:
            for port, key in keys.items():
                await client.set(key, f"on {port}")
            for port, key in keys.items():
                assert await client.get(key) == f"on {port}".encode()
                assert call(port, "GET", key) == f"on {port}".encode()  # that node has it
                assert cluster.owner_of(key) == port
        assert sorted(name for name, _ in cluster.dump()) == sorted(
            key.encode() for key in keys.values()
        )
        cluster.flush()
        assert cluster.dump() == []


async def test_a_half_migrated_slot_answers_ask_and_redis_py_follows_it(
    redis_binary: str, tmp_path: Path
) -> None:
    with RedisClusterSet(redis_binary, tmp_path) as cluster:
        moved, stayed = "{token}moved", "{token}stayed"
        slot = cluster.slot_of(moved)
        source = cluster.owner_of(moved)
        target = next(port for port in cluster.ports if port != source)
        async with RedisCluster(host="127.0.0.1", port=cluster.ports[0]) as client:
            await client.set(moved, "m")
            await client.set(stayed, "s")
            cluster.begin_migration(slot, target, move=[moved])
            assert cluster.slot_owner(slot) == source
            with pytest.raises(ReplyError, match=rf"^ASK {slot} 127\.0\.0\.1:{target}$"):
                call(source, "GET", moved)
            with pytest.raises(ReplyError, match=r"^(TRYAGAIN|ASK) "):  # ASK before Redis 7
                call(source, "MGET", moved, stayed)
            with Link(target) as link:
                assert link.call("ASKING") == b"OK"
                with pytest.raises(ReplyError, match=r"^TRYAGAIN "):
                    link.call("MGET", moved, stayed)
            assert await client.get(moved) == b"m"  # ASK, then ASKING + GET on the target
            assert await client.get(stayed) == b"s"  # still on the source
            assert sorted(name for name, _ in cluster.dump()) == [moved.encode(), stayed.encode()]
            cluster.finish_migration(slot)
            assert cluster.owner_of(moved) == cluster.owner_of(stayed) == target
            assert await client.get(stayed) == b"s"  # MOVED, followed
            assert call(target, "GET", stayed) == b"s"


def test_migrate_slot_moves_the_slot_and_its_keys(redis_binary: str, tmp_path: Path) -> None:
    with RedisClusterSet(redis_binary, tmp_path) as cluster:
        key = cluster.key_on(cluster.ports[0])
        call(cluster.ports[0], "SET", key, "v")
        cluster.migrate_slot(cluster.slot_of(key), cluster.ports[2])
        assert cluster.owner_of(key) == cluster.ports[2]
        assert call(cluster.ports[2], "GET", key) == b"v"
        with pytest.raises(ReplyError, match=r"^MOVED "):
            call(cluster.ports[1], "GET", key)  # every node knows the new owner


@pytest.mark.parametrize(
    ("deployment", "last_step", "processes"),
    [(RedisClusterSet, "_wait_agreed", 3), (SentinelSet, "_sees_everyone", 5)],
)
def test_a_deployment_that_fails_to_start_leaves_no_process(
    redis_binary: str,
    tmp_path: Path,
    started: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    deployment: type[RedisClusterSet | SentinelSet],
    last_step: str,
    processes: int,
) -> None:
    def broken(*args: Any) -> bool:
        raise RuntimeError("the last step failed")

    monkeypatch.setattr(deployment, last_step, broken)
    with (
        pytest.raises(RuntimeError, match="the last step failed"),
        deployment(redis_binary, tmp_path),
    ):
        pass
    assert len(started) == processes
    assert all(process.poll() is not None for process in started)


async def test_the_sentinels_fail_over_and_master_for_writes_to_the_new_master(
    redis_binary: str, tmp_path: Path
) -> None:
    with SentinelSet(redis_binary, tmp_path) as sentinels:
        hosts = ",".join(f"127.0.0.1:{port}" for port in sentinels.sentinel_ports)
        assert sentinels.url == f"redis+sentinel://{hosts}/tokens/0"
        sentinel = Sentinel([("127.0.0.1", port) for port in sentinels.sentinel_ports])
        master = sentinel.master_for(sentinels.service_name)
        try:
            await master.set("before", "1")
            assert await master.execute_command("WAIT", 1, 30_000) == 1  # on the replica
            old = sentinels.master_port()
            assert role(old) == "master"
            assert sentinels.kill_master() == old
            new = sentinels.wait_failover(old)
            assert new != old
            assert sentinels.master_port() == new
            # The pooled connection still points at the dead primary, and redis-py 8.1
            # retries a command on the address it had (redis/redis-py#3874): a connection
            # the pool opens afresh asks the sentinels.
            await master.connection_pool.disconnect()
            await master.set("after", "2")
            assert call(new, "MGET", "before", "after") == [b"1", b"2"]
        finally:
            await master.aclose()
            for client in sentinel.sentinels:
                await client.aclose()


async def test_tls_redis_answers_a_client_certificate_and_refuses_a_client_without(
    tls_binary: str, tmp_path: Path
) -> None:
    files = tls_materials(tmp_path)
    server = start_tls_redis(tls_binary, tmp_path, files)
    try:
        assert server.url == f"rediss://127.0.0.1:{server.port}/0"
        assert not ping(server.port)  # no plain listener
        options: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": server.port,
            "ssl": True,
            "ssl_ca_certs": str(files.ca_cert),
            "retry": NO_RETRY,
        }
        certificate = {
            "ssl_certfile": str(files.client_cert),
            "ssl_keyfile": str(files.client_key),
        }
        async with redis.asyncio.Redis(**options, **certificate) as client:
            assert await client.ping() is True
            await client.set("k", "v")
        assert [name for name, _ in server.dump()] == [b"k"]
        async with redis.asyncio.Redis(**options) as anonymous:
            with pytest.raises(RedisConnectionError):
                await anonymous.ping()
    finally:
        server.stop()


async def test_tls_redis_may_accept_clients_without_a_certificate(
    tls_binary: str, tmp_path: Path
) -> None:
    files = tls_materials(tmp_path)
    server = start_tls_redis(tls_binary, tmp_path, files, require_client_cert=False)
    try:
        async with redis.asyncio.Redis(
            host="127.0.0.1", port=server.port, ssl=True, ssl_ca_certs=str(files.ca_cert)
        ) as client:
            assert await client.ping() is True
    finally:
        server.stop()


def test_tls_is_not_claimed_for_a_binary_that_cannot_serve_it() -> None:
    assert tls_supported("/bin/false") is False


async def test_the_proxy_adds_its_delay_in_each_direction(own_redis: RedisServer) -> None:
    delay = 0.025
    with TcpProxy(own_redis.port, delay=delay) as proxy:
        assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"
        async with redis.asyncio.Redis(host="127.0.0.1", port=proxy.port) as client:
            await client.ping()  # connected: the next round trip is a command's alone
            started = time.monotonic()
            await client.ping()
            assert time.monotonic() - started >= 2 * delay - 0.001
            async with client.pipeline(transaction=False) as pipeline:
                for number in range(500):
                    pipeline.set(f"k{number}", number).get(f"k{number}")
                replies = await pipeline.execute()
            assert replies[1::2] == [str(number).encode() for number in range(500)]  # in order
        assert proxy.accepted == 1


async def test_retarget_moves_new_connections_and_leaves_open_ones(
    own_redis: RedisServer, second_redis: RedisServer
) -> None:
    async def served_by(connection: redis.asyncio.Connection) -> int:
        await connection.send_command("CONFIG", "GET", "port")
        reply = await connection.read_response()  # a map in RESP3, redis-py 8's default
        return int(reply[b"port"] if isinstance(reply, dict) else reply[1])

    with TcpProxy(own_redis.port) as proxy:
        before = redis.asyncio.Connection(host="127.0.0.1", port=proxy.port)
        after = redis.asyncio.Connection(host="127.0.0.1", port=proxy.port)
        try:
            assert await served_by(before) == own_redis.port
            proxy.retarget(second_redis.port)
            assert proxy.target_port == second_redis.port
            assert await served_by(after) == second_redis.port
            assert await served_by(before) == own_redis.port
            assert (proxy.connections, proxy.accepted) == (2, 2)
        finally:
            await before.disconnect()
            await after.disconnect()
        proxy.wait_connections(0)


async def test_close_all_cuts_pooled_connections(own_redis: RedisServer) -> None:
    with TcpProxy(own_redis.port) as proxy:
        async with redis.asyncio.Redis(
            host="127.0.0.1", port=proxy.port, retry=NO_RETRY
        ) as client:
            await client.ping()
            assert proxy.close_all() == 1
            assert proxy.connections == 0
            # The pooled connection was cut. CPython 3.13.0's selector transport raises
            # AttributeError ("'NoneType' object has no attribute '_add_writer'") for a
            # write after the peer reset it, where other versions give redis-py's error.
            with pytest.raises((RedisConnectionError, AttributeError)):
                await client.ping()
            assert await client.ping() is True  # and the pool opens another


def test_close_all_resets_or_closes_as_told(own_redis: RedisServer) -> None:
    with TcpProxy(own_redis.port) as proxy:
        for reset in (True, False):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as conn:
                conn.sendall(b"PING\r\n")
                assert conn.recv(64) == b"+PONG\r\n"
                proxy.close_all(reset=reset)
                if reset:
                    with pytest.raises(ConnectionResetError):
                        conn.recv(64)
                else:
                    assert conn.recv(64) == b""


def test_redis_timeout_closes_an_idle_connection(redis_binary: str, tmp_path: Path) -> None:
    server = idle_closing_redis(redis_binary, tmp_path, idle_seconds=1)
    idle = redis.Connection(host="127.0.0.1", port=server.port, retry=NO_SYNC_RETRY)
    try:
        idle.send_command("CLIENT", "ID")
        own_id = idle.read_response()
        assert own_id in client_ids(server.port)
        wait_for(lambda: own_id not in client_ids(server.port), "Redis to close it", timeout=30)
        with pytest.raises(RedisConnectionError):
            ping_on(idle)
    finally:
        idle.disconnect()
        server.stop()


def test_client_kill_all_cuts_every_normal_client(own_redis: RedisServer) -> None:
    clients = [
        redis.Connection(host="127.0.0.1", port=own_redis.port, retry=NO_SYNC_RETRY)
        for _ in range(2)
    ]
    try:
        for client in clients:
            assert ping_on(client) == b"PONG"
        assert client_kill_all(own_redis.port) == 2
        assert client_ids(own_redis.port) == set()
        for client in clients:
            with pytest.raises(RedisConnectionError):
                ping_on(client)
    finally:
        for client in clients:
            client.disconnect()


async def test_a_switch_behind_the_proxy_leaves_open_connections_on_the_demoted_node(
    redis_binary: str, tmp_path: Path
) -> None:
    primary, replica = start_primary_and_replica(redis_binary, tmp_path)
    try:
        with TcpProxy(primary.port) as proxy:
            async with redis.asyncio.Redis(host="127.0.0.1", port=proxy.port) as before:
                await before.set("k", "1")
                assert await before.execute_command("WAIT", 1, 30_000) == 1
                switch_primary(proxy, primary.port, replica.port)
                assert (role(primary.port), role(replica.port)) == ("slave", "master")
                with pytest.raises(ReadOnlyError):
                    await before.set("k", "2")  # its connection stayed on the old primary
                async with redis.asyncio.Redis(host="127.0.0.1", port=proxy.port) as after:
                    assert await after.get("k") == b"1"
                    await after.set("k", "2")
                assert call(replica.port, "GET", "k") == b"2"
    finally:
        primary.stop()
        replica.stop()
