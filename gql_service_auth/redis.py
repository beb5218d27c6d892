"""Share access tokens across processes and hosts through Redis (or Valkey).

Needs the ``[redis]`` extra: ``pip install 'gql-service-auth[redis]'``.

>>> store = RedisTokenStore.from_url("redis://127.0.0.1:6379/0")  # doctest: +SKIP
>>> transport = OAuth2Transport(url, token_url=..., ..., token_store=store)  # doctest: +SKIP

What Redis holds, per set of credentials, is the token, encrypted, a lock taken while one
process fetches, and for the token budget (see :class:`~gql_service_auth.TokenBudget`) the
fleet's count of token requests in the current window and, after a refusal of the
credentials, that refusal, encrypted. None says whose they are:

- A key's name is ``<prefix>:{<tag>}:token`` (and ``:lock``, ``:spent``, ``:refused``,
  ``:failed``), where the tag is an HMAC of
  the token URL, client id, scope, further token parameters and client authentication
  method, keyed by HKDF from the client secret (or from ``store_key``). The braces are
  a Redis Cluster hash tag: the keys live in one slot, so the scripts run on a cluster.
- The token is encrypted with AES-GCM under another HKDF key from the same secret, the
  key's name as associated data, so it cannot be moved to another key unnoticed. Its
  fingerprint, for the compare-and-delete of a refused token, is an HMAC too.

So reading Redis, its backups, its replicas or ``MONITOR`` gives nothing usable; every
process that holds the client secret (and so could fetch a token itself) can read it.
The commands used are in Redis 6.2 and Valkey alike: ``EVALSHA`` (with ``SCRIPT LOAD``),
and in scripts ``SET PX``, ``TIME``, ``HGET``, ``HMGET``, ``HSET``, ``PTTL``,
``PEXPIRE``, ``INCR``, ``GET`` and ``DEL``.
"""

from __future__ import annotations

try:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from ._stores import redis_clients as clients
    from ._stores.redis_faults import explain, heal, healable
    from ._stores.redis_keys import Keys  # cryptography
    from ._stores.redis_loop import Running, connection_at_hand
    from ._stores.sealed import Hidden as _Hidden
except ImportError as exc:  # pragma: no cover - the extra is installed for the tests
    raise ImportError(
        "gql_service_auth.redis needs the redis extra: pip install 'gql-service-auth[redis]'"
    ) from exc

import asyncio
import json
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from ._core import fork as _fork
from ._core.constants import STORE_CONNECT_TIMEOUT, STORE_COOLDOWN, STORE_TIMEOUT
from ._core.errors import ConfigurationError
from ._core.loop_thread import LoopClosed
from ._stores import redis_scripts as scripts
from ._stores.protocol import (
    Remembered,
    StoredToken,
    StoreFault,
    StoreOnItsThread,
    StoresByUrl,
    Timeouts,
    TokenIdentity,
    Turn,
    call_on_thread,
    checked_seconds,
)

__all__ = ["RedisTokenStore"]

_T = TypeVar("_T")

_Client = clients.Client
_Scripts = dict[str, Any]

_MAX_TTL_MS = 366 * 24 * 3600 * 1000
"""The longest a token is kept, whatever its ``expires_in``: a year (and a valid PEXPIRE)."""

_FAILURE_TTL_MS = 5000
"""How long a failed fetch's reason is kept for its waiters, who poll every 80 ms at most."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _opaque(value: bytes | str) -> str:
    """An owner value as text, whatever bytes another client wrote there."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _refused(keys: Keys, identity: TokenIdentity) -> str:
    """The key of a refusal of ``identity``'s secret: with ``store_key``, the secrets of a
    client id share the other keys, and one's refusal is no other's."""
    return f"{keys.refused}:{keys.fingerprint(identity.client_secret)[:16]}"


