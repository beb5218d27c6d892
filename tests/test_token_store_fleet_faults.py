"""The shared token store under fleet faults: revocations, failing endpoints, pools, closes.

Each test runs gql's ``Client`` against the emulator (real clock) and a real
``redis-server``, both on 127.0.0.1; the fleet tests start real processes
(tests/fleet_worker.py).
"""

from __future__ import annotations

import asyncio
import pickle
import threading
from datetime import date
from typing import Any

import pytest
from gql import Client
from gql.transport.exceptions import TransportServerError
from redis_server import RedisServer, command
from support import (
    COUNT,
    HANG_GUARD,
    SLOW_MACHINE,
    UNAUTHENTICATED_ERROR,
    Fleet,
    closed_port,
    fleet_config,
    identity_of,
    query,
    token_of_its_own,
    with_store,
)

from gql_service_auth import (
    AuthEvent,
    ConfigurationError,
    OAuth2Transport,
    RetryPolicy,
    StoredToken,
    TokenIdentity,
)
from gql_service_auth.emulator import ClientRecord, Emulator, ManualClock
from gql_service_auth.redis import RedisTokenStore


def run_fleet(processes: int, config: dict[str, Any]) -> list[dict[str, Any]]:
    """One phase of ``processes`` fleet workers started together; each one's outcome."""
    fleet = Fleet(processes, **config)
    try:
        return fleet.run()
    finally:
        fleet.close()


# 1. Revocations.


