"""Figure 15: what a process pays before its first answer, per stack, against gql alone.

Two measures, each in fresh interpreters, interleaved (gql's, then ours, each run):

- import: ``import gql``, then the stack's gql transport module (gql's own, or ours, which
  imports gql's), timed inside the process: beyond ``import gql``, and whole (gql
  included, what a process that imports the transport pays);
- a cold one-query process: interpreter start to the first answer, wall time, of a script
  that imports the stack's transport, builds it and runs one query against the lean server
  (gql's with a fixed header; ours with OAuth2, whose first query also fetches a token).

Medians, in milliseconds. The lean server runs in its own process (see ``_lean_server.py``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

# stack: (gql's module and transport, ours); gql's Client.execute runs an async
# transport's query on a loop of its own.
STACKS: dict[str, tuple[str, str, str, str]] = {
    "aiohttp": (
        "gql.transport.aiohttp",
        "AIOHTTPTransport",
        "gql_service_auth.transports",
        "OAuth2Transport",
    ),
    "requests": (
        "gql.transport.requests",
        "RequestsHTTPTransport",
        "gql_service_auth.requests",
        "OAuth2RequestsTransport",
    ),
    "httpx": (
        "gql.transport.httpx",
        "HTTPXTransport",
        "gql_service_auth.httpx",
        "OAuth2HTTPXTransport",
    ),
}

_IMPORT = """
import time
t0 = time.perf_counter()
import gql
t1 = time.perf_counter()
import {module}
t2 = time.perf_counter()
print(t2 - t1, t2 - t0)
"""

_QUERY = """
from gql import Client, gql
from {module} import {name}
transport = {name}({arguments})
Client(transport=transport).execute(gql("query {{ carriers(first: 1) {{ totalCount }} }}"))
"""


_IMPORTS_PER_RUN = 3


def _run(code: str, env: dict[str, str]) -> str:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    ).stdout


def _with_bytecode(cache: str) -> dict[str, str]:
    """The processes' environment: modules' bytecode cached under ``cache`` for every
    module alike, as an installed package has it. Without it (``PYTHONDONTWRITEBYTECODE``,
    set on some machines, or an editable install never imported) our modules were compiled
    from source in every run while gql's came compiled from site-packages: 27 ms of the
    requests stack's import."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache
    return env


def _wall(code: str, env: dict[str, str]) -> float:
    began = time.perf_counter()
    _run(code, env)
    return time.perf_counter() - began


def figure(runs: int, url: str, token_url: str) -> dict[str, Any]:
    """The import and cold-query medians of each stack, gql's and ours, in ms."""
    with tempfile.TemporaryDirectory() as cache:
        return _figure(runs, url, token_url, _with_bytecode(cache))


def _figure(runs: int, url: str, token_url: str, env: dict[str, str]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for stack, (gql_module, gql_class, our_module, our_class) in STACKS.items():
        theirs = f"{url!r}, headers={{'Authorization': 'Bearer lean-0'}}"
        ours = (
            f"{url!r}, token_url={token_url!r}, client_id='bench', client_secret='secret', "
            "share_tokens=False"
        )
        imports: dict[str, list[float]] = {"gql": [], "ours": []}
        whole: dict[str, list[float]] = {"gql": [], "ours": []}
        cold: dict[str, list[float]] = {"gql": [], "ours": []}
        for module in (gql_module, our_module):  # a first run writes the bytecode
            _run(_IMPORT.format(module=module), env)
        for _ in range(runs):
            # Three import pairs per run: `import gql` alone moves a few ms from one process
            # to the next, as much as the difference measured, and an import costs a tenth
            # of a one-query process.
            for _ in range(_IMPORTS_PER_RUN):
                for who, module in (("gql", gql_module), ("ours", our_module)):
                    beyond, entire = _run(_IMPORT.format(module=module), env).split()
                    imports[who].append(float(beyond))
                    whole[who].append(float(entire))
            cold["gql"].append(
                _wall(_QUERY.format(module=gql_module, name=gql_class, arguments=theirs), env)
            )
            cold["ours"].append(
                _wall(_QUERY.format(module=our_module, name=our_class, arguments=ours), env)
            )
        import_ms = {who: statistics.median(times) * 1000 for who, times in imports.items()}
        whole_ms = {who: statistics.median(times) * 1000 for who, times in whole.items()}
        cold_ms = {who: statistics.median(times) * 1000 for who, times in cold.items()}
        figures[stack] = {
            "import ms (beyond gql)": {k: round(v, 1) for k, v in import_ms.items()},
            "import ratio": round(import_ms["ours"] / import_ms["gql"], 2),
            "whole import ms": {k: round(v, 1) for k, v in whole_ms.items()},
            "whole import ratio": round(whole_ms["ours"] / whole_ms["gql"], 2),
            "cold one-query process ms": {k: round(v, 1) for k, v in cold_ms.items()},
            "cold ratio": round(cold_ms["ours"] / cold_ms["gql"], 2),
        }
    return figures
