"""Runtime boundaries: abandoned fetches, fork, loops handed between threads, copies, secrets."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import gc
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any

import aiohttp
import pytest
from gql import Client, GraphQLRequest, gql
from gql.transport.aiohttp import AIOHTTPTransport
from gql.transport.exceptions import (
    TransportConnectionFailed,
    TransportError,
    TransportServerError,
)
from support import COUNT, renewed, secrets_shown, wait_until

from gql_service_auth import (
    ApiKeyRejectedError,
    ApiKeyTransport,
    AuthEvent,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
    UnauthenticatedError,
)
from gql_service_auth.emulator import Emulator, ManualClock

NO_WAIT = RetryPolicy(wait_initial=0, wait_max=0, wait_jitter=0)
ANSWER = {"carriers": {"totalCount": 25}}
KINDS = ["api_key", "oauth2"]
# A status line aiohttp parses, then a header it refuses: a ClientResponseError.
MALFORMED = b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"

Outcome = tuple[threading.Thread, list[object]]


LEFT_OPEN: list[str] = []
"""ResourceWarnings seen by _collect_garbage during the current test."""


def _collect_garbage() -> None:
    """Finalize garbage now, noting its ResourceWarnings for ``no_resource_left_open``.

    Left to chance, a leftover is finalized later, anywhere (even inside pytest's report of
    a failure), where ``filterwarnings = ["error"]`` turns its warning into another error.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    LEFT_OPEN.extend(str(w.message)[:70] for w in caught if w.category is ResourceWarning)


@pytest.fixture(autouse=True)
def no_resource_left_open() -> Iterator[None]:
    """Fails the test that left a socket, connection or session open."""
    _collect_garbage()  # earlier tests' leftovers are theirs, not this test's
    LEFT_OPEN.clear()
    yield
    # pytest keeps a failed test's traceback, and so its objects, in sys.last_* until the
    # next test's call phase: drop it now, so leftovers are blamed on the test that made them.
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        with contextlib.suppress(AttributeError):
            delattr(sys, name)
    _collect_garbage()
    leaks = sorted(set(LEFT_OPEN))
    assert leaks == [], "the test left these open"


def _build(kind: str, emulator: Emulator, url: str = "", **kwargs: Any) -> AIOHTTPTransport:
    """A transport for the emulator's recent client, built from picklable arguments only."""
    client, url = emulator.recent_client, url or emulator.graphql_url
    if kind == "gql":
        key = f"SERVICE-API-KEY {client.client_id}:{client.client_secret}"
        return AIOHTTPTransport(url, headers={"Authorization": key})
    kwargs |= {"client_id": client.client_id, "client_secret": client.client_secret}
    if kind == "api_key":
        return ApiKeyTransport(url, **kwargs)
    kwargs = {"token_url": emulator.token_url, "retry": NO_WAIT, **kwargs}
    return OAuth2Transport(url, **kwargs)


@contextlib.contextmanager
def _connected(client: Client) -> Iterator[tuple[asyncio.AbstractEventLoop, Any]]:
    """``client`` connected on a new event loop, not running; both closed on exit."""
    loop = asyncio.new_event_loop()
    try:
        session = loop.run_until_complete(client.connect_async())
        try:
            yield loop, session
        finally:
            loop.run_until_complete(client.close_async())
    finally:
        loop.close()


def _sync_execute(transport: AIOHTTPTransport, execute_timeout: float) -> object:
    """gql's sync ``Client.execute`` on a new event loop, closed afterwards.

    Returns a ``TimeoutError`` rather than raising it, for the callers that expect one.
    """
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Client(transport=transport, execute_timeout=execute_timeout).execute(COUNT)
    except TimeoutError as exc:
        return exc
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def _start(call: Callable[[], object]) -> Outcome:
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # handed to the test by _finish
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def _finish(started: Outcome, timeout: float = 10.0) -> object:
    """What the thread's call returned or raised; fails if it runs longer than ``timeout``."""
    thread, outcome = started
    thread.join(timeout)
    assert not thread.is_alive(), f"the thread still ran after {timeout} s"
    _collect_garbage()  # what the thread's loop left behind
    return outcome[0]


