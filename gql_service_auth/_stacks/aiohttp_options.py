"""The keywords of the aiohttp transports, as ``TypedDict`` s for ``**kwargs`` (``from_env``).

Public through :mod:`gql_service_auth.transports`, which they name as their module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from ssl import SSLContext
from typing import Any, TypedDict

from aiohttp.client_reqrep import Fingerprint
from aiohttp.typedefs import LooseCookies, LooseHeaders
from yarl import URL

from .._core.events import EventHook
from .._core.oauth2 import ClientAuthMethod, RetryPolicy
from .._core.token import Clock
from .._stores.protocol import TokenStore
from .aiohttp_token_session import TokenSessionArgs


class AIOHTTPTransportOptions(TypedDict, total=False):
    """The keywords of gql's ``AIOHTTPTransport``, all passed through unchanged.

    ``auth`` is left out on purpose: aiohttp cannot combine it with the ``Authorization``
    header these transports send, so it is refused.
    """

    headers: LooseHeaders | None
    cookies: LooseCookies | None
    ssl: SSLContext | bool | Fingerprint
    timeout: int | None
    ssl_close_timeout: int | float | None
    json_serialize: Callable[..., str]
    json_deserialize: Callable[..., Any]
    client_session_args: dict[str, Any] | None


class OAuth2Options(AIOHTTPTransportOptions, total=False):
    """The optional keywords of :class:`OAuth2Transport`, for :meth:`OAuth2Transport.from_env`."""

    scope: str | Sequence[str] | None
    token_params: Mapping[str, str] | None
    token_auth_method: ClientAuthMethod
    refresh_margin: float
    default_expires_in: float
    max_renewals: int
    retry: RetryPolicy | None
    on_event: EventHook | None
    clock: Clock | None
    allow_insecure_http: bool
    token_session_args: TokenSessionArgs | None
    token_proxy: str | URL | None
    token_store: TokenStore | None
    share_tokens: bool


class ApiKeyOptions(AIOHTTPTransportOptions, total=False):
    """The optional keywords of :class:`ApiKeyTransport`, for :meth:`ApiKeyTransport.from_env`."""

    allow_insecure_http: bool


# Shown as gql_service_auth.transports's, where users import them from; get_type_hints()
# resolves their annotations in that module's names (it imports the ones aiohttp's use).
for _options in (AIOHTTPTransportOptions, ApiKeyOptions, OAuth2Options):
    _options.__module__ = "gql_service_auth.transports"
del _options
