"""What the shared token stores keep of an identity: an HMAC tag, sealed values, fingerprints.

Written once for Redis (``redis.py``, names in ``redis_keys.py``) and the local store
(``local.py``): no client id, client secret or token is kept in the clear. The tag that names
an identity's entries is an HMAC of its token URL, client id, scope, further token parameters
and client authentication method, keyed by HKDF (RFC 5869) from the client secret (or a
``store_key``); values are sealed with AES-GCM under another HKDF key, with associated data
that binds each to its entry; a token's fingerprint is an HMAC too.

Imported only by the modules of the extras that install ``cryptography``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .protocol import TokenIdentity

# Salt and labels of the HKDF derivations: a change of scheme changes them, and with them
# every Redis key name, so existing stores keep working only while they stay as they are.
_SALT = b"gql-service-auth token store v1"
_NAME_INFO = b"key names"
_VALUE_INFO = b"token values"


class Hidden:
    """Holds a value that ``repr`` and ``vars()`` must not show (a password, a store key)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<hidden>"


class Sealer:
    """The tag and the keys of one identity, from its key material; never shown.

    Args:
        identity: Whose entries these are.
        material: The client secret, or the store's ``store_key``.
    """

    __slots__ = ("_name_key", "_value_key", "tag")

    def __init__(self, identity: TokenIdentity, material: bytes) -> None:
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
        self._name_key = hkdf(material, _NAME_INFO)
        #: 32 hexadecimal digits that name the identity's entries.
        self.tag = hmac.new(self._name_key, canonical, hashlib.sha256).hexdigest()[:32]
        self._value_key = AESGCM(hkdf(material, _VALUE_INFO + b"\0" + canonical))

    def __repr__(self) -> str:
        return "<keys>"

    def fingerprint(self, access_token: str) -> str:
        """An HMAC of ``access_token``: equal for equal tokens, and shows nothing of them."""
        mac = hmac.new(self._name_key, b"fingerprint\0" + access_token.encode(), "sha256")
        return mac.hexdigest()[:32]

    def seal(self, text: str, aad: bytes) -> str:
        """``text`` encrypted and authenticated, bound to ``aad``, as base64."""
        nonce = os.urandom(12)
        sealed = self._value_key.encrypt(nonce, text.encode(), aad)
        return base64.b64encode(nonce + sealed).decode("ascii")

    def open(self, value: bytes | str, aad: bytes) -> str | None:
        """What :meth:`seal` sealed with ``aad``; ``None`` for anything else."""
        try:
            raw = base64.b64decode(value, validate=True)
            return self._value_key.decrypt(raw[:12], raw[12:], aad).decode()
        except (InvalidTag, ValueError, TypeError):
            # Another key (store_key differs between processes) or a damaged value: as
            # good as absent; this process fetches and its newer token replaces it.
            return None


def hkdf(material: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=info).derive(material)
