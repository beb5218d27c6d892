"""Requests at the edges of a token's life: shared request objects, refusals, odd tokens."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from gql import Client, FileVar, GraphQLRequest, gql
from support import COUNT, RENAME, UPLOAD, wait_until

from gql_service_auth import (
    AuthEvent,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
    UnauthenticatedError,
)
from gql_service_auth.emulator import Emulator, ManualClock, RecordedMutation

CARRIER = "query ($id: ID!) { carrier(id: $id) { id name } }"
RENAME_ANY = (
    "mutation ($id: ID!, $name: String!) { renameCarrier(id: $id, name: $name) { id name } }"
)
CALLERS = 20
_T = TypeVar("_T")


def carrier_id(index: int) -> str:
    """The id of the emulator's ``index``-th seeded carrier, from 1."""
    return f"carrier-{index:03d}"


async def bounded(*calls: Awaitable[_T]) -> list[_T]:
    """Run ``calls`` concurrently, failing the test after 30 s."""
    return await asyncio.wait_for(asyncio.gather(*calls), timeout=30)


async def settle(*calls: Awaitable[Any]) -> list[Any]:
    """Like :func:`bounded`, but an exception is returned as the call's outcome."""
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=30)


async def hold_token_fetch(
    session: Any, emulator: Emulator, clock: ManualClock, moment: str
) -> None:
    """Make the next call wait for a token fetch: on a cold cache, or a renewal."""
    if moment == "renewal":
        await session.execute(COUNT)
        clock.advance(emulator.token_ttl)
    emulator.token_latency = 0.1


@pytest.mark.parametrize("moment", ["cold", "renewal"])
async def test_concurrent_queries_sharing_a_request_each_get_their_own_answer(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    moment: str,
) -> None:
    """Callers sharing one request with their own variables (gql 3 style) get their own carrier."""
    shared = gql(CARRIER)
    async with Client(transport=make_oauth2()) as session:
        await hold_token_fetch(session, emulator, clock, moment)
        with pytest.warns(DeprecationWarning, match="variable_values"):
            results = await bounded(
                *(
                    session.execute(shared, variable_values={"id": carrier_id(i)})
                    for i in range(1, CALLERS + 1)
                )
            )
    got = [result["carrier"]["id"] for result in results]
    assert got == [carrier_id(i) for i in range(1, CALLERS + 1)]


@pytest.mark.parametrize("moment", ["cold", "renewal"])
async def test_concurrent_mutations_sharing_a_request_each_run_once_with_their_own_arguments(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    moment: str,
) -> None:
    """Renames sharing one request each run exactly once, with the caller's own arguments."""
    shared = gql(RENAME_ANY)
    wanted = [{"id": carrier_id(i), "name": f"Name {i}"} for i in range(1, CALLERS + 1)]
    async with Client(transport=make_oauth2()) as session:
        await hold_token_fetch(session, emulator, clock, moment)
        with pytest.warns(DeprecationWarning, match="variable_values"):
            results = await bounded(
                *(session.execute(shared, variable_values=args) for args in wanted)
            )
    ran = sorted(emulator.mutations, key=lambda m: m.arguments["id"])
    assert ran == [RecordedMutation("renameCarrier", args) for args in wanted]
    assert [result["renameCarrier"] for result in results] == wanted


@pytest.mark.parametrize("moment", ["cold", "renewal"])
async def test_a_batch_sends_the_variables_its_requests_held_when_it_was_called(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    moment: str,
) -> None:
    """Batches reusing one request object, reassigned before each call, run their own renames."""
    shared = gql(RENAME_ANY)
    wanted = [{"id": carrier_id(i), "name": f"Batch {i}"} for i in range(1, CALLERS + 1)]

    async def caller(args: dict[str, str]) -> list[dict[str, Any]]:
        shared.variable_values = args  # what gql 3 style execute() does to a request
        answers: list[dict[str, Any]] = await session.execute_batch(
            [shared, GraphQLRequest(COUNT)]
        )
        return answers

    async with Client(transport=make_oauth2()) as session:
        await hold_token_fetch(session, emulator, clock, moment)
        results = await bounded(*(caller(args) for args in wanted))
    ran = sorted(emulator.mutations, key=lambda m: m.arguments["id"])
    assert ran == [RecordedMutation("renameCarrier", args) for args in wanted]
    assert [result[0]["renameCarrier"] for result in results] == wanted


@pytest.mark.parametrize("moment", ["cold", "renewal"])
async def test_concurrent_uploads_sharing_a_request_each_send_their_own_file(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    moment: str,
) -> None:
    """Uploads sharing one request, each with its own file, each upload that file once."""
    shared = GraphQLRequest(UPLOAD)
    sizes = range(1, 11)
    async with Client(transport=make_oauth2()) as session:
        await hold_token_fetch(session, emulator, clock, moment)
        with pytest.warns(DeprecationWarning, match="variable_values"):
            outcomes = await settle(
                *(
                    session.execute(
                        shared,
                        variable_values={
                            "file": FileVar(io.BytesIO(b"x" * size), filename=f"{size}.txt")
                        },
                        upload_files=True,
                    )
                    for size in sizes
                )
            )
    answers = [o["uploadDocument"] if isinstance(o, dict) else type(o).__name__ for o in outcomes]
    assert answers == [{"filename": f"{size}.txt", "size": size} for size in sizes]
    uploaded = sorted(
        (m.arguments["file"].filename, len(m.arguments["file"].data)) for m in emulator.mutations
    )
    assert uploaded == sorted((f"{size}.txt", size) for size in sizes)


