"""The settings half of the auth objects for requests and httpx: constructors, ``from_env``.

Each stack's module adds the other half, what its client calls (a requests hook, an
httpx auth flow), to these bases. Token requests go out through the aiohttp poster of
the other transports, on a thread and event loop of their own, whatever stack signs the
GraphQL requests: one token manager then serves every stack alike.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from ssl import SSLContext
from typing import Any

from yarl import URL

from .._core import fork as _fork
from .._core.config import check_url
from .._core.constants import ENV_BASE_URL
from .._core.errors import ConfigurationError
from .._core.redact import forgets_on_error
from .._core.rotation import Credentials, CredentialsGiven, credentials_of
from .._core.settings import api_key_env, oauth2_env
from .._core.sharing import api_endpoint
from .._core.token import AccessToken
from .aiohttp_token_post import ssl_of_verify
from .aiohttp_token_session import SslSetting
from .http_auth import (
    ApiKeyRules,
    InsecureOrigins,
    OAuth2Rules,
    ServiceOrigin,
    remember_environment_proxies,
)
from .options import OAuth2Settings, TokenOptions, check_known, oauth2_settings

# At run time: typing.get_type_hints() of the constructors resolves Unpack.
if sys.version_info >= (3, 11):
    from typing import Self, Unpack
else:
    from typing_extensions import Self, Unpack


class OAuth2AuthOptions(TokenOptions, total=False):
    """The optional keywords of the OAuth2 auth objects, for ``from_env``: the token's
    (:class:`~gql_service_auth.TokenOptions`) and the auth's own."""

    verify: bool | str | SSLContext
    sign_any_origin: bool


def service_origin(
    kind: str, url: str | URL | None, *, sign_any_origin: bool, allow_insecure_http: bool
) -> ServiceOrigin:
    """The origin an auth object of class ``kind`` signs requests to: ``url``'s.

    Raises:
        ConfigurationError: no ``url`` and no ``sign_any_origin``; both; or a ``url``
            that credentials may not go to (see :func:`~gql_service_auth._core.config.check_url`).
    """
    if sign_any_origin:
        if url is not None:
            raise ConfigurationError(f"{kind} takes url= or sign_any_origin=True, not both")
        return ServiceOrigin(None)
    if url is None:
        raise ConfigurationError(
            f"{kind} signs only the requests to its service: pass url= (the API's URL, "
            f"which from_env() reads from {ENV_BASE_URL}), or sign_any_origin=True to sign "
            "every request its client sends, to any host"
        )
    check_url(url, what="url", allow_insecure_http=allow_insecure_http)
    remember_environment_proxies()  # the client's own proxies are not seen here
    return ServiceOrigin(str(url))


_ORIGINS_KEPT = 64
"""How many origins an OAuth2 auth object keeps its decision for (signed or not, and the
rules): a client that talks to many hosts decides again, past that."""


class _PerApi:
    """A standalone auth object's rules for each API (origin) it signs requests to.

    Each origin's token is shared with the auth objects of the same settings for that
    origin (see ``_core/sharing.py``), so what one API refuses never drops or pauses the token
    of another. The latest :data:`_APIS_KEPT` origins are kept (the process keeps more,
    see ``_core/sharing.py``); a copy or an unpickled one starts with none.
    """

    def __init__(self, settings: OAuth2Settings) -> None:
        self.settings = settings
        self._setup()

    def _setup(self) -> None:
        self._by_api: OrderedDict[str | None, OAuth2Rules] = OrderedDict()
        self._lock = threading.Lock()
        self.latest: OAuth2Rules | None = None
        _fork.reset_in_child(self)

    def __repr__(self) -> str:
        return f"<rules for {len(self._by_api)} APIs>"

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.settings = state["settings"]
        self._setup()

    def rules(self, url: object) -> OAuth2Rules:
        """The rules of a request to ``url``, once its origin is one credentials may go to.

        Raises:
            ConfigurationError: plain http to a host that is not loopback, not allowed.
        """
        return self.rules_of_api(url)[0]

    def rules_of_api(self, url: object) -> tuple[OAuth2Rules, str | None]:
        """:meth:`rules`, and the API they are kept under (see :meth:`kept`)."""
        parsed = URL(str(url))
        self.settings.origins.check(parsed.scheme, parsed.host or "")
        api = api_endpoint(parsed, path=False)
        return self.kept(api, None), api

    def kept(self, api: str | None, rules: OAuth2Rules | None) -> OAuth2Rules:
        """The rules of ``api``, now the latest used and the last to be dropped.

        ``rules``: those the auth kept for the API's origin (see ``_of_origin``), used
        again; kept here again if they were dropped meanwhile, so that an origin in use
        keeps one token however many others pass. ``None``: new rules if there are none.
        """
        if rules is not None and self.latest is rules:
            # The API of the last request (almost always the only one): already the last
            # to be dropped, and no lock to take. Racing another API's request, it may be
            # second to last: a bound of 16 APIs that is kept near enough.
            return rules
        with self._lock:
            current = self._by_api.get(api)
            if current is None:
                current = self._by_api[api] = (
                    rules if rules is not None else self.settings.rules(api)
                )
                while len(self._by_api) > _APIS_KEPT:
                    self._by_api.popitem(last=False)
            self._by_api.move_to_end(api)
            self.latest = current
        return current

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork


