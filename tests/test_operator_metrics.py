"""What an operator alerts on, through OpenTelemetry, on every stack and both methods:
failed requests by cause, the remaining life of the token in hand, whether the shared
store is in use (and why not), and credentials read anew.

The SDK's in-memory reader is the global provider of the worker process, as an
application installs its own (see ``otel_support.py``); the package is configured with
nothing. Counters are cumulative for the process, so each test reads what it added.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gql import Client, GraphQLRequest
from gql.transport.exceptions import TransportProtocolError
from otel_support import Telemetry, attrs, installed
from support import COUNT, HANG_GUARD, closed_port, wait_until
from test_application_errors import CASES, OAUTH2_CASES, Silent, execute, make

from gql_service_auth import (
    ApiKeyRejectedError,
    ApiKeyTransport,
    CredentialsCallback,
    GqlServiceAuthError,
    OAuth2Transport,
    ServiceHTTPError,
    ServiceTimeoutError,
)
from gql_service_auth.emulator import Emulator, ManualClock
from gql_service_auth.local import LocalTokenStore

FAILURES = "gql_service_auth.request.failures"
REMAINING_LIFE = "gql_service_auth.token.remaining_life"
SHARING = "gql_service_auth.store.sharing"

REFUSAL = {"errors": [{"message": "no", "extensions": {"code": "UNAUTHENTICATED"}}]}


@pytest.fixture
def telemetry() -> Telemetry:
    return installed()


def method_of(case: str) -> str:
    return case.rpartition("-")[2]


def failing(calls: int, transport: Any, kind: type[Exception] = GqlServiceAuthError) -> list[str]:
    """Make ``calls`` calls that each fail; the class names of what they raised."""
    raised = []
    for _ in range(calls):
        with pytest.raises(kind) as caught:
            execute(transport)
        raised.append(type(caught.value).__name__)
    return raised


@pytest.mark.parametrize("case", CASES)
def test_each_failed_call_counts_once_by_method_and_cause(
    case: str, emulator: Emulator, telemetry: Telemetry
) -> None:
    """Five calls to a wrong path: five failures, whatever the stack, with the status."""
    transport = make(case, emulator, url=emulator.base_url + "/nowhere")
    raised = failing(5, transport)
    assert raised == ["ServiceHTTPError"] * 5
    assert telemetry.added_to(FAILURES) == {
        attrs(
            gql_service_auth__method=method_of(case),
            gql_service_auth__cause="http_status",
            error__type="ServiceHTTPError",
            http__response__status_code=404,
        ): 5
    }


@pytest.mark.parametrize("case", CASES)
def test_calls_the_service_refuses_count_as_refused(
    case: str, emulator: Emulator, telemetry: Telemetry
) -> None:
    """The issue's measure: five calls refused showed as 2 refusals and 1 re-send. Each
    is now a failed request, refused; an OAuth2 call that waited out a pause of renewals
    too, since it failed for the same reason."""
    emulator.fail_graphql_requests(100, body=REFUSAL)
    raised = failing(5, make(case, emulator))
    expected = "ApiKeyRejectedError" if method_of(case) == "api_key" else "UnauthenticatedError"
    assert raised == [expected] * 5
    assert telemetry.added_to(FAILURES) == {
        attrs(
            gql_service_auth__method=method_of(case),
            gql_service_auth__cause="refused",
            error__type=expected,
        ): 5
    }


@pytest.mark.parametrize("case", CASES)
def test_a_service_that_is_not_there_counts_as_unreachable(
    case: str, emulator: Emulator, telemetry: Telemetry
) -> None:
    with closed_port() as port:
        raised = failing(2, make(case, emulator, url=f"http://127.0.0.1:{port}/graphql"))
    assert raised == ["ServiceUnreachableError"] * 2
    assert telemetry.added_to(FAILURES) == {
        attrs(
            gql_service_auth__method=method_of(case),
            gql_service_auth__cause="unreachable",
            error__type="ServiceUnreachableError",
        ): 2
    }


@pytest.mark.parametrize("case", CASES)
def test_a_web_page_where_the_api_should_be_counts_as_not_graphql(
    case: str, emulator: Emulator, telemetry: Telemetry
) -> None:
    """A wrong base URL that serves a page for every path answers 200: gql's
    TransportProtocolError, counted, where it used to count nothing."""
    emulator.fail_graphql_requests(
        10, body=b"<html>Welcome</html>", headers={"Content-Type": "text/html"}
    )
    raised = failing(2, make(case, emulator), TransportProtocolError)
    assert raised == ["TransportProtocolError"] * 2
    assert telemetry.added_to(FAILURES) == {
        attrs(
            gql_service_auth__method=method_of(case),
            gql_service_auth__cause="not_graphql",
            error__type="TransportProtocolError",
        ): 2
    }


@pytest.mark.parametrize("case", OAUTH2_CASES)
def test_no_token_counts_as_token_on_oauth2(
    case: str, emulator: Emulator, telemetry: Telemetry
) -> None:
    raised = failing(3, make(case, emulator, client_secret="not-the-secret"))
    assert raised == ["TokenRequestError"] * 3
    assert telemetry.added_to(FAILURES) == {
        attrs(
            gql_service_auth__method="oauth2",
            gql_service_auth__cause="token",
            error__type="TokenRequestError",
        ): 3
    }


@pytest.mark.parametrize("case", OAUTH2_CASES)
def test_a_call_that_succeeds_once_resent_is_no_failure(
    case: str, emulator: Emulator, telemetry: Telemetry
) -> None:
    transport = make(case, emulator)
    execute(transport)
    emulator.revoke_tokens()
    execute(transport)
    added = telemetry.added()
    assert added[("gql_service_auth.request.resends", frozenset())] == 1
    assert telemetry.added_to(FAILURES) == {}


@pytest.mark.parametrize("case", ["aiohttp-api_key", "httpx-async-oauth2"])
def test_a_check_that_runs_out_of_time_counts_once_as_a_timeout(
    case: str, emulator: Emulator, telemetry: Telemetry
) -> None:
    """check()'s own bound cuts its query off: one failure, the timeout, not two."""
    silent = Silent()
    try:
        transport = make(case, emulator, url=f"http://127.0.0.1:{silent.port}/graphql")
        with pytest.raises(ServiceTimeoutError):
            asyncio.run(transport.check(timeout=0.5))
    finally:
        silent.close()
    assert telemetry.added_to(FAILURES) == {
        attrs(
            gql_service_auth__method=method_of(case),
            gql_service_auth__cause="timeout",
            error__type="ServiceTimeoutError",
        ): 1
    }


