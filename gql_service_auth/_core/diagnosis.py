"""What to tell a user whose call failed for want of an answer: the messages of the
errors that name the URL or the setting at fault, the bound that ran out and what to do.

No I/O and no HTTP stack: the adapters say what happened (a status, a timeout of so many
seconds, a proxy on the way) and the words are chosen here, once for every stack, as
``gql-service-auth check`` says them.
"""

from __future__ import annotations

from typing import Final

from .constants import ENV_AUTH_URL, ENV_BASE_URL, GRAPHQL_PATH

_API_URL: Final = (
    f"check {ENV_BASE_URL} (the API host, to which from_env() appends {GRAPHQL_PATH}) or "
    "the url given"
)
_TOKEN_URL: Final = f"check {ENV_AUTH_URL} (with from_env()) or the token_url given"


def _after(gql_message: str, explanation: str) -> str:
    """gql's own message first, as code written for gql may match it, then ours."""
    gql_message = gql_message.strip()
    return f"{gql_message}: {explanation}" if gql_message else explanation


def http_status_message(gql_message: str, url: str, status: int) -> str:
    """The message of an HTTP error status from the API that carries no GraphQL answer."""
    if status in (404, 405):
        why = f"nothing answers GraphQL at {url} (HTTP {status}): {_API_URL}"
    elif status in (502, 503, 504):
        why = (
            f"the service at {url}, or a gateway or proxy before it, is unavailable "
            f"(HTTP {status}): try again later; if it lasts, {_API_URL}"
        )
    elif status >= 500:
        why = f"the service at {url} failed (HTTP {status}), with no GraphQL answer: try later"
    else:
        why = f"{url} answered HTTP {status} without a GraphQL answer: {_API_URL}"
    return _after(gql_message, why)


def proxy_clause(proxy: str | None) -> str:
    """`` through the proxy ...`` for a request that went through one, else nothing.

    ``proxy`` names it without credentials, and where it was set (``"host:port, which
    HTTP_PROXY names"``).
    """
    return f" through the proxy {proxy}" if proxy else ""


def unreachable_message(
    gql_message: str,
    url: str,
    *,
    timeout: float | None,
    timed_out: bool,
    proxy: str | None,
) -> str:
    """The message of a request to the API that got no answer: the connection failed,
    or ``timeout`` (the transport's own bound, when known) ran out."""
    via = proxy_clause(proxy)
    check_proxy = "; check the proxy too, or NO_PROXY" if proxy else ""
    if timed_out:
        bound = f" within {timeout:g} s (the transport's timeout)" if timeout else " in time"
        why = (
            f"no answer from {url}{via}{bound}: {_API_URL}, and that the service is up"
            f"{check_proxy}; a slower query needs a longer timeout"
        )
    else:
        why = f"could not reach {url}{via}: {_API_URL}, the network and the service{check_proxy}"
    return _after(gql_message, why)


def deadline_message(
    url: str, seconds: float, *, token_url: str | None = None, proxy: str | None = None
) -> str:
    """The message of a call whose deadline (gql's ``execute_timeout``) passed while it
    waited for the API's answer (through ``proxy``), or for a token from ``token_url``."""
    deadline = (
        f"within the {seconds:.1f} s the call was given (gql's Client execute_timeout, or "
        "a deadline of yours around the call)"
    )
    if token_url is not None:
        return (
            f"no access token from {token_url} {deadline}, so no query was sent: "
            f"{_TOKEN_URL} and that the authorization server is up"
        )
    check_proxy = "; check the proxy too, or NO_PROXY" if proxy else ""
    return (
        f"no answer from {url}{proxy_clause(proxy)} {deadline}: {_API_URL}, and that the "
        f"service is up{check_proxy}; a slower query needs a larger execute_timeout"
    )


def token_unreachable_hint(proxy: str | None) -> str:
    """What to do when the token endpoint could not be reached, or did not answer."""
    if proxy:
        return (
            "Check the proxy, or add the token host to NO_PROXY if it needs none; then "
            f"{ENV_AUTH_URL} (with from_env()) or the token_url given. This is retried "
            "within RetryPolicy"
        )
    return (
        f"Check {ENV_AUTH_URL} (with from_env()) or the token_url given, the network, and "
        "that the authorization server is up. This is retried within RetryPolicy"
    )
