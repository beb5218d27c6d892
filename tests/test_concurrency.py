"""Cancellation, event loops and threads around one transport's token cache.

Also chaos: threads, random cancellations and batches while tokens expire and renew.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable

import pytest
from gql import Client
from support import (
    ANSWER,
    COUNT,
    STACK_REASONS,
    execute_on_threads,
    wait_until,
)

from gql_service_auth import (
    OAuth2Transport,
    TokenRequestError,
)
from gql_service_auth.emulator import Emulator, ManualClock


@pytest.mark.stacks("aiohttp", "httpx", reason=STACK_REASONS["cancel"])
async def test_cancelling_the_caller_that_started_the_fetch_spares_the_others(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The first caller is cancelled mid-fetch; the other callers still get the one token."""
    emulator.token_latency = 0.2
    async with Client(transport=make_oauth2()) as session:
        starter = asyncio.ensure_future(session.execute(COUNT))
        await wait_until(lambda: emulator.counters.token_requests == 1)
        others = [asyncio.ensure_future(session.execute(COUNT)) for _ in range(20)]
        await asyncio.sleep(0)
        starter.cancel()
        results = await asyncio.gather(*others)
        assert starter.cancelled()
    assert len(results) == 20
    assert emulator.counters.token_requests == 1


@pytest.mark.stacks("aiohttp", "httpx", reason=STACK_REASONS["cancel"])
async def test_cancelling_a_waiter_spares_the_fetch(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A waiting caller is cancelled; the fetch completes and serves the starter."""
    emulator.token_latency = 0.2
    async with Client(transport=make_oauth2()) as session:
        starter = asyncio.ensure_future(session.execute(COUNT))
        await wait_until(lambda: emulator.counters.token_requests == 1)
        waiter = asyncio.ensure_future(session.execute(COUNT))
        await asyncio.sleep(0.01)
        waiter.cancel()
        result = await starter
    assert result["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 1


@pytest.mark.stacks("aiohttp", "httpx", reason=STACK_REASONS["cancel"])
async def test_a_cancelled_fetch_is_replaced_by_the_next_caller(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """When the only caller is cancelled, the next call fetches anew and does not fail."""
    emulator.token_latency = 0.1
    async with Client(transport=make_oauth2()) as session:
        lonely = asyncio.ensure_future(session.execute(COUNT))
        await wait_until(lambda: emulator.counters.token_requests == 1)
        lonely.cancel()
        result = await session.execute(COUNT)
    assert result["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests <= 2


def test_sync_execute_from_two_threads_shares_the_token(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Threads with their own event loops reuse one cached token, and renew it once."""
    transport = make_oauth2()
    assert execute_on_threads(transport) == []
    assert execute_on_threads(transport) == []
    assert emulator.counters.token_requests == 1
    clock.advance(emulator.token_ttl)
    assert execute_on_threads(transport) == []
    assert execute_on_threads(transport) == []
    assert emulator.counters.token_requests == 2
    assert emulator.counters.graphql_requests == 4


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
async def test_callers_on_two_loops_share_one_fetch(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A fetch started on one loop serves a caller on another loop in another thread."""
    emulator.token_latency = 0.3
    transport = make_oauth2()
    first = asyncio.ensure_future(Client(transport=transport).execute_async(COUNT))
    await wait_until(lambda: emulator.counters.token_requests == 1)  # in flight, this loop's
    other: list[object] = []

    def on_another_loop() -> None:
        other.append(asyncio.run(Client(transport=transport).execute_async(COUNT)))

    thread = threading.Thread(target=on_another_loop)
    thread.start()
    result = await first
    await asyncio.get_running_loop().run_in_executor(None, thread.join, 5)
    assert other == [result]
    sent = [r.headers["Authorization"] for r in emulator.requests if r.path == "/graphql"]
    assert len(sent) == 2
    assert len(set(sent)) == 1  # one token for both
    assert emulator.counters.token_requests == 1


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
def test_a_fetch_outlives_the_loop_that_asked_for_it(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A caller's loop stops mid-fetch: the fetch runs on, and serves the next caller."""
    emulator.token_latency = 0.3
    transport = make_oauth2()
    stopped = asyncio.new_event_loop()
    try:
        # Ask for a token, then stop the loop before the answer: as gql's sync execute does
        # when its execute_timeout strikes.
        task = stopped.create_task(Client(transport=transport).execute_async(COUNT))
        stopped.run_until_complete(wait_until(lambda: emulator.counters.token_requests == 1))
        assert asyncio.run(Client(transport=transport).execute_async(COUNT)) == ANSWER
        assert emulator.counters.token_requests == 1
        task.cancel()
        stopped.run_until_complete(asyncio.gather(task, return_exceptions=True))
    finally:
        stopped.close()


@pytest.mark.usefixtures("no_resource_left_open")
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


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
def test_threads_share_one_transport_concurrently(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Four threads run sync Client.execute at once on one transport: all succeed, one token."""
    emulator.graphql_latency = 0.005
    transport = make_oauth2()
    start = threading.Barrier(4)
    errors: list[BaseException] = []
    done = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal done
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            start.wait(10)
            for _ in range(15):
                Client(transport=transport).execute(COUNT)
                with lock:
                    done += 1
        except BaseException as exc:  # surfaced by the assertions below
            errors.append(exc)
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    for round_ in range(2):
        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        assert emulator.counters.token_requests == round_ + 1
        clock.advance(emulator.token_ttl)  # the next round must renew, once
    assert done == 120


@pytest.mark.stacks("aiohttp", "httpx", reason=STACK_REASONS["cancel"])
async def test_random_cancellations_never_break_the_others(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Callers cancelled at random mid-fetch: the rest succeed, with one fetch per lifetime."""
    chance = random.Random(20261121)
    emulator.token_latency = 0.02
    rounds = 5
    async with Client(transport=make_oauth2()) as session:
        for _ in range(rounds):
            tasks = [asyncio.ensure_future(session.execute(COUNT)) for _ in range(100)]
            for _ in range(30):
                await asyncio.sleep(chance.uniform(0, 0.004))
                chance.choice(tasks).cancel()
            results = await asyncio.wait_for(
                asyncio.gather(*tasks, return_exceptions=True), timeout=30
            )
            failures = [
                r
                for r in results
                if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)
            ]
            assert failures == []
            assert any(isinstance(r, dict) for r in results)
            clock.advance(emulator.token_ttl)
        # The round after the last expiry still works: no stale error was kept.
        await session.execute(COUNT)
    assert emulator.counters.token_requests == rounds + 1


async def test_batches_in_flight_during_a_renewal(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Client-side batches refused after a revocation are renewed once and all answered."""
    async with Client(transport=make_oauth2(), batch_interval=0.01) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        emulator.graphql_latency = 0.01
        results = await asyncio.wait_for(
            asyncio.gather(*(session.execute(COUNT) for _ in range(60))), timeout=30
        )
    assert [r["carriers"]["totalCount"] for r in results] == [25] * 60
    assert emulator.counters.token_requests == 2
