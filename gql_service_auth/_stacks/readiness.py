"""``transport.check()``: the credentials and the API, checked now, from the application.

A readiness probe, or a start that fails at once rather than on the first request: the
contract's check query (``carriers(first: 1)``) goes through the transport itself, so it
proves what the application's queries need (the token, or the key, accepted by the API
at the URL given, through the same proxy and TLS settings). An OAuth2 transport keeps
the token it fetched for it: a check costs at most one token request, none while a token
is valid. A transport not yet connected is connected for the check and closed after it.

Failures raise what a query would (:class:`~gql_service_auth.TokenRequestError`,
:class:`~gql_service_auth.UnauthenticatedError`, :class:`~gql_service_auth.ServiceHTTPError`
...), with their messages; a GraphQL error, gql's ``TransportQueryError``. The bound,
``timeout``, ends a check that hangs with :class:`~gql_service_auth.ServiceTimeoutError`
(async stacks) or the stack's own timeout (sync stacks).
"""

from __future__ import annotations

from typing import Any, Final

from gql.graphql_request import GraphQLRequest
from gql.transport.exceptions import TransportQueryError
from graphql import ExecutionResult, parse

CHECK_QUERY: Final = "query GqlServiceAuthCheck { carriers(first: 1) { edges { node { id } } } }"
"""The contract's check query, asking for one carrier: the only query the service is
known to have (../SERVICE.md)."""

CHECK_TIMEOUT: Final = 10.0
"""Seconds a check may take by default, its token included: gql's ``execute_timeout``."""

_DOCUMENT = parse(CHECK_QUERY)


def _request() -> GraphQLRequest:
    return GraphQLRequest(_DOCUMENT)


def _checked(result: ExecutionResult) -> None:
    """Raise gql's ``TransportQueryError`` for an answer with errors, as gql's client does."""
    if result.errors:
        raise TransportQueryError(str(result.errors[0]), errors=result.errors, data=result.data)


def _check_timeout(timeout: float) -> float:
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0:
        from .._core.errors import ConfigurationError

        raise ConfigurationError(f"timeout must be a positive number of seconds, not {timeout!r}")
    return float(timeout)


class ChecksBlocking:
    """``check()`` for the sync transports (requests, httpx)."""

    _check_connected_attribute: str  # "session" (requests) or "client" (httpx)

    def _check_timeout_args(self, timeout: float) -> dict[str, Any]:
        """The keywords of ``execute`` that bound one request by ``timeout``."""
        raise NotImplementedError

    def check(self, timeout: float = CHECK_TIMEOUT) -> None:
        """Check the credentials and the API now: the contract's check query, sent
        through this transport. Blocks; returns once the API answered it.

        An OAuth2 transport keeps the token it fetched: at most one token request, none
        while a token is valid. See :doc:`readiness </readiness>`.

        Args:
            timeout: Seconds the query may wait for the API (the stack's own timeout), 10
                by default. The token's fetch is bounded by ``RetryPolicy.timeout``.

        Raises:
            TokenRequestError: no token (OAuth2): the message says why.
            UnauthenticatedError: the API refused the token or the key.
            ServiceHTTPError, ServiceUnreachableError: no GraphQL answer from ``url``.
            gql.transport.exceptions.TransportQueryError: a GraphQL error.
        """
        seconds = _check_timeout(timeout)
        transport: Any = self
        connected = getattr(self, self._check_connected_attribute, None) is not None
        if not connected:
            transport.connect()
        try:
            result = transport.execute(_request(), **self._check_timeout_args(seconds))
        finally:
            if not connected:
                transport.close()
        _checked(result)


class ChecksAsync:
    """``await check()`` for the async transports (aiohttp, httpx async), on asyncio or
    trio."""

    _check_connected_attribute: str  # "session" (aiohttp, per event loop) or "client"

    async def check(self, timeout: float = CHECK_TIMEOUT) -> None:
        """Check the credentials and the API now: the contract's check query, sent
        through this transport; returns once the API answered it.

        An OAuth2 transport keeps the token it fetched: at most one token request, none
        while a token is valid. See :doc:`readiness </readiness>`.

        Args:
            timeout: Seconds the check may take, its token included (10 by default).

        Raises:
            TokenRequestError: no token (OAuth2): the message says why.
            UnauthenticatedError: the API refused the token or the key.
            ServiceHTTPError, ServiceUnreachableError: no GraphQL answer from ``url``.
            ServiceTimeoutError: no answer within ``timeout``.
            gql.transport.exceptions.TransportQueryError: a GraphQL error.
        """
        import anyio

        seconds = _check_timeout(timeout)
        transport: Any = self
        connected = getattr(self, self._check_connected_attribute, None) is not None
        if not connected:
            await transport.connect()
        try:
            with anyio.fail_after(seconds):
                result = await transport.execute(_request())
        finally:
            if not connected:
                await transport.close()
        _checked(result)
