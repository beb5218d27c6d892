"""The emulator keeps the service contract, seen over raw HTTP."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import threading
import urllib.request
from collections.abc import AsyncIterator

import aiohttp
import pytest
from support import wait_until

from gql_service_auth.emulator import ClientRecord, Emulator, ManualClock, environ_or_emulator

QUERY = {"query": "query { carriers(first: 2) { edges { node { id name } } } }"}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain aiohttp session."""
    async with aiohttp.ClientSession() as session:
        yield session


async def _token(http: aiohttp.ClientSession, emulator: Emulator, **form: str) -> tuple[int, dict]:
    async with http.post(emulator.token_url, data=form) as response:
        return response.status, await response.json()


async def _query(http: aiohttp.ClientSession, emulator: Emulator, authorization: str) -> dict:
    headers = {"Authorization": authorization}
    async with http.post(emulator.graphql_url, json=QUERY, headers=headers) as response:
        return await response.json()


def _grant(client: ClientRecord) -> dict[str, str]:
    return {
        "grant_type": "client_credentials",
        "client_id": client.client_id,
        "client_secret": client.client_secret,
    }


async def test_issues_expiring_bearer_tokens(
    emulator: Emulator, clock: ManualClock, http: aiohttp.ClientSession
) -> None:
    """A token is accepted until its TTL passes, then refused with UNAUTHENTICATED."""
    status, body = await _token(http, emulator, **_grant(emulator.recent_client))
    assert status == 200
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 3600
    bearer = f"Bearer {body['access_token']}"
    assert len((await _query(http, emulator, bearer))["data"]["carriers"]["edges"]) == 2
    clock.advance(3600)
    refused = await _query(http, emulator, bearer)
    assert refused["data"] is None
    assert refused["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_legacy_client_gets_tokens_but_no_api_key(
    emulator: Emulator, http: aiohttp.ClientSession
) -> None:
    """A client registered before 2024-05-13 works with OAuth2 only."""
    legacy = emulator.legacy_client
    status, body = await _token(http, emulator, **_grant(legacy))
    assert status == 200
    ok = await _query(http, emulator, f"Bearer {body['access_token']}")
    assert "errors" not in ok
    key = f"SERVICE-API-KEY {legacy.client_id}:{legacy.client_secret}"
    refused = await _query(http, emulator, key)
    assert "2024-05-13" in refused["errors"][0]["message"]


async def test_missing_or_unknown_authorization_is_refused(
    emulator: Emulator, http: aiohttp.ClientSession
) -> None:
    """No header, an unknown scheme or an unknown token: all UNAUTHENTICATED."""
    for value in ("", "Token abc", "Bearer never-issued"):
        body = await _query(http, emulator, value)
        assert body["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_answers_to_refusals_meet_only_refused_requests(
    emulator: Emulator, http: aiohttp.ClientSession
) -> None:
    """``answer_refusals``: accepted requests pass them by, refused ones meet them in order."""
    unauthenticated = {"data": None, "errors": [{"extensions": {"code": "UNAUTHENTICATED"}}]}
    emulator.answer_refusals(1)
    emulator.answer_refusals(1, 200, body=unauthenticated)
    emulator.answer_refusals(1, 200, body=unauthenticated)
    _, body = await _token(http, emulator, **_grant(emulator.recent_client))
    assert "errors" not in await _query(http, emulator, f"Bearer {body['access_token']}")
    legacy = emulator.legacy_client
    answers = []
    for authorization, payload in (
        ("Bearer never-issued", QUERY),
        (f"SERVICE-API-KEY {legacy.client_id}:{legacy.client_secret}", QUERY),
        ("Bearer never-issued", [QUERY, QUERY]),  # a batch: a copy per request
        ("Bearer never-issued", QUERY),  # the emulator's own refusal again
    ):
        headers = {"Authorization": authorization}
        async with http.post(emulator.graphql_url, json=payload, headers=headers) as response:
            answers.append((response.status, await response.read()))
    assert answers[0] == (401, b"")
    assert answers[1][0] == 200
    assert json.loads(answers[1][1]) == unauthenticated
    assert json.loads(answers[2][1]) == [unauthenticated, unauthenticated]
    assert answers[3][0] == 200
    assert b"invalid access token" in answers[3][1]
    assert emulator.counters.unauthenticated_responses == 4


@pytest.mark.parametrize(
    ("form", "status", "error"),
    [
        ({"grant_type": "password"}, 400, "unsupported_grant_type"),
        (
            {"grant_type": "client_credentials", "client_id": "nobody", "client_secret": "x"},
            401,
            "invalid_client",
        ),
        ({"grant_type": "client_credentials"}, 401, "invalid_client"),
    ],
)
async def test_token_endpoint_errors_follow_rfc_6749(
    emulator: Emulator, http: aiohttp.ClientSession, form: dict[str, str], status: int, error: str
) -> None:
    """Bad token requests get RFC 6749 section 5.2 error objects."""
    got_status, body = await _token(http, emulator, **form)
    assert (got_status, body["error"]) == (status, error)
    assert "error_description" in body


