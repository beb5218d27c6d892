"""Authenticating gql transports for the service: API key and OAuth 2.0 client credentials."""

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._core.budget import TokenBudget
    from ._core.errors import (
        ApiKeyRejectedError,
        ApiKeyRejectedHTTPError,
        ConfigurationError,
        GqlServiceAuthError,
        ServiceHTTPError,
        ServiceTimeoutError,
        ServiceUnreachableError,
        TokenBudgetExceededError,
        TokenRequestError,
        UnauthenticatedError,
        UnauthenticatedHTTPError,
    )
    from ._core.events import AuthEvent, EventHook, EventName
    from ._core.oauth2 import ClientAuthMethod, RetryPolicy
    from ._core.rotation import CredentialsCallback, CredentialsSource
    from ._core.token import AccessToken, Clock
    from ._stacks.aiohttp_token_session import TokenSessionArgs
    from ._stacks.options import TokenOptions
    from ._stores.protocol import StoredToken, TokenIdentity, TokenStore
    from .credentials import CredentialsFile, CredentialsFiles
    from .provider import AsyncTokenProvider, TokenProvider
    from .transports import (
        AIOHTTPTransportOptions,
        ApiKeyOptions,
        ApiKeyTransport,
        OAuth2Options,
        OAuth2Transport,
    )

    __version__: str

# The re-exports are imported on first use (PEP 562). Importing any submodule runs this
# file first, and pytest imports one of them, the plugin, in every run once the package
# is installed: gql and aiohttp (about 400 ms) must wait until a name is used. A name
# imports its own module only: `from gql_service_auth import ConfigurationError` in a
# requests or httpx application loads no aiohttp.
_HOMES: dict[str, str] = {
    "AIOHTTPTransportOptions": "transports",
    "AccessToken": "_core.token",
    "AsyncTokenProvider": "provider",
    "ApiKeyOptions": "transports",
    "ApiKeyRejectedError": "_core.errors",
    "ApiKeyRejectedHTTPError": "_core.errors",
    "ApiKeyTransport": "transports",
    "AuthEvent": "_core.events",
    "ClientAuthMethod": "_core.oauth2",
    "Clock": "_core.token",
    "ConfigurationError": "_core.errors",
    "CredentialsCallback": "_core.rotation",
    "CredentialsFile": "credentials",
    "CredentialsFiles": "credentials",
    "CredentialsSource": "_core.rotation",
    "EventHook": "_core.events",
    "EventName": "_core.events",
    "GqlServiceAuthError": "_core.errors",
    "OAuth2Options": "transports",
    "OAuth2Transport": "transports",
    "RetryPolicy": "_core.oauth2",
    "ServiceHTTPError": "_core.errors",
    "ServiceTimeoutError": "_core.errors",
    "ServiceUnreachableError": "_core.errors",
    "StoredToken": "_stores.protocol",
    "TokenIdentity": "_stores.protocol",
    "TokenStore": "_stores.protocol",
    "TokenOptions": "_stacks.options",
    "TokenProvider": "provider",
    "TokenBudget": "_core.budget",
    "TokenBudgetExceededError": "_core.errors",
    "TokenRequestError": "_core.errors",
    "TokenSessionArgs": "_stacks.aiohttp_token_session",
    "UnauthenticatedError": "_core.errors",
    "UnauthenticatedHTTPError": "_core.errors",
}


_FIRST_USE = threading.RLock()


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the lock at the fork; it is not in the child.
    global _FIRST_USE
    _FIRST_USE = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is not None:
        from importlib import import_module

        # One first use at a time: threads importing different modules at once can each
        # find the other's half-imported (gql's modules import one another).
        with _FIRST_USE:
            module = import_module(f".{home}", __name__)
            for public, where in _HOMES.items():
                if where == home:
                    globals()[public] = getattr(module, public)
        return globals()[name]
    # Resolved on first use, as stamina does: importlib.metadata costs ~6 ms at import.
    if name == "__version__":
        from importlib.metadata import version

        return version("gql-service-auth")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AIOHTTPTransportOptions",
    "AccessToken",
    "ApiKeyOptions",
    "ApiKeyRejectedError",
    "ApiKeyRejectedHTTPError",
    "ApiKeyTransport",
    "AsyncTokenProvider",
    "AuthEvent",
    "ClientAuthMethod",
    "Clock",
    "ConfigurationError",
    "CredentialsCallback",
    "CredentialsFile",
    "CredentialsFiles",
    "CredentialsSource",
    "EventHook",
    "EventName",
    "GqlServiceAuthError",
    "OAuth2Options",
    "OAuth2Transport",
    "RetryPolicy",
    "ServiceHTTPError",
    "ServiceTimeoutError",
    "ServiceUnreachableError",
    "StoredToken",
    "TokenBudget",
    "TokenBudgetExceededError",
    "TokenIdentity",
    "TokenOptions",
    "TokenProvider",
    "TokenRequestError",
    "TokenSessionArgs",
    "TokenStore",
    "UnauthenticatedError",
    "UnauthenticatedHTTPError",
    "__version__",
]
