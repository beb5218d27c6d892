"""Less travelled paths: subscriptions, odd token answers, failing hooks, the demo."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
from aiohttp import ClientResponseError
from gql import Client, gql
from gql.transport.exceptions import TransportQueryError, TransportServerError
from support import COUNT, exception_chain, wait_until

from gql_service_auth import (
    ApiKeyTransport,
    AuthEvent,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
)
from gql_service_auth._oauth2 import parse_retry_after
from gql_service_auth.emulator import Emulator

SUBSCRIPTION = gql("subscription { ticks }")
NO_WAIT_TWO = RetryPolicy(attempts=2, wait_initial=0, wait_max=0, wait_jitter=0)


async def test_refused_subscription_drops_the_token(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A subscription refused with UNAUTHENTICATED is not re-sent, but the next call renews."""
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        with pytest.raises(TransportQueryError):
            async for _ in session.subscribe(SUBSCRIPTION):
                pass  # pragma: no cover
        assert emulator.counters.token_requests == 1
        await session.execute(COUNT)
    assert emulator.counters.token_requests == 2


@pytest.mark.parametrize("status", [401, 502])
async def test_subscription_server_errors_are_scrubbed(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    make_api_key: Callable[..., ApiKeyTransport],
    status: int,
) -> None:
    """A bare error status on a subscription is gql's TransportServerError, headers blanked."""
    for transport in (make_oauth2(), make_api_key()):
        async with Client(transport=transport) as session:
            emulator.fail_graphql_requests(1, status, body=b"")
            with pytest.raises(TransportServerError) as caught:
                async for _ in session.subscribe(SUBSCRIPTION):
                    pass  # pragma: no cover
        # A 401 is our error, whose cause is gql's: aiohttp's record is further down the chain.
        (record,) = [
            e for e in exception_chain(caught.value) if isinstance(e, ClientResponseError)
        ]
        assert record.request_info.headers["Authorization"] == "***"


def test_retry_after_forms() -> None:
    """Retry-After is read as seconds or as an HTTP-date; nonsense is ignored."""
    later = datetime.now(timezone.utc) + timedelta(seconds=30)
    assert parse_retry_after(format_datetime(later, usegmt=True)) == pytest.approx(30, abs=2)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert parse_retry_after("2.5") == 2.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("inf") is None
    assert parse_retry_after(None) is None


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


async def test_a_failing_hook_does_not_break_authentication(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception in on_event is logged and the query still succeeds."""

    def broken(event: AuthEvent) -> None:
        raise RuntimeError("metrics backend down")

    async with Client(transport=make_oauth2(on_event=broken)) as session:
        result = await session.execute(COUNT)
    assert result["carriers"]["totalCount"] == 25
    messages = [r.getMessage() for r in caplog.records]
    assert "gql_service_auth.hook_failed event=token_fetched" in messages


async def test_events_are_logged_under_stable_names(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each event is a log record named gql_service_auth.<event> with structured fields."""
    caplog.set_level(logging.DEBUG, logger="gql_service_auth")
    async with Client(transport=make_oauth2()) as session:
        await session.execute(COUNT)
    # The fetch's thread logs the token just after handing it to the caller.
    await wait_until(lambda: any(r.name == "gql_service_auth" for r in caplog.records))
    (record,) = [r for r in caplog.records if r.name == "gql_service_auth"]
    assert record.getMessage().startswith("gql_service_auth.token_fetched reason=initial ")
    assert record.gql_service_auth["reason"] == "initial"  # type: ignore[attr-defined]


async def test_log_messages_carry_the_details_without_configuration(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The message itself says what happened (Python prints only it when unconfigured)."""
    emulator.fail_token_requests(2, 503)
    async with Client(transport=make_oauth2(retry=NO_WAIT_TWO)) as session:
        with pytest.raises(TokenRequestError):
            await session.execute(COUNT)

    def records_of_ours() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "gql_service_auth"]

    # The fetch's thread logs its failure just after handing it to the caller.
    await wait_until(lambda: len(records_of_ours()) == 2)
    records = records_of_ours()
    assert [r.getMessage().rsplit(" duration=", 1)[0] for r in records] == [
        "gql_service_auth.token_request_retry_scheduled status=503 "
        "error=temporarily_unavailable attempt=1/2 wait=0.000",
        "gql_service_auth.token_request_failed status=503 error=temporarily_unavailable "
        "attempt=2/2 reason=initial",
    ]
    # Lazy %-formatting: a constant template per event, the values as arguments.
    assert records[0].msg == (
        "gql_service_auth.token_request_retry_scheduled status=%d error=%s attempt=%d/%d wait=%.3f"
    )
    assert records[0].args == (503, "temporarily_unavailable", 1, 2, 0.0)
    fields = dict(records[1].gql_service_auth)  # type: ignore[attr-defined]
    assert fields.pop("duration") >= 0
    assert fields == {
        "reason": "initial",
        "attempt": 2,
        "max_attempts": 2,
        "status": 503,
        "error": "temporarily_unavailable",
    }


def test_server_text_in_a_log_message_stays_on_its_line(caplog: pytest.LogCaptureFixture) -> None:
    """An error code a server made up is quoted: it cannot forge a line or another field."""
    from gql_service_auth._events import Emitter

    caplog.set_level(logging.INFO, logger="gql_service_auth")
    Emitter(None)(AuthEvent("token_request_retry_scheduled", error="x\nstatus=200 ok"))
    assert caplog.records[-1].getMessage() == (
        "gql_service_auth.token_request_retry_scheduled error='x\\nstatus=200 ok'"
    )


def test_soak_script_runs_in_tiny_mode() -> None:
    """make soak's script works: a 3 s run with 10 workers passes its own checks."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"
    completed = subprocess.run(
        [sys.executable, "-W", "error", str(script), "--seconds", "3", "--workers", "10"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    figures = json.loads(completed.stdout)
    assert figures["queries_failed"] == 0
    assert figures["queries_ok"] > 0
    assert figures["token_requests"] >= 2
