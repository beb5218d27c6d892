"""``gql-service-auth check``: the contract's check query with real credentials, on the
stack the application uses, and a report of which method works and why not.

:mod:`gql_service_auth.cli` parses the command line and runs it; this is the check itself:
its steps, the notes that tell a refusal's cause, and the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, TextIO

from gql import Client, gql
from gql.transport.exceptions import TransportError, TransportServerError

from ._cli_emulator import UsageError as _UsageError
from ._core.config import ends_with_path
from ._core.constants import (
    DEFAULT_EXPIRES_IN,
    ENV_AUTH_URL,
    ENV_BASE_URL,
    ENV_CLIENT_ID,
    ENV_CLIENT_ID_FILE,
    ENV_CLIENT_SECRET,
    ENV_CLIENT_SECRET_FILE,
    ENV_CREDENTIALS_FILE,
    GRAPHQL_PATH,
)
from ._core.errors import (
    ServiceHTTPError,
    ServiceTimeoutError,
    ServiceUnreachableError,
    TokenRequestError,
    UnauthenticatedError,
)
from ._core.events import AuthEvent
from ._core.oauth2 import RetryPolicy
from .transports import ApiKeyTransport, OAuth2Transport

EXIT_OK: Final = 0
EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_INTERRUPTED: Final = 130

_CHECK_QUERY = "query ($first: Int) { carriers(first: $first) { edges { node { id name } } } }"

STACKS: Final = ("aiohttp", "requests", "httpx", "httpx-async")
"""The stacks ``check --stack`` can use: each one's transports are the application's."""

CHECK_TIMEOUT: Final = 10.0
"""Seconds the check query may take by default, its token included (gql's
``execute_timeout``)."""


# What auto's API key refusal means depends on what OAuth2 then made of the same
# credentials: only their acceptance proves the 2024-05-13 rule is the cause.
_NOTE_RULE = (
    "The service refused these credentials as an API key, and OAuth2 accepted them: "
    "credentials registered before 2024-05-13 cannot be used as an API key. New credentials "
    "created in the console would allow the API key."
)
_NOTE_WRONG = (
    "The authorization server refused these credentials too, so the Client Id or Client "
    "Secret is wrong (the 2024-05-13 rule refuses only the API key): check "
    f"{ENV_CLIENT_ID} and {ENV_CLIENT_SECRET}."
)
_NOTE_EITHER = (
    "The service refused these credentials as an API key. Either the Client Id or Client "
    "Secret is wrong, or the credentials were registered before 2024-05-13 and work only "
    "with OAuth2{}."
)
_NOTE_ELSEWHERE = (
    "The authorization server accepted these credentials, but the service refused both the "
    f"API key and the token: check that {ENV_BASE_URL} and {ENV_AUTH_URL} belong to the same "
    "environment."
)
_NO_AUTH_URL = (
    f"OAuth2 needs the authorization server: pass --auth-url or set {ENV_AUTH_URL} "
    "(the API key alone does not)"
)


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
    error: str | None = None
    exit_code: int = EXIT_OK


def required_setting(value: str | None, environ: Mapping[str, str], name: str, flag: str) -> str:
    """A flag's ``value``, else the variable ``name``; a usage error when neither is set."""
    value = value if value is not None else environ.get(name, "")
    if not value.strip():
        raise _UsageError(f"no {flag}: pass {flag} or set {name}")
    return value.strip()


