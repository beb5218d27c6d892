"""The token provider: the Authorization value for code that is not an HTTP client of the
package's, under threads, asyncio, trio and fork."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import trio
from support import ANSWER, COUNT, NO_WAIT, in_child, unfolded
from ways import AIOHTTP, Call

from gql_service_auth import (
    AsyncTokenProvider,
    OAuth2Transport,
    TokenBudget,
    TokenProvider,
    TokenRequestError,
)
from gql_service_auth.emulator import Emulator

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "websocket_token.py"
QUERY = b'{"query": "query { carriers(first: 1) { totalCount } }"}'


def provider_of(cls: Any, emulator: Emulator, **kwargs: Any) -> Any:
    client = emulator.recent_client
    kwargs.setdefault("retry", NO_WAIT)
    return cls(
        emulator.token_url,
        client.client_id,
        kwargs.pop("client_secret", client.client_secret),
        **kwargs,
    )


def answer(emulator: Emulator, authorization: str) -> object:
    """What the API answers a plain request carrying ``authorization``."""
    request = urllib.request.Request(
        emulator.graphql_url,
        data=QUERY,
        headers={"Authorization": authorization, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"]


def test_threads_share_one_token_fetch(emulator: Emulator) -> None:
    emulator.token_latency = 0.2  # every thread asks while the fetch is under way
    provider = provider_of(TokenProvider, emulator)
    with ThreadPoolExecutor(8) as pool:
        values = list(pool.map(lambda _: provider.authorization(), range(8)))
    assert len(set(values)) == 1
    assert values[0].startswith("Bearer ")
    assert answer(emulator, values[0]) == ANSWER
    assert emulator.counters.token_requests == 1


def test_asyncio_tasks_share_one_token_fetch(emulator: Emulator) -> None:
    emulator.token_latency = 0.2
    provider = provider_of(AsyncTokenProvider, emulator)

    async def main() -> list[str]:
        return await asyncio.gather(*(provider.authorization() for _ in range(20)))

    values = asyncio.run(main())
    assert len(set(values)) == 1
    assert emulator.counters.token_requests == 1


def test_trio_tasks_share_one_token_fetch(emulator: Emulator) -> None:
    emulator.token_latency = 0.2
    provider = provider_of(AsyncTokenProvider, emulator)
    values: list[str] = []

    async def ask() -> None:
        values.append(await provider.authorization())

    async def main() -> None:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for _ in range(10):
                    nursery.start_soon(ask)

    trio.run(main)
    assert len(values) == 10
    assert len(set(values)) == 1
    assert emulator.counters.token_requests == 1


def test_a_refused_value_is_renewed_once_for_every_caller(emulator: Emulator) -> None:
    provider = provider_of(TokenProvider, emulator)
    first = provider.authorization()
    emulator.revoke_tokens()
    for _ in range(5):  # five callers were refused with it
        provider.refused(first)
    with ThreadPoolExecutor(5) as pool:
        renewed = set(pool.map(lambda _: provider.authorization(), range(5)))
    assert len(renewed) == 1
    assert renewed != {first}
    assert answer(emulator, renewed.pop()) == ANSWER
    assert emulator.counters.token_requests == 2


def test_a_value_already_replaced_is_ignored(emulator: Emulator) -> None:
    provider = provider_of(TokenProvider, emulator)
    first = provider.authorization()
    provider.refused(first.removeprefix("Bearer "))  # the bare token will do too
    second = provider.authorization()
    provider.refused(first)  # late: a caller that held the old one
    assert provider.authorization() == second
    assert emulator.counters.token_requests == 2


def test_the_provider_shares_the_token_of_the_transports(emulator: Emulator) -> None:
    """Same credentials, same API: the transport and the provider cost one token."""
    provider = provider_of(TokenProvider, emulator, url=emulator.graphql_url)
    client = emulator.recent_client
    transport = OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        client_id=client.client_id,
        client_secret=client.client_secret,
        retry=NO_WAIT,
    )
    assert AIOHTTP.one(transport, Call(COUNT)) == ANSWER
    assert provider.authorization() == f"Bearer {transport.token.value}"  # type: ignore[union-attr]
    assert emulator.counters.token_requests == 1


def test_a_forked_child_uses_the_token_and_renews_on_its_own(emulator: Emulator) -> None:
    provider = provider_of(TokenProvider, emulator)
    first = provider.authorization()

    def child() -> None:
        assert provider.authorization() == first  # inherited, still valid
        provider.refused(first)
        assert provider.authorization() != first  # fetched on a thread of the child's

    assert in_child(child, timeout=60) == (0, "ok")


def test_refused_credentials_are_not_asked_again_at_once(emulator: Emulator) -> None:
    provider = provider_of(
        TokenProvider,
        emulator,
        client_secret="wrong-secret",
        token_budget=TokenBudget(refusal_wait=600, refusal_wait_max=600),
    )
    for _ in range(3):
        with pytest.raises(TokenRequestError, match="invalid_client"):
            provider.authorization()
    assert emulator.counters.token_requests == 1


def test_from_env_reads_the_service_variables(emulator: Emulator) -> None:
    provider = TokenProvider.from_env(emulator.environ() | {"SERVICE_AUTH_URL": emulator.auth_url})
    assert answer(emulator, provider.authorization()) == ANSWER


def test_the_provider_shows_no_secret_or_token(emulator: Emulator) -> None:
    provider = provider_of(TokenProvider, emulator)
    value = provider.authorization()
    shown = unfolded(provider, depth=3)
    assert emulator.recent_client.client_secret not in shown
    assert value.removeprefix("Bearer ") not in shown
    assert "client_id='emu-recent-client'" in repr(provider)


def test_a_websocket_client_gets_a_fresh_token_at_each_connect(emulator: Emulator) -> None:
    """gql's websocket transport, its init_payload from the provider at each connect: a
    connection refused (4403) hands the token back, and the next connect renews it."""
    from gql import Client
    from gql.transport.aiohttp_websockets import AIOHTTPWebsocketsTransport
    from gql.transport.exceptions import TransportConnectionFailed

    provider = provider_of(AsyncTokenProvider, emulator)
    url = emulator.graphql_url.replace("http", "ws", 1)

    async def connect_and_query() -> object:
        transport = AIOHTTPWebsocketsTransport(url=url)
        transport.init_payload = {"Authorization": await provider.authorization()}
        try:
            async with Client(transport=transport) as session:
                return await session.execute(COUNT)
        except TransportConnectionFailed:
            provider.refused(transport.init_payload["Authorization"])
            raise

    assert asyncio.run(connect_and_query()) == ANSWER
    emulator.revoke_tokens()
    with pytest.raises(TransportConnectionFailed):
        asyncio.run(connect_and_query())
    assert asyncio.run(connect_and_query()) == ANSWER
    assert emulator.counters.token_requests == 2
    assert emulator.counters.websocket_connections == 3


def test_accepted_tokens_keep_later_refusals_from_pausing_renewals(emulator: Emulator) -> None:
    """Tokens the API accepted, then revoked one after another: each is renewed, as the
    transports' are, with no pause of renewals."""
    provider = provider_of(TokenProvider, emulator)
    for _ in range(4):
        value = provider.authorization()
        assert answer(emulator, value) == ANSWER
        provider.accepted(value)
        emulator.revoke_tokens()
        provider.refused(value)
    assert answer(emulator, provider.authorization()) == ANSWER
    assert emulator.counters.token_requests == 5


