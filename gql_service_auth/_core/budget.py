"""What a set of credentials may cost the authorization server: no token request again
soon after it refused them, and at most a budget of token requests in any window.

Identity providers throttle, bill and lock clients out per token request. A wrong secret
used to cost one token request per wave of queries, and nothing backed off after
``invalid_client``; a bug or an API refusing every token could cost thousands. Both are
counted here for the whole process, by credentials (any transport, manager or API), and
decided without I/O: a shared store adds its own count for the fleet (see
``_stores/level.py``).

- After the token endpoint refused the credentials (``invalid_client``,
  ``unauthorized_client``, or a 401 without a code), no token is requested for them for
  ``refusal_wait`` seconds, doubling at each refusal in a row up to ``refusal_wait_max``:
  callers get the same error at once, saying when the next request may go. Credentials
  read anew from their source (``_core/rotation.py``) are other credentials.
- Past ``requests`` token requests in ``window`` seconds, none goes until the window has
  room: callers that need a token get :class:`TokenBudgetExceededError`, naming the
  budget, while a token still valid keeps serving.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from . import fork as _fork
from .errors import ConfigurationError, TokenBudgetExceededError, TokenRequestError
from .events import AuthEvent
from .token import TokenFetcher, TokenResponse

REFUSING_CODES: Final = frozenset({"invalid_client", "unauthorized_client"})
"""RFC 6749 error codes that refuse the client itself, whatever it asks for."""

_DIGEST_KEY: Final = secrets.token_bytes(32)
_KEPT: Final = 1024
"""Credentials whose ledger a process keeps; the least recently used goes first."""


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """What one set of credentials may cost the token endpoint, counted across the process
    and, with a shared token store, across the fleet.

    The defaults leave room for every pattern in the docs (a token per lifetime per
    process or fleet, renewals after revocations, restarts), even with one-second
    tokens (120 a minute), and stop a runaway: a wrong secret, a caller's bug, an API
    refusing every token.

    Args:
        requests: Token requests allowed in any ``window`` seconds; a fetch that retries
            counts once (its retries are bounded by ``RetryPolicy.attempts``).
        window: Seconds of the window.
        refusal_wait: Seconds no token is requested after the token endpoint refused the
            credentials; doubled at each refusal in a row.
        refusal_wait_max: The longest such wait.

    Raises:
        ConfigurationError: a value out of its range.
    """

    requests: int = 300
    window: float = 60.0
    refusal_wait: float = 2.0
    refusal_wait_max: float = 300.0

    def __post_init__(self) -> None:
        if isinstance(self.requests, bool) or not isinstance(self.requests, int):
            raise ConfigurationError("TokenBudget.requests must be an int")
        if self.requests < 1:
            raise ConfigurationError("TokenBudget.requests must be at least 1")
        for name in ("window", "refusal_wait", "refusal_wait_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"TokenBudget.{name} must be a number of seconds")
            if not 0 < value < float("inf"):
                raise ConfigurationError(f"TokenBudget.{name} must be a finite number above 0")
        if self.refusal_wait_max < self.refusal_wait:
            raise ConfigurationError("TokenBudget.refusal_wait_max must be refusal_wait or more")

    def refusal_backoff(self, refusals: int) -> float:
        """Seconds no token is requested after the ``refusals``-th refusal in a row."""
        return float(min(self.refusal_wait * 2 ** min(refusals - 1, 30), self.refusal_wait_max))


TokenBudget.__module__ = "gql_service_auth"

DEFAULT_BUDGET: Final = TokenBudget()


def refuses_credentials(error: TokenRequestError) -> bool:
    """Whether the token endpoint refused the credentials themselves (not the scope, not a
    transient failure): asking again with them cannot succeed."""
    if error.retryable:
        return False
    if error.error is not None:
        return error.error in REFUSING_CODES
    return error.status == 401


def credentials_key(token_url: str, client_id: str, client_secret: str) -> str:
    """What a ledger is kept by: a keyed digest, the secret included, that shows none."""
    material = "\0".join((token_url, client_id, client_secret)).encode()
    return hashlib.blake2b(material, key=_DIGEST_KEY, digest_size=16).hexdigest()


class Ledger:
    """What the token endpoint was asked for one set of credentials, and how it answered,
    in this process. Thread-safe; held a few attribute reads at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: When the requests of the longest window any budget asked about went; at most
        #: as many as the largest budget allows (so bounded whatever the traffic).
        self._times: deque[float] = deque()
        self._longest = 0.0
        self._most = 0
        self._refusals = 0
        self._refused_until = 0.0
        self._refusal: TokenRequestError | None = None
        self._told_until = 0.0

    def admit(self, now: float, budget: TokenBudget | None) -> TokenRequestError | None:
        """Count a token request about to go, or say why it may not (``None``: it may)."""
        with self._lock:
            if now < self._refused_until and self._refusal is not None:
                return remembered(self._refusal, self._refused_until - now)
            if budget is None:
                return None
            # Transports of other budgets may count the same credentials: the history kept
            # serves the longest window and the largest count any of them asked about.
            self._longest = max(self._longest, budget.window)
            self._most = max(self._most, budget.requests)
            times = self._times
            while times and times[0] <= now - self._longest:
                times.popleft()
            since = now - budget.window
            within = [t for t in times if t > since][-budget.requests :]
            if len(within) >= budget.requests:
                return spent(budget, within[0] + budget.window - now, len(within))
            times.append(now)
            while len(times) > self._most:
                times.popleft()
            return None

    def refused(self, error: TokenRequestError, now: float, budget: TokenBudget) -> float:
        """The endpoint refused the credentials: the seconds no request goes now.

        Refusals of fetches that were in flight together (a wave of transports that share
        no token, uploads, several APIs) are one refusal: only one that comes once the
        last back-off ended counts towards the next, longer one.
        """
        with self._lock:
            if now < self._refused_until:
                self._refusal = error
                return self._refused_until - now
            self._refusals += 1
            wait = budget.refusal_backoff(self._refusals)
            self._refused_until = now + wait
            self._refusal = error
            return wait

    def hold(self, error: TokenRequestError, until: float) -> None:
        """Another process of the fleet was refused: no request until ``until``."""
        with self._lock:
            if until > self._refused_until:
                self._refused_until, self._refusal = until, error

    def first_told(self, now: float, until: float) -> bool:
        """Whether a spent budget is to be told now: once until ``until``."""
        with self._lock:
            if now < self._told_until:
                return False
            self._told_until = until
            return True

    def refused_for(self, now: float) -> float:
        """Seconds no request goes for a refusal; 0 when none is remembered."""
        return max(self._refused_until - now, 0.0)

    def accepted(self) -> None:
        """The endpoint issued a token: its refusals in a row are over."""
        if self._refusals:
            with self._lock:
                self._refusals = 0
                self._refused_until = 0.0
                self._refusal = None

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()


