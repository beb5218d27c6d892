"""Figure 12: how many tokens code costs, without and with sharing, on the same run.

Four patterns of user code against the emulator, each run twice: "without" is every
transport on its own (``share_tokens=False``, no store), as before 0.2; "with" is the
defaults (tokens shared in the process) plus, for processes, the local store
(``SERVICE_TOKEN_STORE_URL=file:///...``). Token requests are counted by the emulator.

- per call: a helper that builds a transport and a gql ``Client`` for each query, with
  gql's blocking ``execute``, the garbage collector run between calls;
- per thread: threads that each build a transport, all on a cold token at once;
- cron: one-shot processes in a row, each one query;
- workers: processes on one host (web or Celery workers), each with concurrent query
  loops over several lifetimes of short tokens.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gql import Client, gql

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import Emulator

QUERY = gql("query { carriers(first: 1) { totalCount } }")
MODES = ("without", "with")

_ONE_SHOT = """
import os
from gql import Client, gql
from gql_service_auth import OAuth2Transport
transport = OAuth2Transport.from_env(share_tokens=os.environ["SHARE"] == "1")
Client(transport=transport).execute(gql("query { carriers(first: 1) { totalCount } }"))
"""

_WORKER = """
import asyncio, json, os, sys, time
from gql import Client, gql
from gql_service_auth import OAuth2Transport
QUERY = gql("query { carriers(first: 1) { totalCount } }")
async def main():
    transport = OAuth2Transport.from_env(share_tokens=os.environ["SHARE"] == "1")
    failed = queries = 0
    async with Client(transport=transport, execute_timeout=30) as session:
        sys.stdin.readline()  # go
        until = time.monotonic() + float(os.environ["SECONDS"])
        async def loop():
            nonlocal failed, queries
            while time.monotonic() < until:
                try:
                    await session.execute(QUERY)
                except Exception:
                    failed += 1
                queries += 1
                await asyncio.sleep(float(os.environ["PAUSE"]))
        await asyncio.gather(*(loop() for _ in range(int(os.environ["CONCURRENCY"]))))
    print(json.dumps({"queries": queries, "failed": failed}), flush=True)
