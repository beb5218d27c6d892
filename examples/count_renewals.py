"""Count token fetches, renewals and retries with the on_event hook (e.g. for metrics).

Uses the service when SERVICE_* variables are set, else an emulator started here,
with 1 s tokens so renewals show within the run.
"""

import asyncio
import time
from collections import Counter

from gql import Client, gql

from gql_service_auth import AuthEvent, OAuth2Transport
from gql_service_auth.emulator import environ_or_emulator

QUERY = gql("query { carriers(first: 1) { edges { node { id } } } }")
RUN_SECONDS = 3.0
counts: Counter[str] = Counter()


def on_event(event: AuthEvent) -> None:
    counts[event.name] += 1
    if event.name == "token_fetched" and event.reason != "initial":
        counts["renewals"] += 1


async def main() -> None:
    with environ_or_emulator(token_ttl=1.0) as (environ, emulator):
        if emulator:
            print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
        transport = OAuth2Transport.from_env(environ, on_event=on_event)
        deadline = time.monotonic() + RUN_SECONDS
        queries = 0
        async with Client(transport=transport) as session:
            while time.monotonic() < deadline:
                await asyncio.gather(*(session.execute(QUERY) for _ in range(10)))
                queries += 10
                await asyncio.sleep(0.05)
    print(f"{queries} queries in {RUN_SECONDS:g} s")
    for name, count in sorted(counts.items()):
        print(f"  {name}: {count}")


if __name__ == "__main__":
    asyncio.run(main())