async def test_token_endpoint_wants_a_form(
    emulator: Emulator, http: aiohttp.ClientSession
) -> None:
    """A JSON token request is invalid_request."""
    async with http.post(emulator.token_url, json=_grant(emulator.recent_client)) as response:
        assert response.status == 400
        assert (await response.json())["error"] == "invalid_request"


async def test_basic_client_authentication(
    emulator: Emulator, http: aiohttp.ClientSession
) -> None:
    """HTTP Basic client authentication works; combined with form secrets it is refused."""
    client = emulator.recent_client
    basic = base64.b64encode(f"{client.client_id}:{client.client_secret}".encode()).decode()
    headers = {"Authorization": f"Basic {basic}"}
    form = {"grant_type": "client_credentials"}
    async with http.post(emulator.token_url, data=form, headers=headers) as response:
        assert response.status == 200
    both = {**form, "client_secret": client.client_secret}
    async with http.post(emulator.token_url, data=both, headers=headers) as response:
        assert (await response.json())["error"] == "invalid_request"
    bad = {"Authorization": "Basic not-base64!"}
    async with http.post(emulator.token_url, data=form, headers=bad) as response:
        assert response.status == 401


async def test_scopes_are_checked(http: aiohttp.ClientSession) -> None:
    """A client limited to some scopes gets invalid_scope for others."""
    client = ClientRecord("scoped", "secret", scopes=frozenset({"read"}))
    with Emulator(clients=[client]).run_in_thread() as emulator:
        status, body = await _token(http, emulator, **_grant(client), scope="read")
        assert (status, body["scope"]) == (200, "read")
        status, body = await _token(http, emulator, **_grant(client), scope="read write")
        assert (status, body["error"]) == (400, "invalid_scope")


async def test_bad_graphql_bodies_are_reported(
    emulator: Emulator, http: aiohttp.ClientSession
) -> None:
    """A body that is not a GraphQL request gets a 400 with an errors member."""
    for body in (b"not json", b"[]", b"42", b'{"query": 1}'):
        async with http.post(
            emulator.graphql_url, data=body, headers={"Content-Type": "application/json"}
        ) as response:
            assert "errors" in await response.json()


async def test_cursor_and_page_bounds(emulator: Emulator, http: aiohttp.ClientSession) -> None:
    """Bad cursors and page sizes are GraphQL errors, not crashes."""
    client = emulator.recent_client
    key = {"Authorization": f"SERVICE-API-KEY {client.client_id}:{client.client_secret}"}
    for query in (
        'query { carriers(after: "bm9wZToz") { totalCount } }',
        'query { carriers(after: "???") { totalCount } }',
        "query { carriers(first: 1000) { totalCount } }",
        'mutation { renameCarrier(id: "nope", name: "x") { id } }',
    ):
        async with http.post(emulator.graphql_url, json={"query": query}, headers=key) as response:
            assert (await response.json())["errors"]
    assert emulator.counters.mutations_run == 0


async def test_mutations_are_recorded_with_their_arguments(
    emulator: Emulator, http: aiohttp.ClientSession
) -> None:
    """Each mutation the emulator runs is kept with its arguments, in order."""
    client = emulator.recent_client
    key = {"Authorization": f"SERVICE-API-KEY {client.client_id}:{client.client_secret}"}
    for name in ("First", "Second"):
        query = {
            "query": "mutation ($n: String!) "
            '{ renameCarrier(id: "carrier-002", name: $n) { id } }',
            "variables": {"n": name},
        }
        async with http.post(emulator.graphql_url, json=query, headers=key) as response:
            assert (await response.json())["data"]
    assert [(m.field, dict(m.arguments)) for m in emulator.mutations] == [
        ("renameCarrier", {"id": "carrier-002", "name": "First"}),
        ("renameCarrier", {"id": "carrier-002", "name": "Second"}),
    ]
    emulator.reset_counters()
    assert not emulator.mutations


