"""AuthEvents and their log records: stable names, details in the message, hooks that fail."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from gql import Client
from support import (
    COUNT,
    wait_until,
)

from gql_service_auth import (
    AuthEvent,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
)
from gql_service_auth.emulator import Emulator

NO_WAIT_TWO = RetryPolicy(attempts=2, wait_initial=0, wait_max=0, wait_jitter=0)


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


async def test_server_text_in_a_log_message_stays_on_its_line(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An error code a server made up is quoted: it cannot forge a line or another field."""
    caplog.set_level(logging.INFO, logger="gql_service_auth")
    emulator.fail_token_requests(1, 503, body={"error": "x\nstatus=200 ok"})
    async with Client(transport=make_oauth2(retry=NO_WAIT_TWO)) as session:
        await session.execute(COUNT)  # the second attempt gets a token
    (record,) = [r for r in caplog.records if "retry_scheduled" in r.getMessage()]
    assert record.getMessage() == (
        "gql_service_auth.token_request_retry_scheduled status=503 error='x\\nstatus=200 ok' "
        "attempt=1/2 wait=0.000"
    )
