"""Queries and helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gql import Client, FileVar, GraphQLRequest, gql
from gql.transport.aiohttp import AIOHTTPTransport

from gql_service_auth import AuthEvent, OAuth2Transport, RetryPolicy, TokenStore
from gql_service_auth.emulator import ClientRecord, Emulator

CARRIERS = gql("query { carriers(first: 10) { edges { node { id name } } } }")
"""The contract's authentication check query."""

COUNT = gql("query { carriers(first: 1) { totalCount } }")

RENAME = gql('mutation { renameCarrier(id: "carrier-001", name: "Renamed") { id name } }')

UPLOAD = gql("mutation ($file: Upload!) { uploadDocument(file: $file) { filename size } }")

UNAUTHENTICATED_ERROR = {"message": "expired", "extensions": {"code": "UNAUTHENTICATED"}}


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


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
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
    """Where any of ``secrets`` shows in ``exc``'s chain: traceback, str, repr, args, vars, locals.

    Locals too: crash reporters such as Sentry capture the local variables of each frame
    of a traceback by default. Frames of files whose path starts with ``own`` (the tests'
    own, which hold the secrets they look for) are left out.
    """
    secrets = [s for s in secrets if s]
    assert secrets, "nothing to look for: the scan would prove nothing"
    texts = {"traceback": "".join(traceback.format_exception(exc))}
    for link in _links(exc):
        name = type(link).__name__
        texts |= {f"str({name})": str(link), f"repr({name})": repr(link)}
        texts |= {f"args({name})": repr(link.args), f"vars({name})": repr(vars(link))}
        tb = link.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if not code.co_filename.startswith(own):
                where = f"locals({code.co_name}@{code.co_filename}:{id(tb.tb_frame)})"
                texts[where] = _safe_repr(tb.tb_frame.f_locals)
            tb = tb.tb_next
    return [where for where, text in texts.items() if any(s in text for s in secrets)]


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
    ``store``."""
    client = client or emulator.recent_client
    kwargs.setdefault("retry", STORE_RETRY)
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
