"""The ``gql-service-auth`` command: check credentials, serve the emulator, run the demo.

Exit codes:
    0: success.
    1: the service or the authorization server refused the credentials.
    2: bad usage or configuration (a missing variable, an unreadable file...).
    3: the service could not be reached or answered in an unexpected way.
    130: interrupted (Ctrl+C).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Final, TextIO

from gql import Client, gql
from gql.transport.exceptions import TransportError

from ._constants import ENV_AUTH_URL, ENV_BASE_URL, ENV_CLIENT_ID, ENV_CLIENT_SECRET
from ._errors import (
    ConfigurationError,
    TokenRequestError,
    UnauthenticatedError,
)
from ._events import AuthEvent
from .emulator import ClientRecord, Emulator
from .transports import ApiKeyTransport, OAuth2Transport

EXIT_OK: Final = 0
EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_INTERRUPTED: Final = 130

_CHECK_QUERY = "query ($first: Int) { carriers(first: $first) { edges { node { id name } } } }"

_FALLBACK_NOTE = (
    "The service refused these credentials as an API key. Credentials registered before "
    "2024-05-13 cannot be used as an API key, so OAuth2 is tried with the same credentials. "
    "New credentials created in the console would allow the API key."
)


class _UsageError(Exception):
    """Bad command-line input, reported with exit code 2."""


@dataclass
class _Step:
    name: str
    ok: bool
    latency_ms: float
    detail: str = ""


@dataclass
class _Report:
    ok: bool = False
    method: str | None = None
    steps: list[_Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    token_expires_in: float | None = None
    access_token: str | None = None
    carriers: list[dict[str, str]] = field(default_factory=list)
    exit_code: int = EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gql-service-auth",
        description="Check credentials against the service, serve its emulator, or run the demo.",
        epilog="Exit codes: 0 ok, 1 credentials refused, 2 usage or configuration error, "
        "3 service unreachable, 130 interrupted.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check",
        help="run the authentication check query with real credentials",
        description="Run the contract's check query (carriers) and tell which method works. "
        f"Settings default to the {ENV_BASE_URL}, {ENV_AUTH_URL}, {ENV_CLIENT_ID} and "
        f"{ENV_CLIENT_SECRET} environment variables.",
    )
    check.add_argument(
        "--method",
        choices=("auto", "api-key", "oauth2"),
        default="auto",
        help="auto tries the API key, then OAuth2 (default: auto)",
    )
    check.add_argument("--base-url", help=f"API host (default: ${ENV_BASE_URL})")
    check.add_argument("--auth-url", help=f"authorization server (default: ${ENV_AUTH_URL})")
    check.add_argument("--client-id", help=f"Client Id (default: ${ENV_CLIENT_ID})")
    check.add_argument(
        "--client-secret",
        help=f"Client Secret (default: ${ENV_CLIENT_SECRET}; prefer the variable, since "
        "arguments are visible to other users of the machine)",
    )
    check.add_argument("--first", type=int, default=5, help="carriers to show (default: 5)")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.add_argument(
        "--show-token",
        action="store_true",
        help="also print the access token (it grants access: handle with care)",
    )
    check.add_argument(
        "--allow-insecure-http",
        action="store_true",
        help="allow http:// to a host that is not loopback",
    )

    emulator = commands.add_parser(
        "emulator",
        help="serve the service emulator on 127.0.0.1",
        description="Serve the emulator until interrupted, and print the SERVICE_* variables "
        "that point the other commands and the examples at it.",
    )
    emulator.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    emulator.add_argument("--port", type=int, default=8000, help="port, 0 for any (default: 8000)")
    emulator.add_argument(
        "--token-ttl", type=float, default=3600.0, help="token lifetime in seconds (default: 3600)"
    )
    emulator.add_argument(
        "--clients",
        type=Path,
        help='JSON file of credentials: [{"client_id": ..., "client_secret": ..., '
        '"registered": "YYYY-MM-DD", "scopes": [...]}]',
    )

    demo = commands.add_parser(
        "demo", help="show the whole story against the embedded emulator (about 10 s)"
    )
    demo.add_argument(
        "--token-ttl", type=float, default=2.0, help="token lifetime in seconds (default: 2)"
    )
    return parser


def main(argv: Sequence[str] | None = None, *, environ: Mapping[str, str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: The arguments, without the program name; ``sys.argv[1:]`` when ``None``.
        environ: Where ``check`` reads ``SERVICE_*`` variables; ``os.environ`` when ``None``.

    Returns:
        The exit code (see the module docstring).
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse exits on --help and on bad usage
        return int(exit_.code or 0)
    try:
        if args.command == "check":
            report = asyncio.run(_check(args, os.environ if environ is None else environ))
            _print_report(report, args.json, sys.stdout)
            return report.exit_code
        if args.command == "emulator":
            return asyncio.run(_serve(args))
        from ._demo import run_demo

        return asyncio.run(run_demo(token_ttl=args.token_ttl, out=sys.stdout))
    except (_UsageError, ConfigurationError) as exc:
        print(f"gql-service-auth: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _setting(value: str | None, environ: Mapping[str, str], name: str, flag: str) -> str:
    value = value if value is not None else environ.get(name, "")
    if not value.strip():
        raise _UsageError(f"no {flag}: pass {flag} or set {name}")
    return value.strip()


async def _check(args: argparse.Namespace, environ: Mapping[str, str]) -> _Report:
    # Flags win over variables; the transports' from_env() then builds the URLs.
    settings = {
        ENV_BASE_URL: _setting(args.base_url, environ, ENV_BASE_URL, "--base-url"),
        ENV_CLIENT_ID: _setting(args.client_id, environ, ENV_CLIENT_ID, "--client-id"),
        ENV_CLIENT_SECRET: _setting(
            args.client_secret, environ, ENV_CLIENT_SECRET, "--client-secret"
        ),
    }
    if args.method != "api-key":
        settings[ENV_AUTH_URL] = _setting(args.auth_url, environ, ENV_AUTH_URL, "--auth-url")
    if not 1 <= args.first <= 100:
        raise _UsageError("--first must be between 1 and 100")
    report = _Report()

    if args.method in ("auto", "api-key"):
        api_key = ApiKeyTransport.from_env(settings, allow_insecure_http=args.allow_insecure_http)
        refused = await _query_step(report, "api_key", api_key, args.first)
        if report.ok:
            report.method = "api-key"
            return report
        if not refused or args.method == "api-key":
            return report
        report.notes.append(_FALLBACK_NOTE)

    fetched: list[AuthEvent] = []
    oauth2 = OAuth2Transport.from_env(
        settings,
        allow_insecure_http=args.allow_insecure_http,
        on_event=lambda event: fetched.append(event) if event.name == "token_fetched" else None,
    )
    await _query_step(report, "oauth2", oauth2, args.first, fetched)
    if report.ok:
        report.method = "oauth2"
        token = oauth2.token
        if args.show_token and token is not None:
            report.access_token = token.value
    return report


async def _query_step(
    report: _Report,
    name: str,
    transport: ApiKeyTransport | OAuth2Transport,
    first: int,
    fetched: list[AuthEvent] | None = None,
) -> bool:
    """Run the check query; record the steps. Returns whether the credentials were refused."""
    started = time.perf_counter()
    try:
        async with Client(transport=transport) as session:
            query = gql(_CHECK_QUERY)
            query.variable_values = {"first": first}
            result = await session.execute(query)
    except (UnauthenticatedError, TokenRequestError) as exc:
        _token_step(report, fetched)
        report.steps.append(_Step(name, False, _ms_since(started), str(exc)))
        report.exit_code = (
            EXIT_UNREACHABLE
            if isinstance(exc, TokenRequestError) and exc.retryable
            else EXIT_REFUSED
        )
        return not isinstance(exc, TokenRequestError)
    except (TransportError, OSError, asyncio.TimeoutError) as exc:
        report.steps.append(_Step(name, False, _ms_since(started), f"{type(exc).__name__}: {exc}"))
        report.exit_code = EXIT_UNREACHABLE
        return False
    elapsed = _ms_since(started)
    token_ms = _token_step(report, fetched)
    edges = result.get("carriers", {}).get("edges", [])
    report.carriers = [edge["node"] for edge in edges]
    report.steps.append(
        _Step(name, True, round(elapsed - token_ms, 1), f"{len(report.carriers)} carriers")
    )
    report.ok = True
    report.exit_code = EXIT_OK
    return False


def _token_step(report: _Report, fetched: list[AuthEvent] | None) -> float:
    if not fetched:
        return 0.0
    event = fetched[0]
    duration = round((event.duration or 0.0) * 1000, 1)
    report.token_expires_in = event.expires_in
    lifetime = (
        f"expires in {event.expires_in:g} s"
        if event.expires_in is not None
        else ("no expires_in given")
    )
    report.steps.append(_Step("token", True, duration, lifetime))
    return duration


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


_LABELS = {"api_key": "API key", "oauth2": "OAuth2 query", "token": "OAuth2 token"}


def _print_report(report: _Report, as_json: bool, out: TextIO) -> None:
    if as_json:
        document: dict[str, Any] = asdict(report)
        del document["exit_code"]
        if document["access_token"] is None:
            del document["access_token"]
        print(json.dumps(document, indent=2), file=out)
        return
    for step in report.steps:
        outcome = "ok" if step.ok else "FAILED"
        print(
            f"{_LABELS[step.name]:<13} {outcome:<6} {step.latency_ms:>8.1f} ms  {step.detail}",
            file=out,
        )
        if step.name == "api_key" and not step.ok:
            for note in report.notes:
                print(f"  note: {note}", file=out)
    if report.ok:
        print(f"\nmethod that works: {report.method}", file=out)
        for carrier in report.carriers:
            print(f"  {carrier['id']}  {carrier['name']}", file=out)
        if report.access_token is not None:
            print(f"\naccess token: {report.access_token}", file=out)


def _read_clients(path: Path) -> list[ClientRecord]:
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
        raise _UsageError(
            f"cannot read clients from {path}: {type(exc).__name__}: {exc}"
        ) from None


async def _serve(args: argparse.Namespace) -> int:
    clients = _read_clients(args.clients) if args.clients else None
    emulator = Emulator(clients=clients, host=args.host, port=args.port, token_ttl=args.token_ttl)
    try:
        await emulator.start()
    except OSError as exc:
        raise _UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    lines = [f"# gql-service-auth emulator on {emulator.base_url} (Ctrl+C to stop)"]
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
    return EXIT_OK


def _first(emulator: Emulator, *, api_key_allowed: bool) -> ClientRecord | None:
    return next(
        (c for c in emulator.clients.values() if c.api_key_allowed == api_key_allowed), None
    )
