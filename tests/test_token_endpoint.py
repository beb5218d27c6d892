"""The token request: what is sent, what is refused, and how failures are retried."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from gql import Client
from gql.transport.exceptions import TransportQueryError
from support import COUNT, closed_port, wait_until

from gql_service_auth import AuthEvent, OAuth2Transport, RetryPolicy, TokenRequestError
from gql_service_auth.emulator import ClientRecord, Emulator


def _token_requests(emulator: Emulator) -> list[dict[str, str]]:
    return [dict(r.form or {}) for r in emulator.requests if r.path == "/oauth2/token"]


async def test_form_body_carries_the_client_credentials_grant(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The request is a urlencoded form with grant_type, client_id and client_secret."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
    (request,) = [r for r in emulator.requests if r.path == "/oauth2/token"]
    assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert request.form == {
        "grant_type": "client_credentials",
        "client_id": emulator.recent_client.client_id,
        "client_secret": emulator.recent_client.client_secret,
    }
    assert "Authorization" not in request.headers


async def test_http_basic_client_authentication(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """With client_secret_basic the secret travels in the Basic header, not the form."""
    async with Client(transport=make_oauth2(token_auth_method="client_secret_basic")) as session:
        await session.execute(COUNT)
    (request,) = [r for r in emulator.requests if r.path == "/oauth2/token"]
    assert request.auth_scheme == "Basic"
    assert request.form == {"grant_type": "client_credentials"}


async def test_scope_and_extra_parameters_are_sent_on_every_fetch(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """scope (a list is space-joined) and token_params go with each token request."""
    transport = make_oauth2(scope=["carriers:read", "carriers:write"], token_params={"aud": "x"})
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        await session.execute(COUNT)
    forms = _token_requests(emulator)
    assert len(forms) == 2
    for form in forms:
        assert form["scope"] == "carriers:read carriers:write"
        assert form["aud"] == "x"


async def test_user_headers_and_cookies_stay_away_from_the_token_endpoint(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The GraphQL session's headers and cookies are not sent to the authorization server."""
    transport = make_oauth2(headers={"X-Team": "billing"}, cookies={"session": "abc"})
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
    token_request, graphql_request = emulator.requests
    assert "X-Team" not in token_request.headers
    assert "Cookie" not in token_request.headers
    assert graphql_request.headers["X-Team"] == "billing"
    assert "session=abc" in graphql_request.headers["Cookie"]


