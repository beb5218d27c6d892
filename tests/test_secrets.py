"""No secret, token or Authorization value in logs, reprs, messages or tracebacks."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from datetime import date

import pytest
from gql import Client
from support import COUNT, exception_texts, upload

from gql_service_auth import ApiKeyTransport, OAuth2Transport, RetryPolicy
from gql_service_auth.emulator import ClientRecord, Emulator

SECRET = "SENTINEL-secret-7f3a9c"
WRONG_SECRET = "SENTINEL-wrong-1b2e4d"
RECENT = ClientRecord("sentinel-recent", SECRET, date(2025, 2, 1))
LEGACY = ClientRecord("sentinel-legacy", SECRET, date(2023, 2, 1))
NO_WAIT = RetryPolicy(attempts=3, wait_initial=0, wait_max=0, wait_jitter=0)

Scenario = Callable[[Emulator], Awaitable[None]]


@pytest.fixture
def sentinel_emulator() -> Iterator[Emulator]:
    """An emulator that knows only the sentinel clients."""
    with Emulator(clients=[RECENT, LEGACY]).run_in_thread() as running:
        yield running


def _oauth2(emulator: Emulator, secret: str = SECRET, **kwargs: object) -> OAuth2Transport:
    return OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        client_id=RECENT.client_id,
        client_secret=secret,
        retry=NO_WAIT,
        **kwargs,  # type: ignore[arg-type]
    )


def _api_key(emulator: Emulator, client: ClientRecord = RECENT) -> ApiKeyTransport:
    return ApiKeyTransport(
        emulator.graphql_url, client_id=client.client_id, client_secret=client.client_secret
    )


async def _run(transport: ApiKeyTransport | OAuth2Transport, times: int = 1) -> None:
    async with Client(transport=transport, fetch_schema_from_transport=True) as session:
        for _ in range(times):
            await session.execute(COUNT)


async def api_key_ok(emulator: Emulator) -> None:
    await _run(_api_key(emulator), 2)


async def api_key_legacy(emulator: Emulator) -> None:
    await _run(_api_key(emulator, LEGACY))


async def api_key_bare_401(emulator: Emulator) -> None:
    emulator.unauthenticated_status, emulator.unauthenticated_body = 401, False
    await _run(_api_key(emulator, LEGACY))


async def oauth2_renewal(emulator: Emulator) -> None:
    transport = _oauth2(emulator)
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        await session.execute(COUNT)


async def oauth2_refused_forever(emulator: Emulator) -> None:
    emulator.refuse_all_tokens = True
    await _run(_oauth2(emulator, max_renewals=2))


async def oauth2_bare_401_forever(emulator: Emulator) -> None:
    emulator.refuse_all_tokens = True
    emulator.unauthenticated_status, emulator.unauthenticated_body = 401, False
    await _run(_oauth2(emulator))


async def invalid_client(emulator: Emulator) -> None:
    await _run(_oauth2(emulator, WRONG_SECRET))


async def invalid_client_basic(emulator: Emulator) -> None:
    await _run(_oauth2(emulator, WRONG_SECRET, token_auth_method="client_secret_basic"))


async def server_echoes_the_secret(emulator: Emulator) -> None:
    body = {"error": f"bad {SECRET}", "error_description": f"secret {SECRET} refused"}
    emulator.fail_token_requests(1, 401, body=body)
    await _run(_oauth2(emulator))


async def token_endpoint_down(emulator: Emulator) -> None:
    emulator.fail_token_requests(10, 503)
    await _run(_oauth2(emulator))


async def graphql_502(emulator: Emulator) -> None:
    emulator.fail_graphql_requests(5, 502, body=b"bad gateway")
    await _run(_oauth2(emulator))


async def upload_refused(emulator: Emulator) -> None:
    transport = _oauth2(emulator)
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        emulator.revoke_tokens()
        await session.execute(upload(b"data"), upload_files=True)


SCENARIOS: list[Scenario] = [
    api_key_ok,
    api_key_legacy,
    api_key_bare_401,
    oauth2_renewal,
    oauth2_refused_forever,
    oauth2_bare_401_forever,
    invalid_client,
    invalid_client_basic,
    server_echoes_the_secret,
    token_endpoint_down,
    graphql_502,
    upload_refused,
]


def _log_texts(records: list[logging.LogRecord]) -> list[str]:
    texts = []
    for record in records:
        texts += [record.getMessage(), repr(record.__dict__)]
        if record.exc_info and record.exc_info[1] is not None:
            texts += exception_texts(record.exc_info[1])
    return texts


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_no_secret_is_shown(
    sentinel_emulator: Emulator, caplog: pytest.LogCaptureFixture, scenario: Scenario
) -> None:
    """Logs at DEBUG, exception texts, reprs and tracebacks hold no credential."""
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    try:
        await scenario(sentinel_emulator)
    except Exception as exc:
        texts += exception_texts(exc)
    texts += _log_texts(caplog.records)

    sent = [r.headers.get("Authorization", "") for r in sentinel_emulator.requests]
    tokens = [value.split(" ", 1)[1] for value in sent if value.startswith("Bearer ")]
    forbidden = [SECRET, WRONG_SECRET, *tokens, *(value for value in sent if value)]
    assert caplog.records, "the scenario logged nothing: the scan would prove nothing"
    for text in texts:
        for value in forbidden:
            assert value not in text
