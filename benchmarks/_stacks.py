"""Figure 11: gql's requests and httpx transports, ours against gql's with a fixed header.

Per stack, the client's CPU time per request (``time.process_time``) of our API key and
OAuth2 transports against gql's same transport sending a fixed ``Authorization`` header,
in blocks interleaved in a shuffled order each round, against the lean server in its own
process; and the herd: concurrent callers on a cold OAuth2 transport while the token
endpoint takes 50 ms, and how many token requests they made.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gql import Client, gql
from gql.transport.httpx import HTTPXAsyncTransport, HTTPXTransport
from gql.transport.requests import RequestsHTTPTransport

from gql_service_auth.httpx import (
    ApiKeyHTTPXAsyncTransport,
    ApiKeyHTTPXTransport,
    OAuth2HTTPXAsyncTransport,
    OAuth2HTTPXTransport,
)
from gql_service_auth.requests import ApiKeyRequestsTransport, OAuth2RequestsTransport

QUERY = gql("query { carriers(first: 1) { totalCount } }")
CREDENTIALS = {"client_id": "bench", "client_secret": "secret"}
HEADER = {"Authorization": "Bearer lean-fixed"}
CONCURRENCY = 20  # the async stack's callers at a time

# name: (gql's class, our API key class, our OAuth2 class, async)
STACKS: dict[str, tuple[type[Any], type[Any], type[Any], bool]] = {
    "requests": (RequestsHTTPTransport, ApiKeyRequestsTransport, OAuth2RequestsTransport, False),
    "httpx": (HTTPXTransport, ApiKeyHTTPXTransport, OAuth2HTTPXTransport, False),
    "httpx async": (
        HTTPXAsyncTransport,
        ApiKeyHTTPXAsyncTransport,
        OAuth2HTTPXAsyncTransport,
        True,
    ),
}


BASELINE = "gql, header per request"
"""What the ratios are against: gql's transport sending the header with each request, as
ours send theirs (a token changes; a fixed header is the client's default, merged once)."""


class _HeaderPerRequest:
    """A session of gql's transport whose every call sends ``HEADER`` (``extra_args``)."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def execute(self, request: Any) -> Any:
        # Returned as it is: the sync session's answer, or the async one's coroutine.
        return self._session.execute(request, extra_args={"headers": HEADER})


def _contenders(stack: str, url: str, token_url: str) -> dict[str, Callable[[], Any]]:
    gql_class, api_key, oauth2, _ = STACKS[stack]
    return {
        BASELINE: lambda: gql_class(url),
        "gql, fixed header": lambda: gql_class(url, headers=HEADER),
        "API key": lambda: api_key(url, **CREDENTIALS),
        "OAuth2": lambda: oauth2(url, token_url=token_url, share_tokens=False, **CREDENTIALS),
    }


def _sync_block(session: Any, count: int) -> None:
    for _ in range(count):
        session.execute(QUERY)


async def _async_block(session: Any, count: int) -> None:
    for start in range(0, count, CONCURRENCY):
        size = min(CONCURRENCY, count - start)
        await asyncio.gather(*(session.execute(QUERY) for _ in range(size)))


def _sessions(stack: str, makers: dict[str, Callable[[], Any]]) -> Iterator[dict[str, Any]]:
    """Connected sync sessions, one per contender (a generator: closed on the way out)."""
    clients = {name: Client(transport=make()) for name, make in makers.items()}
    sessions = {name: _session_of(name, client.connect_sync()) for name, client in clients.items()}
    try:
        yield sessions
    finally:
        for client in clients.values():
            client.close_sync()


def per_request(url: str, token_url: str, requests: int, rounds: int) -> dict[str, Any]:
    """Client CPU per request of each stack's contenders, interleaved by round."""
    order = random.Random(1337)
    block = min(200, requests)
    figures: dict[str, Any] = {}
    for stack, (_, _, _, is_async) in STACKS.items():
        makers = _contenders(stack, url, token_url)
        cpu: dict[str, list[float]] = {name: [] for name in makers}
        if is_async:
            asyncio.run(_async_rounds(makers, cpu, block, rounds, order))
        else:
            sessions_of = _sessions(stack, makers)
            sessions = next(sessions_of)
            try:
                for session in sessions.values():
                    _sync_block(session, 20)  # warm up: token, pool
                for _ in range(rounds):
                    names = list(makers)
                    order.shuffle(names)
                    for name in names:
                        cpu[name].append(_timed(_sync_block, sessions[name], block))
            finally:
                sessions_of.close()
        figures[stack] = _summary(cpu, block)
    return figures


async def _async_rounds(
    makers: dict[str, Callable[[], Any]],
    cpu: dict[str, list[float]],
    block: int,
    rounds: int,
    order: random.Random,
) -> None:
    clients = {name: Client(transport=make()) for name, make in makers.items()}
    sessions = {
        name: _session_of(name, await client.connect_async()) for name, client in clients.items()
    }
    try:
        for session in sessions.values():
            await _async_block(session, 40)
        for _ in range(rounds):
            names = list(makers)
            order.shuffle(names)
            for name in names:
                gc.collect()
                gc.disable()
                try:
                    started = time.process_time()
                    await _async_block(sessions[name], block)
                    cpu[name].append(time.process_time() - started)
                finally:
                    gc.enable()
    finally:
        for client in clients.values():
            await client.close_async()


def _session_of(name: str, session: Any) -> Any:
    return _HeaderPerRequest(session) if name == BASELINE else session


def _timed(work: Callable[[Any, int], None], session: Any, count: int) -> float:
    gc.collect()
    gc.disable()
    try:
        started = time.process_time()
        work(session, count)
        return time.process_time() - started
    finally:
        gc.enable()


def _summary(cpu: dict[str, list[float]], block: int) -> dict[str, Any]:
    base = cpu[BASELINE]
    rows: dict[str, Any] = {}
    for name, values in cpu.items():
        paired = [(c - b) / block * 1e6 for c, b in zip(values, base, strict=True)]
        rows[name] = {
            "client_cpu_us_per_request": round(statistics.median(values) / block * 1e6, 1),
            "extra_cpu_us_per_request": round(statistics.median(paired), 1),
            "cpu_ratio": round(statistics.median(base) / statistics.median(values), 3),
        }
    return rows


def herd(
    url: str, token_url: str, callers: int, token_requests: Callable[[], int]
) -> dict[str, Any]:
    """``callers`` concurrent queries on a cold OAuth2 transport of each stack."""
    rows: dict[str, Any] = {}
    for stack, (_, _, oauth2, is_async) in STACKS.items():
        before = token_requests()
        transport = oauth2(url, token_url=token_url, share_tokens=False, **CREDENTIALS)
        failed = (
            asyncio.run(_async_herd(transport, callers))
            if is_async
            else _sync_herd(transport, callers)
        )
        rows[stack] = {"token_requests": token_requests() - before, "failed": failed}
    return rows


def _sync_herd(transport: Any, callers: int) -> int:
    def attempt(session: Any) -> int:
        try:
            session.execute(QUERY)
        except Exception:
            return 1
        return 0

    with Client(transport=transport) as session, ThreadPoolExecutor(callers) as pool:
        return sum(pool.map(attempt, [session] * callers))


async def _async_herd(transport: Any, callers: int) -> int:
    async with Client(transport=transport) as session:
        results = await asyncio.gather(
            *(session.execute(QUERY) for _ in range(callers)), return_exceptions=True
        )
    return sum(isinstance(result, BaseException) for result in results)


def print_figure(rows: dict[str, Any]) -> None:
    print(
        "11. gql's other stacks: client CPU per request against gql's same transport sending "
        "the header with each request (goal: ratio >= 0.99); herd on a cold token (goal: 1 "
        "token request)"
    )
    for stack, contenders in rows["per request"].items():
        cells = "; ".join(
            f"{name} {row['client_cpu_us_per_request']:.0f} us"
            + (
                ""
                if name == BASELINE
                else f" ({row['extra_cpu_us_per_request']:+.1f}, ratio {row['cpu_ratio']:.3f})"
            )
            for name, row in contenders.items()
        )
        herd_row = rows["herd"][stack]
        print(
            f"    {stack:<12} {cells}; herd of {rows['callers']}: "
            f"{herd_row['token_requests']} token request(s), {herd_row['failed']} failed"
        )
