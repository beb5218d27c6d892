"""The renew-and-resend flow, driven by hand: no network, no event loop
(gql_service_auth._core.flow).

The asynchronous driver is run by a bare ``coroutine.send(None)`` loop, not by asyncio:
it must await only what the adapter gives it (the next issue runs it under trio).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import pytest

from gql_service_auth import AuthEvent, TokenRequestError
from gql_service_auth._core.flow import (
    Accepted,
    NeedToken,
    Outcome,
    Paused,
    Refused,
    Sent,
    Wait,
    drive_async,
    drive_sync,
    renewal_flow,
)
from gql_service_auth._core.ledger import NotNow, RenewalPaused, RenewalSpent
from gql_service_auth._core.refusal import (
    BARE_401,
    REFUSED_AGAIN_WHILE_RUNNING,
    Answer,
    RequestFacts,
)
from gql_service_auth._core.token import AccessToken, TokenResponse, access_token

OK = Sent(Answer.of_results([(None, {"x": 1})]), "ok")
REFUSED = Sent(Answer.of_results([([{"extensions": {"code": "UNAUTHENTICATED"}}], None)]), "no")
REFUSED_RUNNING = Sent(
    Answer.of_results([([{"extensions": {"code": "UNAUTHENTICATED"}, "path": ["a"]}], None)]),
    "ran",
)
QUERY = RequestFacts(query=True)
MUTATION = RequestFacts()


def token(generation: int) -> AccessToken:
    return access_token(
        TokenResponse(f"t{generation}", expires_in=3600),
        started=0.0,
        generation=generation,
        refresh_margin=60.0,
        default_expires_in=3600.0,
    )


class Ledger:
    """A token manager's bookkeeping, recorded."""

    def __init__(self, *, pause: float = 0.0, loaded: frozenset[int] = frozenset()) -> None:
        self.generation = 0
        self.calls: list[tuple[str, int]] = []
        self.pause = pause
        self.loaded_generations = loaded
        self.drop_again = True
        self.last_answer: object = None

    def confirm(self, token: AccessToken) -> None:
        self.calls.append(("confirm", token.generation))

    def invalidate(self, token: AccessToken, *, answer: object = None) -> bool:
        self.calls.append(("invalidate", token.generation))
        self.last_answer = answer
        return True

    def refused_while_running(self, token: AccessToken) -> bool:
        self.calls.append(("refused_while_running", token.generation))
        return self.drop_again

    def pause_remaining(self) -> float:
        return self.pause

    def loaded(self, token: AccessToken) -> bool:
        return token.generation in self.loaded_generations

    def expired(self, token: AccessToken) -> bool:
        return False


class Service:
    """Hands out tokens in sequence and answers sends from a script; records both."""

    def __init__(
        self, ledger: Ledger, answers: list[Sent[str]], tokens: list[object] | None = None
    ):
        self.ledger = ledger
        self.answers = iter(answers)
        self.tokens: Iterator[object] | None = iter(tokens) if tokens is not None else None
        self.needs: list[NeedToken] = []
        self.sent_with: list[int] = []
        self.waits: list[float] = []

    def get_token(self, need: NeedToken) -> AccessToken | NotNow:
        """The next token of the script: a token, what the manager hands out instead of
        one (a value), or an error it raises."""
        self.needs.append(need)
        reply = next(self.tokens) if self.tokens is not None else None
        if isinstance(reply, BaseException):
            raise reply
        if reply is None:
            self.ledger.generation += 1
            return token(self.ledger.generation)
        assert isinstance(reply, AccessToken | RenewalPaused | RenewalSpent)
        return reply

    def send(self, sent_token: AccessToken) -> Sent[str]:
        self.sent_with.append(sent_token.generation)
        return next(self.answers)

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


def run_sync(service: Service, flow: Any) -> Outcome[str]:
    return drive_sync(flow, get_token=service.get_token, send=service.send, sleep=service.sleep)


def run_without_a_loop(coroutine: Coroutine[Any, Any, Outcome[str]]) -> Outcome[str]:
    for _ in range(100):  # each await of a coroutine that never suspends: none at all
        try:
            coroutine.send(None)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
    raise AssertionError("the driver suspended: it awaited something it was not given")


