"""The redis-py clients of a Redis token store: built from a URL, copied after ``fork()``,
named with no secret, closed.

Three shapes of deployment, each from a URL (see docs/managed-redis.md):

- ``redis://``, ``rediss://`` (TLS) and ``unix://``, as redis-py reads them: one server,
  or a managed service's primary endpoint.
- ``redis+cluster://[user:password@]host:port[,host:port...][?option=value...]`` and
  ``rediss+cluster://``: a Redis Cluster, discovered from any of those nodes (a managed
  service's configuration endpoint is one).
- ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db][?...]`` and
  ``rediss+sentinel://``: the primary that those Sentinels name for ``service``. The user
  and password are the data nodes'; ``sentinel_username`` and ``sentinel_password`` options
  are the Sentinels' own, if they have any.

The options of the query string are redis-py's connection keywords (``ssl_ca_certs``,
``ssl_certfile``...), as ``redis.asyncio.Redis.from_url`` reads them. Nothing here ever
shows a URL: it may hold a password.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from .._core.constants import REDIS_SCHEMES
from .._core.errors import ConfigurationError

Client = aioredis.Redis | RedisCluster

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
SCHEMES = REDIS_SCHEMES

_SENTINEL_PORT = 26379
_SENTINEL_OWN = ("sentinel_username", "sentinel_password")
"""Options of a ``redis+sentinel://`` URL that are the Sentinels' credentials, not redis-py's."""

_UNREADABLE = (
    "the token store URL cannot be read: check its hosts and ports, and percent-encode any "
    "/, #, ?, @ or , in its user name or password, and any @ in an option's value"
)


def _hosts(netloc: str, default_port: int) -> list[tuple[str, int]]:
    """The ``host:port`` pairs of a comma-separated list (``[v6]:port`` too)."""
    pairs = []
    for item in netloc.split(","):
        parts = urlsplit(f"//{item}")
        if not parts.hostname:
            raise ValueError("a host is missing")
        pairs.append((parts.hostname, parts.port or default_port))
    return pairs


def _split(url: str) -> tuple[bool, str, list[tuple[str, int]], str, str]:
    """A cluster or Sentinel URL's parts: (TLS, user info, hosts, path, query)."""
    scheme, _, rest = url.partition("://")
    rest, _, _fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    default_port = _SENTINEL_PORT if scheme.endswith("+sentinel") else 6379
    return scheme.startswith("rediss"), userinfo + at, _hosts(hosts, default_port), path, query


def _one_server_kwargs(tls: bool, userinfo: str, host: str, port: int, db: str, query: str) -> Any:
    """redis-py's keywords for one of the servers, as ``parse_url`` reads a plain URL."""
    scheme = "rediss" if tls else "redis"
    netloc = f"[{host}]" if ":" in host else host
    kwargs: dict[str, Any] = dict(parse_url(f"{scheme}://{userinfo}{netloc}:{port}/{db}?{query}"))
    if kwargs.pop("connection_class", None) is SSLConnection:
        kwargs["ssl"] = True
    return kwargs


def _check_readable(url: str) -> None:
    """Refuse a URL with an ``@`` past its host part, or a fragment: a password with an
    unescaped ``/``, ``?``, ``#`` or ``@`` (``user:12/ab@host``), whose rest would be read
    as the path (a Sentinel service, shown in messages) or the host (looked up, and shown).
    An ``@`` in an option's value is refused too: percent-encoded (``%40``), it is read."""
    rest = url.partition("://")[2]
    if url.startswith("unix://"):
        # unix://[user:password@]/path: the path starts at the first "/" after any "@".
        userinfo, at, path = rest.partition("@")
        rest = path if at and not any(c in userinfo for c in "/?#") else rest
        ends = [i for i in (rest.find("?"), rest.find("#")) if i >= 0]
        host_part, after = "", rest
    else:
        ends = [i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0]
        host_part, after = (rest[: min(ends)], rest[min(ends) :]) if ends else (rest, "")
    if "@" in after or "#" in rest or host_part.count("@") > 1:
        raise ConfigurationError(_UNREADABLE)


