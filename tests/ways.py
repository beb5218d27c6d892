"""Every stack, each with a way to run calls through gql's client.

A :class:`Way` runs a list of calls concurrently through one gql session of a transport:
on threads for the sync transports (gql's sync session), on asyncio or trio for
``HTTPXAsyncTransport``, on asyncio for aiohttp's. Each call's answer, or the exception it
raised, comes back in order, so one test body checks the same behaviour on every stack.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import trio
from gql import Client, GraphQLRequest

from gql_service_auth import ApiKeyTransport, OAuth2Transport
from gql_service_auth.httpx import (
    ApiKeyHTTPXAsyncTransport,
    ApiKeyHTTPXTransport,
    OAuth2HTTPXAsyncTransport,
    OAuth2HTTPXTransport,
)
from gql_service_auth.requests import ApiKeyRequestsTransport, OAuth2RequestsTransport

DEADLINE = 30.0
"""Seconds a run may take, whatever happens: no test waits without end."""


@dataclass(frozen=True)
class Call:
    """One call to make through the session: ``execute`` or ``execute_batch``."""

    request: GraphQLRequest | list[GraphQLRequest]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def sync(self, session: Any) -> object:
        if isinstance(self.request, list):
            return session.execute_batch(self.request, **self.kwargs)
        return session.execute(self.request, **self.kwargs)

    async def run_async(self, session: Any) -> object:
        if isinstance(self.request, list):
            return await session.execute_batch(self.request, **self.kwargs)
        return await session.execute(self.request, **self.kwargs)


def calls(
    request: GraphQLRequest | list[GraphQLRequest], times: int = 1, **kwargs: Any
) -> list[Call]:
    return [Call(request, kwargs) for _ in range(times)]


@dataclass(frozen=True)
class Way:
    """A stack's transports and how its calls run.

    Attributes:
        name: The test id.
        api_key, oauth2: The transport classes.
        loop: ``None`` (threads), ``"asyncio"`` or ``"trio"``.
        replays_uploads: Whether a refused upload with seekable files is sent again.
    """

    name: str
    api_key: type[Any]
    oauth2: type[Any]
    loop: str | None
    replays_uploads: bool

    def run(self, transport: Any, todo: Sequence[Call]) -> list[object]:
        """Each call's answer or exception, all made at once through one session."""
        if self.loop is None:
            return _on_threads(transport, todo)
        if self.loop == "asyncio":
            return asyncio.run(asyncio.wait_for(_on_asyncio(transport, todo), DEADLINE))
        return trio.run(_on_trio, transport, todo)

    def one(self, transport: Any, call: Call) -> object:
        """The answer of one call; what it raised is raised."""
        (outcome,) = self.run(transport, [call])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def _on_threads(transport: Any, todo: Sequence[Call]) -> list[object]:
    def attempt(call: Call, session: Any) -> object:
        try:
            return call.sync(session)
        except Exception as exc:
            return exc

    with Client(transport=transport) as session, ThreadPoolExecutor(len(todo)) as pool:
        futures = [pool.submit(attempt, call, session) for call in todo]
        return [future.result(DEADLINE) for future in futures]


async def _on_asyncio(transport: Any, todo: Sequence[Call]) -> list[object]:
    async with Client(transport=transport) as session:
        return await asyncio.gather(
            *(call.run_async(session) for call in todo), return_exceptions=True
        )


async def _on_trio(transport: Any, todo: Sequence[Call]) -> list[object]:
    results: list[object] = [None] * len(todo)

    async def attempt(index: int, call: Call, session: Any) -> None:
        try:
            results[index] = await call.run_async(session)
        except Exception as exc:
            results[index] = exc

    with trio.fail_after(DEADLINE):
        async with Client(transport=transport) as session, trio.open_nursery() as nursery:
            for index, call in enumerate(todo):
                nursery.start_soon(attempt, index, call, session)
    return results


WAYS = [
    Way("requests", ApiKeyRequestsTransport, OAuth2RequestsTransport, None, False),
    Way("httpx", ApiKeyHTTPXTransport, OAuth2HTTPXTransport, None, True),
    Way("httpx-asyncio", ApiKeyHTTPXAsyncTransport, OAuth2HTTPXAsyncTransport, "asyncio", True),
    Way("httpx-trio", ApiKeyHTTPXAsyncTransport, OAuth2HTTPXAsyncTransport, "trio", True),
]

AIOHTTP = Way("aiohttp", ApiKeyTransport, OAuth2Transport, "asyncio", False)
"""aiohttp's transports, which the behaviour suite covers through ``support.STACKS``."""

EVERY_WAY = [AIOHTTP, *WAYS]
"""Every stack, for the few tests written once for all four."""
