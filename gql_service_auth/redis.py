"""Share access tokens across processes and hosts through Redis (or Valkey).

Needs the ``[redis]`` extra: ``pip install 'gql-service-auth[redis]'``.

>>> store = RedisTokenStore.from_url("redis://127.0.0.1:6379/0")  # doctest: +SKIP
>>> transport = OAuth2Transport(url, token_url=..., ..., token_store=store)  # doctest: +SKIP

What Redis holds, per set of credentials, is two keys: the token, encrypted, and a lock
taken while one process fetches. Neither says whose they are:

- A key's name is ``<prefix>:{<tag>}:token`` (and ``:lock``), where the tag is an HMAC of
  the token URL, client id, scope, further token parameters and client authentication
  method, keyed by HKDF from the client secret (or from ``store_key``). The braces are
  a Redis Cluster hash tag: both keys live in one slot, so the scripts run on a cluster.
- The token is encrypted with AES-GCM under another HKDF key from the same secret, the
  key's name as associated data, so it cannot be moved to another key unnoticed. Its
  fingerprint, for the compare-and-delete of a refused token, is an HMAC too.

So reading Redis, its backups, its replicas or ``MONITOR`` gives nothing usable; every
process that holds the client secret (and so could fetch a token itself) can read it.
The commands used are in Redis 6.2 and Valkey alike: ``EVALSHA`` (with ``SCRIPT LOAD``),
and in scripts ``SET PX``, ``TIME``, ``HGET``, ``HMGET``, ``HSET``, ``PTTL``,
``PEXPIRE``, ``GET`` and ``DEL``.
"""

from __future__ import annotations

try:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.connection import parse_url
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from ._redis_keys import Keys  # cryptography
    from ._sealed import Hidden as _Hidden
except ImportError as exc:  # pragma: no cover - the extra is installed for the tests
    raise ImportError(
        "gql_service_auth.redis needs the redis extra: pip install 'gql-service-auth[redis]'"
    ) from exc

import asyncio
import json
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from . import _fork
from . import _redis_scripts as scripts
from ._constants import STORE_COOLDOWN, STORE_TIMEOUT
from ._errors import ConfigurationError
from ._loop_thread import LoopClosed, LoopThread
from ._store import StoredToken, StoreOnItsThread, StoresByUrl, TokenIdentity

__all__ = ["RedisTokenStore"]

_T = TypeVar("_T")

_Client = aioredis.Redis | RedisCluster
_Scripts = dict[str, Any]

_MAX_TTL_MS = 366 * 24 * 3600 * 1000
"""The longest a token is kept, whatever its ``expires_in``: a year (and a valid PEXPIRE)."""

_FAILURE_TTL_MS = 5000
"""How long a failed fetch's reason is kept for its waiters, who poll every 80 ms at most."""

_MAX_CALLS = 32
"""Store calls under way at once, at most: the others queue, rather than overflow the
client's connection pool (redis-py raises at 100), which would pass for an outage."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _opaque(value: bytes | str) -> str:
    """An owner value as text, whatever bytes another client wrote there."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


