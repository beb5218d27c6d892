"""Key names and encryption of the Redis token store (see ``redis.py``'s docstring).

Imported by ``gql_service_auth.redis`` only, which checks that the ``[redis]`` extra (and so
``cryptography``) is installed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ._store import TokenIdentity

# Salt and labels of the HKDF derivations (RFC 5869): a change of scheme changes them.
_SALT = b"gql-service-auth token store v1"
_NAME_INFO = b"key names"
_VALUE_INFO = b"token values"


class Keys:
    """The names and keys of one identity; never shown."""

    __slots__ = ("aad", "failed", "fingerprint_key", "lock", "token", "value_key")

    def __init__(self, identity: TokenIdentity, material: bytes, prefix: str) -> None:
        canonical = json.dumps(
            [
                identity.token_url,
                identity.client_id,
                identity.scope,
                [list(pair) for pair in identity.token_params],
                identity.auth_method,
            ],
            separators=(",", ":"),
        ).encode()
        name_key = hkdf(material, _NAME_INFO)
        tag = hmac.new(name_key, canonical, hashlib.sha256).hexdigest()[:32]
        self.token = f"{prefix}:{{{tag}}}:token"
        self.lock = f"{prefix}:{{{tag}}}:lock"
        self.failed = f"{prefix}:{{{tag}}}:failed"
        self.aad = self.token.encode()
        self.fingerprint_key = name_key
        self.value_key = AESGCM(hkdf(material, _VALUE_INFO + b"\0" + canonical))

    def __repr__(self) -> str:
        return "<keys>"

    def fingerprint(self, access_token: str) -> str:
        mac = hmac.new(self.fingerprint_key, b"fingerprint\0" + access_token.encode(), "sha256")
        return mac.hexdigest()[:32]

    def seal(self, text: str, aad: bytes | None = None) -> str:
        nonce = os.urandom(12)
        sealed = self.value_key.encrypt(nonce, text.encode(), aad or self.aad)
        return base64.b64encode(nonce + sealed).decode("ascii")

    def open(self, value: bytes | str, aad: bytes | None = None) -> str | None:
        try:
            raw = base64.b64decode(value, validate=True)
            return self.value_key.decrypt(raw[:12], raw[12:], aad or self.aad).decode()
        except (InvalidTag, ValueError):
            # Another key (store_key differs between processes) or a damaged value: as
            # good as absent; this process fetches and its newer token replaces it.
            return None


def hkdf(material: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=info).derive(material)
