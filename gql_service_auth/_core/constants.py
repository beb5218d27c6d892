"""Constants of the service contract and the package's defaults, each in one place.

The contract is ``SERVICE.md``; where it says "unknown", the default here is a guess
that a keyword argument can override.
"""

from __future__ import annotations

from datetime import date
from typing import Final

ENV_BASE_URL: Final = "SERVICE_BASE_URL"
"""Environment variable: the API host (``{base_url}``); ``/graphql`` is appended."""

ENV_AUTH_URL: Final = "SERVICE_AUTH_URL"
"""Environment variable: the authorization server (``{auth_url}``).

``/oauth2/token`` is appended.
"""

ENV_CLIENT_ID: Final = "SERVICE_CLIENT_ID"
"""Environment variable: the Client Id created in the web console."""

ENV_CLIENT_SECRET: Final = "SERVICE_CLIENT_SECRET"
"""Environment variable: the Client Secret created in the web console."""

ENV_CREDENTIALS_FILE: Final = "SERVICE_CREDENTIALS_FILE"
"""Environment variable, optional: a file holding both credentials (a JSON object, or
``client_id=...`` and ``client_secret=...`` lines), read again when it changes; in place of
``SERVICE_CLIENT_ID`` and ``SERVICE_CLIENT_SECRET``."""

ENV_CLIENT_ID_FILE: Final = "SERVICE_CLIENT_ID_FILE"
"""Environment variable, optional: a file holding the Client Id alone, read again when it
changes; in place of ``SERVICE_CLIENT_ID``, with ``SERVICE_CLIENT_SECRET_FILE``."""

ENV_CLIENT_SECRET_FILE: Final = "SERVICE_CLIENT_SECRET_FILE"
"""Environment variable, optional: a file holding the Client Secret alone (a mounted
Kubernetes Secret's key), read again when it changes; in place of
``SERVICE_CLIENT_SECRET``."""

ENV_TOKEN_STORE_URL: Final = "SERVICE_TOKEN_STORE_URL"
"""Environment variable, optional: a ``file:///dir`` or a Redis URL: ``redis://``
(``rediss://``, ``unix://``), ``redis+cluster://`` or ``redis+sentinel://``.

When set, :meth:`OAuth2Transport.from_env` shares tokens through that directory, with the
other processes of the host (:class:`~gql_service_auth.local.LocalTokenStore`, the
``[local]`` extra), or through that Redis (:class:`~gql_service_auth.redis.RedisTokenStore`,
the ``[redis]`` extra).
"""

REDIS_SCHEMES: Final = (
    "redis://",
    "rediss://",
    "unix://",
    "redis+cluster://",
    "rediss+cluster://",
    "redis+sentinel://",
    "rediss+sentinel://",
)
"""The URL forms of a Redis token store (see ``_stores/redis_clients.py``)."""

ENV_TOKEN_STORE_CONNECT_TIMEOUT: Final = "SERVICE_TOKEN_STORE_CONNECT_TIMEOUT"
"""Environment variable, optional: seconds a call of the ``SERVICE_TOKEN_STORE_URL`` store
may wait for the store to be set up (connected, TLS done, cluster discovered) before its
own timeout runs (the stores' ``connect_timeout=``; ``STORE_CONNECT_TIMEOUT`` when unset).
"""

ENV_TOKEN_STORE_TIMEOUT: Final = "SERVICE_TOKEN_STORE_TIMEOUT"
"""Environment variable, optional: seconds each call of the ``SERVICE_TOKEN_STORE_URL``
store may take (the stores' ``timeout=``; ``STORE_TIMEOUT`` when unset).

Past it the process fetches its token itself, so on a busy host, or with a Redis far away,
a budget too short for the calls costs a token request each time it runs out.
"""

GRAPHQL_PATH: Final = "/graphql"
"""Path of the GraphQL endpoint under ``{base_url}``."""

TOKEN_PATH: Final = "/oauth2/token"
"""Path of the token endpoint under ``{auth_url}``."""

API_KEY_SCHEME: Final = "SERVICE-API-KEY"
"""Scheme word of the API-key ``Authorization`` header (method 1 of the contract)."""

BEARER_SCHEME: Final = "Bearer"
"""Scheme word of the access-token ``Authorization`` header (RFC 6750 section 2.1)."""

UNAUTHENTICATED: Final = "UNAUTHENTICATED"
"""``extensions.code`` of a GraphQL error that refuses the credentials."""

API_KEY_CUTOFF: Final = date(2024, 5, 13)
"""Credentials registered before this date cannot be used as an API key (method 2 only)."""

DEFAULT_REFRESH_MARGIN: Final = 60.0
"""Seconds before expiry at which a token is renewed in the background, while still in use.

Capped at half the token's lifetime. A failed renewal is tried again within this time,
so it is how long the token endpoint may be down without any request noticing.
"""

