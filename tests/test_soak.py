"""make soak's script works: a tiny run whose counts (never its times) are checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_soak_script_runs_in_tiny_mode() -> None:
    """make soak's script works: a 3 s run with 10 workers passes its own checks."""

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"
    completed = subprocess.run(
        [sys.executable, "-W", "error", str(script), "--seconds", "3", "--workers", "10"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    figures = json.loads(completed.stdout)
    assert figures["queries_failed"] == 0
    assert figures["queries_ok"] > 0
    assert figures["token_requests"] >= 2
