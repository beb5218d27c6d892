"""make bench's script works: a tiny run reports every figure.

Only that it runs: its figures are measured on whatever else the machine is doing, so
``make bench`` prints them and no test asserts them. The behaviours the figures count are
each proven, on an injected clock or by events, by a behaviour test:

- one token request for a herd of callers on every stack: ``test_stacks.py::
  test_concurrent_callers_share_one_token_fetch``; for 1,000 on a cold cache and after
  expiry: ``test_oauth2_lifecycle.py``; after a revocation: ``test_stacks.py::
  test_revoked_token_is_renewed_once_and_the_requests_sent_again``,
  ``test_concurrency.py::test_batches_in_flight_during_a_renewal``;
- renewal ahead of expiry, by the margin rule, with no query failed or kept waiting:
  ``test_refresh_ahead.py``, ``test_oauth2_lifecycle.py``;
- a fleet's cold start and a fleet-wide revocation, one token request each:
  ``test_token_store.py::test_a_fleet_on_a_cold_cache_makes_one_token_request`` and
  ``::test_a_fleet_wide_revocation_costs_one_renewal``;
- one token per pattern of figure 12 with sharing: ``test_sharing.py``,
  ``test_local_store_processes.py``;
- one span and one count per fetch: ``test_telemetry.py``;
- figure 16's rotation with no failed query: ``test_rotating_credentials.py``;
- figure 17's wrong secret asked once, and a runaway stopped at the budget:
  ``test_token_budget.py``;
- figure 14's fleets sharing on a cluster, Sentinel, TLS 50 ms away and the local store:
  ``test_store_deployments.py``, ``test_local_store_processes.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"

FIGURES = (
    "1 overhead",
    "1 layer cost",
    "1 instructions",
    "2 stampede",
    "3 early renewal",
    "4 event loop",
    "5 footprint",
    "6 scaling",
    "7 pytest plugin",
    "8 renewal latency",
    "9 fleet",
    "10 revocation",
    "11 other stacks",
    "12 sharing",
    "13 opentelemetry",
    "14 fleets on deployments",
    "16 rotation",
    "17 budget",
)

# The tiny run takes about two minutes, and its processes most of a core: make test-bench
# runs it, and .ci/run, apart from make test, as make test-stacks runs the other stacks.
# Under pytest-xdist, one worker runs them all (--dist loadgroup), so the module's fixture
# runs once, not once per worker.
pytestmark = [
    pytest.mark.xdist_group("bench"),
    pytest.mark.skipif(
        os.environ.get("GQL_SERVICE_AUTH_BENCH") != "1",
        reason="the benchmark's tiny run: make test-bench (GQL_SERVICE_AUTH_BENCH=1)",
    ),
]


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    """The tiny benchmark run's figures, as JSON."""
    completed = subprocess.run(
        [sys.executable, "-W", "error", str(SCRIPT), "--tiny", "--json"],
        capture_output=True,
        text=True,
        timeout=1200,  # a guard against hanging: 30 s took 130 s beside 4 CPU-bound processes
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    result: dict[str, Any] = json.loads(completed.stdout)
    return result


def test_every_figure_is_reported(figures: dict[str, Any]) -> None:
    """Each of the fourteen figures is in the output, with what it measured."""
    assert set(figures) >= set(FIGURES)
    for key in FIGURES:
        assert figures[key], key


def test_the_redis_figures_ran_against_a_real_redis(
    figures: dict[str, Any], redis_binary: str
) -> None:
    """With a redis-server at hand, the fleet and revocation figures ran, not skipped, and
    so did figure 14's fleet on one plain Redis (the tiny run leaves some deployments out,
    and says so)."""
    for key in ("9 fleet", "10 revocation"):
        assert "skipped" not in figures[key], figures[key]
    rows = figures["14 fleets on deployments"]["rows"]
    assert "skipped" not in rows["plain Redis"], rows["plain Redis"]
    assert all("skipped" in row or "token_requests" in row for row in rows.values()), rows


def test_the_instruction_counts_compare_every_contender_with_gqls_own(
    figures: dict[str, Any],
) -> None:
    """Figure 1's counts: where valgrind is installed, each contender of the stack counted
    has a count per request and a ratio against gql's transport (the baseline's is 1)."""
    rows = figures["1 instructions"]
    if "skipped" in rows:
        assert shutil.which("valgrind") is None, rows
        return
    (stack,) = (name for name in rows if name != "requests_counted")
    contenders = rows[stack]
    assert set(contenders) == {"gql, header per request", "API key", "OAuth2"}
    assert contenders["gql, header per request"]["ratio"] == 1.0
    assert all(row["instructions_per_request"] > 0 for row in contenders.values())


def test_the_opentelemetry_figure_runs_in_the_modes_it_names(figures: dict[str, Any]) -> None:
    """Figure 13's modes are what they say: no import without the API; with the SDK, a span
    for each fetch it counted."""
    rows = figures["13 opentelemetry"]
    assert rows["without opentelemetry"]["opentelemetry_imported"] is False
    assert rows["API, no SDK"]["opentelemetry_imported"] is True
    configured = rows["SDK configured"]
    # Fetches forced on a manual clock, the first token's too: counts of the script's own.
    assert configured["spans"] == configured["fetches_counted"] == rows["fetches"] + 1