class Ledgers:
    """The process's ledgers, by :func:`credentials_key`, the most recent ``_KEPT``."""

    def __init__(self) -> None:
        self._ledgers: OrderedDict[str, Ledger] = OrderedDict()
        self._lock = threading.Lock()
        _fork.reset_in_child(self)

    def of(self, key: str) -> Ledger:
        with self._lock:
            ledger = self._ledgers.get(key)
            if ledger is None:
                ledger = self._ledgers[key] = Ledger()
                while len(self._ledgers) > _KEPT:
                    self._ledgers.popitem(last=False)
            else:
                self._ledgers.move_to_end(key)
            return ledger

    def clear(self) -> None:
        """Forget every refusal and count (the pytest plugin does, between tests)."""
        with self._lock:
            self._ledgers.clear()

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        for ledger in self._ledgers.values():
            ledger._after_fork_in_child()


LEDGERS = Ledgers()
"""The process's ledgers."""


def remembered(
    refusal: TokenRequestError, wait: float, *, elsewhere: bool = False
) -> TokenRequestError:
    """The error of a request not sent, the credentials refused a moment ago (to another
    process sharing the store, if ``elsewhere``): the same status and code, and when the
    next request may go."""
    code = refusal.error or f"HTTP {refusal.status}"
    told = ", as another process sharing the token store was told" if elsewhere else ""
    error = TokenRequestError(
        f"the authorization server refused these credentials ({code}) a moment ago{told}; "
        f"no token is requested with them for {wait:.1f} s more",
        status=refusal.status,
        error=refusal.error,
        error_description=refusal.error_description,
        error_uri=refusal.error_uri,
        hint=refusal.hint
        or "Check client_id and client_secret; credentials read from a file or a callable "
        "are read again at once when they change",
    )
    error._not_sent = True  # no request went: the refusal was logged when it came
    return error