def as_coroutine(call: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    async def call_async(*args: Any) -> Any:
        return call(*args)

    return call_async


def run_async(service: Service, flow: Any) -> Outcome[str]:
    return run_without_a_loop(
        drive_async(
            flow,
            get_token=as_coroutine(service.get_token),
            send=as_coroutine(service.send),
            sleep=as_coroutine(service.sleep),
        )
    )


DRIVERS = pytest.mark.parametrize("run", [run_sync, run_async], ids=["sync", "async"])


def flow(
    ledger: Ledger,
    facts: RequestFacts = QUERY,
    *,
    max_renewals: int = 2,
    first: tuple[AccessToken, Sent[str]] | None = None,
    events: list[AuthEvent] | None = None,
) -> Any:
    return renewal_flow(
        facts,
        ledger,
        max_renewals=max_renewals,
        min_ttl=1.5,
        emit=(events if events is not None else []).append,
        first=first,
    )


@DRIVERS
def test_a_first_send_accepted_confirms_its_token(run: Callable[..., Outcome[str]]) -> None:
    ledger = Ledger()
    service = Service(ledger, [OK])
    outcome = run(service, flow(ledger))
    assert isinstance(outcome, Accepted)
    assert outcome.raw == "ok"
    assert service.needs == [NeedToken(1.5, 0)]
    assert ledger.calls == [("confirm", 1)]


@DRIVERS
def test_a_refusal_renews_and_resends_with_a_newer_token(run: Callable[..., Outcome[str]]) -> None:
    ledger = Ledger()
    events: list[AuthEvent] = []
    service = Service(ledger, [REFUSED, OK])
    outcome = run(service, flow(ledger, events=events))
    assert isinstance(outcome, Accepted)
    assert outcome.token.generation == 2
    assert service.needs == [NeedToken(1.5, 0), NeedToken(1.5, 1)]
    assert service.sent_with == [1, 2]
    assert ledger.calls == [("invalidate", 1), ("confirm", 2)]
    assert [(e.name, e.attempt, e.max_attempts, e.wait) for e in events] == [
        ("request_retry_scheduled", 1, 3, 0.0)
    ]
    assert service.waits == [0.0]  # yields to others once, as a pause of 0


@DRIVERS
def test_renewals_are_bounded_by_max_renewals(run: Callable[..., Outcome[str]]) -> None:
    ledger = Ledger()
    service = Service(ledger, [REFUSED] * 10)
    outcome = run(service, flow(ledger, max_renewals=2))
    assert isinstance(outcome, Refused)
    assert (outcome.reason, outcome.renewals, outcome.last) == (None, 2, REFUSED)
    assert service.sent_with == [1, 2, 3]


@DRIVERS
def test_max_renewals_0_never_resends(run: Callable[..., Outcome[str]]) -> None:
    ledger = Ledger()
    service = Service(ledger, [REFUSED])
    outcome = run(service, flow(ledger, max_renewals=0))
    assert isinstance(outcome, Refused)
    assert outcome.reason is None
    assert service.sent_with == [1]


@DRIVERS
def test_a_send_made_already_is_judged_without_sending_again(
    run: Callable[..., Outcome[str]],
) -> None:
    ledger = Ledger()
    service = Service(ledger, [OK])
    outcome = run(service, flow(ledger, first=(token(7), REFUSED)))
    assert isinstance(outcome, Accepted)
    assert service.needs == [NeedToken(1.5, 7)]
    assert ledger.calls[0] == ("invalidate", 7)


@DRIVERS
def test_a_mutation_refused_while_it_ran_ends_with_the_reason(
    run: Callable[..., Outcome[str]],
) -> None:
    ledger = Ledger()
    service = Service(ledger, [REFUSED_RUNNING])
    outcome = run(service, flow(ledger, MUTATION))
    assert isinstance(outcome, Refused)
    assert outcome.dropped
    assert (
        outcome.reason == "the service refused it while it ran, so it may have changed something"
    )
    assert ledger.calls == [("refused_while_running", 1)]


@DRIVERS
def test_a_query_refused_again_while_running_keeps_its_renewed_token(
    run: Callable[..., Outcome[str]],
) -> None:
    ledger = Ledger()
    ledger.drop_again = False
    service = Service(ledger, [REFUSED_RUNNING])
    outcome = run(service, flow(ledger, QUERY))
    assert isinstance(outcome, Refused)
    assert (outcome.reason, outcome.dropped) == (REFUSED_AGAIN_WHILE_RUNNING, False)


@DRIVERS
def test_paused_renewals_end_the_call_before_any_send(run: Callable[..., Outcome[str]]) -> None:
    ledger = Ledger()
    service = Service(ledger, [], tokens=[RenewalPaused(2.5, 3)])
    outcome = run(service, flow(ledger))
    assert outcome == Paused(refusals=3, remaining=2.5)
    assert service.sent_with == []


@DRIVERS
def test_a_spent_renewal_counts_as_an_attempt_unsent(run: Callable[..., Outcome[str]]) -> None:
    ledger = Ledger()
    ledger.generation = 5
    service = Service(ledger, [REFUSED], tokens=[token(1), RenewalSpent(), RenewalSpent()])
    outcome = run(service, flow(ledger, max_renewals=2))
    assert isinstance(outcome, Refused)
    assert outcome.reason is None
    assert service.sent_with == [1]
    # After a spent renewal, only a token newer than the manager's newest will do.
    assert [n.newer_than for n in service.needs] == [0, 1, 5]


@DRIVERS
def test_the_pause_is_waited_out_before_each_resend(run: Callable[..., Outcome[str]]) -> None:
    ledger = Ledger(pause=4.0)
    events: list[AuthEvent] = []
    service = Service(ledger, [REFUSED, OK])
    run(service, flow(ledger, events=events))
    assert service.waits == [4.0]
    assert events[0].wait == 4.0


@DRIVERS
def test_a_refused_token_read_from_a_store_earns_one_more_send_once(
    run: Callable[..., Outcome[str]],
) -> None:
    ledger = Ledger(loaded=frozenset({2, 3}))
    events: list[AuthEvent] = []
    service = Service(ledger, [REFUSED] * 10)
    outcome = run(service, flow(ledger, max_renewals=1, events=events))
    assert isinstance(outcome, Refused)
    assert service.sent_with == [1, 2, 3]  # max_renewals + 2, not more
    assert [e.max_attempts for e in events] == [2, 3]


@DRIVERS
def test_what_a_bare_401_keeps_is_kept_with_the_token_it_dropped(
    run: Callable[..., Outcome[str]],
) -> None:
    """What the stack keeps of a bare 401 (detached from the exchange), never its raw
    answer: a live response leads back to the transport, and holds the token."""
    ledger = Ledger()
    service = Service(ledger, [Sent(BARE_401, "401 response", kept="401 detached"), OK])
    run(service, flow(ledger))
    assert ledger.last_answer == "401 detached"
    ledger = Ledger()
    run(Service(ledger, [Sent(BARE_401, "401 response"), OK]), flow(ledger))
    assert ledger.last_answer is None


@DRIVERS
def test_a_token_error_ends_the_flow_and_closes_it(run: Callable[..., Outcome[str]]) -> None:
    ledger = Ledger()
    service = Service(ledger, [REFUSED], tokens=[token(1), TokenRequestError("down")])
    generator = flow(ledger)
    with pytest.raises(TokenRequestError, match="down"):
        run(service, generator)
    assert generator.gi_frame is None  # closed: nothing left suspended


def test_the_flow_asks_for_what_it_needs_as_plain_values() -> None:
    ledger = Ledger()
    steps = flow(ledger, first=(token(1), REFUSED))
    assert steps.send(None) == Wait(0.0)
    assert steps.send(None) == NeedToken(1.5, 1)
    command = steps.send(token(2))
    assert command.token.generation == 2  # type: ignore[union-attr]
    with pytest.raises(StopIteration) as done:
        steps.send(OK)
    assert isinstance(done.value.value, Accepted)


@DRIVERS
def test_the_callers_own_authorization_refused_keeps_our_token(
    run: Callable[..., Outcome[str]],
) -> None:
    ledger = Ledger()
    service = Service(ledger, [REFUSED])
    outcome = run(service, flow(ledger, RequestFacts(own_authorization=True)))
    assert isinstance(outcome, Refused)
    assert not outcome.dropped
    assert ledger.calls == []
    assert service.sent_with == [1]


@DRIVERS
def test_a_resend_refused_while_running_as_a_mutation_ends_there(
    run: Callable[..., Outcome[str]],
) -> None:
    ledger = Ledger()
    service = Service(ledger, [REFUSED, REFUSED_RUNNING])
    outcome = run(service, flow(ledger, MUTATION, max_renewals=5))
    assert isinstance(outcome, Refused)
    assert outcome.reason is not None
    assert service.sent_with == [1, 2]