async def test_concurrent_uploads_on_a_valid_token_do_not_close_each_others_files(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], tmp_path: Path
) -> None:
    """Uploads of files on disk queued for a connection each send their own, still open, file."""
    files = []
    for size in range(1, 6):
        path = tmp_path / f"{size}.txt"
        path.write_bytes(b"x" * size)
        files.append(FileVar(str(path), content_type="text/plain"))
    # One connection: each upload's file is opened when it is called and sent when the
    # previous upload has finished, as with any connection limit under load.
    transport = make_oauth2(client_session_args={"connector": aiohttp.TCPConnector(limit=1)})
    try:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
            outcomes = await settle(
                *(
                    session.execute(
                        GraphQLRequest(UPLOAD, variable_values={"file": file}), upload_files=True
                    )
                    for file in files
                )
            )
    finally:
        for file in files:
            if isinstance(file.f, io.IOBase):
                file.f.close()
    answers = [o["uploadDocument"] if isinstance(o, dict) else type(o).__name__ for o in outcomes]
    assert answers == [{"filename": f"{size}.txt", "size": size} for size in range(1, 6)]
    assert emulator.counters.mutations_run == 5


@pytest.mark.parametrize("revoked", [False, True], ids=["cold", "re-sent"])
async def test_a_callers_later_change_to_its_variables_does_not_reach_what_it_sends(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], revoked: bool
) -> None:
    """One variables dict changed after each call started: each sends, and re-sends, its own."""
    shared = gql(RENAME_ANY)
    variables: dict[str, str] = {}
    wanted = [{"id": carrier_id(i), "name": f"Name {i}"} for i in range(1, 6)]
    async with Client(transport=make_oauth2()) as session:
        if revoked:
            await session.execute(COUNT)
            emulator.revoke_tokens()  # each first send is refused, then re-sent
        emulator.token_latency = 0.1
        calls = []
        for args in wanted:
            variables.update(args)
            request = GraphQLRequest(shared, variable_values=variables)
            calls.append(asyncio.ensure_future(session.execute(request)))
            await asyncio.sleep(0)  # the call has started
        await bounded(*calls)
    ran = sorted(emulator.mutations, key=lambda m: m.arguments["id"])
    assert ran == [RecordedMutation("renameCarrier", args) for args in wanted]


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
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], events: list[AuthEvent]
) -> None:
    """Re-sends wait pauses that double per refused fresh token; an accepted answer ends them."""
    emulator.refuse_all_tokens = True
    policy = RetryPolicy(wait_initial=0.05, wait_max=1, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy, max_renewals=3)) as session:
        with pytest.raises(UnauthenticatedError):
            await session.execute(COUNT)
        waits = [e.wait for e in events if e.name == "request_retry_scheduled"]
        assert waits == [0, pytest.approx(0.05, abs=0.02), pytest.approx(0.1, abs=0.02)]
        assert emulator.counters.token_requests == 4
        emulator.refuse_all_tokens = False
        with pytest.raises(UnauthenticatedError, match="paused"):
            await session.execute(COUNT)  # 4 fresh refusals: paused for 0.2 s
        assert emulator.counters.token_requests == 4
        await asyncio.sleep(0.25)  # the pause is a rate limit in real time
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


async def test_a_token_type_other_than_bearer_is_refused(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A DPoP token is not sent as a Bearer token: a TokenRequestError names token_type."""
    body = {"access_token": "opaque-dpop-value", "token_type": "DPoP", "expires_in": 3600}
    emulator.fail_token_requests(1, 200, body=body)
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(TokenRequestError, match="token_type"):
            await session.execute(COUNT)
    assert emulator.counters.token_requests == 1
    assert emulator.counters.graphql_requests == 0


@pytest.mark.parametrize("token_type", ["bearer", "BEARER", None])
async def test_bearer_in_any_case_or_no_token_type_is_accepted(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], token_type: str | None
) -> None:
    """``token_type`` is compared without case, and a missing one means Bearer."""
    issuer = make_oauth2()
    async with Client(transport=issuer) as session:
        await session.execute(COUNT)
    assert issuer.token is not None
    body: dict[str, Any] = {"access_token": issuer.token.value, "expires_in": 3600}
    if token_type is not None:
        body["token_type"] = token_type
    emulator.reset_counters()
    emulator.fail_token_requests(1, 200, body=body)
    async with Client(transport=make_oauth2()) as session:
        result = await session.execute(COUNT)
    assert result["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 1
