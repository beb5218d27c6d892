"""What the token manager does when asked for a token, decided as values, without I/O.

:meth:`TokenManager.get <gql_service_auth._core.tokens.TokenManager.get>` reads its state
under its lock into a :class:`State`, asks :func:`plan_get` what to do, and does it: hand
out a token, join the fetch under way, start one, or say why not now. After a fetch it
waited for, :func:`plan_after_fetch` and :func:`plan_after_failure` say what the caller
gets. The rules, in order (the first that applies decides):

1. A token newer than the refused one (``after``), usable for ``min_ttl`` more, serves.
2. A fetch under way is joined: one fetch serves every caller.
3. A caller wishing for more lifetime (an upload) while a failed renewal backs off gets
   the usable token in hand, as every request does meanwhile, rather than a fetch.
4. When the renewal after a refusal was itself refused, a late request refused with the
   older token is spent: fetching another for each is what stampedes a provider. Once per
   wave, a token read from a shared store does not spend it (see ``only_a_loaded_one_since``).
5. While renewals are paused for refused fresh tokens, nothing is fetched.
6. Else a fetch starts.

Nothing here knows a thread, a lock or an event loop: each rule has its hand-fed test.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ledger import Refusals, RenewalPaused, RenewalSpent
from .token import AccessToken


@dataclass(frozen=True, slots=True)
class State:
    """What the manager knows when asked, read under its lock.

    Attributes:
        token: The token in hand, if any.
        flying: Whether a fetch (in the foreground or a renewal ahead) is under way.
        generation: The generation of the newest token obtained.
        now: The manager's clock.
        renewal_retry_at: When a failed background renewal may be tried again.
        refusals: What refusals taught the manager.
    """

    token: AccessToken | None
    flying: bool
    generation: int
    now: float
    renewal_retry_at: float
    refusals: Refusals


@dataclass(frozen=True, slots=True)
class Use:
    """Hand out ``token``."""

    token: AccessToken


@dataclass(frozen=True, slots=True)
class Join:
    """Wait for the fetch under way."""


@dataclass(frozen=True, slots=True)
class TakeOff:
    """Start a fetch, and wait for it."""


@dataclass(frozen=True, slots=True)
class Fail:
    """The fetch's error stands: no usable token is left."""


Plan = Use | Join | TakeOff | RenewalSpent | RenewalPaused
"""What a caller asking for a token does first: the last two are what it gets, no token."""

JOIN = Join()
TAKE_OFF = TakeOff()
SPENT = RenewalSpent()
FAIL = Fail()


def usable(token: AccessToken, min_ttl: float, now: float) -> bool:
    """Whether ``token`` may be sent now, valid ``min_ttl`` seconds more."""
    return now < token.usable_until and token.expires_at - now >= min_ttl


def in_hand(state: State, after: int) -> AccessToken | None:
    """The token in hand, if usable now and newer than ``after``: what a caller falls back
    on when a renewal fails."""
    token = state.token
    if token is not None and token.generation > after and usable(token, 0.0, state.now):
        return token
    return None


def plan_get(state: State, *, min_ttl: float, after: int) -> Plan:
    """What a caller asking for a token valid ``min_ttl`` more, newer than generation
    ``after`` (0: any), does first (the rules of this module, in order)."""
    token = state.token
    if token is not None and token.generation > after and usable(token, min_ttl, state.now):
        return Use(token)
    if state.flying:
        return JOIN
    if min_ttl and state.now < state.renewal_retry_at:
        fallback = in_hand(state, after)
        if fallback is not None:
            return Use(fallback)
    if _wave_spent(state, after):
        return SPENT
    refusals = state.refusals
    remaining = refusals.pause_remaining()
    if refusals.renewing_after_refusal and remaining > 0:
        return RenewalPaused(remaining, refusals.unconfirmed_refusals)
    return TAKE_OFF


def _wave_spent(state: State, after: int) -> bool:
    """Rule 4: the token refused at ``after`` was renewed since, and that renewal was
    refused too (the token is gone, a renewal after a refusal is due)."""
    refusals = state.refusals
    return (
        refusals.renewing_after_refusal
        and state.token is None
        and bool(after)
        and state.generation > after
        # A token read from a shared store is no renewal of this process's: its refusal
        # leaves the wave the one fetch that follows (the flow gives a loaded token's send
        # one more attempt, for the same reason). Once: a second refused token, however it
        # came, spends the wave.
        and not refusals.only_a_loaded_one_since(after, state.generation)
    )


def plan_after_failure(state: State, *, min_ttl: float, after: int) -> Use | Fail:
    """What a caller whose fetch failed gets: a caller that wished for more lifetime than
    the token in hand had gets that token back while usable; any other, the error."""
    fallback = in_hand(state, after) if min_ttl else None
    return FAIL if fallback is None else Use(fallback)


def renews_landed(token: AccessToken, *, min_ttl: float, now: float) -> bool:
    """Whether a caller wishing for ``min_ttl`` more waits for a renewal of the ``token``
    its fetch brought: one read from a shared store, due for renewal already. Once."""
    return bool(min_ttl) and not usable(token, min_ttl, now) and now >= token.renew_at


def plan_renewal(state: State, landed: AccessToken, *, after: int) -> Use | Join | TakeOff:
    """The renewal of ``landed`` that :func:`renews_landed` asked for: joined when one is
    under way, started unless another token replaced it or a failed renewal backs off
    (then the caller gets what is in hand)."""
    if state.flying:
        return JOIN
    if state.token is not landed or state.now < state.renewal_retry_at:
        return Use(in_hand(state, after) or landed)
    return TAKE_OFF
