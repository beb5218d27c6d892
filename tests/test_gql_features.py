"""Drop-in: gql's features keep working through both transports."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import ClientResponseError
from gql import Client, GraphQLRequest, gql
from gql.dsl import DSLQuery, DSLSchema, dsl_gql
from gql.transport.aiohttp import AIOHTTPTransport
from gql.transport.exceptions import TransportQueryError, TransportServerError
from support import CARRIERS, COUNT, STACK_REASONS, upload

from gql_service_auth import ApiKeyTransport, OAuth2Transport
from gql_service_auth.emulator import Emulator

Factory = Callable[..., AIOHTTPTransport]


@pytest.fixture(params=["oauth2", "api_key"])
def make_transport(
    request: pytest.FixtureRequest,
    make_oauth2: Callable[..., OAuth2Transport],
    make_api_key: Callable[..., ApiKeyTransport],
) -> Factory:
    """Each test here runs with both transports."""
    return make_oauth2 if request.param == "oauth2" else make_api_key


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
def test_is_an_aiohttp_transport(make_transport: Factory) -> None:
    """Both transports are AIOHTTPTransport subclasses, usable wherever one is expected."""
    assert isinstance(make_transport(), AIOHTTPTransport)


def test_sync_client_execute(emulator: Emulator, make_transport: Factory) -> None:
    """The blocking Client.execute works, one connection per call."""
    client = Client(transport=make_transport())
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        first = client.execute(CARRIERS)
        second = client.execute(CARRIERS)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    assert first == second
    assert first["carriers"]["edges"][0]["node"] == {
        "id": "carrier-001",
        "name": "Borealis Freight 001",
    }


async def test_dsl_with_schema_from_the_transport(make_transport: Factory) -> None:
    """fetch_schema_from_transport introspects the schema, and gql's DSL builds queries on it."""
    client = Client(transport=make_transport(), fetch_schema_from_transport=True)
    async with client as session:
        assert client.schema is not None
        ds = DSLSchema(client.schema)
        query = dsl_gql(
            DSLQuery(
                ds.Query.carriers(first=2).select(
                    ds.CarrierConnection.edges.select(
                        ds.CarrierEdge.node.select(ds.Carrier.id, ds.Carrier.name)
                    ),
                    ds.CarrierConnection.pageInfo.select(ds.PageInfo.hasNextPage),
                )
            )
        )
        result = await session.execute(query)
    assert len(result["carriers"]["edges"]) == 2
    assert result["carriers"]["pageInfo"]["hasNextPage"] is True


async def test_pagination_with_after(make_transport: Factory) -> None:
    """All carriers can be read page by page with the endCursor."""
    query = gql(
        "query ($after: String) { carriers(first: 10, after: $after) "
        "{ edges { node { id } } pageInfo { hasNextPage endCursor } } }"
    )
    ids: list[str] = []
    after: str | None = None
    async with Client(transport=make_transport()) as session:
        for _ in range(10):
            query.variable_values = {"after": after}
            page = (await session.execute(query))["carriers"]
            ids += [edge["node"]["id"] for edge in page["edges"]]
            if not page["pageInfo"]["hasNextPage"]:
                break
            after = page["pageInfo"]["endCursor"]
    assert len(ids) == len(set(ids)) == 25


async def test_execute_batch(emulator: Emulator, make_transport: Factory) -> None:
    """Client.execute_batch sends several operations in one request."""
    async with Client(transport=make_transport()) as session:
        results = await session.execute_batch([GraphQLRequest(COUNT), GraphQLRequest(CARRIERS)])
    assert results[0]["carriers"]["totalCount"] == 25
    assert emulator.counters.graphql_requests == 1


async def test_client_side_batching(emulator: Emulator, make_transport: Factory) -> None:
    """Queries sent with batch_interval are grouped into one request by gql."""
    async with Client(transport=make_transport(), batch_interval=0.01) as session:
        results = await asyncio.gather(*(session.execute(COUNT) for _ in range(5)))
    assert [r["carriers"]["totalCount"] for r in results] == [25] * 5
    assert emulator.counters.graphql_requests == 1


async def test_file_upload(emulator: Emulator, make_transport: Factory) -> None:
    """Files travel as GraphQL multipart uploads."""
    async with Client(transport=make_transport()) as session:
        result = await session.execute(upload(b"twelve bytes"), upload_files=True)
    assert result["uploadDocument"] == {"filename": "note.txt", "size": 12}
    assert emulator.counters.mutations_run == 1


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["sub"])
async def test_subscription_requests_are_authenticated(
    emulator: Emulator, make_transport: Factory
) -> None:
    """subscribe() sends the Authorization header too (the emulator has no subscriptions)."""
    async with Client(transport=make_transport()) as session:
        with pytest.raises(TransportQueryError):
            async for _ in session.subscribe(gql("subscription { ticks }")):
                pass  # pragma: no cover - the emulator answers with an error
    assert emulator.requests[-1].auth_scheme in ("Bearer", "SERVICE-API-KEY")


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
async def test_parent_keywords_keep_working(emulator: Emulator, make_transport: Factory) -> None:
    """headers, timeout, json_serialize and client_session_args reach aiohttp as before."""
    serialized: list[Any] = []

    def serialize(value: Any, **kwargs: Any) -> str:
        serialized.append(value)
        return json.dumps(value, **kwargs)

    transport = make_transport(
        headers={"X-Team": "billing"},
        timeout=10,
        json_serialize=serialize,
        client_session_args={"raise_for_status": False},
    )
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
    assert serialized
    assert emulator.requests[-1].headers["X-Team"] == "billing"


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
async def test_server_errors_keep_gql_types_without_headers_in_the_chain(
    emulator: Emulator, make_transport: Factory
) -> None:
    """A 5xx without a GraphQL body is gql's TransportServerError; its cause keeps no header."""
    emulator.fail_graphql_requests(1, 502, body=b"bad gateway")
    async with Client(transport=make_transport()) as session:
        with pytest.raises(TransportServerError) as caught:
            await session.execute(COUNT)
    assert caught.value.code == 502
    # aiohttp's error stays in the chain for debugging, with the credential blanked.
    assert isinstance(caught.value.__cause__, ClientResponseError)
    assert caught.value.__cause__.request_info.headers["Authorization"] == "***"


async def test_reconnecting_session(emulator: Emulator, make_transport: Factory) -> None:
    """gql's reconnecting session works with the transports."""
    client = Client(transport=make_transport())
    session = await client.connect_async(reconnecting=True)
    try:
        result = await session.execute(COUNT)
    finally:
        await client.close_async()
    assert result["carriers"]["totalCount"] == 25
