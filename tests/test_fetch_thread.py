"""The token fetch runs on a thread of its own: callers that give up, loops that end.

A caller's timeout, a short-lived event loop, a thread that cannot start, a replaced
``asyncio.run``: the fetch finishes for whoever still waits, and asyncio complains of
nothing left behind. Each test here also fails if it leaves a socket or session open.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from gql import Client
from support import (
    ANSWER,
    COUNT,
    LEFT_OPEN,
    STACK_REASONS,
    Outcome,
    collect_garbage,
    finish,
    no_fetch_thread,
    poll,
    start_thread,
    sync_execute,
    wait_until,
)

from gql_service_auth import (
    AuthEvent,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
)
from gql_service_auth.emulator import Emulator

pytestmark = pytest.mark.usefixtures("no_resource_left_open")


def _asyncio_complaints(caplog: pytest.LogCaptureFixture) -> list[str]:
    """asyncio's error records and the ResourceWarnings, once garbage is collected."""
    collect_garbage()
    records = [
        r.getMessage().split("\n")[0]
        for r in caplog.records
        if r.name == "asyncio" and r.levelno >= logging.WARNING
    ]
    return [*records, *LEFT_OPEN]


@pytest.mark.stacks("aiohttp", "httpx", "requests", reason=STACK_REASONS["abandon"])
def test_a_fetch_abandoned_by_a_timed_out_sync_execute_does_not_block_other_threads(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """After a sync execute times out mid-fetch, another thread's query succeeds, one token."""
    emulator.token_latency = 0.5
    transport = make_oauth2(retry=RetryPolicy(timeout=120, wait_initial=0, wait_max=0))
    assert isinstance(finish(start_thread(lambda: sync_execute(transport, 0.2))), TimeoutError)
    # A caller stuck behind the abandoned fetch would wait up to twice the policy's 120 s.
    assert finish(start_thread(lambda: sync_execute(transport, 60))) == ANSWER
    assert emulator.counters.token_requests == 1


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
def test_a_caller_on_a_live_loop_outlasts_fetches_abandoned_by_short_lived_loops(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Three short-lived loops start and abandon the fetch in turn; a live loop's caller wins."""
    emulator.token_latency = 2.0
    transport = make_oauth2()

    def short_lived() -> Outcome:
        # asyncio.run cancels what is left on its loop once the query has timed out.
        client = Client(transport=transport, execute_timeout=0.5)
        return start_thread(lambda: asyncio.run(client.execute_async(COUNT)))

    def until_it_fetches_or_ends(fetches: int, thread: threading.Thread) -> None:
        poll(lambda: emulator.counters.token_requests == fetches or not thread.is_alive())

    loop = asyncio.new_event_loop()
    try:
        abandoning = short_lived()
        assert poll(lambda: emulator.counters.token_requests == 1)
        client = Client(transport=transport, execute_timeout=20)
        caller = loop.create_task(client.execute_async(COUNT))
        loop.run_until_complete(asyncio.sleep(0.1))  # the caller now waits for that fetch
        for fetches in (2, 3):
            # The caller's loop is busy (here: not stepped) while one short-lived loop ends
            # and the next one calls: a moment any loop doing real work has.
            finish(abandoning)
            abandoning = short_lived()
            until_it_fetches_or_ends(fetches, abandoning[0])
            loop.run_until_complete(asyncio.sleep(0.1))
        finish(abandoning)
        result = loop.run_until_complete(asyncio.wait_for(caller, 10))
    finally:
        loop.close()
    assert result == ANSWER


@pytest.mark.stacks("aiohttp", "httpx", reason=STACK_REASONS["cancel"])
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


@pytest.mark.stacks("aiohttp", "httpx", "requests", reason=STACK_REASONS["abandon"])
def test_no_asyncio_error_is_logged_when_a_timed_out_sync_execute_abandons_a_fetch(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sync execute times out mid-fetch and its loop closes: asyncio logs nothing."""
    emulator.token_latency = 0.5
    call = functools.partial(sync_execute, make_oauth2(), 0.2)
    assert isinstance(finish(start_thread(call)), TimeoutError)
    poll(lambda: bool(events), 2)  # where the fetch can still finish, let it
    del call  # the last reference to the transport
    assert _asyncio_complaints(caplog) == []


def test_a_fetch_falls_back_to_the_callers_loop_when_no_thread_can_start(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No thread to be had (pids limit, shutdown): the fetch runs on the caller's loop."""
    real_start = no_fetch_thread(monkeypatch)
    transport = make_oauth2()
    assert sync_execute(transport, 5) == ANSWER
    emulator.revoke_tokens()
    emulator.token_latency = 0.5
    # That caller gives up mid-fetch and its loop stops; its fetch was its own only.
    assert isinstance(sync_execute(transport, 0.2), TimeoutError)
    emulator.token_latency = 0
    monkeypatch.setattr(threading.Thread, "start", real_start)
    # A call stuck behind the stopped loop's fetch would hang: 60 s guard against it.
    assert finish(start_thread(lambda: sync_execute(transport, 60))) == ANSWER


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
    assert sync_execute(transport, 5) == ANSWER


async def test_a_connector_factory_handing_out_a_connector_of_the_callers_loop_fails_clearly(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The fetch runs on a loop of its own: a connector of the caller's loop is refused as
    such, and left open for its owner, rather than closed from the fetch's thread."""
    mine = aiohttp.TCPConnector()  # bound to this test's loop
    try:
        transport = make_oauth2(token_session_args={"connector": lambda: mine})
        with pytest.raises(TokenRequestError, match="another event loop") as caught:
            async with Client(transport=transport) as session:
                await session.execute(COUNT)
        assert not caught.value.retryable
        assert "functools.partial" in str(caught.value)
        assert not mine.closed
    finally:
        await mine.close()
    assert emulator.counters.token_requests == 0
