"""Faults not covered elsewhere; tests/README.md maps every fault to its test."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from gql import Client
from support import COUNT

from gql_service_auth import (
    ApiKeyTransport,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
    UnauthenticatedError,
)
from gql_service_auth.emulator import Emulator


@pytest.fixture
def other_host() -> Iterator[Emulator]:
    """A second emulator on 127.0.0.2: another origin, still this machine."""
    with Emulator(host="127.0.0.2").run_in_thread() as running:
        yield running


async def test_hanging_token_endpoint_fails_within_the_time_bound(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A token endpoint that never answers ends in a retryable error once the budget is spent."""
    emulator.token_latency = 5.0
    policy = RetryPolicy(attempts=5, timeout=0.3, wait_initial=0, wait_max=0, wait_jitter=0)
    started = time.monotonic()
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(TokenRequestError, match="could not reach") as caught:
            await session.execute(COUNT)
    assert time.monotonic() - started < 2.0
    assert caught.value.retryable
    assert emulator.counters.token_requests <= 2
    assert emulator.counters.graphql_requests == 0


async def test_unsupported_grant_type_points_at_the_token_url(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """unsupported_grant_type fails at once and says token_url may be wrong."""
    emulator.fail_token_requests(1, 400, body={"error": "unsupported_grant_type"})
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(TokenRequestError, match="token_url") as caught:
            await session.execute(COUNT)
    assert caught.value.error == "unsupported_grant_type"
    assert emulator.counters.token_requests == 1


@pytest.mark.parametrize("kind", ["oauth2", "api_key"])
async def test_credentials_do_not_follow_a_redirect_to_another_host(
    emulator: Emulator,
    other_host: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    make_api_key: Callable[..., ApiKeyTransport],
    kind: str,
) -> None:
    """A GraphQL redirect to another origin arrives there without the Authorization header."""
    transport = make_oauth2(max_renewals=0) if kind == "oauth2" else make_api_key()
    location = {"Location": other_host.graphql_url}
    async with Client(transport=transport) as session:
        if kind == "oauth2":
            await session.execute(COUNT)  # fetch the token first, so only the query redirects
        emulator.fail_graphql_requests(1, 307, body=b"", headers=location)
        # The other host sees no credentials and refuses: the caller gets a typed error.
        with pytest.raises(UnauthenticatedError):
            await session.execute(COUNT)
    (redirected,) = other_host.requests
    assert "Authorization" not in redirected.headers
