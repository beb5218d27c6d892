"""Run gql's own HTTP transport tests with gql's transports, then with ours in their place.

gql's test suite is the definition of drop-in: every test that passes with gql's
``AIOHTTPTransport`` must pass with ``ApiKeyTransport`` and with ``OAuth2Transport``, and
so for ``RequestsHTTPTransport``, ``HTTPXTransport`` and ``HTTPXAsyncTransport`` and ours
(:data:`TEST_FILES` names each stack's tests). The runs of a stack go two at a time.
``make gql-suite`` (part of ``make test``) runs this script with the project's venv::

    .venv/bin/python tests/gql_suite/run.py [extra pytest arguments]

The tests come from the sdist of the installed gql version, fetched once with
``pip download`` into ``.venv/gql-sdist`` and unpacked beside it. Each run is a pytest
process of its own, with gql's pytest settings (its ``pyproject.toml``), not ours, and
our plugin ``gql_swap.py``, which swaps the transport and reports every test's outcome.

Fails (exit status 1) when the stock run fails or passes nothing, or when a swapped run
fails a test, passes fewer tests than stock, or passes one without building our transport.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

# gql's tests of each HTTP transport; the websocket and online ones test other things.
TEST_FILES = {
    "aiohttp": (
        "tests/test_aiohttp.py",
        "tests/test_aiohttp_batch.py",
        "tests/test_aiohttp_multipart.py",
    ),
    "requests": ("tests/test_requests.py", "tests/test_requests_batch.py"),
    "httpx": ("tests/test_httpx.py", "tests/test_httpx_async.py", "tests/test_httpx_batch.py"),
}
MODES = ("stock", "api-key", "oauth2")
HERE = Path(__file__).resolve().parent


@dataclass
class Run:
    stack: str
    mode: str
    returncode: int
    seconds: float
    output: str
    outcomes: dict[str, str]
    built: set[str]
    token_requests: int

    def with_outcome(self, outcome: str) -> set[str]:
        return {test for test, seen in self.outcomes.items() if seen == outcome}


def unpacked_suite(venv: Path, gql_version: str) -> Path:
    """gql's sdist tests for ``gql_version``, downloaded and unpacked on first use."""
    cache = venv / "gql-sdist"
    suite = cache / f"gql-{gql_version}"
    if (suite / "tests").is_dir():
        return suite
    cache.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        download = [
            sys.executable, "-m", "pip", "download", "--quiet", f"gql=={gql_version}",
            "--no-deps", "--no-binary", ":all:", "-d", scratch,
        ]  # fmt: skip
        print(f"gql-suite: fetching the sdist of gql {gql_version} (once)", flush=True)
        subprocess.run(download, check=True)
        (archive,) = Path(scratch).glob("*.tar.gz")
        partial = Path(scratch) / "unpacked"
        with tarfile.open(archive) as tar:
            top = tar.getmembers()[0].name.split("/")[0]
            wanted = [
                m
                for m in tar.getmembers()
                if (m.isfile() or m.isdir())
                and (m.name.startswith(f"{top}/tests/") or m.name == f"{top}/pyproject.toml")
            ]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(partial, members=wanted, filter="data")
            else:  # Python < 3.10.12: members are plain files under top/, checked above
                if any(m.name.startswith("/") or ".." in m.name.split("/") for m in wanted):
                    raise RuntimeError(f"{archive.name} holds paths outside its folder")
                tar.extractall(partial, members=wanted)
        # Renamed whole into place, so an interrupted fetch leaves nothing half done.
        (partial / top).rename(suite)
    return suite


