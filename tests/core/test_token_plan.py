"""What the token manager does when asked for a token (gql_service_auth._core.plan), fed by
hand: one test per rule, in the module's order; no thread, no loop, no network."""

from __future__ import annotations

import pytest
from handfed import token

from gql_service_auth._core.ledger import Refusals, RenewalPaused
from gql_service_auth._core.plan import (
    FAIL,
    JOIN,
    SPENT,
    TAKE_OFF,
    State,
    Use,
    plan_after_failure,
    plan_get,
    plan_renewal,
    renews_landed,
)
from gql_service_auth._core.provenance import Origin
from gql_service_auth._core.token import AccessToken
from gql_service_auth.emulator import ManualClock

# A token of generation n lives 100 s from 0: renewed from 90, usable until 95.


def state(
    held: AccessToken | None = None,
    *,
    now: float = 10.0,
    flying: bool = False,
    generation: int | None = None,
    retry_at: float = 0.0,
    refusals: Refusals | None = None,
) -> State:
    return State(
        held,
        flying,
        generation if generation is not None else (held.generation if held else 0),
        now,
        retry_at,
        refusals
        or Refusals(cooldown=lambda n: 30.0 * n, weighs_provenance=False, clock=ManualClock(now)),
    )


def refused_twice(*, loaded_renewal: bool, now: float = 10.0) -> Refusals:
    """Token 1 refused, its renewal (2) landed (read from a store or fetched), then refused."""
    refusals = Refusals(cooldown=None, weighs_provenance=True, clock=ManualClock(now))
    one, two = token(1), token(2)
    refusals.refused(one, current=one, answer=None)
    origin = Origin(requested_at=5.0, replaces=None) if loaded_renewal else None
    refusals.landed(two, requested=5.0, origin=origin, in_hand=True)
    refusals.refused(two, current=two, answer=None)
    return refusals


# Rule 1: a token newer than the refused one, usable for min_ttl more, serves.


def test_a_usable_token_in_hand_serves() -> None:
    held = token(1)
    assert plan_get(state(held), min_ttl=0.0, after=0) == Use(held)
    assert plan_get(state(held), min_ttl=50.0, after=0) == Use(held)  # 90 s left


def test_the_refused_token_itself_never_serves_again() -> None:
    held = token(1)
    assert plan_get(state(held), min_ttl=0.0, after=1) == TAKE_OFF


def test_a_token_past_its_usable_end_does_not_serve() -> None:
    assert plan_get(state(token(1), now=96.0), min_ttl=0.0, after=0) == TAKE_OFF


# Rule 2: a fetch under way is joined.


def test_a_fetch_under_way_is_joined() -> None:
    assert plan_get(state(None, flying=True), min_ttl=0.0, after=0) == JOIN
    assert plan_get(state(token(1), flying=True), min_ttl=0.0, after=1) == JOIN


# Rule 3: more lifetime wished for while a failed renewal backs off: the token in hand.


def test_an_upload_gets_the_token_in_hand_while_a_failed_renewal_backs_off() -> None:
    held = token(1)
    backing_off = state(held, now=92.0, retry_at=93.0)
    assert plan_get(backing_off, min_ttl=20.0, after=0) == Use(held)


def test_an_upload_fetches_once_the_backoff_is_over() -> None:
    assert plan_get(state(token(1), now=94.0, retry_at=93.0), min_ttl=20.0, after=0) == TAKE_OFF


def test_an_upload_fetches_when_the_token_in_hand_is_the_refused_one() -> None:
    backing_off = state(token(1), now=92.0, retry_at=93.0)
    assert plan_get(backing_off, min_ttl=20.0, after=1) == TAKE_OFF


# Rule 4: the renewal after a refusal refused too spends the wave, unless read from a store.


def test_a_late_request_of_a_wave_whose_renewal_was_refused_is_spent() -> None:
    spent = state(None, generation=2, refusals=refused_twice(loaded_renewal=False))
    assert plan_get(spent, min_ttl=0.0, after=1) == SPENT


def test_a_renewal_read_from_a_store_leaves_the_wave_one_fetch() -> None:
    loaded = state(None, generation=2, refusals=refused_twice(loaded_renewal=True))
    assert plan_get(loaded, min_ttl=0.0, after=1) == TAKE_OFF


def test_the_request_refused_with_the_latest_token_renews() -> None:
    latest = state(None, generation=2, refusals=refused_twice(loaded_renewal=False))
    assert plan_get(latest, min_ttl=0.0, after=2) == TAKE_OFF
    assert plan_get(latest, min_ttl=0.0, after=0) == TAKE_OFF  # not told of a refusal


# Rule 5: renewals paused for refused fresh tokens fetch nothing.


def test_renewals_paused_for_refused_fresh_tokens_fetch_nothing() -> None:
    clock = ManualClock(10.0)
    refusals = Refusals(cooldown=lambda n: 30.0 * n, weighs_provenance=False, clock=clock)
    one = token(1)
    refusals.refused(one, current=one, answer=None)
    assert plan_get(
        state(None, generation=1, refusals=refusals), min_ttl=0.0, after=1
    ) == RenewalPaused(pytest.approx(30.0), 1)
    clock.advance(31.0)
    assert plan_get(state(None, generation=1, refusals=refusals), min_ttl=0.0, after=1) == TAKE_OFF


# Rule 6: else a fetch starts.


def test_the_first_caller_starts_a_fetch() -> None:
    assert plan_get(state(None), min_ttl=0.0, after=0) == TAKE_OFF


# After a fetch.


def test_a_failed_fetch_leaves_an_upload_the_usable_token_in_hand() -> None:
    held = token(1)
    assert plan_after_failure(state(held, now=92.0), min_ttl=20.0, after=0) == Use(held)


def test_a_failed_fetch_fails_a_caller_that_wished_for_no_more_lifetime() -> None:
    assert plan_after_failure(state(token(1), now=92.0), min_ttl=0.0, after=0) == FAIL


def test_a_failed_fetch_fails_when_nothing_usable_is_in_hand() -> None:
    assert plan_after_failure(state(token(1), now=96.0), min_ttl=20.0, after=0) == FAIL
    assert plan_after_failure(state(None), min_ttl=20.0, after=0) == FAIL


def test_a_landed_token_due_for_renewal_is_renewed_for_an_upload_once() -> None:
    landed = token(1)
    assert renews_landed(landed, min_ttl=20.0, now=91.0)
    assert not renews_landed(landed, min_ttl=0.0, now=91.0)  # no more lifetime wished for
    assert not renews_landed(landed, min_ttl=20.0, now=50.0)  # long enough left
    assert not renews_landed(landed, min_ttl=60.0, now=50.0)  # not yet due for renewal


def test_the_renewal_of_a_landed_token_is_joined_started_or_skipped() -> None:
    landed = token(1)
    assert plan_renewal(state(landed, now=91.0, flying=True), landed, after=0) == JOIN
    assert plan_renewal(state(landed, now=91.0), landed, after=0) == TAKE_OFF
    # A failed renewal backs off: the landed token, usable, is what there is.
    assert plan_renewal(state(landed, now=91.0, retry_at=92.0), landed, after=0) == Use(landed)
    # Another token replaced it meanwhile: that one, if usable; else the landed one.
    newer = token(2)
    assert plan_renewal(state(newer, now=91.0), landed, after=0) == Use(newer)
    assert plan_renewal(state(None, now=91.0), landed, after=0) == Use(landed)
