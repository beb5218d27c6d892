"""What a Redis token store makes of redis-py's errors: which a fresh connection heals,
and, for the others, the cause and the fix in words an operator can act on.

Managed Redis fails in ways a single local server does not: connections closed while
idle (by Redis's own ``timeout``, a proxy, a load balancer), a failover behind one DNS
name that leaves connections on the demoted primary (``READONLY``), a slot being migrated
(``TRYAGAIN``). Those cost one more try on a fresh connection, not an outage. A URL of the
wrong kind (a cluster node named by ``redis://``), a TLS certificate, an ACL without a
command the store runs: each is said with its fix (see docs/managed-redis.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster

from .redis_clients import Client

ACL_COMMANDS = (
    "+select +set +evalsha +eval +script|load +time +hget +hmget +hset +pttl +pexpire +incr "
    "+get +del"
)
"""What the store runs (its scripts included), for an ACL line with ``~<prefix>:*``."""

ACL_CLUSTER_EXTRA = "+cluster|slots +cluster|shards +command +asking +readonly"
"""What redis-py's cluster client runs besides, to discover the cluster and follow migrations."""

ACL_CLUSTER_COMMANDS = f"{ACL_COMMANDS} {ACL_CLUSTER_EXTRA}"
"""The ACL commands of a store on a cluster."""

_TRY_AGAIN_WAIT = 0.05
"""Seconds before trying again a call whose keys were mid-migration (TRYAGAIN)."""


def healable(exc: BaseException) -> bool:
    """Whether a fresh connection may succeed where this error came from one in the pool."""
    if isinstance(exc, (redis_errors.AuthenticationError, redis_errors.NoPermissionError)):
        return False
    if isinstance(exc, redis_errors.ConnectionError):
        return not _tls_fault(exc)
    if isinstance(exc, redis_errors.ClusterError) and "TTL exhausted" in str(exc):
        # A cluster client's own redirections and TRYAGAIN waits ran out (a slot moving).
        return True
    return _read_only(exc) or isinstance(
        exc,
        (
            redis_errors.TryAgainError,
            ConnectionResetError,
            BrokenPipeError,
        ),
    )


async def heal(client: Client, exc: BaseException) -> None:
    """Drop what ``exc`` says is stale, so that the next try gets a fresh connection.

    The call's own connection goes, and the pool's idle ones (a failover or an idle close
    affects them all): the next try connects afresh. A cluster
    client reads the slots again; a Sentinel-backed pool asks the Sentinels again on its
    next connection.
    """
    if isinstance(exc, redis_errors.TryAgainError):
        await asyncio.sleep(_TRY_AGAIN_WAIT)
        return
    if isinstance(client, RedisCluster):
        await client.nodes_manager.initialize()
        return
    # A client on one connection (the call's own) reconnects it on its next command.
    if client.connection is not None:
        await client.connection.disconnect()
    await client.connection_pool.disconnect(inuse_connections=False)


def _read_only(exc: BaseException) -> bool:
    """A write refused by a replica: redis-py's own error, or (Redis 6) the same refusal of
    a write inside a script, which reaches redis-py as a plain "Error running script"."""
    if isinstance(exc, redis_errors.ReadOnlyError):
        return True
    return isinstance(exc, redis_errors.ResponseError) and "-READONLY " in str(exc)


def _tls_fault(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "ssl" in text or "certificate" in text or "tls" in text


@dataclass(frozen=True, slots=True)
class _Fault:
    """A store failure, as the advice rules read it."""

    exc: BaseException
    text: str
    clustered: bool
    tls: bool

    def of(self, *kinds: type[BaseException]) -> bool:
        return isinstance(self.exc, kinds)

    def says(self, *words: str) -> bool:
        lowered = self.text.lower()
        return any(word in lowered for word in words)


# The advice for each cause, the first that applies: (when, what to say). ``{needs}`` is
# the ACL the store needs (a cluster's has more).
_ADVICE: tuple[tuple[Callable[[_Fault], bool], str], ...] = (
    (
        lambda fault: (
            fault.of(redis_errors.MovedError, redis_errors.AskError) and not fault.clustered
        ),
        "this Redis is a node of a Redis Cluster: name it with a redis+cluster:// "
        "(rediss+cluster:// for TLS) URL, or give the store a RedisCluster",
    ),
    (
        # redis-py says so too when the ACL refuses CLUSTER SLOTS.
        lambda fault: fault.says("cluster mode is not enabled", "cluster support disabled"),
        "this Redis is not a cluster: name it with a redis:// (rediss://) URL; or, if it "
        f"is one, its user may not discover it: its ACL needs {ACL_CLUSTER_EXTRA}",
    ),
    (
        # NOPERM; or, for a command inside a script, a plain error saying so.
        lambda fault: (
            fault.of(redis_errors.NoPermissionError) or fault.says("can't run this command")
        ),
        "the Redis user may not run a command the store needs: its ACL needs ~<prefix>:* {needs}",
    ),
    (
        lambda fault: (
            fault.of(redis_errors.AuthenticationError) or fault.says("username-password")
        ),
        "Redis refused the user name or password of the URL (or credential_provider)",
    ),
    (
        lambda fault: _read_only(fault.exc),
        "this Redis is a replica, even on a fresh connection: name the primary "
        "endpoint, or the Sentinels with redis+sentinel://",
    ),
    (
        lambda fault: fault.of(redis_errors.ConnectionError) and _tls_fault(fault.exc),
        "TLS failed: with a private CA, add ?ssl_ca_certs=/path/to/ca.pem to the URL "
        "(and ssl_certfile=, ssl_keyfile= if Redis asks for a client certificate); "
        "a server without TLS wants redis://, not rediss://",
    ),
    (
        lambda fault: (
            fault.of(redis_errors.ConnectionError)
            and not fault.tls
            and fault.says("reset by peer", "closed by server")
        ),
        "the server closed the connection: if it expects TLS, use rediss://",
    ),
    (
        lambda fault: fault.of(redis_errors.ClusterError) and "TTL exhausted" in fault.text,
        "a slot of the cluster was moving (a resharding, a failover), longer than the "
        "call's timeout: this passes once the move is done",
    ),
    (
        lambda fault: type(fault.exc).__name__ == "MasterNotFoundError",
        "no Sentinel named a primary that answers for that service: check the service "
        "name and that the Sentinels can be reached; during a failover, this passes "
        "once a replica is promoted",
    ),
)


def explain(exc: BaseException, *, clustered: bool, tls: bool) -> str | None:
    """The cause of a store failure and its fix, in words; ``None`` when there is no more
    to say than redis-py's message (Redis down, a timeout)."""
    fault = _Fault(exc, str(exc), clustered, tls)
    needs = ACL_CLUSTER_COMMANDS if clustered else ACL_COMMANDS
    for applies, advice in _ADVICE:
        if applies(fault):
            return advice.replace("{needs}", needs)
    return None
