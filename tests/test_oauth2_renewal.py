"""OAuth2Transport: renewal after UNAUTHENTICATED, and what is never sent twice."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from gql import Client, GraphQLRequest
from gql.transport.exceptions import TransportQueryError
from support import (
    CARRIER,
    COUNT,
    RENAME,
    STACK_REASONS,
    TICKS,
    UNAUTHENTICATED_ERROR,
    upload,
    wait_until,
)

from gql_service_auth import (
    AuthEvent,
    OAuth2Transport,
    RetryPolicy,
    UnauthenticatedError,
)
from gql_service_auth.emulator import Emulator, ManualClock, RecordedMutation


async def test_revoked_token_is_renewed_and_the_query_retried(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], events: list[AuthEvent]
) -> None:
    """A token revoked while it looks valid is renewed once and the query succeeds."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        result = await session.execute(COUNT)
    assert result["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 2
    assert emulator.counters.graphql_requests == 3
    names = [e.name for e in events]
    assert names.count("token_rejected") == 1
    assert names.count("request_retry_scheduled") == 1
    assert [e.reason for e in events if e.name == "token_fetched"] == ["initial", "rejected"]


@pytest.mark.parametrize(("status", "body"), [(200, True), (401, True), (401, False)])
async def test_refusal_is_recognised_whatever_the_status(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    status: int,
    body: bool,
) -> None:
    """UNAUTHENTICATED with status 200 or 401, or a bare 401, all lead to one renewal."""
    emulator.unauthenticated_status = status
    emulator.unauthenticated_body = body
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        await session.execute(COUNT)
    assert emulator.counters.token_requests == 2
    assert emulator.counters.unauthenticated_responses == 1


@pytest.mark.parametrize("max_renewals", [0, 1, 3])
async def test_a_server_that_refuses_every_token_ends_in_bounded_requests(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], max_renewals: int
) -> None:
    """When every token is refused, the caller gets the service's errors after N+1 sends."""
    emulator.refuse_all_tokens = True
    async with Client(transport=make_oauth2(max_renewals=max_renewals)) as session:
        with pytest.raises(UnauthenticatedError) as caught:
            await session.execute(COUNT)
    assert isinstance(caught.value, TransportQueryError)
    assert caught.value.errors is not None
    assert caught.value.errors[0]["extensions"]["code"] == "UNAUTHENTICATED"
    assert "token_url" in str(caught.value)
    assert emulator.counters.graphql_requests == max_renewals + 1
    assert emulator.counters.token_requests == max_renewals + 1


@pytest.mark.stacks("aiohttp", "httpx", reason=STACK_REASONS["inflight"])
async def test_many_requests_failing_with_one_token_cause_one_renewal(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """50 in-flight requests refused with the same old token share a single renewal."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        emulator.token_latency = 0.05
        results = await asyncio.gather(*(session.execute(COUNT) for _ in range(50)))
    assert len(results) == 50
    assert emulator.counters.token_requests == 2
    assert emulator.counters.unauthenticated_responses == 50


async def test_a_late_refusal_of_an_old_token_reuses_the_newer_one(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
) -> None:
    """Refused with token 1 after token 2 exists, a request retries with 2 and renews nothing."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.graphql_latency = 0.2
        slow = asyncio.ensure_future(session.execute(COUNT))  # sent with token 1
        await wait_until(lambda: emulator.counters.graphql_requests == 2)
        clock.advance(emulator.token_ttl + 1)  # token 1 expires on both sides
        await session.execute(COUNT)  # fetches token 2
        await slow
    assert emulator.counters.token_requests == 2
    assert emulator.counters.unauthenticated_responses == 1
    assert not any(e.name == "token_rejected" for e in events)


@pytest.mark.parametrize(
    "errors",
    [
        "not a list",
        ["a string"],
        [{"message": "no extensions"}],
        [{"extensions": "not an object"}],
        [{"extensions": {"code": 42}}],
        {"extensions": {"code": "UNAUTHENTICATED"}},
        [None, 3, [UNAUTHENTICATED_ERROR]],
    ],
)
async def test_malformed_errors_are_not_mistaken_for_a_refusal(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], errors: object
) -> None:
    """Odd ``errors`` shapes reach the caller as gql errors; no crash, no renewal."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.fail_graphql_requests(1, body={"data": None, "errors": errors})
        with pytest.raises(TransportQueryError) as caught:
            await session.execute(COUNT)
    assert not isinstance(caught.value, UnauthenticatedError)
    assert emulator.counters.token_requests == 1


async def test_refusal_among_several_errors_is_found(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """UNAUTHENTICATED anywhere in the errors array triggers the renewal."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        errors = [{"message": "other", "extensions": {"code": "X"}}, UNAUTHENTICATED_ERROR]
        emulator.fail_graphql_requests(1, body={"data": None, "errors": errors})
        await session.execute(COUNT)
    assert emulator.counters.token_requests == 2


