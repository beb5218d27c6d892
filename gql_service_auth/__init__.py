"""Authenticating gql transports for the service: API key and OAuth 2.0 client credentials."""

from ._errors import (
    ApiKeyRejectedError,
    ApiKeyRejectedHTTPError,
    ConfigurationError,
    GqlServiceAuthError,
    TokenRequestError,
    UnauthenticatedError,
    UnauthenticatedHTTPError,
)
from ._events import AuthEvent, EventHook, EventName
from ._oauth2 import ClientAuthMethod, RetryPolicy
from ._token_session import TokenSessionArgs
from ._tokens import AccessToken, Clock
from .transports import (
    AIOHTTPTransportOptions,
    ApiKeyOptions,
    ApiKeyTransport,
    OAuth2Options,
    OAuth2Transport,
)


def __getattr__(name: str) -> str:
    # Resolved on first use, as stamina does: importlib.metadata costs ~6 ms at import.
    if name == "__version__":
        from importlib.metadata import version

        return version("gql-service-auth")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "TokenRequestError",
    "TokenSessionArgs",
    "UnauthenticatedError",
    "UnauthenticatedHTTPError",
    "__version__",
]
