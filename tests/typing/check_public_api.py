"""Code that uses the public API as a user would: checked by mypy --strict, never run."""

from __future__ import annotations

import functools
import os
import socket

import aiohttp
from gql import Client, gql
from gql.transport.exceptions import TransportServerError
from yarl import URL

from gql_service_auth import (
    AccessToken,
    ApiKeyRejectedError,
    ApiKeyRejectedHTTPError,
    ApiKeyTransport,
    AuthEvent,
    ConfigurationError,
    GqlServiceAuthError,
    OAuth2Transport,
    RetryPolicy,
    StoredToken,
    TokenIdentity,
    TokenRequestError,
    TokenSessionArgs,
    TokenStore,
    UnauthenticatedError,
    UnauthenticatedHTTPError,
)
from gql_service_auth.emulator import Emulator, ManualClock

renewals: list[AuthEvent] = []


def count(event: AuthEvent) -> None:
    if event.name == "token_fetched" and event.reason != "initial":
        renewals.append(event)
    bound: int | None = event.max_attempts
    print(bound)


oauth2 = OAuth2Transport(
    "https://api.example.com/graphql",
    token_url="https://auth.example.com/oauth2/token",
    client_id="id",
    client_secret="secret",
    scope=["read", "write"],
    token_params={"audience": "api"},
    token_auth_method="client_secret_basic",
    refresh_margin=30.0,
    default_expires_in=600,
    max_renewals=2,
    retry=RetryPolicy(attempts=5, timeout=20.0),
    on_event=count,
    clock=ManualClock(),
    headers={"X-Team": "billing"},
    timeout=30,
)
api_key: ApiKeyTransport = ApiKeyTransport.from_env(os.environ, ssl=False)
from_env: OAuth2Transport = OAuth2Transport.from_env({}, max_renewals=0)
by_url = OAuth2Transport(
    URL("https://api.example.com/graphql"),
    token_url=URL("https://auth.example.com/oauth2/token"),
    client_id="id",
    client_secret="secret",
)
session_args: TokenSessionArgs = {
    "trust_env": True,
    "connector": functools.partial(aiohttp.TCPConnector, family=socket.AF_INET),
}
proxied = OAuth2Transport(
    "https://api.example.com/graphql",
    token_url="https://auth.example.com/oauth2/token",
    client_id="id",
    client_secret="secret",
    client_session_args={"trust_env": True},
    token_session_args=session_args,
    token_proxy=URL("http://proxy.example.com:3128"),
)
proxied_from_env = OAuth2Transport.from_env(
    {}, token_proxy="http://proxy.example.com:3128", token_session_args={"trust_env": False}
)
explicit: OAuth2Transport = OAuth2Transport.from_env(
    {}, url="https://api.example.com/graphql", token_url="https://a.example.com/t", client_id="i"
)
token: AccessToken | None = oauth2.token
expires_at: float | None = token.expires_at if token is not None else None
client = Client(transport=oauth2, fetch_schema_from_transport=True)


async def main() -> None:
    async with Emulator(token_ttl=5) as emulator:
        transport = OAuth2Transport(
            emulator.graphql_url,
            token_url=emulator.token_url,
            client_id=emulator.recent_client.client_id,
            client_secret=emulator.recent_client.client_secret,
        )
        try:
            async with Client(transport=transport) as session:
                await session.execute(gql("query { carriers(first: 1) { totalCount } }"))
        except ApiKeyRejectedHTTPError as exc:
            code: int | None = exc.code
            print(code, exc.errors)
        except ApiKeyRejectedError as exc:
            errors: list[object] | None = exc.errors
            print(errors)
        except UnauthenticatedHTTPError as exc:
            gqls: TransportServerError = exc
            print(gqls.code)
        except UnauthenticatedError:
            pass
        except TokenRequestError as exc:
            status: int | None = exc.status
            retryable: bool = exc.retryable
            print(status, retryable, exc.error, exc.error_description)
        except (ConfigurationError, GqlServiceAuthError):
            pass
        emulator.fail_token_requests(2, 503, retry_after=1)
        emulator.revoke_tokens()
        print(emulator.counters.token_requests)


class MemoryTokenStore:
    """A TokenStore of the user's own (one process only): the protocol is enough to write one."""

    timeout = 0.25
    cooldown = 10.0

    def __init__(self) -> None:
        self.tokens: dict[TokenIdentity, StoredToken] = {}

    async def load(self, identity: TokenIdentity) -> StoredToken | None:
        return self.tokens.get(identity)

    async def save(self, identity: TokenIdentity, token: StoredToken) -> bool:
        self.tokens[identity] = token
        return True

    async def discard(self, identity: TokenIdentity, access_token: str) -> bool:
        return self.tokens.pop(identity, None) is not None

    async def lock(self, identity: TokenIdentity, owner: str, ttl: float) -> str | None:
        return None

    async def unlock(
        self, identity: TokenIdentity, owner: str, failure: str | None = None
    ) -> None:
        return None

    async def failure(self, identity: TokenIdentity, owner: str) -> str | None:
        return None


def token_stores(url: str) -> list[OAuth2Transport]:
    import redis.asyncio

    from gql_service_auth.redis import RedisTokenStore

    mine: TokenStore = MemoryTokenStore()
    shared = RedisTokenStore.from_url("redis://127.0.0.1:6379/0", store_key=b"0" * 32)
    given = RedisTokenStore(redis.asyncio.Redis(), timeout=0.1, cooldown=5.0)
    given.close()
    return [
        OAuth2Transport(url, token_url=url, client_id="id", client_secret="s", token_store=store)
        for store in (mine, shared)
    ]
