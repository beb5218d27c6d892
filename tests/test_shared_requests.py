"""Callers sharing one request object, or one variables dict, each send their own.

gql 3 style ``variable_values``, batches reusing a request, and variables changed after
a call started: whether the call waits for a token on a cold cache, for a renewal, or is
re-sent after a refusal, each caller's own arguments are sent, once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from gql import Client, GraphQLRequest, gql
from support import (
    CARRIER,
    COUNT,
    bounded,
    hold_token_fetch,
)

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import Emulator, ManualClock, RecordedMutation

RENAME_ANY = (
    "mutation ($id: ID!, $name: String!) { renameCarrier(id: $id, name: $name) { id name } }"
)

CALLERS = 20

_T = TypeVar("_T")


def carrier_id(index: int) -> str:
    """The id of the emulator's ``index``-th seeded carrier, from 1."""
    return f"carrier-{index:03d}"


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
