"""A short tour of gql-service-auth against the embedded emulator (``make demo``).

Runs offline in a few seconds: the API key, the 2024-05-13 rule, an OAuth2 token shared
by concurrent queries, and a token expiring and renewed without a failed query.
"""

from __future__ import annotations

import asyncio
import time

from gql import Client, gql

from gql_service_auth import ApiKeyRejectedError, ApiKeyTransport, AuthEvent, OAuth2Transport
from gql_service_auth.emulator import Emulator

CARRIERS = gql("query { carriers(first: 3) { edges { node { id name } } } }")
TOKEN_TTL = 2.0  # seconds: short, so the renewal shows within the demo


def step(title: str) -> None:
    print(f"\n== {title}")


async def main() -> None:
    async with Emulator(token_ttl=TOKEN_TTL) as emulator:
        recent, legacy = emulator.recent_client, emulator.legacy_client
        print(f"emulator listening on {emulator.base_url} (tokens live {TOKEN_TTL:g} s)")

        step("1. API key (credentials registered 2025-01-15)")
        api_key = ApiKeyTransport(
            emulator.graphql_url, client_id=recent.client_id, client_secret=recent.client_secret
        )
        async with Client(transport=api_key) as session:
            result = await session.execute(CARRIERS)
        for edge in result["carriers"]["edges"]:
            print(f"   {edge['node']['id']}  {edge['node']['name']}")
        print(f"   token requests so far: {emulator.counters.token_requests}")

        step("2. API key with credentials registered before 2024-05-13")
        old_key = ApiKeyTransport(
            emulator.graphql_url, client_id=legacy.client_id, client_secret=legacy.client_secret
        )
        try:
            async with Client(transport=old_key) as session:
                await session.execute(CARRIERS)
        except ApiKeyRejectedError as exc:
            print(f"   refused, as the service does: {exc}")

        step("3. OAuth2 with the same old credentials")
        events: list[AuthEvent] = []

        def on_event(event: AuthEvent) -> None:
            events.append(event)
            if event.name == "token_fetched":
                print(f"   token fetched ({event.reason}), expires_in={event.expires_in}")

        oauth2 = OAuth2Transport(
            emulator.graphql_url,
            token_url=emulator.token_url,
            client_id=legacy.client_id,
            client_secret=legacy.client_secret,
            on_event=on_event,
        )
        async with Client(transport=oauth2, fetch_schema_from_transport=True) as session:
            print("   schema fetched through the transport")

            step("4. 200 concurrent queries share that one token")
            before = emulator.counters.token_requests
            results = await asyncio.gather(*(session.execute(CARRIERS) for _ in range(200)))
            print(
                f"   {len(results)} answers, {emulator.counters.token_requests - before} new "
                "token request(s): all reused the token fetched for the schema"
            )

            step("5. queries for three token lifetimes: renewed before expiry")
            failures = 0
            refusals_before = emulator.counters.unauthenticated_responses
            deadline = time.monotonic() + 3 * TOKEN_TTL
            queries = 0
            while time.monotonic() < deadline:
                try:
                    await asyncio.gather(*(session.execute(CARRIERS) for _ in range(10)))
                except Exception:
                    failures += 1
                queries += 10
                await asyncio.sleep(0.1)
            refusals = emulator.counters.unauthenticated_responses - refusals_before
            print(f"   {queries} queries, {failures} failed, {refusals} refused tokens")

        step("6. counters")
        counters = emulator.counters
        print(f"   token requests:            {counters.token_requests}")
        print(f"   GraphQL requests:          {counters.graphql_requests}")
        print(f"   UNAUTHENTICATED answers:   {counters.unauthenticated_responses} (step 2)")
        renewals = sum(1 for e in events if e.name == "token_fetched" and e.reason != "initial")
        print(f"   renewals seen by the hook: {renewals}")


if __name__ == "__main__":
    asyncio.run(main())
