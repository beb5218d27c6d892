"""The token request's own aiohttp session: what it accepts, inherits, and where it goes.

Each token fetch runs on a short-lived thread with an event loop of its own (see
:mod:`gql_service_auth._core.tokens`) and opens a session for that fetch alone. So nothing
bound to an event loop can be handed over: a connector is asked for as a factory, called
on the fetch's loop. And the request carries the client credentials and nothing else:
keys that would add credentials of their own, or change what the request means, are
refused with a message saying what to use instead.

The default follows the GraphQL session's ``client_session_args`` where users expect the
token request to go where their traffic goes: ``trust_env`` (``HTTP_PROXY``,
``HTTPS_PROXY``, ``NO_PROXY``), ``proxy`` and ``proxy_auth``, and nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from ssl import SSLContext
from typing import TYPE_CHECKING, Any, Final, TypedDict
from urllib.request import getproxies, proxy_bypass

from yarl import URL

from .._core.config import environment_proxy, is_loopback
from .._core.errors import ConfigurationError, TokenRequestError
from .._core.sharing import Same

# aiohttp is imported when a token is first fetched, not with this module: the requests
# and httpx adapters import it, and aiohttp is about half of what importing them costs.
# At run time, typing.get_type_hints() of TokenSessionArgs reads its aiohttp types as Any.
if TYPE_CHECKING:
    from aiohttp import BaseConnector, BasicAuth, TraceConfig
    from aiohttp.client_reqrep import Fingerprint
else:
    BaseConnector = BasicAuth = TraceConfig = Fingerprint = Any

SslSetting = SSLContext | bool | Fingerprint
"""aiohttp's ``ssl``: how the token request verifies the token endpoint."""


class TokenSessionArgs(TypedDict, total=False):
    """The aiohttp ``ClientSession`` keywords the token request's session accepts.

    Attributes:
        trust_env: Take proxies from ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY`` (and
            ``~/.netrc``), as aiohttp does.
        proxy: An ``http://`` or ``https://`` proxy URL; credentials may go in it, in
            latin-1 as HTTP Basic sends them.
        proxy_auth: Credentials for ``proxy``; they take the place of any in its URL.
        connector: A callable returning a new connector, such as
            ``functools.partial(aiohttp.TCPConnector, family=socket.AF_INET)``; called on
            the fetch's own event loop for each fetch, and closed after it.
        trace_configs: aiohttp ``TraceConfig`` objects. Their callbacks run on the fetch's
            own thread and event loop, and see the request's headers, the Basic
            credentials of ``client_secret_basic`` included.
        read_bufsize, max_line_size, max_field_size: As aiohttp's.
    """

    trust_env: bool
    proxy: str | URL | None
    proxy_auth: BasicAuth | None
    connector: Callable[[], BaseConnector]
    trace_configs: list[TraceConfig] | None
    read_bufsize: int
    max_line_size: int
    max_field_size: int


# Shown where users import it from, as the errors are (see _core/errors.py).
TokenSessionArgs.__module__ = "gql_service_auth"
ACCEPTED_KEYS: Final = frozenset(TokenSessionArgs.__annotations__)
"""The keys of ``token_session_args``; any other is refused."""

INHERITED_KEYS: Final = ("trust_env", "proxy", "proxy_auth")
"""What the token session takes from ``client_session_args`` when not told otherwise."""