_APIS_KEPT = 16
"""How many origins a standalone auth object keeps rules for: one, in the common case."""


class ApiKeyAuthBase:
    """Signs the requests to its service with the API key (``SERVICE-API-KEY id:secret``).

    Only the requests to the origin of ``url`` (its scheme, host and port) are signed: a
    request to any other host goes out untouched, so a client that also calls another
    service never sends it the key. A request that already carries an ``Authorization``
    header is the caller's own, and is left alone. Credentials go only over https, or
    plain http to loopback, unless ``allow_insecure_http``; a proxy set on the client
    itself is not seen (give the service's ``https://`` URL to go through one). A refused
    key is not the auth's to retry:
    the response comes back as the service sent it.

    Args:
        client_id: The Client Id from the console.
        client_secret: The Client Secret from the console; never shown.
        credentials: In place of ``client_id`` and ``client_secret``: credentials that
            can change without a restart (a :class:`~gql_service_auth.CredentialsFile`,
            :class:`~gql_service_auth.CredentialsFiles`,
            :class:`~gql_service_auth.CredentialsCallback`, or a callable returning
            ``(client_id, client_secret)``); see docs/rotating-credentials.md.
        url: The API's URL (``{base_url}/graphql``): requests to its origin are signed.
        sign_any_origin: Sign every request the client sends, to any host, instead.
        allow_insecure_http: Allow plain ``http://`` to hosts that are not loopback.

    Raises:
        ConfigurationError: bad credentials; neither ``url`` nor ``sign_any_origin``.
    """

    @forgets_on_error
    def __init__(
        self,
        client_id: str | None = None,
        client_secret: str | None = None,
        *,
        credentials: CredentialsGiven | None = None,
        url: str | URL | None = None,
        sign_any_origin: bool = False,
        allow_insecure_http: bool = False,
    ) -> None:
        self._service = service_origin(
            type(self).__name__,
            url,
            sign_any_origin=sign_any_origin,
            allow_insecure_http=allow_insecure_http,
        )
        self._rules = ApiKeyRules(
            credentials_of(client_id, client_secret, credentials),
            InsecureOrigins(allow_insecure_http),
        )

    @classmethod
    @forgets_on_error
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        url: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        sign_any_origin: bool = False,
        allow_insecure_http: bool = False,
    ) -> Self:
        """Build the auth from ``SERVICE_BASE_URL`` (``/graphql`` is appended unless it
        ends with it), ``SERVICE_CLIENT_ID`` and ``SERVICE_CLIENT_SECRET``.

        A setting given by keyword wins: its variable is then not read; with
        ``sign_any_origin=True``, ``SERVICE_BASE_URL`` is not read.

        Raises:
            ConfigurationError: a variable is missing or empty; the message names it.
        """
        return cls(
            **api_key_env(
                environ,
                url=url,
                client_id=client_id,
                client_secret=client_secret,
                reads_url=not sign_any_origin,
            ),
            sign_any_origin=sign_any_origin,
            allow_insecure_http=allow_insecure_http,
        )

    #: The auth of a transport, which sends a call carrying the caller's own
    #: ``Authorization`` (in ``extra_args``) without it: the auth need not look for one in
    #: each request's headers. An ``Authorization`` set on the transport's client itself
    #: is refused when the transport is built (``headers=``), and replaced if set later.
    _own_client = False

    @classmethod
    def _for_transport(
        cls,
        client_id: str | None,
        client_secret: str | None,
        url: str,
        allow_insecure_http: bool,
        credentials: CredentialsGiven | None = None,
    ) -> Self:
        auth = cls(
            client_id,
            client_secret,
            credentials=credentials,
            url=url,
            allow_insecure_http=allow_insecure_http,
        )
        auth._own_client = True
        return auth

    def _signs(self, scheme: str, host: str | None, port: int | None) -> bool:
        """Whether a request to this origin is the service's, to sign."""
        return self._service.covers(scheme, host, port)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} client_id={self._rules.credentials.client_id!r}>"