async def test_a_revocation_that_covers_a_peers_newer_token_fails_no_query(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """Refused, a transport does not take a stored token from before its refusal: it fetches."""
    events: list[AuthEvent] = []
    transport = with_store(live_emulator, store, events)
    await query(transport)
    # A peer renewed ahead of expiry and stored its newer token; then every token is revoked.
    newer = await token_of_its_own(live_emulator)
    assert await store.save(identity_of(live_emulator), StoredToken(newer, 3600.0, 3600.0))
    live_emulator.revoke_tokens()
    await query(transport)  # before: UnauthenticatedError after 1 renewal
    assert transport.token is not None
    assert transport.token.value != newer
    assert live_emulator.counters.token_requests == 3
    assert [e.name for e in events].count("token_fetched") == 2


async def test_the_renewal_of_a_revoked_shared_token_serves_every_transport(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """Refused one after another with the fleet's token, transports share one renewal."""
    transports = [with_store(live_emulator, store) for _ in range(4)]
    for transport in transports:
        await query(transport)
    live_emulator.revoke_tokens()
    for transport in transports:  # each learns of the revocation later than the one before
        await query(transport)
    assert live_emulator.counters.token_requests == 2
    assert len({t.token.value for t in transports if t.token is not None}) == 1


# 2. A token endpoint that fails, with a store: the fetch's own deadline, one fetch.


def test_processes_waiting_on_a_failing_fetch_learn_its_error(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """6 processes, a 503 endpoint: all end in TokenRequestError, after one process's tries."""
    live_emulator.token_latency = 0.2
    live_emulator.fail_token_requests(1000, 503)
    config = fleet_config(
        live_emulator,
        redis_server.url,
        concurrency=1,
        retry_timeout=1.5,
        store_timeout=SLOW_MACHINE,
        execute_timeout=HANG_GUARD,
    )
    outcomes = run_fleet(6, config)
    # Before: the waiters waited out the holder's lock, then fetched in turn (more token
    # requests than one process's tries), and ran into execute_timeout (TimeoutError).
    assert [o["failures"] for o in outcomes] == [["TokenRequestError"]] * 6
    # One process's tries (at most 4 of 0.2 s in 1.5 s), not one process's after another's.
    assert live_emulator.counters.token_requests <= 4


async def test_a_hung_token_endpoint_ends_in_token_request_error_with_a_store(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """Transports waiting on a fetch that hangs get TokenRequestError at its deadline."""
    live_emulator.freeze_token_endpoint(2 * HANG_GUARD)  # hung for longer than any wait
    try:
        retry = RetryPolicy(timeout=1.0)
        transports = [with_store(live_emulator, store, retry=retry) for _ in range(3)]
        outcomes = await asyncio.gather(
            *(
                Client(transport=t, execute_timeout=HANG_GUARD).execute_async(COUNT)
                for t in transports
            ),
            return_exceptions=True,
        )
    finally:
        live_emulator.freeze_token_endpoint(0)
    assert [type(o).__name__ for o in outcomes] == ["TokenRequestError"] * 3
    assert live_emulator.counters.token_requests == 1


# 3. The store's own connection pool is no outage.


async def test_two_hundred_transports_on_one_store_read_their_tokens(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """200 credentials, each token in Redis: 200 new transports at once cost 0 token requests."""
    registered = date(2025, 1, 15)
    clients = [ClientRecord.generate(f"emu-pool-client-{i}", registered) for i in range(200)]
    live_emulator.clients.update((c.client_id, c) for c in clients)

    retry = RetryPolicy()  # the default 8 s deadline: 200 fetches at once on a slow machine
    for client in clients:  # one at a time: the tokens land in Redis
        await query(with_store(live_emulator, store, client=client, retry=retry))
    live_emulator.reset_counters()
    events: list[AuthEvent] = []
    await asyncio.gather(
        *(
            query(with_store(live_emulator, store, events, client=client, retry=retry))
            for client in clients
        )
    )
    # Before: over redis-py's pool of 100, MaxConnectionsError passed for Redis being down.
    assert live_emulator.counters.token_requests == 0
    assert [e.name for e in events] == ["token_loaded"] * 200


# 4. A process with no token of its own takes a usable stored token due for renewal.


async def test_a_new_process_takes_a_stored_token_due_for_renewal(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """With 20 s left of 3600 (past the 60 s margin), a stored token serves a cold transport."""
    stored = await token_of_its_own(live_emulator)
    assert await store.save(identity_of(live_emulator), StoredToken(stored, 20.0, 3600.0))
    live_emulator.fail_token_requests(1000, 503)  # the token endpoint is down
    events: list[AuthEvent] = []
    transport = with_store(live_emulator, store, events)
    await query(transport, times=3)  # before: TokenRequestError
    assert transport.token is not None
    assert transport.token.value == stored
    assert events[0].name == "token_loaded"


async def test_a_token_due_for_renewal_taken_from_the_store_is_renewed_in_the_background(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """The next query after taking it renews it once, for this transport and the store."""
    stored = await token_of_its_own(live_emulator)
    assert await store.save(identity_of(live_emulator), StoredToken(stored, 20.0, 3600.0))
    events: list[AuthEvent] = []
    transport = with_store(live_emulator, store, events)
    await query(transport)
    await query(transport)
    for _ in range(200):  # bounded: 2 s at most
        if transport.token is not None and transport.token.value != stored:
            break
        await asyncio.sleep(0.01)
    assert [e.name for e in events] == ["token_loaded", "token_fetched"]
    assert events[1].reason == "expiring"
    loaded = await store.load(identity_of(live_emulator))
    assert loaded is not None
    assert loaded.access_token == transport.token.value


# 5. from_env(): one store per URL per process.


async def test_from_env_transports_share_one_store(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """A from_env() transport per job: one store, one thread, one connection, one token."""
    environ = {**live_emulator.environ(), "SERVICE_TOKEN_STORE_URL": redis_server.url}
    for _ in range(20):
        await query(OAuth2Transport.from_env(environ))
    threads = [t for t in threading.enumerate() if t.name == "gql-service-auth-redis"]
    assert len(threads) == 1  # before: one per transport, until the garbage collector ran
    clients = command(redis_server.port, "CLIENT", "LIST").count(b"cmd=")
    assert clients <= 2  # the store's, and the one asking
    assert live_emulator.counters.token_requests == 1


# 7. close() racing a store call.


async def test_closing_the_store_during_a_call_is_quiet(
    live_emulator: Emulator, own_redis: RedisServer
) -> None:
    """A call cut short by close() is no store failure: a direct fetch, and no warning."""
    events: list[AuthEvent] = []
    store = RedisTokenStore.from_url(own_redis.url, timeout=3.0)
    assert await store.load(identity_of(live_emulator)) is None  # connected
    own_redis.pause()
    try:
        closer = threading.Timer(0.3, store.close)
        closer.start()
        await asyncio.wait_for(query(with_store(live_emulator, store, events)), 15)
        closer.join()
    finally:
        own_redis.resume()
    assert [e.name for e in events] == ["token_fetched"]


# 8. A fetch lock without a time to live.


async def test_a_lock_without_a_time_to_live_is_taken_over(
    live_emulator: Emulator, store: RedisTokenStore, redis_server: RedisServer
) -> None:
    """A lock that lost its TTL (a restore, a PERSIST) stalls no fetch, and heals."""
    await query(with_store(live_emulator, store))
    names = [name.decode() for name, _ in redis_server.dump()]
    token_key = next(name for name in names if name.endswith(":token"))
    lock_key = token_key.removesuffix(":token") + ":lock"
    command(redis_server.port, "SET", lock_key, "an-owner-long-gone")  # no PX
    command(redis_server.port, "DEL", token_key)
    events: list[AuthEvent] = []
    # Before: waited out for lock_ttl, then fetched unlocked, and the lock stayed forever.
    await asyncio.wait_for(query(with_store(live_emulator, store, events)), 10)
    assert [e.name for e in events] == ["token_fetched"]
    assert command(redis_server.port, "EXISTS", lock_key) == b":0\r\n"


# Also: the store failure says which Redis and what failed; the cool-down is per store.


async def test_a_store_failure_names_the_redis_and_the_cause_once_per_store(
    live_emulator: Emulator,
) -> None:
    """5 transports, Redis down: one token_store_failed naming host, port and cause."""
    events: list[AuthEvent] = []
    with closed_port() as port:
        url = f"redis://user:store-password-4f1c@127.0.0.1:{port}/2?socket_keepalive=true"
        with RedisTokenStore.from_url(url) as store:
            for _ in range(5):
                await query(with_store(live_emulator, store, events))
    failed = [e for e in events if e.name == "token_store_failed"]
    assert len(failed) == 1  # before: one per transport
    assert failed[0].store == f"redis://127.0.0.1:{port}/2"
    assert failed[0].detail is not None
    assert "connect" in failed[0].detail.lower()
    assert "store-password" not in repr(failed[0])


# Refusals at awkward moments.


async def test_two_revocations_in_a_row_fail_no_query(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """An idle transport takes the stored replacement of its token, which a second
    revocation covered too: one send more for each of its 5 queries, and one fresh fetch."""
    events: list[AuthEvent] = []
    first, idle = with_store(live_emulator, store), with_store(live_emulator, store, events)
    await query(first)
    await query(idle)
    live_emulator.revoke_tokens()
    await query(first)  # renews, and stores the replacement of the shared token
    live_emulator.revoke_tokens()
    del events[:]
    await query(idle, times=5)  # before: UnauthenticatedError after 1 renewal
    assert [e.name for e in events if e.name.startswith("token_")] == [
        "token_rejected",
        "token_loaded",
        "token_rejected",
        "token_fetched",
    ]
    assert live_emulator.counters.token_requests == 3


async def test_a_renewal_under_way_at_a_refusal_does_not_serve_it_an_older_token(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """A renewal ahead of expiry that reads a peer's token from before the revocation does
    not answer the refusal that came meanwhile: the request waits for a fetch after it."""
    live_emulator.token_ttl = 1.0
    events: list[AuthEvent] = []
    transport = with_store(live_emulator, store, events)
    await query(transport)  # a 1 s token, renewed ahead from 0.5 s on
    live_emulator.token_ttl = 60.0
    newer = await token_of_its_own(live_emulator)  # a peer's, stored, not due for renewal
    assert await store.save(identity_of(live_emulator), StoredToken(newer, 60.0, 60.0))
    await asyncio.sleep(0.55)
    live_emulator.revoke_tokens()
    # The query starts the renewal, which reads the peer's token (unless the refusal came
    # first: then it fetches), and is refused meanwhile.
    await query(transport)  # before: UnauthenticatedError after 1 renewal
    assert events[-1].name == "token_fetched"
    assert transport.token is not None
    assert transport.token.value != newer


# Stores that are not quite right.


class MemoryStore:
    """A TokenStore of a user's own, in memory, as the protocol asks."""

    timeout = 0.25
    cooldown = 10.0

    def __init__(self) -> None:
        self.tokens: dict[TokenIdentity, StoredToken] = {}

    async def load(self, identity: TokenIdentity) -> StoredToken | None:
        return self.tokens.get(identity)

    async def save(self, identity: TokenIdentity, token: StoredToken) -> bool:
        self.tokens[identity] = token
        return True

    async def discard(self, identity: TokenIdentity, access_token: str) -> bool:
        return self.tokens.pop(identity, None) is not None

    async def lock(self, identity: TokenIdentity, owner: str, ttl: float) -> str | None:
        return None

    async def unlock(
        self, identity: TokenIdentity, owner: str, failure: str | None = None
    ) -> None:
        return None

    async def failure(self, identity: TokenIdentity, owner: str) -> str | None:
        return None


class OlderStore(MemoryStore):
    """A store written for the earlier protocol: its unlock takes no failure."""

    async def unlock(self, identity: TokenIdentity, owner: str) -> None:  # type: ignore[override]
        return None


async def test_a_store_whose_method_fails_to_be_called_is_a_store_that_failed(
    live_emulator: Emulator,
) -> None:
    """A method with other arguments counts as the store failing: the query succeeds."""
    events: list[AuthEvent] = []
    await query(with_store(live_emulator, OlderStore(), events), times=3)
    assert [e.name for e in events] == ["token_store_failed", "token_fetched"]
    assert events[0].error == "TypeError"
    assert events[0].store == "OlderStore"


def test_a_store_without_failure_is_refused(live_emulator: Emulator) -> None:
    """token_store= needs every method of the protocol, failure() included."""

    class NoFailure(MemoryStore):
        failure = None  # type: ignore[assignment]

    with pytest.raises(ConfigurationError, match=r"has no failure\(\)"):
        with_store(live_emulator, NoFailure())


@pytest.mark.parametrize(
    "url",
    [
        "redis://:pa/ss-word-8c1f@127.0.0.1:1/0",
        "redis://user:pa#ss-word-8c1f@127.0.0.1:1/0",
        "redis://user:ss-word-8c1f@127.0.0.1:notaport/0",
    ],
    ids=["slash", "hash", "bad-port"],
)
def test_a_store_url_redis_cannot_read_is_refused_without_showing_it(url: str) -> None:
    """A password with an unescaped / or #, or a bad port: refused up front, quoted nowhere."""
    with pytest.raises(ConfigurationError) as info:
        RedisTokenStore.from_url(url)
    assert "ss-word" not in str(info.value)
    assert "percent-encode" in str(info.value)


async def test_damaged_values_in_redis_are_as_good_as_absent(
    live_emulator: Emulator, store: RedisTokenStore, redis_server: RedisServer
) -> None:
    """A token hash with a damaged field is replaced by the next fetch, quietly."""
    await query(with_store(live_emulator, store))
    token_key = next(n.decode() for n, _ in redis_server.dump() if n.endswith(b":token"))
    command(redis_server.port, "HSET", token_key, "life", "not-a-number")
    events: list[AuthEvent] = []
    await query(with_store(live_emulator, store, events))
    await query(with_store(live_emulator, store, events))
    assert [e.name for e in events] == ["token_fetched", "token_loaded"]


async def test_unpickled_from_env_transports_share_the_store(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """A from_env() transport sent to a worker by pickle uses that process's one store."""
    environ = {**live_emulator.environ(), "SERVICE_TOKEN_STORE_URL": redis_server.url}
    pickled = pickle.dumps(OAuth2Transport.from_env(environ))
    for _ in range(10):
        await query(pickle.loads(pickled))
    threads = [t for t in threading.enumerate() if t.name == "gql-service-auth-redis"]
    assert len(threads) == 1
    assert live_emulator.counters.token_requests == 1


async def test_the_replacement_of_a_newer_token_serves_a_transport_refused_with_an_older_one(
    live_emulator: Emulator, store: RedisTokenStore
) -> None:
    """Two tokens in use at a revocation: the newer one's replacement serves both."""
    older = with_store(live_emulator, store)
    await query(older)
    # The premise: the peer's token was requested after the older one, by more than the
    # store's estimates of when tokens were requested (from PTTL, read on a thread that a
    # loaded machine schedules late) can be off. A few ms apart, it once was not.
    await asyncio.sleep(0.5)
    peer_token = await token_of_its_own(live_emulator)
    assert await store.save(identity_of(live_emulator), StoredToken(peer_token, 3600.0, 3600.0))
    newer = with_store(live_emulator, store)
    await query(newer)  # reads the peer's newer token
    live_emulator.revoke_tokens()
    await query(newer)  # refused: fetches its replacement
    await query(older)  # refused with the older token: takes the same replacement
    assert live_emulator.counters.token_requests == 3
    assert older.token is not None
    assert newer.token is not None
    assert older.token.value == newer.token.value


def _sent_tokens(emulator: Emulator) -> list[str]:
    return [
        r.headers.get("Authorization", "").removeprefix("Bearer ")
        for r in emulator.requests
        if r.path.endswith("/graphql")
    ]


async def test_a_pause_waited_on_a_manual_clock_never_makes_a_revoked_stored_token_look_newer(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """Refusal times are weighed against stored tokens in real time, whatever clock the
    transport reads its lifetimes and pauses on: a ManualClock advanced by a pause's wait
    does not make a peer's token from before the revocation look newer than it."""
    clock = ManualClock()
    events: list[AuthEvent] = []
    policy = RetryPolicy(wait_initial=1.0, wait_max=1.0, wait_jitter=0)
    refusal = {"errors": [UNAUTHENTICATED_ERROR]}
    with RedisTokenStore.from_url(redis_server.url, timeout=SLOW_MACHINE) as store:
        transport = with_store(
            live_emulator, store, events, clock=clock, retry=policy, max_renewals=1
        )
        async with Client(transport=transport) as session:
            # A fresh token refused, and its renewal answered 503: the renewed token is in
            # hand, and no answer has accepted it.
            live_emulator.fail_graphql_requests(1, 200, body=refusal)
            live_emulator.fail_graphql_requests(1, 503, body={"message": "down"})
            with pytest.raises(TransportServerError):
                await session.execute(COUNT)
            peer = await token_of_its_own(live_emulator)
            assert await store.save(identity_of(live_emulator), StoredToken(peer, 3600.0, 3600.0))
            live_emulator.revoke_tokens()  # the peer's stored token and ours
            live_emulator.reset_counters()
            before = clock()
            await session.execute(COUNT)  # refused: a second fresh refusal, a 1 s pause
            assert clock() - before == pytest.approx(1.0)  # waited on the clock
    assert peer not in _sent_tokens(live_emulator)
    assert live_emulator.counters.graphql_requests == 2


async def test_a_replacement_written_on_a_manual_clock_serves_a_peer_on_real_time(
    live_emulator: Emulator, redis_server: RedisServer
) -> None:
    """How long before its replacement a refused token was requested is stored in real
    seconds, whatever the writer's clock: a peer on real time refused with an older token
    takes the replacement (3 token requests in all, not 4)."""
    clock = ManualClock()
    with RedisTokenStore.from_url(redis_server.url, timeout=SLOW_MACHINE) as store:
        older = with_store(live_emulator, store)
        await query(older)
        # The premise, as in the test above: the peer's token requested after the older
        # one by more than the store's estimates can be off on a loaded machine (in a
        # make test beside other work, a few ms apart, it once was not).
        await asyncio.sleep(0.5)
        peer = await token_of_its_own(live_emulator)
        assert await store.save(identity_of(live_emulator), StoredToken(peer, 3600.0, 3600.0))
        newer = with_store(live_emulator, store, clock=clock)
        await query(newer)  # reads the peer's newer token
        clock.advance(60)  # the test moves its clock on; the 3600 s token stays good
        live_emulator.revoke_tokens()
        await query(newer)  # refused: fetches and stores its replacement
        await query(older)  # refused with the older token: takes that replacement
    assert live_emulator.counters.token_requests == 3
