"""The ``emulator`` command: serve the emulator, print its settings, summarize on exit.

Its credentials come from ``--clients FILE``, or from ``--keep-clients FILE``, which keeps
the generated ones across restarts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from collections.abc import Sequence
from datetime import date
from pathlib import Path

from ._core.constants import ENV_CLIENT_ID, ENV_CLIENT_SECRET
from .emulator import ClientRecord, Emulator
from .emulator._server import COUNTERS_PATH


class UsageError(Exception):
    """Bad command-line input, reported with exit code 2."""


def read_clients(path: Path) -> list[ClientRecord]:
    try:
        entries = json.loads(path.read_text())
        return [
            ClientRecord(
                str(entry["client_id"]),
                str(entry["client_secret"]),
                date.fromisoformat(entry.get("registered", "2025-01-15")),
                frozenset(entry["scopes"]) if entry.get("scopes") is not None else None,
            )
            for entry in entries
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"cannot read clients from {path}: {type(exc).__name__}: {exc}") from None


def write_clients(path: Path, clients: Sequence[ClientRecord]) -> None:
    entries = [
        {
            "client_id": client.client_id,
            "client_secret": client.client_secret,
            "registered": client.registered.isoformat(),
            **({"scopes": sorted(client.scopes)} if client.scopes is not None else {}),
        }
        for client in clients
    ]
    try:
        # O_EXCL: never over a file that appeared since; 0600: it holds the secrets.
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(entries, file, indent=2)
            file.write("\n")
    except OSError as exc:
        raise UsageError(f"cannot write clients to {path}: {exc.strerror}") from None


def clients_of(args: argparse.Namespace) -> tuple[list[ClientRecord] | None, Path | None]:
    """The clients to serve, and the file to write them to once generated, if any."""
    if args.clients and args.keep_clients:
        raise UsageError("--clients and --keep-clients: give one")
    if args.clients:
        return read_clients(args.clients), None
    if args.keep_clients:
        if args.keep_clients.exists():
            return read_clients(args.keep_clients), None
        return None, args.keep_clients
    return None, None


async def serve(args: argparse.Namespace) -> None:
    clients, keep_in = clients_of(args)
    emulator = Emulator(clients=clients, host=args.host, port=args.port, token_ttl=args.token_ttl)
    if keep_in is not None:
        write_clients(keep_in, list(emulator.clients.values()))
    try:
        await emulator.start()
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    lines = [
        f"# gql-service-auth emulator on {emulator.base_url} (Ctrl+C to stop); "
        f"counters: GET {emulator.base_url}{COUNTERS_PATH}"
    ]
    recent = _first(emulator, api_key_allowed=True) or next(iter(emulator.clients.values()))
    lines += [f"export {k}={v}" for k, v in emulator.environ(recent).items()]
    legacy = _first(emulator, api_key_allowed=False)
    if legacy is not None:
        lines.append(
            f"# registered {legacy.registered.isoformat()}, before 2024-05-13: OAuth2 only"
        )
        lines += [
            f"# export {k}={v}"
            for k, v in emulator.environ(legacy).items()
            if k in (ENV_CLIENT_ID, ENV_CLIENT_SECRET)
        ]
    print("\n".join(lines), flush=True)
    try:
        await stop.wait()
    finally:
        await emulator.close()
        counters = emulator.counters
        print(
            f"# served {counters.token_requests} token requests "
            f"({counters.tokens_issued} tokens issued), {counters.graphql_requests} GraphQL "
            f"requests ({counters.unauthenticated_responses} UNAUTHENTICATED, "
            f"{counters.mutations_run} mutations run)",
            flush=True,
        )


def _first(emulator: Emulator, *, api_key_allowed: bool) -> ClientRecord | None:
    return next(
        (c for c in emulator.clients.values() if c.api_key_allowed == api_key_allowed), None
    )