class OAuth2AuthBase:
    """Signs each request with an OAuth 2.0 client-credentials access token.

    The first request fetches a token; every request and thread shares one fetch; a
    token is renewed in the background ``refresh_margin`` seconds before it expires; and
    when the service answers ``UNAUTHENTICATED`` (or HTTP 401 without a GraphQL body) to
    a request that ran nothing and whose body can be sent again, the token is renewed
    and the request re-sent, up to ``max_renewals`` times. A request refused to the end
    comes back as the service answered it. A request that already carries an
    ``Authorization`` header is the caller's own: it is left alone, and never re-sent.

    Only the requests to the origin of ``url`` (its scheme, host and port) are signed: a
    request to any other host goes out untouched, and fetches no token. With
    ``sign_any_origin=True``, every request is signed, and each origin has a token of its
    own, shared with the other auth objects of the same settings for that origin, so one
    API's refusals never drop or pause another's token.

    The other keywords (``scope``, ``token_params``, ``token_auth_method``,
    ``refresh_margin``, ``default_expires_in``, ``max_renewals``, ``retry``, ``on_event``,
    ``clock``, ``token_session_args``, ``token_proxy``, ``token_store``, ``share_tokens``)
    are :class:`~gql_service_auth.TokenOptions`, as every OAuth2 transport takes them.
    The token request goes through aiohttp; with ``token_session_args=None`` it takes
    proxies from the environment (``trust_env``), as requests and httpx do. A proxy set on
    the client itself is not seen by the auth, which refuses plain ``http://`` to hosts
    that are not loopback and through the environment's remote proxy only: through a proxy
    of your own, give the service's ``https://`` URL.

    Args:
        token_url: The token endpoint, ``{auth_url}/oauth2/token``.
        client_id: The Client Id from the console.
        client_secret: The Client Secret from the console; never shown.
        credentials: In place of ``client_id`` and ``client_secret``: credentials that
            can change without a restart (a :class:`~gql_service_auth.CredentialsFile`,
            :class:`~gql_service_auth.CredentialsFiles`,
            :class:`~gql_service_auth.CredentialsCallback`, or a callable returning
            ``(client_id, client_secret)``); see docs/rotating-credentials.md.
        url: The API's URL (``{base_url}/graphql``): requests to its origin are signed.
        sign_any_origin: Sign every request the client sends, to any host, instead.
        allow_insecure_http: Allow plain ``http://`` to hosts that are not loopback.
        verify: How the token endpoint's certificate is verified: ``True``, ``False``,
            a CA bundle's path or an ``ssl.SSLContext``.

    Raises:
        ConfigurationError: a bad argument (neither ``url`` nor ``sign_any_origin``
            included); the message says which.
    """

    @forgets_on_error
    def __init__(
        self,
        token_url: str | URL,
        client_id: str | None = None,
        client_secret: str | None = None,
        *,
        url: str | URL | None = None,
        sign_any_origin: bool = False,
        verify: bool | str | SSLContext = True,
        **options: Unpack[TokenOptions],
    ) -> None:
        self._setup(
            token_url,
            client_id,
            client_secret,
            url,
            sign_any_origin,
            options,
            ssl=ssl_of_verify(verify),
            verify=verify,
            inherited={"trust_env": True},
            inherited_from="the environment (trust_env)",
        )

    def _setup(
        self,
        token_url: str | URL,
        client_id: str | None,
        client_secret: str | None,
        url: str | URL | None,
        sign_any_origin: bool,
        options: TokenOptions,
        *,
        ssl: SslSetting,
        verify: object,
        inherited: Mapping[str, Any] | None,
        inherited_from: str,
    ) -> None:
        """What every constructor does, with how its stack's token request verifies TLS
        (``ssl``, ``verify``) and what it inherits when ``token_session_args`` is ``None``."""
        caller = f"{type(self).__name__}.__init__"
        check_known(options, caller)
        self._service = service_origin(
            type(self).__name__,
            url,
            sign_any_origin=sign_any_origin,
            allow_insecure_http=options.get("allow_insecure_http", False),
        )
        self.token_url = token_url
        settings = oauth2_settings(
            token_url,
            client_id,
            client_secret,
            options,
            caller=caller,
            ssl=ssl,
            verify=verify,
            inherited=inherited,
            inherited_from=inherited_from,
        )
        self._rules: OAuth2Rules | None = None
        self._per_api: _PerApi | None = _PerApi(settings)
        self._seen = {}

    #: See ``ApiKeyAuthBase._own_client``.
    _own_client = False

    @classmethod
    def _of(cls, token_url: str | URL, rules: OAuth2Rules, url: object) -> Self:
        """An auth with rules a transport of API ``url`` made (its token request follows
        the transport); it signs the requests to ``url``'s origin, as a standalone one."""
        auth = cls.__new__(cls)
        auth._service = ServiceOrigin(str(url))
        auth.token_url = token_url
        auth._rules = rules
        auth._per_api = None
        auth._own_client = True
        auth._seen = {}
        return auth

    def _signs(self, scheme: str, host: str | None, port: int | None) -> bool:
        """Whether a request to this origin is the service's, to sign."""
        return self._service.covers(scheme, host, port)

    def _rules_for(self, url: object) -> OAuth2Rules:
        """The rules of a request to ``url``: a transport's own, or those of its API."""
        if self._per_api is not None:
            return self._per_api.rules(url)
        assert self._rules is not None
        return self._rules

    def _of_origin(
        self, scheme: str, host: str | None, port: int | None, url: object
    ) -> OAuth2Rules | None:
        """The rules of a request to ``url``, of origin ``scheme://host:port``, once
        credentials may go there (:meth:`_clear`); ``None`` when it is not the service's.

        Kept per origin: deciding again (the origin compared, the plain-http rule, the
        rules per API looked up under their lock) was the largest part of the auth
        objects' cost per request in figure 1 of ``make bench``. An origin refused by
        :meth:`_clear` is not kept: it raises at each request.
        """
        key = (scheme, host, port)
        seen = self._seen
        # One read: threads share the auth, and another may clear the dict between two.
        found = seen.get(key)
        if found is not None:
            rules, api = found
            if rules is not None and self._per_api is not None:
                # Used again: the latest (what .token shows), and kept by the rules per API
                # as long as it is used (a busy API among many others keeps its token).
                kept = self._per_api.kept(api, rules)
                if kept is not rules:
                    seen[key] = (kept, api)
                rules = kept
            return rules
        rules, api = None, None
        if self._signs(scheme, host, port):
            if self._per_api is not None:
                rules, api = self._per_api.rules_of_api(url)
            else:
                rules = self._rules_for(url)
            self._clear(rules, scheme, host)
        if len(seen) >= _ORIGINS_KEPT:
            seen.clear()
        seen[key] = (rules, api)
        return rules

    def _clear(self, rules: OAuth2Rules, scheme: str, host: str | None) -> None:
        """Raise ``ConfigurationError`` unless credentials may go to ``scheme://host``
        in the clear (see :class:`~gql_service_auth._stacks.http_auth.InsecureOrigins`),
        the environment's proxy weighed: requests' and httpx's auths do not see their
        client's. (aiohttp's middleware checks each request's own proxy instead.)"""
        rules.origins.check(scheme, host or "")

    # Each decision with the API its rules are kept under (see _PerApi.kept), in a tuple:
    # rules of None (not the service's) are found by one get().
    _seen: dict[tuple[str, str | None, int | None], tuple[OAuth2Rules | None, str | None]]

    # pickle and copy: what was decided per origin is decided again (the environment's
    # proxy, read once per origin, may differ where the copy lands).
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_seen", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._seen = {}

    @classmethod
    @forgets_on_error
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        url: str | None = None,
        token_url: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        **kwargs: Unpack[OAuth2AuthOptions],
    ) -> Self:
        """Build the auth from the ``SERVICE_*`` environment variables.

        Reads ``SERVICE_BASE_URL`` and ``SERVICE_AUTH_URL`` (``/graphql`` and
        ``/oauth2/token`` are appended unless they end with them), ``SERVICE_CLIENT_ID``,
        ``SERVICE_CLIENT_SECRET`` and, if set, ``SERVICE_TOKEN_STORE_URL``, as
        :meth:`OAuth2Transport.from_env` does. A setting given by keyword wins: its
        variable is then not read; with ``sign_any_origin=True``, ``SERVICE_BASE_URL`` is
        not read.

        Raises:
            ConfigurationError: a variable is missing or empty; the message names it.
        """
        return cls._from_env(environ, dict(kwargs), url, token_url, client_id, client_secret)

    @classmethod
    def _from_env(
        cls,
        environ: Mapping[str, str],
        kwargs: dict[str, Any],
        url: str | None,
        token_url: str | None,
        client_id: str | None,
        client_secret: str | None,
    ) -> Self:
        """``from_env``'s work, whatever keywords a subclass's constructor takes."""
        settings = oauth2_env(
            environ,
            kwargs,
            url=url,
            token_url=token_url,
            client_id=client_id,
            client_secret=client_secret,
            reads_url=not kwargs.get("sign_any_origin", False),
        )
        return cls(**settings)

    @property
    def token(self) -> AccessToken | None:
        """The cached access token (its ``repr`` hides the value), or ``None`` before the first.

        Of the origin this auth last signed a request to: each has its own token.
        """
        rules = self._per_api.latest if self._per_api is not None else self._rules
        return rules.tokens.token if rules is not None else None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} token_url={str(self.token_url)!r} "
            f"client_id={self._credentials.client_id!r}>"
        )

    @property
    def _credentials(self) -> Credentials:
        if self._per_api is not None:
            return self._per_api.settings.credentials
        assert self._rules is not None
        return self._rules.credentials