def build(url: str, options: Mapping[str, Any]) -> Client:
    """The client of ``url`` with redis-py keywords ``options`` (the URL's query wins).

    Raises:
        ConfigurationError: the URL cannot be read (its text is never quoted, nor kept in
            the error's context: redis-py's message may quote parts of a password).
    """
    _check_readable(url)
    unreadable = False
    try:
        if url.startswith(CLUSTER_SCHEMES):
            return _cluster(url, options)
        if url.startswith(SENTINEL_SCHEMES):
            return _sentinel(url, options)
        return aioredis.Redis.from_url(url, **options)
    except ConfigurationError:
        raise
    except ValueError:
        unreadable = True
    assert unreadable
    raise ConfigurationError(_UNREADABLE)


def _cluster_parts(url: str) -> tuple[bool, str, list[tuple[str, int]], str]:
    tls, userinfo, hosts, path, query = _split(url)
    if path.strip("/") not in ("", "0"):
        raise ConfigurationError("a Redis Cluster has database 0 only: drop the /N of the URL")
    return tls, userinfo, hosts, query


def _sentinel_parts(url: str) -> tuple[bool, str, list[tuple[str, int]], str, str, str]:
    tls, userinfo, hosts, path, query = _split(url)
    service, _, db = path.strip("/").partition("/")
    if not service or "/" in db:
        raise ConfigurationError(
            "a redis+sentinel:// URL names the service after its hosts: "
            "redis+sentinel://host:26379,host2:26379/service[/db]"
        )
    return tls, userinfo, hosts, unquote(service), db or "0", query


def _cluster(url: str, options: Mapping[str, Any]) -> RedisCluster:
    tls, userinfo, hosts, query = _cluster_parts(url)
    kwargs = {**options, **_one_server_kwargs(tls, userinfo, *hosts[0], "0", query)}
    for name in ("host", "port", "db", "path"):
        kwargs.pop(name, None)
    nodes = [ClusterNode(host, port) for host, port in hosts]
    return RedisCluster(startup_nodes=nodes, **kwargs)


def _sentinel(url: str, options: Mapping[str, Any]) -> aioredis.Redis:
    tls, userinfo, hosts, service, db, query = _sentinel_parts(url)
    pairs = parse_qsl(query, keep_blank_values=True)
    own = {name: value for name, value in pairs if name in _SENTINEL_OWN}
    query = urlencode([(name, value) for name, value in pairs if name not in _SENTINEL_OWN])
    kwargs = {**options, **_one_server_kwargs(tls, userinfo, *hosts[0], db, query)}
    for name in ("host", "port", "path"):
        kwargs.pop(name, None)
    # The Sentinels get the connection's timeouts and TLS settings, not its credentials.
    sentinel_kwargs = {
        name: value
        for name, value in kwargs.items()
        if name.startswith(("socket_", "ssl")) or name in ("retry", "protocol")
    }
    # parse_qsl decoded them already.
    if own.get("sentinel_username"):
        sentinel_kwargs["username"] = own["sentinel_username"]
    if own.get("sentinel_password"):
        sentinel_kwargs["password"] = own["sentinel_password"]
    manager = Sentinel(  # type: ignore[no-untyped-call]
        hosts, sentinel_kwargs=sentinel_kwargs, **kwargs
    )
    client: aioredis.Redis = manager.master_for(service)
    return client


def location(url: str) -> str:
    """Where ``url`` leads, with no user, password or option.

    Raises:
        ConfigurationError: redis-py cannot read it; the message quotes none of it, as a
            password with an unescaped ``/`` or ``#`` would show in parts.
    """
    _check_readable(url)
    scheme = url.partition("://")[0]
    parts: Any = None
    try:
        if url.startswith(CLUSTER_SCHEMES):
            return f"{scheme}://{_listed(_cluster_parts(url)[2])}"
        if url.startswith(SENTINEL_SCHEMES):
            _, _, hosts, service, db, _ = _sentinel_parts(url)
            return f"{scheme}://{_listed(hosts)}/{quote(service, safe='')}/{db}"
        parts = parse_url(url)
    except ConfigurationError:
        raise
    except ValueError:
        pass  # raised below, outside this block: no context that quotes the URL
    if parts is None:
        raise ConfigurationError(_UNREADABLE)
    if parts.get("path"):
        return f"unix://{parts['path']}"
    scheme = url.partition("://")[0]
    host, port = parts.get("host", "localhost"), parts.get("port", 6379)
    return f"{scheme}://{_host(host)}:{port}/{parts.get('db', 0)}"


