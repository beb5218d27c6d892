"""Where a token read from a shared store comes from, and how it stands to a refusal.

A revocation of every token issued so far refuses the token a process holds, and may have
covered a token a peer stored before it too. A request refused is sent again only with a
token newer than the revocation behind its refusal; these values tell which ones are.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal


def refusal_fingerprint(access_token: str) -> str:
    """What is kept of a refused token to tell its replacement by: a hash, not the token."""
    digest = hashlib.sha256(b"gql-service-auth refused token\0" + access_token.encode())
    return digest.hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A token the API refused, which a token read from a shared store is weighed against.

    Attributes:
        at: When it was first refused (``time.monotonic()``).
        fingerprint: The refused token's :func:`refusal_fingerprint`.
        requested_at: When the refused token was requested (``time.monotonic()``), if known.
    """

    at: float
    fingerprint: str
    requested_at: float | None = None


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a token read from a shared store comes from.

    Attributes:
        requested_at: When it was requested (``time.monotonic()``), from its lifetime and
            time left on the store's clock.
        replaces: The fingerprint of the refused token it was fetched to replace, or ``None``.
        replaced_before: Seconds between the request of that token and its own, if known.
        uncertainty: Seconds by which it may have been requested earlier than
            ``requested_at`` says: the process that stored it measured its time left
            before its write ran.
    """

    requested_at: float
    replaces: str | None
    replaced_before: float | None = None
    uncertainty: float = 0.0

    def answers(self, refusal: Refusal | None) -> Literal["newer", "replacement", "older"]:
        """How it stands to ``refusal``.

        ``"newer"``: requested after it. ``"replacement"``: fetched to replace that very
        token, or one requested no earlier: the revocation that refused that one came
        after the refused token was issued, so it explains the refusal, and this token is
        newer than it (unless another revocation came since, which no process can tell).
        ``"older"``: neither; a revocation that refused the token may have covered it too.
        """
        if refusal is None or self.requested_at - self.uncertainty > refusal.at:
            return "newer"
        if self.replaces is not None and self.replaces == refusal.fingerprint:
            return "replacement"
        before, refused = self.replaced_before, refusal.requested_at
        if before is not None and refused is not None and self.requested_at - before >= refused:
            return "replacement"
        return "older"
