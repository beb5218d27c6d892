"""An OAuth2 transport's settings, checked, and the token manager they make, for any stack.

The adapter brings what is its own: how the token request is posted (a
:class:`~gql_service_auth._core.oauth2.FormPoster`). Everything else is decided here once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from yarl import URL

from .._stores.protocol import TokenIdentity, TokenStore
from . import fork as _fork
from .budget import DEFAULT_BUDGET, GuardedFetch, TokenBudget, credentials_key
from .config import check_seconds, endpoint_or_env, shown_url
from .constants import (
    ENV_AUTH_URL,
    ENV_BASE_URL,
    ENV_TOKEN_STORE_CONNECT_TIMEOUT,
    ENV_TOKEN_STORE_TIMEOUT,
    ENV_TOKEN_STORE_URL,
    FETCH_GRACE,
    GRAPHQL_PATH,
    REDIS_SCHEMES,
    STORE_CONNECT_TIMEOUT,
    STORE_TIMEOUT,
    TOKEN_PATH,
)
from .credentials import ClientCredentials
from .errors import ConfigurationError
from .events import Emitter, Subscribers
from .oauth2 import (
    ClientAuthMethod,
    ClientCredentialsGrant,
    FormPoster,
    RetryPolicy,
    checked_token_params,
)
from .rotation import Credentials, RotatingCredentials
from .sharing import SHARED, Same, SharingKey, api_endpoint
from .telemetry import NAMESPACE, credentials_tag
from .token import Clock, TokenFetcher

if TYPE_CHECKING:
    from yarl import URL

    from .._stores.level import SharedLevel, TokenSource
    from .rotating_source import RotatingIdentity, RotatingSource
    from .tokens import TokenManager

_STORE_METHODS = ("load", "save", "discard", "lock", "unlock", "failure")


def check_renewal_settings(
    *, refresh_margin: object, default_expires_in: object, max_renewals: object
) -> None:
    """Refuse renewal settings that are not numbers in their range, naming the setting."""
    check_seconds("refresh_margin", refresh_margin)
    check_seconds("default_expires_in", default_expires_in, positive=True)
    if isinstance(max_renewals, bool) or not isinstance(max_renewals, int) or max_renewals < 0:
        raise ConfigurationError("max_renewals must be an int of at least 0")


def store_from_env(environ: Mapping[str, str]) -> TokenStore | None:
    """The store ``SERVICE_TOKEN_STORE_URL`` names, one per URL per process, or ``None``.

    One per URL: a transport per job must not open a store per job. ``file:///dir`` is a
    :class:`~gql_service_auth.local.LocalTokenStore` in that directory; ``redis://``,
    ``rediss://``, ``unix://``, ``redis+cluster://`` and ``redis+sentinel://`` URLs (and
    their ``rediss+`` forms) are a :class:`~gql_service_auth.redis.RedisTokenStore`.
    ``SERVICE_TOKEN_STORE_TIMEOUT`` and ``SERVICE_TOKEN_STORE_CONNECT_TIMEOUT`` set its
    bounds.

    Raises:
        ConfigurationError: a URL of another form, or a bound that is no number of seconds.
        ImportError: the extra the URL needs is not installed: ``[local]`` for ``file://``,
            ``[redis]`` for Redis.
    """
    url = environ.get(ENV_TOKEN_STORE_URL, "").strip()
    if not url:
        return None
    timeout = _seconds(environ, ENV_TOKEN_STORE_TIMEOUT, STORE_TIMEOUT)
    connect_timeout = _seconds(environ, ENV_TOKEN_STORE_CONNECT_TIMEOUT, STORE_CONNECT_TIMEOUT)
    # Imported only here: each extra's module is the one place that needs its dependency.
    try:
        if url.startswith("file://"):
            from ..local import shared_store as local_store

            return local_store(url, timeout=timeout, connect_timeout=connect_timeout)
        if url.startswith(REDIS_SCHEMES):
            from ..redis import shared_store

            return shared_store(url, timeout=timeout, connect_timeout=connect_timeout)
    except ConfigurationError as exc:
        # The message quotes the URL; which variable gave it is known only here.
        raise ConfigurationError(f"{ENV_TOKEN_STORE_URL}: {exc}") from None
    raise ConfigurationError(
        f"{ENV_TOKEN_STORE_URL}={shown_url(url)} must be a file:///absolute/directory URL (a "
        "store on this host) or a Redis URL: redis://, rediss:// or unix://, "
        "redis+cluster:// (a Redis Cluster) or redis+sentinel:// (Sentinel), with rediss+ "
        "for TLS"
    )


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    """The variable ``name`` in seconds, or ``default`` when unset."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        seconds: object = float(text)
    except ValueError:
        seconds = text
    check_seconds(name, seconds, positive=True)
    return float(text)


