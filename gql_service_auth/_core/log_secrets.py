"""Keeping credentials out of the log records of gql's transports and httpx's core.

gql's transports log every answer at DEBUG (``<<< {body}``) before anything of ours sees
it, and httpcore every answer's headers: an error page, a GraphQL error or a header that
quotes the token or the client secret would be written to the logs of any application that
turns DEBUG on. The adapters install :data:`FILTER` on those loggers (:data:`LOGGERS`);
it replaces, in each of their records, the credentials this process holds, in every form
a server may quote them (as sent, JSON-escaped, percent-encoded): every client secret given
to a transport or auth, and the latest tokens obtained (:data:`_KEPT` of them, so a token
just replaced, which an answer in flight may still quote, is among them). It runs only for
records those loggers emit: nothing per request when DEBUG is off.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Final

_KEPT: Final = 256
"""Tokens remembered: the latest, of every manager of the process."""

# What a server may quote of each credential (as sent, JSON-escaped, percent-encoded: see
# redact.spellings), computed once. Client secrets are kept while the process runs: they
# are few (one per credentials), and a run of new tokens must never push one out.
_TOKENS: deque[tuple[str, ...]] = deque(maxlen=_KEPT)
_CLIENT_SECRETS: dict[str, tuple[str, ...]] = {}
_LOCK = threading.Lock()

LOGGERS: Final = (
    "gql.transport.aiohttp",
    "gql.transport.requests",
    "gql.transport.httpx",
    # gql's websocket transports (their messages: connection_init carries the token a
    # TokenProvider gave them).
    "gql.transport.common.base",
    *(
        f"{core}.{part}"
        for core in ("httpcore", "httpcore2")
        for part in ("http11", "http2", "connection", "proxy", "socks")
    ),
)
"""The loggers that record answers at DEBUG: gql's transports' (its websocket ones log
every message both ways), and httpcore's (httpx's core; httpcore2 for httpx2), which log
each answer's headers. A filter acts only on the
records of the logger it is on, not of its children: each is named."""


def remember(secret: str, *, lasting: bool = False) -> None:
    """Note a credential of this process, for :data:`FILTER` to keep out of the logs:
    a token, or (``lasting``) a client secret."""
    from .redact import spellings  # at the first credential, not at import

    needles = tuple(spellings([secret]))
    with _LOCK:
        if lasting:
            _CLIENT_SECRETS.setdefault(secret, needles)
        elif needles not in _TOKENS:
            _TOKENS.append(needles)


class _CredentialFilter(logging.Filter):
    """Replaces the process's credentials in the records of the logger it is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True  # a malformed call: logging reports it, as on any logger
        with _LOCK:
            groups = [*_CLIENT_SECRETS.values(), *_TOKENS]
        found = [needle for needles in groups for needle in needles if needle in message]
        if found:
            from .redact import REDACTED

            for needle in sorted(found, key=len, reverse=True):  # one that holds another
                message = message.replace(needle, REDACTED)
            record.msg = message
            record.args = ()
        return True


FILTER: Final = _CredentialFilter()


def install() -> None:
    """Put :data:`FILTER` on :data:`LOGGERS` (once: a logger keeps one of each)."""
    for name in LOGGERS:
        logging.getLogger(name).addFilter(FILTER)
