"""``gql-service-auth demo``: the whole story, live, against the embedded emulator."""

from __future__ import annotations

import asyncio
import time
from typing import TextIO

from gql import Client, gql
from gql.client import AsyncClientSession

from ._core.errors import ApiKeyRejectedError
from ._core.events import AuthEvent
from .emulator import Emulator
from .transports import ApiKeyTransport, OAuth2Transport

_CARRIERS = gql("query { carriers(first: 3) { edges { node { id name } } } }")
_LIFETIMES = 3  # token lifetimes the renewal part runs for
_CONCURRENCY = 200
_HOUR = 3600.0
"""The tokens' lifetime until the renewal part: 200 queries queued behind aiohttp's 100
connections on a busy machine can take longer than a short token lives."""


async def run_demo(*, token_ttl: float, out: TextIO) -> int:
    """Run the demo, writing to ``out``; returns 0 when no query failed, else 1.

    Args:
        token_ttl: Seconds the tokens of the renewal part live.
        out: Where the story is told.
    """

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    async with Emulator(token_ttl=_HOUR) as emulator:
        recent, legacy = emulator.recent_client, emulator.legacy_client
        say(f"Emulator of the service on {emulator.base_url}; tokens live an hour.")

        say("\n1. API key, with credentials registered on 2025-01-15")
        api_key = ApiKeyTransport(
            emulator.graphql_url, client_id=recent.client_id, client_secret=recent.client_secret
        )
        async with Client(transport=api_key) as session:
            result = await session.execute(_CARRIERS)
        for edge in result["carriers"]["edges"]:
            say(f"   {edge['node']['id']}  {edge['node']['name']}")
        say(f"   token requests: {emulator.counters.token_requests} (the API key needs none)")

        say("\n2. API key, with credentials registered on 2023-09-01")
        old_key = ApiKeyTransport(
            emulator.graphql_url, client_id=legacy.client_id, client_secret=legacy.client_secret
        )
        try:
            async with Client(transport=old_key) as session:
                await session.execute(_CARRIERS)
        except ApiKeyRejectedError as exc:
            say(f"   refused, as the service does. The error says:\n   {exc}")

        say("\n3. OAuth2, with those same 2023 credentials")
        events: list[AuthEvent] = []
        oauth2 = OAuth2Transport(
            emulator.graphql_url,
            token_url=emulator.token_url,
            client_id=legacy.client_id,
            client_secret=legacy.client_secret,
            on_event=events.append,
        )
        async with Client(transport=oauth2, fetch_schema_from_transport=True) as session:
            fetch = next(e for e in events if e.name == "token_fetched")
            say(
                f"   token fetched in {(fetch.duration or 0) * 1000:.0f} ms, "
                f"expires_in={fetch.expires_in:g} s; schema fetched with it"
            )

            say(f"\n4. {_CONCURRENCY} concurrent queries")
            before = emulator.counters.token_requests
            await asyncio.gather(*(session.execute(_CARRIERS) for _ in range(_CONCURRENCY)))
            new = emulator.counters.token_requests - before
            # What was measured: a busy machine may slow the queries past a renewal.
            shared = "all shared the token in hand" if new == 0 else "the others shared them"
            say(f"   {_CONCURRENCY} answers, {new} new token request{_s(new)}: {shared}")
            refused_before_5 = emulator.counters.unauthenticated_responses

            say(f"\n5. The service revokes the token; from now on tokens live {token_ttl:g} s")
            emulator.token_ttl = token_ttl
            emulator.revoke_tokens()
            before = emulator.counters.token_requests
            await session.execute(_CARRIERS)
            new = emulator.counters.token_requests - before
            refused = emulator.counters.unauthenticated_responses - refused_before_5
            say(
                f"   the next query was refused {refused} time{_s(refused)} "
                f"(UNAUTHENTICATED), renewed with {new} token request{_s(new)}, and sent again"
            )
            refused_before_6 = emulator.counters.unauthenticated_responses

            say(f"\n6. Queries for {_LIFETIMES} token lifetimes, renewed before each expiry")
            failures, queries = await _keep_querying(
                session, emulator, events, _LIFETIMES * token_ttl, out
            )
            say(f"   {queries} queries, {failures} failed")

        counters = emulator.counters
        renewals = sum(1 for e in events if e.name == "token_fetched" and e.reason != "initial")
        say("\n7. What the emulator counted")
        say(f"   token requests:          {counters.token_requests}")
        say(f"   GraphQL requests:        {counters.graphql_requests}")
        by_step = (
            refused_before_5,
            refused_before_6 - refused_before_5,
            counters.unauthenticated_responses - refused_before_6,
        )
        say(
            f"   UNAUTHENTICATED answers: {counters.unauthenticated_responses} (steps 1 to 4: "
            f"{by_step[0]}, step 5: {by_step[1]}, step 6: {by_step[2]})"
        )
        say(f"   renewals the hook saw:   {renewals}")
    return 0 if failures == 0 else 1


async def _keep_querying(
    session: AsyncClientSession,
    emulator: Emulator,
    events: list[AuthEvent],
    seconds: float,
    out: TextIO,
) -> tuple[int, int]:
    """Query in rounds of 10 for ``seconds``, showing progress; returns (failures, queries)."""
    interactive = out.isatty()
    failures = queries = 0
    started = time.monotonic()
    seen = len(events)
    while (elapsed := time.monotonic() - started) < seconds:
        results = await asyncio.gather(
            *(session.execute(_CARRIERS) for _ in range(10)), return_exceptions=True
        )
        failures += sum(isinstance(r, BaseException) for r in results)
        queries += len(results)
        renewed = [e for e in events[seen:] if e.name == "token_fetched"]
        seen = len(events)
        if interactive:
            width = 30
            done = int(width * min(elapsed / seconds, 1))
            print(
                f"\r   [{'#' * done}{'.' * (width - done)}] {elapsed:4.1f} s  "
                f"{queries} queries  {failures} failed  "
                f"{emulator.counters.token_requests} token requests",
                end="",
                file=out,
                flush=True,
            )
        else:
            for _ in renewed:
                print(f"   {elapsed:4.1f} s: token renewed before expiry", file=out, flush=True)
        await asyncio.sleep(0.1)
    if interactive:
        print(file=out)
    return failures, queries


def _s(count: int) -> str:
    return "" if count == 1 else "s"
