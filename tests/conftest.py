"""Fixtures: the plugin's emulator (gql_service_auth.pytest_plugin), and transports for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gql_service_auth import ApiKeyTransport, AuthEvent, OAuth2Transport, RetryPolicy
from gql_service_auth.emulator import ClientRecord, Emulator, ManualClock

pytest_plugins = ["pytester"]

NO_WAIT = RetryPolicy(wait_initial=0, wait_max=0, wait_jitter=0)
"""Retries without backoff waits, so tests never sleep through them."""


@pytest.fixture
def clock(service_clock: ManualClock) -> ManualClock:
    """The plugin's clock, shared by the emulator and the transports: advanced, never slept."""
    return service_clock


@pytest.fixture
def emulator(service_emulator: Emulator, clock: ManualClock) -> Emulator:
    """The plugin's emulator, on the manual clock (our tests never wait out a lifetime)."""
    return service_emulator


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