async def test_refused_mutation_is_resent_and_runs_once(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A mutation refused before it ran (no data) is sent again and runs exactly once."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        result = await session.execute(RENAME)
    assert result["renameCarrier"]["name"] == "Renamed"
    assert emulator.counters.mutations_run == 1


async def test_refusal_with_data_is_not_resent(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """An answer carrying data next to UNAUTHENTICATED may have run something: no re-send."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.fail_graphql_requests(
            1, body={"data": {"renameCarrier": None}, "errors": [UNAUTHENTICATED_ERROR]}
        )
        with pytest.raises(UnauthenticatedError, match="may have run") as caught:
            await session.execute(RENAME)
        assert caught.value.data == {"renameCarrier": None}
        assert emulator.counters.graphql_requests == 2
        await session.execute(COUNT)  # the refused token was dropped: a new one is fetched
    assert emulator.counters.token_requests == 2


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["upload"])
async def test_upload_renews_a_token_that_would_expire_soon(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Before an upload, a token with less than refresh_margin left is renewed first."""
    emulator.token_ttl = 100  # ordinary renewal at 50 s; an upload wants 60 s left
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        clock.advance(45)
        await session.execute(COUNT)
        assert emulator.counters.token_requests == 1
        result = await session.execute(upload(b"hello"), upload_files=True)
    assert result["uploadDocument"]["size"] == 5
    assert emulator.counters.token_requests == 2
    assert emulator.counters.unauthenticated_responses == 0


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["upload"])
@pytest.mark.parametrize("body", [True, False], ids=["UNAUTHENTICATED", "bare-401"])
async def test_refused_upload_is_not_resent(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], body: bool
) -> None:
    """An upload refused with a revoked token raises instead of re-sending a consumed stream."""
    emulator.unauthenticated_status, emulator.unauthenticated_body = 401, body
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        with pytest.raises(UnauthenticatedError, match="not sent again"):
            await session.execute(upload(b"hello"), upload_files=True)
        assert emulator.counters.graphql_requests == 2
        result = await session.execute(upload(b"again"), upload_files=True)
    assert result["uploadDocument"]["size"] == 5
    assert emulator.counters.mutations_run == 1


