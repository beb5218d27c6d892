"""The access token as a value, and its lifetime rule: when it is renewed and last sent.

Written once: the token manager applies it to each token it obtains, and a shared store's
reader applies the same rule to decide whether a stored token is due for renewal.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from .constants import BEARER_SCHEME, EXPIRY_GUARD
from .log_secrets import remember


class Clock(Protocol):
    """A monotonic clock in seconds, like :func:`time.monotonic`; injectable for tests.

    One clock rules a transport's time: token lifetimes, renewal backoff, and the pauses of
    renewals while fresh tokens are refused. (When refusals came is real time: it is weighed
    against the times of tokens that other processes stored.) A clock whose class defines a
    ``wait(seconds)`` method, as the emulator's ``ManualClock`` does, takes over a re-send's
    wait for a pause: the ``ManualClock`` advances, so a test runs through pauses at once.
    """

    def __call__(self) -> float: ...


_Slept = TypeVar("_Slept")


def waits_on(clock: Clock, sleep: Callable[[float], _Slept]) -> Callable[[float], _Slept]:
    """``sleep`` (an adapter's: ``asyncio.sleep``, ``trio.sleep``, ``time.sleep``), or for
    a clock that takes over waits (see :class:`Clock`), its ``wait``, then a sleep of 0 to
    yield as a wait does.

    Looked up on the clock's class, and taken only when it is a plain (not async)
    function: a mock or a spy clock, whose instances answer any attribute, keeps real waits.
    """
    clock_wait = getattr(type(clock), "wait", None)
    if not inspect.isfunction(clock_wait) or inspect.iscoroutinefunction(clock_wait):
        return sleep

    def wait(seconds: float) -> _Slept:
        if seconds > 0:
            clock_wait(clock, seconds)
        return sleep(0)

    return wait


@dataclass(frozen=True, slots=True, repr=False)
class TokenResponse:
    """A successful token endpoint answer (RFC 6749 section 5.1), already validated.

    Attributes:
        access_token: The token; never shown by ``repr``.
        expires_in: Lifetime in seconds from the server, or ``None`` when it sent none.
        token_type: The server's ``token_type``, or ``None``.
        scope: The granted scope, or ``None``.
        lifetime: Seconds the token was issued for, when that is more than
            ``expires_in`` (a token read from a shared store part-way through its life);
            renewal points are set from it, so every process renews at the same moment.
    """

    access_token: str
    expires_in: float | None = None
    token_type: str | None = None
    scope: str | None = None
    lifetime: float | None = None

    def __repr__(self) -> str:
        return (
            f"TokenResponse(access_token='***', expires_in={self.expires_in!r}, "
            f"token_type={self.token_type!r}, scope={self.scope!r}, lifetime={self.lifetime!r})"
        )


class TokenFetcher(Protocol):
    """Obtains a new token from an authorization server.

    Raises:
        TokenRequestError: no token could be had; the fetcher has done its own retries.
    """

    def __call__(self) -> Awaitable[TokenResponse]: ...


@dataclass(frozen=True, slots=True, repr=False)
class AccessToken:
    """A cached access token with the times, on the manager's clock, that rule its use.

    Attributes:
        value: The token itself; never shown by ``repr``.
        generation: 1 for the first token a manager obtained, 2 for the next, and so on.
        obtained_at: When the request that produced it was sent.
        renew_at: From then on, requests still use it, while one renewal runs in the
            background.
        expires_at: When the server will stop accepting it, as far as we know.
        usable_until: The last moment it is sent: ``expires_at`` less a guard against
            clock skew and transit time (see ``EXPIRY_GUARD``). After that, a request
            waits for a new token.
    """

    value: str = field(compare=False)
    generation: int
    obtained_at: float
    renew_at: float
    expires_at: float
    usable_until: float = float("inf")

    def __post_init__(self) -> None:
        remember(self.value)  # kept out of gql's own log records

    @property
    def authorization(self) -> str:
        """The ``Authorization`` header value for this token (contract method 2)."""
        # Built per call: a cached copy would be one more place holding the token, for a
        # saving of a fraction of a microsecond.
        return f"{BEARER_SCHEME} {self.value}"

    def __repr__(self) -> str:
        return (
            f"AccessToken(generation={self.generation}, obtained_at={self.obtained_at:.3f}, "
            f"renew_at={self.renew_at:.3f}, expires_at={self.expires_at:.3f}, "
            f"usable_until={self.usable_until:.3f}, value='***')"
        )


# Shown as gql_service_auth.AccessToken, where users import it from (see _core/errors.py).
AccessToken.__module__ = "gql_service_auth"
Clock.__module__ = "gql_service_auth"


def renewal_margin(refresh_margin: float, lifetime: float) -> float:
    """Seconds before expiry at which a token of ``lifetime`` seconds is renewed.

    Ahead of expiry, so that the new token lands while the old one is still in use; but
    never before half the lifetime, so that short tokens are still reused.
    """
    return min(refresh_margin, lifetime / 2)


def expiry_guard(lifetime: float) -> float:
    """Seconds before expiry at which a token of ``lifetime`` seconds is no longer sent.

    The API checks expiry on its own clock, when the request arrives (``EXPIRY_GUARD``); a
    tenth of the lifetime at most, so that short tokens stay usable.
    """
    return min(EXPIRY_GUARD, lifetime / 10)


def access_token(
    response: TokenResponse,
    *,
    started: float,
    generation: int,
    refresh_margin: float,
    default_expires_in: float,
) -> AccessToken:
    """The token of ``response``, its times on the clock ``started`` was read from.

    Args:
        response: The token endpoint's answer, or a token read from a shared store.
        started: When the request that produced it was sent.
        generation: Its number in the manager's sequence.
        refresh_margin: See :func:`renewal_margin`.
        default_expires_in: The lifetime of a token the server gave none (or 0 and less).
    """
    lifetime = response.expires_in
    if lifetime is not None and lifetime <= 0:
        # A lifetime of 0 or less would make every request fetch a token. It says
        # nothing usable, so it is treated as absent (and the manager says so); a token
        # that really is dead is caught by the reactive renewal.
        lifetime = None
    if lifetime is None:
        lifetime = default_expires_in
    # A token issued earlier (read from a shared store) keeps the renewal point and guard
    # of its whole lifetime, as in the process that fetched it.
    whole = max(response.lifetime or lifetime, lifetime)
    # Times count from when the request was sent, not when the answer came: the server
    # started the lifetime somewhere in between, so this errs on the early side.
    expires_at = started + lifetime
    usable_until = expires_at - expiry_guard(whole)
    return AccessToken(
        value=response.access_token,
        generation=generation,
        obtained_at=started,
        renew_at=min(expires_at - renewal_margin(refresh_margin, whole), usable_until),
        expires_at=expires_at,
        usable_until=usable_until,
    )
