"""The per-request path: shared, read-only credentials, and what each request sends.

Requests without ``extra_args`` share what carries their credential: the API key is a
default header of each event loop's session, a token's header is built once per token.
These tests check that every request still sends the right header, whatever the loop,
thread, token or ``extra_args``, and that nothing shared shows or leaks a credential.
"""

from __future__ import annotations

import asyncio
import copy
import pickle
import time
from collections.abc import Callable

import pytest
from gql import Client
from gql.transport.exceptions import TransportQueryError
from support import (
    COUNT,
    STACK_REASONS,
    execute_on_threads,
    renewed,
    wait_until,
)

from gql_service_auth import (
    ApiKeyTransport,
    OAuth2Transport,
)
from gql_service_auth.emulator import Emulator, ManualClock


def sent(emulator: Emulator) -> list[str]:
    return [r.headers.get("Authorization", "") for r in emulator.requests if r.path == "/graphql"]


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
def test_the_api_key_goes_with_every_loop_and_thread(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """Each loop's session carries the key: blocking calls from 4 threads, then an async one."""
    transport = make_api_key()
    assert execute_on_threads(transport, 4) == []

    async def main() -> None:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)

    asyncio.run(main())
    key = f"SERVICE-API-KEY {emulator.recent_client.client_id}:"
    assert len(sent(emulator)) == 5
    assert all(header.startswith(key) for header in sent(emulator))


async def test_extra_args_headers_travel_and_the_callers_authorization_is_sent_as_it_is(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    make_oauth2: Callable[..., OAuth2Transport],
) -> None:
    """Other headers travel beside the credential. A per-request Authorization is the
    caller's: sent as it is, as on every stack (tests/test_stacks.py), and the call after
    it carries the credential again; the caller's arguments are left as they were."""
    extra = {"headers": {"Authorization": "Bearer not-mine", "X-Trace": "7"}}
    for transport in (make_api_key(), make_oauth2()):
        async with Client(transport=transport) as session:
            with pytest.raises(TransportQueryError):
                await session.execute(COUNT, extra_args=extra)
            await session.execute(COUNT, extra_args={"headers": {"X-Trace": "8"}})
    graphql = [r for r in emulator.requests if r.path == "/graphql"]
    assert [r.auth_scheme for r in graphql] == ["Bearer", "SERVICE-API-KEY", "Bearer", "Bearer"]
    assert [r.headers.get("X-Trace") for r in graphql] == ["7", "8", "7", "8"]
    assert emulator.counters.token_requests == 1
    assert extra == {"headers": {"Authorization": "Bearer not-mine", "X-Trace": "7"}}


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["kw"])
async def test_client_session_headers_travel_with_the_api_key(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """Headers given through client_session_args are kept beside the key."""
    transport = make_api_key(client_session_args={"headers": {"X-Tenant": "north"}})
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
    (request,) = emulator.requests
    assert request.headers["X-Tenant"] == "north"
    assert request.auth_scheme == "SERVICE-API-KEY"


async def test_each_request_sends_the_token_it_was_checked_with(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Across renewals, queries in flight keep their token, and new ones take the new one."""
    transport = make_oauth2()
    emulator.graphql_latency = 0.2  # the first wave is still in flight when the token changes
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        assert transport.token is not None
        first = transport.token.authorization
        wave = asyncio.gather(*(session.execute(COUNT) for _ in range(20)))
        await wait_until(lambda: emulator.counters.graphql_requests == 21)
        clock.advance(3600 - 60 + 1)  # past renew_at: the next query renews in the background
        await session.execute(COUNT)
        await wait_until(renewed(transport, 2))
        emulator.graphql_latency = 0.0
        await asyncio.gather(*(session.execute(COUNT) for _ in range(20)))
        second = transport.token.authorization
        await wave
    assert second != first
    assert sent(emulator) == [first] * 22 + [second] * 20
    assert emulator.counters.unauthenticated_responses == 0


async def test_shared_credentials_never_show(
    emulator: Emulator,
    make_api_key: Callable[..., ApiKeyTransport],
    make_oauth2: Callable[..., OAuth2Transport],
) -> None:
    """After requests, repr and vars of the transports show no credential; copies work."""
    client = emulator.recent_client
    # Built with the real clock and no hook, which copy as settings do.
    oauth2 = make_oauth2(clock=time.monotonic, on_event=None)
    for transport in (make_api_key(), oauth2):
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
            texts = [repr(transport), repr(vars(transport))]
            texts += [repr(value) for value in vars(transport).values()]
            assert not any(client.client_secret in text for text in texts)
            token = getattr(transport, "token", None)
            if token is not None:
                assert not any(token.value in text for text in texts)
            clone = copy.deepcopy(transport)
            restored = pickle.loads(pickle.dumps(transport))
        for copied in (clone, restored):
            async with Client(transport=copied) as session:
                await session.execute(COUNT)
    assert len(sent(emulator)) == 6


async def test_vars_and_copies_of_a_transport_in_use_hide_the_token(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """What requests share to carry the token hides it; copies leave it behind."""
    transport = make_oauth2(clock=time.monotonic, on_event=None)  # picklable settings
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        await session.execute(COUNT)  # the fast path builds the shared arguments
    assert transport.token is not None
    value = transport.token.value
    assert value not in repr(vars(transport))
    for clone in (
        copy.copy(transport),
        copy.deepcopy(transport),
        pickle.loads(pickle.dumps(transport)),
    ):
        assert value not in repr(vars(clone))
