"""A service refusing every token: one renewal per wave of refusals, then growing pauses.

While fresh tokens keep being refused, re-sends wait pauses that double, calls made
during a pause fail at once without a token request, and an accepted answer ends them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from gql import Client
from support import (
    COUNT,
    settle,
    wait_until,
)

from gql_service_auth import (
    AuthEvent,
    OAuth2Transport,
    RetryPolicy,
    UnauthenticatedError,
)
from gql_service_auth.emulator import Emulator, ManualClock


@pytest.mark.parametrize("retry", [None, RetryPolicy()], ids=["zero-wait", "default-policy"])
async def test_concurrent_queries_refused_every_token_cost_at_most_one_renewal_per_wave(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    retry: RetryPolicy | None,
) -> None:
    """100 queries against a server refusing every token fetch at most 3 tokens, then fail."""
    emulator.refuse_all_tokens = True
    options = {} if retry is None else {"retry": retry}
    async with Client(transport=make_oauth2(**options)) as session:
        outcomes = await settle(*(session.execute(COUNT) for _ in range(100)))
    assert [type(o).__name__ for o in outcomes] == ["UnauthenticatedError"] * 100
    assert emulator.counters.token_requests <= 3


async def test_a_late_refusal_after_the_waves_renewal_was_refused_fetches_nothing(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A refusal arriving after its wave's renewal was refused too ends without a new fetch."""
    emulator.refuse_all_tokens = True
    async with Client(transport=make_oauth2()) as session:
        emulator.graphql_latency = 0.3
        late = asyncio.ensure_future(session.execute(COUNT))  # refused with token 1, late
        await wait_until(lambda: emulator.counters.graphql_requests == 1)
        emulator.graphql_latency = 0
        with pytest.raises(UnauthenticatedError):
            await session.execute(COUNT)  # token 1 refused, renewed to token 2, refused
        assert emulator.counters.token_requests == 2
        with pytest.raises(UnauthenticatedError):
            await asyncio.wait_for(late, 10)
    assert emulator.counters.token_requests == 2
    assert emulator.counters.graphql_requests == 3


async def test_a_new_call_during_the_cool_down_fails_without_a_token_request(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """After two fresh tokens are refused, a new call within the pause fails at once."""
    emulator.refuse_all_tokens = True
    policy = RetryPolicy(wait_initial=5, wait_max=5, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(UnauthenticatedError):
            await session.execute(COUNT)  # token 1 refused, renewed at once; token 2 refused
        with pytest.raises(UnauthenticatedError, match="paused"):
            await session.execute(COUNT)
    assert emulator.counters.token_requests == 2
    assert emulator.counters.graphql_requests == 2


async def test_renewal_pauses_grow_while_fresh_tokens_are_refused_and_end_on_acceptance(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
    clock: ManualClock,
) -> None:
    """Re-sends wait pauses that double per refused fresh token; an accepted answer ends them.

    On the transport's one clock: the test's ManualClock moves through the re-sends' waits,
    and ends the pause when advanced.
    """
    emulator.refuse_all_tokens = True
    policy = RetryPolicy(wait_initial=0.05, wait_max=1, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy, max_renewals=3)) as session:
        before = clock()
        with pytest.raises(UnauthenticatedError):
            await session.execute(COUNT)
        waits = [e.wait for e in events if e.name == "request_retry_scheduled"]
        assert waits == [0, pytest.approx(0.05, abs=0.02), pytest.approx(0.1, abs=0.02)]
        assert clock() - before == pytest.approx(sum(waits))  # waited on the clock
        assert emulator.counters.token_requests == 4
        emulator.refuse_all_tokens = False
        with pytest.raises(UnauthenticatedError, match="paused"):
            await session.execute(COUNT)  # 4 fresh refusals: paused for 0.2 s
        assert emulator.counters.token_requests == 4
        clock.advance(0.25)  # pauses are on the transport's clock, as lifetimes are
        await session.execute(COUNT)
        emulator.revoke_tokens()  # an accepted token refused later: renewed at once
        events.clear()
        await session.execute(COUNT)
    assert [e.wait for e in events if e.name == "request_retry_scheduled"] == [0]
    assert emulator.counters.token_requests == 6


async def test_without_backoff_waits_there_is_no_cool_down(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """With the zero-wait policy, each new call after a fresh refusal fetches a token."""
    emulator.refuse_all_tokens = True
    async with Client(transport=make_oauth2(max_renewals=0)) as session:
        for _ in range(2):
            with pytest.raises(UnauthenticatedError):
                await session.execute(COUNT)
    assert emulator.counters.token_requests == 2