def _poll(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _in_child(child: Callable[[], object], timeout: float) -> tuple[int, str]:
    """Run ``child()`` in a forked process: its exit code and how it ended ("ok" or the error)."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns that a fork with threads running may deadlock the child.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        status = "ok"
        try:
            child()
        except BaseException as exc:
            status = f"{type(exc).__name__}: {exc}"
        finally:
            try:
                os.write(write_end, status.encode()[:2000])
            finally:
                os._exit(0 if status == "ok" else 1)
    os.close(write_end)
    try:
        deadline = time.monotonic() + timeout
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return -1, f"still running after {timeout} s"
            time.sleep(0.02)
        return os.waitstatus_to_exitcode(done[1]), os.read(read_end, 4096).decode()
    finally:
        os.close(read_end)


def _asyncio_complaints(caplog: pytest.LogCaptureFixture) -> list[str]:
    """asyncio's error records and the ResourceWarnings, once garbage is collected."""
    _collect_garbage()
    records = [
        r.getMessage().split("\n")[0]
        for r in caplog.records
        if r.name == "asyncio" and r.levelno >= logging.WARNING
    ]
    return [*records, *LEFT_OPEN]


def _credentials(authorizations: Iterable[str]) -> list[str]:
    """Each ``Authorization`` value sent, and the credential after its scheme word."""
    return [part for value in authorizations for part in (value, value.partition(" ")[2]) if part]


def _shown(exc: BaseException, secrets: Iterable[str]) -> list[str]:
    """Where any of ``secrets`` shows in ``exc``'s chain, this file's frames left out."""
    return secrets_shown(exc, secrets, own=__file__)


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


# -- 2. Never wait on a fetch that nobody can finish ------------------------------------


def test_a_fetch_abandoned_by_a_timed_out_sync_execute_does_not_block_other_threads(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """After a sync execute times out mid-fetch, another thread's query succeeds, one token."""
    emulator.token_latency = 0.5
    transport = make_oauth2(retry=RetryPolicy(timeout=20, wait_initial=0, wait_max=0))
    assert isinstance(_finish(_start(lambda: _sync_execute(transport, 0.2))), TimeoutError)
    began = time.monotonic()
    assert _finish(_start(lambda: _sync_execute(transport, 6))) == ANSWER
    assert time.monotonic() - began < 5
    assert emulator.counters.token_requests == 1


def test_a_caller_on_a_live_loop_outlasts_fetches_abandoned_by_short_lived_loops(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Three short-lived loops start and abandon the fetch in turn; a live loop's caller wins."""
    emulator.token_latency = 2.0
    transport = make_oauth2()

    def short_lived() -> Outcome:
        # asyncio.run cancels what is left on its loop once the query has timed out.
        client = Client(transport=transport, execute_timeout=0.5)
        return _start(lambda: asyncio.run(client.execute_async(COUNT)))

    def until_it_fetches_or_ends(fetches: int, thread: threading.Thread) -> None:
        _poll(lambda: emulator.counters.token_requests == fetches or not thread.is_alive())

    loop = asyncio.new_event_loop()
    try:
        abandoning = short_lived()
        assert _poll(lambda: emulator.counters.token_requests == 1)
        client = Client(transport=transport, execute_timeout=20)
        caller = loop.create_task(client.execute_async(COUNT))
        loop.run_until_complete(asyncio.sleep(0.1))  # the caller now waits for that fetch
        for fetches in (2, 3):
            # The caller's loop is busy (here: not stepped) while one short-lived loop ends
            # and the next one calls: a moment any loop doing real work has.
            _finish(abandoning)
            abandoning = short_lived()
            until_it_fetches_or_ends(fetches, abandoning[0])
            loop.run_until_complete(asyncio.sleep(0.1))
        _finish(abandoning)
        result = loop.run_until_complete(asyncio.wait_for(caller, 10))
    finally:
        loop.close()
    assert result == ANSWER


def test_a_forked_child_does_not_wait_on_the_parents_fetch(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Forked while another thread's fetch is in flight, the child's first query succeeds."""
    emulator.token_latency = 0.5
    transport = make_oauth2()
    fetching = _start(lambda: _sync_execute(transport, 5))
    try:
        assert _poll(lambda: emulator.counters.token_requests == 1)
        child = _in_child(lambda: _sync_execute(transport, 5), timeout=8)
    finally:
        _finish(fetching)
    assert child == (0, "ok")


def test_a_forked_child_renews_for_itself_while_the_parents_renewal_runs(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Forked mid-renewal: the child's query goes out with the token at once, and the child
    renews on its own thread, not waiting for the parent's renewal it has no thread of."""
    transport = make_oauth2()
    assert _sync_execute(transport, 5) == ANSWER
    clock.advance(3600 - 60 + 1)
    emulator.token_latency = 0.5
    assert _sync_execute(transport, 5) == ANSWER  # starts the parent's background renewal
    assert _poll(lambda: emulator.counters.token_requests == 2)

    def child() -> None:
        assert _sync_execute(transport, 5) == ANSWER
        assert _poll(renewed(transport, 2))

    assert _in_child(child, timeout=8) == (0, "ok")
    assert _poll(renewed(transport, 2))
    assert emulator.counters.token_requests == 3  # first, the parent's and the child's renewal


@pytest.mark.parametrize("kind", KINDS)
def test_a_forked_child_does_not_reuse_the_parents_connected_session(
    emulator: Emulator, kind: str
) -> None:
    """Forked inside a connected session on the forking thread, the child's own query succeeds."""
    transport = _build(kind, emulator)
    with _connected(Client(transport=transport, execute_timeout=3)) as (loop, session):
        loop.run_until_complete(session.execute(COUNT))
        child = _in_child(lambda: _sync_execute(transport, 5), timeout=8)
        try:  # the parent's session must be unharmed by whatever the child did
            after: object = loop.run_until_complete(session.execute(COUNT))
        except Exception as exc:  # shown by the assertion below
            after = exc
    assert (child, after) == ((0, "ok"), ANSWER)


async def test_no_asyncio_error_is_logged_when_cancelled_callers_leave_a_failing_fetch(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """All callers are cancelled mid-fetch, then the fetch fails: asyncio logs nothing."""
    emulator.token_latency = 0.3
    emulator.fail_token_requests(5, 400)
    async with Client(transport=make_oauth2()) as session:
        callers = [asyncio.ensure_future(session.execute(COUNT)) for _ in range(5)]
        await wait_until(lambda: emulator.counters.token_requests > 0)
        for caller in callers:
            caller.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        del callers, caller  # their tracebacks would keep what asyncio may complain of alive
        # The emulator records a token request once it has waited and answers it (400).
        await wait_until(lambda: any(r.path == "/oauth2/token" for r in emulator.requests))
        await asyncio.sleep(0.1)
    assert emulator.counters.token_requests == 1
    assert _asyncio_complaints(caplog) == []


def test_no_asyncio_error_is_logged_when_a_timed_out_sync_execute_abandons_a_fetch(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sync execute times out mid-fetch and its loop closes: asyncio logs nothing."""
    emulator.token_latency = 0.5
    call = functools.partial(_sync_execute, make_oauth2(), 0.2)
    assert isinstance(_finish(_start(call)), TimeoutError)
    _poll(lambda: bool(events), 2)  # where the fetch can still finish, let it
    del call  # the last reference to the transport
    assert _asyncio_complaints(caplog) == []


async def test_a_hanging_token_endpoint_fails_with_token_request_error_within_gqls_timeout(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Default RetryPolicy, gql's default execute_timeout: a hanging endpoint ends in our error."""
    emulator.token_latency = 30
    with pytest.raises(TokenRequestError):
        async with Client(transport=make_oauth2(retry=RetryPolicy())) as session:
            await session.execute(COUNT)


def test_a_fetch_falls_back_to_the_callers_loop_when_no_thread_can_start(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No thread to be had (pids limit, shutdown): the fetch runs on the caller's loop."""
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name == "gql-service-auth-token":
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    transport = make_oauth2()
    assert _sync_execute(transport, 5) == ANSWER
    emulator.revoke_tokens()
    emulator.token_latency = 0.5
    # That caller gives up mid-fetch and its loop stops; its fetch was its own only.
    assert isinstance(_sync_execute(transport, 0.2), TimeoutError)
    emulator.token_latency = 0
    monkeypatch.setattr(threading.Thread, "start", real_start)
    began = time.monotonic()
    assert _finish(_start(lambda: _sync_execute(transport, 5))) == ANSWER
    assert time.monotonic() - began < 3


def test_a_slow_resolver_does_not_stretch_a_fetch_past_its_bound(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """getaddrinfo stuck for 3 s: the fetch ends in TokenRequestError at its 0.5 s bound."""
    real_getaddrinfo = socket.getaddrinfo

    def slow(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "localhost":
            time.sleep(3)
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    token_url = emulator.token_url.replace("127.0.0.1", "localhost")
    transport = make_oauth2(token_url=token_url, retry=RetryPolicy(timeout=0.5, wait_jitter=0))
    began = time.monotonic()
    outcome = _finish(_start(lambda: _sync_execute(transport, 10)))
    assert isinstance(outcome, TokenRequestError)
    assert time.monotonic() - began < 4


def test_a_replaced_asyncio_run_does_not_break_fetches(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Libraries such as nest_asyncio replace asyncio.run; fetches do not depend on it."""

    def main_thread_only(*_: Any, **__: Any) -> Any:
        raise RuntimeError("There is no current event loop in thread")

    transport = make_oauth2()
    monkeypatch.setattr(asyncio, "run", main_thread_only)
    assert _sync_execute(transport, 5) == ANSWER


async def test_each_caller_gets_its_own_copy_of_a_fetch_error(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Callers sharing a failed fetch get distinct errors, so one's context is not another's."""
    emulator.token_latency = 0.1
    emulator.fail_token_requests(1, 400)
    async with Client(transport=make_oauth2()) as session:
        outcomes = await asyncio.gather(
            session.execute(COUNT), session.execute(COUNT), return_exceptions=True
        )
    first, second = outcomes
    assert isinstance(first, TokenRequestError)
    assert isinstance(second, TokenRequestError)
    assert first is not second
    assert str(first) == str(second)
    assert emulator.counters.token_requests == 1


FORKED_CHILD_EXITS = """
import asyncio, os, sys
from gql import Client, gql
from gql_service_auth import {cls}
from gql_service_auth.emulator import Emulator, ManualClock

COUNT = gql("query {{ carriers(first: 1) {{ totalCount }} }}")

async def main(transport, emulator):
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        pid = os.fork()
        if pid == 0:
            return "child"
        _, status = os.waitpid(pid, 0)
        emulator.revoke_tokens()  # OAuth2: a renewal, woken up from the fetch's thread
        await asyncio.wait_for(session.execute(COUNT), 5)  # the parent still works
        return f"parent: child exited {{os.waitstatus_to_exitcode(status)}}"

with Emulator().run_in_thread() as emulator:
    client = emulator.recent_client
    extra = {{"token_url": emulator.token_url}} if "{cls}" == "OAuth2Transport" else {{}}
    transport = {cls}(
        emulator.graphql_url,
        client_id=client.client_id,
        client_secret=client.client_secret,
        **extra,
    )
    loop = asyncio.new_event_loop()
    who = loop.run_until_complete(main(transport, emulator))
    if who == "child":
        print(asyncio.run(Client(transport=transport).execute_async(COUNT)), flush=True)
        sys.exit(0)  # a normal exit, as gunicorn and Celery workers make: finalizers run
    print(who, flush=True)
"""


@pytest.mark.parametrize("cls", ["ApiKeyTransport", "OAuth2Transport"])
def test_a_forked_child_exits_without_touching_its_parents_connections(cls: str) -> None:
    """A child that inherited connected sessions exits normally: no warning, parent unharmed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, 3.12+
        done = subprocess.run(
            [sys.executable, "-c", FORKED_CHILD_EXITS.format(cls=cls)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert "parent: child exited 0" in done.stdout
    assert "totalCount" in done.stdout
    assert "Unclosed" not in done.stderr


# -- 5. Secrets, everywhere an exception can carry them -------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_redirect_loop_error_shows_no_credential(emulator: Emulator, kind: str) -> None:
    """aiohttp's TooManyRedirects under gql's TransportConnectionFailed holds no credential."""
    emulator.fail_graphql_requests(20, 307, headers={"Location": emulator.graphql_url})
    with pytest.raises(TransportConnectionFailed) as info:
        async with Client(transport=_build(kind, emulator)) as session:
            await session.execute(COUNT)
    sent = [r.headers.get("Authorization", "") for r in emulator.requests if r.path == "/graphql"]
    secrets = [emulator.recent_client.client_secret, *_credentials(sent)]
    assert _shown(info.value, secrets) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_malformed_graphql_answer_error_shows_no_credential(
    emulator: Emulator, kind: str
) -> None:
    """aiohttp's ClientResponseError under gql's TransportConnectionFailed holds no credential."""
    async with _loopback(lambda _: MALFORMED) as (url, received):
        with pytest.raises(TransportConnectionFailed) as info:
            async with Client(transport=_build(kind, emulator, url + "/graphql")) as session:
                await session.execute(COUNT)
    secrets = [emulator.recent_client.client_secret, *_credentials(received)]
    assert _shown(info.value, secrets) == []


async def test_a_malformed_token_answer_error_shows_no_basic_credentials(
    emulator: Emulator,
) -> None:
    """With client_secret_basic, a malformed token answer raises TokenRequestError, no secret."""
    async with _loopback(lambda _: MALFORMED) as (url, received):
        basic = {"token_url": url + "/oauth2/token", "token_auth_method": "client_secret_basic"}
        with pytest.raises(TokenRequestError) as info:
            async with Client(transport=_build("oauth2", emulator, **basic)) as session:
                await session.execute(COUNT)
    secrets = [emulator.recent_client.client_secret, *_credentials(received)]
    assert _shown(info.value, secrets) == []


@pytest.mark.parametrize(
    ("kind", "error"), [("api_key", ApiKeyRejectedError), ("oauth2", UnauthenticatedError)]
)
async def test_a_credential_echoed_by_the_api_is_scrubbed_from_our_error(
    emulator: Emulator, caplog: pytest.LogCaptureFixture, kind: str, error: type[Exception]
) -> None:
    """A refusal quoting the API key or token raises our error, whose errors hold neither."""
    # gql's own transport logs every answer's body at DEBUG; the scan here is of our errors.
    caplog.set_level(logging.INFO, logger="gql.transport.aiohttp")
    async with _loopback(_echo_refusal) as (url, received):
        with pytest.raises(error) as info:
            async with Client(transport=_build(kind, emulator, url + "/graphql")) as session:
                await session.execute(COUNT)
    secrets = [emulator.recent_client.client_secret, *_credentials(received)]
    assert _shown(info.value, secrets) == []


@pytest.mark.parametrize("status", [200, 502])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_credential_echoed_in_a_body_that_is_not_graphql_is_scrubbed(
    emulator: Emulator, kind: str, status: int
) -> None:
    """A proxy page quoting the Authorization header reaches no message or attribute."""
    transport = _build(kind, emulator)
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        sent = [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"]
        page = f"<pre>Request headers:\nAuthorization: {sent[-1]}\n</pre>".encode()
        emulator.fail_graphql_requests(1, status, body=page)
        with pytest.raises(TransportError) as info:
            await session.execute(COUNT)
    secrets = [emulator.recent_client.client_secret, *_credentials(sent)]
    assert _shown(info.value, secrets) == []


async def test_a_basic_header_echoed_by_the_token_endpoint_is_scrubbed(emulator: Emulator) -> None:
    """The token endpoint quoting the Basic header it got: TokenRequestError without it."""
    client = emulator.recent_client
    raw = f"{client.client_id}:{client.client_secret}".encode()
    basic = base64.b64encode(raw).decode()
    description = f"malformed header: Authorization: Basic {basic}"
    emulator.fail_token_requests(
        1, 400, body={"error": "invalid_request", "error_description": description}
    )
    transport = _build("oauth2", emulator, token_auth_method="client_secret_basic")
    with pytest.raises(TokenRequestError) as info:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
    assert _shown(info.value, [basic, client.client_secret]) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_credential_echoed_in_a_response_header_or_undecodable_body_is_scrubbed(
    emulator: Emulator, kind: str
) -> None:
    """A 502 quoting the credential in a header, and a page that is not UTF-8: scrubbed."""
    transport = _build(kind, emulator)
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
    assert [_shown(exc, secrets) for exc in caught] == [[], []]


async def test_a_credential_echoed_in_a_malformed_token_answer_is_scrubbed(
    emulator: Emulator,
) -> None:
    """A token endpoint quoting the Basic header in a header aiohttp cannot parse."""

    def quote_it(headers: Mapping[str, str]) -> bytes:
        return f"HTTP/1.1 200 OK\r\nContent-Length: {headers['authorization']}\r\n\r\n".encode()

    async with _loopback(quote_it) as (url, received):
        basic = {"token_url": url + "/oauth2/token", "token_auth_method": "client_secret_basic"}
        with pytest.raises(TokenRequestError) as info:
            async with Client(transport=_build("oauth2", emulator, **basic)) as session:
                await session.execute(COUNT)
    secrets = [emulator.recent_client.client_secret, *_credentials(received)]
    assert _shown(info.value, secrets) == []


class _Frozen(Exception):
    """A caller's own exception that refuses changes, holding a cycle."""

    def __setattr__(self, name: str, value: object) -> None:
        if name not in ("__traceback__", "__context__", "__cause__", "__suppress_context__"):
            raise AttributeError("frozen")
        super().__setattr__(name, value)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_query_made_while_the_caller_handles_its_own_error_fails_as_usual(
    emulator: Emulator, kind: str
) -> None:
    """Inside the caller's except block (a cyclic, read-only error), a 502 is still gql's."""
    cyclic: list[object] = []
    cyclic.append(cyclic)
    emulator.fail_graphql_requests(1, 502, body=b"bad gateway")
    async with Client(transport=_build(kind, emulator)) as session:
        try:
            raise _Frozen("the caller's own", cyclic)
        except _Frozen:
            with pytest.raises(TransportServerError):
                await session.execute(COUNT)


@pytest.mark.parametrize("kind", ["gql", *KINDS])
async def test_cyclic_variables_fail_as_they_do_with_gqls_transport(
    emulator: Emulator, kind: str
) -> None:
    """Variables that contain themselves fail with the error gql's own transport raises."""
    variables: dict[str, Any] = {"id": "carrier-001"}
    variables["self"] = variables
    request = GraphQLRequest(
        gql("query ($id: ID!) { carrier(id: $id) { id } }"), variable_values=variables
    )
    async with Client(transport=_build(kind, emulator)) as session:
        with pytest.raises(Exception, match=r"[Cc]ircular") as info:
            await session.execute(request)
    assert not isinstance(info.value, RecursionError)


@pytest.mark.parametrize("kind", KINDS)
def test_a_timed_out_call_leaves_no_credential_in_its_chain(emulator: Emulator, kind: str) -> None:
    """gql's execute_timeout cancels the request: its chain's frames hold no credential."""
    emulator.graphql_latency = 0.5
    transport = _build(kind, emulator)
    if kind == "oauth2":
        assert _sync_execute(transport, 5) == ANSWER  # a token first, so the send times out
    outcome = _sync_execute(transport, 0.2)
    assert isinstance(outcome, TimeoutError)
    sent = [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"]
    assert _shown(outcome, [emulator.recent_client.client_secret, *_credentials(sent)]) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failed_subscription_leaves_no_credential_in_its_chain(
    emulator: Emulator, kind: str
) -> None:
    """A subscription answered with a 500: gql's error, no credential in the chain."""
    emulator.fail_graphql_requests(1, 500, body=b"")
    async with Client(transport=_build(kind, emulator)) as session:
        with pytest.raises(TransportServerError) as info:
            async for _ in session.subscribe(gql("subscription { ticks }")):
                pass  # pragma: no cover
    sent = [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"]
    secrets = [emulator.recent_client.client_secret, *_credentials(sent)]
    assert _shown(info.value, secrets) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failure_handled_inside_a_batch_error_leaves_the_batching_session_alive(
    emulator: Emulator, kind: str
) -> None:
    """A failed call made while handling a batched call's error: later batches still run."""

    async def scenario() -> object:
        async with (
            Client(transport=_build(kind, emulator), batch_interval=0.01) as batched,
            Client(transport=_build(kind, emulator)) as plain,
        ):
            await batched.execute(COUNT)
            await plain.execute(COUNT)
            emulator.fail_graphql_requests(1, 500, body={"oops": 1})
            try:
                await batched.execute(COUNT)
            except TransportServerError:
                emulator.fail_graphql_requests(1, 500, body={"oops": 2})
                with pytest.raises(TransportServerError):
                    await plain.execute(COUNT)
            # gql's batching task caught the first error and waits on: its frame is not ours.
            return await batched.execute(COUNT)

    # Bounded as a whole: a dead batching task also hangs the session's close.
    assert await asyncio.wait_for(scenario(), 20) == ANSWER


# -- 7. Drop-in, the rest --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gql", *KINDS])
def test_a_session_connected_on_a_loop_serves_another_thread_running_that_loop(
    emulator: Emulator, kind: str
) -> None:
    """Connected on loop L in one thread, the session executes when another thread runs L."""
    with _connected(Client(transport=_build(kind, emulator))) as (loop, session):
        result = _finish(_start(lambda: loop.run_until_complete(session.execute(COUNT))))
    assert result == ANSWER


@pytest.mark.parametrize("kind", ["gql", *KINDS])
def test_closing_on_the_loop_from_another_thread_closes_the_session(
    emulator: Emulator, kind: str
) -> None:
    """Connected on loop L in one thread and closed on L by another, no session stays open."""
    transport = _build(kind, emulator)
    client = Client(transport=transport)

    async def session_of_this_loop() -> aiohttp.ClientSession | None:
        return transport.session

    with _connected(client) as (loop, _):
        opened = loop.run_until_complete(session_of_this_loop())
        assert opened is not None
        try:
            assert _finish(_start(lambda: loop.run_until_complete(client.close_async()))) is None
            assert opened.closed
        finally:
            loop.run_until_complete(opened.close())  # a no-op once closed


COPIERS = [
    pytest.param(lambda transport: pickle.loads(pickle.dumps(transport)), id="pickle"),
    pytest.param(copy.deepcopy, id="deepcopy"),
]


@pytest.mark.parametrize("copier", COPIERS)
@pytest.mark.parametrize("kind", ["gql", *KINDS])
async def test_a_copied_transport_runs_a_query(
    emulator: Emulator, kind: str, copier: Callable[[Any], AIOHTTPTransport]
) -> None:
    """A pickled or deep-copied transport runs a query, as gql's own transport does."""
    async with Client(transport=copier(_build(kind, emulator))) as session:
        assert await session.execute(COUNT) == ANSWER


@pytest.mark.parametrize("copier", COPIERS)
async def test_a_copy_of_a_used_oauth2_transport_fetches_its_own_token(
    emulator: Emulator, copier: Callable[[Any], AIOHTTPTransport]
) -> None:
    """A copy of an OAuth2Transport holding a token drops it and fetches its own."""
    original = _build("oauth2", emulator)
    async with Client(transport=original) as session:
        await session.execute(COUNT)
    async with Client(transport=copier(original)) as session:
        assert await session.execute(COUNT) == ANSWER
    assert emulator.counters.token_requests == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_gqls_positional_arguments_are_accepted_in_gqls_order(
    emulator: Emulator, kind: str
) -> None:
    """headers, cookies, auth, ssl, timeout... given positionally as to gql reach the request."""
    gql_args = ({"X-Trace": "1"}, {"trace": "c"}, None, True, 10, 10, json.dumps, json.loads, None)
    client = emulator.recent_client
    keywords = {"client_id": client.client_id, "client_secret": client.client_secret}
    if kind == "oauth2":
        keywords |= {"token_url": emulator.token_url}
    cls = ApiKeyTransport if kind == "api_key" else OAuth2Transport
    transport = cls(emulator.graphql_url, *gql_args, **keywords)
    async with Client(transport=transport) as session:
        assert await session.execute(COUNT) == ANSWER
    sent = [r.headers for r in emulator.requests if r.path == "/graphql"]
    assert [(h.get("X-Trace"), h.get("Cookie")) for h in sent] == [("1", "trace=c")]