def test_a_field_refused_while_the_call_answered_is_no_failed_request(
    emulator: Emulator, telemetry: Telemetry
) -> None:
    """gql raises the answer's errors, the application's to read: the call itself got
    its answer, and the operator's count of failed requests stays the service's reach."""
    transport = make("aiohttp-api_key", emulator)
    emulator.fail_graphql_requests(
        1, body={"data": None, "errors": [{"message": "boom", "path": ["carriers"]}]}
    )
    with pytest.raises(Exception, match="boom"):
        execute(transport)
    assert telemetry.added_to(FAILURES) == {}


def test_the_remaining_life_of_the_token_in_hand_is_a_gauge_per_credentials(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry
) -> None:
    """One point per credentials, keyed by a digest that shows no client id; the
    transports that share a token share its point."""
    recent, legacy = emulator.recent_client, emulator.legacy_client
    transports = [
        make(
            "aiohttp-oauth2",
            emulator,
            clock=clock,
            client_id=client.client_id,
            client_secret=client.client_secret,
        )
        for client in (recent, recent, legacy)
    ]
    for transport in transports:
        execute(transport)
    assert emulator.counters.token_requests == 2

    def ours() -> dict[frozenset[tuple[str, Any]], float]:
        points = telemetry.gauge(REMAINING_LIFE)
        return {key: value for key, value in points.items() if _ours(key, emulator)}

    points = ours()
    assert sorted(points.values()) == [emulator.token_ttl, emulator.token_ttl]
    tags = {dict(key)["gql_service_auth.credentials"] for key in points}
    assert len(tags) == 2
    clock.advance(100)
    assert sorted(ours().values()) == [emulator.token_ttl - 100] * 2
    shown = repr(telemetry.gauge(REMAINING_LIFE))
    for client in (recent, legacy):
        assert client.client_id not in shown
        assert client.client_secret not in shown


def test_a_token_past_its_expiry_leaves_the_gauge(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry
) -> None:
    """A process at rest keeps a token nobody renews: no point at 0 for it."""
    transport = make("aiohttp-oauth2", emulator, clock=clock)
    execute(transport)
    assert [v for k, v in telemetry.gauge(REMAINING_LIFE).items() if _ours(k, emulator)] == [
        emulator.token_ttl
    ]
    clock.advance(emulator.token_ttl)
    assert not [k for k in telemetry.gauge(REMAINING_LIFE) if _ours(k, emulator)]