async def check(args: argparse.Namespace, environ: Mapping[str, str]) -> _Report:
    settings = _check_settings(args, environ)
    report = _Report()
    if ends_with_path(settings[ENV_BASE_URL], GRAPHQL_PATH):
        report.notes.append(
            f"The base URL ends in {GRAPHQL_PATH}, so it is used as the GraphQL endpoint as it "
            f"is. {ENV_BASE_URL} is meant to be the API host, without {GRAPHQL_PATH}."
        )
    api_key_class, oauth2_class = _transport_classes(args.stack)
    proxies = [name for name in _PROXY_VARIABLES if environ.get(name, "").strip()]
    if proxies and args.stack == "aiohttp":
        report.notes.append(
            f"{' and '.join(proxies)} {'is' if len(proxies) == 1 else 'are'} set: aiohttp "
            "ignores the environment's proxies, requests and httpx follow them. Check with "
            "--stack requests, httpx or httpx-async to see what such an application sees."
        )
    sync = args.stack in _SYNC_STACKS
    # A sync stack's own timeout bounds each request (gql's execute_timeout bounds only
    # async calls), so its thread never outlives the check.
    bounds: dict[str, Any] = {"timeout": args.timeout} if sync else {}
    if args.method in ("auto", "api-key"):
        api_key = api_key_class.from_env(
            settings, allow_insecure_http=args.allow_insecure_http, **bounds
        )
        failure = await _query_step(report, "api_key", api_key, args)
        if report.ok:
            report.method = "api-key"
            return report
        if not isinstance(failure, UnauthenticatedError) or args.method == "api-key":
            return report
        if ENV_AUTH_URL not in settings:
            report.notes.append(_NOTE_EITHER.format(""))
            report.error = _NO_AUTH_URL
            report.exit_code = EXIT_USAGE
            return report

    events: list[AuthEvent] = []
    # On a sync stack the token's fetch is bounded by its RetryPolicy alone: --timeout.
    fetch = {"retry": RetryPolicy(timeout=args.timeout)} if sync else {}
    oauth2 = oauth2_class.from_env(
        settings,
        allow_insecure_http=args.allow_insecure_http,
        on_event=lambda event: events.append(event) if event.name in _TOKEN_EVENTS else None,
        **bounds,
        **fetch,
    )
    failure = await _query_step(report, "oauth2", oauth2, args, events)
    if report.ok:
        report.method = "oauth2"
        token = oauth2.token
        if args.show_token and token is not None:
            report.access_token = token.value
    if args.method == "auto":
        report.notes.append(_auto_note(report.ok, failure))
    return report


_SYNC_STACKS: Final = frozenset({"requests", "httpx"})
_PROXY_VARIABLES: Final = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")


def _transport_classes(stack: str) -> tuple[Any, Any]:
    """The API key and OAuth2 transport classes of ``stack`` (see :data:`STACKS`).

    Raises:
        _UsageError: the stack's extra is not installed.
    """
    if stack == "aiohttp":
        return ApiKeyTransport, OAuth2Transport
    extra = "requests" if stack == "requests" else "httpx"
    try:
        if stack == "requests":
            from . import requests as module

            return module.ApiKeyRequestsTransport, module.OAuth2RequestsTransport
        from . import httpx as stack_module

        if stack == "httpx":
            return stack_module.ApiKeyHTTPXTransport, stack_module.OAuth2HTTPXTransport
        return stack_module.ApiKeyHTTPXAsyncTransport, stack_module.OAuth2HTTPXAsyncTransport
    except ImportError:
        raise _UsageError(
            f"--stack {stack} needs the {extra} extra: pip install 'gql-service-auth[{extra}]'"
        ) from None


_CREDENTIAL_FILES = (ENV_CREDENTIALS_FILE, ENV_CLIENT_ID_FILE, ENV_CLIENT_SECRET_FILE)
"""The variables naming credentials files, which ``check`` reads as the application does."""


