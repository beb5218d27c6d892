"""Queries and helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import gc
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from gql import Client, FileVar, GraphQLRequest, gql
from gql.transport import AsyncTransport
from gql.transport.aiohttp import AIOHTTPTransport
from gql.transport.httpx import HTTPXAsyncTransport, HTTPXTransport
from gql.transport.requests import RequestsHTTPTransport
from yarl import URL

from gql_service_auth import (
    ApiKeyTransport,
    AuthEvent,
    OAuth2Transport,
    RetryPolicy,
    TokenIdentity,
    TokenStore,
    UnauthenticatedError,
)
from gql_service_auth.emulator import ClientRecord, Emulator, ManualClock
from gql_service_auth.httpx import (
    ApiKeyHTTPXAsyncTransport,
    ApiKeyHTTPXTransport,
    OAuth2HTTPXAsyncTransport,
    OAuth2HTTPXTransport,
)
from gql_service_auth.requests import ApiKeyRequestsTransport, OAuth2RequestsTransport

if TYPE_CHECKING:
    import pytest

CARRIERS = gql("query { carriers(first: 10) { edges { node { id name } } } }")
"""The contract's authentication check query."""

COUNT = gql("query { carriers(first: 1) { totalCount } }")

RENAME = gql('mutation { renameCarrier(id: "carrier-001", name: "Renamed") { id name } }')

UPLOAD = gql("mutation ($file: Upload!) { uploadDocument(file: $file) { filename size } }")

UNAUTHENTICATED_ERROR = {"message": "expired", "extensions": {"code": "UNAUTHENTICATED"}}

CARRIER = "query ($id: ID!) { carrier(id: $id) { id name } }"
"""One carrier by id (``carrier-001`` to ``carrier-025``)."""

TICKS = gql("subscription { ticks }")

CARRIER_RENAMED = gql("subscription { carrierRenamed { id } }")

NO_WAIT = RetryPolicy(wait_initial=0, wait_max=0, wait_jitter=0)
"""Retries without backoff waits, so tests never sleep through them."""

ONE_ATTEMPT = RetryPolicy(attempts=1, wait_initial=0, wait_max=0, wait_jitter=0)
"""A token request that fails is not retried: the error is that of the first answer."""


_T = TypeVar("_T")


async def bounded(*calls: Awaitable[_T]) -> list[_T]:
    """Run ``calls`` concurrently, failing the test after 30 s."""
    return await asyncio.wait_for(asyncio.gather(*calls), timeout=30)


async def settle(*calls: Awaitable[Any]) -> list[Any]:
    """Like :func:`bounded`, but an exception is returned as the call's outcome."""
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=30)


async def hold_token_fetch(
    session: Any, emulator: Emulator, clock: ManualClock, moment: str
) -> None:
    """Make the next call wait for a token fetch: on a cold cache (``"cold"``), or a renewal."""
    if moment == "renewal":
        await session.execute(COUNT)
        clock.advance(emulator.token_ttl)
    emulator.token_latency = 0.1