def test_the_gauge_follows_credentials_that_change(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry
) -> None:
    """After a rotation to other credentials, the point is theirs: a process started
    after the rotation shows the same digest."""
    first, second = emulator.recent_client, emulator.create_credentials()
    pairs = [(first.client_id, first.client_secret)]
    rotating = OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        credentials=CredentialsCallback(lambda: pairs[0], check_every=0.02),
        clock=clock,
    )
    execute(rotating)
    (before,) = [k for k in telemetry.gauge(REMAINING_LIFE) if _ours(k, emulator)]
    pairs[0] = (second.client_id, second.client_secret)
    _poll(lambda: bool(telemetry.added_to("gql_service_auth.credentials.changes")))
    execute(rotating)
    fresh = make(
        "aiohttp-oauth2",
        emulator,
        clock=clock,
        client_id=second.client_id,
        client_secret=second.client_secret,
        share_tokens=False,
    )
    execute(fresh)
    (after,) = [k for k in telemetry.gauge(REMAINING_LIFE) if _ours(k, emulator)]
    assert after != before


def _ours(key: frozenset[tuple[str, Any]], emulator: Emulator) -> bool:
    """A point of this test's emulator (another test's transports may live on)."""
    attributes = dict(key)
    return attributes.get("server.port") == int(emulator.token_url.split(":")[2].split("/")[0])


class _Unplugged(LocalTokenStore):
    """A local store whose loads fail while ``unplugged`` is set, as a Redis gone away,
    and whose saves fail while ``full`` is (as a Redis out of memory)."""

    unplugged = False
    full = False

    async def load(self, identity: Any) -> Any:
        if self.unplugged:
            raise ConnectionError("Connection refused")
        return await super().load(identity)

    async def save(self, identity: Any, token: Any) -> bool:
        if self.full:
            raise MemoryError("OOM command not allowed")
        return await super().save(identity, token)


def test_a_store_that_failed_a_save_is_not_shared_though_its_other_calls_answered(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry, tmp_path: Path
) -> None:
    """The token fetched was never stored: no process can read it."""
    with _Unplugged(tmp_path / "store", cooldown=0) as store:
        store.full = True
        transport = make("aiohttp-oauth2", emulator, clock=clock, token_store=store)
        execute(transport)
        lost = attrs(gql_service_auth__store=store.location, error__type="MemoryError")
        assert telemetry.gauge(SHARING).get(lost) == 0


def test_a_store_that_failed_shows_as_sharing_lost_and_why_until_it_answers(
    emulator: Emulator, clock: ManualClock, telemetry: Telemetry, tmp_path: Path
) -> None:
    """The store.sharing gauge: 1 for a store in use; 0, with the failure's class, from a
    failed call until a call succeeds (the process fetches its own tokens meanwhile)."""
    with _Unplugged(tmp_path / "store", cooldown=0) as store:
        at = attrs(gql_service_auth__store=store.location)
        lost = attrs(gql_service_auth__store=store.location, error__type="ConnectionError")
        transport = make("aiohttp-oauth2", emulator, clock=clock, token_store=store)
        execute(transport)
        assert telemetry.gauge(SHARING).get(at) == 1
        store.unplugged = True
        emulator.revoke_tokens()  # the next call needs a new token: the store is asked
        execute(transport)
        points = telemetry.gauge(SHARING)
        assert points.get(lost) == 0
        assert at not in points
        store.unplugged = False
        emulator.revoke_tokens()
        execute(transport)
        assert telemetry.gauge(SHARING).get(at) == 1
        assert lost not in telemetry.gauge(SHARING)
    # A store closed on purpose is no store in use: it leaves the gauge.
    assert at not in telemetry.gauge(SHARING)


def test_credentials_read_anew_are_counted_for_an_api_key(
    emulator: Emulator, telemetry: Telemetry
) -> None:
    client = emulator.recent_client
    other = emulator.create_credentials()
    pairs = [(client.client_id, client.client_secret)]
    transport = ApiKeyTransport(
        emulator.graphql_url, credentials=CredentialsCallback(lambda: pairs[0], check_every=0.02)
    )
    execute(transport)
    pairs[0] = (other.client_id, other.client_secret)
    _poll(lambda: bool(telemetry.added_to("gql_service_auth.credentials.changes")))
    execute(transport)
    assert telemetry.added_to("gql_service_auth.credentials.changes") == {frozenset(): 1}


