"""Every script in examples/ runs to the end, offline, against the emulator it starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


def test_there_are_examples() -> None:
    """The examples folder is found, so the test below cannot pass by running nothing."""
    assert len(EXAMPLES) >= 7


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda path: path.name)
def test_example_runs(script: Path, request: pytest.FixtureRequest) -> None:
    """The example exits 0 and says it used an emulator, with no SERVICE_* variables set."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    shares = "SERVICE_TOKEN_STORE_URL" in script.read_text(encoding="utf-8")
    if shares:  # an example of the token store gets a real Redis
        environ["SERVICE_TOKEN_STORE_URL"] = request.getfixturevalue("redis_server").url
    completed = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "using an emulator" in completed.stdout
    if shares:
        assert "token requests: 1\n" in completed.stdout, completed.stdout
