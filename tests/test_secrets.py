"""No secret, token or Authorization value in logs, reprs, messages or tracebacks."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import urllib.parse
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import date
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import ClientResponseError
from gql import Client, GraphQLRequest, gql
from gql.transport.exceptions import (
    TransportConnectionFailed,
    TransportError,
    TransportProtocolError,
    TransportQueryError,
    TransportServerError,
)
from redis_server import RedisServer
from support import (
    ANSWER,
    CARRIER_RENAMED,
    CARRIERS,
    COUNT,
    KINDS,
    NO_WAIT,
    ONE_ATTEMPT,
    SLOW_MACHINE,
    STACK_REASONS,
    TICKS,
    build_transport,
    closed_port,
    exception_chain,
    exception_texts,
    query,
    run_python,
    running_proxy,
    secrets_shown,
    serving,
    shown,
    stack_and_method,
    sync_execute,
    unfolded,
    upload,
    with_store,
)
from ways import EVERY_WAY, Call, Way
from yarl import URL

from gql_service_auth import (
    ApiKeyRejectedError,
    ApiKeyTransport,
    AuthEvent,
    ConfigurationError,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
    UnauthenticatedError,
    UnauthenticatedHTTPError,
)
from gql_service_auth.cli import main
from gql_service_auth.emulator import ClientRecord, Emulator, ManualClock
from gql_service_auth.redis import RedisTokenStore

SECRET = "SENTINEL-secret-7f3a9c"
WRONG_SECRET = "SENTINEL-wrong-1b2e4d"
RECENT = ClientRecord("sentinel-recent", SECRET, date(2025, 2, 1))
LEGACY = ClientRecord("sentinel-legacy", SECRET, date(2023, 2, 1))
THREE_ATTEMPTS = RetryPolicy(attempts=3, wait_initial=0, wait_max=0, wait_jitter=0)

Scenario = Callable[[Emulator], Awaitable[None]]


@pytest.fixture
def sentinel_emulator() -> Iterator[Emulator]:
    """An emulator that knows only the sentinel clients."""
    with Emulator(clients=[RECENT, LEGACY]).run_in_thread() as running:
        yield running


def _oauth2(emulator: Emulator, secret: str = SECRET, **kwargs: object) -> OAuth2Transport:
    return OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        client_id=RECENT.client_id,
        client_secret=secret,
        retry=THREE_ATTEMPTS,
        **kwargs,  # type: ignore[arg-type]
    )


def _api_key(emulator: Emulator, client: ClientRecord = RECENT) -> ApiKeyTransport:
    return ApiKeyTransport(
        emulator.graphql_url, client_id=client.client_id, client_secret=client.client_secret
    )


async def _run(transport: ApiKeyTransport | OAuth2Transport, times: int = 1) -> None:
    async with Client(transport=transport, fetch_schema_from_transport=True) as session:
        for _ in range(times):
            await session.execute(COUNT)


async def api_key_ok(emulator: Emulator) -> None:
    await _run(_api_key(emulator), 2)


async def api_key_legacy(emulator: Emulator) -> None:
    await _run(_api_key(emulator, LEGACY))


async def api_key_bare_401(emulator: Emulator) -> None:
    emulator.unauthenticated_status, emulator.unauthenticated_body = 401, False
    await _run(_api_key(emulator, LEGACY))


async def oauth2_renewal(emulator: Emulator) -> None:
    transport = _oauth2(emulator)
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        await session.execute(COUNT)


async def oauth2_refused_forever(emulator: Emulator) -> None:
    emulator.refuse_all_tokens = True
    await _run(_oauth2(emulator, max_renewals=2))


async def oauth2_bare_401_forever(emulator: Emulator) -> None:
    emulator.refuse_all_tokens = True
    emulator.unauthenticated_status, emulator.unauthenticated_body = 401, False
    await _run(_oauth2(emulator))


async def invalid_client(emulator: Emulator) -> None:
    await _run(_oauth2(emulator, WRONG_SECRET))


async def invalid_client_basic(emulator: Emulator) -> None:
    await _run(_oauth2(emulator, WRONG_SECRET, token_auth_method="client_secret_basic"))


async def server_echoes_the_secret(emulator: Emulator) -> None:
    body = {"error": f"bad {SECRET}", "error_description": f"secret {SECRET} refused"}
    emulator.fail_token_requests(1, 401, body=body)
    await _run(_oauth2(emulator))


async def token_endpoint_down(emulator: Emulator) -> None:
    emulator.fail_token_requests(10, 503)
    await _run(_oauth2(emulator))


async def graphql_502(emulator: Emulator) -> None:
    emulator.fail_graphql_requests(5, 502, body=b"bad gateway")
    await _run(_oauth2(emulator))


async def upload_refused(emulator: Emulator) -> None:
    transport = _oauth2(emulator)
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        await session.execute(upload(b"data"), upload_files=True)


SCENARIOS: list[Scenario] = [
    api_key_ok,
    api_key_legacy,
    api_key_bare_401,
    oauth2_renewal,
    oauth2_refused_forever,
    oauth2_bare_401_forever,
    invalid_client,
    invalid_client_basic,
    server_echoes_the_secret,
    token_endpoint_down,
    graphql_502,
    upload_refused,
]


def _log_texts(records: list[logging.LogRecord]) -> list[str]:
    texts = []
    for record in records:
        texts += [record.getMessage(), repr(record.__dict__)]
        if record.exc_info and record.exc_info[1] is not None:
            texts += exception_texts(record.exc_info[1])
    return texts


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_no_secret_is_shown(
    sentinel_emulator: Emulator, caplog: pytest.LogCaptureFixture, scenario: Scenario
) -> None:
    """Logs at DEBUG, exception texts, reprs and tracebacks hold no credential."""
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    try:
        await scenario(sentinel_emulator)
    except Exception as exc:
        texts += exception_texts(exc)
    texts += _log_texts(caplog.records)

    sent = [r.headers.get("Authorization", "") for r in sentinel_emulator.requests]
    tokens = [value.split(" ", 1)[1] for value in sent if value.startswith("Bearer ")]
    forbidden = [SECRET, WRONG_SECRET, *tokens, *(value for value in sent if value)]
    assert caplog.records, "the scenario logged nothing: the scan would prove nothing"
    for text in texts:
        for value in forbidden:
            assert value not in text


# -- Credentials in the errors of failed requests (both transports) ------------------

# A status line aiohttp parses, then a header it refuses: a ClientResponseError.
MALFORMED = b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"


def _credentials(authorizations: Iterable[str]) -> list[str]:
    """Each ``Authorization`` value sent, and the credential after its scheme word."""
    return [part for value in authorizations for part in (value, value.partition(" ")[2]) if part]


def _echo_refusal(headers: Mapping[str, str]) -> bytes:
    """An UNAUTHENTICATED answer whose message quotes the request's Authorization header."""
    quoted = f"refused: {headers.get('authorization')}"
    error = {"message": quoted, "extensions": {"code": "UNAUTHENTICATED"}}
    body = json.dumps({"data": None, "errors": [error]}).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\nConnection: close\r\n\r\n" + body


