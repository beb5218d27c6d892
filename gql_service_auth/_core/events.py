"""Events of the token life cycle: logged under stable names and handed to a user hook."""

# No "from __future__ import annotations": AuthEvent's annotations stay objects, so
# typing.get_type_hints(AuthEvent) needs no lookup in the module its __module__ names.
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from . import fork as _fork
from . import telemetry as _telemetry
from .constants import LOGGER_NAME

EventName: TypeAlias = Literal[
    "token_fetched",
    "token_loaded",
    "token_store_failed",
    "token_request_retry_scheduled",
    "token_request_failed",
    "token_renewal_failed",
    "token_rejected",
    "token_expires_in_ignored",
    "request_retry_scheduled",
    "credentials_changed",
    "credentials_source_failed",
    "token_budget_exhausted",
]
"""What happened; the log record's message starts with ``"gql_service_auth." + name``."""


@dataclass(frozen=True, slots=True)
class AuthEvent:
    """One event of the token life cycle, as handed to an ``on_event`` hook.

    Never carries a secret or a token. Fields that do not apply to an event are ``None``.

    Attributes:
        name: ``token_fetched`` (a new token arrived), ``token_loaded`` (a token
            another process fetched was read from the shared token store),
            ``token_store_failed`` (the shared token store failed or was slow: the
            process fetches for itself and leaves the store alone for ``wait``
            seconds), ``token_request_retry_scheduled``
            (the token endpoint failed transiently and will be asked again),
            ``token_request_failed`` (no token could be had, and requests waited for
            one), ``token_renewal_failed`` (a renewal ahead of expiry failed; the token in
            use stays in use until it expires, and the renewal is tried again after
            ``wait`` seconds), ``token_rejected`` (the
            API refused a token, which is dropped), ``token_expires_in_ignored`` (the
            token endpoint gave an ``expires_in`` of 0 or less, which is treated as
            absent: the default lifetime applies), ``request_retry_scheduled`` (a
            refused GraphQL request will be sent again with a renewed token),
            ``credentials_changed`` (credentials read from a source that can change, such
            as a mounted file, changed: they are used from now on),
            ``credentials_source_failed`` (such a source could not be read: the
            credentials read last stay in use; said once until a read succeeds),
            ``token_budget_exhausted`` (a token was needed, and none was requested: the
            credentials' token budget is spent for ``wait`` more seconds).
        reason: Why the token was fetched: ``"initial"`` (first token), ``"expiring"``
            (renewal ahead of expiry, in the background while the token stays in use),
            ``"expired"`` (no usable token was left, so requests waited for this one) or
            ``"rejected"`` (renewal after the API refused the token).
        attempt: Number of the attempt that just failed, from 1. For
            ``token_request_failed``, the requests made to the token endpoint; ``None``
            when the fetch was cut off or broke before the grant could count them. For
            ``token_renewal_failed``, the renewals that failed in a row.
        max_attempts: The most attempts allowed, so ``attempt`` reads "2 of 4":
            ``RetryPolicy.attempts`` for token requests, ``max_renewals + 1`` for
            ``request_retry_scheduled``.
        wait: Seconds until the next attempt (for ``token_renewal_failed``, until the next
            background renewal may start).
        duration: Seconds the token fetch took, retries included.
        expires_in: Seconds of lifetime the server gave the new token; ``None`` when it
            gave none and the default lifetime applies. For ``token_expires_in_ignored``,
            the value the server sent. For ``token_renewal_failed``, the seconds the
            token in use has left. For ``token_loaded``, the seconds the stored token
            had left.
        status: HTTP status of the failed answer, ``None`` when none came.
        error: RFC 6749 error code, or the exception's class name.
        store: For ``token_store_failed``, which store failed: for Redis, its URL with no
            user or password (``redis://host:6379/0``).
        detail: For ``token_store_failed``, what failed, in words (``Connection refused``,
            ``no answer within 0.25 s``). For ``credentials_changed`` and
            ``credentials_source_failed``, the source and the Client Id (never the secret).
    """

    name: EventName
    reason: str | None = None
    attempt: int | None = None
    max_attempts: int | None = None
    wait: float | None = None
    duration: float | None = None
    expires_in: float | None = None
    status: int | None = None
    error: str | None = None
    store: str | None = None
    detail: str | None = None


# Shown as gql_service_auth.AuthEvent, where users import it from (see _core/errors.py).
AuthEvent.__module__ = "gql_service_auth"

