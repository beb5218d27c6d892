"""The token manager's ledger: what refusals said, and how renewals failed.

No I/O, no thread and no lock of its own: :class:`~gql_service_auth._core.tokens.TokenManager`
owns one of each and calls them with its lock held (but for reads on the per-request
path, where a stale value costs one locked call more). Each field is named for the
question it answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .constants import RENEWAL_RETRY_MIN
from .provenance import Origin, Refusal, refusal_fingerprint
from .token import AccessToken

_RECENT = 4
"""Generations whose request times and origins are kept: those a refusal may name."""


@dataclass(frozen=True, slots=True)
class RenewalSpent:
    """The renewal that followed the refused token was itself refused: no token now.

    What ``TokenManager.get`` returns with ``after=``: many requests refused with one token
    share one renewal (a wave), and once that renewal is refused too, fetching another for
    each late request is what stampedes an identity provider.
    """


@dataclass(frozen=True, slots=True)
class RenewalPaused:
    """Fresh tokens keep being refused, and renewals are paused for a while: no token now.

    What ``TokenManager.get`` returns then, rather than fetching.

    Attributes:
        remaining: Seconds until renewals resume.
        refusals: Consecutive tokens refused before any answer accepted them.
    """

    remaining: float
    refusals: int


NotNow = RenewalSpent | RenewalPaused
"""Why ``TokenManager.get`` hands out no token now: values, not exceptions."""


@dataclass(frozen=True, slots=True, repr=False)
class Pause:
    """What refusals of fresh tokens taught a token manager, handed to the next manager of
    the same credentials when transports built per call leave none alive (see
    ``_core/sharing.py``). No secret and no token: counts, times and a redacted answer.

    Attributes:
        refusals: Fresh tokens refused in a row before any answer accepted one.
        until: When (on the manager's clock) renewals resume.
        answer: What the adapter kept of the last refusal (see :attr:`Refusals.answer`).
        latest: The latest refusal, weighed against tokens read from a shared store.
    """

    refusals: int
    until: float
    answer: object
    latest: Refusal | None

    def __repr__(self) -> str:
        return f"<Pause refusals={self.refusals}>"


class Refusals:
    """The refusal state of one token manager.

    Args:
        cooldown: Seconds renewals pause after the n-th refusal in a row of a token that
            no answer had accepted; ``None`` never pauses.
        weighs_provenance: Whether tokens may come from a shared store, whose refusals
            must be weighed against the token's origin (see :mod:`.provenance`).
        clock: The manager's clock, the one its token lifetimes are read on, for pauses:
            one clock moves them all, so a ``ManualClock`` in tests ends a pause as it ends
            a lifetime. By default, real time: a pause spares an authorization server's
            rate limit.
        real_time: Real time, for when refusals came and when tokens were requested:
            weighed against the tokens other processes stored, whose times (a shared
            store's, Redis's ``PTTL``) are real time on every host, whatever clock this
            process's transports were given.
    """

    def __init__(
        self,
        *,
        cooldown: Callable[[int], float] | None,
        weighs_provenance: bool,
        clock: Callable[[], float] = time.monotonic,
        real_time: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cooldown = cooldown
        self._weighs_provenance = weighs_provenance
        self._clock = clock
        self._real_time = real_time
        #: A refusal dropped the token, and the next fetch renews for it ("rejected").
        self.renewing_after_refusal = False
        #: The newest generation an answer accepted. Read without the lock on the
        #: per-request path, where a stale read costs one extra confirm() call.
        self.confirmed = 0
        #: Tokens refused in a row before any answer accepted them, and until when
        #: (``clock``) renewals pause for them.
        self.unconfirmed_refusals = 0
        self.paused_until = 0.0
        #: A token was dropped for a refusal while an operation ran: the next token to
        #: land is the one renewed for it, whose generation is kept, and which such a
        #: refusal does not drop again before an answer accepts it.
        self.next_token_answers_running_refusal = False
        self.generation_renewed_for_running_refusal = 0
        #: The token the API refused last, until a new one lands: a shared store drops
        #: it, if it still holds it, rather than hand it back.
        self.refused_token: AccessToken | None = None
        #: What the adapter kept of the last refusal that dropped a token (an HTTP 401
        #: without a body, say), or None: a call that fails at once while renewals are
        #: paused ends as that one did.
        self.answer: object = None
        #: The latest token refused (late refusals of replaced tokens too), and, for the
        #: tokens of the last few generations, when (real time) each was requested and,
        #: for one read from a shared store, its origin: a request refused is not sent
        #: again with a stored token that the same revocation may have covered.
        self.latest: Refusal | None = None
        self._requested: dict[int, float] = {}
        self._origins: dict[int, Origin] = {}

    def confirm(self, generation: int) -> None:
        """An answer accepted the token of ``generation``: refusals in a row stop counting."""
        self.confirmed = max(self.confirmed, generation)
        self.unconfirmed_refusals = 0
        self.paused_until = 0.0

    def refused(
        self,
        token: AccessToken,
        *,
        current: AccessToken | None,
        answer: object,
        expired: bool = False,
    ) -> bool:
        """The API refused ``token`` before anything ran; ``current`` is the token in hand.

        ``expired``: the token had expired by then, which explains the refusal: it does
        not count towards a pause, which is for fresh tokens refused.

        Returns:
            Whether to drop it: it is the token in hand (the first of many requests
            refused with one token renews it; the others find it gone).
        """
        self._record(token)
        self.answer = answer
        if current is not token:
            return False
        self.refused_token = token
        self.renewing_after_refusal = True
        if token.generation > self.confirmed and not expired:
            self.unconfirmed_refusals += 1
            if self._cooldown is not None:
                pause = self._cooldown(self.unconfirmed_refusals)
                self.paused_until = self._clock() + pause
        return True

    def refused_while_running(
        self, token: AccessToken, *, current: AccessToken | None
    ) -> tuple[bool, bool]:
        """A resolver refused ``token`` while an operation ran.

        Returns:
            Whether a renewal may help, and whether to drop ``token`` (it is in hand).
        """
        self._record(token)
        if (
            token.generation == self.generation_renewed_for_running_refusal
            and self.confirmed < token.generation
        ):
            return False, False
        if current is not token:
            return True, False
        self.refused_token = token
        self.renewing_after_refusal = True
        self.next_token_answers_running_refusal = True
        return True, True

    def pause_remaining(self) -> float:
        """Seconds until renewals resume after refused fresh tokens; 0 when not paused."""
        return max(self.paused_until - self._clock(), 0.0)

    def pause(self) -> Pause | None:
        """What a new manager of these credentials must know: the refused fresh tokens in
        a row, while the token in hand is gone for them; ``None`` when nothing is owed."""
        if not (self.renewing_after_refusal and self.unconfirmed_refusals):
            return None
        return Pause(self.unconfirmed_refusals, self.paused_until, self.answer, self.latest)

    def resume(self, pause: Pause) -> None:
        """Go on from ``pause``, as the manager that learned it would have: its next token
        is a renewal after a refusal, and the pause, or the refusals that grow it, hold."""
        self.renewing_after_refusal = True
        self.unconfirmed_refusals = pause.refusals
        self.paused_until = pause.until
        self.answer = pause.answer
        self.latest = pause.latest

    def landed(
        self, token: AccessToken, *, requested: float, origin: Origin | None, in_hand: bool
    ) -> None:
        """A new token landed (``in_hand``: it replaces the token in hand)."""
        self._requested[token.generation] = requested
        if origin is not None:
            self._origins[token.generation] = origin
        for recent in (self._requested, self._origins):
            while len(recent) > _RECENT:
                del recent[min(recent)]
        if in_hand:
            self.refused_token = None
            self.renewing_after_refusal = False
            if self.next_token_answers_running_refusal:
                # Whichever fetch lands first after such a refusal serves its re-send.
                self.generation_renewed_for_running_refusal = token.generation

    def fetch_ended(self) -> None:
        """A fetch ended, with a token or not: the next one answers no running refusal."""
        self.next_token_answers_running_refusal = False

    def standing(self, token: AccessToken) -> Literal["newer", "replacement", "older"]:
        """How ``token`` stands to the latest refusal (see :meth:`Origin.answers`).

        ``"newer"`` for a token this process fetched: its own renewals are trusted as ever.
        """
        origin = self._origins.get(token.generation)
        return "newer" if origin is None else origin.answers(self.latest)

    def loaded(self, token: AccessToken) -> bool:
        """Whether ``token`` was read from a shared store rather than fetched here."""
        return token.generation in self._origins

    def only_a_loaded_one_since(self, after: int, generation: int) -> bool:
        """Whether the one token after generation ``after`` is ``generation``, read from a
        shared store: the renewal that followed ``after`` was no fetch of this process's."""
        return generation == after + 1 and generation in self._origins

    def _record(self, token: AccessToken) -> None:
        # The first refusal of a token is the one that counts: a token requested after it
        # is newer than the revocation behind it. Without a store, no token is read from
        # elsewhere, and nothing is weighed against it.
        if not self._weighs_provenance:
            return
        fingerprint = refusal_fingerprint(token.value)
        if self.latest is None or self.latest.fingerprint != fingerprint:
            requested = self._requested.get(token.generation)
            self.latest = Refusal(self._real_time(), fingerprint, requested)


def _default_backoff(failures: int) -> float:
    # 5 s, 10 s, 20 s...: a token endpoint that failed a whole fetch, retries included, is
    # not asked again at once; the manager also tries before the token is no longer usable.
    return min(5.0 * 2.0 ** (failures - 1), 300.0)


class RenewalFailures:
    """Renewals ahead of expiry that failed in a row, and when the next may start.

    Args:
        backoff: Seconds to wait after the n-th failure before the next renewal;
            whatever it says, the next comes no sooner than ``RENEWAL_RETRY_MIN`` and
            before the token stops being usable. ``None``: 5 s, 10 s, 20 s... up to 300 s.
    """

    def __init__(self, backoff: Callable[[int], float] | None = None) -> None:
        self._backoff = backoff or _default_backoff
        self.count = 0
        #: When (on the manager's clock) the next renewal may start.
        self.next_at = 0.0

    def failed(self, token: AccessToken | None, now: float) -> tuple[float, float, int] | None:
        """A renewal of ``token``, the token in hand, failed at ``now``.

        Returns:
            The seconds the token has left, the seconds until the next renewal may start,
            and the failures in a row; ``None`` when no usable token is left, so the
            failure is a request's.
        """
        if token is None or now >= token.usable_until:
            return None
        self.count += 1
        # Spaced by the backoff, but tried again before the token is no longer usable,
        # while that is at least RENEWAL_RETRY_MIN away: each try is one fetch, so this
        # bounds the fetches of a token's last stretch.
        wait = min(self._backoff(self.count), (token.usable_until - now) / 2)
        wait = max(wait, RENEWAL_RETRY_MIN)
        self.next_at = now + wait
        return token.expires_at - now, wait, self.count

    def succeeded(self) -> None:
        """A new token landed: the next renewal comes at its own time."""
        self.count = 0
        self.next_at = 0.0
