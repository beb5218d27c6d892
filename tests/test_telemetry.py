"""OpenTelemetry: the metrics and spans an application sees once it configures the SDK.

The SDK's in-memory reader and exporter are installed as the global providers of this
worker process, as an application installs its own; the package is configured with
nothing. Counters are cumulative for the process, so each test reads what it added.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gql import Client
from opentelemetry import metrics, trace
from opentelemetry.trace import StatusCode
from otel_support import BREAKING, Telemetry, attrs, installed
from support import COUNT, NO_WAIT, SLOW_MACHINE, no_fetch_thread, wait_until

from gql_service_auth import OAuth2Transport, RetryPolicy, TokenRequestError
from gql_service_auth.emulator import Emulator, ManualClock
from gql_service_auth.local import LocalTokenStore

NO_WAIT_TWO = RetryPolicy(attempts=2, wait_initial=0, wait_max=0, wait_jitter=0)


@pytest.fixture
def telemetry() -> Telemetry:
    return installed()


def _secrets_of(emulator: Emulator) -> list[str]:
    client = emulator.recent_client
    tokens = [
        request.headers["Authorization"].split()[-1]
        for request in emulator.requests
        if "Authorization" in request.headers and request.auth_scheme == "Bearer"
    ]
    return [client.client_id, client.client_secret, *tokens]


def _oauth2(emulator: Emulator, clock: ManualClock, **kwargs: Any) -> OAuth2Transport:
    kwargs.setdefault("retry", NO_WAIT)
    return OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        client_id=emulator.recent_client.client_id,
        client_secret=emulator.recent_client.client_secret,
        clock=clock,
        **kwargs,
    )


async def test_a_fetch_is_a_span_under_the_request_that_waited_with_its_retries_as_events(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], telemetry: Telemetry
) -> None:
    """On every stack: one span per fetch, child of the caller's span, a retry as an event;
    the fetch counted by reason and outcome, its duration in the histogram."""
    emulator.fail_token_requests(1, 503)
    tracer = trace.get_tracer("the-application")
    with tracer.start_as_current_span("handle request") as request_span:
        async with Client(transport=make_oauth2()) as session:
            await session.execute(COUNT)
    await wait_until(lambda: len(telemetry.spans()) == 1)
    (span,) = telemetry.spans()
    assert span.parent is not None
    assert span.parent.span_id == request_span.get_span_context().span_id
    assert span.attributes is not None
    assert span.attributes["gql_service_auth.reason"] == "initial"
    assert span.attributes["gql_service_auth.outcome"] == "success"
    assert span.attributes["server.address"] == "127.0.0.1"
    assert span.status.status_code is StatusCode.UNSET
    assert [(e.name, dict(e.attributes or {})) for e in span.events] == [
        (
            "token_request_retry_scheduled",
            {
                "gql_service_auth.attempt": 1,
                "gql_service_auth.max_attempts": NO_WAIT.attempts,
                "gql_service_auth.wait": 0.0,
                "http.response.status_code": 503,
                "error.type": "temporarily_unavailable",
            },
        )
    ]
    success = attrs(gql_service_auth__reason="initial", gql_service_auth__outcome="success")
    assert telemetry.added() == {
        ("gql_service_auth.token.fetches", success): 1,
        ("gql_service_auth.token.fetch.duration", success): 1,
    }
    everything = telemetry.everything()
    assert all(secret not in everything for secret in _secrets_of(emulator))


def test_on_a_stack_with_no_loop_the_fetch_is_a_child_of_the_callers_span(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry
) -> None:
    """gql's requests transport blocks its thread: the fetch on its own thread still
    joins the trace of the caller's span."""
    from gql_service_auth.requests import OAuth2RequestsTransport

    transport = OAuth2RequestsTransport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        client_id=emulator.recent_client.client_id,
        client_secret=emulator.recent_client.client_secret,
        clock=clock,
        retry=NO_WAIT,
    )
    tracer = trace.get_tracer("the-application")
    with tracer.start_as_current_span("job") as job, Client(transport=transport) as session:
        session.execute(COUNT)
    for _ in range(500):  # the fetch's span ends just after the token is handed out
        if telemetry.spans():
            break
        time.sleep(0.01)
    (span,) = telemetry.spans()
    assert span.parent is not None
    assert span.parent.span_id == job.get_span_context().span_id
    assert span.context is not None
    assert span.context.trace_id == job.get_span_context().trace_id


async def test_a_failed_fetch_is_an_error_span_and_a_failure_by_error_code(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry
) -> None:
    emulator.fail_token_requests(2, 503)
    async with Client(transport=_oauth2(emulator, clock, retry=NO_WAIT_TWO)) as session:
        with pytest.raises(TokenRequestError):
            await session.execute(COUNT)
    await wait_until(lambda: len(telemetry.spans()) == 1)
    (span,) = telemetry.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "temporarily_unavailable"
    assert span.attributes is not None
    assert span.attributes["gql_service_auth.outcome"] == "failure"
    assert span.attributes["error.type"] == "temporarily_unavailable"
    assert span.attributes["gql_service_auth.attempt"] == 2
    assert [e.name for e in span.events] == ["token_request_retry_scheduled"]
    assert telemetry.added_to("gql_service_auth.token.fetches") == {
        attrs(
            gql_service_auth__reason="initial",
            gql_service_auth__outcome="failure",
            error__type="temporarily_unavailable",
        ): 1
    }


