"""The bounded renew-and-resend flow, written once, as a generator of commands.

:func:`renewal_flow` decides; a driver does what it says. It yields a command and is sent
the reply:

- :class:`NeedToken` -> an ``AccessToken``, or what the token manager hands out instead
  (``RenewalPaused``, ``RenewalSpent``: values, as it returns them);
- :class:`Send` -> :class:`Sent`, the answer to the request sent with that token;
- :class:`Wait` -> ``None``, once the seconds have passed.

It returns an :data:`Outcome`. :func:`drive_async` and :func:`drive_sync` carry the
commands out with the callables an adapter gives them; neither knows an HTTP stack, and
the asynchronous one awaits only what it is given, so it runs under any event loop
library (the adapter passes its ``sleep``). The token manager is called directly for the
bookkeeping that does no I/O (confirm, drop, pause), as the ``tokens`` argument.

The bound: a request is sent at most ``max_renewals`` + 1 times, plus one send, once,
when a re-send's token was read from a shared store and is refused too (a revocation
that this process could not see may have covered it; a fresh fetch follows).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

from .events import AuthEvent
from .ledger import NotNow, RenewalPaused, RenewalSpent
from .refusal import (
    REFUSED_AGAIN_WHILE_RUNNING,
    Action,
    Answer,
    RequestFacts,
    TokenFate,
    judge,
)
from .token import AccessToken

_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class NeedToken:
    """Get a token valid ``min_ttl`` seconds more, and newer than generation ``newer_than``."""

    min_ttl: float
    newer_than: int


@dataclass(frozen=True, slots=True)
class Send:
    """Send the request with ``token``; reply with :class:`Sent`."""

    token: AccessToken


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait ``seconds`` (renewals are paused) before going on; 0 yields to others once."""

    seconds: float


Command = NeedToken | Send | Wait


@dataclass(frozen=True, slots=True)
class Sent(Generic[_R]):
    """An answer as the decision reads it, and as the stack gave it (``raw``).

    ``kept`` is what of a bare 401 may outlive the exchange: the token manager keeps it,
    and what learns of its refusals after it (``_core/sharing.py``), for the errors of calls
    that fail while renewals pause. Detached: no secret, no path back to a transport
    (aiohttp's scrubbed ``Bare401``); ``None`` where the stack's raw answer is a live
    response, which holds its request's headers and the hooks of the auth that sent it.
    """

    answer: Answer
    raw: _R
    kept: object = None


@dataclass(frozen=True, slots=True)
class Accepted(Generic[_R]):
    """The request was answered: ``raw`` goes back to the caller."""

    token: AccessToken
    raw: _R


@dataclass(frozen=True, slots=True)
class Refused(Generic[_R]):
    """The request ends refused.

    Attributes:
        token: The token of the last send.
        last: The last answer.
        reason: Why it was not sent again; ``None`` when the renewals ran out.
        dropped: Whether the token was dropped, so that the next call uses a new one.
        renewals: The renewals the request was allowed.
        expired: The last token had expired when it was refused: the request waited
            longer than the token lived (in the client's queue, say).
    """

    token: AccessToken
    last: Sent[_R]
    reason: str | None
    dropped: bool
    renewals: int
    expired: bool = False


@dataclass(frozen=True, slots=True)
class Paused:
    """No send was made: fresh tokens kept being refused, and renewals are paused."""

    refusals: int
    remaining: float


Outcome = Accepted[_R] | Refused[_R] | Paused


class TokenLedger(Protocol):
    """The token manager's bookkeeping, as the flow uses it: no I/O, no waiting."""

    @property
    def generation(self) -> int: ...

    def confirm(self, token: AccessToken) -> None: ...

    def invalidate(self, token: AccessToken, *, answer: object = None) -> bool: ...

    def refused_while_running(self, token: AccessToken) -> bool: ...

    def pause_remaining(self) -> float: ...

    def loaded(self, token: AccessToken) -> bool: ...

    def expired(self, token: AccessToken) -> bool: ...


