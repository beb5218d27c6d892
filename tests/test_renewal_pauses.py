"""A service refusing every token: one renewal per wave of refusals, then growing pauses.

While fresh tokens keep being refused, re-sends wait pauses that double, calls made
during a pause fail at once without a token request, and an accepted answer ends them.
What the refusals taught outlives the transports: built one per call, on threads or in a
forked child, they cost what one long-lived transport costs.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import pytest
from gql import Client
from support import (
    ANSWER,
    COUNT,
    PAUSING,
    STACK_REASONS,
    blocking_execute,
    collect_garbage,
    finish,
    in_child,
    refused_tenant_cost,
    settle,
    start_thread,
    tenants,
    token_requests_of,
    wait_until,
)

from gql_service_auth import (
    AuthEvent,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
    UnauthenticatedError,
)
from gql_service_auth._core.constants import SHARED_PAUSES_KEPT
from gql_service_auth.emulator import ClientRecord, Emulator, ManualClock


@pytest.mark.stacks("aiohttp", "httpx", reason=STACK_REASONS["inflight"])
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


@pytest.mark.parametrize("collected", [True, False], ids=["collected", "left-to-the-collector"])
def test_transports_built_per_call_cost_what_one_transport_costs_while_fresh_tokens_are_refused(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    clock: ManualClock,
    collected: bool,
) -> None:
    """A transport per call for credentials an API refuses, other tenants' built and used
    in between: the pauses hold, each renewal after one grows the next, and the token
    requests are those of one long-lived transport (before: 2 per call)."""

    def cost(*, per_call: bool) -> int:
        return refused_tenant_cost(
            make_oauth2, blocking_execute, emulator, clock, per_call=per_call, collected=collected
        )

    assert cost(per_call=True) == cost(per_call=False) == 18


def _refused_call(
    make_oauth2: Callable[..., OAuth2Transport], client: ClientRecord, api: Emulator, **kwargs: Any
) -> object:
    """A per-call transport's outcome: ``client``'s query to ``api``, which refuses it."""
    transport = make_oauth2(client, url=api.graphql_url, retry=PAUSING, **kwargs)
    return blocking_execute(transport)


def test_transports_built_per_call_on_threads_cost_one_wave_while_fresh_tokens_are_refused(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Eight threads at a time, five times, each build a transport per call for credentials
    an API refuses and one for another tenant, the collector run in between: one wave of
    token requests in all, then every call fails at once.

    Not sent again (``max_renewals=0``): a re-send waits out the pause on the clock, which
    would end it for every thread, as it would for threads sharing one transport.
    """
    refused, *others = tenants(emulator, 4)
    with Emulator().run_in_thread() as elsewhere:

        def calls(number: int) -> tuple[str, object]:
            outcome = _refused_call(make_oauth2, refused, elsewhere, max_renewals=0)
            return type(outcome).__name__, blocking_execute(make_oauth2(others[number % 3]))

        for _ in range(5):
            started = [start_thread(functools.partial(calls, number)) for number in range(8)]
            outcomes = [finish(thread) for thread in started]  # the collector runs as each ends
            assert outcomes == [("UnauthenticatedError", ANSWER)] * 8
    assert token_requests_of(emulator, refused) <= 3


def _paused_per_call(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], api: Emulator
) -> ClientRecord:
    """A tenant whose per-call transport ``api`` refused, renewals paused, and then gone:
    another tenant's transport built since, and the collector run."""
    refused, other = tenants(emulator, 2)
    assert isinstance(_refused_call(make_oauth2, refused, api), UnauthenticatedError)
    make_oauth2(other)
    collect_garbage()
    assert token_requests_of(emulator, refused) == 2
    return refused


def test_a_forked_child_goes_on_from_the_pause_its_parent_learned(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A child forked while renewals pause for refused credentials fails at once too,
    fetching nothing, as it would with its parent's transport."""
    with Emulator().run_in_thread() as elsewhere:
        refused = _paused_per_call(emulator, make_oauth2, elsewhere)

        def child() -> None:
            outcome = _refused_call(make_oauth2, refused, elsewhere)
            assert isinstance(outcome, UnauthenticatedError), outcome
            assert "paused" in str(outcome)

        assert in_child(child, timeout=20) == (0, "ok")
    assert token_requests_of(emulator, refused) == 2


def test_a_transport_that_keeps_its_tokens_to_itself_keeps_its_pauses_too(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """share_tokens=False: while the shared transports of refused credentials are paused,
    one that opted out fetches and renews for itself, as another process would."""
    with Emulator().run_in_thread() as elsewhere:
        refused = _paused_per_call(emulator, make_oauth2, elsewhere)
        assert "paused" in str(_refused_call(make_oauth2, refused, elsewhere))
        outcome = _refused_call(make_oauth2, refused, elsewhere, share_tokens=False)
        assert isinstance(outcome, UnauthenticatedError)
        assert "paused" not in str(outcome)
    assert token_requests_of(emulator, refused) == 4


def test_another_secret_does_not_go_on_from_the_pause_of_one(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The same client id with another secret is not paused by the first one's refusals:
    its own token request, refused as invalid_client."""
    with Emulator().run_in_thread() as elsewhere:
        refused = _paused_per_call(emulator, make_oauth2, elsewhere)
        wrong = ClientRecord(refused.client_id, "not-the-secret")
        outcome = _refused_call(make_oauth2, wrong, elsewhere)
    assert isinstance(outcome, TokenRequestError)
    assert outcome.error == "invalid_client"
    assert token_requests_of(emulator, refused) == 3


def test_the_process_remembers_the_pauses_of_a_bounded_number_of_credentials(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Per-call transports of one more set of refused credentials than the process keeps
    pauses for: the least recently refused is forgotten, and fetches anew; the next one
    still fails at once."""
    refused = tenants(emulator, SHARED_PAUSES_KEPT + 2)
    with Emulator().run_in_thread() as elsewhere:
        for client in refused:  # each one's transport lets the previous one's manager go
            assert isinstance(_refused_call(make_oauth2, client, elsewhere), UnauthenticatedError)
            collect_garbage()
        second = _refused_call(make_oauth2, refused[1], elsewhere)
        first = _refused_call(make_oauth2, refused[0], elsewhere)
    assert "paused" in str(second)
    assert "paused" not in str(first)
    assert [token_requests_of(emulator, client) for client in refused[:2]] == [4, 2]
