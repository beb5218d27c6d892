"""Reading settings from the environment, and refusing unsafe URLs."""

from __future__ import annotations

import base64
import ipaddress
import logging
import math
import os
import urllib.request
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

from yarl import URL

from .constants import LOGGER_NAME
from .errors import ConfigurationError

logger = logging.getLogger(LOGGER_NAME)


def read_env(environ: Mapping[str, str], name: str) -> str:
    """The value of one environment variable, which must be set and not empty."""
    value = environ.get(name, "").strip()
    if not value:
        raise ConfigurationError(
            f"environment variable {name} is not set or empty: "
            f"export {name}=... (see the README's configuration table)"
        )
    return value


def given_or_env(environ: Mapping[str, str], given: str | None, name: str) -> str:
    """``given`` if it is not ``None``, else the value of variable ``name`` (see
    :func:`read_env`)."""
    return given if given is not None else read_env(environ, name)


def join_url(base: str, path: str) -> str:
    """``base`` with ``path`` appended to its path, however many slashes it ends with.

    A query or fragment stays after the path (``https://h/?key=1`` gives
    ``https://h/graphql?key=1``, not ``https://h/?key=1/graphql``).
    """
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


def ends_with_path(url: str, path: str) -> bool:
    """Whether the path of ``url`` ends with ``path``, trailing slashes aside."""
    return urlsplit(url).path.rstrip("/").endswith(path)


def env_url(environ: Mapping[str, str], name: str, path: str) -> str:
    """The endpoint under the URL in variable ``name``: its value with ``path`` appended.

    A value whose path already ends with ``path`` is used as it is (but for trailing
    slashes): people paste the endpoint's full URL where the host is asked for, and
    ``/graphql/graphql`` would only answer 404.
    That is logged at INFO, once per variable and value: the value is accepted and works,
    and a program that builds a transport per call should not repeat it.
    """
    base = read_env(environ, name)
    if not ends_with_path(base, path):
        return join_url(base, path)
    if (name, base) not in _NOTED:
        _NOTED.add((name, base))
        # Not the value: a URL may carry more than a host.
        logger.info("%s.url_path_already_present variable=%s path=%s", LOGGER_NAME, name, path)
    return join_url(base, "")


_NOTED: set[tuple[str, str]] = set()


def endpoint_or_env(environ: Mapping[str, str], given: str | None, name: str, path: str) -> str:
    """``given`` if it is not ``None``, else the endpoint under variable ``name`` (see
    :func:`env_url`)."""
    return given if given is not None else env_url(environ, name, path)


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` names this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if not host:
        return False
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _without_userinfo(url: URL) -> str:
    """The URL for a message: its user and password left out, since either may be secret."""
    try:
        return str(url.with_user(None)) if url.user or url.password else str(url)
    except ValueError:  # userinfo yarl will not rebuild without a host
        return "(a URL with credentials)"


def check_url(url: str | URL, *, what: str, allow_insecure_http: bool) -> None:
    """Refuse a URL that would carry credentials in clear text to another machine.

    ``url`` may be a ``yarl.URL``, as gql's ``AIOHTTPTransport`` and aiohttp accept; it is
    checked as it is, not turned into a string and parsed again.

    Raises:
        ConfigurationError: the URL is not a str or a ``yarl.URL``, is not http(s), or is
            plain http to a host that is not loopback while ``allow_insecure_http`` is false.
    """
    if isinstance(url, URL):
        parsed: URL | None = url
    elif isinstance(url, str):
        try:
            parsed = URL(url)
        except ValueError:
            parsed = None
    else:
        raise ConfigurationError(f"{what} must be a str or a yarl.URL, not {type(url).__name__}")
    if parsed is None:
        # Raised outside the except clause: yarl's message, which would be chained as the
        # context, may quote the URL and the password in it.
        raise ConfigurationError(f"{what} is not a valid URL")
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigurationError(
            f"{what} must be an http:// or https:// URL, got {_without_userinfo(parsed)!r}"
        )
    if parsed.user or parsed.password:
        raise ConfigurationError(
            f"{what} must not carry credentials in the URL; pass client_id and client_secret"
        )
    if parsed.scheme == "http" and not allow_insecure_http and not is_loopback(parsed.host):
        raise ConfigurationError(
            f"refusing to send credentials over plain http to {parsed.host} ({what}): "
            "use an https:// URL, or pass allow_insecure_http=True if this network is trusted"
        )


def check_seconds(name: str, value: object, *, positive: bool = False) -> None:
    """Refuse ``value`` unless it is a finite number of seconds, at least 0 (or more)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        bound = "more than 0" if positive else "at least 0"
        raise ConfigurationError(f"{name} must be a finite number of seconds, {bound}")


def environment_proxy(url: str, trust_env: bool = True) -> str | None:
    """The proxy the environment names for ``url`` (``"host:port (HTTPS_PROXY)"``), as
    requests, httpx and aiohttp with ``trust_env`` read it; ``None`` when none applies."""
    if not trust_env:
        return None
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    scheme = parts.scheme or "http"
    value = proxies.get(scheme) or proxies.get("all")
    if not value or _bypassed(parts.hostname or "", parts.port):
        return None
    proxy = urlsplit(value if "://" in value else f"http://{value}")
    where = proxy.hostname or "?"
    if proxy.port is not None:
        where = f"{where}:{proxy.port}"
    name = f"{scheme.upper()}_PROXY" if proxies.get(scheme) else "ALL_PROXY"
    return f"{where} ({name})"


def shown_url(url: object) -> str:
    """``url`` quoted for a message, with any password in it (a Redis URL's, in its
    user part or its query) masked, and its query with it."""
    text = str(url)
    try:
        parts = urlsplit(text)
        password = parts.password
    except ValueError:
        return repr(text.split("://", 1)[0] + "://...")
    if password:
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    if parts.query:  # ?password=... is a form of some URLs
        parts = parts._replace(query="***")
    return repr(urlunsplit(parts))


def _bypassed(host: str, port: int | None) -> bool:
    """Whether ``NO_PROXY`` keeps ``host`` from the proxy, as requests and httpx read it:
    ``*``, a name and its subdomains, an address, a CIDR block, an optional ``:port``."""
    value = os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or ""
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in (part.strip().lower() for part in value.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry_port and port is not None and entry_port != str(port):
            continue
        if address is not None and "/" in name:
            try:
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = name.lstrip(".")
        if host.lower() == name or host.lower().endswith("." + name):
            return True
    return False


def environment_proxy_logins() -> list[str]:
    """The logins of the proxies the environment names (see :func:`proxy_login`): an
    answer through one may quote them."""
    return [
        login
        for value in urllib.request.getproxies_environment().values()
        for login in proxy_login(value)
    ]


def proxy_login(proxy: object) -> list[str]:
    """The password of a proxy URL, in the forms an answer may quote it: as it is, as
    ``user:password``, and as the Basic credential sent for it; none without one."""
    text = str(proxy)
    parts = urlsplit(text if "://" in text else f"http://{text}")
    try:
        user, password = parts.username, parts.password
    except ValueError:
        return []
    if not password:
        return []
    user, password = unquote(user or ""), unquote(password)
    basic = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return [password, f"{user}:{password}", basic]