_OWN_CREDENTIALS: Final = (
    "would send more than the client credentials to the authorization server. Extra "
    "form fields go in token_params; HTTP Basic is token_auth_method='client_secret_basic'"
)
# Keys users may reach for, with what to do instead.
_REFUSED: Final[Mapping[str, str]] = {
    "auth": _OWN_CREDENTIALS,
    "headers": _OWN_CREDENTIALS,
    "cookies": _OWN_CREDENTIALS,
    "cookie_jar": _OWN_CREDENTIALS,
    "base_url": "the token request goes to token_url",
    "raise_for_status": (
        "the token endpoint's error answers are read for their RFC 6749 error, and "
        "retried when transient"
    ),
    "timeout": "a token fetch is bounded by retry=RetryPolicy(timeout=...)",
    "read_timeout": "a token fetch is bounded by retry=RetryPolicy(timeout=...)",
    "conn_timeout": "a token fetch is bounded by retry=RetryPolicy(timeout=...)",
    "ssl": "pass the transport's ssl=, which the token request uses too",
    "loop": "token requests run on an event loop of their own",
    "connector_owner": "the token session closes the connector it made after each fetch",
}


@dataclass(frozen=True, slots=True, repr=False)
class TokenSession:
    """The resolved settings of the token request's session. Its ``repr`` hides the proxy.

    Attributes:
        trust_env: aiohttp's ``trust_env``.
        proxy: The proxy, with any credentials in its URL; ``None`` for none (or, with
            ``trust_env``, the environment's).
        connector: Makes a new connector on the fetch's loop; ``None`` for aiohttp's.
        options: The other accepted ``ClientSession`` keywords.
        allow_insecure_http: Whether clear-text credentials to a remote host are allowed.
    """

    trust_env: bool = False
    proxy: URL | None = None
    connector: Callable[[], BaseConnector] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    allow_insecure_http: bool = False

    def __repr__(self) -> str:
        proxy = f"{self.proxy.host}:{self.proxy.port}" if self.proxy is not None else None
        return f"<TokenSession trust_env={self.trust_env} proxy={proxy}>"

    def route(self, url: str | URL) -> str | None:
        """The proxy a request to ``url`` goes through, named without credentials (and,
        for the environment's, by the variable that names it); ``None`` for none."""
        if self.proxy is not None:
            return f"{self.proxy.host}:{self.proxy.port} (the token request's proxy)"
        if not self.trust_env:
            return None
        return environment_proxy(str(url))

    def secrets(self) -> list[str]:
        """The proxy's credentials in every form a request or an error may show them.

        With ``trust_env`` and no proxy of its own, those of the environment's proxies,
        read now as aiohttp reads them for each request.
        """
        if self.proxy is not None:
            return _url_secrets(self.proxy)
        if not self.trust_env:
            return []
        found: list[str] = []
        for scheme, value in getproxies().items():
            if scheme in ("http", "https", "ws", "wss"):
                try:
                    found += _url_secrets(URL(value))
                except ValueError:
                    continue  # aiohttp cannot use it either
        return found

    def sharing_key(self, url: str | URL) -> Hashable:
        """Where this session sends a request to ``url``, and how: sessions with equal
        keys send the same request to the same place, so their tokens are shared.

        With ``trust_env``, what the environment says now (a proxy for ``url``, unless
        one is given; a ``.netrc`` entry for its host); with neither, trusting it
        changes nothing.
        """
        environment: tuple[str | None, str | None] = (None, None)
        if self.trust_env:
            proxy, entry = _environment(url)
            environment = (proxy if self.proxy is None else None, entry)
        options = tuple(sorted((key, hashable(value)) for key, value in self.options.items()))
        return (
            str(self.proxy) if self.proxy is not None else None,
            environment,
            Same(self.connector),
            options,
            self.allow_insecure_http,
        )

    def make_connector(self) -> BaseConnector | None:
        """A new connector for one fetch, on the running loop; ``None`` for aiohttp's own.

        Raises:
            TokenRequestError: the factory failed or gave back an unusable connector.
        """
        if self.connector is None:
            return None
        hint = (
            "token_session_args['connector'] must return a new aiohttp connector each time "
            "it is called, such as functools.partial(aiohttp.TCPConnector, ...)"
        )
        try:
            connector = self.connector()
        except Exception as exc:
            raise TokenRequestError(
                f"token_session_args['connector'] raised {type(exc).__name__}", hint=hint
            ) from exc
        import aiohttp

        if not isinstance(connector, aiohttp.BaseConnector):
            raise TokenRequestError(
                f"token_session_args['connector'] returned {type(connector).__name__}", hint=hint
            )
        if connector.closed:
            # Most likely the same instance again, closed with the session of an earlier
            # fetch, on a loop that is gone.
            raise TokenRequestError(
                "token_session_args['connector'] returned a closed connector", hint=hint
            )
        # aiohttp does not check it: a session on this loop would fail on the first
        # request, then close the connector from this thread, under its owner's loop.
        owner = getattr(connector, "_loop", None)
        if owner is not None and owner is not asyncio.get_running_loop():
            raise TokenRequestError(
                "token_session_args['connector'] returned a connector of another event "
                "loop; the token fetch runs on an event loop of its own",
                hint=hint,
            )
        return connector

    def check_environment(self, url: str | URL) -> None:
        """Refuse a plain-http token request that ``trust_env`` would send to a remote proxy.

        An explicit proxy was checked when the transport was built; the environment's is
        known only now, and is read the way aiohttp reads it.

        Raises:
            TokenRequestError: not retryable, saying what to change.
        """
        if not self.trust_env or self.proxy is not None or self.allow_insecure_http:
            return
        target = URL(url)
        if target.scheme != "http" or target.host is None or proxy_bypass(target.host):
            return
        value = getproxies().get("http")
        try:
            proxy = URL(value) if value else None
        except ValueError:
            return  # aiohttp cannot use it either
        if proxy is not None and proxy.scheme == "http" and not is_loopback(proxy.host):
            raise TokenRequestError(
                f"refusing to send the client credentials over plain http through the proxy "
                f"at {proxy.host} that the environment names (http_proxy): it, and the "
                "network on the way to it, would read them",
                hint=(
                    "Add the token host to NO_PROXY, use an https:// token_url, pass "
                    "token_session_args={'trust_env': False}, or allow_insecure_http=True "
                    "if this network is trusted"
                ),
            )


