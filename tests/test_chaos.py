"""Chaos: cancellations, threads and batches while tokens expire and renew."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable

from gql import Client
from support import COUNT

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import Emulator, ManualClock


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