def _listed(hosts: list[tuple[str, int]]) -> str:
    return ",".join(f"{_host(quote(host, safe='.:'))}:{port}" for host, port in hosts)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def client_location(client: Client) -> str:
    """Where a client given to a store leads, with no user, password or option."""
    if isinstance(client, RedisCluster):
        nodes = client.get_nodes() or client.startup_nodes
        return "redis+cluster://" + ",".join(sorted(f"{n.host}:{n.port}" for n in nodes))
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if isinstance(pool, SentinelConnectionPool):
        sentinels = ",".join(_sentinel_addresses(pool.sentinel_manager))
        return f"redis+sentinel://{sentinels}/{pool.service_name}/{kwargs.get('db', 0)}"
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{kwargs.get('db', 0)}"


def _sentinel_addresses(manager: Sentinel) -> list[str]:
    found = []
    for sentinel in manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        found.append(f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', _SENTINEL_PORT)}")
    return found


def fresh_copy(client: Client) -> Client:
    """A client with ``client``'s settings and none of its connections (a forked child's:
    the parent's sockets, and the loop they belong to, are not the child's to use)."""
    if isinstance(client, RedisCluster):
        return _fresh_cluster(client)
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        return _fresh_sentinel(pool)
    fresh = type(pool)(connection_class=pool.connection_class, **pool.connection_kwargs)
    # from_pool: the client owns the pool, so closing the client closes its connections.
    return aioredis.Redis.from_pool(fresh)


_CLUSTER_KEYWORDS = frozenset(inspect.signature(RedisCluster.__init__).parameters) - {
    "self",
    "host",
    "port",
    "startup_nodes",
}


def _fresh_cluster(client: RedisCluster) -> RedisCluster:
    kwargs = {k: v for k, v in client.connection_kwargs.items() if k in _CLUSTER_KEYWORDS}
    if issubclass(client.connection_kwargs.get("connection_class", object), SSLConnection):
        kwargs["ssl"] = True
    nodes = [ClusterNode(n.host, n.port) for n in client.startup_nodes]
    manager = client.nodes_manager
    return RedisCluster(
        startup_nodes=nodes,
        require_full_coverage=manager.require_full_coverage,
        address_remap=manager.address_remap,
        retry=client.retry,
        **kwargs,
    )


def _fresh_sentinel(pool: SentinelConnectionPool) -> aioredis.Redis:
    old = pool.sentinel_manager
    hosts = []
    for sentinel in old.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        hosts.append((kwargs.get("host", "localhost"), kwargs.get("port", _SENTINEL_PORT)))
    manager = Sentinel(  # type: ignore[no-untyped-call]
        hosts,
        min_other_sentinels=old.min_other_sentinels,
        sentinel_kwargs=old.sentinel_kwargs,
        force_master_ip=getattr(old, "_force_master_ip", None),
        **old.connection_kwargs,
    )
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    fresh = type(pool)(
        pool.service_name,
        manager,
        connection_class=pool.connection_class,
        is_master=pool.is_master,
        check_connection=pool.check_connection,
        **kwargs,
    )
    return aioredis.Redis.from_pool(fresh)


async def close(client: Client) -> None:
    """Close ``client`` and, for a Sentinel-backed one, its connections to the Sentinels."""
    await client.aclose()
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        await pool.sentinel_manager.aclose()


def sentinel_managed(client: Client) -> bool:
    return isinstance(getattr(client, "connection_pool", None), SentinelConnectionPool)


def uses_tls(client: Client | None) -> bool:
    """Whether ``client`` connects with TLS."""
    if client is None:
        return False
    if isinstance(client, RedisCluster):
        kind = client.connection_kwargs.get("connection_class", object)
    else:
        kind = client.connection_pool.connection_class
    return isinstance(kind, type) and issubclass(kind, SSLConnection)
