"""The refusal rules (gql_service_auth._core.refusal), fed answers by hand: no network, no loop."""

from __future__ import annotations

import dataclasses

import pytest

from gql_service_auth._core.refusal import (
    ACCEPT,
    BARE_401,
    REDIRECTED,
    Action,
    Answer,
    RequestFacts,
    TokenFate,
    api_key_advice,
    api_key_message,
    exhausted_message,
    is_refusal,
    judge,
    not_resent_message,
    paused_message,
    refusal_message,
)

REFUSAL = {"message": "token expired", "extensions": {"code": "UNAUTHENTICATED"}}
FIELD_REFUSAL = {**REFUSAL, "path": ["me"]}
OTHER = {"message": "boom", "extensions": {"code": "INTERNAL"}}

MAY_HAVE_CHANGED = "the service refused it while it ran, so it may have changed something"
QUERY = RequestFacts(query=True)
MUTATION = RequestFacts(query=False)
UPLOAD = RequestFacts(replayable=False)
BATCH = RequestFacts(batch=True)


def one(errors: object, data: object = None) -> Answer:
    return Answer.of_results([(errors, data)])


@pytest.mark.parametrize(
    "errors",
    [None, [], [OTHER], "UNAUTHENTICATED", [None, 3, "x"], [{"extensions": "UNAUTHENTICATED"}]],
)
def test_an_answer_without_unauthenticated_is_accepted_and_confirms_the_token(
    errors: object,
) -> None:
    assert judge(MUTATION, one(errors, {"x": 1})) is ACCEPT
    assert ACCEPT.action is Action.ACCEPT
    assert ACCEPT.token is TokenFate.CONFIRM


def test_a_refusal_before_execution_drops_the_token_and_resends() -> None:
    verdict = judge(MUTATION, one([REFUSAL]))
    assert (verdict.action, verdict.token, verdict.reason) == (Action.RESEND, TokenFate.DROP, None)


def test_a_bare_401_is_a_refusal_before_anything_ran() -> None:
    assert BARE_401.refused
    assert not BARE_401.ran
    verdict = judge(MUTATION, BARE_401)
    assert (verdict.action, verdict.token) == (Action.RESEND, TokenFate.DROP)
    assert judge(BATCH, BARE_401).action is Action.RESEND


def test_a_mutation_refused_while_it_ran_is_not_resent() -> None:
    verdict = judge(MUTATION, one([FIELD_REFUSAL]))
    assert (verdict.action, verdict.token) == (Action.FAIL, TokenFate.DROP_ONCE)
    assert (
        verdict.reason == "the service refused it while it ran, so it may have changed something"
    )


def test_a_query_refused_while_it_ran_is_resent_and_its_token_dropped_once() -> None:
    verdict = judge(QUERY, one([FIELD_REFUSAL]))
    assert (verdict.action, verdict.token) == (Action.RESEND, TokenFate.DROP_ONCE)


def test_any_error_with_a_path_counts_as_having_run() -> None:
    answer = one([REFUSAL, {"message": "x", "path": []}])
    assert answer.ran
    assert judge(MUTATION, answer).action is Action.FAIL


def test_a_refusal_that_carried_data_is_not_resent() -> None:
    verdict = judge(QUERY, one([REFUSAL], {"me": None}))
    assert (verdict.action, verdict.token) == (Action.FAIL, TokenFate.DROP)
    assert verdict.reason == "the answer carried data, so part of it may have run"


def test_an_upload_is_never_resent() -> None:
    reason = "it uploads files, whose streams were consumed by the first send"
    for answer, fate in ((one([REFUSAL]), TokenFate.DROP), (BARE_401, TokenFate.DROP)):
        verdict = judge(UPLOAD, answer)
        assert (verdict.action, verdict.token, verdict.reason) == (Action.FAIL, fate, reason)
    assert judge(UPLOAD, one([FIELD_REFUSAL])).token is TokenFate.DROP_ONCE


