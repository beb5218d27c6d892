"""``transport.check()``: the credentials and the API, checked now, from the application.

A readiness probe, or a start that fails at once rather than on the first request: the
contract's check query (``carriers(first: 1)``) goes through the transport itself, so it
proves what the application's queries need (the token, or the key, accepted by the API
at the URL given, through the same proxy and TLS settings). An OAuth2 transport keeps
the token it fetched for it: a check costs at most one token request, none while a token
is valid. The check connects a copy of the transport, and closes it after: the
application's own connection is never touched.

Failures raise what a query would (:class:`~gql_service_auth.TokenRequestError`,
:class:`~gql_service_auth.UnauthenticatedError`, :class:`~gql_service_auth.ServiceHTTPError`
...), with their messages; a GraphQL error, gql's ``TransportQueryError``. The bound,
``timeout``, ends a check that hangs with :class:`~gql_service_auth.ServiceTimeoutError`
(async stacks) or the stack's own timeout (sync stacks).
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar, Final

from gql.graphql_request import GraphQLRequest
from gql.transport.exceptions import TransportQueryError
from graphql import ExecutionResult, parse

from .._core.diagnosis import deadline_message
from .._core.errors import ServiceTimeoutError
from .._core.telemetry import Method
from .failures import count

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


def _probe_of(transport: object) -> Any:
    """A transport of the same settings, not connected, that the check connects and
    closes: it never touches the application's connection, which other tasks or threads
    connect, use and close meanwhile (a probe that borrowed it failed when the
    application closed it). The copy shares the transport's token manager: the token it
    fetches, or uses, is the transport's."""
    return copy.copy(transport)


def _check_timeout(timeout: float) -> float:
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0:
        from .._core.errors import ConfigurationError

        raise ConfigurationError(f"timeout must be a positive number of seconds, not {timeout!r}")
    return float(timeout)


class ChecksBlocking:
    """``check()`` for the sync transports (requests, httpx)."""

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
        probe = _probe_of(self)
        probe.connect()
        try:
            result = probe.execute(_request(), **self._check_timeout_args(seconds))
        finally:
            probe.close()
        _checked(result)


class ChecksAsync:
    """``await check()`` for the async transports: aiohttp on asyncio, httpx async on
    asyncio or trio."""

    #: How the transport's failed calls are counted (see _stacks/failures.py).
    _method: ClassVar[Method]

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
        probe = _probe_of(self)
        connected = False
        try:
            with anyio.fail_after(seconds):
                await probe.connect()
                connected = True
                result = await probe.execute(_request())
        except anyio.get_cancelled_exc_class():
            raise
        except TimeoutError as exc:
            if isinstance(exc, ServiceTimeoutError):
                raise
            tokens = getattr(transport, "_tokens", None) or getattr(
                getattr(transport, "_rules", None), "tokens", None
            )
            waited = getattr(tokens, "waited_for", None)
            token = waited() if waited is not None else None
            error = ServiceTimeoutError(
                deadline_message(
                    str(transport.url),
                    seconds,
                    token_url=token[0] if token else None,
                    proxy=token[1] if token else transport._unanswered_proxy(),
                    bound="check()'s timeout",
                )
            )
            count(error, self._method)  # the probe's call was cut off uncounted
            raise error from None
        finally:
            if connected:
                with anyio.CancelScope(shield=True):
                    await probe.close()
        _checked(result)