def spent(budget: TokenBudget, wait: float, used: int) -> TokenBudgetExceededError:
    """The error of a request not sent, the budget spent."""
    error = TokenBudgetExceededError(
        f"the token budget of these credentials is spent: {used} token requests in the "
        f"last {budget.window:g} s, of {budget.requests} allowed (token_budget="
        f"TokenBudget(requests={budget.requests}, window={budget.window:g})); none goes "
        f"for {max(wait, 0.0):.1f} s",
        budget=budget,
        retry_after=max(wait, 0.0),
        hint="Something asks for tokens far more often than they expire: a transport per "
        "request with share_tokens=False, an API refusing every token, processes without "
        "a shared store. See docs/token-budget.md",
    )
    error._not_sent = True  # told once per window that had no room (tell_denied)
    return error


def _secret_mark(client_secret: str) -> str:
    """Which secret a refusal kept in a store was of: a digest that cannot give it back
    (kept sealed beside the refusal, as every value of the store is)."""
    digest = hashlib.blake2b(client_secret.encode(), person=b"gsa-refusal", digest_size=16)
    return digest.hexdigest()


def refusal_text(error: TokenRequestError, client_secret: str) -> str:
    """What a shared store keeps of a refusal of the credentials: the answer's status and
    codes, and a mark of the secret refused, no secret."""
    return json.dumps(
        {
            "status": error.status,
            "error": error.error,
            "error_description": error.error_description,
            "secret": _secret_mark(client_secret),
        }
    )


def refusal_from(text: str, client_secret: str) -> TokenRequestError | None:
    """The refusal another process kept in the shared store, if it was of this secret.

    A store keyed by ``store_key`` keeps one entry for a client id whatever its secret:
    during a rotation, the refusal of the old secret is no refusal of the new one.
    """
    try:
        fields = json.loads(text)
    except ValueError:
        return None
    if not isinstance(fields, dict) or fields.get("secret") != _secret_mark(client_secret):
        return None

    def field(name: str) -> Any:
        value = fields.get(name)
        return value if isinstance(value, str | int) and not isinstance(value, bool) else None

    status, code, description = field("status"), field("error"), field("error_description")
    return TokenRequestError(
        "the authorization server refused these credentials (another process sharing the "
        "token store was told)",
        status=status if isinstance(status, int) else None,
        error=code if isinstance(code, str) else None,
        error_description=description if isinstance(description, str) else None,
    )


class GuardedFetch:
    """A :class:`~.token.TokenFetcher` that asks the token endpoint only when the
    credentials' ledger admits it, and tells the ledger how it answered.

    Args:
        fetch: The grant.
        key: The credentials' :func:`credentials_key`.
        budget: The ceiling, or ``None`` for none (refusals are remembered all the same,
            on :data:`DEFAULT_BUDGET`'s back-off).
        emit: Hears ``token_budget_exhausted`` and ``token_request_refused_recently``.
        clock: Real time in seconds, as other processes count it.
    """

    __slots__ = ("_budget", "_emit", "_fetch", "_key", "clock")

    def __init__(
        self,
        fetch: TokenFetcher,
        key: str,
        budget: TokenBudget | None,
        emit: Callable[[AuthEvent], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._key = key
        self._budget = budget
        self._emit = emit
        self.clock = clock

    def __repr__(self) -> str:
        return f"<GuardedFetch {self._fetch!r}>"

    @property
    def budget(self) -> TokenBudget | None:
        return self._budget

    @property
    def key(self) -> str:
        return self._key

    async def __call__(self) -> TokenResponse:
        ledger = LEDGERS.of(self._key)
        denied = ledger.admit(self.clock(), self._budget)
        if denied is not None:
            self.tell_denied(denied)
            raise denied
        try:
            response = await self._fetch()
        except TokenRequestError as error:
            self.tell_answer(error)
            raise
        ledger.accepted()
        return response

    def tell_denied(self, denied: TokenRequestError) -> None:
        """Tell the hook of a request not sent for the budget, once per window that had no
        room (a refusal remembered was told when it came)."""
        now = self.clock()
        if isinstance(denied, TokenBudgetExceededError) and LEDGERS.of(self._key).first_told(
            now, now + (denied.retry_after or 0.0)
        ):
            budget = denied.budget
            self._emit(
                AuthEvent(
                    "token_budget_exhausted",
                    error="TokenBudgetExceededError",
                    wait=denied.retry_after,
                    detail=f"{budget.requests} token requests in {budget.window:g} s",
                )
            )

    def tell_answer(self, error: TokenRequestError) -> float | None:
        """Remember a refusal of the credentials: the seconds no request goes, or ``None``
        when ``error`` refuses something else."""
        if not refuses_credentials(error):
            return None
        return LEDGERS.of(self._key).refused(error, self.clock(), self._budget or DEFAULT_BUDGET)
