"""The ``gql-service-auth`` command: check credentials or a token store, serve the
emulator, run the demo.

Exit codes:
    0: success; also ``emulator`` stopped by Ctrl+C or SIGTERM, its normal way to stop.
    1: the service or the authorization server refused the credentials.
    2: bad usage or configuration (a missing variable, an unreadable file...).
    3: the service (or the token store) could not be reached or answered in an
       unexpected way (a wrong URL).
    130: ``check`` or ``demo`` interrupted (Ctrl+C).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

from ._cli_check import (
    CHECK_TIMEOUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    STACKS,
    check,
    print_report,
    required_setting,
)
from ._cli_emulator import UsageError as _UsageError
from ._cli_emulator import serve
from ._cli_store import check_store, open_store, print_store_report
from ._core.constants import (
    ENV_AUTH_URL,
    ENV_BASE_URL,
    ENV_CLIENT_ID,
    ENV_CLIENT_ID_FILE,
    ENV_CLIENT_SECRET,
    ENV_CLIENT_SECRET_FILE,
    ENV_CREDENTIALS_FILE,
    ENV_TOKEN_STORE_URL,
    LOGGER_NAME,
)
from ._core.errors import (
    ConfigurationError,
)

__all__ = [
    "EXIT_CODES",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "main",
]

EXIT_CODES: Final = (
    "Exit codes: 0 ok, 1 credentials refused, 2 usage or configuration error, 3 service "
    "(or token store) unreachable or unexpected answer, 130 interrupted. The emulator "
    "command exits 0 when Ctrl+C or SIGTERM stops it."
)
"""The exit codes as ``--help`` tells them; docs/cli.md says the same (a test compares)."""


def _parser() -> argparse.ArgumentParser:
    # Every command takes -v: the report says what went wrong, the log records how.
    verbosity = argparse.ArgumentParser(add_help=False)
    verbosity.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="also log token requests and retries to stderr (-vv: every event)",
    )
    parser = argparse.ArgumentParser(
        prog="gql-service-auth",
        description="Check credentials against the service, serve its emulator, or run the demo.",
        epilog=EXIT_CODES,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check",
        parents=[verbosity],
        help="run the authentication check query with real credentials",
        description="Run the contract's check query (carriers) and tell which method works. "
        f"Settings default to the {ENV_BASE_URL}, {ENV_AUTH_URL}, {ENV_CLIENT_ID} and "
        f"{ENV_CLIENT_SECRET} environment variables; {ENV_AUTH_URL} is needed only when "
        f"OAuth2 is tried. Credentials in files are read as the application reads them: "
        f"{ENV_CREDENTIALS_FILE}, or {ENV_CLIENT_SECRET_FILE} with {ENV_CLIENT_ID_FILE} or "
        f"{ENV_CLIENT_ID}.",
        epilog=EXIT_CODES,
    )
    check.add_argument(
        "--method",
        choices=("auto", "api-key", "oauth2"),
        default="auto",
        help="auto tries the API key, then OAuth2 if the key is refused (default: auto)",
    )
    check.add_argument(
        "--base-url",
        help=f"API host; /graphql is appended unless it ends with it (default: ${ENV_BASE_URL})",
    )
    check.add_argument(
        "--auth-url",
        help=f"authorization server, for OAuth2 only; /oauth2/token is appended unless it "
        f"ends with it (default: ${ENV_AUTH_URL})",
    )
    check.add_argument("--client-id", help=f"Client Id (default: ${ENV_CLIENT_ID})")
    check.add_argument(
        "--client-secret",
        help=f"Client Secret (default: ${ENV_CLIENT_SECRET}; prefer the variable, since "
        "arguments are visible to other users of the machine)",
    )
    check.add_argument(
        "--first", type=int, default=5, metavar="N", help="carriers to show (default: 5)"
    )
    check.add_argument(
        "--timeout",
        type=float,
        default=CHECK_TIMEOUT,
        metavar="SECONDS",
        help=f"how long each query may take, its token included (default: {CHECK_TIMEOUT:g})",
    )
    check.add_argument(
        "--stack",
        choices=STACKS,
        default="aiohttp",
        help="the HTTP stack to check with, as the application's transport uses it: its "
        "proxies (requests and httpx follow HTTP_PROXY, aiohttp does not), TLS and "
        "timeouts (default: aiohttp)",
    )
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

    store = commands.add_parser(
        "store",
        parents=[verbosity],
        help="try a token store URL end to end: connect, lock, save, load, clean up",
        description="Try the token store a URL names as the transports use it, on an identity "
        "made up for the check: set-up (connection, TLS, AUTH, cluster slots, scripts), then a "
        "sealed round trip. A failing step says why and how to fix it. The URL defaults to "
        f"${ENV_TOKEN_STORE_URL}; SERVICE_TOKEN_STORE_TIMEOUT and "
        "SERVICE_TOKEN_STORE_CONNECT_TIMEOUT apply.",
        epilog=EXIT_CODES,
    )
    store.add_argument(
        "url",
        nargs="?",
        help=f"file:///dir, redis://, rediss://, redis+cluster://, redis+sentinel://... "
        f"(default: ${ENV_TOKEN_STORE_URL}; prefer the variable if the URL holds a password)",
    )

    emulator = commands.add_parser(
        "emulator",
        help="serve the service emulator on 127.0.0.1",
        description="Serve the emulator until Ctrl+C or SIGTERM stops it (exit code 0), and "
        "print the SERVICE_* variables that point the other commands and the examples at it.",
    )
    emulator.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    emulator.add_argument("--port", type=int, default=8000, help="port, 0 for any (default: 8000)")
    emulator.add_argument(
        "--token-ttl", type=float, default=3600.0, help="token lifetime in seconds (default: 3600)"
    )
    emulator.add_argument(
        "--clients",
        type=Path,
        metavar="FILE",
        help='JSON file of credentials: [{"client_id": ..., "client_secret": ..., '
        '"registered": "YYYY-MM-DD", "scopes": [...]}]',
    )
    emulator.add_argument(
        "--keep-clients",
        type=Path,
        metavar="FILE",
        help="the same development credentials at every start: read from FILE, or, the first "
        "time, generated and written there (mode 0600)",
    )

    demo = commands.add_parser(
        "demo",
        parents=[verbosity],
        help="show the whole story against the embedded emulator (about 10 s)",
        description="Show the whole story against the embedded emulator (about 10 s).",
    )
    demo.add_argument(
        "--token-ttl",
        type=float,
        default=2.0,
        help="lifetime in seconds of the tokens once the demo revokes the first (default: 2)",
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
    with _logging_for(getattr(args, "verbose", 0)):
        return _run(args, environ)


def _run(args: argparse.Namespace, environ: Mapping[str, str] | None) -> int:
    try:
        if args.command == "check":
            report = asyncio.run(check(args, os.environ if environ is None else environ))
            print_report(report, args.json, sys.stdout)
            if report.error is not None:
                print(f"gql-service-auth: error: {report.error}", file=sys.stderr)
            return report.exit_code
        if args.command == "emulator":
            asyncio.run(serve(args))
            return EXIT_OK
        if args.command == "store":
            return _store(args, os.environ if environ is None else environ)
        from ._demo import run_demo

        return asyncio.run(run_demo(token_ttl=args.token_ttl, out=sys.stdout))
    except (_UsageError, ConfigurationError) as exc:
        print(f"gql-service-auth: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _store(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    url = required_setting(args.url, environ, ENV_TOKEN_STORE_URL, "URL")
    store = open_store(url, environ)
    try:
        report = asyncio.run(check_store(store))
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    print_store_report(report, sys.stdout)
    return EXIT_OK if report.ok else EXIT_UNREACHABLE


@contextlib.contextmanager
def _logging_for(verbose: int) -> Iterator[None]:
    """One plain line on stderr per log record, unless the caller set up logging already.

    Python's fallback for a program that configured nothing prints bare messages. The
    report already tells of every failure, so this package's records show only with -v
    (INFO: token requests retried or failed, tokens refused) or -vv (DEBUG: every event);
    warnings of other libraries always show. main() may be called by a program: what it
    changes is undone when it returns, and a program that configured logging (the root
    logger or this package's) keeps its setup untouched.
    """
    root = logging.getLogger()
    package = logging.getLogger(LOGGER_NAME)
    if root.handlers or package.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    root_level, package_level = root.level, package.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    levels = {0: logging.ERROR, 1: logging.INFO}
    package.setLevel(levels.get(verbose, logging.DEBUG))
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(root_level)
        package.setLevel(package_level)
