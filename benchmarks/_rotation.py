"""Figure 16: what a rotation of the credentials costs a fleet under load.

Four processes, one per stack (aiohttp, requests, httpx, httpx on asyncio), each querying
without pause through one transport that reads a credentials file
(``CredentialsFile``), OAuth2 ones sharing a local store. The file is replaced with new
credentials (created in the emulator), and the figure counts, until every process has had
a query answered with them: the seconds, the token requests, and the queries that failed;
then the old credentials are deleted and the queries of one more second are counted.
The watcher checks the file every ``check_every`` seconds (10 by default; 1 here, so that
the figure takes seconds), so the time is about one period and a query.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gql_service_auth.emulator import ClientRecord, Emulator

WORKER = Path(__file__).resolve().parent.parent / "tests" / "rotation_worker.py"
STACKS = ("aiohttp", "requests", "httpx", "httpx-async")
CHECK_EVERY = 1.0
GUARD = 60.0
"""Seconds any wait may take, whatever happens."""


def _write(path: Path, client: ClientRecord) -> None:
    staged = path.with_suffix(".tmp")
    staged.write_text(
        json.dumps({"client_id": client.client_id, "client_secret": client.client_secret})
    )
    os.replace(staged, path)


def _statuses(directory: Path) -> list[dict[str, Any]]:
    paths = [directory / f"status-{index}.json" for index in range(len(STACKS))]
    return [json.loads(path.read_text()) if path.exists() else {} for path in paths]


def _until(condition: Any) -> bool:
    deadline = time.monotonic() + GUARD
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def rotation(
    method: str, check_every: float = CHECK_EVERY, counted_for: float = 1.0
) -> dict[str, Any]:
    """One rotation under load, for ``method`` (``oauth2`` or ``api_key``)."""
    with Emulator().run_in_thread() as emulator, tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        path = directory / "credentials.json"
        old = emulator.recent_client
        _write(path, old)
        (directory / "tokens").mkdir(mode=0o700)
        stop = directory / "stop"
        workers = []
        try:
            for index, stack in enumerate(STACKS):
                config = {
                    "graphql_url": emulator.graphql_url,
                    "token_url": emulator.token_url,
                    "method": method,
                    "stack": stack,
                    "source": "file",
                    "path": str(path),
                    "check_every": check_every,
                    "store_url": (directory / "tokens").as_uri(),
                    "status": str(directory / f"status-{index}.json"),
                    "stop": str(stop),
                }
                environ = {**os.environ, "ROTATION_CONFIG": json.dumps(config)}
                workers.append(subprocess.Popen([sys.executable, str(WORKER)], env=environ))
            assert _until(lambda: all(s.get("ok", 0) >= 10 for s in _statuses(directory)))
            new = emulator.create_credentials()
            before = emulator.counters.token_requests
            failed_before = sum(s["failed"] for s in _statuses(directory))
            written = time.time()
            _write(path, new)
            assert _until(lambda: all(s.get("switched") for s in _statuses(directory)))
            statuses = _statuses(directory)
            token_requests = emulator.counters.token_requests - before
            seconds = [s["switched_at"] - written for s in statuses]
            failed_during = sum(s["failed"] for s in statuses) - failed_before
            emulator.delete_credentials(old)
            counted = [s["ok"] + s["failed"] for s in statuses]
            time.sleep(counted_for)  # the queries of a while after the deletion
            after = _statuses(directory)
        finally:
            stop.touch()
            for worker in workers:
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
        return {
            "processes": len(STACKS),
            "check_every": check_every,
            "after_deletion_seconds": counted_for,
            "seconds_until_all_switched": round(max(seconds), 3),
            "seconds_per_process": [round(s, 3) for s in seconds],
            "token_requests": token_requests,
            "failed_during": failed_during,
            "queries_after_deletion": sum(s["ok"] + s["failed"] for s in after) - sum(counted),
            "failed_after_deletion": sum(s["failed"] for s in after)
            - sum(s["failed"] for s in statuses),
            "deleted_credentials_used": emulator.counters.deleted_credentials_used,
        }


def figure(check_every: float = CHECK_EVERY, after: float = 1.0) -> dict[str, Any]:
    return {method: rotation(method, check_every, after) for method in ("oauth2", "api_key")}


def print_figure(figures: dict[str, Any]) -> None:
    first = next(iter(figures.values()))
    print(
        f"\n16. A rotation under load: {len(STACKS)} processes (aiohttp, requests, httpx, httpx "
        f"async), a credentials file checked every {first['check_every']:g} s, OAuth2 on a "
        f"local store; queries counted {first['after_deletion_seconds']:g} s after the deletion"
    )
    print(
        f"  {'method':<8} {'all switched':>13} {'token requests':>15} {'failed':>7} "
        f"{'after deletion: queries':>24} {'failed':>7} {'deleted used':>13}"
    )
    for method, row in figures.items():
        switched = row["seconds_until_all_switched"]
        print(
            f"  {method:<8} {switched:>11.2f} s {row['token_requests']:>15} "
            f"{row['failed_during']:>7} {row['queries_after_deletion']:>24} "
            f"{row['failed_after_deletion']:>7} {row['deleted_credentials_used']:>13}"
        )
