"""The OAuth 2.0 client-credentials grant (RFC 6749 section 4.4) as a token fetcher.

The grant builds the request, reads the answer and retries transient failures; sending
the bytes is left to a :class:`FormPoster`, so another HTTP library can be plugged in
(the aiohttp one is in ``_stacks/aiohttp_token_post.py``).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Protocol, TypeAlias
from urllib.parse import quote_plus

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
)
from yarl import URL

from .constants import (
    BEARER_SCHEME,
    DEFAULT_RETRY_ATTEMPTS,
    DEFAULT_RETRY_TIMEOUT,
    DEFAULT_WAIT_INITIAL,
    DEFAULT_WAIT_JITTER,
    DEFAULT_WAIT_MAX,
    MAX_SERVER_TEXT,
    MAX_TOKEN_RESPONSE_BYTES,
)
from .credentials import ClientCredentials
from .errors import ConfigurationError, TokenRequestError
from .events import AuthEvent
from .token import TokenResponse

ClientAuthMethod: TypeAlias = Literal["client_secret_post", "client_secret_basic"]
"""How the client authenticates at the token endpoint (RFC 6749 section 2.3.1 names).

``client_secret_post`` sends id and secret as form fields, as the service contract says;
``client_secret_basic`` sends them in an HTTP Basic ``Authorization`` header.
"""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounds and backoff for retries of the token endpoint, and pauses of renewals.

    The n-th wait is ``wait_initial * 2 ** (n - 1)`` seconds, capped at ``wait_max``, plus
    up to ``wait_jitter`` seconds of random jitter; a server's ``Retry-After`` is honoured
    when longer. The same backoff spaces renewals while the API keeps refusing tokens the
    authorization server has just issued (see :meth:`pause_after`). Use
    ``RetryPolicy(wait_initial=0, wait_max=0, wait_jitter=0)`` in tests.

    Args:
        attempts: Most requests to the token endpoint for one token, the first included.
        timeout: Most seconds one token fetch may take, waits included. A ``Retry-After``
            that would run past it ends the fetch at once instead of sleeping. Keep it
            below gql's ``execute_timeout`` (10 s by default) minus the transport's
            ``timeout``, so that a failing token endpoint ends in a ``TokenRequestError``
            rather than gql's bare ``TimeoutError``.
        wait_initial: Seconds of the first wait.
        wait_max: Seconds of the longest wait computed by backoff.
        wait_jitter: Seconds of the most jitter added to a wait.
    """

    attempts: int = DEFAULT_RETRY_ATTEMPTS
    timeout: float = DEFAULT_RETRY_TIMEOUT
    wait_initial: float = DEFAULT_WAIT_INITIAL
    wait_max: float = DEFAULT_WAIT_MAX
    wait_jitter: float = DEFAULT_WAIT_JITTER

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigurationError("RetryPolicy.attempts must be an int of at least 1")
        for name in ("timeout", "wait_initial", "wait_max", "wait_jitter"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigurationError(f"RetryPolicy.{name} must be a finite number >= 0")
        if self.timeout == 0:
            raise ConfigurationError("RetryPolicy.timeout must be more than 0 seconds")

    def wait_before(self, attempt: int) -> float:
        """Seconds to wait after the ``attempt``-th failed attempt (from 1), before the next.

        ``wait_initial``, doubling up to ``wait_max``, plus up to ``wait_jitter`` at random;
        a server's ``Retry-After`` may ask for more.
        """
        exponent = min(max(attempt - 1, 0), 64)  # 2**64 times any wait is past wait_max
        wait = min(self.wait_initial * 2.0**exponent, self.wait_max)
        return max(wait, 0.0) + random.uniform(0, self.wait_jitter)

    def pause_after(self, refusals: int) -> float:
        """Seconds renewals pause after ``refusals`` consecutive refused fresh tokens.

        A token the API refused before accepting any request with it is "fresh". One such
        refusal is renewed at once (a token can be revoked between issue and use); from
        the second on, renewals back off like retries: ``wait_initial``, then doubling up
        to ``wait_max``, plus jitter. The first accepted answer ends the pause.
        """
        if refusals < 2:
            return 0.0
        pause = min(self.wait_initial * 2 ** (refusals - 2), self.wait_max)
        return float(pause) + random.uniform(0, self.wait_jitter)


# Shown as gql_service_auth.RetryPolicy, where users import it from (see _core/errors.py).
RetryPolicy.__module__ = "gql_service_auth"


@dataclass(frozen=True, slots=True)
class FormAnswer:
    """What an HTTP stack hands back from the token endpoint.

    ``headers`` should be case-insensitive, as a ``multidict.CIMultiDict`` is.
    """

    status: int
    headers: Mapping[str, str]
    body: bytes


class FormPoster(Protocol):
    """Sends a urlencoded form by POST, follows no redirect, and returns the answer.

    A poster may also have a ``secrets()`` method returning credentials of its own (a
    proxy's), which the grant then keeps out of its errors as it does the client secret.

    Raises:
        TokenRequestError: with ``retryable=True`` when no answer came (connection
            failure, timeout).
    """

    async def __call__(
        self, url: str | URL, form: Mapping[str, str], headers: Mapping[str, str], timeout: float
    ) -> FormAnswer: ...


def secrets_sent(form: Mapping[str, str], headers: Mapping[str, str]) -> list[str]:
    """Every form in which a token request carries the client's secret."""
    secret = form.get("client_secret", "")
    authorization = headers.get("Authorization", "")
    return [secret, quote_plus(secret), authorization, authorization.partition(" ")[2]]


# Codes of RFC 6749 section 5.2 and what the user should do about each.
_HINTS: Mapping[str, str] = {
    "invalid_client": (
        "The authorization server refused the Client Id or Client Secret: check client_id "
        "and client_secret (SERVICE_CLIENT_ID, SERVICE_CLIENT_SECRET). A lost secret cannot "
        "be shown again: create new credentials in the console"
    ),
    "invalid_scope": "The requested scope was refused: check the scope argument",
    "unauthorized_client": (
        "These credentials may not use the client-credentials grant: check their settings "
        "in the console"
    ),
    "unsupported_grant_type": (
        "This endpoint does not support client_credentials: check that token_url is the "
        "service's {auth_url}/oauth2/token"
    ),
    "invalid_grant": "The grant was refused: check the credentials and token_params",
    "invalid_request": (
        "The token request was malformed for this server: check token_url, token_params "
        "and token_auth_method"
    ),
}
_WRONG_TOKEN_URL = (
    "Wrong token_url? It must be the service's {auth_url}/oauth2/token; from_env() "
    "appends /oauth2/token to SERVICE_AUTH_URL"
)
_TRANSIENT_CODES = frozenset({"temporarily_unavailable", "server_error", "slow_down"})


def _is_transient_status(status: int) -> bool:
    return status in (408, 425, 429) or status >= 500


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110 section 10.2.3).

    Accepts delay-seconds (a fraction too, leniently) or an HTTP-date; ``None`` when
    absent or unreadable.
    """
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return max(seconds, 0.0)


def _expires_in(value: object) -> float | None:
    # RFC 6749 says a number; servers also send numeric strings. Anything unreadable is
    # treated as absent, so the default lifetime applies rather than "forever".
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _fits_in_a_header(token: str) -> bool:
    # Visible ASCII only: a superset of RFC 6750's b64token, lenient to odd servers.
    return all("!" <= char <= "~" for char in token)


def _optional_str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def checked_token_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``token_params`` as the token request sends them: each value a ``str``, or a list
    (or tuple) of ``str`` for a field sent once per value (RFC 8707's ``resource``).

    Anything else is refused rather than turned into text: ``True`` and ``1`` would go
    as ``"True"`` and ``"1"``, a set in no fixed order, a dict as its keys. An empty list
    is dropped, as it sends nothing.

    Raises:
        ConfigurationError: a name or value of another type, or a field the grant sets
            itself.
    """
    reserved = {"grant_type", "client_id", "client_secret", "scope"} & set(params or {})
    if reserved:
        raise ConfigurationError(
            f"token_params must not set {', '.join(sorted(reserved))}: "
            "use the transport's own arguments"
        )
    checked: dict[str, Any] = {}
    for name, value in (params or {}).items():
        if not isinstance(name, str):
            raise ConfigurationError(f"token_params names must be str, not {name!r}")
        values = value if isinstance(value, list | tuple) else [value]
        if not all(isinstance(each, str) for each in values):
            raise ConfigurationError(
                f"token_params[{name!r}] must be a str, or a list of str for a field sent "
                f"once per value; got {type(value).__name__}"
            )
        if isinstance(value, list | tuple):
            if value:  # an empty list sends nothing, as no field does
                checked[name] = [str.__str__(each) for each in value]
        else:
            checked[name] = str.__str__(value)  # a str subclass compares as what is sent
    return checked


