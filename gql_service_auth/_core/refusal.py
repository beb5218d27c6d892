"""The refusal rules: is an answer a refusal of the credentials, and may the request go again?

No I/O and no HTTP stack: an adapter reads the service's answer into an :class:`Answer`,
describes its request as :class:`RequestFacts`, and :func:`judge` returns a
:class:`Verdict`. The same rules then hold for every stack, and the unit tests feed them
answers by hand (``tests/core/test_refusal.py``).

The rules, from the service's contract (``UNAUTHENTICATED`` in ``extensions.code``):

1. An answer refuses the credentials when an error of it carries ``UNAUTHENTICATED``,
   or when it is an HTTP 401 without a GraphQL body.
2. A refused request goes again only when nothing of it can have run: no error has a
   ``path`` (GraphQL gives one to errors raised while a field resolved), the answer
   carries no ``data``, and the body can be sent twice (an upload's streams cannot). A
   query refused while it ran may go again: it has no side effects.
3. A refusal that came while the operation ran says less about the token (the API took
   it to start the operation), so the token manager drops such a token only once.
4. A request that carried the caller's own ``Authorization`` was refused for that
   header: our token is neither dropped nor renewed, and the request not sent again.
5. A refusal that came back through a redirect is not the answer to the request sent:
   the server answered that one with the redirect, so it ran, and it never goes again.
   The refusal is the answer to the request the redirect led to, which an adapter that
   can send that request alone (requests, httpx) judges as a request of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from .constants import MAX_SERVER_TEXT, UNAUTHENTICATED


def api_key_advice(instead: str) -> str:
    """What to do about a refused API key; ``instead`` names the OAuth2 class of the stack."""
    return (
        "Either client_id or client_secret is wrong, or the credentials were registered "
        f"before 2024-05-13: such credentials cannot be used as an API key. Use {instead} "
        "with the same credentials, or create new credentials in the console to use the API key"
    )


_CHECK_ENVIRONMENT: Final = (
    "check that url and token_url belong to the same environment (SERVICE_BASE_URL, "
    "SERVICE_AUTH_URL) and that the credentials' project may use the API"
)


def is_refusal(errors: object) -> bool:
    """Whether a GraphQL ``errors`` member refuses the credentials.

    Tolerates any shape: the member is only trusted where it is a list of objects.
    """
    if not isinstance(errors, list):
        return False
    for error in errors:
        if isinstance(error, Mapping):
            extensions = error.get("extensions")
            if isinstance(extensions, Mapping) and extensions.get("code") == UNAUTHENTICATED:
                return True
    return False


def refusal_message(errors: object) -> str | None:
    """The ``message`` of the first refusal in ``errors``, shortened; ``None`` if it has none."""
    for error in errors if isinstance(errors, list) else ():
        if is_refusal([error]):
            message = error.get("message")
            if isinstance(message, str) and message.strip():
                message = message.strip()
                if len(message) > MAX_SERVER_TEXT:
                    message = message[:MAX_SERVER_TEXT] + "..."
                return message
    return None


def during_execution(errors: object) -> bool:
    """Whether an error was raised while the operation ran: it has a ``path``.

    GraphQL gives a field error the path of its field; an error raised before execution
    (a refused token, a syntax error) has none. A field error on a non-null field reaches
    the root, so an operation that ran side effects can still answer ``data: null``.
    """
    # Any path at all counts, whatever its shape: a wrong guess here re-runs a mutation.
    return isinstance(errors, list) and any(
        isinstance(error, Mapping) and error.get("path") is not None for error in errors
    )


@dataclass(frozen=True, slots=True)
class Answer:
    """What the decision needs to know of an answer (one result, or a batch's results).

    Attributes:
        parts: The results in it: 1 for a single request, the batch's size otherwise.
        refusals: How many of them refuse the credentials.
        ran: Some error was raised while an operation ran (it has a ``path``).
        data: Some result carries ``data``.
        bare_401: An HTTP 401 without a GraphQL body: refused before anything ran.
        redirected: It came back through a redirect: it answers the request the
            redirect led to, not the request sent, which the server answered (rule 5).
    """

    parts: int
    refusals: int
    ran: bool
    data: bool
    bare_401: bool = False
    redirected: bool = False

    @classmethod
    def of_results(cls, results: Iterable[tuple[object, object]]) -> Answer:
        """The answer made of GraphQL results, each given as its ``(errors, data)``."""
        parts = refusals = 0
        ran = data = False
        for errors, result_data in results:
            parts += 1
            refusals += is_refusal(errors)
            ran = ran or during_execution(errors)
            data = data or result_data is not None
        return cls(parts, refusals, ran, data)

    @property
    def refused(self) -> bool:
        """Whether the credentials were refused, by any part of it."""
        return self.bare_401 or self.refusals > 0


BARE_401: Final = Answer(parts=1, refusals=1, ran=False, data=False, bare_401=True)
"""An HTTP 401 without a GraphQL body (a single request's or a batch's)."""


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the decision needs to know of the request that was answered.

    Attributes:
        query: Its one operation is a query, which has no side effects.
        batch: It is a batch of operations.
        replayable: Its body can be sent twice (bytes; not an upload's file streams).
        own_authorization: It carried the caller's own ``Authorization`` header.
    """

    query: bool = False
    batch: bool = False
    replayable: bool = True
    own_authorization: bool = False


class Action(enum.Enum):
    """What to do with an answer."""

    ACCEPT = "accept"
    """Hand it to the caller: it refuses nothing."""
    RESEND = "resend"
    """Renew the token and send the request again, if the bounds allow."""
    FAIL = "fail"
    """End the request with an error: it was refused and must not be sent again."""


class TokenFate(enum.Enum):
    """What the answer says of the token it was sent with."""

    CONFIRM = "confirm"
    """Accepted: refusals of fresh tokens stop counting."""
    DROP = "drop"
    """Refused before anything ran: drop it (the first request refused with it renews)."""
    DROP_ONCE = "drop_once"
    """Refused while the operation ran: dropped once, in case it expired as it ran."""
    KEEP = "keep"
    """Not ours to judge: the request carried the caller's own ``Authorization``."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision on one answer.

    Attributes:
        action: Accept, re-send or fail.
        token: What becomes of the token the request was sent with.
        reason: Why the request must not be sent again (``FAIL`` only), as the end of
            a sentence: "the request was not sent again because ...".
    """

    action: Action
    token: TokenFate
    reason: str | None = None


ACCEPT: Final = Verdict(Action.ACCEPT, TokenFate.CONFIRM)


def judge(request: RequestFacts, answer: Answer) -> Verdict:
    """The decision on ``answer``, given what the request was (see the module's rules)."""
    if not answer.refused:
        return ACCEPT
    if request.own_authorization:
        return Verdict(
            Action.FAIL, TokenFate.KEEP, "it carried the caller's own Authorization header"
        )
    fate = TokenFate.DROP_ONCE if answer.ran else TokenFate.DROP
    if answer.redirected:
        return Verdict(Action.FAIL, fate, REDIRECTED)
    if request.batch:
        return _batch_verdict(answer, fate)
    if not request.replayable:
        return Verdict(
            Action.FAIL, fate, "it uploads files, whose streams were consumed by the first send"
        )
    if answer.bare_401:
        return Verdict(Action.RESEND, fate)
    if answer.ran:
        # A query has no side effects and may run again; a mutation (or a subscription)
        # may have changed something already.
        if request.query:
            return Verdict(Action.RESEND, fate)
        return Verdict(
            Action.FAIL,
            fate,
            "the service refused it while it ran, so it may have changed something",
        )
    if answer.data:
        return Verdict(Action.FAIL, fate, "the answer carried data, so part of it may have run")
    return Verdict(Action.RESEND, fate)


def _batch_verdict(answer: Answer, fate: TokenFate) -> Verdict:
    """A refused batch goes again only when none of its operations can have run."""
    if answer.bare_401:
        return Verdict(Action.RESEND, fate)
    if answer.refusals == answer.parts and not (answer.data or answer.ran):
        return Verdict(Action.RESEND, fate)
    return Verdict(Action.FAIL, fate, "part of the batch may have run")


# The messages of the errors that end a refused request, for every stack.

REDIRECTED: Final = (
    "the service answered it with a redirect, so it ran; the refusal came from the "
    "request the redirect led to"
)
"""Why a request whose answer was a redirect is not sent again (rule 5)."""

REFUSED_AGAIN_WHILE_RUNNING: Final = (
    "the service refused it while it ran, with a token already renewed for that very "
    "reason: the refusal is about the operation, not the token"
)
"""Why a query refused while it ran is not sent a second time with a renewed token."""

SUBSCRIPTION: Final = "it is a subscription, whose stream is never sent twice"
"""Why a refused subscription is not sent again."""


def how(answer: Answer) -> str:
    """How the refusal came: ``"HTTP 401"`` or ``"UNAUTHENTICATED"``."""
    return "HTTP 401" if answer.bare_401 else "UNAUTHENTICATED"


def exhausted_message(answer: Answer, renewals: int, expired_after: float | None = None) -> str:
    """The message of a request refused again after ``renewals`` renewals.

    ``expired_after``: the last token had expired when it was refused, this many seconds
    after it was issued; the advice is then about the wait, not the environment.
    """
    if expired_after is not None:
        return (
            f"the service refused the access token ({how(answer)}) after {renewals} "
            f"renewal(s): each time, the token had expired before the service read the "
            f"request, which waited longer than the token lives ({expired_after:g} s), in "
            "the client's connection pool or on the network. Send fewer requests at once "
            "(a semaphore, or a smaller pool), or ask the authorization server for "
            "longer-lived tokens"
        )
    return (
        f"the service refused the access token ({how(answer)}) after {renewals} renewal(s). "
        "The authorization server issues tokens the API does not accept: "
        f"{_CHECK_ENVIRONMENT}"
    )


def not_resent_message(answer: Answer, why: str, *, dropped: bool) -> str:
    """The message of a refused request that was not sent again because ``why``."""
    token = (
        "The token was dropped, so calling again uses a new one"
        if dropped
        else "The token was kept: the service accepts it for other operations"
    )
    return (
        f"the service refused the access token ({how(answer)}); the request was not sent "
        f"again because {why}. {token}"
    )


def paused_message(refusals: int, remaining: float) -> str:
    """The message of a call that fails at once while renewals are paused."""
    return (
        f"the service refused the last {refusals} access tokens before accepting any "
        f"request with them; renewals are paused for {remaining:.1f} s to spare the "
        f"authorization server. {_CHECK_ENVIRONMENT[0].upper()}{_CHECK_ENVIRONMENT[1:]}"
    )


def api_key_message(answer: Answer, said: str | None, instead: str = "OAuth2Transport") -> str:
    """The message of a refused API key; ``said`` is the service's own message, if any.

    ``instead`` is the class to use in its place: the OAuth2 class of the same stack.
    """
    if answer.bare_401:
        return f"the service refused the API key (HTTP 401). {api_key_advice(instead)}"
    # What the service said tells a wrong secret from the 2024-05-13 rule; the message
    # must say it, since most people read only the message.
    message = "the service refused the API key (UNAUTHENTICATED)"
    if said is not None:
        message += f"; server said: {said!r}"
    return f"{message}. {api_key_advice(instead)}"
