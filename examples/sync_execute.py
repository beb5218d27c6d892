"""Blocking code: gql's Client.execute with an authenticating transport.

Uses the service when SERVICE_* variables are set, else an emulator started here.
"""

from gql import Client, gql

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import environ_or_emulator

QUERY = gql("query { carriers(first: 3) { edges { node { id name } } } }")

with environ_or_emulator() as (environ, emulator):
    if emulator:
        print(f"No SERVICE_* variables: using an emulator at {emulator.base_url}")
    client = Client(transport=OAuth2Transport.from_env(environ))
    for edge in client.execute(QUERY)["carriers"]["edges"]:
        print(edge["node"]["id"], edge["node"]["name"])
    # Each execute() connects anew; the token fetched by the first call is reused.
    client.execute(QUERY)
    if emulator:
        print(f"token requests for two calls: {emulator.counters.token_requests}")