def run(suite: Path, stack: str, mode: str, extra: list[str]) -> Run:
    """One pytest process over gql's tests of ``stack``, with ``mode``'s transports in
    gql's place."""
    with tempfile.TemporaryDirectory(prefix="gql-suite-") as scratch:
        report = Path(scratch) / "report.json"
        command = [
            sys.executable, "-m", "pytest", *TEST_FILES[stack],
            # gql's settings (asyncio mode, loop scope), not ours: no filterwarnings=error.
            "-c", str(suite / "pyproject.toml"), "--rootdir", str(suite),
            "-p", "gql_swap", f"--gql-transport={mode}", f"--gql-stack={stack}",
            f"--gql-swap-report={report}",
            "-p", "no:cacheprovider", "-q", *extra,
        ]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        # gql's CLI tests run the gql-cli script of this venv.
        env["PATH"] = os.pathsep.join(
            filter(None, [str(Path(sys.executable).parent), env.get("PATH")])
        )
        started = time.monotonic()
        done = subprocess.run(
            command,
            cwd=suite,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        seconds = time.monotonic() - started
        summary = json.loads(report.read_text()) if report.exists() else {}
    return Run(
        stack=stack,
        mode=mode,
        returncode=done.returncode,
        seconds=seconds,
        output=done.stdout,
        outcomes=summary.get("outcomes", {}),
        built=set(summary.get("built", [])),
        token_requests=summary.get("token_requests", 0),
    )


def problems(stock: Run, swapped: Run) -> list[str]:
    """What makes ``swapped`` fall short of ``stock``; empty when it does not."""
    found = []
    if swapped.returncode != 0:
        found.append(f"pytest exited with status {swapped.returncode}")
    found += [f"failed: {test}" for test in sorted(swapped.with_outcome("failed"))]
    lost = stock.with_outcome("passed") - swapped.with_outcome("passed")
    found += [f"passes with gql's transport, not with ours: {test}" for test in sorted(lost)]
    # A test that never built our transport proves nothing about it; one that never built
    # gql's either (it builds another stack's) is not about this one.
    unbuilt = (swapped.with_outcome("passed") & stock.built) - swapped.built
    found += [f"passed without building our transport: {test}" for test in sorted(unbuilt)]
    if swapped.mode == "oauth2" and swapped.token_requests == 0:
        found.append("no token was requested: the swap did not take")
    return found


def main(argv: list[str]) -> int:
    gql_version = version("gql")
    suite = unpacked_suite(Path(sys.prefix), gql_version)
    # Two at a time: each run is one process that mostly waits on its loopback servers.
    jobs = [(stack, mode) for stack in TEST_FILES for mode in MODES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = pool.map(lambda job: run(suite, job[0], job[1], argv), jobs)
        runs = {(r.stack, r.mode): r for r in done}
    failures: dict[tuple[str, str], list[str]] = {}
    for stack in TEST_FILES:
        stock = runs[stack, "stock"]
        if stock.returncode != 0 or not stock.with_outcome("passed"):
            failures[stack, "stock"] = [f"gql's own run exited with status {stock.returncode}"]
        for mode in MODES[1:]:
            if found := problems(stock, runs[stack, mode]):
                failures[stack, mode] = found

    print(f"gql {gql_version}: its HTTP transport tests, with its transports and with ours")
    for (stack, mode), result in runs.items():
        counts = ", ".join(
            f"{len(result.with_outcome(outcome))} {outcome}"
            for outcome in ("passed", "failed", "skipped")
        )
        extra = f", {result.token_requests} token requests" if mode == "oauth2" else ""
        verdict = "FAILED" if (stack, mode) in failures else "ok"
        print(f"  {stack:8} {mode:8} {counts}{extra}  ({result.seconds:.1f} s)  {verdict}")
    for (stack, mode), found in failures.items():
        # gql's tests log at DEBUG, so a failing run's output is long: the end of it here,
        # all of it in a file.
        log = suite / f"last-{stack}-{mode}.log"
        log.write_text(runs[stack, mode].output, encoding="utf-8")
        tail = "\n".join(runs[stack, mode].output.rstrip().splitlines()[-40:])
        print(f"\n== {stack} {mode}: the end of pytest's output (all of it: {log})\n{tail}")
        print(f"\n== {stack} {mode}: what falls short")
        for line in found:
            print(f"  {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