asyncio.run(main())
"""


def _blocking_query(transport: OAuth2Transport) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        Client(transport=transport, execute_timeout=30).execute(QUERY)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def _counted(emulator: Emulator, work: Callable[[], Any]) -> dict[str, Any]:
    before = emulator.counters.token_requests
    began = time.perf_counter()
    outcome = work() or {}
    return {
        "token_requests": emulator.counters.token_requests - before,
        "seconds": round(time.perf_counter() - began, 2),
        **outcome,
    }


def per_call(emulator: Emulator, calls: int, share: bool) -> dict[str, Any]:
    environ = emulator.environ()

    def work() -> None:
        for _ in range(calls):
            _blocking_query(OAuth2Transport.from_env(environ, share_tokens=share))
            gc.collect()

    return _counted(emulator, work)


def per_thread(emulator: Emulator, threads: int, share: bool) -> dict[str, Any]:
    environ, failures = emulator.environ(), []
    start = threading.Barrier(threads, timeout=30)

    def worker() -> None:
        try:
            start.wait()
            _blocking_query(OAuth2Transport.from_env(environ, share_tokens=share))
        except Exception as exc:
            failures.append(exc)

    def work() -> dict[str, Any]:
        running = [threading.Thread(target=worker) for _ in range(threads)]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join(timeout=60)
        return {"failed": len(failures)}

    return _counted(emulator, work)


@contextmanager
def _store_directory() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="gql-service-auth-bench-") as directory:
        yield os.path.join(directory, "tokens")


def _environ(emulator: Emulator, share: bool, store: str, **more: Any) -> dict[str, str]:
    environ = {**os.environ, **emulator.environ(), "SHARE": "1" if share else "0"}
    environ.pop("SERVICE_TOKEN_STORE_URL", None)
    if share:
        environ["SERVICE_TOKEN_STORE_URL"] = "file://" + store
    return {**environ, **{key: str(value) for key, value in more.items()}}


def cron(emulator: Emulator, runs: int, share: bool) -> dict[str, Any]:
    with _store_directory() as store:
        environ = _environ(emulator, share, store)

        def work() -> dict[str, Any]:
            failed = 0
            for _ in range(runs):
                completed = subprocess.run(
                    [sys.executable, "-c", _ONE_SHOT], env=environ, timeout=60, check=False
                )
                failed += completed.returncode != 0
            return {"failed": failed}

        return _counted(emulator, work)


def workers(
    emulator: Emulator, count: int, concurrency: int, seconds: float, share: bool
) -> dict[str, Any]:
    with _store_directory() as store:
        environ = _environ(
            emulator, share, store, SECONDS=seconds, CONCURRENCY=concurrency, PAUSE=0.05
        )

        def work() -> dict[str, Any]:
            processes = [
                subprocess.Popen(
                    [sys.executable, "-c", _WORKER],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=environ,
                    text=True,
                )
                for _ in range(count)
            ]
            try:
                for process in processes:  # all go together, once every one is connected
                    assert process.stdin is not None
                    process.stdin.write("go\n")
                    process.stdin.flush()
                outcomes = []
                for process in processes:
                    out, _ = process.communicate(timeout=seconds + 60)
                    outcomes.append(json.loads(out) if out.strip() else {"failed": -1})
            finally:
                for process in processes:
                    if process.poll() is None:
                        process.kill()
                        process.wait(timeout=10)
            return {
                "queries": sum(o.get("queries", 0) for o in outcomes),
                "failed": sum(o["failed"] for o in outcomes),
            }

        return _counted(emulator, work)


def figure(sizes: Any) -> dict[str, Any]:
    """Each pattern without and with sharing, each on an emulator of its own (fresh
    credentials, so nothing is shared between runs); tokens live ``sharing_ttl`` s."""
    patterns: dict[str, Callable[[Emulator, bool], dict[str, Any]]] = {
        "per call": lambda emulator, share: per_call(emulator, sizes.sharing_calls, share),
        "per thread": lambda emulator, share: per_thread(emulator, sizes.sharing_threads, share),
        "cron": lambda emulator, share: cron(emulator, sizes.cron_runs, share),
        "workers": lambda emulator, share: workers(
            emulator,
            sizes.worker_processes,
            sizes.worker_concurrency,
            sizes.worker_seconds,
            share,
        ),
    }
    rows: dict[str, Any] = {}
    for name, pattern in patterns.items():
        for mode in MODES:
            with Emulator(token_ttl=sizes.sharing_ttl).run_in_thread() as emulator:
                emulator.token_latency = 0.05  # an identity provider's, so callers overlap
                rows.setdefault(name, {})[mode] = pattern(emulator, mode == "with")
    return {
        "rows": rows,
        "calls": sizes.sharing_calls,
        "threads": sizes.sharing_threads,
        "cron_runs": sizes.cron_runs,
        "workers": f"{sizes.worker_processes} processes x {sizes.worker_concurrency} loops, "
        f"{sizes.worker_seconds:g} s of {sizes.sharing_ttl:g} s tokens",
    }


def print_figure(figure: dict[str, Any]) -> None:
    print(
        "12. Tokens per pattern of code   goal: one token per lifetime, whatever the code "
        "does (token requests counted by the emulator)"
    )
    print(
        f"   per call: {figure['calls']} transports one after another; per thread: "
        f"{figure['threads']} threads; cron: {figure['cron_runs']} one-shot processes; "
        f"workers: {figure['workers']}"
    )
    print(f"   {'pattern':<12}{'without sharing':>18}{'with sharing':>16}   failed queries")
    for name, row in figure["rows"].items():
        without, with_ = row["without"], row["with"]
        failed = f"{without.get('failed', 0)} / {with_.get('failed', 0)}"
        print(
            f"   {name:<12}{without['token_requests']:>18}{with_['token_requests']:>16}   {failed}"
        )