def resolve_token_session(
    token_session_args: Mapping[str, Any] | None,
    *,
    client_session_args: Mapping[str, Any] | None,
    token_proxy: str | URL | None,
    token_url: str | URL,
    allow_insecure_http: bool,
    inherited_from: str = "client_session_args",
) -> TokenSession:
    """The token session's settings, from the transport's keywords.

    ``token_session_args``, when given, is all there is; otherwise ``trust_env``,
    ``proxy`` and ``proxy_auth`` come from ``client_session_args`` (what the GraphQL
    requests use, which messages call ``inherited_from``). ``token_proxy`` sets the
    proxy either way.

    Raises:
        ConfigurationError: a refused or malformed key, a proxy given twice, or a
            plain-http token request through a proxy that is not loopback without
            ``allow_insecure_http``. Messages never show a proxy URL: it may carry a
            password.
    """
    source, chosen = _chosen(token_session_args, client_session_args, inherited_from)
    proxy_name = f"{source}['proxy']" if source.endswith("_args") else source
    if token_proxy is not None:
        if token_session_args is not None and chosen.get("proxy") is not None:
            raise ConfigurationError(
                "the token request's proxy is given twice: pass token_proxy= or "
                "token_session_args['proxy'], not both"
            )
        if token_session_args is None:
            chosen.pop("proxy_auth", None)  # it was meant for the GraphQL session's proxy
        chosen["proxy"] = token_proxy
        proxy_name = "token_proxy"
    proxy = _proxy(chosen.pop("proxy", None), proxy_name, chosen.pop("proxy_auth", None), source)
    if proxy is not None and not allow_insecure_http:
        _check_plain_http_through(proxy, token_url, proxy_name)
    trust_env = chosen.pop("trust_env", False)
    if token_session_args is not None and not isinstance(trust_env, bool):
        raise ConfigurationError("token_session_args['trust_env'] must be a bool")
    connector = chosen.pop("connector", None)
    return TokenSession(
        trust_env=bool(trust_env) and _environment_matters(token_url, proxy),
        proxy=proxy,
        connector=connector,
        options=chosen,
        allow_insecure_http=allow_insecure_http,
    )