def check_token_store(token_store: object) -> None:
    """Refuse a ``token_store`` that is not a :class:`TokenStore`, naming what it lacks."""
    if token_store is None:
        return
    for method in _STORE_METHODS:
        if not callable(getattr(token_store, method, None)):
            raise ConfigurationError(
                f"token_store must be a TokenStore; {type(token_store).__name__} has no {method}()"
            )


def joined_scope(scope: str | Sequence[str] | None) -> str | None:
    """``scope`` as the token request sends it: one string, space-delimited (RFC 6749 3.3).

    Raises:
        ConfigurationError: neither a str nor a sequence of str.
    """
    if scope is None or isinstance(scope, str):
        return scope
    if not isinstance(scope, Sequence) or not all(isinstance(each, str) for each in scope):
        raise ConfigurationError(
            f"scope must be a str or a sequence of str, not {type(scope).__name__}"
        )
    return " ".join(scope)


def token_manager(
    token_url: str | URL,
    credentials: Credentials,
    *,
    post: FormPoster,
    scope: str | None,
    token_params: Mapping[str, str] | None,
    token_auth_method: ClientAuthMethod,
    refresh_margin: float,
    default_expires_in: float,
    policy: RetryPolicy,
    emit: Emitter,
    clock: Clock | None,
    token_store: TokenStore | None,
    share: bool,
    api_url: str | URL | None,
    budget: TokenBudget | None = DEFAULT_BUDGET,
) -> TokenManager:
    """The token manager of one transport: the grant, and the shared store under it.

    With ``share``, the process's manager for the same token requests to the API at
    ``api_url`` (see :func:`~.sharing.api_endpoint`), if it has one (see
    ``_core/sharing.py``); ``emit`` hears its events either way. Credentials that can
    change have a grant and a store entry per pair read (see ``_core/rotating_source.py``),
    and are shared by their source.
    """
    params = checked_token_params(token_params)
    check_token_store(token_store)
    clock = clock or time.monotonic
    # The token machinery, here rather than at import: a process that imports the requests
    # or httpx transports, or uses an API key, never needs it (figure 15 of make bench).
    machinery = _fork.imported(_token_machinery)
    grant_and_source = partial(
        _grant_and_source,
        machinery,
        token_url,
        scope=scope,
        params=params,
        auth_method=token_auth_method,
        policy=policy,
        post=post,
        token_store=token_store,
        refresh_margin=float(refresh_margin),
        default_expires_in=float(default_expires_in),
        budget=budget,
    )

    def build() -> TokenManager:
        subscribers = Subscribers()
        make = partial(grant_and_source, emit=subscribers)
        source: TokenSource
        grant: TokenFetcher
        if isinstance(credentials, RotatingCredentials):
            rotating = machinery.rotating_source(credentials, make)
            grant, source = rotating.fetch, rotating
        else:
            grant, source = make(credentials)
        return machinery.manager(
            grant,
            refresh_margin=float(refresh_margin),
            default_expires_in=float(default_expires_in),
            fetch_timeout=policy.timeout + FETCH_GRACE,
            cooldown=policy.pause_after,
            max_attempts=policy.attempts,
            clock=clock,
            emit=subscribers,
            source=source,
            server=_host_and_port(token_url),
            token_url=str(token_url),
            route=getattr(post, "route", None),
            labels=_GaugeLabels(token_url, credentials, scope),
        )

    if share:
        sharing_key = getattr(post, "sharing_key", None)
        key = SharingKey(
            api_endpoint(api_url),
            _identity(machinery, token_url, credentials, scope, params, token_auth_method),
            sharing_key(token_url) if callable(sharing_key) else Same(post),
            policy,
            float(refresh_margin),
            float(default_expires_in),
            Same(clock),
            Same(token_store),
        )
        manager = SHARED.manager(key, build)
    else:
        manager = build()
    manager.subscribe(emit)
    return manager


def _identity(
    machinery: _Machinery,
    token_url: str | URL,
    credentials: Credentials,
    scope: str | None,
    params: Mapping[str, str],
    auth_method: ClientAuthMethod,
) -> TokenIdentity | RotatingIdentity:
    """What the transports that share a token share: the credentials and the token
    parameters; for credentials that can change, their source."""
    if not isinstance(credentials, RotatingCredentials):
        return _identity_of(token_url, credentials, scope, params, auth_method)
    # The parameters, with no credentials: the source stands for them.
    no_pair = ClientCredentials("-", "-")
    parameters = _identity_of(token_url, no_pair, scope, params, auth_method)
    return machinery.rotating_identity(credentials.source, parameters)


def _identity_of(
    token_url: str | URL,
    credentials: ClientCredentials,
    scope: str | None,
    params: Mapping[str, str],
    auth_method: ClientAuthMethod,
) -> TokenIdentity:
    return TokenIdentity.of(
        token_url=str(token_url),
        client_id=credentials.client_id,
        client_secret=credentials.client_secret,
        scope=scope,
        token_params=params,
        auth_method=auth_method,
    )