def checked_auth_method(method: object) -> ClientAuthMethod:
    """``token_auth_method``, one of the two the grant knows.

    Raises:
        ConfigurationError: any other.
    """
    if method == "client_secret_post" or method == "client_secret_basic":
        return method
    raise ConfigurationError(
        "token_auth_method must be 'client_secret_post' or 'client_secret_basic'"
    )


class ClientCredentialsGrant:
    """Fetches tokens with the client-credentials grant: a :class:`TokenFetcher`.

    Args:
        token_url: ``{auth_url}/oauth2/token``.
        credentials: The client's id and secret.
        scope: Sent as ``scope`` on every request when given.
        extra_params: Further form fields sent on every request (``audience``...).
        auth_method: Form fields (the contract) or HTTP Basic.
        policy: Bounds of the retries of transient failures.
        post: The HTTP stack.
        emit: Receives retry events.
    """

    def __init__(
        self,
        token_url: str | URL,
        credentials: ClientCredentials,
        *,
        scope: str | None,
        extra_params: Mapping[str, str],
        auth_method: ClientAuthMethod,
        policy: RetryPolicy,
        post: FormPoster,
        emit: Callable[[AuthEvent], None],
    ) -> None:
        auth_method = checked_auth_method(auth_method)
        extra_params = checked_token_params(extra_params)
        self._token_url = token_url
        self._credentials = credentials
        self._auth_method = auth_method
        self._policy = policy
        self._post = post
        # A poster may name secrets of its own (a proxy's credentials), which a proxy or a
        # debugging page behind it may quote back, as a server may quote the client's.
        self._post_secrets: Callable[[], list[str]] | None = getattr(post, "secrets", None)
        self._emit = emit
        form = {"grant_type": "client_credentials"}
        if scope:
            form["scope"] = scope
        form.update(extra_params)
        self._public_form = form

    def __repr__(self) -> str:
        return f"<ClientCredentialsGrant {self._token_url} {self._credentials!r}>"

    def _request(self) -> tuple[dict[str, str], dict[str, str]]:
        # Built per request, so the secret lives in no long-lived structure but the
        # credentials object, whose repr hides it.
        form = dict(self._public_form)
        headers = {"Accept": "application/json"}
        if self._auth_method == "client_secret_basic":
            headers["Authorization"] = self._credentials.basic_authorization()
        else:
            form["client_id"] = self._credentials.client_id
            form["client_secret"] = self._credentials.client_secret
        return form, headers

    async def __call__(self) -> TokenResponse:
        """Obtain one token, retrying transient failures within the policy's bounds.

        Raises:
            TokenRequestError: refused, malformed, or still failing when the bounds ran out.
        """
        deadline = time.monotonic() + self._policy.timeout
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._policy.attempts)
            | stop_before_delay(self._policy.timeout),
            wait=self._wait,
            retry=retry_if_exception(
                lambda exc: isinstance(exc, TokenRequestError) and exc.retryable
            ),
            before_sleep=self._before_sleep,
            reraise=True,
        )
        attempt_number = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempt_number = attempt.retry_state.attempt_number
                    remaining = max(deadline - time.monotonic(), 0.001)
                    form, headers = self._request()
                    try:
                        answer = await self._post(self._token_url, form, headers, remaining)
                    finally:
                        # Tracebacks keep this frame's locals, and crash reporters read them.
                        del form, headers
                    return self._parse(answer)
        except TokenRequestError as exc:
            exc.attempts = attempt_number
            raise
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover

    def _wait(self, state: RetryCallState) -> float:
        wait = self._policy.wait_before(state.attempt_number)
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        retry_after = getattr(error, "retry_after", None)
        return max(wait, retry_after or 0.0)

    def _before_sleep(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        self._emit(
            AuthEvent(
                "token_request_retry_scheduled",
                attempt=state.attempt_number,
                max_attempts=self._policy.attempts,
                wait=state.upcoming_sleep,
                status=getattr(error, "status", None),
                error=getattr(error, "error", None) or type(error).__name__,
            )
        )

    def _redact(self, text: str) -> str:
        # A server may echo what it was sent, in any of the forms it was sent in: the
        # secret must not reach a message.
        secret = self._credentials.client_secret
        basic = self._credentials.basic_authorization().partition(" ")[2]
        extra = self._post_secrets() if self._post_secrets is not None else []
        for sent in (secret, quote_plus(secret), basic, *extra):
            if sent:
                text = text.replace(sent, "***")
        if len(text) > MAX_SERVER_TEXT:
            text = text[:MAX_SERVER_TEXT] + "..."
        return text

    def _parse(self, answer: FormAnswer) -> TokenResponse:
        status = answer.status
        if len(answer.body) > MAX_TOKEN_RESPONSE_BYTES:
            raise TokenRequestError(
                f"the token endpoint sent more than {MAX_TOKEN_RESPONSE_BYTES} bytes "
                f"(HTTP {status})",
                status=status,
                hint="Check that token_url is the service's {auth_url}/oauth2/token",
            )
        try:
            document: object = json.loads(answer.body)
        except (ValueError, UnicodeDecodeError):
            document = None
        if 300 <= status < 400:
            location = answer.headers.get("Location")
            raise TokenRequestError(
                f"the token endpoint answered with a redirect (HTTP {status}"
                + (f" to {self._redact(location)}" if location else "")
                + "), which is not followed so that credentials go nowhere else",
                status=status,
                hint="Set token_url to the final address",
            )
        if 200 <= status < 300:
            return self._parse_success(status, document)
        return self._raise_error(answer, document)

    def _parse_success(self, status: int, document: object) -> TokenResponse:
        if not isinstance(document, dict):
            raise TokenRequestError(
                f"the token endpoint answered HTTP {status} with a body that is not a JSON object",
                status=status,
                hint="Check that token_url is the service's {auth_url}/oauth2/token",
            )
        access_token = document.get("access_token")
        if not isinstance(access_token, str) or not access_token.strip():
            raise TokenRequestError(
                f"the token endpoint answered HTTP {status} without an access_token",
                status=status,
                hint="Check that token_url is the service's {auth_url}/oauth2/token",
            )
        if not _fits_in_a_header(access_token):
            # It goes into "Authorization: Bearer <token>": whitespace or control
            # characters would break the header or inject another (RFC 6750 section 2.1
            # allows only b64token characters).
            raise TokenRequestError(
                f"the token endpoint answered HTTP {status} with an access_token that "
                "cannot be sent in an HTTP header (whitespace or control characters)",
                status=status,
                hint="The authorization server is misbehaving; report it to the service",
            )
        token_type = _optional_str(document.get("token_type"))
        if token_type is not None and token_type.lower() != BEARER_SCHEME.lower():
            # RFC 6749 section 7.1: a client must not use a token whose type it does not
            # understand. A DPoP or MAC token sent as Bearer would be refused, or worse.
            raise TokenRequestError(
                f"the token endpoint issued a token with token_type {self._redact(token_type)!r}; "
                "only Bearer tokens can be sent (RFC 6749 section 7.1)",
                status=status,
                hint="Ask the service for Bearer tokens: check token_params and scope",
            )
        return TokenResponse(
            access_token=access_token,
            expires_in=_expires_in(document.get("expires_in")),
            token_type=token_type,
            scope=_optional_str(document.get("scope")),
        )

    def _raise_error(self, answer: FormAnswer, document: object) -> TokenResponse:
        status = answer.status
        fields = document if isinstance(document, dict) else {}
        error = _optional_str(fields.get("error"))
        description = _optional_str(fields.get("error_description"))
        uri = _optional_str(fields.get("error_uri"))
        retryable = _is_transient_status(status) or error in _TRANSIENT_CODES
        if error is not None:
            error = self._redact(error)
        reason = "the token endpoint refused the request"
        if status in (404, 405):
            # No such path, or a path that takes no POST: the URL is wrong, whatever the
            # body says; the credentials were never looked at.
            reason = "nothing takes token requests at token_url"
            hint = _WRONG_TOKEN_URL
        elif error is not None and error in _HINTS:
            hint = _HINTS[error]
        elif status == 407:
            hint = (
                "A proxy refused the request (Proxy Authentication Required): check the "
                "credentials in token_proxy or token_session_args, or in HTTP_PROXY with "
                "trust_env"
            )
        elif retryable:
            hint = "The authorization server is unavailable; try again later"
        elif status in (401, 403):
            hint = _HINTS["invalid_client"]
        else:
            hint = "Check token_url and the credentials"
        raise TokenRequestError(
            f"{reason} (HTTP {status}" + (f", {error}" if error else "") + ")",
            status=status,
            error=error,
            error_description=self._redact(description) if description else None,
            error_uri=self._redact(uri) if uri else None,
            retryable=retryable,
            retry_after=parse_retry_after(answer.headers.get("Retry-After")),
            hint=hint,
        )
