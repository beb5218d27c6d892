"""Four processes, one token: a fleet sharing its token through Redis (the [redis] extra).

Each process builds its own transport with OAuth2Transport.from_env(), which reads the
Redis URL from SERVICE_TOKEN_STORE_URL (here redis://127.0.0.1:6379/0 when unset). Uses
the service when SERVICE_* variables are set, else an emulator started here.
"""

import asyncio
import multiprocessing
import os
from collections.abc import Mapping

from gql import Client, gql

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import environ_or_emulator

QUERY = gql("query { carriers(first: 1) { edges { node { id } } } }")
PROCESSES = 4


def worker(environ: Mapping[str, str]) -> int:
    """One process of the fleet: 20 concurrent queries; returns how many succeeded."""

    async def run() -> int:
        transport = OAuth2Transport.from_env(environ)
        async with Client(transport=transport) as session:
            results = await asyncio.gather(*(session.execute(QUERY) for _ in range(20)))
        return len(results)

    return asyncio.run(run())


def main() -> None:
    with environ_or_emulator() as (environ, emulator):
        if emulator:
            print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
        environ = dict(environ)
        environ.setdefault(
            "SERVICE_TOKEN_STORE_URL",
            os.environ.get("SERVICE_TOKEN_STORE_URL", "redis://127.0.0.1:6379/0"),
        )
        # spawn: fresh processes, as separate pods or workers would be.
        with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
            done = pool.map(worker, [environ] * PROCESSES)
        print(f"{sum(done)} queries in {PROCESSES} processes")
        if emulator:
            # 1 with a reachable Redis; without one, each process fetches its own (4).
            print(f"token requests: {emulator.counters.token_requests}")


if __name__ == "__main__":
    main()
