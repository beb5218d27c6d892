"""Scrubbing aiohttp's records of an exchange out of exception chains: the ``RequestInfo``
of a ``ClientResponseError``, and the responses of the redirects before it.

Registered with :mod:`gql_service_auth._core.redact` on import, by every module that sends
with aiohttp (the transports and the token request's session).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import ClientResponse, ClientResponseError, RequestInfo
from aiohttp.streams import EMPTY_PAYLOAD
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from .._core.redact import REDACTED, SENSITIVE_HEADERS, register


def _redacted_info(info: RequestInfo) -> RequestInfo:
    # A proxy's password sits in the URL of the CONNECT request aiohttp records (its
    # real_url), which ClientHttpProxyError's message shows.
    if not (
        any(name in info.headers for name in SENSITIVE_HEADERS)
        or info.url.password
        or info.real_url.password
    ):
        return info
    headers = CIMultiDict(info.headers)
    for name in SENSITIVE_HEADERS:
        if name in headers:
            headers[name] = REDACTED
    return RequestInfo(
        _redacted_url(info.url),
        info.method,
        CIMultiDictProxy(headers),
        _redacted_url(info.real_url),
    )


def _passwords(link: BaseException) -> list[str]:
    """The passwords in the URLs of aiohttp's record of a request (a proxy's)."""
    if not isinstance(link, ClientResponseError):
        return []
    try:
        urls = (link.request_info.url, link.request_info.real_url)
        return [p for url in urls for p in (url.password, url.raw_password) if p]
    except Exception:  # an odd record, made by the caller's code
        return []


def _redacted_url(url: URL) -> URL:
    return url.with_password(REDACTED) if url.password else url


class _AiohttpRecords:
    """aiohttp's ``ClientResponseError`` (and its subclasses) and their ``RequestInfo``; the
    responses of the redirects before it (``history``), and theirs."""

    def passwords(self, link: BaseException) -> list[str]:
        return _passwords(link)

    def scrub(self, link: BaseException) -> None:
        if isinstance(link, ClientResponseError):
            link.request_info = _redacted_info(link.request_info)
            link.args = tuple(
                _redacted_info(a) if isinstance(a, RequestInfo) else a for a in link.args
            )

    def responses(self, link: BaseException) -> Sequence[ClientResponse]:
        # The error keeps the headers of its own response (scrubbed as its attributes
        # are), not the response.
        return link.history if isinstance(link, ClientResponseError) else ()

    def history(self, response: ClientResponse) -> Sequence[ClientResponse]:
        return response.history

    def blank_requests(self, response: ClientResponse) -> None:
        response._request_info = _redacted_info(response._request_info)
        _forget(response, "request_info")

    def headers(self, response: ClientResponse) -> list[tuple[str, str]]:
        return [] if response._headers is None else list(response._headers.items())

    def replace_headers(self, response: ClientResponse, headers: list[tuple[str, str]]) -> None:
        response._headers = CIMultiDictProxy(CIMultiDict(headers))
        # aiohttp decodes header bytes as UTF-8 with surrogateescape: encoded back alike.
        response._raw_headers = tuple(
            (name.encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape"))
            for name, value in headers
        )
        _forget(response, "headers", "raw_headers", "links", "content_disposition")

    def body(self, response: ClientResponse) -> bytes | None:
        return response._body

    def replace_body(self, response: ClientResponse, body: bytes) -> None:
        if response._body is None:
            # aiohttp released a redirect's response unread: its stream keeps what had
            # arrived of the body in its buffer. The stream goes, buffer and all.
            response.content = EMPTY_PAYLOAD
        response._body = body


def _forget(response: ClientResponse, *names: str) -> None:
    """Drop aiohttp's cached copies of ``response``'s properties (its ``reify``), which
    would go on showing what was replaced."""
    cache = getattr(response, "_cache", None)
    if isinstance(cache, dict):
        for name in names:
            cache.pop(name, None)


# aiosignal: aiohttp's trace signals, whose frames hold a request's headers.
register(_AiohttpRecords(), modules=("aiohttp", "aiosignal", "multidict", "yarl"))
