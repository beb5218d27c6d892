"""Refusals as a bare HTTP 401 (no body): renewed and re-sent, or gql's error and ours.

Batches (``execute_batch`` and gql's ``batch_interval``), mutations, a reconnecting
session, the pause after refused renewals, and bare 401s mixed with ``UNAUTHENTICATED``
bodies among concurrent callers and threads. Once renewals are spent, the error is gql's
``TransportServerError`` (``code`` 401) as well as ours.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable

import pytest
from gql import Client, GraphQLRequest
from gql.transport.exceptions import (
    TransportQueryError,
    TransportServerError,
)
from support import (
    CARRIER_RENAMED,
    COUNT,
    GQL_401,
    RENAME,
    STACK_REASONS,
    UNAUTHENTICATED_ERROR,
    bare_401s,
    blocking_execute,
    collect_garbage,
    tenants,
)

from gql_service_auth import (
    ApiKeyRejectedHTTPError,
    ApiKeyTransport,
    OAuth2Transport,
    RetryPolicy,
    UnauthenticatedError,
    UnauthenticatedHTTPError,
)
from gql_service_auth.emulator import Emulator


async def test_an_oauth2_batch_refused_with_a_bare_401_is_renewed_and_resent_once(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The known gap: a bare 401 to a batch renews the token and re-sends it, once."""
    bare_401s(emulator)
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        results = await session.execute_batch([GraphQLRequest(RENAME), GraphQLRequest(COUNT)])
    assert results[0]["renameCarrier"]["name"] == "Renamed"
    assert results[1]["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 2
    assert emulator.counters.graphql_requests == 3  # the query, the refused batch, its re-send
    assert emulator.counters.mutations_run == 1


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
@pytest.mark.parametrize("max_renewals", [0, 1, 2])
async def test_an_oauth2_batch_refused_until_renewals_are_spent_is_gqls_error_and_ours(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], max_renewals: int
) -> None:
    """The bare 401 that ends a batch is gql's TransportServerError (401, gql's text) too."""
    bare_401s(emulator)
    emulator.refuse_all_tokens = True
    async with Client(transport=make_oauth2(max_renewals=max_renewals)) as session:
        with pytest.raises(TransportServerError) as info:
            await session.execute_batch([GraphQLRequest(RENAME), GraphQLRequest(COUNT)])
    caught = info.value
    assert isinstance(caught, UnauthenticatedHTTPError)
    assert isinstance(caught, TransportQueryError)  # what gql's reconnecting session spares
    assert (caught.code, caught.errors) == (401, None)
    assert str(caught).startswith(GQL_401)
    assert f"after {max_renewals} renewal(s)" in str(caught)
    assert isinstance(caught.__cause__, TransportServerError)
    assert emulator.counters.graphql_requests == max_renewals + 1
    assert emulator.counters.token_requests == max_renewals + 1
    assert emulator.counters.mutations_run == 0


async def test_queries_batched_by_gql_and_refused_with_a_bare_401_share_one_renewal(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Client(batch_interval=...) groups concurrent queries; the refused batch renews once."""
    bare_401s(emulator)
    async with Client(transport=make_oauth2(), batch_interval=0.05) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        emulator.reset_counters()
        results = await asyncio.wait_for(
            asyncio.gather(*(session.execute(COUNT) for _ in range(5))), timeout=10
        )
    assert all(r["carriers"]["totalCount"] == 25 for r in results)
    assert emulator.counters.token_requests == 1
    assert emulator.counters.graphql_requests == 2  # one batch, refused, then re-sent


async def test_queries_batched_by_gql_all_get_the_http_error_when_renewals_are_spent(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Every caller of a batch refused to the end catches it as gql's error and ours."""
    bare_401s(emulator)
    emulator.refuse_all_tokens = True
    async with Client(transport=make_oauth2(), batch_interval=0.05) as session:
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(session.execute(COUNT) for _ in range(4)), return_exceptions=True),
            timeout=10,
        )
    assert all(isinstance(o, UnauthenticatedHTTPError) and o.code == 401 for o in outcomes)
    assert emulator.counters.graphql_requests == 2