class RedisTokenStore(StoreOnItsThread):
    """A :class:`~gql_service_auth.TokenStore` on Redis, Redis Cluster, Sentinel or Valkey.

    Give it to :class:`~gql_service_auth.OAuth2Transport` as ``token_store=``; one store
    may serve many transports, even with different credentials. Redis is used only when
    a process needs a new token, never per request. It runs its Redis calls on a thread
    and event loop of its own, so the client is never shared between event loops, gql's
    blocking ``Client.execute`` on any thread can use it, and no caller's loop ever waits
    on Redis; a forked child gets a client of its own, of the same kind.

    A connection that Redis, a proxy or a failover closed or demoted (``ConnectionError``,
    ``READONLY``), or a slot being migrated (``TRYAGAIN``), costs no outage: the store
    drops its connections and tries the call once more, on a fresh one, within the call's
    ``timeout``. Only Redis itself failing counts.

    Args:
        client: A ``redis.asyncio.Redis`` (a Sentinel's ``master_for`` one too) or
            ``RedisCluster`` the store may use as its own: it is used on the store's
            thread only, and closed by :meth:`close`. Give it no retries of its own, as
            :meth:`from_url` does.
        store_key: Key material for the key names and the encryption (at least 16
            bytes), in place of the client secret: processes that share it share tokens
            whatever client secret each holds (a secret being rotated). ``None`` derives
            the keys from the client secret.
        timeout: Seconds each Redis call may take, once the store is connected; past it,
            the process fetches its token itself.
        connect_timeout: Seconds a call may wait for the store to be ready: connected
            (TLS and AUTH done, a cluster discovered, the scripts loaded) and its turn
            come, before ``timeout`` starts.
        cooldown: Seconds Redis is left alone after a failed or slow call.
        prefix: Start of the key names, e.g. for an ACL pattern.

    Raises:
        ConfigurationError: a bad argument.
    """

    _running: Running

    def __init__(
        self,
        client: _Client,
        *,
        store_key: bytes | str | None = None,
        timeout: float = STORE_TIMEOUT,
        connect_timeout: float = STORE_CONNECT_TIMEOUT,
        cooldown: float = STORE_COOLDOWN,
        prefix: str = "gql-service-auth",
    ) -> None:
        if not isinstance(client, (aioredis.Redis, RedisCluster)):
            raise ConfigurationError(
                "client must be a redis.asyncio.Redis or RedisCluster, not "
                f"{type(client).__name__}; for a URL use RedisTokenStore.from_url"
            )
        self._given: _Hidden | None = _Hidden(client)
        self._recipe: _Hidden | None = None
        bounds = checked_seconds(
            timeout=timeout, connect_timeout=connect_timeout, cooldown=cooldown
        )
        self._init(lambda: client, store_key, bounds, prefix, clients.client_location(client))

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        store_key: bytes | str | None = None,
        timeout: float = STORE_TIMEOUT,
        connect_timeout: float = STORE_CONNECT_TIMEOUT,
        cooldown: float = STORE_COOLDOWN,
        prefix: str = "gql-service-auth",
        **client_kwargs: Any,
    ) -> RedisTokenStore:
        """A store on the Redis at ``url``.

        ``redis://``, ``rediss://`` (TLS), ``unix://``, ``user:password@``, the database
        number and options such as ``?ssl_ca_certs=`` work as in redis-py's
        ``Redis.from_url``; ``redis+cluster://host:port[,host:port...]`` is a Redis
        Cluster and ``redis+sentinel://host:26379[,...]/service[/db]`` the primary the
        Sentinels name (``rediss+`` for TLS): see :doc:`/managed-redis`. The client gets
        no retries of its own: a Redis that is down must cost little, and the token
        endpoint is the fallback.

        Args:
            url: The Redis URL; never shown, as it may hold a password.
            client_kwargs: Further redis-py client keywords (``ssl_ca_certs``,
                ``credential_provider``...).
            store_key, timeout, connect_timeout, cooldown, prefix: As for the constructor.

        Raises:
            ConfigurationError: a URL of another form, one that cannot be read (never
                quoted), or a bad argument.
        """
        if not isinstance(url, str) or not url.startswith(clients.SCHEMES):
            raise ConfigurationError(
                "the token store URL must start with redis://, rediss://, unix://, "
                "redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://"
            )
        bounds = checked_seconds(
            timeout=timeout, connect_timeout=connect_timeout, cooldown=cooldown
        )
        location = clients.location(url)
        # Hidden: the URL may hold a password, and client_kwargs one too.
        hidden = _Hidden((url, client_kwargs))
        options = _Hidden(
            {
                # Guards only: the store bounds each step itself (call_on_thread), and a
                # read that redis-py cut short would cost the connection.
                "socket_timeout": bounds["connect_timeout"] + bounds["timeout"],
                "socket_connect_timeout": bounds["connect_timeout"],
                "retry": Retry(NoBackoff(), 0),
                **client_kwargs,
            }
        )

        def connect() -> _Client:
            return clients.build(hidden.value[0], options.value)

        store = cls.__new__(cls)
        store._given = None
        store._recipe = _Hidden((hidden.value, store_key, bounds, prefix))
        store._init(connect, store_key, bounds, prefix, location)
        return store

    def _init(
        self,
        connect: Callable[[], _Client],
        store_key: bytes | str | None,
        bounds: dict[str, float],
        prefix: str,
        location: str,
    ) -> None:
        if isinstance(store_key, str):
            store_key = store_key.encode()
        if store_key is not None and (not isinstance(store_key, bytes) or len(store_key) < 16):
            raise ConfigurationError("store_key must be bytes or str of at least 16 bytes")
        self._connect = connect
        self._store_key = _Hidden(store_key)
        self._timeout = bounds["timeout"]
        self._connect_timeout = bounds["connect_timeout"]
        self._cooldown = bounds["cooldown"]
        self._prefix = prefix
        self._location = location
        self._shared_url: _Hidden | None = None
        self._keys: Remembered[Keys] = Remembered(self._derive_keys)
        self._closed = False
        self._start()
        _fork.reset_in_child(self)

    def _start(self) -> None:
        self._running = Running(self._connect, self._connect_timeout)
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
            return _shared_again, (self._shared_url.value, self._timeout, self._connect_timeout)
        if self._recipe is None:
            raise TypeError(
                "a RedisTokenStore built on a client cannot be pickled: build it with "
                "RedisTokenStore.from_url, or one per process"
            )
        (url, client_kwargs), store_key, bounds, prefix = self._recipe.value
        return _restore, (url, client_kwargs, store_key, bounds, prefix)

    # The store's own thread and loop, on which the client lives.

    async def _eval(self, source: str, keys: list[str], args: list[Any]) -> Any:
        """Run a Lua script (EVALSHA, loading it on first use) on the keys of one identity.

        Once connected, within ``timeout``: a connection found closed or demoted, or a
        slot found moving, is healed and the call made once more (every script is safe to
        run twice: a read, a newer-only write, or a compare-and-set by owner).
        Cancelling the caller cancels it. Nothing run on the store's loop refers to the
        store, so the store is never collected (and its finalizer never run) there.
        """
        running = self._running

        async def body(turn: Turn) -> Any:
            try:
                client, calls = await running.ready_client()
                async with calls, connection_at_hand(client, running.set_up_span) as on_one:
                    turn.start()
                    script = running.script(source)
                    try:
                        return await script(keys=keys, args=args, client=on_one)
                    except Exception as exc:
                        if not healable(exc):
                            raise
                        await heal(on_one, exc)
                    return await script(keys=keys, args=args, client=on_one)
            except asyncio.CancelledError:
                if running.loop.closing and not turn.abandoned:
                    # Cancelled by close(), not by the caller: to the caller an error of
                    # the store like any other, so that it fetches its token itself.
                    raise LoopClosed("the token store was closed") from None
                raise
            except Exception as exc:
                held = running.client
                advice = explain(
                    exc, clustered=isinstance(held, RedisCluster), tls=clients.uses_tls(held)
                )
                if advice is None:
                    raise
                raise StoreFault(type(exc).__name__, f"{advice} ({str(exc)[:160]})") from None

        return await call_on_thread(
            running.loop, body, connect_timeout=self._connect_timeout, timeout=self._timeout
        )

    def _derive_keys(self, identity: TokenIdentity) -> Keys:
        material = self._store_key.value or identity.client_secret.encode()
        return Keys(identity, material, self._prefix)

    def _keys_of(self, identity: TokenIdentity) -> Keys:
        return self._keys.of(identity)

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

    # The fleet's share of token budgets (see gql_service_auth.TokenBudget): optional in
    # the TokenStore protocol, looked up by name.

    async def note_refusal(self, identity: TokenIdentity, text: str, seconds: float) -> None:
        """Keep, ``seconds`` long and encrypted, that the token endpoint refused these
        credentials (``text``, with no secret): other processes do not ask meanwhile."""
        keys = self._keys_of(identity)
        sealed = keys.seal(text, keys.refused.encode())
        milliseconds = max(int(seconds * 1000), 1)
        await self._eval(scripts.NOTE, [_refused(keys, identity)], [sealed, milliseconds])

    async def admit(
        self, identity: TokenIdentity, window: float | None
    ) -> tuple[tuple[str, float] | None, tuple[int, float] | None]:
        """In one round trip: the refusal kept for these credentials, with its seconds
        left; else, with a ``window``, one more token request counted in the window of
        that many seconds shared by every process, with the requests counted and the
        window's seconds left (``None`` for what does not apply)."""
        keys = self._keys_of(identity)
        milliseconds = "" if window is None else str(max(int(window * 1000), 1))
        value, ttl, used, left = await self._eval(
            scripts.ADMIT, [_refused(keys, identity), keys.spent], [milliseconds]
        )
        if value:
            text = keys.open(_opaque(value), keys.refused.encode())
            return (None if text is None else (text, max(int(ttl), 0) / 1000)), None
        if used:
            return None, (int(used), max(int(left), 0) / 1000)
        return None, None

    # Life cycle.

    def _after_fork_in_child(self) -> None:
        # The store's thread is not in the child, and the client's sockets are the
        # parent's: both stay referenced, unused, and the child starts its own, of the
        # same kind (a cluster, a Sentinel's primary).
        self._finalizer.detach()
        _fork.keep_orphan(self._running)
        if self._given is not None:
            given = self._given.value
            self._connect = lambda: clients.fresh_copy(given)
        self._start()


