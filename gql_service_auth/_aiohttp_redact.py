"""Scrubbing aiohttp's records of a request (``RequestInfo``) out of exception chains.

Registered with :mod:`gql_service_auth._redact` on import, by every module that sends
with aiohttp (the transports and the token request's session).
"""

from __future__ import annotations

from typing import cast

from aiohttp import ClientResponse, ClientResponseError, RequestInfo
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from ._redact import REDACTED, SENSITIVE_HEADERS, redact_text, register


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
    """aiohttp's ``ClientResponseError`` (and its subclasses) and their ``RequestInfo``."""

    def passwords(self, link: BaseException) -> list[str]:
        return _passwords(link)

    def scrub(self, link: BaseException, needles: list[str]) -> None:
        if isinstance(link, ClientResponseError):
            link.request_info = _redacted_info(link.request_info)
            link.args = tuple(
                _redacted_info(a) if isinstance(a, RequestInfo) else a for a in link.args
            )
            for response in link.history:
                # The record a redirect's response keeps of the request behind it, and
                # its own headers, which its repr shows and a server may echo into.
                response._request_info = _redacted_info(response.request_info)
                _scrub_headers(response, needles)


def _scrub_headers(response: ClientResponse, needles: list[str]) -> None:
    if not needles or response._headers is None:
        return
    headers = redact_text(response._headers, needles)
    if headers is not response._headers:
        response._headers = cast("CIMultiDictProxy[str]", headers)
        response._raw_headers = tuple(
            (name, cast("bytes", redact_text(value, needles)))
            for name, value in response._raw_headers
        )
        # aiohttp caches what its properties read (propcache): the copies go too.
        cache = getattr(response, "_cache", None)
        if isinstance(cache, dict):
            cache.pop("headers", None)
            cache.pop("raw_headers", None)


# aiosignal: aiohttp's trace signals, whose frames hold a request's headers.
register(_AiohttpRecords(), modules=("aiohttp", "aiosignal", "multidict", "yarl"))
