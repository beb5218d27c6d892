"""What credentials may cost the token endpoint: refused ones are not asked again at once,
and a budget caps token requests over a window, on every stack."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support import ANSWER, COUNT, HANG_GUARD, NO_WAIT, SLOW_MACHINE, poll
from ways import EVERY_WAY, Call, Way, calls

from gql_service_auth import (
    AuthEvent,
    ConfigurationError,
    OAuth2Transport,
    TokenBudget,
    TokenBudgetExceededError,
    TokenRequestError,
    UnauthenticatedError,
)
from gql_service_auth._core.budget import LEDGERS
from gql_service_auth._core.sharing import SHARED
from gql_service_auth.emulator import Emulator, ManualClock
from gql_service_auth.local import LocalTokenStore
from gql_service_auth.redis import RedisTokenStore

PATIENT = TokenBudget(refusal_wait=600.0, refusal_wait_max=600.0)
"""A budget whose refusals are remembered longer than any test runs, busy machine or not."""


@pytest.fixture(params=EVERY_WAY, ids=lambda way: way.name)
def way(request: pytest.FixtureRequest) -> Way:
    return request.param  # type: ignore[no-any-return]


def oauth2(way: Way, emulator: Emulator, **kwargs: Any) -> Any:
    client = emulator.recent_client
    kwargs.setdefault("retry", NO_WAIT)
    kwargs.setdefault("client_id", client.client_id)
    kwargs.setdefault("client_secret", client.client_secret)
    return way.oauth2(emulator.graphql_url, token_url=emulator.token_url, **kwargs)


def test_refused_credentials_are_not_asked_again_at_the_next_wave(
    way: Way, emulator: Emulator
) -> None:
    """A wrong secret costs one token request, not one per wave of queries."""
    transport = oauth2(way, emulator, client_secret="wrong-secret", token_budget=PATIENT)
    first = way.run(transport, calls(COUNT, 5))
    assert all(isinstance(r, TokenRequestError) and r.error == "invalid_client" for r in first)
    for _ in range(3):
        again = way.run(transport, calls(COUNT, 5))
        assert all(isinstance(r, TokenRequestError) for r in again)
        assert all(r.error == "invalid_client" for r in again)  # type: ignore[union-attr]
        assert all("a moment ago" in str(r) for r in again)
    assert emulator.counters.token_requests == 1


def test_other_transports_of_the_process_remember_the_refusal(emulator: Emulator) -> None:
    """Remembered by credentials, not by transport: a transport built per job asks once."""
    way = EVERY_WAY[0]
    for _ in range(4):
        transport = oauth2(
            way, emulator, client_secret="wrong-secret", token_budget=PATIENT, share_tokens=False
        )
        with pytest.raises(TokenRequestError, match="invalid_client"):
            way.one(transport, Call(COUNT))
    assert emulator.counters.token_requests == 1


def test_the_refusal_is_asked_again_once_its_back_off_ends(emulator: Emulator) -> None:
    """Bounded: after the back-off the endpoint is asked again, and the next wait doubles."""
    way = EVERY_WAY[0]
    budget = TokenBudget(refusal_wait=0.05, refusal_wait_max=0.1)
    transport = oauth2(way, emulator, client_secret="wrong-secret", token_budget=budget)

    def asked_again() -> bool:
        with pytest.raises(TokenRequestError):
            way.one(transport, Call(COUNT))
        return emulator.counters.token_requests >= 3

    assert poll(asked_again)


def test_new_credentials_from_the_source_are_asked_at_once(emulator: Emulator) -> None:
    """A refusal remembered is of those credentials: the fixed ones go at once."""
    client = emulator.recent_client
    secret = ["wrong-secret"]
    way = EVERY_WAY[0]
    transport = oauth2(
        way,
        emulator,
        client_id=None,
        client_secret=None,
        credentials=lambda: (client.client_id, secret[0]),
        token_budget=PATIENT,
    )
    with pytest.raises(TokenRequestError, match="invalid_client"):
        way.one(transport, Call(COUNT))
    secret[0] = client.client_secret
    assert way.one(transport, Call(COUNT)) == ANSWER


def test_an_api_refusing_every_token_spends_the_budget_and_then_no_token_is_asked(
    way: Way, emulator: Emulator
) -> None:
    """Past the budget, calls that need a token fail at once with the budget named."""
    events: list[AuthEvent] = []
    emulator.refuse_all_tokens = True
    budget = TokenBudget(requests=3, window=600.0)
    transport = oauth2(way, emulator, token_budget=budget, on_event=events.append)
    outcomes = [way.run(transport, calls(COUNT))[0] for _ in range(6)]
    assert emulator.counters.token_requests == 3
    spent = [o for o in outcomes if isinstance(o, TokenBudgetExceededError)]
    assert spent
    assert all(isinstance(o, UnauthenticatedError | TokenBudgetExceededError) for o in outcomes)
    assert "3 allowed" in str(spent[0])
    assert "token_budget=TokenBudget(requests=3, window=600)" in str(spent[0])
    assert spent[0].budget == budget
    assert isinstance(spent[0], TokenRequestError)  # what existing except clauses catch
    assert any(e.name == "token_budget_exhausted" for e in events)


def test_a_valid_token_keeps_serving_while_the_budget_is_spent(
    emulator: Emulator, clock: ManualClock
) -> None:
    """The renewal ahead of expiry is not made; the token in hand serves until it ends."""
    events: list[AuthEvent] = []
    way = EVERY_WAY[0]
    transport = oauth2(
        way,
        emulator,
        clock=clock,
        refresh_margin=600,
        token_budget=TokenBudget(requests=1, window=600.0),
        on_event=events.append,
    )
    way.one(transport, Call(COUNT))
    clock.advance(3000)  # past renew_at, still usable
    assert way.run(transport, calls(COUNT, 3)) == [ANSWER] * 3
    assert poll(lambda: any(e.name == "token_budget_exhausted" for e in events))
    assert way.run(transport, calls(COUNT, 3)) == [ANSWER] * 3
    assert emulator.counters.token_requests == 1


def test_no_budget_sets_no_ceiling(emulator: Emulator) -> None:
    emulator.refuse_all_tokens = True
    way = EVERY_WAY[0]
    transport = oauth2(way, emulator, token_budget=None)
    for _ in range(4):
        with pytest.raises(UnauthenticatedError):
            way.one(transport, Call(COUNT))
    assert emulator.counters.token_requests > 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requests": 0}, "at least 1"),
        ({"requests": 1.5}, "must be an int"),
        ({"window": 0}, "above 0"),
        ({"refusal_wait": float("inf")}, "finite"),
        ({"refusal_wait": 10, "refusal_wait_max": 5}, "refusal_wait or more"),
    ],
)
def test_a_bad_budget_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        TokenBudget(**kwargs)


def test_a_budget_of_another_type_is_refused(emulator: Emulator) -> None:
    with pytest.raises(ConfigurationError, match="token_budget must be a TokenBudget"):
        OAuth2Transport(
            emulator.graphql_url,
            token_url=emulator.token_url,
            client_id="x",
            client_secret="y",
            token_budget=100,  # type: ignore[typeddict-item]
        )


# -- the fleet, through a shared store ---------------------------------------------------


@pytest.fixture(params=["local", "redis"])
def shared(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[LocalTokenStore | RedisTokenStore]:
    """Each store, with a timeout no loaded machine reaches."""
    if request.param == "local":
        with LocalTokenStore(tmp_path / "store", timeout=SLOW_MACHINE) as local:
            yield local
    else:
        server = request.getfixturevalue("redis_server")
        with RedisTokenStore.from_url(server.url, timeout=SLOW_MACHINE) as redis:
            yield redis


def _as_another_process() -> None:
    """Forget what this process learnt, as a process of the fleet that learnt nothing."""
    LEDGERS.clear()
    SHARED.clear()


def test_a_refusal_is_remembered_across_the_fleet(
    emulator: Emulator, shared: LocalTokenStore | RedisTokenStore
) -> None:
    """The process refused keeps the refusal in the store: the others do not ask."""
    way = EVERY_WAY[0]
    wrong = {"client_secret": "wrong-secret", "token_budget": PATIENT, "token_store": shared}
    with pytest.raises(TokenRequestError, match="invalid_client"):
        way.one(oauth2(way, emulator, **wrong), Call(COUNT))
    _as_another_process()
    with pytest.raises(TokenRequestError, match="another process sharing the token store") as e:
        way.one(oauth2(way, emulator, **wrong), Call(COUNT))
    assert e.value.error == "invalid_client"
    assert emulator.counters.token_requests == 1
    # Other credentials, in the same store, are theirs: they ask, and get a token.
    assert way.one(oauth2(way, emulator, token_store=shared), Call(COUNT)) == ANSWER


def test_the_budget_is_counted_across_the_fleet(
    emulator: Emulator, shared: LocalTokenStore | RedisTokenStore
) -> None:
    """Processes that each fetch (the API refuses their tokens) share one count."""
    emulator.refuse_all_tokens = True
    way = EVERY_WAY[0]
    budget = TokenBudget(requests=3, window=600.0)
    outcomes = []
    for _ in range(6):
        _as_another_process()
        transport = oauth2(way, emulator, token_store=shared, token_budget=budget)
        outcomes.append(way.run(transport, calls(COUNT))[0])
    assert emulator.counters.token_requests == 3
    assert isinstance(outcomes[-1], TokenBudgetExceededError)


_CRON_JOB = """
import json, os, sys
from gql import Client, gql
from gql_service_auth import OAuth2Transport, TokenBudget, TokenBudgetExceededError
transport = OAuth2Transport.from_env(token_budget=TokenBudget(requests=2, window=600))
try:
    Client(transport=transport).execute(gql("query { carriers(first: 1) { totalCount } }"))
