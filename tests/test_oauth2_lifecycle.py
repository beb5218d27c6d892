"""OAuth2Transport: lazy single-flight fetch and early renewal of tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

import pytest
from gql import Client
from support import CARRIERS, COUNT, HANG_GUARD, renewed, wait_until

from gql_service_auth import AuthEvent, OAuth2Transport
from gql_service_auth.emulator import Emulator, ManualClock


async def test_no_token_is_fetched_before_the_first_request(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Building and connecting fetch nothing; the first query fetches one token."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        assert emulator.counters.token_requests == 0
        await session.execute(CARRIERS)
    assert emulator.counters.token_requests == 1
    assert [r.auth_scheme for r in emulator.requests if r.path == "/graphql"] == ["Bearer"]


async def test_thousand_concurrent_queries_share_one_token_request(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """1,000 concurrent queries on an empty cache cause exactly one token request."""
    emulator.token_latency = 0.05  # keep the fetch in flight while all callers pile up
    # gql's 10 s execute_timeout covers the wait in the connection pool's queue: the last
    # of 1,000 waits for 999, which on a loaded machine can take longer.
    async with Client(transport=make_oauth2(), execute_timeout=HANG_GUARD) as session:
        results = await asyncio.gather(*(session.execute(COUNT) for _ in range(1000)))
    assert all(r["carriers"]["totalCount"] == 25 for r in results)
    assert emulator.counters.token_requests == 1
    assert emulator.counters.unauthenticated_responses == 0


async def test_thousand_concurrent_queries_after_expiry_renew_once(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """After the token expired, 1,000 concurrent queries cause exactly one renewal."""
    async with Client(transport=make_oauth2(), execute_timeout=HANG_GUARD) as session:
        await session.execute(COUNT)
        clock.advance(emulator.token_ttl + 1)
        emulator.token_latency = 0.05
        results = await asyncio.gather(*(session.execute(COUNT) for _ in range(1000)))
    assert len(results) == 1000
    assert emulator.counters.token_requests == 2
    assert emulator.counters.unauthenticated_responses == 0


async def test_token_is_reused_until_the_refresh_margin(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A 3600 s token is reused until 60 s before expiry, then renewed before it lapses."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        clock.advance(3600 - 60 - 1)
        await session.execute(COUNT)
        assert emulator.counters.token_requests == 1
        clock.advance(2)
        await session.execute(COUNT)
        await wait_until(renewed(transport, 2))
    assert emulator.counters.token_requests == 2
    assert emulator.counters.unauthenticated_responses == 0


@pytest.mark.parametrize("expires_in_format", ["number", "string"])
async def test_margin_is_capped_at_half_a_short_lifetime(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    expires_in_format: Literal["number", "string"],
) -> None:
    """A 10 s token (``10`` or ``"10"``) is still reused for 5 s, not renewed every request."""
    emulator.token_ttl = 10
    emulator.expires_in_format = expires_in_format
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        clock.advance(4.9)
        await session.execute(COUNT)
        assert emulator.counters.token_requests == 1
        clock.advance(0.2)
        await session.execute(COUNT)
        await wait_until(renewed(transport, 2))
    assert emulator.counters.token_requests == 2


async def test_missing_expires_in_uses_the_default_lifetime(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Without expires_in the token lives default_expires_in seconds, never forever."""
    emulator.expires_in_format = "omitted"
    transport = make_oauth2(default_expires_in=100)
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        clock.advance(49)
        await session.execute(COUNT)
        assert emulator.counters.token_requests == 1
        clock.advance(2)
        await session.execute(COUNT)
        await wait_until(renewed(transport, 2))
    assert emulator.counters.token_requests == 2


@pytest.mark.parametrize("expires_in", [0, -5])
async def test_non_positive_expires_in_is_ignored_with_a_warning(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
    expires_in: int,
) -> None:
    """expires_in <= 0 says nothing usable: the default lifetime applies, and one warning."""
    emulator.advertised_ttl = expires_in
    transport = make_oauth2(default_expires_in=120)
    async with Client(transport=transport) as session:
        for _ in range(5):
            await session.execute(COUNT)
    assert emulator.counters.token_requests == 1
    assert transport.token is not None
    assert transport.token.expires_at - transport.token.obtained_at == 120
    ignored = [e for e in events if e.name == "token_expires_in_ignored"]
    assert [e.expires_in for e in ignored] == [expires_in]


async def test_fetch_events_tell_initial_from_expiring(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
) -> None:
    """The hook hears each fetch with its reason and the lifetime the server gave.

    The token expired, so the second query waited for its renewal: ``expired``.
    """
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        clock.advance(emulator.token_ttl)
        await session.execute(COUNT)
    fetched = [e for e in events if e.name == "token_fetched"]
    assert [e.reason for e in fetched] == ["initial", "expired"]
    assert fetched[0].expires_in == emulator.token_ttl
    assert fetched[0].duration is not None


async def test_token_property_hides_the_value(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """``transport.token`` tells the token's times; its repr never shows the value."""
    transport = make_oauth2()
    assert transport.token is None
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
    token = transport.token
    assert token is not None
    assert token.expires_at - token.obtained_at == pytest.approx(emulator.token_ttl)
    assert token.value not in repr(token)
    assert token.generation == 1
