"""Build queries with gql's DSL on the schema fetched through the transport.

Uses the service when SERVICE_* variables are set, else an emulator started here.
"""

import asyncio

from gql import Client
from gql.dsl import DSLQuery, DSLSchema, dsl_gql

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import environ_or_emulator


async def main() -> None:
    with environ_or_emulator() as (environ, emulator):
        if emulator:
            print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
        client = Client(
            transport=OAuth2Transport.from_env(environ), fetch_schema_from_transport=True
        )
        async with client as session:
            assert client.schema is not None
            ds = DSLSchema(client.schema)
            query = dsl_gql(
                DSLQuery(
                    ds.Query.carriers(first=5).select(
                        ds.CarrierConnection.edges.select(
                            ds.CarrierEdge.node.select(ds.Carrier.id, ds.Carrier.name)
                        )
                    )
                )
            )
            result = await session.execute(query)
        for edge in result["carriers"]["edges"]:
            print(edge["node"]["id"], edge["node"]["name"])


if __name__ == "__main__":
    asyncio.run(main())