async def test_field_refusals_come_after_the_side_effect(
    emulator: Emulator, http: aiohttp.ClientSession
) -> None:
    """refuse_fields: the mutation runs, then its resolver answers UNAUTHENTICATED with a path."""
    client = emulator.recent_client
    key = {"Authorization": f"SERVICE-API-KEY {client.client_id}:{client.client_secret}"}
    rename = {"query": 'mutation { renameCarrier(id: "carrier-003", name: "Late") { id } }'}
    emulator.refuse_fields(2)
    for query in (rename, QUERY):
        async with http.post(emulator.graphql_url, json=query, headers=key) as response:
            answer = await response.json()
        assert answer["data"] is None
        assert answer["errors"][0]["extensions"] == {"code": "UNAUTHENTICATED"}
        assert answer["errors"][0]["path"] in (["renameCarrier"], ["carriers"])
    assert emulator.counters.mutations_run == 1
    assert emulator.carriers[2]["name"] == "Late"
    assert emulator.counters.unauthenticated_responses == 2
    async with http.post(emulator.graphql_url, json=QUERY, headers=key) as response:
        assert (await response.json())["data"]["carriers"]


async def test_async_context_manager_and_reprs() -> None:
    """Emulator.running() serves in the current loop; reprs hide secrets."""
    async with Emulator.running(token_ttl=5) as emulator:
        assert emulator.base_url.startswith("http://127.0.0.1:")
        assert emulator.recent_client.client_secret not in repr(emulator.recent_client)
        assert "127.0.0.1" in repr(emulator)
    assert repr(emulator) == "<Emulator not started>"
    with pytest.raises(RuntimeError, match="not started"):
        _ = emulator.base_url


def test_port_in_use_is_reported() -> None:
    """Starting on a taken port raises at once instead of hanging."""
    with Emulator().run_in_thread() as first:
        taken = Emulator(port=first.port)
        with pytest.raises(OSError, match="address already in use"), taken.run_in_thread():
            pass  # pragma: no cover


def test_environ_or_emulator_prefers_the_configured_service() -> None:
    """With SERVICE_BASE_URL set, no emulator is started and the environment is passed on."""
    configured = {"SERVICE_BASE_URL": "https://api.example.com"}
    with environ_or_emulator(configured) as (environ, emulator):
        assert emulator is None
        assert environ is configured


def test_environ_or_emulator_starts_one_otherwise() -> None:
    """Without it, an emulator runs with the knobs given, and unknown knobs are refused."""
    with environ_or_emulator({}, legacy=True, token_ttl=5) as (environ, emulator):
        assert emulator is not None
        assert emulator.token_ttl == 5
        assert environ["SERVICE_CLIENT_ID"] == emulator.legacy_client.client_id
    with pytest.raises(TypeError, match="token_tll"), environ_or_emulator({}, token_tll=5):
        pass  # pragma: no cover


async def test_a_frozen_token_endpoint_holds_requests_until_the_outage_ends(
    emulator: Emulator, http: aiohttp.ClientSession
) -> None:
    """During a freeze, token requests hang while the API answers; then they are served."""
    emulator.freeze_token_endpoint(0.5)
    held = asyncio.ensure_future(_token(http, emulator, **_grant(emulator.recent_client)))
    done = []
    held.add_done_callback(lambda _: done.append("token"))
    await wait_until(lambda: emulator.counters.token_requests == 1)
    await _query(http, emulator, "Bearer nothing")  # the API is not frozen
    done.append("graphql")
    status, body = await held
    assert status == 200
    assert body["token_type"] == "Bearer"
    assert done == ["graphql", "token"]
    emulator.freeze_token_endpoint(0)  # ended: answered at once from now on
    status, _ = await _token(http, emulator, **_grant(emulator.recent_client))
    assert status == 200


def test_stopping_mid_request_leaves_no_pending_task(caplog: pytest.LogCaptureFixture) -> None:
    """A handler asleep in a latency knob, its client gone, is cancelled when the emulator
    stops: not left pending for the garbage collector to report."""

    def post(url: str) -> None:
        with contextlib.suppress(OSError):  # the client gives up: its connection closes
            urllib.request.urlopen(urllib.request.Request(url, data=b"x"), timeout=0.2)

    with Emulator().run_in_thread() as emulator:
        emulator.token_latency = 5.0
        caller = threading.Thread(target=post, args=(emulator.token_url,))
        caller.start()
        caller.join(10)
        assert emulator.counters.token_requests == 1
    gc.collect()
    assert "Task was destroyed" not in caplog.text


async def test_ending_a_freeze_releases_the_requests_it_holds(
    emulator: Emulator, http: aiohttp.ClientSession
) -> None:
    """``freeze_token_endpoint(0)`` answers the requests already held, not only later ones."""
    emulator.freeze_token_endpoint(600)
    held = asyncio.ensure_future(_token(http, emulator, **_grant(emulator.recent_client)))
    await wait_until(lambda: emulator.counters.token_requests == 1)
    assert not held.done()
    emulator.freeze_token_endpoint(0)
    await wait_until(held.done)  # a hang guard: held for the 600 s window, this fails
    status, _ = held.result()
    assert status == 200