except TokenBudgetExceededError as error:
    print("budget", error.retry_after > 0)
except Exception as error:
    print(type(error).__name__)
else:
    print("ok")
"""


def test_a_cron_storm_on_one_host_stops_at_the_budget(
    live_emulator: Emulator, tmp_path: Path
) -> None:
    """Six one-shot jobs at once on a local store, their tokens all refused by the API:
    two token requests in all, and the jobs past them fail at once, naming the budget."""
    emulator = live_emulator
    emulator.refuse_all_tokens = True
    (tmp_path / "tokens").mkdir(mode=0o700)
    environ = {
        **os.environ,
        **emulator.environ(),
        "SERVICE_TOKEN_STORE_URL": (tmp_path / "tokens").as_uri(),
        "SERVICE_TOKEN_STORE_TIMEOUT": str(SLOW_MACHINE),
    }
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", _CRON_JOB], env=environ, stdout=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    said = [job.communicate(timeout=HANG_GUARD)[0].strip() for job in jobs]
    assert emulator.counters.token_requests == 2
    assert said.count("budget True") >= 4
    assert set(said) <= {"budget True", "UnauthenticatedError"}


def test_a_refusal_remembered_is_logged_once_not_per_wave(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """The waves that meet a remembered refusal add no WARNING: the log says it once."""
    way = EVERY_WAY[0]
    transport = oauth2(way, emulator, client_secret="wrong-secret", token_budget=PATIENT)
    for _ in range(5):
        way.run(transport, calls(COUNT, 3))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split()[0] for r in warnings] == [
        "gql_service_auth.token_request_failed"
    ]


def test_a_spent_budget_is_told_once_per_window(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    emulator.refuse_all_tokens = True
    way = EVERY_WAY[0]
    transport = oauth2(way, emulator, token_budget=TokenBudget(requests=1, window=600.0))
    for _ in range(5):
        way.run(transport, calls(COUNT))
    told = [r for r in caplog.records if "token_budget_exhausted" in r.getMessage()]
    assert len(told) == 1


def test_a_refusal_of_the_old_secret_does_not_stop_the_new_one_on_a_store_key(
    emulator: Emulator, tmp_path: Path
) -> None:
    """With store_key, old and new secrets of a client id share the store's entries: a
    refusal kept there is the old secret's alone."""
    with LocalTokenStore(tmp_path / "store", store_key=b"k" * 32, timeout=SLOW_MACHINE) as store:
        way = EVERY_WAY[0]
        old = {"client_secret": "revoked-secret", "token_budget": PATIENT, "token_store": store}
        with pytest.raises(TokenRequestError, match="invalid_client"):
            way.one(oauth2(way, emulator, **old), Call(COUNT))
        _as_another_process()
        transport = oauth2(way, emulator, token_budget=PATIENT, token_store=store)
        assert way.one(transport, Call(COUNT)) == ANSWER
    assert emulator.counters.token_requests == 2