class RedisTokenStore(StoreOnItsThread):
    """A :class:`~gql_service_auth.TokenStore` on Redis, Redis Cluster or Valkey.

    Give it to :class:`~gql_service_auth.OAuth2Transport` as ``token_store=``; one store
    may serve many transports, even with different credentials. Redis is used only when
    a process needs a new token, never per request. It runs its Redis calls on a thread
    and event loop of its own, so the client is never shared between event loops, gql's
    blocking ``Client.execute`` on any thread can use it, and no caller's loop ever waits
    on Redis; a forked child gets a client of its own.

    Args:
        client: A ``redis.asyncio.Redis`` or ``RedisCluster`` the store may use as its
            own: it is used on the store's thread only, and closed by :meth:`close`. Give
            it short timeouts and no retries, as :meth:`from_url` does.
        store_key: Key material for the key names and the encryption (at least 16
            bytes), in place of the client secret: processes that share it share tokens
            whatever client secret each holds (a secret being rotated). ``None`` derives
            the keys from the client secret.
        timeout: Seconds each Redis call may take; past it, the process fetches its token
            itself.
        cooldown: Seconds Redis is left alone after a failed or slow call.
        prefix: Start of the key names, e.g. for an ACL pattern.

    Raises:
        ConfigurationError: a bad argument.
    """

    _running: _Running

    def __init__(
        self,
        client: _Client,
        *,
        store_key: bytes | str | None = None,
        timeout: float = STORE_TIMEOUT,
        cooldown: float = STORE_COOLDOWN,
        prefix: str = "gql-service-auth",
    ) -> None:
        if not isinstance(client, (aioredis.Redis, RedisCluster)):
            raise ConfigurationError(
                "client must be a redis.asyncio.Redis or RedisCluster, not "
                f"{type(client).__name__}; for a URL use RedisTokenStore.from_url"
            )
        self._init(lambda: client, store_key, timeout, cooldown, prefix, _client_location(client))
        self._given: _Hidden | None = _Hidden(client)
        self._recipe: _Hidden | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        store_key: bytes | str | None = None,
        timeout: float = STORE_TIMEOUT,
        cooldown: float = STORE_COOLDOWN,
        prefix: str = "gql-service-auth",
        **client_kwargs: Any,
    ) -> RedisTokenStore:
        """A store on the Redis at ``url``, as ``redis.asyncio.Redis.from_url`` reads it.

        ``redis://``, ``rediss://`` (TLS), ``unix://``, ``user:password@`` and the
        database number work as in redis-py. The client gets ``timeout`` as its socket
        timeouts and no retries: a Redis that is down must cost little, and the token
        endpoint is the fallback.

        Args:
            url: The Redis URL; never shown, as it may hold a password.
            client_kwargs: Further ``redis.asyncio.Redis`` keywords (``ssl_ca_certs``...).
            store_key, timeout, cooldown, prefix: As for the constructor.
        """
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(
                "the token store URL must start with redis://, rediss:// or unix://"
            )
        # Hidden: the URL may hold a password, and client_kwargs one too.
        hidden = _Hidden((url, client_kwargs))
        options = _Hidden(
            {
                "socket_timeout": timeout,
                "socket_connect_timeout": timeout,
                "retry": Retry(NoBackoff(), 0),
                **client_kwargs,
            }
        )

        def connect() -> _Client:
            return aioredis.Redis.from_url(url, **options.value)

        store = cls.__new__(cls)
        store._init(connect, store_key, timeout, cooldown, prefix, _url_location(url))
        store._given = None
        store._recipe = _Hidden((hidden.value, store_key, timeout, cooldown, prefix))
        return store

    def _init(
        self,
        connect: Callable[[], _Client],
        store_key: bytes | str | None,
        timeout: float,
        cooldown: float,
        prefix: str,
        location: str,
    ) -> None:
        if isinstance(store_key, str):
            store_key = store_key.encode()
        if store_key is not None and (not isinstance(store_key, bytes) or len(store_key) < 16):
            raise ConfigurationError("store_key must be bytes or str of at least 16 bytes")
        for name, value in (("timeout", timeout), ("cooldown", cooldown)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigurationError(f"{name} must be a number of seconds, at least 0")
        if not timeout:
            raise ConfigurationError("timeout must be more than 0 seconds")
        self._connect = connect
        self._store_key = _Hidden(store_key)
        self._timeout = float(timeout)
        self._cooldown = float(cooldown)
        self._prefix = prefix
        self._location = location
        self._shared_url: _Hidden | None = None
        self._keys: dict[TokenIdentity, Keys] = {}
        self._closed = False
        self._start()
        _fork.reset_in_child(self)

    def _start(self) -> None:
        self._running = _Running()
        # Closes the client and stops the thread when the store is collected, or at exit:
        # a store dropped without close() leaves no open socket behind.
        self._finalizer = weakref.finalize(self, self._running.loop.shut)

    def __repr__(self) -> str:
        return f"<RedisTokenStore {self._location} prefix={self._prefix!r}>"

    # A copy of a transport shares its store, as it would share a connection pool; a
    # pickled one gets a store of the same URL in the process that unpickles it.
    def __copy__(self) -> RedisTokenStore:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> RedisTokenStore:
        return self

    def __reduce__(self) -> tuple[Callable[..., RedisTokenStore], tuple[Any, ...]]:
        if self._shared_url is not None:
            # from_env()'s: unpickled, it is the process's shared store for the same URL.
            return _shared_again, (self._shared_url.value, self._timeout)
        if self._recipe is None:
            raise TypeError(
                "a RedisTokenStore built on a client cannot be pickled: build it with "
                "RedisTokenStore.from_url, or one per process"
            )
        (url, client_kwargs), store_key, timeout, cooldown, prefix = self._recipe.value
        return _restore, (url, client_kwargs, store_key, timeout, cooldown, prefix)

    # The store's own thread and loop, on which the client lives.

    async def _on_own_loop(self, work: Callable[[_Client, _Scripts], Awaitable[_T]]) -> _T:
        """Run ``work(client, scripts)`` on the store's loop; cancelling the caller cancels it.

        Nothing run there refers to the store, so the store is never collected (and its
        finalizer never run) on its own thread.
        """
        running, connect = self._running, self._connect

        async def run() -> _T:
            try:
                if running.client is None:
                    running.client = connect()
                    running.calls = asyncio.Semaphore(_call_limit(running.client))
                assert running.calls is not None
                async with running.calls:
                    return await work(running.client, running.scripts)
            except asyncio.CancelledError:
                if running.loop.closing:
                    # Cancelled by close(), not by the caller: to the caller an error of
                    # the store like any other, so that it fetches its token itself.
                    raise LoopClosed("the token store was closed") from None
                raise

        return await asyncio.wrap_future(running.loop.submit(run()))

    async def _eval(self, source: str, keys: list[str], args: list[Any]) -> Any:
        """Run a Lua script (EVALSHA, loading it on first use) on the keys of one identity."""

        async def work(client: _Client, scripts: _Scripts) -> Any:
            script = scripts.get(source)
            if script is None:
                script = scripts[source] = client.register_script(source)
            return await script(keys=keys, args=args)

        return await self._on_own_loop(work)

    def _keys_of(self, identity: TokenIdentity) -> Keys:
        keys = self._keys.get(identity)
        if keys is None:
            material = self._store_key.value or identity.client_secret.encode()
            keys = self._keys[identity] = Keys(identity, material, self._prefix)
        return keys

    # The TokenStore protocol.

    async def load(self, identity: TokenIdentity) -> StoredToken | None:
        """The stored token of ``identity``, with its time left by Redis's clock."""
        keys = self._keys_of(identity)
        value, lifetime, ttl, replaces = await self._eval(scripts.LOAD, [keys.token], [])
        try:
            if value is None or lifetime is None or int(ttl) <= 0:
                return None
            access_token = keys.open(_text(value))
            life = int(lifetime) / 1000
            fingerprint, before = None, None
            if replaces is not None:
                opened = keys.open(_text(replaces), keys.aad + b":replaces")
                if opened is not None:
                    fingerprint, before = json.loads(opened)
                    before = float(before) if before is not None else None
        except (ValueError, TypeError):  # UnicodeDecodeError and JSONDecodeError too
            # Damaged, or not ours: as good as absent; a fetch's newer token replaces it.
            return None
        if access_token is None:
            return None
        return StoredToken(access_token, int(ttl) / 1000, life, fingerprint, before)

    async def save(self, identity: TokenIdentity, token: StoredToken) -> bool:
        """Store ``token`` unless the stored one expires later (by Redis's clock)."""
        keys = self._keys_of(identity)
        # Capped, so that any expires_in a server sends makes a valid PEXPIRE.
        ttl = min(max(int(token.expires_in * 1000), 1), _MAX_TTL_MS)
        replaces = ""
        if token.replaces:
            replaced = json.dumps([token.replaces, token.replaced_before])
            replaces = keys.seal(replaced, keys.aad + b":replaces")
        args = [
            keys.seal(token.access_token),
            keys.fingerprint(token.access_token),
            ttl,
            min(int(token.lifetime * 1000), _MAX_TTL_MS),
            replaces,
        ]
        return bool(await self._eval(scripts.SAVE, [keys.token], args))

    async def discard(self, identity: TokenIdentity, access_token: str) -> bool:
        """Delete the stored token if it is ``access_token`` (compared by fingerprint)."""
        keys = self._keys_of(identity)
        return bool(
            await self._eval(scripts.DISCARD, [keys.token], [keys.fingerprint(access_token)])
        )

    async def lock(self, identity: TokenIdentity, owner: str, ttl: float) -> str | None:
        """Take (or, for its owner, extend) the fetch lock for ``ttl`` seconds.

        Returns:
            ``None`` when ``owner`` holds it now; else the holder's owner value.
        """
        milliseconds = min(max(int(ttl * 1000), 1), _MAX_TTL_MS)
        answer = await self._eval(
            scripts.LOCK, [self._keys_of(identity).lock], [owner, milliseconds]
        )
        return None if answer is None else _opaque(answer)

    async def unlock(
        self, identity: TokenIdentity, owner: str, failure: str | None = None
    ) -> None:
        """Release the fetch lock if ``owner`` still holds it; publish ``failure``, if any.

        The failure is kept, encrypted as tokens are, for a few seconds.
        """
        keys = self._keys_of(identity)
        sealed = keys.seal(failure, keys.failed.encode()) if failure is not None else ""
        await self._eval(
            scripts.UNLOCK, [keys.lock, keys.failed], [owner, sealed, _FAILURE_TTL_MS]
        )

    async def failure(self, identity: TokenIdentity, owner: str) -> str | None:
        """Why ``owner``'s fetch failed, if it released the lock so a moment ago."""
        keys = self._keys_of(identity)
        value = await self._eval(scripts.GET, [keys.failed], [])
        if value is None:
            return None
        holder, _, sealed = _opaque(value).partition(":")
        return keys.open(sealed, keys.failed.encode()) if holder == owner else None

    # Life cycle.

    def _after_fork_in_child(self) -> None:
        # The store's thread is not in the child, and the client's sockets are the
        # parent's: both stay referenced, unused, and the child starts its own.
        self._finalizer.detach()
        _fork.keep_orphan(self._running)
        self._start()
        if self._given is not None:
            given = self._given.value
            self._connect = lambda: _fresh_copy(given)


class _Running:
    """What a store runs on: a loop thread, and the client and scripts on its loop."""

    def __init__(self) -> None:
        self.client: _Client | None = None
        self.calls: asyncio.Semaphore | None = None
        self.scripts: _Scripts = {}
        self.loop = LoopThread("gql-service-auth-redis", self._close_client)

    def __repr__(self) -> str:
        return f"<running {self.loop!r}>"

    async def _close_client(self) -> None:
        client, self.client = self.client, None
        self.scripts = {}
        if client is not None:
            await client.aclose()


def _restore(
    url: str,
    client_kwargs: dict[str, Any],
    store_key: bytes | None,
    timeout: float,
    cooldown: float,
    prefix: str,
) -> RedisTokenStore:
    return RedisTokenStore.from_url(
        url,
        store_key=store_key,
        timeout=timeout,
        cooldown=cooldown,
        prefix=prefix,
        **client_kwargs,
    )


def _url_location(url: str) -> str:
    """Where ``url`` leads, as redis-py reads it, with no user, password or option.

    Raises:
        ConfigurationError: redis-py cannot read it; the message quotes none of it, as a
            password with an unescaped ``/`` or ``#`` would show in parts.
    """
    try:
        parts = parse_url(url)
    except ValueError:
        raise ConfigurationError(
            "the token store URL cannot be read: check its host and port, and "
            "percent-encode any /, #, ? or @ in its user name or password"
        ) from None
    if parts.get("path"):
        return f"unix://{parts['path']}"
    scheme = url.partition("://")[0]
    host, port = parts.get("host", "localhost"), parts.get("port", 6379)
    return f"{scheme}://{host}:{port}/{parts.get('db', 0)}"


def _client_location(client: _Client) -> str:
    if isinstance(client, RedisCluster):
        nodes = client.get_nodes() or getattr(client.nodes_manager, "startup_nodes", {}).values()
        return "redis-cluster://" + ",".join(sorted(f"{n.host}:{n.port}" for n in nodes))
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{kwargs.get('db', 0)}"


def _call_limit(client: _Client) -> int:
    if isinstance(client, aioredis.Redis):
        pool_size = getattr(client.connection_pool, "max_connections", None)
        if isinstance(pool_size, int) and pool_size > 0:
            return min(pool_size, _MAX_CALLS)
    return _MAX_CALLS


def _open_shared(url: str, timeout: float) -> RedisTokenStore:
    store = RedisTokenStore.from_url(url, timeout=timeout)
    store._shared_url = _Hidden(url)
    return store


_SHARED = StoresByUrl(_open_shared, lambda store: store.closed)


def _shared_again(url: str, timeout: float) -> RedisTokenStore:
    """Unpickled, a shared store is the process's shared store of that URL and timeout."""
    return shared_store(url, timeout=timeout)


def shared_store(url: str, *, timeout: float = STORE_TIMEOUT) -> RedisTokenStore:
    """The process's one store for ``url`` and ``timeout``, opened on first use
    (``from_env()``'s).

    Transports built one per job share it, rather than each opening a connection and a
    thread. One that was closed is replaced. A forked child keeps it: the store resets
    itself there. Closed at exit, as every store is.
    """
    return _SHARED.get(url, timeout)


def _fresh_copy(client: _Client) -> _Client:
    """A client with ``client``'s settings and none of its connections."""
    if isinstance(client, aioredis.Redis):
        pool = client.connection_pool
        fresh = type(pool)(connection_class=pool.connection_class, **pool.connection_kwargs)
        # from_pool: the client owns the pool, so closing the client closes its connections.
        return aioredis.Redis.from_pool(fresh)
    raise RuntimeError("a RedisCluster given to RedisTokenStore cannot be used after fork()")