async def test_redirects_are_not_followed(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A redirect from the token endpoint is an error; the credentials go nowhere else."""
    emulator.fail_token_requests(1, 307, headers={"Location": emulator.token_url + "?again"})
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(TokenRequestError, match="redirect") as caught:
            await session.execute(COUNT)
    assert caught.value.status == 307
    assert emulator.counters.token_requests == 1


async def test_invalid_client_fails_at_once(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Wrong credentials give invalid_client after one request, with what to check."""
    transport = make_oauth2(ClientRecord(emulator.recent_client.client_id, "wrong-secret"))
    async with Client(transport=transport) as session:
        with pytest.raises(TokenRequestError) as caught:
            await session.execute(COUNT)
    error = caught.value
    assert (error.status, error.error, error.retryable) == (401, "invalid_client", False)
    assert error.error_description == "client authentication failed"
    assert "client_secret" in str(error)
    assert isinstance(error, TransportQueryError)
    assert emulator.counters.token_requests == 1
    assert emulator.counters.graphql_requests == 0


async def test_rfc_6749_error_fields_are_kept(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """error, error_description and error_uri of the body reach the exception."""
    emulator.fail_token_requests(
        1,
        400,
        body={"error": "invalid_scope", "error_description": "nope", "error_uri": "https://e/x"},
    )
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(TokenRequestError) as caught:
            await session.execute(COUNT)
    error = caught.value
    assert (error.error, error.error_description, error.error_uri) == (
        "invalid_scope",
        "nope",
        "https://e/x",
    )
    assert "scope" in str(error)
    assert emulator.counters.token_requests == 1


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
async def test_transient_failures_are_retried(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
    status: int,
) -> None:
    """429 and 5xx answers are retried, and the query succeeds once a token comes."""
    emulator.fail_token_requests(2, status)
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
    assert emulator.counters.token_requests == 3
    retries = [e for e in events if e.name == "token_request_retry_scheduled"]
    assert [(e.attempt, e.status) for e in retries] == [(1, status), (2, status)]


async def test_retries_stop_after_the_attempt_bound(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], events: list[AuthEvent]
) -> None:
    """A token endpoint that keeps failing is asked `attempts` times, then the caller is told."""
    emulator.fail_token_requests(100, 503)
    policy = RetryPolicy(attempts=3, wait_initial=0, wait_max=0, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(TokenRequestError) as caught:
            await session.execute(COUNT)
    assert caught.value.retryable
    assert caught.value.attempts == 3
    assert "after 3 attempts" in str(caught.value)
    assert emulator.counters.token_requests == 3
    # The fetch's thread publishes the error first and emits the event after it.
    await wait_until(lambda: bool(events) and events[-1].name == "token_request_failed")


async def test_retries_stop_at_the_time_bound(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """With slow failing answers, the total time bound ends the retries before the attempts."""
    emulator.fail_token_requests(100, 503)
    emulator.token_latency = 0.1
    policy = RetryPolicy(attempts=50, timeout=0.35, wait_initial=0, wait_max=0, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(TokenRequestError):
            await session.execute(COUNT)
    assert 2 <= emulator.counters.token_requests <= 5


async def test_retry_after_is_honoured(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], events: list[AuthEvent]
) -> None:
    """The wait before the next attempt is at least the server's Retry-After."""
    emulator.fail_token_requests(1, 429, retry_after=0.2)
    started = time.monotonic()
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
    (retry,) = [e for e in events if e.name == "token_request_retry_scheduled"]
    assert retry.wait == pytest.approx(0.2)
    assert time.monotonic() - started >= 0.2
    assert emulator.counters.token_requests == 2


async def test_retry_after_beyond_the_time_bound_fails_at_once(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A Retry-After longer than the remaining budget ends the fetch without sleeping."""
    emulator.fail_token_requests(1, 503, retry_after=120)
    policy = RetryPolicy(timeout=5, wait_initial=0, wait_max=0, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(TokenRequestError) as caught:
            await session.execute(COUNT)
    assert caught.value.retry_after == 120
    assert emulator.counters.token_requests == 1


async def test_unreachable_token_endpoint_is_retried_then_reported(
    make_oauth2: Callable[..., OAuth2Transport],
) -> None:
    """Connection refused is retried within the bound and reported as retryable."""
    policy = RetryPolicy(attempts=2, wait_initial=0, wait_max=0, wait_jitter=0)
    with closed_port() as port:
        transport = make_oauth2(token_url=f"http://127.0.0.1:{port}/oauth2/token", retry=policy)
        async with Client(transport=transport) as session:
            with pytest.raises(TokenRequestError, match="could not reach") as caught:
                await session.execute(COUNT)
    assert caught.value.status is None
    assert caught.value.retryable
    assert caught.value.attempts == 2


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"token_type": "Bearer", "expires_in": 60}, "without an access_token"),
        ({"access_token": ""}, "without an access_token"),
        ({"access_token": 42}, "without an access_token"),
        ("<html>login</html>", "not a JSON object"),
        ('["access_token"]', "not a JSON object"),
    ],
)
async def test_malformed_success_is_a_clear_error(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    body: object,
    match: str,
) -> None:
    """A 200 without a usable access_token is reported, not retried, not crashed on."""
    emulator.fail_token_requests(1, 200, body=body)  # type: ignore[arg-type]
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(TokenRequestError, match=match) as caught:
            await session.execute(COUNT)
    assert not caught.value.retryable
    assert emulator.counters.token_requests == 1


async def test_a_failed_fetch_is_not_remembered(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """After a failed fetch the next query starts a new one and succeeds."""
    emulator.fail_token_requests(1, 400)
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(TokenRequestError):
            await session.execute(COUNT)
        result = await session.execute(COUNT)
    assert result["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 2


async def test_reconnecting_session_does_not_retry_bad_credentials(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """gql's reconnecting session, which retries most errors 5 times, fails fast here."""
    transport = make_oauth2(ClientRecord(emulator.recent_client.client_id, "wrong-secret"))
    client = Client(transport=transport)
    session = await client.connect_async(reconnecting=True)
    try:
        with pytest.raises(TokenRequestError):
            await session.execute(COUNT)
    finally:
        await client.close_async()
    assert emulator.counters.token_requests == 1


@pytest.mark.parametrize("token", ["abc\r\nX-Injected: 1", "two words", "caf\u00e9", "tab\there"])
async def test_token_unfit_for_a_header_is_refused(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], token: str
) -> None:
    """A token with whitespace, control or non-ASCII characters is never put in a header."""
    emulator.fail_token_requests(1, 200, body={"access_token": token, "expires_in": 60})
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(TokenRequestError, match="cannot be sent in an HTTP header"):
            await session.execute(COUNT)
    assert emulator.counters.graphql_requests == 0