def _restore(
    url: str,
    client_kwargs: dict[str, Any],
    store_key: bytes | None,
    bounds: dict[str, float],
    prefix: str,
) -> RedisTokenStore:
    return RedisTokenStore.from_url(
        url, store_key=store_key, prefix=prefix, **bounds, **client_kwargs
    )


def _open_shared(url: str, timeouts: Timeouts) -> RedisTokenStore:
    timeout, connect_timeout = timeouts
    store = RedisTokenStore.from_url(url, timeout=timeout, connect_timeout=connect_timeout)
    store._shared_url = _Hidden(url)
    store.prepare()
    return store


_SHARED = StoresByUrl(_open_shared, lambda store: store.closed)


def _shared_again(url: str, timeout: float, connect_timeout: float) -> RedisTokenStore:
    """Unpickled, a shared store is the process's shared store of that URL and timeouts."""
    return shared_store(url, timeout=timeout, connect_timeout=connect_timeout)


def shared_store(
    url: str, *, timeout: float = STORE_TIMEOUT, connect_timeout: float = STORE_CONNECT_TIMEOUT
) -> RedisTokenStore:
    """The process's one store for ``url`` and its timeouts, opened on first use
    (``from_env()``'s), and set up at once, in the background.

    Transports built one per job share it, rather than each opening a connection and a
    thread. One that was closed is replaced. A forked child keeps it: the store resets
    itself there. Closed at exit, as every store is.
    """
    return _SHARED.get(url, (timeout, connect_timeout))