def _chosen(
    token_session_args: Mapping[str, Any] | None,
    client_session_args: Mapping[str, Any] | None,
    inherited_from: str,
) -> tuple[str, dict[str, Any]]:
    """Where the token session's keywords come from (as messages name it), and a copy of
    them: ``token_session_args``, checked, or what ``client_session_args`` lends."""
    if token_session_args is None:
        if client_session_args is not None and not isinstance(client_session_args, Mapping):
            raise ConfigurationError(
                "client_session_args must be a dict of aiohttp ClientSession keywords, not "
                f"{type(client_session_args).__name__}"
            )
        lent = (client_session_args or {}).items()
        return inherited_from, {k: v for k, v in lent if k in INHERITED_KEYS}
    if not isinstance(token_session_args, Mapping):
        raise ConfigurationError(
            "token_session_args must be a dict of aiohttp ClientSession keywords, not "
            f"{type(token_session_args).__name__}"
        )
    chosen = dict(token_session_args)
    _check_keys(chosen)
    return "token_session_args", chosen


def _check_plain_http_through(proxy: URL, token_url: str | URL, proxy_name: str) -> None:
    """Refuse a plain-http token request through a proxy that is another machine."""
    if URL(token_url).scheme == "http" and proxy.scheme == "http" and not is_loopback(proxy.host):
        raise ConfigurationError(
            f"refusing to send credentials over plain http through the proxy at {proxy.host} "
            f"({proxy_name}): token_url is http://, so the proxy and the network on the way "
            "to it would read the client secret. Use an https:// token_url, or pass "
            "allow_insecure_http=True if this network is trusted"
        )


def _environment_matters(token_url: str | URL, proxy: URL | None) -> bool:
    """Whether ``trust_env`` changes where the token request goes, or what it sends.

    When nothing in the environment concerns the token URL now (it is read once, as the
    GraphQL requests' proxy is, per origin), a session that trusts it sends as one that
    ignores it: so built, transports of either kind share their tokens, and the fetch goes
    where the sharing key says whoever built the shared manager.
    """
    environment_proxy, netrc_entry = _environment(token_url)
    return netrc_entry is not None or (proxy is None and environment_proxy is not None)


def _environment(url: str | URL) -> tuple[str | None, str | None]:
    """What ``trust_env`` takes from the environment for ``url`` now: the proxy, and a
    digest of the ``.netrc`` entry aiohttp would send as Basic credentials (with a proxy
    given or not), ``None`` when it has none for the host."""
    target = URL(url)
    bypassed = target.host is None or proxy_bypass(target.host)
    proxy = None if bypassed else getproxies().get(target.scheme)
    return proxy or None, _netrc_entry(target.host)


def _netrc_entry(host: str | None) -> str | None:
    # Read as aiohttp reads it (NETRC, else ~/.netrc); unreadable or malformed (not in the
    # locale's encoding included): none.
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    if host is None or not os.path.exists(path):
        return None
    import netrc  # here: it imports shlex, and most machines have no .netrc to read

    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, ValueError, netrc.NetrcParseError):
        return None
    return None if entry is None else hashlib.sha256(repr(entry).encode()).hexdigest()


def hashable(value: object) -> Hashable:
    """``value`` as part of a sharing key: itself if it compares by value, else by identity."""
    if isinstance(value, list | tuple):
        return tuple(hashable(each) for each in value)
    if isinstance(value, str | bytes | int | float | bool | type(None)):
        return value
    return Same(value)


