"""Soak run: 50 workers query for a while through gql's Client while 1 s tokens expire.

    make soak                     # 60 s
    python benchmarks/soak.py --seconds 5
    python benchmarks/soak.py --seconds 3 --workers 10 --report-only   # the tests' run

Prints its figures and exits 1 if a query failed, if memory grew by more than the
allowance, or if token requests leave the band the renewal rule allows:
- at most one more than elapsed time / the time each token is used (lifetime minus the
  margin): no renewal more often than the margin rule says;
- at least one less than elapsed time / lifetime: a token for every lifetime, or queries
  would have met expired tokens.
Renewal is lazy (the first query after renew_at fetches), so under load each token is used a
little longer than the rule's minimum and the count sits between the two.
Everything goes to an emulator on 127.0.0.1; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import resource
import sys
import time
from pathlib import Path

from _load import query_until
from gql import Client, gql

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import Emulator

QUERY = gql("query { carriers(first: 1) { edges { node { id } } } }")
TOKEN_TTL = 1.0
REFRESH_MARGIN = 60.0  # the default; capped at half the lifetime, so 0.5 s here
MEMORY_ALLOWANCE_MB = 20.0


def rss_mb() -> float:
    """Resident memory now, from /proc where there is one, else the peak."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # pragma: no cover


async def soak(seconds: float, workers: int) -> dict[str, float]:
    async with Emulator(token_ttl=TOKEN_TTL) as emulator:
        # The emulator runs in this process: keep its request log small so the RSS
        # figures are about the client, not about what the emulator remembers.
        emulator.requests = collections.deque(maxlen=100)
        client_record = emulator.recent_client
        transport = OAuth2Transport(
            emulator.graphql_url,
            token_url=emulator.token_url,
            client_id=client_record.client_id,
            client_secret=client_record.client_secret,
            refresh_margin=REFRESH_MARGIN,
        )
        async with Client(transport=transport) as session:
            await session.execute(QUERY)  # warm up: imports, first token, connection pool
            gc.collect()
            rss_start = rss_mb()
            tokens_start = emulator.counters.token_requests
            started = time.monotonic()
            deadline = started + seconds

            samples: list[float] = []

            async def sample_memory() -> None:
                for _ in range(10_000):  # bounded; the deadline ends it first
                    if time.monotonic() >= deadline:
                        return
                    samples.append(round(rss_mb(), 1))
                    await asyncio.sleep(min(5.0, seconds / 4))

            (ok, failed), _ = await asyncio.gather(
                query_until(session, QUERY, deadline, workers), sample_memory()
            )
            elapsed = time.monotonic() - started
            gc.collect()
            rss_end = rss_mb()
        token_requests = emulator.counters.token_requests - tokens_start
    used_for = TOKEN_TTL - min(REFRESH_MARGIN, TOKEN_TTL / 2)
    return {
        "seconds": round(elapsed, 2),
        "workers": workers,
        "queries_ok": ok,
        "queries_failed": failed,
        "queries_per_second": round(ok / elapsed, 1),
        "token_requests": token_requests,
        "token_requests_most": round(elapsed / used_for + 1, 2),
        "token_requests_least": round(elapsed / TOKEN_TTL - 1, 2),
        "unauthenticated_answers": emulator.counters.unauthenticated_responses,
        "rss_start_mb": round(rss_start, 1),
        "rss_end_mb": round(rss_end, 1),
        "rss_samples_mb": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument(
        "-r",
        "--report-only",
        action="store_true",
        help="print the figures and exit 0 whatever they are (the tests' run: a figure "
        "measured beside other work says nothing of the package)",
    )
    args = parser.parse_args(argv)
    figures = asyncio.run(soak(args.seconds, args.workers))
    print(json.dumps(figures, indent=2))
    problems = []
    if figures["queries_failed"]:
        problems.append(f"{figures['queries_failed']} queries failed")
    if figures["token_requests"] > figures["token_requests_most"]:
        problems.append("tokens were renewed more often than the margin rule allows")
    if figures["token_requests"] < figures["token_requests_least"]:
        problems.append("fewer tokens than lifetimes: some queries met expired tokens")
    if figures["rss_end_mb"] - figures["rss_start_mb"] > MEMORY_ALLOWANCE_MB:
        problems.append(f"memory grew by more than {MEMORY_ALLOWANCE_MB:g} MB")
    for problem in problems:
        print(f"soak: {'noted' if args.report_only else 'FAILED'}: {problem}", file=sys.stderr)
    return 1 if problems and not args.report_only else 0


if __name__ == "__main__":
    sys.exit(main())
