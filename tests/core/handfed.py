"""What the hand-fed tests of the token manager's pieces share: tokens made by hand."""

from __future__ import annotations

from gql_service_auth._core.token import AccessToken, TokenResponse, access_token


def token(generation: int, *, lifetime: float = 100.0, started: float = 0.0) -> AccessToken:
    """A token of ``generation`` living ``lifetime`` s from ``started``: with the 10 s
    margin, a 100 s one is renewed from 90 and usable until 95."""
    return access_token(
        TokenResponse(f"t{generation}", expires_in=lifetime),
        started=started,
        generation=generation,
        refresh_margin=10.0,
        default_expires_in=lifetime,
    )
