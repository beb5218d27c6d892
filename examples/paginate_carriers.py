"""Read every carrier, a page at a time, with the connection's endCursor.

Uses the service when SERVICE_* variables are set, else an emulator started here.
"""

import asyncio

from gql import Client, gql

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import environ_or_emulator

PAGE = gql(
    """
    query ($after: String) {
      carriers(first: 10, after: $after) {
        edges { node { id name } }
        pageInfo { hasNextPage endCursor }
      }
    }
    """
)
MAX_PAGES = 1000  # a bound, in case a server kept saying hasNextPage


async def main() -> None:
    with environ_or_emulator() as (environ, emulator):
        if emulator:
            print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
        carriers = []
        after = None
        async with Client(transport=OAuth2Transport.from_env(environ)) as session:
            for _ in range(MAX_PAGES):
                PAGE.variable_values = {"after": after}
                page = (await session.execute(PAGE))["carriers"]
                carriers += [edge["node"] for edge in page["edges"]]
                if not page["pageInfo"]["hasNextPage"]:
                    break
                after = page["pageInfo"]["endCursor"]
        print(
            f"{len(carriers)} carriers, first {carriers[0]['name']}, last {carriers[-1]['name']}"
        )


if __name__ == "__main__":
    asyncio.run(main())
