"""What to tell a user whose call failed for want of an answer: the messages of the
errors that name the URL or the setting at fault, the bound that ran out and what to do.

No I/O and no HTTP stack: the adapters say what happened (a status, a timeout of so many
seconds, a proxy on the way) and the words are chosen here, once for every stack, as
``gql-service-auth check`` says them.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
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
    if status == 407:
        why = (
            f"the proxy on the way to {url} refused the request (HTTP 407 Proxy "
            "Authentication Required): check the proxy's credentials (HTTP_PROXY, "
            "HTTPS_PROXY, proxies=, proxy=), or NO_PROXY if the service needs no proxy"
        )
    elif status in (404, 405):
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


_PLAIN_REASONS: Final = frozenset(
    {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"}
)
"""OpenSSL's reasons for a handshake that met a plain-http answer: its versions differ."""


def chain_links(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the errors behind it, nearest first: causes and contexts, and what a
    stack's error holds as its ``reason``, ``os_error`` or arguments (urllib3's, requests'
    and aiohttp's); each once, 64 at most."""
    seen: set[int] = set()
    pending: list[object] = [error]
    while pending and len(seen) < 64:
        link = pending.pop(0)
        if not isinstance(link, BaseException) or id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        pending += [
            link.__cause__,
            link.__context__,
            getattr(link, "reason", None),
            getattr(link, "os_error", None),
            *link.args,
        ]


def answered_in_plain(error: BaseException) -> bool:
    """Whether a TLS failure is a server that answered the handshake in plain http (an
    https:// URL to an http:// port): told by OpenSSL's reason on the ``ssl.SSLError`` in
    ``error``'s chain, never by a text that may quote the URL."""
    for link in chain_links(error):
        reason = getattr(link, "reason", None) if isinstance(link, ssl.SSLError) else None
        if isinstance(reason, str):  # OpenSSL's own (aiohttp's errors are SSLErrors too)
            return reason in _PLAIN_REASONS
    return False


def unreachable_message(
    gql_message: str,
    url: str,
    *,
    timeout: float | None,
    failure: str,
    proxy: str | None,
) -> str:
    """The message of a request to the API that got no answer. ``failure`` says how:
    ``"timeout"`` (``timeout``, the transport's own bound, when known, ran out),
    ``"connect"`` (no connection: refused, no such host), ``"tls"`` (the TLS handshake or
    the certificate's check failed), ``"plain"`` (the server answered the handshake in
    plain http: an https:// URL to an http:// port), or ``"dropped"`` (the connection
    failed once made: the request may have reached the service)."""
    via = proxy_clause(proxy)
    check_proxy = "; check the proxy too, or NO_PROXY" if proxy else ""
    if failure == "timeout":
        bound = f" within {timeout:g} s (the transport's timeout)" if timeout else " in time"
        why = (
            f"no answer from {url}{via}{bound}: {_API_URL}, and that the service is up"
            f"{check_proxy}; a slower query needs a longer timeout"
        )
    elif failure == "tls":
        why = (
            f"the TLS connection to {url}{via} failed: check the server's certificate and "
            "the transport's TLS setting (ssl=, verify=); never turn verification off for "
            "the service"
        )
    elif failure == "plain":
        which = f"{_API_URL}, or the proxy's URL" if proxy else _API_URL
        why = (
            f"the server at {url}{via} answered in plain http, not TLS: {which}; an "
            "https:// URL names a port that serves http://"
        )
    elif failure == "dropped":
        why = (
            f"the connection to {url}{via} failed before an answer came: the request may "
            "have reached the service, so check that a mutation did not take effect before "
            f"sending it again{check_proxy}"
        )
    else:
        why = f"could not reach {url}{via}: {_API_URL}, the network and the service{check_proxy}"
    return _after(gql_message, why)


def deadline_message(
    url: str,
    seconds: float,
    *,
    token_url: str | None = None,
    proxy: str | None = None,
    bound: str = "gql's execute_timeout",
) -> str:
    """The message of a call that a deadline (``seconds`` of ``bound``) ended while it
    waited for the API's answer, or for a token from ``token_url`` (a fetch was under way
    and no usable token in hand); ``proxy``: the one on the way, named."""
    deadline = f"within the {seconds:g} s of {bound}"
    check_proxy = "; check the proxy too, or NO_PROXY" if proxy else ""
    if token_url is not None:
        return (
            f"no access token from {token_url}{proxy_clause(proxy)} {deadline} (a token "
            f"fetch was still under way): {_TOKEN_URL}, and that the authorization server "
            f"is up{check_proxy}"
        )
    return (
        f"no answer from {url}{proxy_clause(proxy)} {deadline}: {_API_URL}, and that the "
        f"service is up{check_proxy}; a slower query needs a larger {bound.split()[-1]}"
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
