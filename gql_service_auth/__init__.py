"""Authenticating gql transports for the service: API key and OAuth 2.0 client credentials."""

from importlib.metadata import PackageNotFoundError, version

from ._errors import (
    ApiKeyRejectedError,
    ConfigurationError,
    GqlServiceAuthError,
    TokenRequestError,
    UnauthenticatedError,
)
from ._events import AuthEvent, EventHook, EventName
from ._oauth2 import ClientAuthMethod, RetryPolicy
from ._tokens import AccessToken, Clock
from .transports import (
    AIOHTTPTransportOptions,
    ApiKeyOptions,
    ApiKeyTransport,
    OAuth2Options,
    OAuth2Transport,
)

try:
    __version__ = version("gql-service-auth")
except PackageNotFoundError:  # pragma: no cover - running from a source tree never installed
    __version__ = "0+unknown"

__all__ = [
    "AIOHTTPTransportOptions",
    "AccessToken",
    "ApiKeyOptions",
    "ApiKeyRejectedError",
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
    "UnauthenticatedError",
    "__version__",
]
