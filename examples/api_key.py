"""The API key method, and what happens with credentials registered before 2024-05-13.

Uses the service when SERVICE_* variables are set, else an emulator started here.
"""

import asyncio

from gql import Client, gql

from gql_service_auth import ApiKeyRejectedError, ApiKeyTransport, OAuth2Transport
from gql_service_auth.emulator import environ_or_emulator

QUERY = gql("query { carriers(first: 3) { edges { node { id name } } } }")


async def main() -> None:
    with environ_or_emulator(legacy=True) as (environ, emulator):
        if emulator:
            print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
            print("with credentials registered before 2024-05-13")
        try:
            async with Client(transport=ApiKeyTransport.from_env(environ)) as session:
                result = await session.execute(QUERY)
            print("the API key works")
        except ApiKeyRejectedError as exc:
            print(f"API key refused: {exc}")
            print("falling back to OAuth2 with the same credentials")
            async with Client(transport=OAuth2Transport.from_env(environ)) as session:
                result = await session.execute(QUERY)
        for edge in result["carriers"]["edges"]:
            print(edge["node"]["id"], edge["node"]["name"])


if __name__ == "__main__":
    asyncio.run(main())
