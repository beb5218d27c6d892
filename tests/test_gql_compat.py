"""Code written for gql's AIOHTTPTransport keeps working: yarl URLs, and bare HTTP 401s.

gql's own aiohttp tests run against both transports too (``make gql-suite``); these tests
pin the behaviours that made them fail, through gql's ``Client`` and the emulator.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from gql import Client, GraphQLRequest, gql
from gql.transport.exceptions import TransportQueryError, TransportServerError
from support import COUNT
from yarl import URL

from gql_service_auth import (
    ApiKeyRejectedError,
    ApiKeyRejectedHTTPError,
    ApiKeyTransport,
    ConfigurationError,
    OAuth2Transport,
    UnauthenticatedError,
    UnauthenticatedHTTPError,
)
from gql_service_auth.emulator import Emulator

# What gql's own transport says of a bare 401 (aiohttp's ClientResponseError), and what
# gql's tests match.
GQL_401 = "401, message='Unauthorized'"

SUBSCRIPTION = gql("subscription { carrierRenamed { id } }")


def _bare_401(emulator: Emulator) -> None:
    """Refuse credentials with HTTP 401 and no body; OAuth2 tokens, even fresh, too."""
    emulator.unauthenticated_status, emulator.unauthenticated_body = 401, False
    emulator.refuse_all_tokens = True


async def test_url_and_token_url_may_be_yarl_urls(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    make_oauth2: Callable[..., OAuth2Transport],
) -> None:
    """A yarl.URL works for url and token_url, and is kept as given, as gql keeps it."""
    url, token_url = URL(emulator.graphql_url), URL(emulator.token_url)
    api_key = ApiKeyTransport(
        url,
        client_id=emulator.recent_client.client_id,
        client_secret=emulator.recent_client.client_secret,
    )
    oauth2 = make_oauth2(url=url, token_url=token_url)
    for transport in (api_key, oauth2):
        async with Client(transport=transport) as session:
            assert (await session.execute(COUNT))["carriers"]["totalCount"] == 25
        assert transport.url is url
        assert repr(transport).endswith(f"url={str(url)!r}>")
    assert oauth2.token_url is token_url
    assert emulator.counters.token_requests == 1


@pytest.mark.parametrize("field", ["url", "token_url"])
def test_a_yarl_url_over_plain_http_to_a_remote_host_is_refused(field: str) -> None:
    """The plain-http check holds for yarl URLs; allow_insecure_http still lifts it."""
    urls = {"url": URL("https://api.example.com/graphql"), "token_url": URL("https://a.example")}
    urls[field] = urls[field].with_scheme("http")
    with pytest.raises(ConfigurationError, match=f"plain http to .*example.*{field}"):
        OAuth2Transport(
            urls["url"], token_url=urls["token_url"], client_id="id", client_secret="s"
        )
    OAuth2Transport(
        urls["url"],
        token_url=urls["token_url"],
        client_id="id",
        client_secret="s",
        allow_insecure_http=True,
    )


@pytest.mark.parametrize("url", [URL("/graphql"), URL("ftp://127.0.0.1/graphql"), 42])
def test_a_relative_or_odd_url_is_refused(url: object) -> None:
    """A relative yarl.URL, another scheme, or neither str nor URL: a ConfigurationError."""
    with pytest.raises(ConfigurationError, match="url must be"):
        ApiKeyTransport(url, client_id="id", client_secret="s")  # type: ignore[arg-type]


async def test_a_bare_401_to_the_api_key_is_gqls_error_and_ours(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """Caught as gql's TransportServerError (code 401, gql's text) and as ApiKeyRejectedError."""
    _bare_401(emulator)
    async with Client(transport=make_api_key(emulator.legacy_client)) as session:
        with pytest.raises(TransportServerError) as info:  # as code written for gql catches it
            await session.execute(COUNT)
    caught = info.value
    assert caught.code == 401
    assert GQL_401 in str(caught)
    assert isinstance(caught, ApiKeyRejectedHTTPError)
    assert isinstance(caught, ApiKeyRejectedError)
    assert "registered before 2024-05-13" in str(caught)
    assert caught.errors is None
    assert isinstance(caught.__cause__, TransportServerError)
    assert emulator.counters.graphql_requests == 1


async def test_a_bare_401_to_an_api_key_batch_is_gqls_error_and_ours(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """A batch refused with a bare 401 raises the same error as a single request."""
    _bare_401(emulator)
    async with Client(transport=make_api_key(emulator.legacy_client)) as session:
        with pytest.raises(ApiKeyRejectedHTTPError) as caught:
            await session.execute_batch([GraphQLRequest(COUNT), GraphQLRequest(COUNT)])
    assert (caught.value.code, GQL_401 in str(caught.value)) == (401, True)


async def test_a_bare_401_after_spent_renewals_is_gqls_error_and_ours(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Once renewals are spent, the last bare 401 ends the call as both kinds of error."""
    _bare_401(emulator)
    async with Client(transport=make_oauth2(max_renewals=1)) as session:
        with pytest.raises(TransportServerError) as info:
            await session.execute(COUNT)
    caught = info.value
    assert caught.code == 401
    assert GQL_401 in str(caught)
    assert isinstance(caught, UnauthenticatedHTTPError)
    assert not isinstance(caught, ApiKeyRejectedError)
    assert "after 1 renewal(s)" in str(caught)
    assert emulator.counters.graphql_requests == 2
    assert emulator.counters.token_requests == 2


@pytest.mark.parametrize("kind", ["api_key", "oauth2"])
async def test_a_reconnecting_session_does_not_retry_a_bare_401(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    make_oauth2: Callable[..., OAuth2Transport],
    kind: str,
) -> None:
    """gql's reconnecting session, which retries most errors 5 times, sends no more."""
    _bare_401(emulator)
    transport = make_api_key(emulator.legacy_client) if kind == "api_key" else make_oauth2()
    client = Client(transport=transport)
    session = await client.connect_async(reconnecting=True)
    try:
        with pytest.raises(TransportServerError) as caught:
            await session.execute(COUNT)
    finally:
        await client.close_async()
    # What gql's retry condition looks at: a TransportQueryError is never retried.
    assert isinstance(caught.value, TransportQueryError)
    assert caught.value.code == 401
    assert emulator.counters.graphql_requests == (1 if kind == "api_key" else 2)


@pytest.mark.parametrize("kind", ["api_key", "oauth2"])
async def test_a_401_to_a_subscription_is_gqls_error_and_ours(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    make_oauth2: Callable[..., OAuth2Transport],
    kind: str,
) -> None:
    """gql raises TransportServerError for a 401 to a subscription; ours is that too."""
    _bare_401(emulator)
    transport = make_api_key(emulator.legacy_client) if kind == "api_key" else make_oauth2()
    expected = ApiKeyRejectedHTTPError if kind == "api_key" else UnauthenticatedHTTPError
    async with Client(transport=transport) as session:
        with pytest.raises(expected) as caught:
            async for _ in session.subscribe(SUBSCRIPTION):
                pass
    assert (caught.value.code, GQL_401 in str(caught.value)) == (401, True)
    assert emulator.counters.graphql_requests == 1


async def test_unauthenticated_in_a_graphql_body_stays_a_query_error_only(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A refusal the body explains (status 401 or not) is not a gql TransportServerError."""
    emulator.unauthenticated_status, emulator.refuse_all_tokens = 401, True
    async with Client(transport=make_oauth2(max_renewals=0)) as session:
        with pytest.raises(UnauthenticatedError) as caught:
            await session.execute(COUNT)
    assert not isinstance(caught.value, TransportServerError)
    assert caught.value.errors is not None
