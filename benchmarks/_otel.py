"""Figure 13: what OpenTelemetry costs, per request and per token fetch.

Three modes, each in a process of its own (the global providers can be set once per
process): without ``opentelemetry-api`` (its import blocked), with the API and no SDK (an
application that installed the extra but configured nothing), and with the SDK configured
(an in-memory metric reader and span exporter, so exporting costs no I/O). Each process
measures its client CPU per request against the lean server, then per fetch: a manual
clock moved past expiry before each query, so every query waits for a new token.

    python benchmarks/_otel.py MODE GRAPHQL_URL TOKEN_URL REQUESTS FETCHES

prints one JSON object; ``figure()`` runs the three modes in turn over the rounds.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODES = ("without opentelemetry", "API, no SDK", "SDK configured")


def _configure(mode: str) -> Any:
    """Sets the process up as ``mode`` says; returns the SDK's exporter and reader, if any."""
    if mode == MODES[0]:
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
        return None
    if mode == MODES[1]:
        return None
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter, reader


async def _measure(mode: str, url: str, token_url: str, requests: int, fetches: int) -> Any:
    sdk = _configure(mode)
    from gql import Client, gql

    from gql_service_auth import OAuth2Transport
    from gql_service_auth.emulator import ManualClock

    query = gql("query { carriers(first: 1) { totalCount } }")
    clock = ManualClock()
    transport = OAuth2Transport(
        url,
        token_url=token_url,
        client_id="bench",
        client_secret="secret",
        clock=clock,
        share_tokens=False,
    )
    async with Client(transport=transport) as session:
        for _ in range(50):  # warm up: token, pool, the first fetch's imports
            await session.execute(query)
        gc.collect()
        gc.disable()
        try:
            cpu = time.process_time()
            await asyncio.gather(*(session.execute(query) for _ in range(requests)))
            per_request = (time.process_time() - cpu) / requests
            cpu = time.process_time()
            for _ in range(fetches):
                clock.advance(4000)  # past the lean server's 3600 s tokens
                await session.execute(query)
            per_fetch = (time.process_time() - cpu) / fetches
        finally:
            gc.enable()
    result: dict[str, Any] = {
        "cpu_us_per_request": per_request * 1e6,
        "cpu_us_per_fetch_and_query": per_fetch * 1e6,
        "opentelemetry_imported": "opentelemetry.metrics" in sys.modules,
    }
    if sdk is not None:
        exporter, reader = sdk

        def fetch_spans() -> int:
            spans = exporter.get_finished_spans()
            return sum(1 for s in spans if s.name == "gql_service_auth.fetch_token")

        # The last fetch's span ends just after its token is out: wait for it (every fetch
        # and the first token), on a busy machine too, for 30 s at most.
        for _ in range(3000):
            if fetch_spans() >= fetches + 1:
                break
            await asyncio.sleep(0.01)
        result["spans"] = fetch_spans()
        points = [
            point.value
            for resource in reader.get_metrics_data().resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "gql_service_auth.token.fetches"
            for point in metric.data.data_points
        ]
        result["fetches_counted"] = sum(points)
    return result


def figure(graphql_url: str, token_url: str, requests: int, fetches: int, rounds: int) -> Any:
    """The three modes in a shuffled order each round; medians over the rounds."""
    order = random.Random(1313)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        modes = list(MODES)
        order.shuffle(modes)
        for mode in modes:
            command = [sys.executable, "-W", "error", str(HERE / "_otel.py"), mode]
            command += [graphql_url, token_url, str(requests), str(fetches)]
            completed = subprocess.run(
                command, capture_output=True, text=True, timeout=120, check=True
            )
            runs[mode].append(json.loads(completed.stdout))
    figures: dict[str, Any] = {"requests": requests, "fetches": fetches, "rounds": rounds}
    for mode, results in runs.items():
        row = {
            key: round(statistics.median(r[key] for r in results), 1)
            for key in ("cpu_us_per_request", "cpu_us_per_fetch_and_query")
        }
        row["opentelemetry_imported"] = results[-1]["opentelemetry_imported"]
        for key in ("spans", "fetches_counted"):
            if key in results[-1]:
                row[key] = results[-1][key]
        figures[mode] = row
    return figures


def print_figure(rows: dict[str, Any]) -> None:
    print(
        f"13. OpenTelemetry: client CPU per request ({rows['requests']} queries) and per "
        f"token fetch ({rows['fetches']} fetches, each with its query), lean server, median of "
        f"{rows['rounds']} rounds (goal: no measurable cost per request)"
    )
    for mode in MODES:
        row = rows[mode]
        recorded = (
            f"; {row['spans']} spans, {row['fetches_counted']} fetches counted"
            if "spans" in row
            else ""
        )
        print(
            f"    {mode:<22} {row['cpu_us_per_request']:>7.1f} us per request, "
            f"{row['cpu_us_per_fetch_and_query']:>8.1f} us per fetch{recorded}"
        )


if __name__ == "__main__":
    mode, url, token_url, requests, fetches = sys.argv[1:6]
    print(json.dumps(asyncio.run(_measure(mode, url, token_url, int(requests), int(fetches)))))