def settle(
    tokens: TokenLedger, request: RequestFacts, token: AccessToken, sent: Sent[_R]
) -> tuple[Action, bool, str | None]:
    """Judge ``sent`` and tell the token manager: the action, whether the token was
    dropped, and why the request must not be sent again."""
    verdict = judge(request, sent.answer)
    if verdict.token is TokenFate.CONFIRM:
        tokens.confirm(token)
        return verdict.action, False, None
    reason = verdict.reason
    if verdict.token is TokenFate.KEEP:
        return Action.FAIL, False, reason
    if verdict.token is TokenFate.DROP_ONCE:
        dropped = tokens.refused_while_running(token)
        if not dropped and reason is None:
            reason = REFUSED_AGAIN_WHILE_RUNNING
    else:
        # Only the first of many requests refused with this token renews it. The raw
        # answer of a bare HTTP 401 is kept: a call failing while renewals are paused
        # ends as that one did.
        tokens.invalidate(token, answer=sent.kept if sent.answer.bare_401 else None)
        dropped = True
    return (Action.FAIL if reason is not None else Action.RESEND), dropped, reason


def renewal_flow(
    request: RequestFacts,
    tokens: TokenLedger,
    *,
    max_renewals: int,
    min_ttl: float,
    emit: Callable[[AuthEvent], None],
    first: tuple[AccessToken, Sent[_R]] | None = None,
) -> Generator[Command, object, Outcome[_R]]:
    """Send with a valid token; on a refusal, renew and re-send, within bounds.

    ``first`` is the token and answer of a send already made (the adapter's fast path);
    ``None`` starts with no send.
    """
    if first is None:
        reply = yield NeedToken(min_ttl, 0)
        if isinstance(reply, RenewalPaused):
            return Paused(reply.refusals, reply.remaining)
        assert isinstance(reply, AccessToken)  # a first token is never a spent renewal
        token = reply
        sent = cast("Sent[_R]", (yield Send(token)))
    else:
        token, sent = first
    action, dropped, reason = settle(tokens, request, token, sent)
    if action is Action.ACCEPT:
        return Accepted(token, sent.raw)
    if action is Action.FAIL:
        return Refused(token, sent, reason, dropped, max_renewals)
    refused_generation = token.generation
    extra = 0
    attempt = 1  # sends made or spent unsent, the first included
    while attempt < max_renewals + 1 + extra:
        wait = tokens.pause_remaining()
        emit(
            AuthEvent(
                "request_retry_scheduled",
                attempt=attempt,
                max_attempts=max_renewals + 1 + extra,
                wait=wait,
            )
        )
        yield Wait(wait)
        attempt += 1
        reply = yield NeedToken(min_ttl, refused_generation)
        if isinstance(reply, (RenewalPaused, RenewalSpent)):
            # The renewal this request would share was refused as well, or fresh tokens
            # keep being refused: this attempt is spent unsent.
            refused_generation = max(refused_generation, tokens.generation)
            continue
        assert isinstance(reply, AccessToken)
        token = reply
        # Decided when the token is handed out, not when its answer comes: by then other
        # requests' refusals may have changed what is known.
        loaded = tokens.loaded(token)
        sent = cast("Sent[_R]", (yield Send(token)))
        refused_generation = token.generation
        if loaded and not extra:
            extra = 1  # counts only if this answer refuses it
        action, dropped, reason = settle(tokens, request, token, sent)
        if action is Action.ACCEPT:
            return Accepted(token, sent.raw)
        if action is Action.FAIL:
            return Refused(token, sent, reason, dropped, max_renewals)
    return Refused(token, sent, None, True, max_renewals, tokens.expired(token))


_Flow = Generator[Command, object, Outcome[_R]]


async def drive_async(
    flow: _Flow[_R],
    *,
    get_token: Callable[[NeedToken], Awaitable[AccessToken | NotNow]],
    send: Callable[[AccessToken], Awaitable[Sent[_R]]],
    sleep: Callable[[float], Awaitable[object]],
) -> Outcome[_R]:
    """Carry out ``flow``'s commands with coroutines; whatever they raise ends it."""
    reply: object = None
    try:
        while True:
            try:
                command = flow.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(command, Send):
                reply = await send(command.token)
            elif isinstance(command, NeedToken):
                reply = await get_token(command)
            else:
                await sleep(command.seconds)
                reply = None
    finally:
        flow.close()


def drive_sync(
    flow: _Flow[_R],
    *,
    get_token: Callable[[NeedToken], AccessToken | NotNow],
    send: Callable[[AccessToken], Sent[_R]],
    sleep: Callable[[float], object],
) -> Outcome[_R]:
    """Carry out ``flow``'s commands by blocking calls; whatever they raise ends it."""
    reply: object = None
    try:
        while True:
            try:
                command = flow.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(command, Send):
                reply = send(command.token)
            elif isinstance(command, NeedToken):
                reply = get_token(command)
            else:
                sleep(command.seconds)
                reply = None
    finally:
        flow.close()