def test_refused_takes_the_value_in_any_case_of_its_scheme(emulator: Emulator) -> None:
    provider = provider_of(TokenProvider, emulator)
    first = provider.authorization()
    provider.refused("bearer " + first.removeprefix("Bearer "))
    assert provider.authorization() != first


def test_from_env_needs_no_api_url(emulator: Emulator) -> None:
    environ = emulator.environ()
    del environ["SERVICE_BASE_URL"]
    provider = TokenProvider.from_env(environ)
    assert provider.url is None
    assert answer(emulator, provider.authorization()) == ANSWER


def test_the_examples_websocket_transport_reconnects_after_a_refusal(emulator: Emulator) -> None:
    """examples/websocket_token.py's transport in a reconnecting gql session: refused at
    connect, it closes, hands the token back, and the next connect goes with a new one."""
    from gql import Client

    spec = importlib.util.spec_from_file_location("websocket_token", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    provider = provider_of(AsyncTokenProvider, emulator)
    url = emulator.graphql_url.replace("http", "ws", 1)

    async def main() -> object:
        await provider.authorization()
        emulator.revoke_tokens()  # the first connect is refused
        client = Client(transport=example.TokenWebsocketsTransport(provider, url=url))
        connecting = client.connect_async(
            reconnecting=True, retry_connect=_quick_retries(), retry_execute=False
        )
        session = await asyncio.wait_for(connecting, 30)  # a guard: gql's may never end
        try:
            return await asyncio.wait_for(session.execute(COUNT), 30)
        finally:
            await client.close_async()

    assert asyncio.run(main()) == ANSWER
    assert emulator.counters.token_requests == 2
    assert emulator.counters.websocket_connections == 2


def _quick_retries() -> Any:
    import tenacity  # what gql's reconnecting session retries with

    return tenacity.retry(
        wait=tenacity.wait_fixed(0.05), stop=tenacity.stop_after_attempt(5), reraise=True
    )