def no_fetch_thread(monkeypatch: Any) -> Callable[[threading.Thread], None]:
    """Make the token fetch's thread fail to start, as under a pids limit or at shutdown,
    for the rest of the test; returns the real ``Thread.start``, to undo it earlier."""
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name == "gql-service-auth-token":
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    return real_start


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 where connections are refused, for as long as the block runs.

    The socket stays bound without listening: unlike a port that was free a moment ago,
    no other server (another pytest-xdist worker's, say) can take it meanwhile.
    """
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port: int = holder.getsockname()[1]
        yield port


HANG_GUARD = 60.0
"""Seconds after which a test waiting for an event gives up: a guard against hanging, never
a claim of speed. A test waits for the event itself, so a loaded machine costs only time."""


async def wait_until(condition: Callable[[], bool], timeout: float = HANG_GUARD) -> None:
    """Yield to the loop until ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


def renewed(transport: Any, generation: int) -> Callable[[], bool]:
    """A condition for :func:`wait_until`: ``transport`` holds a ``generation`` token or newer."""
    return lambda: transport.token is not None and transport.token.generation >= generation


def execute_on_threads(transport: AIOHTTPTransport, threads: int = 1) -> list[BaseException]:
    """gql's blocking ``Client.execute`` of COUNT on ``threads`` threads at once.

    Each thread owns an event loop and closes it, as a well-behaved worker does: gql's
    sync execute creates one where none is set but never closes it. Returns the errors.
    """
    errors: list[BaseException] = []
    together = threading.Barrier(threads, timeout=10)

    def target() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            together.wait()
            Client(transport=transport).execute(COUNT)
        except BaseException as exc:  # returned to the caller
            errors.append(exc)
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    started = [threading.Thread(target=target) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(10)
    return errors


def upload(data: bytes) -> GraphQLRequest:
    """The upload mutation with ``data`` as its file (send with ``upload_files=True``)."""
    file = FileVar(io.BytesIO(data), filename="note.txt", content_type="text/plain")
    return GraphQLRequest(UPLOAD, variable_values={"file": file})


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or during, each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def exception_texts(exc: BaseException) -> list[str]:
    """All a person or a crash reporter could see of ``exc``: traceback, str, repr, attributes."""
    texts = ["".join(traceback.format_exception(exc))]
    for link in exception_chain(exc):
        texts += [str(link), repr(link), repr(vars(link))]
    return texts


def _links(exc: BaseException) -> list[BaseException]:
    """Every exception reachable from ``exc`` through ``__cause__`` and ``__context__``."""
    seen: dict[int, BaseException] = {}
    pending = [exc]
    while pending:
        link = pending.pop()
        if id(link) not in seen:
            seen[id(link)] = link
            pending += [e for e in (link.__cause__, link.__context__) if e is not None]
    return list(seen.values())


def _safe_repr(names: Mapping[str, object]) -> str:
    """Each local's repr, as crash reporters take it: one that raises is skipped."""
    shown = []
    for name, value in names.items():
        try:
            shown.append(f"{name}={value!r}")
        except Exception:
            shown.append(f"{name}=<repr raised>")
    return ", ".join(shown)


def secrets_shown(exc: BaseException, secrets: Iterable[str], *, own: str) -> list[str]:
    """Where any of ``secrets`` shows in ``exc``'s chain: traceback, str, repr, args, vars,
    locals, and the HTTP responses the chain keeps.

    Locals too: crash reporters such as Sentry capture the local variables of each frame
    of a traceback by default. Frames of files whose path starts with ``own`` (the tests'
    own, which hold the secrets they look for) are left out. The responses as a caller
    reads them (``exc.__cause__.response.text``) and as a debugger unfolds them (see
    :func:`responses_shown`).
    """
    secrets = [s for s in secrets if s]
    assert secrets, "nothing to look for: the scan would prove nothing"
    texts = {"traceback": "".join(traceback.format_exception(exc))}
    for link in _links(exc):
        name = type(link).__name__
        texts |= {f"str({name})": str(link), f"repr({name})": repr(link)}
        texts |= {f"args({name})": repr(link.args), f"vars({name})": repr(vars(link))}
        texts |= responses_shown(link)
        tb = link.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if not code.co_filename.startswith(own):
                where = f"locals({code.co_name}@{code.co_filename}:{id(tb.tb_frame)})"
                texts[where] = _safe_repr(tb.tb_frame.f_locals)
            tb = tb.tb_next
    return [where for where, text in texts.items() if any(s in text for s in secrets)]


def responses_shown(link: BaseException) -> dict[str, str]:
    """What ``link`` shows of the HTTP responses it keeps, and of those before them.

    requests' and httpx's errors keep the response (``exc.response``), aiohttp's the
    responses of the redirects before the error (``exc.history``); each response keeps
    the ones before it (``history``) and the requests behind it. Seen as a caller reads
    them (the headers' values, the body when it reads without waiting on the network) and
    as a debugger unfolds them (:func:`unfolded`: a body nobody read, in a stream's buffer).
    """
    texts: dict[str, str] = {}
    for number, response in enumerate(_responses(link)):
        where = f"{type(response).__name__} {number} of {type(link).__name__}"
        requests = [_attribute(response, name) for name in ("request", "next", "next_request")]
        records = [response, *requests, _attribute(response, "request_info")]
        texts[f"headers({where})"] = repr([_header_items(record) for record in records])
        texts[f"body({where})"] = _body(response)
        texts[f"unfolded({where})"] = unfolded(response)
    return texts


def _responses(link: BaseException) -> list[object]:
    found: list[object] = []
    pending = [getattr(link, "response", None), *(getattr(link, "history", None) or ())]
    while pending:
        response = pending.pop()
        if response is not None and not any(response is seen for seen in found):
            found.append(response)
            pending += getattr(response, "history", None) or ()
    return found


def _attribute(obj: object, name: str) -> object:
    """``obj.name``, or ``None`` where it has none (httpx raises for a response's missing
    request)."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _header_items(record: object) -> list[tuple[str, str]]:
    """Every header of ``record`` (a response or a request), values whole: httpx's repr
    masks some."""
    headers = _attribute(record, "headers")
    items = getattr(headers, "multi_items", None) or getattr(headers, "items", None)
    return list(items()) if items is not None else []


def _body(response: object) -> str:
    """The body as the caller reads it from ``response.content``: requests' and httpx's
    (httpx's raises until read); aiohttp's is a stream, for :func:`unfolded` to show."""
    content = _attribute(response, "content")
    return content.decode("latin-1") if isinstance(content, bytes) else ""


STORE_RETRY = RetryPolicy(wait_initial=0, wait_max=0, wait_jitter=0, timeout=2.0)
"""The token store tests' retries: no backoff waits, and a 2.5 s fetch lock."""


def with_store(
    emulator: Emulator,
    store: TokenStore | None,
    events: list[AuthEvent] | None = None,
    *,
    client: ClientRecord | None = None,
    **kwargs: Any,
) -> OAuth2Transport:
    """An OAuth2Transport for ``client`` (the emulator's recent one), sharing tokens through
    ``store`` only: its tokens are its own in the process, as another process's would be."""
    client = client or emulator.recent_client
    kwargs.setdefault("retry", STORE_RETRY)
    kwargs.setdefault("share_tokens", False)
    return OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        client_id=client.client_id,
        client_secret=client.client_secret,
        token_store=store,
        on_event=events.append if events is not None else None,
        **kwargs,
    )


async def query(transport: AIOHTTPTransport, times: int = 1) -> None:
    """``times`` COUNT queries at once in one session of ``transport``."""
    async with Client(transport=transport) as session:
        await asyncio.gather(*(session.execute(COUNT) for _ in range(times)))


def fleet_config(emulator: Emulator, redis_url: str | None, **more: Any) -> dict[str, Any]:
    """Settings of a tests/fleet_worker.py process for the emulator's recent client.

    ``redis_url`` ``None``: the process keeps its token to itself (no store).
    """
    client = emulator.recent_client
    return {
        "graphql_url": emulator.graphql_url,
        "token_url": emulator.token_url,
        "client_id": client.client_id,
        "client_secret": client.client_secret,
        "redis_url": redis_url,
        **more,
    }


FLEET_WORKER = Path(__file__).with_name("fleet_worker.py")


class Fleet:
    """Processes of tests/fleet_worker.py, each with its own transport on one Redis."""

    def __init__(self, processes: int, **config: Any) -> None:
        env = {**os.environ, "FLEET_CONFIG": json.dumps(config)}
        self.processes = [
            subprocess.Popen(
                [sys.executable, str(FLEET_WORKER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
            )
            for _ in range(processes)
        ]
        for process in self.processes:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"

    def run(self) -> list[dict[str, Any]]:
        """Start one phase in every process at once; each one's outcome."""
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outcomes = []
        for process in self.processes:
            assert process.stdout is not None
            outcomes.append(json.loads(process.stdout.readline()))
        return outcomes

    def close(self) -> None:
        for process in self.processes:
            if process.stdin is not None:
                process.stdin.close()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


# -- Transports by kind, run on threads, loops and forked children ----------------------

ANSWER = {"carriers": {"totalCount": 25}}
"""What COUNT answers."""


@dataclass(frozen=True)
class Stack:
    """One HTTP stack's transports: gql's own, and ours for each method.

    The behaviour suite takes its transports from here, through ``KINDS``, the ``stack``
    fixture (``make_oauth2``, ``make_api_key``) and :func:`build_transport`: a new stack is
    one more entry in ``STACKS``, and the tests parametrized over them run on it too.
    """

    name: str
    gql: Callable[..., Any]
    api_key: Callable[..., Any]
    oauth2: Callable[..., Any]
    #: Keywords every transport of the stack is built with, unless a test gives its own.
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def kind(self, method: str) -> str:
        """The ``kind`` of this stack's transport for ``method`` ("api_key", "oauth2",
        "gql"): the method alone on the default stack, aiohttp, as test ids have it."""
        return method if self is ALL_STACKS[0] else f"{self.name}-{method}"


_CALLERS: dict[int, ThreadPoolExecutor] = {}
"""The threads of :class:`OnThreads`' callers, per process (a forked child has none of its
parent's): as many as the suite has callers at once (200), as a sync application serving
that many has; asyncio's default pool (6 threads here) would run 6 at a time, and a test
of 50 requests in flight would have 6."""


async def _on_thread(call: Callable[[], _T]) -> _T:
    pool = _CALLERS.get(os.getpid())
    if pool is None:
        pool = _CALLERS[os.getpid()] = ThreadPoolExecutor(256, thread_name_prefix="caller")
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(pool, context.run, call)


def _as_called(request: GraphQLRequest) -> GraphQLRequest:
    """``request`` with its variables as they are now (the files in them shared)."""
    taken = copy.copy(request)
    if request.variable_values is not None:
        taken.variable_values = dict(request.variable_values)
    return taken


class OnThreads(AsyncTransport):
    """A sync gql transport (requests, httpx) behind gql's async interface: each call runs
    on a worker thread, as an asyncio application calls a sync client. The behaviour
    suite, written for async transports, runs on the sync stacks through it; what a test
    reads of the transport (``url``, ``session``...) is the wrapped one's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @classmethod
    def of(cls, transport_class: type[Any]) -> Callable[..., OnThreads]:
        """A factory like ``transport_class``'s constructor, wrapping what it builds."""
        return lambda *args, **kwargs: cls(transport_class(*args, **kwargs))

    async def connect(self) -> None:
        await _on_thread(self.inner.connect)

    async def close(self) -> None:
        await _on_thread(self.inner.close)

    # The calls go to the threads as closures: the caller's arguments (a secret of its own
    # in extra_args) would otherwise sit in the locals of asyncio's frames, which the
    # secret scans read as the package's. Each takes its request as it is when called: a
    # thread calling a sync client is blocked in its call, and gql's sync session gives
    # each call its own request, while gql's async session goes on rewriting a request
    # its callers share (gql 3 style) before the thread would read it.
    async def execute(self, request: GraphQLRequest, *args: Any, **kwargs: Any) -> Any:
        inner, request = self.inner, _as_called(request)
        return await _on_thread(lambda: inner.execute(request, *args, **kwargs))

    async def execute_batch(self, reqs: list[GraphQLRequest], *args: Any, **kwargs: Any) -> Any:
        inner, reqs = self.inner, [_as_called(request) for request in reqs]
        return await _on_thread(lambda: inner.execute_batch(reqs, *args, **kwargs))

    def subscribe(self, request: GraphQLRequest) -> Any:
        raise NotImplementedError("the sync transports have no subscriptions")

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # a copy being made, before its __dict__ is
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "inner":
            super().__setattr__(name, value)
        else:
            setattr(self.inner, name, value)


class _TrioLoop:
    """One trio event loop on a thread of its own, per process, that runs coroutines for
    :class:`OnTrio`."""

    _loops: ClassVar[dict[int, _TrioLoop]] = {}
    _lock = threading.Lock()

    def __init__(self) -> None:
        import trio

        self._token: Any = None
        ready = threading.Event()

        async def serve() -> None:
            self._token = trio.lowlevel.current_trio_token()
            ready.set()
            await trio.sleep_forever()

        threading.Thread(target=trio.run, args=(serve,), name="trio-loop", daemon=True).start()
        if not ready.wait(HANG_GUARD):
            raise RuntimeError("the trio loop did not start")

    @classmethod
    def of_this_process(cls) -> _TrioLoop:
        with cls._lock:
            loop = cls._loops.get(os.getpid())
            if loop is None:
                loop = cls._loops[os.getpid()] = cls()
            return loop

    def run(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``call()``'s coroutine on the trio loop; blocks the calling thread."""

        import trio

        async def run() -> _T:
            return await call()

        return trio.from_thread.run(run, trio_token=self._token)


# A child forked while another thread builds the first loop starts with the lock free.
os.register_at_fork(after_in_child=lambda: setattr(_TrioLoop, "_lock", threading.Lock()))


class OnTrio(OnThreads):
    """An async gql transport (httpx's) run on trio, behind gql's asyncio interface: each
    call goes to one trio loop, on a thread of its own, from a caller thread. The
    behaviour suite, written on asyncio, runs on httpx under trio through it."""

    async def connect(self) -> None:
        inner = self.inner
        await _on_thread(lambda: _TrioLoop.of_this_process().run(inner.connect))

    async def close(self) -> None:
        inner = self.inner
        await _on_thread(lambda: _TrioLoop.of_this_process().run(inner.close))

    async def execute(self, request: GraphQLRequest, *args: Any, **kwargs: Any) -> Any:
        inner, trio_loop, request = self.inner, _TrioLoop.of_this_process(), _as_called(request)
        return await _on_thread(
            lambda: trio_loop.run(lambda: inner.execute(request, *args, **kwargs))
        )

    async def execute_batch(self, reqs: list[GraphQLRequest], *args: Any, **kwargs: Any) -> Any:
        inner, trio_loop = self.inner, _TrioLoop.of_this_process()
        reqs = [_as_called(request) for request in reqs]
        return await _on_thread(
            lambda: trio_loop.run(lambda: inner.execute_batch(reqs, *args, **kwargs))
        )


ALL_STACKS = [
    Stack("aiohttp", AIOHTTPTransport, ApiKeyTransport, OAuth2Transport),
    # httpx bounds the wait for a pooled connection (5 s by default): a thousand queries on
    # a busy machine wait longer for its 100 connections. A guard, as HANG_GUARD is.
    Stack(
        "httpx",
        HTTPXAsyncTransport,
        ApiKeyHTTPXAsyncTransport,
        OAuth2HTTPXAsyncTransport,
        defaults={"timeout": HANG_GUARD},
    ),
    Stack(
        "requests",
        OnThreads.of(RequestsHTTPTransport),
        OnThreads.of(ApiKeyRequestsTransport),
        OnThreads.of(OAuth2RequestsTransport),
        defaults={"timeout": HANG_GUARD},
    ),
    Stack(
        "httpxsync",
        OnThreads.of(HTTPXTransport),
        OnThreads.of(ApiKeyHTTPXTransport),
        OnThreads.of(OAuth2HTTPXTransport),
        defaults={"timeout": HANG_GUARD},
    ),
    Stack(
        "trio",
        OnTrio.of(HTTPXAsyncTransport),
        OnTrio.of(ApiKeyHTTPXAsyncTransport),
        OnTrio.of(OAuth2HTTPXAsyncTransport),
        defaults={"timeout": HANG_GUARD},
    ),
]
"""Every stack the behaviour suite can run on, the first the default: aiohttp, httpx on
asyncio, requests and httpx sync (:class:`OnThreads`), httpx on trio (:class:`OnTrio`)."""

STACKS = [
    stack
    for stack in ALL_STACKS
    if stack.name in os.environ.get("GQL_SERVICE_AUTH_STACKS", ALL_STACKS[0].name).split(",")
]
"""The stacks this run's behaviour suite runs on: ``GQL_SERVICE_AUTH_STACKS`` names them
(comma-separated; aiohttp alone by default; ``make test-stacks`` runs them all)."""

STACK_REASONS = {
    "kw": (
        "aiohttp's own keywords (client_session_args, its session's proxy, trace configs, "
        "response_class); the other stacks': test_stacks.py, test_stack_proxies.py"
    ),
    "sub": "gql's subscriptions over HTTP multipart are its aiohttp transport's alone",
    "aio": (
        "what gql's aiohttp transport is and says (its class, positional order, yarl URLs, "
        "its 401 text, its error types)"
    ),
    "loops": (
        "aiohttp's transports keep a session per event loop, so one transport serves loops "
        "and threads; gql's httpx transport holds one client (threads: test_stacks.py)"
    ),
    "upload": (
        "aiohttp's transports never send an upload twice, so it asks for a token with "
        "margin; httpx re-sends one whose files can seek (test_stacks.py)"
    ),
    "inflight": (
        "N requests in flight at once with one token: an async stack sends all N before "
        "the first answer; callers on threads start one by one, and those after the first "
        "refusal rightly wait for the renewal. Holding N in flight would take a server "
        "latency long enough for N threads to start, a timing this suite relies on only "
        "for a few (threads sharing one renewal: test_stacks.py, and test_bare_401.py's "
        "20 callers, of which 3 must be refused within its 0.1 s latency)"
    ),
    "abandon": (
        "gql's sync execute abandons an asyncio loop at execute_timeout: httpx2's sync "
        "client then leaks a socket, closed while another thread's request waits in its "
        "auth (gql's HTTPXTransport with any blocking httpx2.Auth does too); on trio, "
        "through OnTrio, the call goes on on the trio loop, and nothing abandons it"
    ),
    "cancel": (
        "cancelling the asyncio task of a sync call (or of a trio one) leaves the thread "
        "running: nothing of the package runs in the cancelled task, so the test would "
        "check nothing"
    ),
    "redirect": (
        "aiohttp follows redirects by default, httpx not (httpx's: test_stacks.py, "
        "test_redirects.py)"
    ),
}
"""Why a test runs on some stacks alone (``pytest.mark.stacks``)."""


KINDS = [stack.kind(method) for stack in STACKS for method in ("api_key", "oauth2")]
"""Our transports on every stack, for tests parametrized over them ("gql" adds gql's own)."""


def stack_and_method(kind: str) -> tuple[Stack, str]:
    """The stack and the method of a ``kind`` from :attr:`Stack.kind`."""
    name, _, method = kind.rpartition("-")
    return next(s for s in ALL_STACKS if s.name == (name or ALL_STACKS[0].name)), method


GQL_401 = "401, message='Unauthorized'"
"""What gql's own transport says of a bare 401 (aiohttp's ClientResponseError), and what
gql's tests match: how its TransportServerError for one starts."""

TESTS = str(Path(__file__).parent)
"""This folder: frames of its files hold the secrets tests look for, and are not scanned."""


def build_transport(
    kind: str, emulator: Emulator, url: str = "", **kwargs: Any
) -> AIOHTTPTransport:
    """A transport for the emulator's recent client, built from picklable arguments only.

    ``kind`` (see :attr:`Stack.kind`): ``"gql"`` (gql's own, with the API key header),
    ``"api_key"`` or ``"oauth2"``, on the default stack or prefixed with another's name.
    """
    client, url = emulator.recent_client, url or emulator.graphql_url
    stack, method = stack_and_method(kind)
    kwargs = {**stack.defaults, **kwargs}
    if method == "gql":
        key = f"SERVICE-API-KEY {client.client_id}:{client.client_secret}"
        return stack.gql(url, headers={"Authorization": key})  # type: ignore[no-any-return]
    kwargs |= {"client_id": client.client_id, "client_secret": client.client_secret}
    if method == "api_key":
        return stack.api_key(url, **kwargs)  # type: ignore[no-any-return]
    kwargs = {"token_url": emulator.token_url, "retry": NO_WAIT, **kwargs}
    return stack.oauth2(url, **kwargs)  # type: ignore[no-any-return]


def bare_401s(emulator: Emulator) -> None:
    """Refusals are HTTP 401 with no body from now on."""
    emulator.unauthenticated_status, emulator.unauthenticated_body = 401, False


def shown(exc: BaseException, secrets: Iterable[str]) -> list[str]:
    """:func:`secrets_shown`, the frames of the tests' own files left out."""
    return secrets_shown(exc, secrets, own=TESTS)


def unfolded(root: object, depth: int = 2) -> str:
    """What a debugger or a crash reporter shows of ``root``, unfolded ``depth`` levels down.

    ``repr(vars(x))`` of ``root`` and of every object its attributes hold, then theirs, down
    to ``depth`` (0: ``root``'s own). Objects without a ``__dict__`` (slots, builtin values)
    are seen through their repr only, as in ``vars`` of the object holding them. No
    attribute is named: private ones may be renamed without touching the tests.
    """
    texts = [_repr_or_note(root)]
    seen: set[int] = set()
    level: list[object] = [root]
    for _ in range(depth + 1):
        below: list[object] = []
        for obj in level:
            if id(obj) in seen or not hasattr(obj, "__dict__") or isinstance(obj, type):
                continue
            seen.add(id(obj))
            attributes = dict(vars(obj))
            texts.append(_repr_or_note(attributes))
            below += attributes.values()
        level = below
    return "\n".join(texts)


def _repr_or_note(obj: object) -> str:
    try:
        return repr(obj)
    except Exception:
        return "<repr raised>"


# -- Threads, event loops and forked children ---------------------------------------

Outcome = tuple[threading.Thread, list[object]]

LEFT_OPEN: list[str] = []
"""ResourceWarnings seen by collect_garbage during the current test."""


def collect_garbage() -> None:
    """Finalize garbage now, noting its ResourceWarnings for ``no_resource_left_open``.

    Left to chance, a leftover is finalized later, anywhere (even inside pytest's report of
    a failure), where ``filterwarnings = ["error"]`` turns its warning into another error.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    LEFT_OPEN.extend(str(w.message)[:70] for w in caught if w.category is ResourceWarning)


@contextlib.contextmanager
def connected(client: Client) -> Iterator[tuple[asyncio.AbstractEventLoop, Any]]:
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


def sync_execute(transport: AIOHTTPTransport, execute_timeout: float) -> object:
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


def start_thread(call: Callable[[], object]) -> Outcome:
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # handed to the test by finish
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def finish(started: Outcome, timeout: float = HANG_GUARD + 30) -> object:
    """What the thread's call returned or raised; fails if it runs longer than ``timeout``."""
    thread, outcome = started
    thread.join(timeout)
    assert not thread.is_alive(), f"the thread still ran after {timeout} s"
    collect_garbage()  # what the thread's loop left behind
    return outcome[0]


def poll(condition: Callable[[], bool], timeout: float = HANG_GUARD) -> bool:
    """Sleep-poll until ``condition()`` holds: whether it did within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def in_child(child: Callable[[], object], timeout: float) -> tuple[int, str]:
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


def blocking_execute(transport: OAuth2Transport) -> object:
    """gql's blocking ``Client.execute`` on a loop of this thread, closed afterwards."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Client(transport=transport, execute_timeout=10).execute(COUNT)
    except Exception as exc:  # reported by the caller's assertion
        return exc
    finally:
        asyncio.set_event_loop(None)
        loop.close()


# -- A real forward proxy: proxy.py on 127.0.0.1 -------------------------------------

PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


@dataclass(frozen=True)
class Proxy:
    """A running proxy.py: where it listens, and its access log."""

    url: str
    log: Path

    def forwarded(self, emulator: Emulator, path: str) -> bool:
        """Whether the access log shows a POST to ``path`` on ``emulator``."""
        host = URL(emulator.base_url).authority
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"POST {host}{path} " in text


@contextlib.contextmanager
def running_proxy(directory: Path, *options: str) -> Iterator[Proxy]:
    """proxy.py on 127.0.0.1 and a free port; stopped, children included, whatever happens."""
    directory.mkdir(parents=True, exist_ok=True)
    port_file, log = directory / "port", directory / "access.log"
    env = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARIABLES}
    with (directory / "output.txt").open("wb") as output:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", "0",
                "--port-file", str(port_file), "--num-acceptors", "1", "--num-workers", "1",
                "--log-file", str(log), "--data-dir", str(directory / "data"), *options,
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, so its workers go with it
        )  # fmt: skip
    try:
        # It writes the port file once listening; connections made before its workers
        # start wait in the listen backlog.
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                output_text = (directory / "output.txt").read_text(errors="replace")
                raise AssertionError(f"proxy.py did not start: {output_text[-2000:]}")
            time.sleep(0.02)
        yield Proxy(f"http://127.0.0.1:{port_file.read_text().split()[0]}", log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def set_http_proxy(monkeypatch: pytest.MonkeyPatch, url: str, no_proxy: str = "") -> None:
    """Name ``url`` as the environment's http proxy, and ``no_proxy`` its exceptions."""
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, url)
    if no_proxy:
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.setenv(name, no_proxy)


def via_proxy(emulator: Emulator, path: str) -> list[bool]:
    """For each request to ``path`` the emulator saw, whether proxy.py forwarded it (it
    adds ``Via: 1.1 proxy.py``)."""
    return [
        "proxy.py" in request.headers.get("Via", "")
        for request in emulator.requests
        if request.path == path
    ]


# -- Scripts in a fresh interpreter --------------------------------------------------


def run_python(
    code: str, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (no logging set up, nothing imported)."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(environ or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def quiet(stderr: str) -> str:
    """``stderr`` without asyncio's debug-mode notes of slow steps (a loaded machine)."""
    return "\n".join(
        line
        for line in stderr.splitlines()
        if not re.match(r"Executing <.*> took [0-9.]+ seconds$", line)
    )


ROOT = Path(__file__).resolve().parent.parent
"""The project's root, where scripts of :func:`run_script` run."""


def run_script(
    code: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with ``-X dev -W error``, from the project's root."""
    return subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


# What run_script()'s scripts of the token store start with: cfg from child_env(), and a
# transport(store) factory.
CHILD_PRELUDE = """
import asyncio, gc, json, os, sys, time, threading
sys.path.insert(0, "tests")
from gql import Client
from support import COUNT
from gql_service_auth import OAuth2Transport, RetryPolicy
from gql_service_auth.redis import RedisTokenStore
cfg = json.loads(os.environ["CFG"])
def transport(store, **kw):
    kw.setdefault("share_tokens", False)  # each stands in for a process of its own
    return OAuth2Transport(cfg["graphql_url"], token_url=cfg["token_url"],
        client_id=cfg["client_id"], client_secret=cfg["client_secret"],
        retry=RetryPolicy(wait_initial=0, wait_max=0, wait_jitter=0, timeout=2.0),
        token_store=store, **kw)
"""


def child_env(emulator: Emulator, redis_url: str) -> dict[str, str]:
    """The environment of a CHILD_PRELUDE script for the emulator and a Redis."""
    return {"CFG": json.dumps(fleet_config(emulator, redis_url))}


# -- The token store ------------------------------------------------------------------

SLOW_MACHINE = 10.0
"""Seconds of store timeout where a test counts requests rather than tests timeouts: the
store's 0.25 s default is a budget a loaded machine overruns, and each overrun is a token
request more (the process then fetches for itself)."""


def identity_of(emulator: Emulator, client: ClientRecord | None = None) -> TokenIdentity:
    """The identity under which with_store()'s transports share their token."""
    client = client or emulator.recent_client
    return TokenIdentity.of(
        token_url=emulator.token_url,
        client_id=client.client_id,
        client_secret=client.client_secret,
        scope=None,
        token_params={},
        auth_method="client_secret_post",
    )


async def token_of_its_own(emulator: Emulator) -> str:
    """A token the emulator issued to a transport with no store (as a peer would hold)."""
    peer = with_store(emulator, None)
    await query(peer)
    assert peer.token is not None
    return peer.token.value


@contextlib.contextmanager
def serving(add_routes: Callable[[Any], None]) -> Iterator[str]:
    """An aiohttp application on 127.0.0.1 and a thread of its own, its routes added by
    ``add_routes(app)``; its base URL. Stopped, whatever happens."""
    from aiohttp import web

    started: list[Any] = []  # its port, and how to stop it
    ready = threading.Event()

    async def serve() -> None:
        app = web.Application()
        add_routes(app)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            done, loop = asyncio.Event(), asyncio.get_running_loop()
            started.extend([runner.addresses[0][1], lambda: loop.call_soon_threadsafe(done.set)])
            ready.set()
            await done.wait()
        finally:
            await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(10), "the server did not start"
        yield f"http://127.0.0.1:{started[0]}"
    finally:
        if len(started) == 2:
            started[1]()
        thread.join(10)


async def _forwarded(request: Any, target: str, body: bytes) -> Any:
    """What ``target`` answers ``body`` POSTed with ``request``'s credentials and type."""
    from aiohttp import ClientSession, web

    headers = {"Content-Type": "application/json"}  # a GET the redirect led to has none
    headers.update(
        (name.title(), value)
        for name, value in request.headers.items()
        if name.lower() in ("authorization", "content-type", "accept")
    )
    async with (
        ClientSession() as session,
        session.post(target, data=body, headers=headers) as answer,
    ):
        return web.Response(
            status=answer.status, body=await answer.read(), content_type=answer.content_type
        )


@contextlib.contextmanager
def running_gateway(routes: Mapping[str, str]) -> Iterator[str]:
    """A gateway on 127.0.0.1 that forwards each path of ``routes`` to its URL (several
    APIs behind one origin); its base URL. Stopped, whatever happens."""
    from aiohttp import web

    async def forward(request: web.Request) -> web.Response:
        target = routes.get(request.path)
        if target is None:
            return web.Response(status=404)
        return await _forwarded(request, target, await request.read())  # type: ignore[no-any-return]

    with serving(lambda app: app.router.add_route("POST", "/{tail:.*}", forward)) as url:
        yield url


@dataclass
class Redirector:
    """A server whose ``/graphql`` answers every request with a redirect to ``/hop``.

    Attributes:
        graphql_url: Its ``/graphql``.
        ran: The requests ``/graphql`` answered: a server that answers with a redirect has
            run what it was sent.
        hops: The method of each request the redirect led to.
    """

    graphql_url: str
    ran: int = 0
    hops: list[str] = field(default_factory=list)


@contextlib.contextmanager
def running_redirector(api_url: str, status: int, body: object = None) -> Iterator[Redirector]:
    """A :class:`Redirector` on 127.0.0.1 answering ``status`` (with ``body`` as JSON, if
    given); ``/hop`` (any method) asks ``api_url`` the COUNT query with the hop's
    ``Authorization``, and answers what it answered: a refusal of the token, or the count.
    Stopped, whatever happens."""
    from aiohttp import web

    redirector = Redirector("")
    count = json.dumps({"query": "{ carriers(first: 1) { totalCount } }"}).encode()

    async def graphql(request: web.Request) -> web.Response:
        await request.read()
        redirector.ran += 1
        if body is None:
            return web.Response(status=status, headers={"Location": "/hop"})
        return web.json_response(body, status=status, headers={"Location": "/hop"})

    async def hop(request: web.Request) -> web.Response:
        await request.read()
        redirector.hops.append(request.method)
        return await _forwarded(request, api_url, count)  # type: ignore[no-any-return]

    def add_routes(app: web.Application) -> None:
        app.router.add_route("*", "/graphql", graphql)
        app.router.add_route("*", "/hop", hop)

    with serving(add_routes) as url:
        redirector.graphql_url = f"{url}/graphql"
        yield redirector


# -- Tenants, one of which an API refuses ----------------------------------------------

PAUSING = RetryPolicy(wait_initial=1, wait_max=4, wait_jitter=0)
"""While fresh tokens keep being refused, renewals pause 1 s, then 2 s, then 4 s each time:
no jitter, so every run has the same figures on the ManualClock."""


def tenants(emulator: Emulator, count: int) -> list[ClientRecord]:
    """``count`` new sets of credentials the emulator knows, each a tenant of its own."""
    registered = [
        ClientRecord.generate(f"emu-tenant-{len(emulator.clients) + number}", date(2025, 1, 15))
        for number in range(count)
    ]
    emulator.clients.update((client.client_id, client) for client in registered)
    return registered


def token_requests_of(emulator: Emulator, client: ClientRecord) -> int:
    """The token requests that named ``client`` in their form (``client_secret_post``)."""
    return sum(
        request.path == "/oauth2/token"
        and (request.form or {}).get("client_id") == client.client_id
        for request in emulator.requests
    )


def refused_tenant_cost(
    build: Callable[..., Any],
    call: Callable[[Any], object],
    emulator: Emulator,
    clock: ManualClock,
    *,
    per_call: bool,
    collected: bool = True,
    calls: int = 30,
) -> int:
    """The token requests of a tenant whose every token an API refuses: ``calls`` calls a
    second apart on the emulator's clock, each followed by a call of another tenant, on a
    transport per call (``per_call``) or on one for all.

    ``build(client, url=..., retry=...)`` makes a transport; ``call(transport)`` runs COUNT
    through gql's client and returns its answer or its error. ``collected``: the garbage
    collector runs after each call, as it may at any time in a program.
    """
    refused, *others = tenants(emulator, 4)
    # An API the tenant's project may not use: it knows none of the emulator's tokens.
    with Emulator().run_in_thread() as elsewhere:

        def refused_transport() -> Any:
            return build(refused, url=elsewhere.graphql_url, retry=PAUSING)

        one = None if per_call else refused_transport()
        for number in range(calls):
            transport = refused_transport() if one is None else one
            outcome = call(transport)
            assert isinstance(outcome, UnauthenticatedError), outcome
            assert call(build(others[number % len(others)])) == ANSWER
            del transport, outcome  # a per-call transport is gone, as in a helper
            if collected:
                collect_garbage()
            clock.advance(1)
    return token_requests_of(emulator, refused)
