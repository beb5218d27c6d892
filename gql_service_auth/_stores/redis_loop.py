"""A Redis token store's life on its own loop: the client, its one set-up, its pool's
connections taken before a call's ``timeout`` starts, and the scripts it runs.

Nothing here refers to the store itself, so the store is never collected (and its
finalizer never run) on its own thread; ``RedisTokenStore`` (``gql_service_auth.redis``)
submits its calls here through :func:`~.protocol.call_on_thread`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from .._core.loop_thread import LoopThread
from . import redis_clients as clients
from . import redis_scripts as scripts
from .protocol import StoreTimeout, outcome_read

_Client = clients.Client

_MAX_CALLS = 32
"""Store calls under way at once, at most: the others queue, rather than overflow the
client's connection pool (redis-py raises at 100), which would pass for an outage."""


class Running:
    """What a store runs on: a loop thread, and the client and scripts on its loop.

    Args:
        connect: Builds the client (opens nothing yet).
        connect_timeout: Seconds its set-up may take.
    """

    def __init__(self, connect: Callable[[], _Client], connect_timeout: float) -> None:
        self._connect = connect
        self._connect_timeout = connect_timeout
        self.client: _Client | None = None
        self.calls: asyncio.Semaphore | None = None
        self.scripts: dict[str, Any] = {}
        self.setting_up: asyncio.Future[None] | None = None
        self.set_up = False
        self.loop = LoopThread("gql-service-auth-redis", self._close_client)

    def __repr__(self) -> str:
        return f"<running {self.loop!r}>"

    @property
    def set_up_span(self) -> float:
        return self._connect_timeout * _SET_UP_SPAN

    def script(self, source: str) -> Any:
        script = self.scripts.get(source)
        if script is None:
            assert self.client is not None
            if isinstance(self.client, RedisCluster):
                # EVAL, routed by key: redis-py's Script answers a NOSCRIPT by loading the
                # script on every primary, and one frozen primary would hold each first
                # call; EVAL caches it on the node that runs it.
                script = functools.partial(_eval_by_key, source)
            else:
                script = self.client.register_script(source)
            self.scripts[source] = script
        return script

    async def ready(self) -> None:
        """Connect (once: every call waits for the one set-up under way; again after a
        failure), waiting ``connect_timeout`` at most. On the store's loop.

        The set-up is a task of its own, which a caller that gives up leaves running (up
        to ``_SET_UP_SPAN`` times the bound): a set-up slower than one caller's bound, a
        Redis far away, still ends, and serves the callers after it.
        """
        if self.set_up:
            return
        if self.client is None:
            self.client = self._connect()
            self.calls = asyncio.Semaphore(_call_limit(self.client))
        task = self.setting_up
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self.setting_up = asyncio.ensure_future(self._bounded_set_up(self.client))
            task.add_done_callback(outcome_read)  # a set-up every caller gave up on
        try:
            await asyncio.wait_for(asyncio.shield(task), self._connect_timeout)
        except asyncio.TimeoutError:
            raise StoreTimeout(
                f"not connected within {self._connect_timeout:g} s (connect_timeout)"
            ) from None
        self.set_up = True

    async def _bounded_set_up(self, client: _Client) -> None:
        await asyncio.wait_for(self._set_up(client), self.set_up_span)

    async def ready_client(self) -> tuple[_Client, asyncio.Semaphore]:
        await self.ready()
        assert self.client is not None
        assert self.calls is not None
        return self.client, self.calls

    async def _set_up(self, client: _Client) -> None:
        """One round of what the first call would otherwise pay: a connection (TLS and
        AUTH included), the cluster's slots, the scripts loaded where they run."""
        if isinstance(client, RedisCluster):
            # The slots only: loading the scripts on every primary would wait for each,
            # and one frozen primary would stop every identity; a call loads its script
            # where it runs (NOSCRIPT, then SCRIPT LOAD).
            await client.initialize()
            return
        # One round trip for every script, rather than a NOSCRIPT and a load in the first
        # call of each (the Sentinels' primary is asked for on connecting). No PING: the
        # ACL line of the docs before 0.3 does not allow it.
        async with client.pipeline(transaction=False) as pipe:
            for source in _ALL_SCRIPTS:
                pipe.script_load(source)
            await pipe.execute()

    async def _close_client(self) -> None:
        client, self.client = self.client, None
        self.scripts = {}
        self.set_up = False
        if client is not None:
            await clients.close(client)


_SET_UP_SPAN = 3
"""A set-up may go on for this many times ``connect_timeout``, for the callers after the
ones that gave up on it; redis-py's socket timeouts bound each of its steps too."""


async def _eval_by_key(source: str, keys: list[str], args: list[Any], client: _Client) -> Any:
    return await client.eval(source, len(keys), *keys, *args)


@contextlib.asynccontextmanager
async def connection_at_hand(client: _Client, span: float) -> AsyncIterator[_Client]:
    """A client on one connection of a single server's pool, taken (and opened, if it
    must be: TCP, TLS, AUTH; a Sentinel asked where the primary is) before the call's
    ``timeout`` starts, and given back after: a burst of calls to a Redis far away grows
    the pool, rather than each call cut off while it connects, or racing the others for
    the connections they opened. The taking is a task of its own, as the set-up is: a
    caller that gives up leaves it to end (within ``span`` seconds) and hand the
    connection back for the next. A cluster's connections open within the call."""
    if not isinstance(client, aioredis.Redis):
        yield client
        return
    single = client.client()  # the same pool; closing it gives its connection back

    async def take() -> None:
        # Made here, not as an argument: a task cancelled before it starts (the store
        # closed) leaves no coroutine never awaited.
        await asyncio.wait_for(single.initialize(), span)

    def give_back() -> Awaitable[None]:
        # The connection leaves the client at once, even if its release never runs (the
        # store closing): the pool's own closing disconnects it, and the client is not
        # left to warn of an unclosed connection when collected.
        connection, single.connection = single.connection, None
        if connection is None:
            return asyncio.sleep(0)
        return client.connection_pool.release(connection)

    taking = asyncio.ensure_future(take())
    taking.add_done_callback(outcome_read)
    try:
        await asyncio.shield(taking)
    except asyncio.CancelledError:
        taking.add_done_callback(lambda _: asyncio.ensure_future(give_back()))
        raise
    try:
        yield single
    finally:
        await asyncio.shield(give_back())


_ALL_SCRIPTS = (
    scripts.LOAD,
    scripts.SAVE,
    scripts.DISCARD,
    scripts.LOCK,
    scripts.UNLOCK,
    scripts.GET,
    scripts.NOTE,
    scripts.ADMIT,
)


def _call_limit(client: _Client) -> int:
    if isinstance(client, aioredis.Redis):
        pool_size = getattr(client.connection_pool, "max_connections", None)
        if isinstance(pool_size, int) and pool_size > 0:
            return min(pool_size, _MAX_CALLS)
    return _MAX_CALLS