def _check_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The ``SERVICE_*`` settings of the check: flags win over variables (the transports'
    ``from_env()`` then builds the URLs).

    Raises:
        _UsageError: a setting missing, or a flag out of its range.
    """
    settings = {ENV_BASE_URL: required_setting(args.base_url, environ, ENV_BASE_URL, "--base-url")}
    files = [name for name in _CREDENTIAL_FILES if environ.get(name, "").strip()]
    if files and args.client_id is None and args.client_secret is None:
        # Credentials in files, as the application reads them: from_env() reads the same
        # variables, and says which are missing or given twice.
        for name in (*files, ENV_CLIENT_ID, ENV_CLIENT_SECRET):
            if environ.get(name, "").strip():
                settings[name] = environ[name].strip()
    else:
        settings[ENV_CLIENT_ID] = required_setting(
            args.client_id, environ, ENV_CLIENT_ID, "--client-id"
        )
        settings[ENV_CLIENT_SECRET] = required_setting(
            args.client_secret, environ, ENV_CLIENT_SECRET, "--client-secret"
        )
    # The auth URL is asked for only where OAuth2 is tried: auto with a working API key
    # needs none.
    auth_url = args.auth_url if args.auth_url is not None else environ.get(ENV_AUTH_URL, "")
    if auth_url.strip():
        settings[ENV_AUTH_URL] = auth_url.strip()
    elif args.method == "oauth2":
        raise _UsageError(f"no --auth-url: pass --auth-url or set {ENV_AUTH_URL}")
    if not 1 <= args.first <= 100:
        raise _UsageError("--first must be between 1 and 100")
    if not 0 < args.timeout <= 600:
        raise _UsageError("--timeout must be more than 0 and at most 600 seconds")
    return settings


def _auto_note(ok: bool, failure: Exception | None) -> str:
    """What ``--method auto`` says of the method after trying OAuth2 (the API key refused)."""
    if ok:
        return _NOTE_RULE
    if isinstance(failure, TokenRequestError) and (
        failure.error == "invalid_client" or (failure.error is None and failure.status == 401)
    ):
        return _NOTE_WRONG
    if isinstance(failure, UnauthenticatedError):
        return _NOTE_ELSEWHERE
    return _NOTE_EITHER.format(", which could not be checked")


_TOKEN_EVENTS: Final = frozenset({"token_fetched", "token_request_failed"})


async def _query_step(
    report: _Report,
    name: str,
    transport: Any,
    args: argparse.Namespace,
    fetched: list[AuthEvent] | None = None,
) -> Exception | None:
    """Run the check query and record the steps; returns the error that ended it, if any."""
    started = time.perf_counter()
    query = gql(_CHECK_QUERY)
    query.variable_values = {"first": args.first}
    try:
        if args.stack in _SYNC_STACKS:
            result = await asyncio.to_thread(_execute_sync, transport, query)
        else:
            async with Client(transport=transport, execute_timeout=args.timeout) as session:
                result = await session.execute(query)
    except TokenRequestError as exc:
        # No token, so no query was sent: the token line tells the failure. The fetch's
        # thread reports the fetch's own duration just after the caller sees the error;
        # until it has, the time until the error stands in.
        elapsed = _ms_since(started)
        failed = next((e for e in fetched or () if e.name == "token_request_failed"), None)
        latency = round(failed.duration * 1000, 1) if failed and failed.duration else elapsed
        report.steps.append(_Step("token", False, latency, str(exc)))
        report.exit_code = _token_exit_code(exc)
        return exc
    except UnauthenticatedError as exc:
        _token_step(report, fetched)
        report.steps.append(_Step(name, False, _ms_since(started), str(exc)))
        report.exit_code = EXIT_REFUSED
        return exc
    except (TransportError, OSError, asyncio.TimeoutError) as exc:
        report.steps.append(_unreached_step(exc, name, transport, args.timeout, started, fetched))
        report.exit_code = EXIT_UNREACHABLE
        return exc
    elapsed = _ms_since(started)
    token_ms = _token_step(report, fetched)
    edges = result.get("carriers", {}).get("edges", [])
    report.carriers = [edge["node"] for edge in edges]
    count = len(report.carriers)
    report.steps.append(
        _Step(
            name, True, round(elapsed - token_ms, 1), f"{count} carrier{'' if count == 1 else 's'}"
        )
    )
    report.ok = True
    report.exit_code = EXIT_OK
    return None


def _execute_sync(transport: Any, query: Any) -> dict[str, Any]:
    """The check query on a sync stack, as a sync application runs it."""
    with Client(transport=transport) as session:
        result: dict[str, Any] = session.execute(query)
    return result


def _unreachable(exc: BaseException, transport: Any, timeout: float) -> str:
    """What an answer that is no GraphQL one, or no answer, says of the API's URL."""
    if isinstance(exc, ServiceHTTPError | ServiceUnreachableError | ServiceTimeoutError):
        return str(exc)  # the transports' own errors say it all, as the application sees it
    url = str(transport.url)
    if isinstance(exc, TransportServerError) and exc.code in (404, 405):
        return (
            f"nothing answers GraphQL at {url} (HTTP {exc.code}): wrong {ENV_BASE_URL}? It is "
            f"the API host; {GRAPHQL_PATH} is appended"
        )
    if isinstance(exc, TransportServerError) and exc.code is not None:
        return f"{url} answered HTTP {exc.code}, not GraphQL: {exc}"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return (
            f"no answer from {url} within {timeout:g} s: is {ENV_BASE_URL} right, and "
            "the service up?"
        )
    return f"cannot reach {url}: {type(exc).__name__}: {exc}"


