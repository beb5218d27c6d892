"""Fuzzing through the public API: whatever the servers answer, only documented errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from gql import Client
from gql.transport.exceptions import TransportError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import COUNT

from gql_service_auth import OAuth2Transport, TokenRequestError, UnauthenticatedError
from gql_service_auth.emulator import Emulator

# The emulator fixture is started once per test and reset between examples on purpose.
# derandomize: CI runs the same examples every time; explore locally with more examples.
FUZZ = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
expires_in_values = (
    st.none()
    | st.integers(min_value=-(10**12), max_value=10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["3600", " 60 ", "1e3", "-5", "nan", "inf", "0x10"])
)
UNAUTHENTICATED = {"message": "no", "extensions": {"code": "UNAUTHENTICATED"}}
errors_values = (
    json_values
    | st.lists(json_values | st.just(UNAUTHENTICATED), max_size=5)
    | st.lists(st.just({"extensions": {"code": "UNAUTHENTICATED"}}), min_size=200, max_size=500)
)


def _query(make_oauth2: Callable[..., OAuth2Transport]) -> BaseException | None:
    async def run() -> None:
        # Each example a scenario of its own: no token shared with the one before.
        async with Client(transport=make_oauth2(share_tokens=False)) as session:
            await session.execute(COUNT)

    try:
        asyncio.run(run())
    except Exception as exc:
        return exc
    return None


@FUZZ
@given(
    status=st.integers(min_value=200, max_value=599),
    body=json_values.map(lambda value: json.dumps(value).encode()) | st.binary(max_size=64),
)
def test_any_token_endpoint_answer(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], status: int, body: bytes
) -> None:
    """Any status and body from the token endpoint: success or a TokenRequestError, bounded."""
    emulator.reset_counters()
    emulator.fail_token_requests(1, status, body=body)
    error = _query(make_oauth2)
    assert error is None or isinstance(error, (TokenRequestError, UnauthenticatedError)), error
    assert emulator.counters.token_requests <= 4


@FUZZ
@given(access_token=json_values, expires_in=expires_in_values, extra=json_values)
def test_any_token_document(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    access_token: Any,
    expires_in: Any,
    extra: Any,
) -> None:
    """Any access_token and expires_in in a 200 answer: no crash, bounded requests."""
    emulator.reset_counters()
    document = {"access_token": access_token, "expires_in": expires_in, "extra": extra}
    emulator.fail_token_requests(1, 200, body=json.dumps(document).encode())
    error = _query(make_oauth2)
    assert error is None or isinstance(error, (TokenRequestError, UnauthenticatedError)), error
    assert emulator.counters.token_requests <= 2
    assert emulator.counters.graphql_requests <= 2


@FUZZ
@given(expires_in=expires_in_values.filter(lambda value: value is not None))
def test_any_expires_in_with_a_real_token(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], expires_in: Any
) -> None:
    """A real token with any expires_in (strings, NaN, negative, huge) serves the query."""
    emulator.reset_counters()
    emulator.expires_in_override = expires_in
    assert _query(make_oauth2) is None
    assert emulator.counters.token_requests == 1


@FUZZ
@given(errors=errors_values, data=json_values, status=st.sampled_from([200, 400, 401, 500]))
def test_any_errors_member(
    emulator: Emulator,
    make_oauth2: Callable[..., OAuth2Transport],
    errors: Any,
    data: Any,
    status: int,
) -> None:
    """Any errors/data shape from the API: gql's errors or ours, never a loop or a crash."""
    emulator.reset_counters()
    emulator.fail_graphql_requests(1, status, body={"data": data, "errors": errors})
    error = _query(make_oauth2)
    if isinstance(error, AssertionError):
        # gql's own Client asserts when an answer has neither data nor errors (null or
        # empty), with plain AIOHTTPTransport too: a drop-in keeps that behaviour.
        assert str(error) == "Transport returned an ExecutionResult without data or errors"
        assert data is None
        assert not errors
    else:
        assert error is None or isinstance(error, TransportError), repr(error)[:200]
    assert emulator.counters.graphql_requests <= 2
    assert emulator.counters.token_requests <= 2