EXPIRY_GUARD: Final = 5.0
"""Seconds before expiry at which a token is no longer sent; at most a tenth of its lifetime.

The API checks expiry on its own clock when the request arrives: this covers the transit
time and some skew between hosts' clocks, as the leeway that token validators allow does
on the other side. Until then a token whose renewal keeps failing is still used.
"""

RENEWAL_RETRY_MIN: Final = 1.0
"""Seconds: the shortest wait between two background renewals when the first failed."""

DEFAULT_EXPIRES_IN: Final = 300.0
"""Seconds a token is trusted when the token endpoint sends no usable ``expires_in``.

The service's token lifetime is unknown, so a token is never trusted forever: five
minutes costs one token request per five minutes and bounds how long a silent expiry
can go unnoticed before the early renewal catches it.
"""

DEFAULT_MAX_RENEWALS: Final = 1
"""Token renewals (and so retries) per request after an ``UNAUTHENTICATED`` answer."""

DEFAULT_RETRY_ATTEMPTS: Final = 4
"""Attempts at the token endpoint for one token, the first one included."""

DEFAULT_RETRY_TIMEOUT: Final = 8.0
"""Seconds one token fetch may take in all, its retries and waits included.

Shorter than gql's default ``execute_timeout`` (10 s), so that a token endpoint that
hangs ends in a :class:`~gql_service_auth.TokenRequestError` saying so, not in gql's
bare ``TimeoutError``.
"""

FETCH_GRACE: Final = 0.5
"""Seconds a token fetch may run past its ``RetryPolicy.timeout`` before it is cut off.

The grant keeps to its own deadline; this bounds a fetcher that does not.
"""

DEFAULT_WAIT_INITIAL: Final = 0.1
"""Seconds of the first backoff wait; each further wait doubles, plus jitter."""

DEFAULT_WAIT_MAX: Final = 5.0
"""Seconds: the longest single backoff wait (a server's ``Retry-After`` may ask for more)."""

DEFAULT_WAIT_JITTER: Final = 0.5
"""Seconds: the most random jitter added to a backoff wait, to spread out retrying clients."""

MAX_TOKEN_RESPONSE_BYTES: Final = 64 * 1024
"""Largest token endpoint body read; a token response is a few hundred bytes."""

MAX_SERVER_TEXT: Final = 300
"""Longest text from a server (an ``error_description``) quoted in an exception message."""

STORE_TIMEOUT: Final = 0.25
"""Seconds each call of a shared token store may take before the store counts as down.

Short, and never retried by the client: the process then fetches its token itself, so
a slow or absent Redis costs a request at most this long.
"""

STORE_CONNECT_TIMEOUT: Final = 2.0
"""Seconds a store call may wait for the store to be ready before its own ``timeout`` runs.

Ready means set up (a Redis connection opened, TLS and AUTH done, a cluster discovered, the
scripts loaded; SQLite opened) and a turn to run. The first call of a process pays it; on a
busy host, or with a Redis far away, it takes several round trips, which
``STORE_TIMEOUT`` is not meant to cover. A store that cannot be reached at all fails at once.
"""

STORE_IDENTITIES_KEPT: Final = 128
"""Sets of credentials a store keeps derived keys for, the most recently used.

Twice the token managers a process keeps (``SHARED_TOKENS_KEPT``): beyond it, the keys of
an identity are derived again (microseconds), rather than kept, with its client secret,
for as long as the process lives.
"""

STORE_COOLDOWN: Final = 10.0
"""Seconds a shared token store is left alone after it failed or was slow."""

STORE_LOCK_TTL: Final = 2.0
"""Seconds a shared store's fetch lock lives unless its holder extends it.

The holder extends it every third of that while its fetch runs, so a fetch may take as
long as it must, and the processes waiting on a holder that died take over within this.
"""

STORE_POLL_MIN: Final = 0.02
"""Seconds: the shortest wait between two reads of a process waiting for another's fetch."""

STORE_POLL_MAX: Final = 0.08
"""Seconds: the longest such wait; each is drawn at random in between (jitter)."""

SHARED_TOKENS_KEPT: Final = 64
"""Token managers a process keeps while their token is usable, with no transport left.

So that transports built one per call share a token whatever the garbage collector does;
one per set of credentials and token settings, the least recently used going first.
"""

SHARED_PAUSES_KEPT: Final = 64
"""Sets of credentials whose refusals a process remembers once no token manager is left.

While an API refuses every fresh token of a set of credentials, renewals pause; transports
built one per call then leave no manager alive to remember it, so the process keeps what
the refusals taught (counts and times, no secret) for the next one. The least recently
refused goes first.
"""

LOGGER_NAME: Final = "gql_service_auth"
"""Name of the package's logger; event names in log records start with it."""
