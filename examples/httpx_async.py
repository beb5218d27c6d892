"""An async job on gql's httpx transport: OAuth2HTTPXAsyncTransport, on asyncio or trio.

Needs the [httpx] extra. Uses the service when SERVICE_* variables are set, else an
emulator started here.
"""

import asyncio

from gql import Client, gql

from gql_service_auth.emulator import environ_or_emulator
from gql_service_auth.httpx import OAuth2HTTPXAsyncTransport

QUERY = gql("query { carriers(first: 1) { edges { node { id } } } }")


async def main(environ: dict[str, str]) -> int:
    # Keywords gql passes to httpx.AsyncClient (timeout, verify, proxy...) work as before.
    transport = OAuth2HTTPXAsyncTransport.from_env(environ, timeout=30)
    async with Client(transport=transport) as session:
        answers = await asyncio.gather(*(session.execute(QUERY) for _ in range(50)))
    return len(answers)


with environ_or_emulator() as (environ, emulator):
    if emulator:
        print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
    print(f"{asyncio.run(main(dict(environ)))} answers")  # trio.run(main, ...) works too
    if emulator:
        print(f"token requests for 50 concurrent queries: {emulator.counters.token_requests}")
