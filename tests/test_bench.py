"""make bench's script works: a tiny run whose counts (never its times) are checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"

# One worker runs them all (make test's --dist loadgroup): the module's fixture, a 35 s
# benchmark run, then runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("bench")


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    """The tiny benchmark run's figures, as JSON."""
    completed = subprocess.run(
        [sys.executable, "-W", "error", str(SCRIPT), "--tiny", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    result: dict[str, Any] = json.loads(completed.stdout)
    return result


def test_all_thirteen_figures_are_reported(figures: dict[str, Any]) -> None:
    """Each of the thirteen figures is in the output."""
    for key in (
        "1 overhead",
        "1 layer cost",
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
    ):
        assert key in figures


def test_every_other_stack_shares_one_token_fetch_in_a_herd(figures: dict[str, Any]) -> None:
    """Figure 11's herd: concurrent callers on a cold token, on requests and httpx."""
    herd = figures["11 other stacks"]["herd"]
    assert set(herd) == {"requests", "httpx", "httpx async"}
    for row in herd.values():
        assert row == {"token_requests": 1, "failed": 0}


def test_opentelemetry_figure_measures_what_it_names(figures: dict[str, Any]) -> None:
    """Figure 13's modes are what they say: no import without the API, and with the SDK one
    span and one count per fetch (the timed ones and the first token)."""
    rows = figures["13 opentelemetry"]
    assert rows["without opentelemetry"]["opentelemetry_imported"] is False
    assert rows["API, no SDK"]["opentelemetry_imported"] is True
    configured = rows["SDK configured"]
    assert configured["spans"] == configured["fetches_counted"] == rows["fetches"] + 1


def test_fleet_revocation_counts(figures: dict[str, Any], redis_binary: str) -> None:
    """Revocations that cover the stored token fail no query, and cost the fleet a few tokens."""
    revocation = figures["10 revocation"]
    assert revocation["revocations"] >= 1
    assert revocation["failed"] == 0
    assert revocation["store_failures"] == 0
    assert revocation["unauthenticated"] > 0
    per = revocation["token_requests_per_revocation"]
    assert len(per) == revocation["revocations"]
    # At least one renewal each, and no more than one per process: the fleet shares them.
    assert all(1 <= n <= revocation["processes"] for n in per)


def test_fleet_counts(figures: dict[str, Any], redis_binary: str) -> None:
    """With the store, a fleet's cold start costs one token request, and renewals fewer."""
    fleet = figures["9 fleet"]
    alone, shared = fleet["without store"], fleet["with RedisTokenStore"]
    cold = shared["cold start"]
    assert cold["queries"] == fleet["processes"] * fleet["concurrency"]
    assert cold["failed"] == 0
    # One, and one more per process that found Redis over its timeout (a loaded machine).
    assert cold["token_requests"] == 1 + shared["cold start store_failures"]
    assert alone["cold start"]["token_requests"] == fleet["processes"]
    assert shared["sustained"]["failed"] == alone["sustained"]["failed"] == 0
    assert shared["sustained"]["token_requests"] < alone["sustained"]["token_requests"]
    assert "oauth2 + RedisTokenStore" in figures["1 overhead"]["concurrency 100"]


def test_stampede_counts(figures: dict[str, Any]) -> None:
    """Each stampede phase costs one token request and no failed query."""
    for phase in ("empty cache", "after expiry", "after revocation"):
        assert figures["2 stampede"]["oauth2"][phase] == {"token_requests": 1, "failed_queries": 0}


def test_early_renewal_counts(figures: dict[str, Any]) -> None:
    """No failure, no UNAUTHENTICATED, and no renewal more often than the margin rule."""
    renewal = figures["3 early renewal"]
    assert renewal["failed_queries"] == 0
    assert renewal["unauthenticated_round_trips"] == 0
    assert renewal["token_requests"] <= renewal["token_requests_by_margin_rule"] + 1
    assert renewal["token_requests"] >= renewal["token_lifetimes"] - 1


def test_scaling_counts(figures: dict[str, Any]) -> None:
    """A cold first wave of any width fetches one token, and nothing fails."""
    for row in figures["6 scaling"].values():
        assert row["oauth2"]["token_requests"] == 1
        assert row["oauth2"]["failed_queries"] == 0
        assert row["baseline"]["token_requests"] == 0


def test_event_loop_run_fetched_each_time(figures: dict[str, Any]) -> None:
    """The event-loop figure really measured during token fetches."""
    assert figures["4 event loop"]["token_requests"] == 3


def test_renewal_latency_counts(figures: dict[str, Any]) -> None:
    """No query failed across renewals, and renewals happened in every scenario."""
    for row in figures["8 renewal latency"].values():
        assert row["failed"] == 0
        assert row["token_requests"] >= 2
        assert row["queries"] > 0


def test_sharing_costs_one_token_per_pattern(figures: dict[str, Any]) -> None:
    """Figure 12: each pattern costs a token per transport or process without sharing, and
    one with it (in the process, then through the local store), with nothing failed."""
    sharing = figures["12 sharing"]
    rows = sharing["rows"]
    assert set(rows) == {"per call", "per thread", "cron", "workers"}
    assert rows["per call"]["without"]["token_requests"] == sharing["calls"]
    assert rows["per thread"]["without"]["token_requests"] == sharing["threads"]
    assert rows["cron"]["without"]["token_requests"] == sharing["cron_runs"]
    assert rows["workers"]["without"]["token_requests"] >= 2
    for row in rows.values():
        assert row["with"]["token_requests"] == 1
        assert row["without"].get("failed", 0) == row["with"].get("failed", 0) == 0
