"""make soak's script works: a tiny run reports its figures.

Only that it runs (``--report-only``): ``make soak`` judges the figures, which a run beside
other work cannot. No query failing across renewals is proven by ``test_refresh_ahead.py``
and ``test_oauth2_lifecycle.py``, on an injected clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_soak_script_runs_in_tiny_mode() -> None:
    """make soak's script works: a 3 s run with 10 workers reports its figures."""

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"
    completed = subprocess.run(
        [sys.executable, "-W", "error", str(script), "--seconds", "3", "--workers", "10", "-r"],
        capture_output=True,
        text=True,
        timeout=600,  # a guard against hanging, not a time the run is allowed
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    figures = json.loads(completed.stdout)
    assert figures["queries_ok"] > 0
    assert figures["token_requests"] >= 2  # 3 s of 1 s tokens: renewed, however slowly
    assert {"queries_failed", "token_requests_most", "rss_end_mb"} <= set(figures)
