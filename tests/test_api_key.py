"""ApiKeyTransport: the API-key header on every request, and the 2024-05-13 rule."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from gql import Client
from gql.transport.exceptions import TransportQueryError
from support import CARRIERS, STACK_REASONS

from gql_service_auth import ApiKeyRejectedError, ApiKeyTransport
from gql_service_auth.emulator import Emulator


async def test_sends_api_key_header_and_never_requests_a_token(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """Each request carries SERVICE-API-KEY <id>:<secret>; the token endpoint is never asked."""
    client = emulator.recent_client
    async with Client(transport=make_api_key()) as session:
        for _ in range(3):
            result = await session.execute(CARRIERS)
            assert len(result["carriers"]["edges"]) == 10
    sent = [r.headers["Authorization"] for r in emulator.requests]
    expected = f"SERVICE-API-KEY {client.client_id}:{client.client_secret}"
    assert sent == [expected] * 3
    assert emulator.counters.token_requests == 0


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["aio"])
async def test_legacy_credentials_are_refused_with_the_rule_explained(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """Credentials registered before 2024-05-13 raise ApiKeyRejectedError, once, not retried."""
    async with Client(transport=make_api_key(emulator.legacy_client)) as session:
        with pytest.raises(ApiKeyRejectedError) as caught:
            await session.execute(CARRIERS)
    message = str(caught.value)
    assert "2024-05-13" in message
    assert "OAuth2Transport" in message
    assert "create new credentials" in message
    assert caught.value.errors is not None
    assert caught.value.errors[0]["extensions"]["code"] == "UNAUTHENTICATED"
    assert emulator.counters.graphql_requests == 1
    assert emulator.counters.token_requests == 0


async def test_refusal_quotes_what_the_service_said(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """The message quotes the service's own reason, which tells a wrong secret from the rule."""
    wrong = ApiKeyTransport(
        emulator.graphql_url, client_id=emulator.recent_client.client_id, client_secret="wrong"
    )
    async with Client(transport=wrong) as session:
        with pytest.raises(ApiKeyRejectedError, match="server said: 'invalid API key'"):
            await session.execute(CARRIERS)
    async with Client(transport=make_api_key(emulator.legacy_client)) as session:
        with pytest.raises(ApiKeyRejectedError, match="server said: 'API key authentication is"):
            await session.execute(CARRIERS)


async def test_quoted_refusal_is_scrubbed_of_the_secret(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A service that quotes the refused key has the secret blanked in the message."""
    client = emulator.recent_client
    error = {
        "message": f"no such key {client.client_id}:{client.client_secret}",
        "extensions": {"code": "UNAUTHENTICATED"},
    }
    emulator.fail_graphql_requests(1, body={"data": None, "errors": [error]})
    async with Client(transport=make_api_key()) as session:
        with pytest.raises(ApiKeyRejectedError) as caught:
            await session.execute(CARRIERS)
    assert f"server said: 'no such key {client.client_id}:***'" in str(caught.value)
    assert client.client_secret not in str(caught.value)


async def test_refusal_is_caught_by_existing_transport_query_error_handlers(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """Code that already catches gql's TransportQueryError keeps working."""
    async with Client(transport=make_api_key(emulator.legacy_client)) as session:
        with pytest.raises(TransportQueryError):
            await session.execute(CARRIERS)


async def test_wrong_secret_is_refused(emulator: Emulator) -> None:
    """A wrong secret is refused as an API key, with the same advice."""
    transport = ApiKeyTransport(
        emulator.graphql_url, client_id=emulator.recent_client.client_id, client_secret="wrong"
    )
    async with Client(transport=transport) as session:
        with pytest.raises(ApiKeyRejectedError):
            await session.execute(CARRIERS)


async def test_bare_401_is_a_refusal(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """HTTP 401 without a GraphQL body also raises ApiKeyRejectedError."""
    emulator.unauthenticated_status = 401
    emulator.unauthenticated_body = False
    async with Client(transport=make_api_key(emulator.legacy_client)) as session:
        with pytest.raises(ApiKeyRejectedError) as caught:
            await session.execute(CARRIERS)
    assert caught.value.errors is None


async def test_refused_batch_raises(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """A batch sent with a refused key raises ApiKeyRejectedError."""
    from gql import GraphQLRequest

    async with Client(transport=make_api_key(emulator.legacy_client)) as session:
        with pytest.raises(ApiKeyRejectedError):
            await session.execute_batch([GraphQLRequest(CARRIERS), GraphQLRequest(CARRIERS)])
    assert emulator.counters.graphql_requests == 1


async def test_user_headers_travel_with_the_key_and_stay_unmodified(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """The user's headers are sent too, and the transport's header dict is never mutated."""
    headers = {"X-Team": "billing"}
    transport = make_api_key(headers=headers)
    async with Client(transport=transport) as session:
        await session.execute(CARRIERS)
        await session.execute(CARRIERS, extra_args={"headers": {"X-Request": "42"}})
    first, second = emulator.requests
    assert first.headers["X-Team"] == "billing"
    assert second.headers["X-Request"] == "42"
    assert second.auth_scheme == "SERVICE-API-KEY"
    assert headers == {"X-Team": "billing"}
