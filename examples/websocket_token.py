"""A token for a client that is not an HTTP transport: gql's websocket transport, which
sends its token once, in ``connection_init``, at each connect.

``AsyncTokenProvider`` hands out the ``Authorization`` value with what the transports get:
one fetch for every caller, renewal ahead of expiry, the token budget. Each connect asks
it for the value now, so a reconnect after an hour carries a valid token; a connection
the service refused hands the value back (``refused``), so the next connect renews it.

Uses the service when SERVICE_* variables are set, else an emulator started here (its
``/graphql`` speaks ``graphql-transport-ws``).
"""

import asyncio
from typing import Any

from gql import Client, gql
from gql.transport.aiohttp_websockets import AIOHTTPWebsocketsTransport
from gql.transport.exceptions import TransportConnectionFailed

from gql_service_auth import AsyncTokenProvider
from gql_service_auth.emulator import environ_or_emulator

REFUSED = (4401, 4403)
"""Close codes of graphql-transport-ws that refuse the connection's authorization."""

QUERY = gql("query { carriers(first: 2) { edges { node { id name } } } }")


class TokenWebsocketsTransport(AIOHTTPWebsocketsTransport):
    """gql's websocket transport, with a fresh token in ``init_payload`` at each connect."""

    def __init__(self, provider: AsyncTokenProvider, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.provider = provider

    async def connect(self) -> None:
        authorization = await self.provider.authorization()
        self.init_payload = {"Authorization": authorization}
        try:
            await super().connect()
        except TransportConnectionFailed:
            # A server refusing the token closes with 4403 (or 4401) before connection_ack;
            # gql reports any close so: the code tells a refusal from a restart or a proxy.
            websocket = getattr(self.adapter, "websocket", None)
            refused = getattr(websocket, "close_code", None) in REFUSED
            # gql leaves a transport that failed in connection_init marked connected:
            # closed, so that the next connect (a reconnecting session's) runs.
            await self.close()
            if refused:
                self.provider.refused(authorization)  # the next connect renews it
            raise
        self.provider.accepted(authorization)  # connection_ack: the token works


async def query_once(provider: AsyncTokenProvider, url: str) -> list[str]:
    async with Client(transport=TokenWebsocketsTransport(provider, url=url)) as session:
        result = await session.execute(QUERY)
    return [edge["node"]["name"] for edge in result["carriers"]["edges"]]


async def main() -> None:
    with environ_or_emulator() as (environ, emulator):
        if emulator:
            print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
        provider = AsyncTokenProvider.from_env(environ)
        url = environ["SERVICE_BASE_URL"].replace("http", "ws", 1) + "/graphql"
        print("connection 1:", await query_once(provider, url))
        if emulator:
            emulator.revoke_tokens()  # the service no longer takes the token in hand
        for _ in range(2):  # bounded: one renewal after a refusal is enough
            try:
                print("connection 2:", await query_once(provider, url))
                break
            except TransportConnectionFailed:
                print("connection 2 closed at connect: the token was refused; renewing")
        if emulator:
            print(f"token requests: {emulator.counters.token_requests}")


if __name__ == "__main__":
    asyncio.run(main())