async def test_a_refused_token_counts_a_refusal_a_resend_and_a_fetch_for_rejected(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry
) -> None:
    async with Client(transport=_oauth2(emulator, clock)) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        await session.execute(COUNT)
    await wait_until(lambda: len(telemetry.spans()) == 2)
    added = telemetry.added()
    assert added[("gql_service_auth.token.refusals", frozenset())] == 1
    assert added[("gql_service_auth.request.resends", frozenset())] == 1
    fetches = telemetry.added_to("gql_service_auth.token.fetches")
    assert fetches == {
        attrs(gql_service_auth__reason=reason, gql_service_auth__outcome="success"): 1
        for reason in ("initial", "rejected")
    }
    assert all(secret not in telemetry.everything() for secret in _secrets_of(emulator))


async def test_a_renewal_ahead_of_expiry_is_a_root_span_linked_to_the_request(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry
) -> None:
    """No request waits for it, so it does not lengthen the trace of the one that started it."""
    tracer = trace.get_tracer("the-application")
    async with Client(transport=_oauth2(emulator, clock, refresh_margin=60)) as session:
        await session.execute(COUNT)
        clock.advance(emulator.token_ttl - 30)  # inside the margin, still valid
        with tracer.start_as_current_span("handle request") as request_span:
            await session.execute(COUNT)
        await wait_until(lambda: len(telemetry.spans()) == 2)
    renewal = next(
        s for s in telemetry.spans() if s.attributes["gql_service_auth.reason"] == "expiring"
    )  # type: ignore[index]
    assert renewal.parent is None
    assert [link.context.span_id for link in renewal.links] == [
        request_span.get_span_context().span_id
    ]
    assert renewal.attributes is not None
    assert renewal.attributes["gql_service_auth.outcome"] == "success"


async def test_a_token_read_from_the_store_counts_a_load_not_a_fetch(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry, tmp_path: Path
) -> None:
    with LocalTokenStore(tmp_path / "store", timeout=SLOW_MACHINE) as store:
        for _ in range(2):  # two transports not sharing in the process: the second loads
            transport = _oauth2(emulator, clock, token_store=store, share_tokens=False)
            async with Client(transport=transport) as session:
                await session.execute(COUNT)
        await wait_until(lambda: len(telemetry.spans()) == 2)
    assert emulator.counters.token_requests == 1
    added = telemetry.added()
    assert added[("gql_service_auth.store.loads", attrs(gql_service_auth__reason="initial"))] == 1
    assert telemetry.added_to("gql_service_auth.token.fetches") == {
        attrs(gql_service_auth__reason="initial", gql_service_auth__outcome="success"): 1
    }
    outcomes = sorted(s.attributes["gql_service_auth.outcome"] for s in telemetry.spans())  # type: ignore[index]
    assert outcomes == ["loaded", "success"]


async def test_a_failing_store_is_counted_and_noted_on_the_fetch(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry, unused_tcp_port: int
) -> None:
    from gql_service_auth.redis import RedisTokenStore

    store = RedisTokenStore.from_url(
        f"redis://127.0.0.1:{unused_tcp_port}/0", store_key=b"k" * 32, timeout=0.5
    )
    try:
        async with Client(transport=_oauth2(emulator, clock, token_store=store)) as session:
            await session.execute(COUNT)
        await wait_until(lambda: len(telemetry.spans()) == 1)
    finally:
        store.close()
    (failures,) = telemetry.added_to("gql_service_auth.store.failures").items()
    location = f"redis://127.0.0.1:{unused_tcp_port}/0"
    assert failures == (
        attrs(gql_service_auth__store=location, error__type="ConnectionError"),
        1,
    )
    (span,) = telemetry.spans()
    assert [e.name for e in span.events] == ["token_store_failed"]
    assert span.attributes is not None
    assert span.attributes["gql_service_auth.outcome"] == "success"


