"""Key names and encryption of the Redis token store (see ``redis.py``'s docstring).

The tag, the sealing and the fingerprints are the local store's too (``sealed.py``); the
names are Redis's own. Imported by ``gql_service_auth.redis`` only, which checks that the
``[redis]`` extra (and so ``cryptography``) is installed.
"""

from __future__ import annotations

from .protocol import TokenIdentity
from .sealed import Sealer, hkdf

__all__ = ["Keys", "hkdf"]


class Keys:
    """The names and keys of one identity; never shown."""

    __slots__ = ("_sealer", "aad", "failed", "lock", "refused", "spent", "token")

    def __init__(self, identity: TokenIdentity, material: bytes, prefix: str) -> None:
        self._sealer = sealer = Sealer(identity, material)
        self.token = f"{prefix}:{{{sealer.tag}}}:token"
        self.lock = f"{prefix}:{{{sealer.tag}}}:lock"
        self.failed = f"{prefix}:{{{sealer.tag}}}:failed"
        self.refused = f"{prefix}:{{{sealer.tag}}}:refused"
        self.spent = f"{prefix}:{{{sealer.tag}}}:spent"
        self.aad = self.token.encode()

    def __repr__(self) -> str:
        return "<keys>"

    def fingerprint(self, access_token: str) -> str:
        return self._sealer.fingerprint(access_token)

    def seal(self, text: str, aad: bytes | None = None) -> str:
        return self._sealer.seal(text, aad or self.aad)

    def open(self, value: bytes | str, aad: bytes | None = None) -> str | None:
        return self._sealer.open(value, aad or self.aad)
