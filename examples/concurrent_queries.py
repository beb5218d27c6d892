"""An async session running many queries at once: they share one token fetch.

Uses the service when SERVICE_* variables are set, else an emulator started here.
"""

import asyncio
import time

from gql import Client, gql

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import environ_or_emulator

QUERY = gql("query { carriers(first: 1) { edges { node { id } } } }")


async def main() -> None:
    with environ_or_emulator() as (environ, emulator):
        if emulator:
            print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
        async with Client(transport=OAuth2Transport.from_env(environ)) as session:
            started = time.perf_counter()
            results = await asyncio.gather(*(session.execute(QUERY) for _ in range(100)))
            elapsed = time.perf_counter() - started
        print(f"{len(results)} queries in {elapsed:.2f} s")
        if emulator:
            print(f"token requests: {emulator.counters.token_requests}")


if __name__ == "__main__":
    asyncio.run(main())