def test_refusals_of_fetches_in_flight_together_count_once(emulator: Emulator) -> None:
    """A wave of transports that share no token, refused together, waits the first
    back-off, not one doubled per transport."""
    way = EVERY_WAY[0]
    budget = TokenBudget(refusal_wait=30.0, refusal_wait_max=600.0)
    emulator.token_latency = 0.3  # all ten in flight at once
    transports = [
        oauth2(
            way, emulator, client_secret="wrong-secret", token_budget=budget, share_tokens=False
        )
        for _ in range(10)
    ]
    with ThreadPoolExecutor(10) as pool:
        outcomes = list(pool.map(lambda t: way.run(t, calls(COUNT))[0], transports))
    assert all(isinstance(o, TokenRequestError) for o in outcomes)
    with pytest.raises(TokenRequestError) as remembered:
        way.one(transports[0], Call(COUNT))
    wait = float(re.search(r"for ([0-9.]+) s more", str(remembered.value))[1])  # type: ignore[index]
    assert wait <= 30.0  # the first back-off; ten refusals in a row would be 600 s


class _OddStore(LocalTokenStore):
    """A store of one's own whose optional budget call answers in another shape."""

    async def admit(self, identity: Any, window: float | None) -> Any:
        return ("refused", 7)  # neither a refusal nor a count


