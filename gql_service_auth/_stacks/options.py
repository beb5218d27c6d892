"""The keywords of the token and its renewal, declared once for every OAuth2 class of every
stack, and the one builder that checks them.

Each OAuth2 transport and auth object takes these keywords as ``**options`` (typed by
:class:`TokenOptions`) beside its own stack's, and hands them to :func:`oauth2_settings`:
the checks run once, in one order, whatever the stack, and the defaults live here only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypedDict

from yarl import URL

from .._core.budget import DEFAULT_BUDGET, TokenBudget
from .._core.config import check_url
from .._core.constants import DEFAULT_EXPIRES_IN, DEFAULT_MAX_RENEWALS, DEFAULT_REFRESH_MARGIN
from .._core.errors import ConfigurationError
from .._core.events import Emitter, EventHook
from .._core.oauth2 import (
    ClientAuthMethod,
    RetryPolicy,
    checked_auth_method,
    checked_token_params,
)
from .._core.rotation import Credentials, CredentialsGiven, credentials_of
from .._core.settings import (
    check_renewal_settings,
    check_token_store,
    joined_scope,
    token_manager,
)
from .._core.token import Clock

if TYPE_CHECKING:  # the token machinery loads with the first OAuth2 transport
    from .._core.tokens import TokenManager
from .._stores.protocol import TokenStore
from .aiohttp_token_post import AiohttpFormPoster
from .aiohttp_token_session import SslSetting, TokenSessionArgs, resolve_token_session
from .http_auth import InsecureOrigins, OAuth2Rules


class TokenOptions(TypedDict, total=False):
    """The keywords of the token and its renewal, taken by every OAuth2 transport and auth
    object, of every stack; each may be left out for its default.

    Attributes:
        scope: Scope to request, a string or a sequence joined by spaces; ``None`` (the
            default) sends none.
        token_params: Further form fields for the token request (``audience``...).
        token_auth_method: ``"client_secret_post"`` (form fields, as the contract says;
            the default) or ``"client_secret_basic"`` (HTTP Basic).
        refresh_margin: Seconds before expiry at which a token is renewed (60), capped at
            half its lifetime. An upload, which cannot be sent twice, asks for a token
            valid at least this long.
        default_expires_in: Seconds a token is trusted when the server gives no usable
            ``expires_in`` (none, unreadable, or 0 and less); 300.
        max_renewals: Renewals, and so re-sends, per request after a refusal (1); 0 never
            re-sends. Requests refused with the same token share one renewal.
        retry: Bounds and backoff of the token endpoint's retries, and the pause of
            renewals while fresh tokens keep being refused; ``None`` means
            ``RetryPolicy()``.
        on_event: Called with each :class:`~gql_service_auth.AuthEvent` (token fetched,
            retry scheduled...), e.g. to count renewals; before the token is handed to
            the transports sharing it, so keep it quick.
        clock: Monotonic clock in seconds, for token lifetimes, renewal backoff and pauses;
            ``time.monotonic`` when ``None``.
        allow_insecure_http: Allow plain ``http://`` URLs to hosts that are not loopback,
            and a plain ``http://`` ``token_url`` through an ``http://`` proxy that is not.
        token_session_args: aiohttp ``ClientSession`` keywords for the token request's
            own session (see :class:`~gql_service_auth.TokenSessionArgs`): ``trust_env``,
            ``proxy``, ``proxy_auth``, ``connector`` (a callable returning a new
            connector, as the fetch runs on an event loop of its own), ``trace_configs``,
            ``read_bufsize``, ``max_line_size``, ``max_field_size``; any other key is
            refused. ``None`` (the default) takes the proxy settings of the GraphQL
            requests' client, so the token request goes where they go; ``{}`` sends it
            directly whatever the client says.
        token_proxy: The token request's proxy, an ``http://`` or ``https://`` URL (a
            ``str`` or ``yarl.URL``, credentials in it as ``user:password@``), in place of
            any other; ``None`` keeps what ``token_session_args`` says. Never shown in a
            ``repr`` or message.
        token_store: A store that shares tokens with other processes, such as
            :class:`~gql_service_auth.redis.RedisTokenStore`: a process then asks the
            token endpoint only when no other process has a token it can use. ``None``
            keeps tokens in this process only.
        share_tokens: Share tokens with the other transports and auth objects of this
            process (of any stack) whose token requests are the same: same credentials,
            scope, ``token_params``, ``token_auth_method``, token request settings (TLS,
            proxy), ``retry``, ``refresh_margin``, ``default_expires_in``, ``clock`` and
            ``token_store``. A transport built per call then costs no token request of
            its own. ``False`` keeps this one's tokens its own. ``True`` by default.
        credentials: In place of ``client_id`` and ``client_secret``, credentials that
            can change without a restart: a :class:`~gql_service_auth.CredentialsFile`,
            :class:`~gql_service_auth.CredentialsFiles`,
            :class:`~gql_service_auth.CredentialsCallback`, or a callable returning
            ``(client_id, client_secret)``. Read again when they may have changed; a
            token of the old credentials stays in use until one of the new lands (see
            docs/rotating-credentials.md).
        token_budget: The most token requests these credentials may cost in a window,
            counted across the process and, with ``token_store``, the fleet, and how long
            no request goes after the token endpoint refused them (see
            :class:`~gql_service_auth.TokenBudget`; the default one when left out).
            ``None`` sets no ceiling; refused credentials are still not asked again at
            once. See docs/token-budget.md.
    """

    scope: str | Sequence[str] | None
    token_params: Mapping[str, str] | None
    token_auth_method: ClientAuthMethod
    refresh_margin: float
    default_expires_in: float
    max_renewals: int
    retry: RetryPolicy | None
    on_event: EventHook | None
    clock: Clock | None
    allow_insecure_http: bool
    token_session_args: TokenSessionArgs | None
    token_proxy: str | URL | None
    token_store: TokenStore | None
    share_tokens: bool
    credentials: CredentialsGiven | None
    token_budget: TokenBudget | None


# Shown where users import it from, as the errors are (see _core/errors.py).
TokenOptions.__module__ = "gql_service_auth"

TOKEN_OPTIONS: Final = frozenset(TokenOptions.__annotations__)
"""The names of the token keywords, told apart from a stack's own in a ``**kwargs``."""


