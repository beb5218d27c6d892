"""Client credentials: a Client Id and a Client Secret the package never shows."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from urllib.parse import quote_plus

from .constants import API_KEY_SCHEME
from .errors import ConfigurationError
from .log_secrets import remember


def _has_control_chars(value: str) -> bool:
    return any(ord(char) < 0x20 or ord(char) == 0x7F for char in value)


@dataclass(frozen=True, slots=True, repr=False)
class ClientCredentials:
    """A Client Id and its Client Secret, as created in the web console.

    ``repr`` and ``str`` show the Client Id only: the secret "is shown once, cannot be
    retrieved later, and must never be exposed" (the service contract).
    """

    client_id: str
    client_secret: str = field(compare=True)

    def __post_init__(self) -> None:
        # Messages name the faulty field but never echo its value: a secret pasted into the
        # wrong argument must not end up in a traceback.
        for name in ("client_id", "client_secret"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ConfigurationError(f"{name} must be a str, not {type(value).__name__}")
            if not value.strip():
                raise ConfigurationError(f"{name} is empty: copy it from the console")
            if _has_control_chars(value) or value != value.strip():
                raise ConfigurationError(
                    f"{name} has surrounding whitespace or control characters; "
                    "check how it was copied or read"
                )
        if ":" in self.client_id:
            # The API key joins id and secret with one colon; a colon in the id would
            # make the header ambiguous.
            raise ConfigurationError("client_id must not contain ':'")
        remember(self.client_secret, lasting=True)  # kept out of gql's own log records

    def __repr__(self) -> str:
        return f"ClientCredentials(client_id={self.client_id!r}, client_secret='***')"

    @property
    def current(self) -> ClientCredentials:
        """These credentials, which never change (as ``RotatingCredentials.current``)."""
        return self

    __str__ = __repr__

    def api_key_authorization(self) -> str:
        """The value of the API-key ``Authorization`` header (contract method 1)."""
        return f"{API_KEY_SCHEME} {self.client_id}:{self.client_secret}"

    def basic_authorization(self) -> str:
        """The ``Authorization`` header of HTTP Basic client authentication.

        RFC 6749 section 2.3.1: id and secret are form-urlencoded before they are
        joined and base64-encoded.
        """
        raw = f"{quote_plus(self.client_id)}:{quote_plus(self.client_secret)}"
        return "Basic " + base64.b64encode(raw.encode()).decode("ascii")
