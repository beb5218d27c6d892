"""What the aiohttp transports rely on in aiohttp itself, checked against the installed one.

``OAuth2Transport`` sets the token as a default header of its loop's session right before
gql's ``execute`` (``_aiohttp.install_token``). That is safe with concurrent requests only
because aiohttp copies a session's default headers into the request before its first
await: a request then carries the header set when it started, whatever another request
on the loop sets next. If an aiohttp release ever awaited first, this test fails.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import aiohttp

from gql_service_auth.emulator import Emulator


async def finish(steps: Generator[Any, None, Any], first: Any) -> Any:
    """Go on with a coroutine stepped by hand, on the running loop, to its end."""
    waiting = first
    for _ in range(10_000):  # each step waits for one future: bounded
        if waiting is not None:
            # A future it yielded, as a Task would take it: marked taken, then awaited.
            waiting._asyncio_future_blocking = False
            await waiting
        try:
            waiting = steps.send(None)
        except StopIteration as done:
            return done.value
    raise AssertionError("the request did not finish in 10,000 steps")


async def test_aiohttp_copies_the_default_headers_before_its_first_await(
    emulator: Emulator,
) -> None:
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer first"}) as session:
        steps = session.post(f"{emulator.base_url}/graphql", json={"query": "{ count }"})
        stepping = steps.__await__()
        first = stepping.send(None)  # runs up to aiohttp's first await: nothing sent yet
        session.headers["Authorization"] = "Bearer second"
        response = await finish(stepping, first)
        response.release()
    seen = [r.headers.get("Authorization") for r in emulator.requests if r.path == "/graphql"]
    assert seen == ["Bearer first"]
