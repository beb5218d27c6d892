"""The token request: what is sent, what is refused, and how failures are retried."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import pytest
from gql import Client
from gql.transport.exceptions import TransportQueryError
from support import (
    COUNT,
    HANG_GUARD,
    ONE_ATTEMPT,
    closed_port,
    finish,
    start_thread,
    sync_execute,
    wait_until,
)

from gql_service_auth import (
    AuthEvent,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
)
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
    # 50 attempts of 0.1 s or more cannot fit in 2 s: the time bound ends them, however
    # slow the machine; it leaves room for more than one, however slow the machine.
    policy = RetryPolicy(attempts=50, timeout=2.0, wait_initial=0, wait_max=0, wait_jitter=0)
    async with Client(transport=make_oauth2(retry=policy)) as session:
        with pytest.raises(TokenRequestError):
            await session.execute(COUNT)
    assert 2 <= emulator.counters.token_requests < 50


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
            with pytest.raises(
                TokenRequestError, match=r"could not reach the token endpoint http://127\.0\.0\.1"
            ) as caught:
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


async def test_hanging_token_endpoint_fails_within_the_time_bound(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A token endpoint that never answers ends in a retryable error once the budget is spent."""
    emulator.freeze_token_endpoint(HANG_GUARD)  # it answers only once the test is over
    policy = RetryPolicy(attempts=5, timeout=0.3, wait_initial=0, wait_max=0, wait_jitter=0)
    started = time.monotonic()
    try:
        async with Client(transport=make_oauth2(retry=policy)) as session:
            with pytest.raises(
                TokenRequestError, match="no answer from the token endpoint"
            ) as caught:
                await session.execute(COUNT)
    finally:
        emulator.freeze_token_endpoint(0)
    # The 0.3 s bound, not the outage's end nor gql's 10 s execute_timeout: a bound, with
    # a margin no loaded machine takes, between them.
    assert time.monotonic() - started < 5
    assert caught.value.retryable
    assert emulator.counters.token_requests <= 2
    assert emulator.counters.graphql_requests == 0


@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_hanging_token_endpoint_fails_with_token_request_error_within_gqls_timeout(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Default RetryPolicy, gql's default execute_timeout: a hanging endpoint ends in our error."""
    emulator.token_latency = 30
    with pytest.raises(TokenRequestError):
        async with Client(transport=make_oauth2(retry=RetryPolicy())) as session:
            await session.execute(COUNT)


@pytest.mark.usefixtures("no_resource_left_open")
def test_a_slow_resolver_does_not_stretch_a_fetch_past_its_bound(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """getaddrinfo stuck until the test lets it go: the fetch ends in TokenRequestError at
    its 0.5 s bound, while the resolver is still stuck (before: the error came out only
    once the resolver returned)."""
    real_getaddrinfo = socket.getaddrinfo
    release, returned = threading.Event(), threading.Event()

    def stuck(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "localhost":
            release.wait(HANG_GUARD)
            returned.set()
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", stuck)
    token_url = emulator.token_url.replace("127.0.0.1", "localhost")
    transport = make_oauth2(token_url=token_url, retry=RetryPolicy(timeout=0.5, wait_jitter=0))
    try:
        outcome = finish(start_thread(lambda: sync_execute(transport, 2 * HANG_GUARD)))
        assert not returned.is_set(), "the outcome waited for the resolver"
    finally:
        release.set()
    assert isinstance(outcome, TokenRequestError)


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


async def test_unknown_token_error_codes_still_explain(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """An unknown error code with 403 points at the credentials; a bare 418 at the URL."""
    emulator.fail_token_requests(1, 403, body={"error": "access_denied"})
    emulator.fail_token_requests(1, 418, body=b"teapot")
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(TokenRequestError, match="client_secret"):
            await session.execute(COUNT)
        with pytest.raises(TokenRequestError, match="token_url") as caught:
            await session.execute(COUNT)
    assert caught.value.error is None


async def test_retry_after_forms(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Retry-After is read as seconds or as an HTTP-date; nonsense is ignored."""

    async def retry_after(value: str | None) -> float | None:
        """The retry_after of the error a 429 with this Retry-After ends in (one attempt)."""
        emulator.fail_token_requests(
            1, 429, headers={} if value is None else {"Retry-After": value}
        )
        async with Client(transport=make_oauth2(retry=ONE_ATTEMPT)) as session:
            with pytest.raises(TokenRequestError) as caught:
                await session.execute(COUNT)
        return caught.value.retry_after

    later = datetime.now(timezone.utc) + timedelta(seconds=30)
    assert await retry_after(format_datetime(later, usegmt=True)) == pytest.approx(30, abs=2)
    assert await retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert await retry_after("2.5") == 2.5
    assert await retry_after("-3") == 0.0
    assert await retry_after("soon") is None
    assert await retry_after("inf") is None
    assert await retry_after(None) is None


async def test_oversized_token_answer_is_refused(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A token endpoint that sends megabytes is stopped after 64 KiB, with a clear error."""
    emulator.fail_token_requests(1, 200, body=b"x" * (1024 * 1024))
    async with Client(transport=make_oauth2()) as session:
        with pytest.raises(TokenRequestError, match="more than"):
            await session.execute(COUNT)


async def test_token_answer_arriving_in_pieces_is_read_whole(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A token body delivered in two chunks with a pause between them is read in full."""
    emulator.token_body_delay = 0.05
    async with Client(transport=make_oauth2()) as session:
        result = await session.execute(COUNT)
    assert result["carriers"]["totalCount"] == 25


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
    async with Client(transport=make_oauth2(share_tokens=False)) as session:
        result = await session.execute(COUNT)
    assert result["carriers"]["totalCount"] == 25
    assert emulator.counters.token_requests == 1
