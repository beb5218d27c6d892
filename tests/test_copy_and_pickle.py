"""copy, deepcopy and pickle: of transports (used or not, with a store) and of our errors.

A copy runs queries and fetches its own token; a copy shares its original's token store,
and an unpickled one rebuilds it from its URL; an error copied or unpickled in another
process is caught by the same ``except`` clauses.
"""

from __future__ import annotations

import copy
import gc
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from gql import Client
from gql.transport.aiohttp import AIOHTTPTransport
from gql.transport.exceptions import (
    TransportError,
    TransportQueryError,
    TransportServerError,
)
from redis_server import RedisServer
from support import (
    ANSWER,
    COUNT,
    GQL_401,
    KINDS,
    SLOW_MACHINE,
    build_transport,
    collect_garbage,
    query,
    run_python,
    with_store,
)

import gql_service_auth
from gql_service_auth import (
    ApiKeyRejectedHTTPError,
    AuthEvent,
    UnauthenticatedHTTPError,
)
from gql_service_auth.emulator import Emulator
from gql_service_auth.redis import RedisTokenStore

COPIERS = [
    pytest.param(lambda transport: pickle.loads(pickle.dumps(transport)), id="pickle"),
    pytest.param(copy.deepcopy, id="deepcopy"),
]


@pytest.mark.parametrize("copier", COPIERS)
@pytest.mark.parametrize("kind", ["gql", *KINDS])
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_copied_transport_runs_a_query(
    emulator: Emulator, kind: str, copier: Callable[[Any], AIOHTTPTransport]
) -> None:
    """A pickled or deep-copied transport runs a query, as gql's own transport does."""
    async with Client(transport=copier(build_transport(kind, emulator))) as session:
        assert await session.execute(COUNT) == ANSWER


HEARD: list[AuthEvent] = []
"""What _hear heard: a module's function, so a pickled transport's hook is the same one."""


def _hear(event: AuthEvent) -> None:
    HEARD.append(event)


@pytest.mark.parametrize(("share_tokens", "token_requests"), [(True, 1), (False, 2)])
@pytest.mark.parametrize("copier", COPIERS)
@pytest.mark.usefixtures("no_resource_left_open")
async def test_a_copy_of_a_used_oauth2_transport_shares_its_token_as_a_new_one_would(
    emulator: Emulator,
    copier: Callable[[Any], AIOHTTPTransport],
    share_tokens: bool,
    token_requests: int,
) -> None:
    """A copy of an OAuth2Transport holding a token uses the process's token, as a transport
    built with its settings would; with ``share_tokens=False`` it fetches its own. Either
    way its ``on_event`` hears the events of the token it uses."""
    original = build_transport("oauth2", emulator, share_tokens=share_tokens, on_event=_hear)
    async with Client(transport=original) as session:
        await session.execute(COUNT)
    copied = copier(original)
    del original, session
    collect_garbage()  # the original's hook hears no more: what follows is the copy's
    HEARD.clear()
    async with Client(transport=copied) as session:
        assert await session.execute(COUNT) == ANSWER
        assert emulator.counters.token_requests == token_requests
        emulator.revoke_tokens()
        assert await session.execute(COUNT) == ANSWER
    assert "token_rejected" in [event.name for event in HEARD]
    assert [event.reason for event in HEARD if event.name == "token_fetched"][-1] == "rejected"


async def test_deepcopy_of_a_transport_with_a_store(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """pickle and copy.deepcopy of a transport work with a store, and the copy shares it."""
    with RedisTokenStore.from_url(redis_server.url, timeout=SLOW_MACHINE) as store:
        shared = with_store(live_emulator, store)
        copied, unused_copy = copy.deepcopy(shared), copy.deepcopy(shared)
        thawed = pickle.loads(pickle.dumps(shared))
        await query(shared)
        await query(copied)  # loads the token shared stored
        await query(thawed)  # loads it too: a Redis store of its own, rebuilt from the URL
        assert live_emulator.counters.token_requests == 1
        store.close()
        # The copy's store is the very one closed: it fetches for itself. A store of its
        # own on that Redis would have loaded the stored token.
        await query(unused_copy)
        assert live_emulator.counters.token_requests == 2
        del thawed  # and its own store, closed when collected
        gc.collect()


@pytest.mark.parametrize("kind", [UnauthenticatedHTTPError, ApiKeyRejectedHTTPError])
@pytest.mark.parametrize(
    "duplicate", [copy.copy, copy.deepcopy, lambda e: pickle.loads(pickle.dumps(e))]
)
def test_the_http_errors_survive_copy_and_pickle(
    kind: type[UnauthenticatedHTTPError], duplicate: Callable[[Any], Any]
) -> None:
    """A copy (a worker process, a task queue) is caught by the same except clauses."""
    error = kind(f"{GQL_401}, url='http://127.0.0.1/graphql': refused")
    copied = duplicate(error)
    assert type(copied) is kind
    assert isinstance(copied, (TransportServerError, TransportQueryError, TransportError))
    assert (copied.code, copied.errors, str(copied)) == (401, None, str(error))


def test_errors_unpickle_in_a_process_that_imported_nothing() -> None:
    """Pickle finds gql_service_auth.X in a fresh process: the lazy names resolve there."""
    values = [
        gql_service_auth.TokenRequestError("refused", status=401, error="invalid_client"),
        gql_service_auth.ApiKeyRejectedHTTPError("refused"),
        gql_service_auth.UnauthenticatedError("refused", errors=[{"message": "x"}]),
        gql_service_auth.ConfigurationError("bad"),
        gql_service_auth.AuthEvent("token_fetched"),
    ]
    completed = run_python(
        f"""
        import pickle
        values = pickle.loads({pickle.dumps(values)!r})
        print([type(v).__name__ for v in values], values[1].code, values[2].errors)
        """
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == (
        "['TokenRequestError', 'ApiKeyRejectedHTTPError', 'UnauthenticatedError', "
        "'ConfigurationError', 'AuthEvent'] 401 [{'message': 'x'}]"
    )
