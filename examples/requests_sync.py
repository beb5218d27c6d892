"""A sync script on gql's requests transport: OAuth2RequestsTransport, no event loop.

Needs the [requests] extra. Uses the service when SERVICE_* variables are set, else an
emulator started here.
"""

from concurrent.futures import ThreadPoolExecutor

from gql import Client, gql

from gql_service_auth.emulator import environ_or_emulator
from gql_service_auth.requests import OAuth2RequestsTransport

QUERY = gql("query { carriers(first: 3) { edges { node { id name } } } }")

with environ_or_emulator() as (environ, emulator):
    if emulator:
        print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
    # timeout= bounds each request: gql's requests transport has none by default.
    transport = OAuth2RequestsTransport.from_env(environ, timeout=30)
    with Client(transport=transport) as session:
        for edge in session.execute(QUERY)["carriers"]["edges"]:
            print(edge["node"]["id"], edge["node"]["name"])
        # Threads share the session's token, and one fetch when it must be renewed.
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: session.execute(QUERY), range(16)))
    if emulator:
        print(f"token requests for 17 queries on 8 threads: {emulator.counters.token_requests}")
