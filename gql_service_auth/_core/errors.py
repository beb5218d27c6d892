"""The errors gql-service-auth raises: one tree, rooted in :class:`GqlServiceAuthError`.

::

    GqlServiceAuthError
    ├── ConfigurationError                 (also ValueError)
    ├── TokenRequestError                  (also gql TransportQueryError)
    │   └── TokenBudgetExceededError
    ├── UnauthenticatedError               (also gql TransportQueryError)
    │   ├── ApiKeyRejectedError
    │   │   └── ApiKeyRejectedHTTPError    (also UnauthenticatedHTTPError)
    │   └── UnauthenticatedHTTPError       (also gql TransportServerError, code 401)
    ├── ServiceHTTPError                   (also gql TransportServerError)
    ├── ServiceUnreachableError            (also gql TransportConnectionFailed)
    └── ServiceTimeoutError                (also TimeoutError)

Why the gql bases: gql's aiohttp transport turns any error that is not a gql
``TransportError`` into ``TransportConnectionFailed``, and a reconnecting gql session
retries every error except ``TransportQueryError`` five times. The errors raised while
a query runs are ``TransportQueryError`` so that ``except TransportQueryError`` keeps
catching them, and so gql never multiplies retries this package already bounded:
transient token endpoint failures were retried here, within
:class:`~gql_service_auth.RetryPolicy`; bad credentials fail at once.

Why the ``...HTTPError`` pair: for a bare HTTP 401 (no GraphQL body) gql's own transport
raises ``TransportServerError`` with ``code`` 401, and code written for gql catches that.
The error that ends such a request is that too, with gql's message first, and stays a
``TransportQueryError`` so that gql's reconnecting session still does not retry it.

Why the ``Service...`` errors: gql raises ``TransportServerError`` for an HTTP status that
is no GraphQL answer, ``TransportConnectionFailed`` when no answer came, and its client's
``execute_timeout`` a bare ``TimeoutError``; their messages name neither the setting at
fault nor what to do. The package's are the same classes (so ``except`` clauses written
for gql, and gql's reconnecting session, treat them as before), with gql's message first
and the URL, the bound that ran out and the remedy after it.

No message here ever holds a secret, an access token or an ``Authorization`` value.
"""

from __future__ import annotations

from typing import Any

from gql.transport.exceptions import (
    TransportConnectionFailed,
    TransportQueryError,
    TransportServerError,
)


class GqlServiceAuthError(Exception):
    """Base class of every error raised by gql-service-auth."""


class ConfigurationError(GqlServiceAuthError, ValueError):
    """A transport was given bad settings: a missing variable, an unsafe URL, a bad argument.

    Raised when the transport is built, before any request is sent.
    """


class TokenRequestError(GqlServiceAuthError, TransportQueryError):
    """The token endpoint did not issue an access token.

    Attributes:
        status: HTTP status of the last answer, or ``None`` when no answer came
            (connection refused, timeout).
        error: The RFC 6749 section 5.2 ``error`` code (``"invalid_client"``...), or
            ``None`` when the body carried none.
        error_description: The server's ``error_description``, shortened, or ``None``.
        error_uri: The server's ``error_uri``, or ``None``.
        retryable: Whether trying again later may succeed (429, 5xx, network). This
            package already retried such failures; the flag is for the caller's own policy.
        retry_after: Seconds the server asked to wait (``Retry-After``), or ``None``.
        attempts: Requests made to the token endpoint for this token.
    """

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        error: str | None = None,
        error_description: str | None = None,
        error_uri: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        hint: str | None = None,
    ) -> None:
        TransportQueryError.__init__(self, reason)
        self.reason = reason
        self.status = status
        self.error = error
        self.error_description = error_description
        self.error_uri = error_uri
        self.retryable = retryable
        self.retry_after = retry_after
        self.hint = hint
        self.attempts = 1
        #: No request went: the token budget kept it (see _core/budget.py).
        self._not_sent = False

    def __str__(self) -> str:
        parts = [self.reason]
        if self.error_description:
            parts.append(f"server said: {self.error_description!r}")
        if self.attempts > 1:
            parts.append(f"after {self.attempts} attempts")
        message = "; ".join(parts)
        return f"{message}. {self.hint}" if self.hint else message