def test_a_store_whose_budget_calls_answer_oddly_fails_no_fetch(
    emulator: Emulator, tmp_path: Path
) -> None:
    with _OddStore(tmp_path / "store", timeout=SLOW_MACHINE) as store:
        way = EVERY_WAY[0]
        assert way.one(oauth2(way, emulator, token_store=store), Call(COUNT)) == ANSWER


def test_a_wider_window_for_the_same_credentials_keeps_its_count(emulator: Emulator) -> None:
    """Budgets of other windows on the same credentials do not erase each other's count."""
    emulator.refuse_all_tokens = True
    way = EVERY_WAY[0]
    strict = oauth2(way, emulator, token_budget=TokenBudget(requests=2, window=600.0))
    loose = oauth2(
        way, emulator, token_budget=TokenBudget(requests=1000, window=0.001), share_tokens=False
    )
    for _ in range(3):
        way.run(loose, calls(COUNT))
    (outcome,) = way.run(strict, calls(COUNT))
    assert isinstance(outcome, TokenBudgetExceededError)


def test_another_secrets_refusal_on_a_store_key_leaves_the_fleet_count_on(
    emulator: Emulator, tmp_path: Path
) -> None:
    """A process of the old secret, refused, keeps its refusal for a while: the processes
    of the new secret are still counted against the budget (with store_key, the secrets
    of a client id share one count: the old secret's request is in it)."""
    emulator.refuse_all_tokens = True
    budget = TokenBudget(requests=2, window=600.0, refusal_wait=600.0, refusal_wait_max=600.0)
    with LocalTokenStore(tmp_path / "store", store_key=b"k" * 32, timeout=SLOW_MACHINE) as store:
        way = EVERY_WAY[0]
        old = {"client_secret": "revoked-secret", "token_budget": budget, "token_store": store}
        with pytest.raises(TokenRequestError, match="invalid_client"):
            way.one(oauth2(way, emulator, **old), Call(COUNT))
        for _ in range(4):
            _as_another_process()
            way.run(oauth2(way, emulator, token_budget=budget, token_store=store), calls(COUNT))
    assert emulator.counters.token_requests == 2