def _poll(condition: Callable[[], bool]) -> None:
    """Wait for ``condition``, which a thread of the package makes true; bounded."""
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.mark.parametrize("case", ["aiohttp-api_key", "aiohttp-oauth2"])
async def test_a_batch_with_the_callers_own_header_is_explained_and_counted_as_execute_is(
    case: str, emulator: Emulator, telemetry: Telemetry
) -> None:
    emulator.fail_graphql_requests(5, 503, body=b"busy", headers={"Content-Type": "text/plain"})
    own = {"headers": {"Authorization": "Bearer the-callers-own"}}
    async with Client(transport=make(case, emulator), execute_timeout=HANG_GUARD) as session:
        with pytest.raises(ServiceHTTPError):
            await session.execute_batch([GraphQLRequest(COUNT)], extra_args=own)
    assert telemetry.added_to(FAILURES) == {
        attrs(
            gql_service_auth__method=method_of(case),
            gql_service_auth__cause="http_status",
            error__type="ServiceHTTPError",
            http__response__status_code=503,
        ): 1
    }


async def test_an_async_session_counts_its_failures_too(
    emulator: Emulator, telemetry: Telemetry
) -> None:
    """gql's execute_batch on aiohttp, refused: one failed request per call."""
    emulator.fail_graphql_requests(10, body=[REFUSAL])
    transport = make("aiohttp-api_key", emulator)
    async with Client(transport=transport, execute_timeout=HANG_GUARD) as session:
        with pytest.raises(ApiKeyRejectedError):
            await session.execute_batch([GraphQLRequest(COUNT)])
    await wait_until(lambda: bool(telemetry.added_to(FAILURES)))
    assert telemetry.added_to(FAILURES) == {
        attrs(
            gql_service_auth__method="api_key",
            gql_service_auth__cause="refused",
            error__type="ApiKeyRejectedError",
        ): 1
    }


_SCENARIO = """
import sys
from gql import Client, gql
from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import generate_latest

from gql_service_auth import ApiKeyTransport, OAuth2Transport
from gql_service_auth.emulator import Emulator
from gql_service_auth.redis import RedisTokenStore

metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
query = gql("query { carriers(first: 1) { edges { node { id } } } }")
store = RedisTokenStore.from_url(sys.argv[1], store_key=b"k" * 32, timeout=0.5)
with Emulator().run_in_thread() as emulator:
    client = emulator.recent_client
    oauth2 = OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        client_id=client.client_id,
        client_secret=client.client_secret,
        token_store=store,  # on a closed port: it fails
    )
    Client(transport=oauth2).execute(query)
    emulator.revoke_tokens()
    Client(transport=oauth2).execute(query)  # refused, renewed, sent again
    wrong = ApiKeyTransport(emulator.graphql_url, client_id="x", client_secret="y")
    try:
        Client(transport=wrong).execute(query)
    except Exception:
        pass
    print(generate_latest().decode())
store.close()
"""


def test_the_docs_dashboard_and_alerts_name_what_the_package_exports(tmp_path: Path) -> None:
    """Every metric and label the dashboard's queries and the alert rules of
    docs/metrics.md name is one a Prometheus scrape of the package shows."""
    import re
    import subprocess
    import sys

    docs = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    blocks = re.findall(r"```(?:promql|yaml)\n(.*?)```", docs, re.S)
    assert len(blocks) == 2
    assert blocks[1].count("- alert:") == 2
    script = tmp_path / "scenario.py"
    script.write_text(_SCENARIO)
    with closed_port() as port:
        completed = subprocess.run(
            [sys.executable, str(script), f"redis://127.0.0.1:{port}/0"],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD,
            check=False,
        )
    assert completed.returncode == 0, completed.stderr
    series = [line for line in completed.stdout.splitlines() if line and line[0] != "#"]
    names = {line.partition("{")[0].split()[0] for line in series}
    labels = {
        label
        for line in series
        for label in re.findall(r'([a-z_]+)="', line.partition("{")[2].rpartition("}")[0])
    }
    text = "\n".join(blocks)
    grouped = {
        label.strip()
        for listed in re.findall(r"\bby \(([^)]*)\)", text)
        for label in listed.split(",")
    }
    grouped |= set(re.findall(r"\$labels\.(\w+)", text))
    assert grouped <= labels, grouped - labels
    outside = re.sub(r"\bby \([^)]*\)|\$labels\.\w+", "", text)
    named = set(re.findall(r"\bgql_service_auth_\w+", outside))
    assert named, "the queries name no metric"
    assert named <= names, named - names