async def test_refused_batch_is_resent_once(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A batch refused as a whole is renewed and sent again, each operation running once."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        results = await session.execute_batch([GraphQLRequest(RENAME), GraphQLRequest(COUNT)])
    assert results[1]["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 2
    assert emulator.counters.mutations_run == 1


async def test_partly_refused_batch_is_not_resent(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A batch where one answer carries data is not sent again."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.fail_graphql_requests(
            1,
            body=[
                {"data": {"carriers": {"totalCount": 25}}},
                {"data": None, "errors": [UNAUTHENTICATED_ERROR]},
            ],
        )
        with pytest.raises(UnauthenticatedError):
            await session.execute_batch([GraphQLRequest(COUNT), GraphQLRequest(COUNT)])
    assert emulator.counters.graphql_requests == 2


async def test_refused_batch_exhausts_into_service_errors(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A batch refused every time ends with the service's errors, after bounded sends."""
    emulator.refuse_all_tokens = True
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(UnauthenticatedError) as caught:
            await session.execute_batch([GraphQLRequest(COUNT), GraphQLRequest(COUNT)])
    assert caught.value.errors is not None
    assert emulator.counters.graphql_requests == 2


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["sub"])
async def test_refused_subscription_drops_the_token(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A subscription refused with UNAUTHENTICATED is not re-sent, but the next call renews."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        with pytest.raises(TransportQueryError):
            async for _ in session.subscribe(TICKS):
                pass  # pragma: no cover
        assert emulator.counters.token_requests == 1
        await session.execute(COUNT)
    assert emulator.counters.token_requests == 2


async def test_mutation_refused_during_execution_is_not_resent(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A mutation refused with a path ran: it raises, runs once, and the token is dropped."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.refuse_fields(1)
        with pytest.raises(UnauthenticatedError) as caught:
            await session.execute(RENAME)
        assert caught.value.errors is not None
        assert caught.value.errors[0]["path"] == ["renameCarrier"]
        assert caught.value.errors[0]["extensions"]["code"] == "UNAUTHENTICATED"
        assert emulator.counters.graphql_requests == 2
        await session.execute(COUNT)
    assert list(emulator.mutations) == [
        RecordedMutation("renameCarrier", {"id": "carrier-001", "name": "Renamed"})
    ]
    assert emulator.counters.token_requests == 2


@pytest.mark.parametrize(
    ("query", "field"),
    [
        (COUNT, "carriers"),
        (GraphQLRequest(CARRIER, variable_values={"id": "carrier-002"}), "carrier"),
    ],
    ids=["non-null-root-data-null", "nullable-root-partial-data"],
)
async def test_query_refused_during_execution_is_renewed_and_resent(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    query: GraphQLRequest,
    field: str,
) -> None:
    """A query refused with a path has no side effect: the token is renewed and it succeeds."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.refuse_fields(1)
        result = await session.execute(query)
    assert result[field] is not None
    assert emulator.counters.token_requests == 2
    assert emulator.counters.graphql_requests == 3


async def test_refusals_while_running_cost_one_renewal_and_never_pause(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A server refusing inside resolvers: one renewal in all, then no pause for healthy calls."""
    policy = RetryPolicy(wait_initial=5, wait_max=5, wait_jitter=0)
    emulator.refuse_fields(1 + 1 + 8)  # call 1 is sent and re-sent; calls 2 to 9 once each
    async with Client(transport=make_oauth2(retry=policy)) as session:
        for _ in range(9):
            with pytest.raises(UnauthenticatedError):
                await session.execute(COUNT)
        result = await session.execute(COUNT)  # the renewed token was kept for such calls
    assert result["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 2
    assert emulator.counters.graphql_requests == 11


async def test_a_kept_token_that_answers_accepted_is_renewed_when_refused_again(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Kept after refusals inside resolvers, then accepted: a later such refusal renews it."""
    emulator.refuse_fields(2)
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(UnauthenticatedError, match="kept"):
            await session.execute(COUNT)  # token 1 refused and renewed; token 2 refused too
        await session.execute(COUNT)  # token 2 accepted
        emulator.refuse_fields(1)  # token 2 has expired, say, as an operation ran
        result = await session.execute(COUNT)
    assert result["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 3


@pytest.mark.parametrize("path", ["renameCarrier", {}, [], 0])
async def test_a_mutation_refused_with_a_path_of_any_shape_is_not_resent(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], path: object
) -> None:
    """Any path present counts as raised while running, whatever its shape: never re-sent."""
    error = {"message": "expired", "path": path, "extensions": {"code": "UNAUTHENTICATED"}}
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.fail_graphql_requests(1, body={"data": None, "errors": [error]})
        with pytest.raises(UnauthenticatedError, match="while it ran"):
            await session.execute(RENAME)
    assert emulator.counters.graphql_requests == 2


async def test_batch_with_a_mutation_refused_during_execution_is_not_resent(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A batch whose mutation was refused with a path raises and the mutation ran once."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.refuse_fields(2)
        with pytest.raises(UnauthenticatedError):
            await session.execute_batch([GraphQLRequest(RENAME), GraphQLRequest(COUNT)])
    assert emulator.counters.mutations_run == 1
    assert emulator.counters.graphql_requests == 2
