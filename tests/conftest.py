"""Fixtures: an emulator on 127.0.0.1 per test, and transports pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gql_service_auth import ApiKeyTransport, AuthEvent, OAuth2Transport, RetryPolicy
from gql_service_auth.emulator import ClientRecord, Emulator, ManualClock

NO_WAIT = RetryPolicy(wait_initial=0, wait_max=0, wait_jitter=0)
"""Retries without backoff waits, so tests never sleep through them."""


@pytest.fixture
def clock() -> ManualClock:
    """A clock shared by the emulator and the transports: tests advance it, never sleep."""
    return ManualClock()


@pytest.fixture
def emulator(clock: ManualClock) -> Iterator[Emulator]:
    """The service emulator, serving from its own thread so sync and async tests can use it."""
    with Emulator(clock=clock).run_in_thread() as running:
        yield running


@pytest.fixture
def events() -> list[AuthEvent]:
    """Collects the events of transports built by the factories below."""
    return []


@pytest.fixture
def make_oauth2(
    emulator: Emulator, clock: ManualClock, events: list[AuthEvent]
) -> Callable[..., OAuth2Transport]:
    """Builds an OAuth2Transport for the emulator's recent client, without backoff waits."""

    def make(client: ClientRecord | None = None, **kwargs: Any) -> OAuth2Transport:
        client = client or emulator.recent_client
        kwargs.setdefault("retry", NO_WAIT)
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("on_event", events.append)
        return OAuth2Transport(
            kwargs.pop("url", emulator.graphql_url),
            token_url=kwargs.pop("token_url", emulator.token_url),
            client_id=client.client_id,
            client_secret=client.client_secret,
            **kwargs,
        )

    return make


@pytest.fixture
def make_api_key(emulator: Emulator) -> Callable[..., ApiKeyTransport]:
    """Builds an ApiKeyTransport, for the recent client unless told otherwise."""

    def make(client: ClientRecord | None = None, **kwargs: Any) -> ApiKeyTransport:
        client = client or emulator.recent_client
        return ApiKeyTransport(
            emulator.graphql_url,
            client_id=client.client_id,
            client_secret=client.client_secret,
            **kwargs,
        )

    return make
