"""Configuration from the environment: the four SERVICE_* variables.

Try it against the emulator served by another terminal:
    gql-service-auth emulator --port 8000        # in terminal 1; prints export lines
    export SERVICE_BASE_URL=...                  # in terminal 2, pasted from terminal 1
    python examples/from_env.py
Without SERVICE_* variables, it starts an emulator itself.
"""

import asyncio

from gql import Client, gql

from gql_service_auth import ConfigurationError, OAuth2Transport
from gql_service_auth.emulator import environ_or_emulator

QUERY = gql("query { carriers(first: 3) { edges { node { id name } } } }")


async def main() -> None:
    try:
        OAuth2Transport.from_env({})
    except ConfigurationError as exc:
        print(f"an empty environment says what is missing: {exc}")
    with environ_or_emulator() as (environ, emulator):
        if emulator:
            print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
        # Keywords given to from_env() reach the constructor.
        transport = OAuth2Transport.from_env(environ, max_renewals=2, timeout=30)
        print(f"GraphQL endpoint: {transport.url}\ntoken endpoint:   {transport.token_url}")
        async with Client(transport=transport) as session:
            result = await session.execute(QUERY)
        print(f"{len(result['carriers']['edges'])} carriers")


if __name__ == "__main__":
    asyncio.run(main())