EventHook: TypeAlias = Callable[[AuthEvent], None]
"""A callable that receives every :class:`AuthEvent`, e.g. to count renewals.

Keep it quick, non-blocking and thread-safe: request events run on the caller's event
loop, and token fetch events (``token_fetched``, ``token_request_failed``...) on the
thread that fetches the token (a caller's own only where no thread could be started).
An exception it raises is
logged and otherwise ignored, so a metrics bug cannot break authentication.
"""

logger = logging.getLogger(LOGGER_NAME)

_LEVELS: dict[EventName, int] = {
    "token_fetched": logging.DEBUG,
    "token_loaded": logging.DEBUG,
    "token_store_failed": logging.WARNING,
    "token_request_retry_scheduled": logging.INFO,
    "token_request_failed": logging.WARNING,
    "token_renewal_failed": logging.WARNING,
    "token_rejected": logging.INFO,
    "token_expires_in_ignored": logging.WARNING,
    "request_retry_scheduled": logging.INFO,
    "credentials_changed": logging.INFO,
    "credentials_source_failed": logging.WARNING,
    "token_budget_exhausted": logging.WARNING,
}


# The fields a log message shows, in this order, each with its %-conversion. The message
# leads with the stable event name, then logfmt-style key=value pairs, so that a program
# that never configured logging (Python then prints the bare message) still says what
# happened. "attempt" is shown as attempt/max_attempts.
_MESSAGE_FIELDS: tuple[tuple[str, str], ...] = (
    ("status", "%d"),
    ("error", "%s"),
    ("attempt", "%d"),
    ("wait", "%.3f"),
    ("reason", "%s"),
    ("expires_in", "%g"),
    ("duration", "%.3f"),
    ("store", "%s"),
    ("detail", "%s"),
)


def _plain(text: str) -> str:
    # An RFC 6749 error code is plain ASCII (section 5.2); anything else a server sent is
    # quoted, so that it cannot break the line or pass for another key=value pair.
    return text if text.isascii() and text.isprintable() and " " not in text else repr(text)


def _log(event: AuthEvent) -> None:
    level = _LEVELS[event.name]
    if not logger.isEnabledFor(level):  # nothing is built for a disabled level
        return
    fields = {k: getattr(event, k) for k in AuthEvent.__slots__ if k != "name"}
    # A constant template per event and set of fields, with lazy arguments: log services
    # group records by template, and a handler formats only what it emits.
    template = LOGGER_NAME + "." + event.name
    args: list[object] = []
    for key, conversion in _MESSAGE_FIELDS:
        value = fields[key]
        if value is None:
            continue
        template += " " + key + "=" + conversion
        args.append(_plain(value) if isinstance(value, str) else value)
        if key == "attempt" and event.max_attempts is not None:
            template += "/%d"
            args.append(event.max_attempts)
    logger.log(
        level,
        template,
        *args,
        extra={"gql_service_auth": {k: v for k, v in fields.items() if v is not None}},
    )


def _publish(event: AuthEvent) -> None:
    """Once per event, whatever the number of hooks: the log record and the telemetry."""
    _log(event)
    _telemetry.record(event)


class Emitter:
    """Logs each event under its stable name and passes it to the user's hook."""

    __slots__ = ("__weakref__", "_hook")

    def __init__(self, hook: EventHook | None) -> None:
        self._hook = hook

    def __call__(self, event: AuthEvent) -> None:
        _publish(event)
        self.notify(event)

    def notify(self, event: AuthEvent) -> None:
        """Pass ``event`` to the hook alone, without logging it."""
        if self._hook is not None:
            try:
                self._hook(event)
            except Exception:
                logger.exception("%s.hook_failed event=%s", LOGGER_NAME, event.name)


class Subscribers:
    """The emitter of a token shared by transports: logs each event once and passes it to
    the hook of every transport still alive that shares the token.

    Held weakly, so a transport that is gone stops hearing, and is not kept alive by the
    token it used. A copy starts with no subscriber: the copied transport subscribes anew.
    """

    __slots__ = ("__weakref__", "_emitters", "_lock")

    def __init__(self) -> None:
        self._emitters: weakref.WeakSet[Emitter] = weakref.WeakSet()
        self._lock = threading.Lock()
        _fork.reset_in_child(self)

    def __repr__(self) -> str:
        return f"<Subscribers {len(self._emitters)}>"

    def __reduce__(self) -> "tuple[type[Subscribers], tuple[()]]":
        return Subscribers, ()

    def add(self, emitter: Emitter) -> None:
        """Pass the events to ``emitter``'s hook too, for as long as ``emitter`` lives."""
        with self._lock:
            self._emitters.add(emitter)

    def __call__(self, event: AuthEvent) -> None:
        _publish(event)
        with self._lock:
            emitters = list(self._emitters)
        for emitter in emitters:
            emitter.notify(event)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork
