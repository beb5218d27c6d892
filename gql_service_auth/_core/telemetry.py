"""Metrics and spans through OpenTelemetry, when its API is installed (extra ``[otel]``).

Recorded through the global providers: an application that configures the OpenTelemetry
SDK sees them with no other setting; one that does not, or has no ``opentelemetry-api``,
pays one lookup per token event, per fetch and per failed request, and nothing per request
that succeeds. The instruments are made at the first event, so importing the package does
not import OpenTelemetry. The gauges (a token's remaining life, a store's health) are read
when the SDK collects, on its own thread, from what the token managers (:func:`hold`) and
the store health (:func:`observe`) hand this module, which knows neither.

Attributes carry what a dashboard groups by (why a token was fetched, how it ended, the
error code, the token endpoint's host, a digest of the credentials) and never a secret, a
token or a client id.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Literal, Protocol, TypeAlias

from .constants import LOGGER_NAME


class Event(Protocol):
    """What is read of an ``AuthEvent`` (``_core/events.py`` imports this module, not back)."""

    @property
    def name(self) -> str: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def duration(self) -> float | None: ...
    @property
    def store(self) -> str | None: ...
    @property
    def status(self) -> int | None: ...


Method: TypeAlias = Literal["oauth2", "api_key"]
"""How a transport authenticates: the ``gql_service_auth.method`` of a failed request."""

Reading: TypeAlias = tuple[float, Mapping[str, "str | int"]]
"""One point of a gauge: its value and attributes."""

NAMESPACE: Final = "gql_service_auth"
"""The instrumentation scope, and the prefix of every metric and attribute of ours."""

SPAN_NAME: Final = "gql_service_auth.fetch_token"
"""The span of one token fetch, its retries as events (a low-cardinality name)."""

DURATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Seconds: a fetch takes milliseconds on a LAN and up to ``RetryPolicy.timeout`` when
it retries, so the SDK's default buckets (in milliseconds' range up to 10 000) would put
every fetch in the first two."""

RFC6749_ERRORS: Final = frozenset(
    {
        "invalid_request",
        "invalid_client",
        "invalid_grant",
        "unauthorized_client",
        "unsupported_grant_type",
        "invalid_scope",
        "access_denied",
        "server_error",
        "temporarily_unavailable",
    }
)
"""Error codes shown as they came: RFC 6749's (sections 4.1.2.1 and 5.2)."""

_CLASS_NAME: Final = re.compile(r"[A-Z][A-Za-z0-9]{0,62}(?:Error|Exception|Timeout|Failed)")

CAUSES: Final = frozenset(
    {
        "refused",
        "token",
        "http_status",
        "not_graphql",
        "unreachable",
        "tls",
        "dropped",
        "timeout",
        "configuration",
        "other",
    }
)
"""The ``gql_service_auth.cause`` of a failed request (see ``_stacks/failures.py``)."""

_FAILED: Final = frozenset({"token_request_failed", "token_renewal_failed"})
_ENDS_A_FETCH: Final = _FAILED | {"token_fetched", "token_loaded"}

# An event's fields as span attributes (the span has the reason from its start): the
# standard names where OpenTelemetry has one.
_ATTRIBUTE_NAMES: Final = {
    "attempt": f"{NAMESPACE}.attempt",
    "max_attempts": f"{NAMESPACE}.max_attempts",
    "wait": f"{NAMESPACE}.wait",
    "expires_in": f"{NAMESPACE}.expires_in",
    "status": "http.response.status_code",
    "store": f"{NAMESPACE}.store",
    "detail": f"{NAMESPACE}.detail",
}

logger = logging.getLogger(LOGGER_NAME)

# The span of the fetch running in this task, for the events it emits (retries, a store
# that failed); a context variable, so concurrent fetches on one loop never mix.
_CURRENT_FETCH: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "gql_service_auth_fetch_span", default=None
)


class _Instruments:
    """The meter's instruments and the tracer, made once per process."""

    def __init__(self, metrics: Any, trace: Any, version: str | None) -> None:
        meter = metrics.get_meter(NAMESPACE, version)
        self.tracer = trace.get_tracer(NAMESPACE, version)

        def counter(name: str, unit: str, description: str) -> Any:
            return meter.create_counter(f"{NAMESPACE}.{name}", unit=unit, description=description)

        self.fetches = counter(
            "token.fetches",
            "{fetch}",
            "Token fetches from the token endpoint, by reason and outcome",
        )
        duration = {
            "name": f"{NAMESPACE}.token.fetch.duration",
            "unit": "s",
            "description": "Duration of token fetches, retries included",
        }
        try:
            self.duration = meter.create_histogram(
                **duration, explicit_bucket_boundaries_advisory=DURATION_BUCKETS
            )
        except TypeError:  # opentelemetry-api before 1.23: the SDK's default buckets
            self.duration = meter.create_histogram(**duration)
        self.renewal_failures = counter(
            "token.renewal.failures",
            "{renewal}",
            "Renewals ahead of expiry that failed (the token in use stays in use)",
        )
        self.refusals = counter(
            "token.refusals",
            "{token}",
            "Tokens the API refused (UNAUTHENTICATED), which were dropped",
        )
        self.resends = counter(
            "request.resends",
            "{request}",
            "Refused GraphQL requests sent again with a renewed token",
        )
        self.budget_exhausted = counter(
            "token.budget_exhausted",
            "{fetch}",
            "Token fetches not made: the credentials' token budget was spent",
        )
        self.store_loads = counter(
            "store.loads", "{token}", "Tokens read from the shared token store instead of fetched"
        )
        self.store_failures = counter(
            "store.failures",
            "{failure}",
            "Failures of the shared token store (the process fetches itself)",
        )
        self.request_failures = counter(
            "request.failures",
            "{request}",
            "GraphQL requests of a transport that failed with the package's error, by cause",
        )
        self.credentials_changes = counter(
            "credentials.changes",
            "{change}",
            "New credentials read from a source that can change, and used from then on",
        )
        self.credentials_source_failures = counter(
            "credentials.source_failures",
            "{failure}",
            "Credentials sources that began to fail (the credentials read last stay)",
        )
        meter.create_observable_gauge(
            f"{NAMESPACE}.token.remaining_life",
            callbacks=[_reading("token.remaining_life")],
            unit="s",
            description="Seconds until the token in hand expires, per credentials",
        )
        meter.create_observable_gauge(
            f"{NAMESPACE}.store.sharing",
            callbacks=[_reading("store.sharing")],
            # Not "1": a Collector's Prometheus translation would add _ratio to the name.
            unit="{store}",
            description=(
                "1 while the process shares its tokens through the store; 0 from a "
                "failed call of it until a fetch through it succeeds"
            ),
        )


_readers: dict[str, Callable[[], Iterable[Reading]]] = {}


def observe(gauge: str, reader: Callable[[], Iterable[Reading]]) -> None:
    """Have ``reader`` give the points of ``gauge`` (``token.remaining_life``,
    ``store.sharing``) each time the SDK collects, on the SDK's thread. It must be quick,
    and take no lock a request may hold long."""
    _readers[gauge] = reader


def _reading(gauge: str) -> Callable[[Any], list[Any]]:
    def callback(options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        reader = _readers.get(gauge)
        if reader is None:
            return []
        try:
            return [Observation(value, dict(attributes)) for value, attributes in reader()]
        except Exception:  # a telemetry bug must not break the application's export
            failed(gauge)
            return []

    return callback


class Holder(Protocol):
    """What holds a token of the token.remaining_life gauge (a token manager)."""

    def remaining_life(self) -> Reading | None: ...


_holders: weakref.WeakSet[Holder] = weakref.WeakSet()
_holders_lock = threading.Lock()  # held to add, and to copy for a collection


def hold(holder: Holder) -> None:
    """Show the life left of ``holder``'s token in the token.remaining_life gauge, for as
    long as ``holder`` lives."""
    with _holders_lock:
        _holders.add(holder)


def _remaining_lives() -> list[Reading]:
    # Managers that share no token (share_tokens=False, or other retry settings) may hold
    # tokens of the same credentials: the gauge has one point per attribute set, the
    # longest life of theirs (one left at rest runs down while another serves).
    with _holders_lock:
        holders = list(_holders)
    longest: dict[frozenset[tuple[str, str | int]], Reading] = {}
    for holder in holders:
        reading = holder.remaining_life()
        if reading is not None:
            key = frozenset(reading[1].items())
            if key not in longest or reading[0] > longest[key][0]:
                longest[key] = reading
    return list(longest.values())


observe("token.remaining_life", _remaining_lives)


def credentials_tag(token_url: str, client_id: str, scope: str | None) -> str:
    """The ``gql_service_auth.credentials`` attribute of a token: a digest of what names
    the credentials, equal in every process that uses them, that does not show them."""
    named = json.dumps([token_url, client_id, scope], separators=(",", ":")).encode()
    return hashlib.blake2b(named, digest_size=8, person=b"gsa metrics").hexdigest()


_lock = threading.Lock()
_instruments: _Instruments | None = None
_absent = False  # opentelemetry-api is not installed: checked once


def _after_fork_in_child() -> None:
    global _lock, _holders_lock
    # Another thread may have held them at the fork.
    _lock, _holders_lock = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _get() -> _Instruments | None:
    global _instruments, _absent
    if _instruments is not None or _absent:
        return _instruments
    with _lock:
        if _instruments is None and not _absent:
            try:
                from opentelemetry import metrics, trace
            except ImportError:
                _absent = True
                return None
            try:
                _instruments = _Instruments(metrics, trace, _version())
            except Exception:
                # A provider that fails, or an API too old: telemetry is off for the
                # process, and authentication goes on as if OpenTelemetry were absent.
                _absent = True
                failed("setup")
    return _instruments


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # not the package's: no cycle

    try:
        return version("gql-service-auth")
    except PackageNotFoundError:  # a vendored copy
        return None


def failed(stage: str) -> None:
    logger.warning("%s.telemetry_failed stage=%s", LOGGER_NAME, stage, exc_info=True)


def current_context() -> Any:
    """The caller's OpenTelemetry context, to parent the fetch it starts; ``None`` when
    OpenTelemetry is not installed."""
    if _get() is None:
        return None
    from opentelemetry import context

    try:
        return context.get_current()
    except Exception:  # a broken context implementation: the fetch gets no parent
        failed("context")
        return None


@contextlib.contextmanager
def fetch_span(reason: str, parent: Any, server: tuple[str, int | None] | None) -> Iterator[None]:
    """The span of one token fetch, current for its duration.

    A fetch requests wait for (``initial``, ``expired``, ``rejected``) is a child of the
    request that started it. A renewal ahead of expiry, which no request waits for, is a
    root span linked to that request, so that it does not lengthen the request's trace.
    """
    instruments = _get()
    span = None
    if instruments is not None:
        try:
            span, attached = _start(instruments, reason, parent, server)
        except Exception:  # a span processor's on_start that raises, say: no span
            failed("span")
    if span is None:
        yield
        return
    fetch = _CURRENT_FETCH.set(span)
    try:
        yield
    finally:
        _CURRENT_FETCH.reset(fetch)
        try:
            from opentelemetry import context

            context.detach(attached)
            span.end()
        except Exception:  # a span processor's on_end that raises
            failed("span")


def _start(
    instruments: _Instruments, reason: str, parent: Any, server: tuple[str, int | None] | None
) -> tuple[Any, Any]:
    """The fetch's span, started and attached to the current context (with the token of
    the attachment)."""
    from opentelemetry import context, trace

    attributes: dict[str, Any] = {f"{NAMESPACE}.reason": reason}
    if server is not None:
        attributes["server.address"] = server[0]
        if server[1] is not None:
            attributes["server.port"] = server[1]
    if reason == "expiring":
        caller = trace.get_current_span(parent).get_span_context()
        links = [trace.Link(caller)] if caller.is_valid else []
        root = trace.set_span_in_context(trace.INVALID_SPAN)
        span = instruments.tracer.start_span(SPAN_NAME, root, attributes=attributes, links=links)
    else:
        span = instruments.tracer.start_span(SPAN_NAME, parent, attributes=attributes)
    # Current in the OpenTelemetry context too: an instrumented HTTP client's span of the
    # token request is this one's child.
    return span, context.attach(trace.set_span_in_context(span))


def record(event: Event) -> None:
    """Count ``event`` in the metrics, and note it on the span of the fetch it belongs to."""
    instruments = _get()
    if instruments is None:
        return
    try:
        _record(instruments, event)
    except Exception:  # a telemetry bug must not break authentication
        failed(event.name)


def recording() -> bool:
    """Whether OpenTelemetry is there to record (the failure path asks before it works)."""
    return _get() is not None


def request_failed(method: Method, cause: str, error: str, status: int | None) -> None:
    """Count a GraphQL request of a transport that failed with ``error`` (a class name),
    for ``cause`` (one of :data:`CAUSES`); ``status``, an HTTP status."""
    instruments = _get()
    if instruments is None:
        return
    attributes: dict[str, str | int] = {
        f"{NAMESPACE}.method": method,
        f"{NAMESPACE}.cause": cause if cause in CAUSES else "other",
        "error.type": class_name(error),
    }
    if status is not None:
        attributes["http.response.status_code"] = status
    try:
        instruments.request_failures.add(1, attributes)
    except Exception:
        failed("request_failed")


def class_name(error: str | None) -> str:
    """``error`` when it is a class name (an ``error.type``), else ``_OTHER``."""
    return error if error is not None and _CLASS_NAME.fullmatch(error) else "_OTHER"


def error_type(event: Event) -> str:
    """``error.type`` from a closed set, as OpenTelemetry's conventions ask: an RFC 6749
    code; else the HTTP status of the answer; else an exception's class name; else
    ``_OTHER``. A token endpoint's own words never become an attribute, since they could
    quote a client id and would make a new series each."""
    error = event.error
    if error in RFC6749_ERRORS:
        return error
    if event.status is not None:
        return str(event.status)
    return class_name(error)


def _record(instruments: _Instruments, event: Event) -> None:
    _count(instruments, event)
    span = _CURRENT_FETCH.get()
    if span is not None:
        _note(span, event)


def _count(instruments: _Instruments, event: Event) -> None:
    """Count ``event`` in the metric it belongs to, if any."""
    name = event.name
    if name in _FAILED or name == "token_fetched":
        attributes = {
            f"{NAMESPACE}.reason": event.reason or "unknown",
            f"{NAMESPACE}.outcome": "failure" if name in _FAILED else "success",
        }
        if name in _FAILED:
            attributes["error.type"] = error_type(event)
        instruments.fetches.add(1, attributes)
        if event.duration is not None:
            instruments.duration.record(event.duration, attributes)
        if name == "token_renewal_failed":
            instruments.renewal_failures.add(1, {"error.type": error_type(event)})
    elif name == "token_loaded":
        instruments.store_loads.add(1, {f"{NAMESPACE}.reason": event.reason or "unknown"})
    elif name == "token_store_failed":
        attributes = {f"{NAMESPACE}.store": event.store or "unknown"}
        instruments.store_failures.add(1, {**attributes, "error.type": class_name(event.error)})
    elif name == "token_rejected":
        instruments.refusals.add(1)
    elif name == "request_retry_scheduled":
        instruments.resends.add(1)
    elif name == "token_budget_exhausted":
        instruments.budget_exhausted.add(1)
    elif name == "credentials_changed":
        instruments.credentials_changes.add(1)
    elif name == "credentials_source_failed":
        instruments.credentials_source_failures.add(1, {"error.type": class_name(event.error)})


def _note(span: Any, event: Event) -> None:
    """Note ``event`` on the span of its fetch: as an event, or, when it ends the fetch,
    as the span's outcome."""
    attributes = {
        attribute: value
        for field, attribute in _ATTRIBUTE_NAMES.items()
        if (value := getattr(event, field)) is not None
    }
    if event.error is not None or event.status is not None:
        attributes["error.type"] = error_type(event)
    if event.name not in _ENDS_A_FETCH:
        span.add_event(event.name, attributes)
        return
    outcome = {"token_fetched": "success", "token_loaded": "loaded"}.get(event.name, "failure")
    span.set_attribute(f"{NAMESPACE}.outcome", outcome)
    span.set_attributes(attributes)
    if outcome == "failure":
        from opentelemetry.trace import Status, StatusCode

        # The error type alone: the exception's message is the caller's to log.
        span.set_status(Status(StatusCode.ERROR, error_type(event)))