@contextlib.asynccontextmanager
async def _loopback(
    answer: Callable[[Mapping[str, str]], bytes],
) -> AsyncIterator[tuple[str, list[str]]]:
    """A raw HTTP server on 127.0.0.1 answering ``answer(headers)`` (names lower-cased).

    Yields its base URL and the ``Authorization`` values it received.
    """
    received: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            fields = (line.partition(":") for line in lines[1:])
            headers = {name.strip().lower(): value.strip() for name, _, value in fields}
            await reader.readexactly(int(headers.get("content-length") or 0))
            if "authorization" in headers:
                received.append(headers["authorization"])
            writer.write(answer(headers))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", received
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["redirect"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_redirect_loop_error_shows_no_credential(emulator: Emulator, kind: str) -> None:
    """aiohttp's TooManyRedirects under gql's TransportConnectionFailed holds no credential."""
    emulator.fail_graphql_requests(20, 307, headers={"Location": emulator.graphql_url})
    with pytest.raises(TransportConnectionFailed) as info:
        async with Client(transport=build_transport(kind, emulator)) as session:
            await session.execute(COUNT)
    sent = [r.headers.get("Authorization", "") for r in emulator.requests if r.path == "/graphql"]
    secrets = [emulator.recent_client.client_secret, *_credentials(sent)]
    assert shown(info.value, secrets) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_malformed_graphql_answer_error_shows_no_credential(
    emulator: Emulator, kind: str
) -> None:
    """gql's error for it holds no credential: aiohttp's ClientResponseError (httpx's
    error) under TransportConnectionFailed; on requests, a TransportProtocolError."""
    on_requests = stack_and_method(kind)[0].name == "requests"
    expected = TransportProtocolError if on_requests else TransportConnectionFailed
    async with _loopback(lambda _: MALFORMED) as (url, received):
        with pytest.raises(expected) as info:
            async with Client(
                transport=build_transport(kind, emulator, url + "/graphql")
            ) as session:
                await session.execute(COUNT)
    secrets = [emulator.recent_client.client_secret, *_credentials(received)]
    assert shown(info.value, secrets) == []


@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_malformed_token_answer_error_shows_no_basic_credentials(
    emulator: Emulator,
) -> None:
    """With client_secret_basic, a malformed token answer raises TokenRequestError, no secret."""
    async with _loopback(lambda _: MALFORMED) as (url, received):
        basic = {"token_url": url + "/oauth2/token", "token_auth_method": "client_secret_basic"}
        with pytest.raises(TokenRequestError) as info:
            async with Client(transport=build_transport("oauth2", emulator, **basic)) as session:
                await session.execute(COUNT)
    secrets = [emulator.recent_client.client_secret, *_credentials(received)]
    assert shown(info.value, secrets) == []


@pytest.mark.parametrize(
    ("kind", "error"), [("api_key", ApiKeyRejectedError), ("oauth2", UnauthenticatedError)]
)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_credential_echoed_by_the_api_is_scrubbed_from_our_error(
    emulator: Emulator, caplog: pytest.LogCaptureFixture, kind: str, error: type[Exception]
) -> None:
    """A refusal quoting the API key or token raises our error, whose errors hold neither."""
    async with _loopback(_echo_refusal) as (url, received):
        with pytest.raises(error) as info:
            async with Client(
                transport=build_transport(kind, emulator, url + "/graphql")
            ) as session:
                await session.execute(COUNT)
    secrets = [emulator.recent_client.client_secret, *_credentials(received)]
    assert shown(info.value, secrets) == []


@pytest.mark.parametrize("status", [200, 502])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_credential_echoed_in_a_body_that_is_not_graphql_is_scrubbed(
    emulator: Emulator, kind: str, status: int
) -> None:
    """A proxy page quoting the Authorization header reaches no message or attribute."""
    transport = build_transport(kind, emulator)
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        sent = [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"]
        page = f"<pre>Request headers:\nAuthorization: {sent[-1]}\n</pre>".encode()
        emulator.fail_graphql_requests(1, status, body=page)
        with pytest.raises(TransportError) as info:
            await session.execute(COUNT)
    secrets = [emulator.recent_client.client_secret, *_credentials(sent)]
    assert shown(info.value, secrets) == []


@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_basic_header_echoed_by_the_token_endpoint_is_scrubbed(emulator: Emulator) -> None:
    """The token endpoint quoting the Basic header it got: TokenRequestError without it."""
    client = emulator.recent_client
    raw = f"{client.client_id}:{client.client_secret}".encode()
    basic = base64.b64encode(raw).decode()
    description = f"malformed header: Authorization: Basic {basic}"
    emulator.fail_token_requests(
        1, 400, body={"error": "invalid_request", "error_description": description}
    )
    transport = build_transport("oauth2", emulator, token_auth_method="client_secret_basic")
    with pytest.raises(TokenRequestError) as info:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
    assert shown(info.value, [basic, client.client_secret]) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_credential_echoed_in_a_response_header_or_undecodable_body_is_scrubbed(
    emulator: Emulator, kind: str
) -> None:
    """A 502 quoting the credential in a header, and a page that is not UTF-8: scrubbed."""
    transport = build_transport(kind, emulator)
    caught: list[BaseException] = []
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        sent = [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"]
        echo = {"X-Debug-Authorization": sent[-1]}
        emulator.fail_graphql_requests(1, 502, body=b"bad gateway", headers=echo)
        emulator.fail_graphql_requests(1, 200, body=b"\xff\xfe" + sent[-1].encode())
        for _ in range(2):
            with pytest.raises(TransportError) as info:
                await session.execute(COUNT)
            caught.append(info.value)
    secrets = [emulator.recent_client.client_secret, *_credentials(sent)]
    assert [shown(exc, secrets) for exc in caught] == [[], []]


@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_credential_echoed_in_a_malformed_token_answer_is_scrubbed(
    emulator: Emulator,
) -> None:
    """A token endpoint quoting the Basic header in a header aiohttp cannot parse."""

    def quote_it(headers: Mapping[str, str]) -> bytes:
        return f"HTTP/1.1 200 OK\r\nContent-Length: {headers['authorization']}\r\n\r\n".encode()

    async with _loopback(quote_it) as (url, received):
        basic = {"token_url": url + "/oauth2/token", "token_auth_method": "client_secret_basic"}
        with pytest.raises(TokenRequestError) as info:
            async with Client(transport=build_transport("oauth2", emulator, **basic)) as session:
                await session.execute(COUNT)
    secrets = [emulator.recent_client.client_secret, *_credentials(received)]
    assert shown(info.value, secrets) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
def test_a_timed_out_call_leaves_no_credential_in_its_chain(emulator: Emulator, kind: str) -> None:
    """gql's execute_timeout cancels the request: its chain's frames hold no credential."""
    emulator.graphql_latency = 0.5
    transport = build_transport(kind, emulator)
    if kind == "oauth2":
        assert sync_execute(transport, 5) == ANSWER  # a token first, so the send times out
    outcome = sync_execute(transport, 0.2)
    assert isinstance(outcome, TimeoutError)
    sent = [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"]
    assert shown(outcome, [emulator.recent_client.client_secret, *_credentials(sent)]) == []


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["sub"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_failed_subscription_leaves_no_credential_in_its_chain(
    emulator: Emulator, kind: str
) -> None:
    """A subscription answered with a 500: gql's error, no credential in the chain."""
    emulator.fail_graphql_requests(1, 500, body=b"")
    async with Client(transport=build_transport(kind, emulator)) as session:
        with pytest.raises(TransportServerError) as info:
            async for _ in session.subscribe(gql("subscription { ticks }")):
                pass  # pragma: no cover
    sent = [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"]
    secrets = [emulator.recent_client.client_secret, *_credentials(sent)]
    assert shown(info.value, secrets) == []


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["sub"])
@pytest.mark.parametrize("status", [401, 502])
async def test_subscription_server_errors_are_scrubbed(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    make_api_key: Callable[..., ApiKeyTransport],
    status: int,
) -> None:
    """A bare error status on a subscription is gql's TransportServerError, headers blanked."""
    for transport in (make_oauth2(), make_api_key()):
        async with Client(transport=transport) as session:
            emulator.fail_graphql_requests(1, status, body=b"")
            with pytest.raises(TransportServerError) as caught:
                async for _ in session.subscribe(TICKS):
                    pass  # pragma: no cover
        # A 401 is our error, whose cause is gql's: aiohttp's record is further down the chain.
        (record,) = [
            e for e in exception_chain(caught.value) if isinstance(e, ClientResponseError)
        ]
        assert record.request_info.headers["Authorization"] == "***"


async def test_connection_failure_keeps_no_token_in_frame_locals(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A GraphQL request that fails to connect: no token in any traceback frame's locals."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
    assert transport.token is not None
    value = transport.token.value
    transport.url = "http://127.0.0.1:9/graphql"  # nothing listens
    async with Client(transport=transport) as session:
        with pytest.raises(TransportConnectionFailed) as raised:
            await session.execute(COUNT)
    assert secrets_shown(raised.value, [value], own=__file__) == []


@pytest.mark.stacks("aiohttp", "httpx", reason=STACK_REASONS["cancel"])
async def test_cancellation_keeps_no_token_in_frame_locals(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A call cancelled in flight: no token in any traceback frame's locals."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        assert transport.token is not None
        value = transport.token.value
        emulator.graphql_latency = 1.0 if hasattr(emulator, "graphql_latency") else 0
        task = asyncio.ensure_future(session.execute(COUNT))
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except BaseException as exc:
            caught: BaseException | None = exc
        else:
            caught = None
    if caught is not None:
        assert secrets_shown(caught, [value], own=__file__) == []


@pytest.fixture
def other_host() -> Iterator[Emulator]:
    """A second emulator on 127.0.0.2: another origin, still this machine."""
    with Emulator(host="127.0.0.2").run_in_thread() as running:
        yield running


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["redirect"])
@pytest.mark.parametrize("kind", ["oauth2", "api_key"])
async def test_credentials_do_not_follow_a_redirect_to_another_host(
    emulator: Emulator,
    other_host: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    make_api_key: Callable[..., ApiKeyTransport],
    kind: str,
) -> None:
    """A GraphQL redirect to another origin arrives there without the Authorization header."""
    transport = make_oauth2(max_renewals=0) if kind == "oauth2" else make_api_key()
    location = {"Location": other_host.graphql_url}
    async with Client(transport=transport) as session:
        if kind == "oauth2":
            await session.execute(COUNT)  # fetch the token first, so only the query redirects
        emulator.fail_graphql_requests(1, 307, body=b"", headers=location)
        # The other host sees no credentials and refuses: the caller gets a typed error.
        with pytest.raises(UnauthenticatedError):
            await session.execute(COUNT)
    (redirected,) = other_host.requests
    assert "Authorization" not in redirected.headers


# -- A service quoting the credentials in an error that is not a refusal -------------


def _forbidden(text: str) -> dict[str, object]:
    return {
        "data": None,
        "errors": [{"message": f"not allowed for {text}", "extensions": {"code": "FORBIDDEN"}}],
    }


@pytest.mark.parametrize("as_json", [False, True])
def test_cli_never_prints_a_key_quoted_in_another_error(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """An error other than UNAUTHENTICATED that quotes the key: exit 3, no secret shown."""
    client = emulator.recent_client
    emulator.fail_graphql_requests(
        1, body=_forbidden(f"SERVICE-API-KEY {client.client_id}:{client.client_secret}")
    )
    code = main(
        ["check", "--method", "api-key", *(["--json"] if as_json else [])],
        environ=emulator.environ(),
    )
    out, err = capsys.readouterr()
    assert code == 3
    assert "FORBIDDEN" in out
    assert client.client_secret not in out + err
    if as_json:
        assert json.loads(out)["ok"] is False


async def test_api_key_error_quoting_the_key_is_scrubbed(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """gql raises TransportQueryError from the answer: its message, errors and data are clean."""
    client = emulator.recent_client
    emulator.fail_graphql_requests(
        1, body=_forbidden(f"SERVICE-API-KEY {client.client_id}:{client.client_secret}")
    )
    async with Client(transport=make_api_key()) as session:
        with pytest.raises(TransportQueryError) as caught:
            await session.execute(CARRIERS)
    assert "***" in str(caught.value)  # the scanner in conftest.py checks every text of it


async def test_oauth2_error_quoting_the_token_is_scrubbed(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The same for a Bearer token quoted back, to a request and to a batch."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(CARRIERS)
        assert transport.token is not None
        token = transport.token.value
        emulator.fail_graphql_requests(1, body=_forbidden(f"Bearer {token}"))
        with pytest.raises(TransportQueryError) as caught:
            await session.execute(CARRIERS)
        assert token not in str(caught.value)
        assert "***" in str(caught.value)
        # A batch goes the way of re-sendable requests (_send_with_renewal).
        emulator.fail_graphql_requests(1, body=[_forbidden(f"Bearer {token}")])
        with pytest.raises(TransportQueryError) as caught:
            await session.execute_batch([GraphQLRequest(CARRIERS)])
        assert token not in repr(vars(caught.value))
        assert "***" in str(caught.value)


# -- Proxy credentials, and credentials in URLs and settings -------------------------


# Matches the autouse leak scanner of conftest.py wherever it shows.
PROXY_PASSWORD = "emu-secret-Pr0xyPassw0rdForTheReview"

CLIENT_SECRET = "emu-secret-TheClientSecretOfTheReview"


def _proxy_secrets(user: str, password: str) -> list[str]:
    return [password, base64.b64encode(f"{user}:{password}".encode()).decode()]


@contextlib.asynccontextmanager
async def _echoing_proxy(
    answer: Callable[[str, Mapping[str, str]], bytes],
) -> AsyncIterator[str]:
    """A raw "proxy" on 127.0.0.1 answering ``answer(request_line, headers)``; yields its URL.

    Plain-http requests through a proxy reach it whole, ``Proxy-Authorization`` included:
    what a misbehaving proxy, or a debugging page behind it, may quote back.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            fields = (line.partition(":") for line in lines[1:] if line)
            headers = {name.strip().lower(): value.strip() for name, _, value in fields}
            await reader.readexactly(int(headers.get("content-length") or 0))
            writer.write(answer(lines[0], headers))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def _echo(field: str) -> Callable[[str, Mapping[str, str]], bytes]:
    """An answer quoting the request's Proxy-Authorization in ``field`` of an RFC 6749 error."""

    def answer(request_line: str, headers: Mapping[str, str]) -> bytes:
        quoted = f"refused {headers.get('proxy-authorization')} for {request_line}"
        status, extra = "407 Proxy Authentication Required", ""
        document = {"error": "access_denied", "error_description": "denied"}
        if field == "Location":
            status, extra = "307 Temporary Redirect", f"Location: http://127.0.0.1/{quoted}\r\n"
        elif field == "token_type":
            status = "200 OK"
            document = {"access_token": "emu-token-abc", "token_type": quoted}
        else:
            document[field] = quoted
        body = json.dumps(document).encode()
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode("latin-1") + body

    return answer


@pytest.mark.parametrize(
    "field", ["error_description", "error", "error_uri", "Location", "token_type"]
)
async def test_proxy_credentials_echoed_back_never_reach_the_error(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], field: str
) -> None:
    """An answer quoting Proxy-Authorization: the error shows neither password nor Basic."""
    async with _echoing_proxy(_echo(field)) as proxy:
        login = URL(proxy).with_user("tester").with_password(PROXY_PASSWORD)
        transport = make_oauth2(token_proxy=login, retry=ONE_ATTEMPT)
        with pytest.raises(TokenRequestError) as caught:
            async with Client(transport=transport) as session:
                await session.execute(COUNT)
    assert shown(caught.value, _proxy_secrets("tester", PROXY_PASSWORD)) == []


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["kw"])
async def test_credentials_of_the_environments_proxy_echoed_back_never_reach_the_error(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same with trust_env, the proxy and its credentials in HTTP_PROXY."""
    async with _echoing_proxy(_echo("error_description")) as proxy:
        login = URL(proxy).with_user("tester").with_password(PROXY_PASSWORD)
        monkeypatch.setenv("http_proxy", str(login))
        transport = make_oauth2(client_session_args={"trust_env": True}, retry=ONE_ATTEMPT)
        with pytest.raises(TokenRequestError) as caught:
            async with Client(transport=transport) as session:
                await session.execute(COUNT)
    assert caught.value.status == 407
    assert shown(caught.value, _proxy_secrets("tester", PROXY_PASSWORD)) == []


# aiohttp sends proxy credentials as latin-1: a password beyond it fails in
# UnicodeEncodeError, whose args hold the whole "user:password" it could not encode.
NOT_LATIN_1 = PROXY_PASSWORD + "\u20ac"


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["kw"])
@pytest.mark.parametrize("how", ["token_proxy", "proxy_auth", "client_session_args"])
def test_proxy_credentials_aiohttp_cannot_send_are_refused_without_showing_them(
    make_oauth2: Callable[..., OAuth2Transport], how: str
) -> None:
    """Refused when the transport is built, by a message that names the argument only."""
    proxy = "http://127.0.0.1:3128"
    kwargs: dict[str, Any] = {
        "token_proxy": {"token_proxy": f"http://tester:{NOT_LATIN_1}@127.0.0.1:3128"},
        "proxy_auth": {
            "token_session_args": {"proxy": proxy, "proxy_auth": _basic_auth(NOT_LATIN_1)}
        },
        "client_session_args": {
            "client_session_args": {"proxy": f"http://tester:{NOT_LATIN_1}@127.0.0.1:3128"}
        },
    }[how]
    with pytest.raises(ConfigurationError, match="latin-1") as caught:
        make_oauth2(**kwargs)
    assert shown(caught.value, [PROXY_PASSWORD]) == []


def _basic_auth(password: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # BasicAuth, from aiohttp 3.14
        return aiohttp.BasicAuth("tester", password)


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["kw"])
async def test_an_environment_proxy_password_aiohttp_cannot_send_is_not_shown(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY is read at fetch time: the failure there shows no password either."""
    monkeypatch.setenv("http_proxy", f"http://tester:{NOT_LATIN_1}@127.0.0.1:9")
    transport = make_oauth2(client_session_args={"trust_env": True}, retry=ONE_ATTEMPT)
    with pytest.raises(TokenRequestError) as caught:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
    assert shown(caught.value, [PROXY_PASSWORD]) == []
    assert emulator.counters.token_requests == 0


async def test_a_graphql_proxy_password_aiohttp_cannot_send_is_not_shown(
    emulator: Emulator,
) -> None:
    """The GraphQL session's own proxy (client_session_args), with the API key."""
    transport = ApiKeyTransport(
        emulator.graphql_url,
        client_id=emulator.recent_client.client_id,
        client_secret=emulator.recent_client.client_secret,
        client_session_args={"proxy": f"http://tester:{NOT_LATIN_1}@127.0.0.1:9"},
    )
    with pytest.raises(TransportError) as caught:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
    assert shown(caught.value, [PROXY_PASSWORD]) == []


@pytest.mark.parametrize("how", ["url", "proxy_auth"])
@pytest.mark.parametrize("failure", ["407", "407 to CONNECT", "unreachable"])
async def test_a_failing_proxy_shows_its_password_nowhere_in_the_chain_or_its_frames(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    tmp_path: Path,
    how: str,
    failure: str,
) -> None:
    """proxy.py asking for other credentials, or no proxy listening at all."""
    wrong = "emu-secret-WrongProxyPasswordGiven"
    with contextlib.ExitStack() as stack:
        if failure == "unreachable":
            proxy = f"http://127.0.0.1:{stack.enter_context(closed_port())}"
        else:
            running = stack.enter_context(
                running_proxy(tmp_path / "proxy", "--basic-auth", f"tester:{PROXY_PASSWORD}")
            )
            proxy = running.url
        token_url = "https://127.0.0.1:9/oauth2/token" if failure == "407 to CONNECT" else None
        extra: dict[str, Any] = {"token_url": token_url} if token_url else {}
        if how == "url":
            extra["token_proxy"] = URL(proxy).with_user("tester").with_password(wrong)
        else:
            extra["token_session_args"] = {"proxy": proxy, "proxy_auth": _basic_auth(wrong)}
        transport = make_oauth2(retry=ONE_ATTEMPT, **extra)
        with pytest.raises(TokenRequestError) as caught:
            async with Client(transport=transport) as session:
                await session.execute(COUNT)
    assert shown(caught.value, _proxy_secrets("tester", wrong)) == []
    assert emulator.counters.token_requests == 0


@pytest.mark.parametrize("field", ["url", "token_url"])
@pytest.mark.parametrize("userinfo", [f"u:{PROXY_PASSWORD}", f":{PROXY_PASSWORD}"])
def test_a_yarl_url_with_credentials_is_refused_without_showing_them(
    field: str, userinfo: str
) -> None:
    """A password in a yarl.URL shows nowhere: not in the message, not in frame locals."""
    urls = {"url": "http://127.0.0.1/graphql", "token_url": "http://127.0.0.1/oauth2/token"}
    urls[field] = urls[field].replace("//", f"//{userinfo}@")
    with pytest.raises(ConfigurationError, match="must not carry credentials") as caught:
        OAuth2Transport(
            URL(urls["url"]),
            token_url=URL(urls["token_url"]),
            client_id="review-client",
            client_secret=CLIENT_SECRET,
        )
    assert shown(caught.value, [PROXY_PASSWORD, CLIENT_SECRET]) == []


_BAD_SETTINGS: dict[str, dict[str, Any]] = {
    "remote proxy for http": {"token_proxy": f"http://u:{PROXY_PASSWORD}@192.0.2.1:3128"},
    "refused key": {
        "token_session_args": {"proxy": f"http://u:{PROXY_PASSWORD}@127.0.0.1:1", "headers": {}}
    },
    "graphql proxy, remote": {
        "client_session_args": {"proxy": f"http://u:{PROXY_PASSWORD}@192.0.2.1:3128"}
    },
    "bad max_renewals": {
        "token_proxy": f"http://u:{PROXY_PASSWORD}@127.0.0.1:1",
        "max_renewals": -1,
    },
    "bad url": {"url": "ftp://127.0.0.1/graphql", "token_proxy": f"http://u:{PROXY_PASSWORD}@h:1"},
    "auth given": {"auth": object(), "token_proxy": f"http://u:{PROXY_PASSWORD}@127.0.0.1:1"},
}


@pytest.mark.parametrize("case", sorted(_BAD_SETTINGS))
def test_a_refused_oauth2_constructor_leaves_no_credential_in_its_frames(case: str) -> None:
    """Crash reporters read every frame's locals: the library's hold no secret afterwards."""
    settings = dict(_BAD_SETTINGS[case])
    url = settings.pop("url", "http://127.0.0.1:1/graphql")
    with pytest.raises(ConfigurationError) as caught:
        OAuth2Transport(
            url,
            token_url="http://127.0.0.1:1/oauth2/token",
            client_id="review-client",
            client_secret=CLIENT_SECRET,
            **settings,
        )
    assert shown(caught.value, [CLIENT_SECRET, PROXY_PASSWORD]) == []


def test_a_refused_api_key_constructor_leaves_no_credential_in_its_frames() -> None:
    """The same for ApiKeyTransport refusing its URL."""
    with pytest.raises(ConfigurationError) as caught:
        ApiKeyTransport(
            "ftp://127.0.0.1/graphql", client_id="review-client", client_secret=CLIENT_SECRET
        )
    assert shown(caught.value, [CLIENT_SECRET]) == []


@pytest.mark.parametrize("cls", [ApiKeyTransport, OAuth2Transport])
def test_from_env_refused_leaves_neither_the_secret_nor_the_environment_in_its_frames(
    cls: type[ApiKeyTransport] | type[OAuth2Transport],
) -> None:
    """A missing variable: from_env's frames held the whole environment, secret included."""
    environ = {"SERVICE_CLIENT_SECRET": CLIENT_SECRET, "SERVICE_CLIENT_ID": "review-client"}
    with pytest.raises(ConfigurationError, match="SERVICE_BASE_URL") as caught:
        cls.from_env(environ)
    assert shown(caught.value, [CLIENT_SECRET]) == []


def _raising_trace() -> Any:
    """A TraceConfig whose request-start callback fails, as a metrics client that is down."""

    async def on_request_start(*_: object) -> None:
        raise RuntimeError("metrics backend down")

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request_start)
    return trace


@pytest.mark.parametrize("method", ["client_secret_post", "client_secret_basic"])
async def test_a_failing_trace_callback_of_the_token_session_leaves_no_secret_in_frames(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], method: str
) -> None:
    """aiohttp's frames between our fetch and the callback held the form and headers."""
    transport = make_oauth2(
        token_session_args={"trace_configs": [_raising_trace()]},
        token_auth_method=method,
        retry=ONE_ATTEMPT,
    )
    with pytest.raises(TokenRequestError) as caught:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
    client = emulator.recent_client
    basic = base64.b64encode(f"{client.client_id}:{client.client_secret}".encode()).decode()
    assert shown(caught.value, [client.client_secret, basic]) == []


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["kw"])
@pytest.mark.parametrize("kind", ["api_key", "oauth2"])
async def test_a_failing_trace_callback_of_the_graphql_session_leaves_no_credential_in_frames(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    make_oauth2: Callable[..., OAuth2Transport],
    kind: str,
) -> None:
    """The same through gql's TransportConnectionFailed, for the GraphQL request's headers."""
    args = {"client_session_args": {"trace_configs": [_raising_trace()]}}
    transport = make_api_key(**args) if kind == "api_key" else make_oauth2(**args)
    async with Client(transport=transport) as session:
        with pytest.raises(TransportError) as caught:
            await session.execute(COUNT)
        token = transport.token.value if isinstance(transport, OAuth2Transport) else ""
    assert shown(caught.value, [emulator.recent_client.client_secret, token]) == []


# -- The token store: a Redis URL password, the store_key -----------------------------

REDIS_PASSWORD = "hunter2-redis-password-8c1f"

STORE_KEY = "store-key-material-5a7e-0011"


@pytest.mark.parametrize(
    "url_of",
    [
        lambda port: f"redis://user:{REDIS_PASSWORD}@127.0.0.1:{port}/0",  # ACL refuses
        lambda port: f"redis://user:{REDIS_PASSWORD}@127.0.0.1:{port}/notadb",
    ],
    ids=["wrong-password", "bad-db"],
)
async def test_no_secret_in_the_error_when_redis_and_the_token_endpoint_fail(
    live_emulator: Emulator,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    url_of: Any,
) -> None:
    """Redis and the token endpoint both fail: no Redis password, store_key or secret shown."""
    live_emulator.fail_token_requests(1, 401, body={"error": "invalid_client"})
    events: list[AuthEvent] = []
    client = live_emulator.recent_client
    with RedisTokenStore.from_url(
        url_of(redis_server.port), store_key=STORE_KEY, timeout=SLOW_MACHINE
    ) as store:
        transport = with_store(live_emulator, store, events)
        with pytest.raises(TokenRequestError) as info:
            await query(transport)
        # As a debugger shows them: the transport unfolded, its token cache and shared
        # level among what it holds, and the store.
        texts = repr(store) + repr(vars(store)) + unfolded(transport)
    exc = info.value
    secrets = [REDIS_PASSWORD, STORE_KEY, client.client_secret]
    where = shown(exc, secrets)
    chain = []
    link: BaseException | None = exc
    while link is not None:
        chain.append(f"{type(link).__name__}: {link}")
        link = link.__cause__ or link.__context__
    print([(e.name, e.error) for e in events])
    print("chain:", chain)
    print("shown at:", where)
    logs = "".join(r.getMessage() + repr(r.__dict__) for r in caplog.records)
    assert not any(s in logs for s in secrets)
    assert not any(s in texts for s in secrets)
    assert where == []


class _SlowExitResponse(aiohttp.ClientResponse):
    """A response class whose exit waits (a metrics hook, say): a timeout may land there,
    after the answer was read."""

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.sleep(0.5)
        await super().__aexit__(*exc)


def _sent(emulator: Emulator) -> list[str]:
    """Each credential sent so far, for the scans: whole headers and what follows the scheme."""
    return _credentials(r.headers.get("Authorization", "") for r in emulator.requests)


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["kw"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("code", ["FORBIDDEN", "UNAUTHENTICATED"])
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_timeout_after_an_answer_quoting_the_credential_shows_it_nowhere(
    emulator: Emulator, kind: str, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    """execute_timeout fires after an answer quoting the credential was read: no frame of
    the TimeoutError's chain shows the credential."""
    slow = {"response_class": _SlowExitResponse}
    transport = build_transport(kind, emulator, client_session_args=slow)
    async with Client(transport=transport, execute_timeout=5) as session:
        await session.execute(COUNT)  # the credential, sent once (a token for OAuth2)
        quoted = {"message": "quoted: " + _sent(emulator)[-2], "extensions": {"code": code}}
        emulator.fail_graphql_requests(1, 200, body={"data": None, "errors": [quoted]})
        session.client.execute_timeout = 0.25
        with pytest.raises(TimeoutError) as info:
            await session.execute(COUNT)
    assert shown(info.value, [emulator.recent_client.client_secret, *_sent(emulator)]) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_redirect_echoing_the_credential_in_its_headers_is_scrubbed(
    emulator: Emulator, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 307 to the same endpoint whose headers quote the credential, then a 500: the
    error's record of the redirect's response shows no credential."""
    async with Client(transport=build_transport(kind, emulator)) as session:
        await session.execute(COUNT)
        echo = {"X-Echo": _sent(emulator)[-2]}
        emulator.fail_graphql_requests(
            1, 307, body=b"", headers={"Location": emulator.graphql_url, **echo}
        )
        emulator.fail_graphql_requests(1, 500, body=b"oops", headers=echo)
        with pytest.raises(TransportServerError) as info:
            await session.execute(COUNT)
    assert shown(info.value, [emulator.recent_client.client_secret, *_sent(emulator)]) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["proxy-password", "cookie"])
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_secret_the_caller_passes_per_request_stays_out_of_our_frames(
    emulator: Emulator, kind: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxy password or a cookie given in extra_args, and a request that fails: no frame
    of ours shows them (gql's own Client frames hold the caller's arguments)."""
    password = "per-request-proxy-password"
    async with Client(transport=build_transport(kind, emulator)) as session:
        await session.execute(COUNT)
        with closed_port() as port:
            if how == "proxy-password":
                extra: dict[str, Any] = {"proxy": f"http://tester:{password}@127.0.0.1:{port}"}
            else:
                extra = {"headers": {"Cookie": f"sid={password}"}}
                emulator.fail_graphql_requests(1, 500, body=b"oops")
            with pytest.raises(TransportError) as info:
                await session.execute(COUNT, extra_args=extra)
    where = shown(info.value, [password, *_sent(emulator)])
    assert [w for w in where if "gql/client.py" not in w] == []


# -- The responses an HTTP error keeps, on every stack --------------------------------


@pytest.fixture(params=EVERY_WAY, ids=lambda way: way.name)
def way(request: pytest.FixtureRequest) -> Way:
    """Each stack in turn: aiohttp, requests, httpx (sync, asyncio and trio)."""
    return request.param  # type: ignore[no-any-return]


def _transport(
    way: Way, method: str, emulator: Emulator, clock: ManualClock, **kwargs: Any
) -> Any:
    """``way``'s transport for ``method`` ("api_key" or "oauth2"), for the recent client;
    an OAuth2 one ends at the first refusal."""
    client = emulator.recent_client
    kwargs |= {"client_id": client.client_id, "client_secret": client.client_secret}
    if method == "api_key":
        return way.api_key(emulator.graphql_url, **kwargs)
    kwargs |= {"token_url": emulator.token_url, "retry": NO_WAIT, "clock": clock}
    return way.oauth2(emulator.graphql_url, max_renewals=0, **kwargs)


def _failed_call(way: Way, transport: Any) -> BaseException:
    """The error of a call to ``transport`` that fails as the emulator was told."""
    (outcome,) = way.run(transport, [Call(COUNT)])
    assert isinstance(outcome, TransportServerError), outcome
    return outcome


@pytest.mark.parametrize("status", [401, 500, 502])
@pytest.mark.parametrize("method", ["api_key", "oauth2"])
@pytest.mark.usefixtures("no_resource_left_open")
def test_an_http_error_quoting_the_credential_keeps_it_nowhere_in_its_chain(
    emulator: Emulator, clock: ManualClock, way: Way, method: str, status: int
) -> None:
    """A page quoting the Authorization header in its body and a header: neither the
    error nor the response its chain keeps (requests', httpx's) shows it."""
    transport = _transport(way, method, emulator, clock)
    way.one(transport, Call(COUNT))  # the credential, sent once (a token for OAuth2)
    quoted = _sent(emulator)[-2]
    page = f"<pre>Request headers:\nAuthorization: {quoted}\n</pre>".encode()
    emulator.fail_graphql_requests(1, status, body=page, headers={"X-Debug-Authorization": quoted})
    error = _failed_call(way, transport)
    # A 401: ApiKeyRejectedHTTPError or UnauthenticatedHTTPError, gql's error its cause.
    assert isinstance(error, UnauthenticatedHTTPError) == (status == 401)
    assert shown(error, [emulator.recent_client.client_secret, *_sent(emulator)]) == []


@pytest.mark.parametrize("method", ["api_key", "oauth2"])
@pytest.mark.usefixtures("no_resource_left_open")
def test_a_credential_quoted_in_a_response_header_only_shows_nowhere_in_the_chain(
    emulator: Emulator, clock: ManualClock, way: Way, method: str
) -> None:
    """A 502 whose body is clean and one header quotes the credential: scrubbed too."""
    transport = _transport(way, method, emulator, clock)
    way.one(transport, Call(COUNT))
    echo = {"X-Echo": _sent(emulator)[-2]}
    emulator.fail_graphql_requests(1, 502, body=b"bad gateway", headers=echo)
    error = _failed_call(way, transport)
    assert shown(error, [emulator.recent_client.client_secret, *_sent(emulator)]) == []


@pytest.mark.usefixtures("no_resource_left_open")
def test_a_secret_quoted_back_escaped_or_encoded_shows_nowhere_in_the_chain(
    emulator: Emulator, clock: ManualClock, way: Way
) -> None:
    """A page quoting the key JSON-escaped (PHP's \\/, Go's \\u003c) and percent-encoded:
    each spelling is scrubbed, in the body and in a header."""
    secret = "s3cr3t/KEY+9x=Q7w<&>"
    client = ClientRecord("escaped-client", secret, date(2025, 2, 1))
    emulator.clients[client.client_id] = client
    transport = way.api_key(emulator.graphql_url, client_id=client.client_id, client_secret=secret)
    php = json.dumps(secret)[1:-1].replace("/", "\\/")
    go = json.dumps(secret)[1:-1].replace("<", "\\u003c").replace(">", "\\u003e")
    go = go.replace("&", "\\u0026")
    encoded = urllib.parse.quote(secret, safe="")
    page = json.dumps({"php": php, "go": go}).encode() + f" {encoded}".encode()
    emulator.fail_graphql_requests(1, 502, body=page, headers={"X-Echo": encoded})
    error = _failed_call(way, transport)
    assert shown(error, [secret, php, go, encoded]) == []


@pytest.mark.parametrize("method", ["api_key", "oauth2"])
@pytest.mark.usefixtures("no_resource_left_open")
def test_a_redirect_body_quoting_the_credential_shows_nowhere_in_the_chain(
    emulator: Emulator, clock: ManualClock, way: Way, method: str
) -> None:
    """A 307 whose body quotes the credential, then a 502: that body, which requests and
    httpx read and aiohttp leaves unread in its stream, shows nowhere in the chain."""
    follow = {"follow_redirects": True} if way.name.startswith("httpx") else {}
    transport = _transport(way, method, emulator, clock, **follow)
    way.one(transport, Call(COUNT))
    page = f"moved; you sent {_sent(emulator)[-2]}".encode()
    emulator.fail_graphql_requests(1, 307, body=page, headers={"Location": emulator.graphql_url})
    emulator.fail_graphql_requests(1, 502, body=b"bad gateway")
    error = _failed_call(way, transport)
    assert shown(error, [emulator.recent_client.client_secret, *_sent(emulator)]) == []


FRESH_CONSTRUCTORS = """
import sys
from gql_service_auth import ConfigurationError
from gql_service_auth.httpx import OAuth2Auth, OAuth2HTTPXTransport
from gql_service_auth.requests import OAuth2RequestsTransport

PASSWORD = "fresh-proxy-pw-5f1d9"
proxy = f"http://user:{PASSWORD}@[::1"
token_url, url = "https://auth.example.com/oauth2/token", "https://api.example.com/graphql"
builds = {
    "requests": lambda: OAuth2RequestsTransport(url, token_url=token_url, client_id="i",
                                                client_secret="s", token_proxy=proxy),
    "httpx": lambda: OAuth2HTTPXTransport(url, token_url=token_url, client_id="i",
                                          client_secret="s", token_proxy=proxy),
    "httpx auth": lambda: OAuth2Auth(token_url, "i", "s", url=url, token_proxy=proxy),
}
found = []
for name, build in builds.items():
    try:
        build()
    except ConfigurationError as exc:
        link, seen = exc, set()
        while link is not None and id(link) not in seen:
            seen.add(id(link))
            tb = link.__traceback__
            while tb is not None:
                own = tb.tb_frame.f_code.co_filename == "<string>"  # this script's
                if not own and PASSWORD in repr(tb.tb_frame.f_locals):
                    found.append(f"{name}: {tb.tb_frame.f_code.co_name}")
                tb = tb.tb_next
            link = link.__cause__ or link.__context__
print("aiohttp loaded" if "aiohttp" in sys.modules else "", found)
"""


def test_a_refused_proxy_leaves_no_password_in_frames_before_any_token_fetch() -> None:
    """In a process that has fetched no token yet (aiohttp, whose scrubber lists the
    libraries whose frames are cleared, not loaded), a malformed proxy URL given to a
    requests or httpx OAuth2 object leaves its password in no frame of the error's chain,
    yarl's included."""
    done = run_python(FRESH_CONSTRUCTORS)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


# -- gql's and httpcore's DEBUG records (_core/log_secrets.py) ---------------------------


@pytest.mark.parametrize("way", EVERY_WAY, ids=lambda way: way.name)
def test_a_secret_quoted_escaped_or_percent_encoded_stays_out_of_every_log_record(
    way: Way, emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """The API quotes the client secret as sent, JSON-escaped and percent-encoded, in its
    body and a header: gql's DEBUG record of the body and httpcore's of the headers show
    none of them."""
    caplog.set_level(logging.DEBUG)
    secret = "s3cr3t/KEY+9x=Q7w<&>-" + emulator.recent_client.client_secret[-8:]
    client = ClientRecord("emu-escaped-client", secret)
    emulator.clients[client.client_id] = client
    escaped = secret.replace("/", "\\/")  # as PHP writes JSON; never the secret as sent
    percent = urllib.parse.quote(secret, safe="")
    message = f"bad key {escaped} {percent}"
    body = '{"data": null, "errors": [{"message": "' + message + '"}]}'
    emulator.fail_graphql_requests(
        1, body=body.encode(), headers={"X-Echo": percent, "Content-Type": "application/json"}
    )
    transport = way.api_key(emulator.graphql_url, client_id=client.client_id, client_secret=secret)
    with pytest.raises(TransportQueryError):
        way.one(transport, Call(COUNT))
    forms = [secret, escaped, percent]
    assert caplog.records
    assert [r.name for r in caplog.records if any(f in r.getMessage() for f in forms)] == []


async def test_the_client_secret_stays_out_of_the_logs_after_many_tokens(
    emulator: Emulator, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A long-lived transport whose tokens were replaced 300 times: an answer quoting its
    client secret is still replaced in gql's record (the secrets are not pushed out by the
    tokens the process remembers)."""
    caplog.set_level(logging.DEBUG)
    # 300 revocations in a row are past any budget: this is about logs, not budgets.
    transport = build_transport("oauth2", emulator, clock=clock, token_budget=None)
    async with Client(transport=transport) as session:
        for _ in range(300):
            emulator.revoke_tokens()
            await session.execute(COUNT)
        secret = emulator.recent_client.client_secret
        emulator.fail_graphql_requests(1, body={"data": None, "errors": [{"message": secret}]})
        caplog.clear()
        with pytest.raises(TransportQueryError):
            await session.execute(COUNT)
    assert [r.name for r in caplog.records if "gql.transport" in r.name]
    assert [r.name for r in caplog.records if secret in r.getMessage()] == []


@pytest.mark.parametrize("kind", ["api_key", "oauth2"])
async def test_a_subscription_with_the_callers_own_authorization_sends_it_as_it_is(
    emulator: Emulator, kind: str
) -> None:
    """aiohttp's subscriptions too: the caller's header goes as given; no token fetched."""
    headers = {"Authorization": "Bearer callers-own"}
    async with Client(transport=build_transport(kind, emulator)) as session:
        with pytest.raises(TransportQueryError):
            async for _ in session.subscribe(CARRIER_RENAMED, extra_args={"headers": headers}):
                pass
    sent = [r.headers.get("Authorization") for r in emulator.requests if r.path == "/graphql"]
    assert sent == ["Bearer callers-own"]
    assert emulator.counters.token_requests == 0


@pytest.mark.parametrize("given", ["proxy=", "environment"])
@pytest.mark.parametrize("method", ["api_key", "oauth2"])
@pytest.mark.parametrize(
    "way", [w for w in EVERY_WAY if w.name.startswith("httpx")], ids=lambda way: way.name
)
def test_a_proxy_quoting_the_login_it_was_sent_leaves_it_out_of_the_logs(
    way: Way,
    emulator: Emulator,
    clock: ManualClock,
    method: str,
    given: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy with a login (httpx's proxy=, or HTTP_PROXY, which httpx follows) that
    answers 407 quoting the Proxy-Authorization it was sent: httpcore's record of its
    headers shows neither the password nor its Basic form."""
    from aiohttp import web

    caplog.set_level(logging.DEBUG)
    # A password of its own: the process remembers every proxy login it has seen.
    password = f"proxy-pass-{uuid.uuid4().hex[:12]}"
    basic = base64.b64encode(f"user:{password}".encode()).decode()

    async def refuse(request: web.Request) -> web.Response:
        echo = request.headers.get("Proxy-Authorization", "none")
        return web.Response(status=407, text=f"you sent {echo}", headers={"X-Echo": echo})

    client = emulator.recent_client
    credentials = {"client_id": client.client_id, "client_secret": client.client_secret}
    with serving(lambda app: app.router.add_route("*", "/{tail:.*}", refuse)) as base:
        proxy = base.replace("http://", f"http://user:{password}@")
        routing: dict[str, Any] = {"proxy": proxy}
        if given == "environment":
            monkeypatch.setenv("HTTP_PROXY", proxy)
            routing = {}
        if method == "api_key":
            transport = way.api_key(emulator.graphql_url, **routing, **credentials)
        else:
            transport = way.oauth2(
                emulator.graphql_url,
                token_url=emulator.token_url,
                retry=NO_WAIT,
                clock=clock,
                token_session_args={},  # the token request goes straight to the emulator
                **routing,
                **credentials,
            )
        way.run(transport, [Call(COUNT)])
    assert caplog.records
    assert [
        r.name for r in caplog.records if password in r.getMessage() or basic in r.getMessage()
    ] == []