def test_the_callers_own_authorization_is_neither_dropped_nor_resent() -> None:
    facts = RequestFacts(query=True, own_authorization=True)
    verdict = judge(facts, one([REFUSAL]))
    assert (verdict.action, verdict.token) == (Action.FAIL, TokenFate.KEEP)
    assert verdict.reason == "it carried the caller's own Authorization header"
    assert judge(facts, one(None, {"x": 1})) is ACCEPT


@pytest.mark.parametrize("facts", [QUERY, MUTATION, BATCH, UPLOAD])
def test_a_refusal_that_came_back_through_a_redirect_is_not_resent(facts: RequestFacts) -> None:
    """The server answered the request sent with a redirect: it ran, whatever it was."""
    for answer in (one([REFUSAL]), BARE_401):
        redirected = dataclasses.replace(answer, redirected=True)
        verdict = judge(facts, redirected)
        assert (verdict.action, verdict.token) == (Action.FAIL, TokenFate.DROP)
        assert verdict.reason == REDIRECTED
    assert judge(QUERY, dataclasses.replace(one(None, {"x": 1}), redirected=True)) is ACCEPT


def test_a_batch_refused_whole_before_execution_is_resent() -> None:
    answer = Answer.of_results([([REFUSAL], None), ([REFUSAL], None)])
    assert (answer.parts, answer.refusals) == (2, 2)
    verdict = judge(BATCH, answer)
    assert (verdict.action, verdict.token) == (Action.RESEND, TokenFate.DROP)


@pytest.mark.parametrize(
    "results",
    [
        [([REFUSAL], None), (None, {"x": 1})],  # one part ran
        [([REFUSAL], None), ([REFUSAL], {"x": 1})],  # data
        [([REFUSAL], None), ([FIELD_REFUSAL], None)],  # refused while running
    ],
)
def test_a_batch_part_of_which_may_have_run_is_not_resent(
    results: list[tuple[object, object]],
) -> None:
    verdict = judge(BATCH, Answer.of_results(results))
    assert verdict.action is Action.FAIL
    assert verdict.reason == "part of the batch may have run"


def test_a_batch_refused_while_running_drops_its_token_once() -> None:
    answer = Answer.of_results([([FIELD_REFUSAL], None)])
    assert judge(BATCH, answer).token is TokenFate.DROP_ONCE


def test_is_refusal_trusts_only_a_list_of_objects() -> None:
    assert is_refusal([OTHER, REFUSAL])
    assert not is_refusal({"extensions": {"code": "UNAUTHENTICATED"}})
    assert not is_refusal([{"extensions": {"code": "unauthenticated"}}])


def test_the_servers_refusal_message_is_quoted_shortened() -> None:
    assert refusal_message([OTHER, REFUSAL]) == "token expired"
    assert refusal_message([{"extensions": {"code": "UNAUTHENTICATED"}, "message": "  "}]) is None
    assert refusal_message("nope") is None
    long = refusal_message([{**REFUSAL, "message": "x" * 1000}])
    assert long is not None
    assert long.endswith("...")
    assert len(long) < 1000


def test_the_messages_say_how_the_refusal_came_and_what_to_do() -> None:
    body = one([REFUSAL])
    assert exhausted_message(body, 2).startswith(
        "the service refused the access token (UNAUTHENTICATED) after 2 renewal(s)."
    )
    assert "(HTTP 401)" in exhausted_message(BARE_401, 1)
    assert not_resent_message(body, "why", dropped=True).endswith(
        "not sent again because why. The token was dropped, so calling again uses a new one"
    )
    assert "The token was kept" in not_resent_message(body, "why", dropped=False)
    paused = paused_message(3, 2.25)
    assert "the last 3 access tokens" in paused
    assert "paused for 2.2 s" in paused
    assert ". Check that url and token_url" in paused
    advice = api_key_advice("OAuth2Transport")
    assert api_key_message(body, "bad key").endswith(f"server said: 'bad key'. {advice}")
    assert api_key_message(body, None).endswith(f"(UNAUTHENTICATED). {advice}")
    assert "Use OAuth2HTTPXTransport " in api_key_message(body, None, "OAuth2HTTPXTransport")
    assert api_key_message(BARE_401, None).startswith(
        "the service refused the API key (HTTP 401)."
    )
