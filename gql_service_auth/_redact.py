"""Keeping credentials out of exceptions: aiohttp's request records and echoed text.

aiohttp's ``ClientResponseError`` (and its subclasses ``TooManyRedirects``,
``ContentTypeError``...) carries a ``RequestInfo`` whose ``headers`` are the request's,
``Authorization`` included; its ``repr`` and ``vars()`` show them. gql chains such errors
as the cause of ``TransportServerError`` and ``TransportConnectionFailed``, and crash
reporters walk chains. Redacting the record in place keeps the chain (the URL, the
status, the message) for debugging and drops only the credentials.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from aiohttp import ClientResponseError, RequestInfo
from multidict import CIMultiDict, CIMultiDictProxy

REDACTED: Final = "***"
"""What stands where a credential was."""

_SENSITIVE_HEADERS: Final = ("Authorization", "Proxy-Authorization", "Cookie")


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        link = pending.pop()
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        pending += [e for e in (link.__cause__, link.__context__) if e is not None]


def _redacted_info(info: RequestInfo) -> RequestInfo:
    if not any(name in info.headers for name in _SENSITIVE_HEADERS):
        return info
    headers = CIMultiDict(info.headers)
    for name in _SENSITIVE_HEADERS:
        if name in headers:
            headers[name] = REDACTED
    return RequestInfo(info.url, info.method, CIMultiDictProxy(headers), info.real_url)


def redact_chain(exc: BaseException, secrets: Iterable[str] = ()) -> None:
    """Rid every exception in ``exc``'s chain of credentials, in place.

    Blanks the credential headers of aiohttp's request records (the exceptions' own and
    those of their redirect ``history``), and replaces each of ``secrets`` in the
    exceptions' messages and attributes: a proxy or a debug page may echo the request,
    and gql puts a body it cannot parse into its error message.
    """
    needles = [s for s in secrets if s]
    for link in _chain(exc):
        if isinstance(link, ClientResponseError):
            link.request_info = _redacted_info(link.request_info)
            for response in link.history:
                # The record a redirect's response keeps of the request that caused it.
                response._request_info = _redacted_info(response.request_info)
        if needles:
            _scrub_exception(link, needles)


def _scrub_exception(link: BaseException, needles: list[str]) -> None:
    scrubbed_args = tuple(_replace(arg, needles) for arg in link.args)
    if scrubbed_args != link.args:
        link.args = scrubbed_args
    for name, value in list(getattr(link, "__dict__", {}).items()):
        # JSONDecodeError.doc holds the whole body; gql's errors hold the answer's parts.
        if isinstance(value, (str, dict, list)):
            scrubbed = _replace(value, needles)
            if scrubbed != value:
                setattr(link, name, scrubbed)


def redact_text(value: object, secrets: Iterable[str]) -> object:
    """``value`` (JSON-like: dicts, lists, strings) with every secret replaced by ``***``.

    For text a server echoes back (an error message quoting the API key it refused)
    before it is put in an exception. Values without a secret are returned as they are.
    """
    needles = [s for s in secrets if s]
    if not needles:
        return value
    return _replace(value, needles)


def _replace(value: object, needles: list[str]) -> object:
    if isinstance(value, str):
        for needle in needles:
            if needle in value:
                value = value.replace(needle, REDACTED)
        return value
    if isinstance(value, dict):
        return {_replace(k, needles): _replace(v, needles) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(item, needles) for item in value]
    return value