def _grant_and_source(
    machinery: _Machinery,
    token_url: str | URL,
    credentials: ClientCredentials,
    *,
    scope: str | None,
    params: Mapping[str, str],
    auth_method: ClientAuthMethod,
    policy: RetryPolicy,
    post: FormPoster,
    emit: Emitter,
    token_store: TokenStore | None,
    refresh_margin: float,
    default_expires_in: float,
    budget: TokenBudget | None,
) -> tuple[GuardedFetch, TokenSource]:
    """The grant of ``credentials`` behind their budget, and where their tokens come from:
    the endpoint, or the store's entry of their identity in front of it. Module-level: a
    copy pickles it."""
    grant = GuardedFetch(
        ClientCredentialsGrant(
            token_url,
            credentials,
            scope=scope,
            extra_params=params,
            auth_method=auth_method,
            policy=policy,
            post=post,
            emit=emit,
        ),
        credentials_key(str(token_url), credentials.client_id, credentials.client_secret),
        budget,
        emit,
    )
    if token_store is None:
        return grant, machinery.endpoint
    level = machinery.shared_level(
        token_store,
        _identity_of(token_url, credentials, scope, params, auth_method),
        refresh_margin=refresh_margin,
        default_expires_in=default_expires_in,
        emit=emit,
    )
    return grant, level


class _Machinery(NamedTuple):
    """What :func:`token_manager` builds with, imported with the first OAuth2 transport."""

    manager: type[TokenManager]
    endpoint: TokenSource
    shared_level: type[SharedLevel]
    rotating_source: type[RotatingSource]
    rotating_identity: type[RotatingIdentity]


def _token_machinery() -> _Machinery:
    from .._stores.level import ENDPOINT, SharedLevel
    from .rotating_source import RotatingIdentity, RotatingSource
    from .tokens import TokenManager

    return _Machinery(TokenManager, ENDPOINT, SharedLevel, RotatingSource, RotatingIdentity)


def api_key_env(
    environ: Mapping[str, str],
    *,
    url: str | None,
    client_id: str | None,
    client_secret: str | None,
    reads_url: bool = True,
) -> dict[str, Any]:
    """An API key transport's or auth's ``from_env`` arguments: the endpoint and the
    credentials, each given by keyword or read from its ``SERVICE_*`` variable (the
    credentials may be files: see :func:`~gql_service_auth.credentials.credentials_env`); without
    ``reads_url`` (an auth signing any origin), ``url`` as given."""
    # The file sources read files: their module, not the core's, does that I/O.
    from ..credentials import credentials_env

    return {
        "url": endpoint_or_env(environ, url, ENV_BASE_URL, GRAPHQL_PATH) if reads_url else url,
        **credentials_env(environ, client_id=client_id, client_secret=client_secret),
    }


def oauth2_env(
    environ: Mapping[str, str],
    kwargs: dict[str, Any],
    *,
    url: str | None,
    token_url: str | None,
    client_id: str | None,
    client_secret: str | None,
    reads_url: bool = True,
) -> dict[str, Any]:
    """An OAuth2 transport's or auth's ``from_env`` arguments, ``kwargs`` included: with the
    token URL, and the store ``SERVICE_TOKEN_STORE_URL`` names unless ``kwargs`` has one."""
    if "token_store" not in kwargs and (store := store_from_env(environ)) is not None:
        kwargs = {**kwargs, "token_store": store}
    return {
        **api_key_env(
            environ,
            url=url,
            client_id=client_id,
            client_secret=client_secret,
            reads_url=reads_url,
        ),
        "token_url": endpoint_or_env(environ, token_url, ENV_AUTH_URL, TOKEN_PATH),
        **kwargs,
    }


def _host_and_port(url: object) -> tuple[str, int | None] | None:
    """The token endpoint's host and port, as a span shows them (never its path or query)."""
    parsed = URL(str(url))
    return (parsed.host, parsed.port) if parsed.host else None


class _GaugeLabels:
    """The attributes of a manager's token.remaining_life points: the token endpoint, as
    its span names it, and a digest of the credentials in use (never the client id), read
    at each collection so that credentials that change move the point."""

    __slots__ = ("_credentials", "_scope", "_server", "_token_url")

    def __init__(self, token_url: object, credentials: Credentials, scope: str | None) -> None:
        self._token_url = str(token_url)
        self._credentials = credentials
        self._scope = scope
        self._server = _host_and_port(token_url)

    def __reduce__(self) -> tuple[Any, ...]:
        return _GaugeLabels, (self._token_url, self._credentials, self._scope)

    def __repr__(self) -> str:
        return "<_GaugeLabels>"

    def __call__(self) -> dict[str, str | int]:
        tag = credentials_tag(self._token_url, self._credentials.client_id, self._scope)
        labels: dict[str, str | int] = {f"{NAMESPACE}.credentials": tag}
        if self._server is not None:
            labels["server.address"] = self._server[0]
            if self._server[1] is not None:
                labels["server.port"] = self._server[1]
        return labels