class TokenBudgetExceededError(TokenRequestError):
    """No token was requested: the credentials' token budget is spent (see
    :class:`~gql_service_auth.TokenBudget`).

    Raised to the calls that need a new token while the budget has no room; a token
    still valid keeps serving the others. ``retry_after`` is the seconds until the window
    has room again, in this process's count.

    Attributes:
        budget: The budget spent.
    """

    def __init__(self, reason: str, *, budget: Any, retry_after: float, hint: str) -> None:
        super().__init__(reason, retryable=True, retry_after=retry_after, hint=hint)
        self.budget = budget


class UnauthenticatedError(GqlServiceAuthError, TransportQueryError):
    """The GraphQL API refused the credentials (``extensions.code == "UNAUTHENTICATED"``).

    ``errors``, ``data`` and ``extensions`` hold the service's answer, as on any gql
    ``TransportQueryError``; ``errors`` is ``None`` when the server answered HTTP 401
    without a GraphQL body.
    """

    def __init__(
        self,
        message: str,
        *,
        errors: list[Any] | None = None,
        data: Any | None = None,
        extensions: Any | None = None,
    ) -> None:
        TransportQueryError.__init__(
            self, message, errors=errors, data=data, extensions=extensions
        )


class ApiKeyRejectedError(UnauthenticatedError):
    """The service refused the API key.

    Either the Client Id and Client Secret are wrong, or the credentials were registered
    before 2024-05-13, which the service accepts only through OAuth2.
    """


class UnauthenticatedHTTPError(UnauthenticatedError, TransportServerError):
    """The service answered HTTP 401 without a GraphQL body, and the request ends there.

    Also gql's ``TransportServerError``, with ``code == 401`` and a message that starts
    with gql's own (``"401, message='Unauthorized', url=..."``), so code written for
    gql's ``AIOHTTPTransport`` keeps catching it. ``errors`` is ``None``; the cause is
    the error gql raised, rid of credentials.
    """

    def __init__(self, message: str) -> None:
        # TransportQueryError's __init__ reaches TransportServerError's through super(),
        # which sets code to None: set it after.
        UnauthenticatedError.__init__(self, message)
        self.code = 401


class ApiKeyRejectedHTTPError(ApiKeyRejectedError, UnauthenticatedHTTPError):
    """The service refused the API key with HTTP 401 and no GraphQL body.

    An :class:`ApiKeyRejectedError` that is also gql's ``TransportServerError`` with
    ``code == 401``; see :class:`UnauthenticatedHTTPError`.
    """


class ServiceHTTPError(GqlServiceAuthError, TransportServerError):
    """The API answered an HTTP error status with no GraphQL answer (a 404 from a wrong
    URL, a 502 from a proxy...); a bare 401 is :class:`UnauthenticatedHTTPError`.

    gql's ``TransportServerError``: ``code`` is the status, and the message starts with
    gql's own; the cause is gql's (the stack's error, with the response on requests and
    httpx).
    """

    def __init__(self, message: str, code: int | None = None) -> None:
        # code is a keyword with a default: pickle and copy rebuild an error from its
        # args (the message), then restore code from its __dict__.
        TransportServerError.__init__(self, message, code)


class ServiceUnreachableError(GqlServiceAuthError, TransportConnectionFailed):
    """No answer came from the API: the connection failed or was refused, a proxy failed,
    or the transport's own ``timeout`` ran out.

    gql's ``TransportConnectionFailed`` (a reconnecting gql session reconnects, as
    before); the message starts with gql's own, and the stack's error is the cause.
    """


class ServiceTimeoutError(GqlServiceAuthError, TimeoutError):
    """gql's ``Client`` ``execute_timeout`` (or ``check()``'s timeout) passed before the
    API answered; a deadline of the caller's own stays the caller's.

    A ``TimeoutError``, as gql's client raises at that deadline, with the URL, the bound
    and what to do in its message.
    """


# Tracebacks, reprs and docs show gql_service_auth.TokenRequestError, where users import it
# from, not this private module (httpx and attrs do the same). Pickle looks classes up by
# module and name, and finds them there too.
for _public in (
    GqlServiceAuthError,
    ConfigurationError,
    TokenRequestError,
    TokenBudgetExceededError,
    UnauthenticatedError,
    ApiKeyRejectedError,
    UnauthenticatedHTTPError,
    ApiKeyRejectedHTTPError,
    ServiceHTTPError,
    ServiceUnreachableError,
    ServiceTimeoutError,
):
    _public.__module__ = "gql_service_auth"
del _public
