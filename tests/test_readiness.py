"""``transport.check()``: the credentials and the API checked now, from the application
(a readiness probe, a start that fails at once), on every stack and both methods."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gql import Client
from support import COUNT, HANG_GUARD
from test_application_errors import CASES, CLASSES, Silent, make

from gql_service_auth import (
    ApiKeyRejectedError,
    ConfigurationError,
    ServiceHTTPError,
    ServiceTimeoutError,
    ServiceUnreachableError,
    TokenRequestError,
)
from gql_service_auth.emulator import Emulator

SYNC = ("requests", "httpx")


def run_check(transport: Any, case: str, **kwargs: Any) -> None:
    """``check()`` as the application calls it: blocking on a sync stack, awaited on an
    async one (on asyncio; trio below)."""
    if case.rpartition("-")[0] in SYNC:
        transport.check(**kwargs)
    else:
        asyncio.run(transport.check(**kwargs))


def run_query(transport: Any, case: str) -> Any:
    """The application's query, as the application runs it (gql's sync execute after an
    asyncio.run would leave gql's own event loop unclosed)."""
    if case.rpartition("-")[0] in SYNC:
        return Client(transport=transport).execute(COUNT)

    async def query() -> Any:
        async with Client(transport=transport) as session:
            return await session.execute(COUNT)

    return asyncio.run(query())


@pytest.mark.parametrize("case", CASES)
def test_a_check_of_good_credentials_passes_and_keeps_its_token(
    emulator: Emulator, case: str
) -> None:
    """One check query, at most one token request; the application's next query uses
    the token the check fetched, and the transport is left as it was (not connected)."""
    transport = make(case, emulator)
    run_check(transport, case)
    assert emulator.counters.graphql_requests == 1
    oauth2 = case.endswith("oauth2")
    assert emulator.counters.token_requests == (1 if oauth2 else 0)
    run_check(transport, case)  # a probe every few seconds: no new token
    assert run_query(transport, case) == {"carriers": {"totalCount": 25}}
    assert emulator.counters.token_requests == (1 if oauth2 else 0)
    assert emulator.counters.graphql_requests == 3


@pytest.mark.parametrize("case", CASES)
def test_a_check_of_a_wrong_secret_fails_with_the_error_a_query_would_meet(
    emulator: Emulator, case: str
) -> None:
    """A wrong secret: the start (or the probe) fails at once, with the same error and
    message the first query would have met."""
    transport = make(case, emulator, client_secret="not-the-secret-9f3a")
    expected = TokenRequestError if case.endswith("oauth2") else ApiKeyRejectedError
    with pytest.raises(expected) as caught:
        run_check(transport, case)
    assert "not-the-secret-9f3a" not in str(caught.value)
    assert emulator.counters.graphql_requests == (0 if case.endswith("oauth2") else 1)


@pytest.mark.parametrize("case", CASES)
def test_a_check_of_a_wrong_url_names_it(emulator: Emulator, case: str) -> None:
    """The API's URL wrong: the error names it, as a query's would."""
    url = f"{emulator.base_url}/v2/graphql"
    with pytest.raises(ServiceHTTPError, match=f"nothing answers GraphQL at {url}"):
        run_check(make(case, emulator, url), case)


@pytest.mark.parametrize("case", [c for c in CASES if c.rpartition("-")[0] not in SYNC])
async def test_a_check_on_a_connected_transport_leaves_it_connected(
    emulator: Emulator, case: str
) -> None:
    """Inside a running client (a FastAPI lifespan's), the check uses its session and
    leaves it open."""
    transport = make(case, emulator)
    async with Client(transport=transport) as session:
        await transport.check()
        assert (await session.execute(COUNT)) == {"carriers": {"totalCount": 25}}


@pytest.mark.parametrize("case", [c for c in CASES if c.rpartition("-")[0] in SYNC])
def test_a_check_on_a_connected_sync_transport_leaves_it_connected(
    emulator: Emulator, case: str
) -> None:
    transport = make(case, emulator)
    with Client(transport=transport) as session:
        transport.check()
        assert session.execute(COUNT) == {"carriers": {"totalCount": 25}}


@pytest.mark.parametrize("case", CASES)
def test_a_check_of_an_api_that_never_answers_ends_within_its_timeout(
    emulator: Emulator, case: str
) -> None:
    """A hanging API: the check ends at its timeout, naming the URL (the stack's own
    timeout on a sync stack, the check's deadline on an async one)."""
    sync = case.rpartition("-")[0] in SYNC
    expected = ServiceUnreachableError if sync else ServiceTimeoutError
    silent = Silent()
    try:
        url = f"http://127.0.0.1:{silent.port}/graphql"
        with pytest.raises(expected) as caught:
            run_check(make(case, emulator, url, timeout=HANG_GUARD), case, timeout=0.5)
    finally:
        silent.close()
    bound = "within 0.5 s (the transport's timeout)" if sync else "within the 0.5 s"
    assert f"no answer from {url} {bound}" in str(caught.value)


@pytest.mark.parametrize("method", ["api_key", "oauth2"])
def test_a_check_runs_under_trio(emulator: Emulator, method: str) -> None:
    trio = pytest.importorskip("trio")
    transport = make(f"httpx-async-{method}", emulator)
    trio.run(transport.check)
    assert emulator.counters.graphql_requests == 1


@pytest.mark.parametrize("timeout", [0, -1, "10", True])
def test_a_bad_timeout_is_refused(emulator: Emulator, timeout: Any) -> None:
    for stack in CLASSES:
        with pytest.raises(ConfigurationError, match="timeout must be a positive number"):
            run_check(make(f"{stack}-api_key", emulator), f"{stack}-api_key", timeout=timeout)
    assert emulator.counters.graphql_requests == 0


@pytest.mark.parametrize("case", [c for c in CASES if c.rpartition("-")[0] not in SYNC])
def test_checks_at_once_and_the_applications_own_calls_leave_each_other_alone(
    emulator: Emulator, case: str
) -> None:
    """Probes overlapping each other and the application's calls that connect and close
    the same transport (a client per unit of work): none fails the other, and the token
    is one, shared."""
    transport = make(case, emulator)

    async def application() -> None:
        for _ in range(10):
            async with Client(transport=transport) as session:
                await session.execute(COUNT)

    async def probes() -> None:
        for _ in range(10):
            await asyncio.gather(*(transport.check() for _ in range(4)))

    async def main() -> None:
        await asyncio.gather(application(), probes())

    asyncio.run(main())
    assert emulator.counters.token_requests == (1 if case.endswith("oauth2") else 0)


@pytest.mark.parametrize("case", [c for c in CASES if c.rpartition("-")[0] in SYNC])
def test_checks_from_threads_leave_each_other_alone(emulator: Emulator, case: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    transport = make(case, emulator)
    with ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(transport.check) for _ in range(24)]:
            future.result(timeout=HANG_GUARD)
    assert emulator.counters.graphql_requests == 24
    assert emulator.counters.token_requests == (1 if case.endswith("oauth2") else 0)
