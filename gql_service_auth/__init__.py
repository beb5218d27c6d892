"""Authenticating gql transports for the service: API key and OAuth 2.0 client credentials."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._core.errors import (
        ApiKeyRejectedError,
        ApiKeyRejectedHTTPError,
        ConfigurationError,
        GqlServiceAuthError,
        TokenRequestError,
        UnauthenticatedError,
        UnauthenticatedHTTPError,
    )
    from ._core.events import AuthEvent, EventHook, EventName
    from ._core.oauth2 import ClientAuthMethod, RetryPolicy
    from ._core.token import AccessToken, Clock
    from ._stacks.aiohttp_token_session import TokenSessionArgs
    from ._stacks.options import TokenOptions
    from ._stores.protocol import StoredToken, TokenIdentity, TokenStore
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
# is installed: gql and aiohttp (about 400 ms) must wait until a name is used. The first
# use imports them all, so that the module then looks as if imported eagerly.
_HOMES: dict[str, str] = {
    "AIOHTTPTransportOptions": "transports",
    "AccessToken": "_core.token",
    "ApiKeyOptions": "transports",
    "ApiKeyRejectedError": "_core.errors",
    "ApiKeyRejectedHTTPError": "_core.errors",
    "ApiKeyTransport": "transports",
    "AuthEvent": "_core.events",
    "ClientAuthMethod": "_core.oauth2",
    "Clock": "_core.token",
    "ConfigurationError": "_core.errors",
    "EventHook": "_core.events",
    "EventName": "_core.events",
    "GqlServiceAuthError": "_core.errors",
    "OAuth2Options": "transports",
    "OAuth2Transport": "transports",
    "RetryPolicy": "_core.oauth2",
    "StoredToken": "_stores.protocol",
    "TokenIdentity": "_stores.protocol",
    "TokenStore": "_stores.protocol",
    "TokenOptions": "_stacks.options",
    "TokenRequestError": "_core.errors",
    "TokenSessionArgs": "_stacks.aiohttp_token_session",
    "UnauthenticatedError": "_core.errors",
    "UnauthenticatedHTTPError": "_core.errors",
}


def __getattr__(name: str) -> object:
    if name in _HOMES:
        from importlib import import_module

        for public, home in _HOMES.items():
            globals()[public] = getattr(import_module(f".{home}", __name__), public)
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
    "AuthEvent",
    "ClientAuthMethod",
    "Clock",
    "ConfigurationError",
    "EventHook",
    "EventName",
    "GqlServiceAuthError",
    "OAuth2Options",
    "OAuth2Transport",
    "RetryPolicy",
    "StoredToken",
    "TokenIdentity",
    "TokenOptions",
    "TokenRequestError",
    "TokenSessionArgs",
    "TokenStore",
    "UnauthenticatedError",
    "UnauthenticatedHTTPError",
    "__version__",
]