async def test_a_reconnecting_batching_session_does_not_retry_a_bare_401(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """gql's reconnecting session retries most errors 5 times; not ours, batched or not."""
    bare_401s(emulator)
    emulator.refuse_all_tokens = True
    client = Client(transport=make_oauth2(), batch_interval=0.01)
    session = await client.connect_async(reconnecting=True)
    try:
        with pytest.raises(TransportServerError) as caught:
            await asyncio.wait_for(session.execute(COUNT), timeout=10)
        with pytest.raises(UnauthenticatedHTTPError):
            await asyncio.wait_for(session.execute_batch([GraphQLRequest(COUNT)]), timeout=10)
    finally:
        await client.close_async()
    assert caught.value.code == 401
    assert emulator.counters.graphql_requests == 4  # 2 per call: the send and one re-send


async def test_an_api_key_batch_refused_with_a_bare_401_in_a_reconnecting_session(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """The API key's bare-401 error is never retried by gql, batched or not."""
    bare_401s(emulator)
    client = Client(transport=make_api_key(emulator.legacy_client), batch_interval=0.01)
    session = await client.connect_async(reconnecting=True)
    try:
        with pytest.raises(ApiKeyRejectedHTTPError) as caught:
            await asyncio.wait_for(session.execute(COUNT), timeout=10)
    finally:
        await client.close_async()
    assert caught.value.code == 401
    assert emulator.counters.graphql_requests == 1


# Every stack's: test_stacks.py. Here aiohttp's 401 text and its subscriptions too.
@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
async def test_a_call_failing_fast_while_bare_401s_pause_renewals_is_gqls_error_too(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The next call after renewals were spent on bare 401s ends at once, in the pause they
    caused: code written for gql, which saw a TransportServerError (401) for the first,
    must catch the second as one too, not as a TransportQueryError without errors."""
    bare_401s(emulator)
    emulator.refuse_all_tokens = True
    policy = RetryPolicy(wait_initial=5, wait_max=5, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(TransportServerError) as first:
            await session.execute(COUNT)
        with pytest.raises(TransportServerError) as paused:
            await session.execute(COUNT)
        with pytest.raises(TransportServerError):
            async for _ in session.subscribe(CARRIER_RENAMED):
                pass
    assert isinstance(first.value, UnauthenticatedHTTPError)
    assert isinstance(paused.value, UnauthenticatedHTTPError)
    assert paused.value.code == 401
    assert str(paused.value).startswith(GQL_401)
    assert "paused" in str(paused.value)
    assert emulator.counters.graphql_requests == 2  # nothing sent while paused
    assert emulator.counters.token_requests == 2


async def test_a_call_failing_fast_while_body_refusals_pause_renewals_stays_a_query_error(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The same pause after UNAUTHENTICATED bodies: no HTTP error, as before."""
    emulator.refuse_all_tokens = True
    policy = RetryPolicy(wait_initial=5, wait_max=5, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(UnauthenticatedError):
            await session.execute(COUNT)
        with pytest.raises(UnauthenticatedError, match="paused") as paused:
            await session.execute(COUNT)
    assert not isinstance(paused.value, TransportServerError)


async def test_a_mutation_refused_with_a_bare_401_is_resent_and_runs_once(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A bare 401 comes before anything ran: the mutation is re-sent, and runs once."""
    bare_401s(emulator)
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        result = await session.execute(RENAME)
    assert result["renameCarrier"]["name"] == "Renamed"
    assert emulator.counters.mutations_run == 1
    assert emulator.counters.graphql_requests == 3


async def test_the_last_refusal_decides_the_errors_kind_body_then_bare(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """UNAUTHENTICATED in a body, then a bare 401 after the renewal: the HTTP error."""
    async with Client(transport=make_oauth2(max_renewals=1)) as session:
        await session.execute(COUNT)
        emulator.fail_graphql_requests(1, body={"data": None, "errors": [UNAUTHENTICATED_ERROR]})
        bare_401s(emulator)
        emulator.refuse_all_tokens = True
        with pytest.raises(TransportServerError) as caught:
            await session.execute(COUNT)
    assert isinstance(caught.value, UnauthenticatedHTTPError)
    assert caught.value.code == 401


async def test_the_last_refusal_decides_the_errors_kind_bare_then_body(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A bare 401, then UNAUTHENTICATED in a body: the service's errors, not an HTTP error."""
    async with Client(transport=make_oauth2(max_renewals=1)) as session:
        await session.execute(COUNT)
        emulator.fail_graphql_requests(1, status=401, body=b"")
        emulator.refuse_all_tokens = True
        with pytest.raises(UnauthenticatedError) as caught:
            await session.execute(COUNT)
    assert not isinstance(caught.value, TransportServerError)
    assert caught.value.errors is not None


async def test_concurrent_refusals_of_both_kinds_share_one_renewal(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """20 callers with one revoked token, refused in turn bare and in a body, renew it once."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        # Only requests with the revoked token meet these, so a re-send or a late original
        # with the renewed one is answered, however the stack schedules its 20 calls; in
        # turn, so each kind comes after the other.
        for _ in range(10):
            emulator.answer_refusals(1)
            emulator.answer_refusals(1, body={"data": None, "errors": [UNAUTHENTICATED_ERROR]})
        # Calls on their way with the revoked token: a caller that starts after the first
        # refusal waits for the renewal instead (requests' callers, on threads, had 10 to
        # 12 on the way within 0.02 s). All 20 were refused at 0.1 s, under load too.
        emulator.graphql_latency = 0.1
        results = await asyncio.wait_for(
            asyncio.gather(*(session.execute(COUNT) for _ in range(20))), timeout=10
        )
    assert len(results) == 20
    assert emulator.counters.token_requests == 2
    # Both orders were met: bare, then a body, then bare.
    assert emulator.counters.unauthenticated_responses >= 3


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
def test_threads_refused_with_a_bare_401_share_one_renewal(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """gql's blocking execute on 6 threads, one transport: one renewal for the bare 401s."""
    bare_401s(emulator)
    transport = make_oauth2()
    assert isinstance(blocking_execute(transport), dict)
    emulator.revoke_tokens()
    emulator.graphql_latency = 0.02
    barrier = threading.Barrier(6)
    outcomes: list[object] = []

    def call() -> None:
        barrier.wait(timeout=10)
        outcomes.append(blocking_execute(transport))

    threads = [threading.Thread(target=call, daemon=True) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads)
    assert [type(o).__name__ for o in outcomes] == ["dict"] * 6
    assert emulator.counters.token_requests == 2


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["sub"])
async def test_subscriptions_refused_with_bare_401s_leave_no_transport_behind(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Per-call transports whose subscriptions a bare 401 refuses: what the refusal taught
    is kept, the transports and their token managers go (before: every one kept for good,
    through the kept error's traceback)."""
    bare_401s(emulator)
    emulator.refuse_all_tokens = True
    for client in tenants(emulator, 6):
        transport = make_oauth2(client=client)
        async with Client(transport=transport) as session:
            try:  # not pytest.raises, which the suite's scan of errors keeps to the end
                async for _ in session.subscribe(CARRIER_RENAMED):
                    pass
            except UnauthenticatedHTTPError:
                pass
            else:
                raise AssertionError("the subscription was not refused")
        live = weakref.ref(transport)
        del transport, session
        collect_garbage()
        assert live() is None


async def test_callers_failing_in_a_pause_after_bare_401s_share_no_error_object(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Two calls failing at once in a pause after bare 401s: each error's cause is its own,
    so what one caller does with its cause (raising it) reaches no other caller's."""
    bare_401s(emulator)
    emulator.refuse_all_tokens = True
    policy = RetryPolicy(wait_initial=5, wait_max=5, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(TransportServerError):
            await session.execute(COUNT)  # renewed once, refused again: a pause
        causes = []
        for _ in range(2):
            with pytest.raises(UnauthenticatedHTTPError) as paused:
                await session.execute(COUNT)
            causes.append(paused.value.__cause__)
    assert all(isinstance(cause, TransportServerError) for cause in causes)
    assert causes[0] is not causes[1]
    assert causes[0].__traceback__ is None  # no frame of the call that met the 401
