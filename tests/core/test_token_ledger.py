"""The token manager's ledger (gql_service_auth._core.ledger), fed by hand: no network, no
thread."""

from __future__ import annotations

import pytest
from handfed import token

from gql_service_auth._core.ledger import Refusals, RenewalFailures


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ledger(clock: Clock, *, cooldown: float | None = 30.0) -> Refusals:
    return Refusals(
        cooldown=(lambda n: cooldown * n) if cooldown is not None else None,
        weighs_provenance=False,
        clock=clock,
    )


def test_only_the_token_in_hand_is_dropped_when_refused() -> None:
    refusals = ledger(Clock())
    one, two = token(1), token(2)
    assert refusals.refused(one, current=one, answer="401")
    assert refusals.renewing_after_refusal
    assert refusals.refused_token is one
    assert not refusals.refused(one, current=two, answer=None)  # replaced already
    assert refusals.answer is None  # the latest refusal's kind, dropped or not


def test_a_refusal_of_either_kind_after_one_of_the_other_drops_nothing_more() -> None:
    """A bare 401 (``answer`` the status) after a refusal in a body (``None``), and the
    other way round: the token they refused is replaced already, whatever the kind."""
    for first, late in (("401", None), (None, "401")):
        refusals = ledger(Clock())
        one, two = token(1), token(2)
        assert refusals.refused(one, current=one, answer=first)
        assert not refusals.refused(one, current=two, answer=late)
        assert refusals.answer == late


def test_refused_fresh_tokens_pause_renewals_until_an_answer_accepts_one() -> None:
    clock = Clock()
    refusals = ledger(clock)
    for generation in (1, 2, 3):
        held = token(generation)
        refusals.refused(held, current=held, answer=None)
    assert refusals.unconfirmed_refusals == 3
    assert refusals.pause_remaining() == pytest.approx(90.0)
    clock.now += 60.0
    assert refusals.pause_remaining() == pytest.approx(30.0)
    refusals.confirm(3)
    assert (refusals.confirmed, refusals.unconfirmed_refusals) == (3, 0)
    assert refusals.pause_remaining() == 0.0


def test_a_new_ledger_goes_on_from_the_pause_an_earlier_one_left() -> None:
    clock = Clock()
    first = ledger(clock)
    for generation in (1, 2):
        held = token(generation)
        first.refused(held, current=held, answer="401")
    pause = first.pause()
    assert pause is not None
    assert "t2" not in repr(pause)  # counts and times: no token
    second = ledger(clock)  # a new manager's, whose generations start again
    second.resume(pause)
    assert second.renewing_after_refusal
    assert second.answer == "401"
    assert second.pause_remaining() == pytest.approx(60.0)
    clock.now += 60.0
    held = token(1)
    second.refused(held, current=held, answer=None)  # its first token, refused as well
    assert second.unconfirmed_refusals == 3
    assert second.pause_remaining() == pytest.approx(90.0)


def test_no_pause_is_left_once_a_token_is_in_hand_again() -> None:
    refusals = ledger(Clock())
    one = token(1)
    assert refusals.pause() is None
    refusals.refused(one, current=one, answer=None)
    assert refusals.pause() is not None
    refusals.landed(token(2), requested=0.0, origin=None, in_hand=True)
    assert refusals.pause() is None


def test_a_refusal_of_an_accepted_token_never_pauses() -> None:
    refusals = ledger(Clock())
    one = token(1)
    refusals.confirm(1)
    refusals.refused(one, current=one, answer=None)
    assert refusals.unconfirmed_refusals == 0
    assert refusals.pause_remaining() == 0.0


def test_no_cooldown_never_pauses() -> None:
    refusals = ledger(Clock(), cooldown=None)
    one = token(1)
    refusals.refused(one, current=one, answer=None)
    assert refusals.pause_remaining() == 0.0


def test_a_running_refusal_renews_once_then_keeps_the_renewed_token() -> None:
    refusals = ledger(Clock())
    one, two = token(1), token(2)
    assert refusals.refused_while_running(one, current=one) == (True, True)
    assert refusals.next_token_answers_running_refusal
    refusals.landed(two, requested=0.0, origin=None, in_hand=True)
    refusals.fetch_ended()
    assert refusals.generation_renewed_for_running_refusal == 2
    assert not refusals.renewing_after_refusal
    # The renewed token refused the same way before any answer accepted it: kept.
    assert refusals.refused_while_running(two, current=two) == (False, False)
    # Once an answer accepted it, it may have expired in its turn: renewed again.
    refusals.confirm(2)
    assert refusals.refused_while_running(two, current=two) == (True, True)


def test_a_running_refusal_of_a_replaced_token_may_help_but_drops_nothing() -> None:
    refusals = ledger(Clock())
    assert refusals.refused_while_running(token(1), current=token(2)) == (True, False)


def test_a_fetch_that_fails_leaves_no_renewal_marked_for_a_running_refusal() -> None:
    refusals = ledger(Clock())
    one = token(1)
    refusals.refused_while_running(one, current=one)
    refusals.fetch_ended()
    refusals.landed(token(2), requested=0.0, origin=None, in_hand=True)
    assert refusals.generation_renewed_for_running_refusal == 0


def test_only_recent_generations_are_remembered() -> None:
    refusals = ledger(Clock())
    for generation in range(1, 10):
        refusals.landed(token(generation), requested=float(generation), origin=None, in_hand=True)
    assert not refusals.loaded(token(9))  # fetched here, not read from a store
    assert refusals.standing(token(9)) == "newer"


def test_failed_renewals_back_off_and_stay_before_the_end_of_the_token() -> None:
    failures = RenewalFailures(lambda n: 5.0 * n)
    held = token(1, lifetime=100.0)  # usable until 95 (a guard of 5 s)
    left, wait, count = failures.failed(held, 50.0)  # type: ignore[misc]
    assert (left, wait, count) == (50.0, 5.0, 1)
    assert failures.next_at == 55.0
    _, wait, count = failures.failed(held, 85.0)  # type: ignore[misc]
    assert (wait, count) == (5.0, 2)  # 10 s of backoff, but only 10 s of use left: half
    failures.succeeded()
    assert (failures.count, failures.next_at) == (0, 0.0)


def test_a_failed_renewal_without_a_usable_token_is_a_requests_failure() -> None:
    failures = RenewalFailures()
    assert failures.failed(None, 0.0) is None
    assert failures.failed(token(1, lifetime=10.0), 10.0) is None
    assert failures.count == 0


def test_the_first_refusal_of_a_token_is_the_one_weighed_against_a_store() -> None:
    clock = Clock()
    refusals = Refusals(cooldown=None, weighs_provenance=True, real_time=clock)
    one = token(1)
    refusals.landed(one, requested=990.0, origin=None, in_hand=True)
    refusals.refused(one, current=one, answer=None)
    first = refusals.latest
    assert first is not None
    assert (first.at, first.requested_at) == (1000.0, 990.0)
    clock.now += 5.0
    refusals.refused_while_running(one, current=None)  # a late refusal of the same token
    assert refusals.latest is first


def test_the_default_renewal_backoff_doubles_up_to_five_minutes() -> None:
    failures = RenewalFailures()
    held = token(1, lifetime=10_000.0)
    waits = [failures.failed(held, 0.0)[1] for _ in range(8)]  # type: ignore[index]
    assert waits == [5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
