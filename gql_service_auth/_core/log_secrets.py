"""Keeping credentials out of the log records of gql's transports and httpx's core.

gql's transports log every answer at DEBUG (``<<< {body}``) before anything of ours sees
it, and httpcore every answer's headers: an error page, a GraphQL error or a header that
quotes the token or the client secret would be written to the logs of any application that
turns DEBUG on. The adapters install :data:`FILTER` on those loggers (:data:`LOGGERS`);
it replaces, in each of their records, the
credentials this process holds: every client secret given to a transport or auth, and
the latest tokens obtained (:data:`_KEPT` of them, so a token just replaced, which an
answer in flight may still quote, is among them). It runs only for records those loggers
emit: nothing per request when DEBUG is off.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Final

_KEPT: Final = 256
_SECRETS: deque[str] = deque(maxlen=_KEPT)
_LOCK = threading.Lock()

LOGGERS: Final = (
    "gql.transport.aiohttp",
    "gql.transport.requests",
    "gql.transport.httpx",
    *(
        f"{core}.{part}"
        for core in ("httpcore", "httpcore2")
        for part in ("http11", "http2", "connection", "proxy", "socks")
    ),
)
"""The loggers that record answers at DEBUG: gql's transports', and httpcore's (httpx's
core; httpcore2 for httpx2), which log each answer's headers. A filter acts only on the
records of the logger it is on, not of its children: each is named."""


def remember(secret: str) -> None:
    """Note a credential of this process, for :data:`FILTER` to keep out of gql's logs."""
    with _LOCK:
        if secret not in _SECRETS:
            _SECRETS.append(secret)


class _CredentialFilter(logging.Filter):
    """Replaces the process's credentials in the records of the logger it is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        with _LOCK:
            secrets = list(_SECRETS)
        message = record.getMessage()
        if any(secret in message for secret in secrets):
            from .redact import redact_text  # only when a record quotes one

            record.msg = redact_text(message, secrets)
            record.args = ()
        return True


FILTER: Final = _CredentialFilter()


def install() -> None:
    """Put :data:`FILTER` on :data:`LOGGERS` (once: a logger keeps one of each)."""
    for name in LOGGERS:
        logging.getLogger(name).addFilter(FILTER)