def _check_keys(args: Mapping[str, Any]) -> None:
    """Refuse ``token_session_args`` keys it does not take, then values of a wrong kind."""
    for key in sorted(args, key=str):
        if key in _REFUSED:
            raise ConfigurationError(f"token_session_args must not set {key!r}: {_REFUSED[key]}")
        if key not in ACCEPTED_KEYS:
            raise ConfigurationError(
                f"token_session_args does not accept {key!r}; it accepts "
                f"{', '.join(sorted(ACCEPTED_KEYS))}"
            )
    _check_values(args)


def _check_values(args: Mapping[str, Any]) -> None:
    connector = args.get("connector")
    import aiohttp

    if isinstance(connector, aiohttp.BaseConnector) or (
        "connector" in args and not callable(connector)
    ):
        raise ConfigurationError(
            "token_session_args['connector'] must be a callable that returns a new connector, "
            "such as functools.partial(aiohttp.TCPConnector, limit=10, family=socket.AF_INET): "
            "token requests run on an event loop of their own, and a connector belongs to "
            "the loop it was made on"
        )
    for key in ("read_bufsize", "max_line_size", "max_field_size"):
        value = args.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"token_session_args[{key!r}] must be an int of at least 1")
    traces = args.get("trace_configs")
    if traces is not None and not (
        isinstance(traces, list) and all(isinstance(t, aiohttp.TraceConfig) for t in traces)
    ):
        raise ConfigurationError(
            "token_session_args['trace_configs'] must be a list of aiohttp.TraceConfig"
        )


def _url_secrets(url: URL) -> list[str]:
    if not url.password:
        return []
    # As aiohttp encodes a Proxy-Authorization header (latin-1), without its BasicAuth,
    # which aiohttp 3.14 deprecates.
    userinfo = f"{url.user or ''}:{url.password}".encode("latin-1", "replace")
    basic = base64.b64encode(userinfo).decode("ascii")
    return [url.password, url.raw_password or "", basic]


def _proxy(value: object, name: str, auth: object, source: str) -> URL | None:
    """The proxy URL with its credentials in it, checked; never shown in a message."""
    if value is None:
        if auth is not None and source == "token_session_args":
            # aiohttp would drop it: with trust_env, the environment's proxy brings its own.
            raise ConfigurationError(
                "token_session_args['proxy_auth'] needs a proxy: set token_proxy= or "
                "token_session_args['proxy'], or put the credentials in HTTP(S)_PROXY"
            )
        return None
    if not isinstance(value, (str, URL)):
        raise ConfigurationError(f"{name} must be a str or a yarl.URL, not {type(value).__name__}")
    try:
        proxy = URL(value)
    except (TypeError, ValueError):
        # from None: yarl's message quotes the URL, which may hold a password.
        raise ConfigurationError(f"{name} is not a valid URL") from None
    if proxy.scheme not in ("http", "https") or not proxy.host:
        raise ConfigurationError(
            f"{name} must be an http:// or https:// proxy URL. For another kind of proxy "
            "(SOCKS), pass a connector factory in token_session_args['connector']"
        )
    if auth is not None:
        import aiohttp

        if not isinstance(auth, aiohttp.BasicAuth):
            raise ConfigurationError(f"{source}['proxy_auth'] must be an aiohttp.BasicAuth")
        # In the URL rather than as aiohttp's proxy_auth, which aiohttp 3.14 deprecates;
        # aiohttp turns either into the same Proxy-Authorization header.
        proxy = proxy.with_user(auth.login).with_password(auth.password)
    if not _sendable(f"{proxy.user or ''}:{proxy.password or ''}"):
        # aiohttp sends them as latin-1 and would fail with a UnicodeEncodeError whose
        # arguments hold them: refused now, with a message that does not quote them.
        raise ConfigurationError(
            f"the credentials of {name} must be latin-1 text, as HTTP Basic sends them: "
            "aiohttp cannot send other characters to a proxy"
        )
    return proxy


def _sendable(userinfo: str) -> bool:
    try:
        userinfo.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True
