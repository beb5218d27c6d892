"""Client middlewares for plain aiohttp code: the service's credentials on any session.

``aiohttp.ClientSession(middlewares=(OAuth2Middleware.from_env(),))`` signs the requests
the session sends to the service (aiohttp 3.12 and later have client middlewares), as
:class:`gql_service_auth.requests.OAuth2Auth` and :class:`gql_service_auth.httpx.OAuth2Auth`
do for requests and httpx. gql's aiohttp transports are
:class:`~gql_service_auth.ApiKeyTransport` and :class:`~gql_service_auth.OAuth2Transport`.
"""

from __future__ import annotations

from ._stacks.aiohttp_auth import ApiKeyMiddleware, OAuth2Middleware, OAuth2MiddlewareOptions

__all__ = ["ApiKeyMiddleware", "OAuth2Middleware", "OAuth2MiddlewareOptions"]