def _unreached_step(
    exc: BaseException,
    name: str,
    transport: Any,
    timeout: float,
    started: float,
    fetched: list[AuthEvent] | None,
) -> _Step:
    """The failed step of a query that got no answer: its own, or the token's when
    ``--timeout`` ran out while the token was still being fetched (no query was sent)."""
    # Python 3.10: aiohttp's timeouts raise the builtin, asyncio's wait_for its own.
    timed_out = isinstance(exc, asyncio.TimeoutError | TimeoutError)
    if timed_out and fetched is not None and not any(e.name in _TOKEN_EVENTS for e in fetched):
        token_url = getattr(transport, "token_url", "the token URL")
        why = (
            f"no token from {token_url} within {timeout:g} s: is {ENV_AUTH_URL} "
            "right, and the authorization server up?"
        )
        return _Step("token", False, _ms_since(started), why)
    return _Step(name, False, _ms_since(started), _unreachable(exc, transport, timeout))


def _token_exit_code(exc: TokenRequestError) -> int:
    """1 when the authorization server refused the credentials, else 3.

    RFC 6749 section 5.2 refuses with 400 or 401 (403 from some servers). Anything else
    (a 404 or 405 from a wrong token_url, a redirect, 5xx, no answer) says nothing of the
    credentials.
    """
    if exc.status in (400, 401, 403) and not exc.retryable:
        return EXIT_REFUSED
    return EXIT_UNREACHABLE


def _token_step(report: _Report, fetched: list[AuthEvent] | None) -> float:
    event = next((e for e in fetched or () if e.name == "token_fetched"), None)
    if event is None:
        return 0.0
    duration = round((event.duration or 0.0) * 1000, 1)
    report.token_expires_in = event.expires_in
    if event.expires_in is None:
        lifetime = f"no expires_in given: {DEFAULT_EXPIRES_IN:g} s assumed"
    elif event.expires_in <= 0:
        lifetime = f"expires_in {event.expires_in:g} ignored: {DEFAULT_EXPIRES_IN:g} s assumed"
    else:
        lifetime = f"expires in {event.expires_in:g} s"
    report.steps.append(_Step("token", True, duration, lifetime))
    return duration


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


_LABELS = {"api_key": "API key", "oauth2": "OAuth2 query", "token": "OAuth2 token"}


def print_report(report: _Report, as_json: bool, out: TextIO) -> None:
    if as_json:
        document: dict[str, Any] = asdict(report)
        del document["exit_code"]
        for optional in ("access_token", "error"):
            if document[optional] is None:
                del document[optional]
        print(json.dumps(document, indent=2), file=out)
        return
    for step in report.steps:
        outcome = "ok" if step.ok else "FAILED"
        print(
            f"{_LABELS[step.name]:<13} {outcome:<6} {step.latency_ms:>8.1f} ms  {step.detail}",
            file=out,
        )
    # After the steps: what a refused API key means depends on what OAuth2 made of it.
    for note in report.notes:
        print(f"  note: {note}", file=out)
    if report.ok:
        print(f"\nmethod that works: {report.method}", file=out)
        for carrier in report.carriers:
            print(f"  {carrier['id']}  {carrier['name']}", file=out)
        if report.access_token is not None:
            print(f"\naccess token: {report.access_token}", file=out)
