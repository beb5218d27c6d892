"""The operator's count of a transport's calls that failed, by method and cause.

Runs on the failure path only: a call that succeeds pays nothing for it. Counted are the
package's own errors, and gql's ``TransportProtocolError``, an answer that is no GraphQL
(a web page where the API should be); an error of the application's, a GraphQL error of
the answer's own, or a cancellation goes on uncounted, as it is no failure of the
service's authentication or reach.
"""

from __future__ import annotations

from typing import Final

from gql.transport.exceptions import TransportProtocolError, TransportServerError

from .._core import telemetry
from .._core.errors import (
    ConfigurationError,
    GqlServiceAuthError,
    ServiceHTTPError,
    ServiceTimeoutError,
    ServiceUnreachableError,
    TokenRequestError,
    UnauthenticatedError,
)
from .unanswered import how

COUNTED: Final = (GqlServiceAuthError, TransportProtocolError)
"""What a call may raise that is counted (an ``except`` clause of the call wrappers)."""

_UNREACHABLE: Final = {
    "connect": "unreachable",
    "timeout": "timeout",
    "tls": "tls",
    "plain": "tls",
    "dropped": "dropped",
}
"""The cause of a :class:`ServiceUnreachableError`, by how the request failed."""


def count(failure: BaseException, method: telemetry.Method) -> None:
    """Count ``failure``, which a call of a transport of ``method`` raises, if it counts."""
    if not isinstance(failure, COUNTED) or not telemetry.recording():
        return
    try:
        status = failure.code if isinstance(failure, TransportServerError) else None
        telemetry.request_failed(
            method,
            cause(failure),
            type(failure).__name__,
            status if isinstance(status, int) else None,
        )
    except Exception:  # a telemetry bug must not replace the call's own error
        telemetry.failed("request_failed")


def cause(failure: BaseException) -> str:
    """Why the call failed, one of :data:`~gql_service_auth._core.telemetry.CAUSES`.

    ``refused``: the service refused the credentials (or refusals of them paused renewals,
    and the call was not sent); ``token``: no token could be had; ``http_status``: the API
    answered an error status and no GraphQL; ``not_graphql``: it answered something else
    than GraphQL; ``unreachable``, ``tls``, ``dropped``, ``timeout``: no answer came, for
    want of a connection, of TLS (a certificate, or a port that serves plain http), of the
    connection kept once the request had gone, or in time.
    """
    if isinstance(failure, UnauthenticatedError):
        return "refused"
    if isinstance(failure, TokenRequestError):
        return "token"
    if isinstance(failure, ServiceHTTPError):
        return "http_status"
    if isinstance(failure, TransportProtocolError):
        return "not_graphql"
    if isinstance(failure, ServiceTimeoutError):
        return "timeout"
    if isinstance(failure, ServiceUnreachableError):
        return _UNREACHABLE.get(how(failure), "unreachable")
    if isinstance(failure, ConfigurationError):
        return "configuration"
    return "other"