def token_options(kwargs: dict[str, Any]) -> TokenOptions:
    """Take the token keywords out of ``kwargs``, which keeps the stack's own (requests'
    and httpx's transports hand those to their client)."""
    taken = {name: kwargs.pop(name) for name in TOKEN_OPTIONS & kwargs.keys()}
    return taken  # type: ignore[return-value]  # only TokenOptions' keys were taken


def check_known(options: Mapping[str, object], caller: str) -> None:
    """Refuse a keyword that is no token option, as Python refuses one a function does not
    take: ``caller`` names the constructor. Checked first, so that a misspelt option is
    not reported as the setting it failed to give.

    Raises:
        TypeError: the first such keyword.
    """
    for name in options:
        if name not in TOKEN_OPTIONS:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")


def _check_kinds(options: TokenOptions) -> None:
    """Refuse options of the wrong kind that nothing else checks when built."""
    retry = options.get("retry")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
    for name in ("on_event", "clock"):
        value = options.get(name)
        if value is not None and not callable(value):
            raise ConfigurationError(f"{name} must be callable, not {type(value).__name__}")
    share = options.get("share_tokens", True)
    if not isinstance(share, bool):
        raise ConfigurationError(f"share_tokens must be a bool, not {type(share).__name__}")


def _budget(options: TokenOptions) -> TokenBudget | None:
    budget = options.get("token_budget", DEFAULT_BUDGET)
    if budget is not None and not isinstance(budget, TokenBudget):
        raise ConfigurationError(
            f"token_budget must be a TokenBudget or None, not {type(budget).__name__}"
        )
    return budget