def test_without_opentelemetry_nothing_is_imported_and_queries_work(
    live_emulator: Emulator, tmp_path: Path
) -> None:
    """Importing the package never imports OpenTelemetry; without it, a fetch works."""
    script = tmp_path / "no_otel.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            import gql_service_auth
            assert "opentelemetry" not in sys.modules, "imported at import time"
            sys.modules["opentelemetry"] = None  # as if not installed
            from gql import Client, gql
            from gql_service_auth import OAuth2Transport
            transport = OAuth2Transport(
                {live_emulator.graphql_url!r},
                token_url={live_emulator.token_url!r},
                client_id={live_emulator.recent_client.client_id!r},
                client_secret={live_emulator.recent_client.client_secret!r},
                share_tokens=False,
            )
            client = Client(transport=transport)
            print(client.execute(gql("query {{ carriers(first: 1) {{ totalCount }} }}")))
            """
        )
    )
    completed = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "'totalCount': 25" in completed.stdout


def test_a_failing_recorder_does_not_break_authentication(
    emulator: Emulator,
    clock: ManualClock,
    telemetry: Telemetry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gql_service_auth._core import telemetry as _telemetry

    instruments = _telemetry._get()
    assert instruments is not None

    class Broken:
        def add(self, *args: object) -> None:
            raise RuntimeError("exporter bug")

    monkeypatch.setattr(instruments, "fetches", Broken())

    async def query() -> None:
        async with Client(transport=_oauth2(emulator, clock)) as session:
            await session.execute(COUNT)

    asyncio.run(query())
    assert "gql_service_auth.telemetry_failed stage=token_fetched" in caplog.text


@pytest.mark.parametrize("thread", ["fetch thread", "no thread to be had"])
def test_a_span_processor_that_raises_costs_no_token(
    emulator: Emulator,
    clock: ManualClock,
    telemetry: Telemetry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    thread: str,
) -> None:
    """on_start and on_end raise: the fetch runs without its span, every query gets its
    token, and the next fetch is not stuck behind the first (on the fetch's thread, or on
    the caller's loop when no thread can start)."""
    if thread == "no thread to be had":
        no_fetch_thread(monkeypatch)
    monkeypatch.setitem(BREAKING, "spans", True)

    async def query() -> None:
        async with Client(transport=_oauth2(emulator, clock), execute_timeout=10) as session:
            await session.execute(COUNT)
            emulator.revoke_tokens()
            await session.execute(COUNT)

    asyncio.run(query())
    assert emulator.counters.token_requests == 2
    assert "gql_service_auth.telemetry_failed stage=span" in caplog.text


def test_a_provider_that_fails_at_set_up_turns_telemetry_off_not_authentication(
    emulator: Emulator,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gql_service_auth._core import telemetry as _telemetry

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no meter for you")

    monkeypatch.setattr(_telemetry, "_instruments", None)  # as in a fresh process
    monkeypatch.setattr(_telemetry, "_absent", False)
    monkeypatch.setattr(metrics, "get_meter", broken)

    async def query() -> None:
        async with Client(transport=_oauth2(emulator, clock)) as session:
            await session.execute(COUNT)

    asyncio.run(query())
    assert emulator.counters.token_requests == 1
    assert "gql_service_auth.telemetry_failed stage=setup" in caplog.text


def test_an_api_without_histogram_advice_records_with_default_buckets(
    emulator: Emulator, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """opentelemetry-api before 1.23 has no explicit_bucket_boundaries_advisory."""
    from gql_service_auth._core import telemetry as _telemetry

    recorded: list[tuple[str, float]] = []

    class Instrument:
        def __init__(self, name: str) -> None:
            self.name = name

        def add(self, amount: float, attributes: object = None) -> None:
            recorded.append((self.name, amount))

        record = add

    class OldMeter:
        def create_counter(self, name: str, unit: str = "", description: str = "") -> Any:
            return Instrument(name)

        def create_histogram(self, name: str, unit: str = "", description: str = "") -> Any:
            return Instrument(name)

        def create_observable_gauge(self, name: str, **kwargs: Any) -> Any:
            return Instrument(name)

    monkeypatch.setattr(_telemetry, "_instruments", None)
    monkeypatch.setattr(_telemetry, "_absent", False)
    monkeypatch.setattr(metrics, "get_meter", lambda *args, **kwargs: OldMeter())

    async def query() -> None:
        async with Client(transport=_oauth2(emulator, clock)) as session:
            await session.execute(COUNT)

    asyncio.run(query())
    assert [name for name, _ in recorded] == [
        "gql_service_auth.token.fetches",
        "gql_service_auth.token.fetch.duration",
    ]


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, {"error": "invalid_client"}, "invalid_client"),
        # A code of the server's own, quoting what it was sent: its status stands in.
        (400, {"error": "bad_client:my-client-id"}, "400"),
        (500, "<html>Internal Server Error</html>", "500"),
    ],
)
async def test_the_error_type_is_a_code_a_status_or_a_class_never_the_servers_words(
    emulator: Emulator,
    clock: ManualClock,
    telemetry: Telemetry,
    status: int,
    body: Any,
    expected: str,
) -> None:
    emulator.fail_token_requests(1, status, body=body)
    transport = _oauth2(emulator, clock, retry=RetryPolicy(attempts=1))
    async with Client(transport=transport) as session:
        with pytest.raises(TokenRequestError):
            await session.execute(COUNT)
    await wait_until(lambda: len(telemetry.spans()) == 1)
    (span,) = telemetry.spans()
    assert span.attributes is not None
    assert span.attributes["error.type"] == expected
    assert span.status.description == expected
    (attributes,) = telemetry.added_to("gql_service_auth.token.fetches")
    assert ("error.type", expected) in attributes
    assert "my-client-id" not in telemetry.everything()