def oauth2_settings(
    token_url: str | URL,
    client_id: str | None,
    client_secret: str | None,
    options: TokenOptions,
    *,
    caller: str,
    ssl: SslSetting,
    verify: object = None,
    inherited: Mapping[str, Any] | None,
    inherited_from: str = "client_session_args",
) -> OAuth2Settings:
    """The settings of one OAuth2 transport or auth object, checked, with their defaults.

    ``caller`` names the constructor in the ``TypeError`` of a keyword it does not take,
    as Python's own would. ``ssl`` is how the token request verifies the token endpoint
    (aiohttp's ``ssl``; ``verify``, requests' and httpx's, tells alike posters apart).
    ``inherited`` is what the token request takes from the GraphQL requests' client when
    ``token_session_args`` is ``None`` (``trust_env``, ``proxy``), named
    ``inherited_from`` in messages.

    Raises:
        TypeError: a keyword that is not a token option.
        ConfigurationError: a bad setting; the message names it.
    """
    check_known(options, caller)
    _check_kinds(options)
    emit = Emitter(options.get("on_event"))
    credentials = credentials_of(client_id, client_secret, options.get("credentials"), emit)
    allow_insecure_http = options.get("allow_insecure_http", False)
    check_url(token_url, what="token_url", allow_insecure_http=allow_insecure_http)
    session = resolve_token_session(
        options.get("token_session_args"),
        client_session_args=inherited,
        token_proxy=options.get("token_proxy"),
        token_url=token_url,
        allow_insecure_http=allow_insecure_http,
        inherited_from=inherited_from,
    )
    refresh_margin = options.get("refresh_margin", DEFAULT_REFRESH_MARGIN)
    default_expires_in = options.get("default_expires_in", DEFAULT_EXPIRES_IN)
    max_renewals = options.get("max_renewals", DEFAULT_MAX_RENEWALS)
    check_renewal_settings(
        refresh_margin=refresh_margin,
        default_expires_in=default_expires_in,
        max_renewals=max_renewals,
    )
    retry = options.get("retry")
    if retry is None:
        retry = RetryPolicy()
    token_store = options.get("token_store")
    check_token_store(token_store)
    manager = partial(
        token_manager,
        token_url,
        credentials,
        post=AiohttpFormPoster(ssl=ssl, session=session, verify=verify),
        scope=joined_scope(options.get("scope")),
        token_params=checked_token_params(options.get("token_params")),
        token_auth_method=checked_auth_method(
            options.get("token_auth_method", "client_secret_post")
        ),
        refresh_margin=refresh_margin,
        default_expires_in=default_expires_in,
        policy=retry,
        emit=emit,
        clock=options.get("clock"),
        token_store=token_store,
        share=options.get("share_tokens", True),
        budget=_budget(options),
    )
    return OAuth2Settings(
        credentials,
        manager,
        max_renewals,
        float(refresh_margin),
        emit,
        InsecureOrigins(allow_insecure_http),
    )


@dataclass(frozen=True, slots=True, repr=False)
class OAuth2Settings:
    """Checked settings; :meth:`rules` makes the rules, and token manager, for an API."""

    credentials: Credentials
    manager: Callable[..., TokenManager]  # token_manager, all but api_url given
    max_renewals: int
    refresh_margin: float
    emit: Emitter
    origins: InsecureOrigins

    def __repr__(self) -> str:
        return f"<OAuth2Settings client_id={self.credentials.client_id!r}>"

    def rules(self, api_url: str | URL | None) -> OAuth2Rules:
        """The rules of requests to the API at ``api_url``, with its token manager."""
        return OAuth2Rules(
            self.credentials,
            self.manager(api_url=api_url),
            self.max_renewals,
            self.refresh_margin,
            self.emit,
            self.origins,
        )
