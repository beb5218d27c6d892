"""Renewal ahead of expiry: no query waits for a renewal while a usable token exists.

Through gql's ``Client`` against the emulator, on the manual clock: the token's times are
moved by ``clock.advance``, and the token endpoint's latency (real time) keeps a renewal in
flight while the queries run.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable

import pytest
from gql import Client
from support import (
    COUNT,
    HANG_GUARD,
    STACK_REASONS,
    execute_on_threads,
    quiet,
    renewed,
    upload,
    wait_until,
)

from gql_service_auth import (
    AuthEvent,
    OAuth2Transport,
    TokenRequestError,
)
from gql_service_auth.emulator import Emulator, ManualClock

TTL = 3600.0  # the emulator's default token lifetime
MARGIN = 60.0  # the transport's default refresh_margin
GUARD = 5.0  # EXPIRY_GUARD: a token is not sent in its last 5 s


def sent_tokens(emulator: Emulator) -> list[str]:
    """The Authorization header of every GraphQL request, in order."""
    return [r.headers.get("Authorization", "") for r in emulator.requests if r.path == "/graphql"]


async def test_queries_past_renew_at_use_the_current_token_while_one_renewal_runs(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
) -> None:
    """Past renew_at, 100 concurrent queries all go out at once with the current token.

    One renewal starts in the background; they do not wait for it, and the queries after
    it lands carry the new token.
    """
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        assert transport.token is not None
        first = transport.token.authorization
        clock.advance(TTL - MARGIN + 1)
        emulator.freeze_token_endpoint(HANG_GUARD)  # the renewal held throughout the queries
        try:
            await asyncio.gather(*(session.execute(COUNT) for _ in range(100)))
            # All 100 were answered while the renewal was still waiting for its answer.
            assert transport.token.generation == 1
            assert sent_tokens(emulator) == [first] * 101
        finally:
            emulator.freeze_token_endpoint(0)
        await wait_until(renewed(transport, 2))
        await session.execute(COUNT)
    assert transport.token.authorization != first
    assert sent_tokens(emulator)[-1] == transport.token.authorization
    assert emulator.counters.token_requests == 2
    assert [e.reason for e in events if e.name == "token_fetched"] == ["initial", "expiring"]


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["upload"])
async def test_an_upload_past_renew_at_waits_for_the_renewal_under_way(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """An upload needs more lifetime than is left past renew_at: it joins the one renewal."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        clock.advance(TTL - MARGIN + 1)
        emulator.token_latency = 0.2
        await session.execute(COUNT)  # starts the background renewal
        await session.execute(upload(b"note"), upload_files=True)
        assert transport.token is not None
        assert transport.token.generation == 2
        assert sent_tokens(emulator)[-1] == transport.token.authorization
    assert emulator.counters.token_requests == 2


async def test_a_failed_renewal_keeps_the_token_until_it_expires(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
) -> None:
    """The token endpoint is down past renew_at: every query succeeds with the current token.

    Each failed renewal says how long the token has left and when the next is tried; none
    is tried sooner. Only once the token is no longer usable does a query wait for a fetch,
    and fail with the token endpoint's error.
    """
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        # Three background renewals and one foreground fetch, of 4 attempts each.
        emulator.fail_token_requests(16, 503)
        clock.advance(TTL - MARGIN + 1)
        await session.execute(COUNT)
        await wait_until(lambda: any(e.name == "token_renewal_failed" for e in events))
        failed = [e for e in events if e.name == "token_renewal_failed"]
        assert len(failed) == 1
        assert failed[0].expires_in == pytest.approx(MARGIN - 1)
        assert failed[0].attempt == 1
        assert failed[0].status == 503
        assert failed[0].wait == 5.0  # the first backoff
        requests = emulator.counters.token_requests
        for _ in range(20):  # within the backoff: no renewal, no failure
            await session.execute(COUNT)
        assert emulator.counters.token_requests == requests
        clock.advance(5.0)
        await session.execute(COUNT)  # the next renewal starts, and fails too
        await wait_until(lambda: len([e for e in events if e.name == "token_renewal_failed"]) == 2)
        failed = [e for e in events if e.name == "token_renewal_failed"]
        assert failed[1].attempt == 2
        assert failed[1].wait == 10.0
        assert failed[1].expires_in == pytest.approx(MARGIN - 6)
        assert not any(e.name == "token_request_failed" for e in events)
        # Tried again before the token is no longer usable, 5 s before expiry.
        clock.advance(MARGIN - 6 - GUARD - 0.5)
        await session.execute(COUNT)
        await wait_until(lambda: len([e for e in events if e.name == "token_renewal_failed"]) == 3)
        failed = [e for e in events if e.name == "token_renewal_failed"]
        assert failed[2].expires_in == pytest.approx(GUARD + 0.5)
        assert failed[2].wait == 1.0  # RENEWAL_RETRY_MIN
        # No longer usable: a query waits for a fetch, and fails with the endpoint's error.
        clock.advance(1.0)
        with pytest.raises(TokenRequestError) as raised:
            await session.execute(COUNT)
        assert raised.value.status == 503
        assert [e.reason for e in events if e.name == "token_request_failed"] == ["expired"]
        assert emulator.counters.token_requests == 1 + 16
        await session.execute(COUNT)
    assert transport.token is not None
    assert transport.token.generation == 2
    queries = emulator.counters.graphql_requests
    assert queries == 1 + 1 + 20 + 1 + 1 + 1  # the failing query sent nothing


async def test_renewal_failures_are_logged_with_the_seconds_left(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One WARNING per failed renewal, readable without configuration."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        emulator.fail_token_requests(4, 503)
        clock.advance(TTL - MARGIN + 1)
        await session.execute(COUNT)
        await wait_until(lambda: "token_renewal_failed" in caplog.text)
    (record,) = [r for r in caplog.records if "token_renewal_failed" in r.getMessage()]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "status=503" in message
    assert "wait=5.000" in message
    assert "expires_in=59" in message
    assert "attempt=1" in message


async def test_a_token_is_not_sent_in_its_last_seconds(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
) -> None:
    """Without a refresh margin, a token is used until 5 s before expiry, then renewed first."""
    transport = make_oauth2(refresh_margin=0)
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        assert transport.token is not None
        assert transport.token.usable_until == transport.token.expires_at - GUARD
        first = transport.token.authorization
        clock.advance(TTL - GUARD - 0.5)
        await session.execute(COUNT)
        assert emulator.counters.token_requests == 1
        clock.advance(1.0)  # 4.5 s before expiry
        await session.execute(COUNT)
    assert emulator.counters.token_requests == 2
    assert sent_tokens(emulator) == [first, first, transport.token.authorization]
    assert transport.token.authorization != first
    assert [e.reason for e in events if e.name == "token_fetched"] == ["initial", "expired"]


async def test_the_guard_is_a_tenth_of_a_short_lifetime(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A 4 s token is usable until 0.4 s before expiry, not cut short by 5 s."""
    emulator.token_ttl = 4
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
    assert transport.token is not None
    assert transport.token.renew_at == pytest.approx(transport.token.obtained_at + 2)
    assert transport.token.usable_until == pytest.approx(transport.token.expires_at - 0.4)


def test_sync_callers_get_the_renewal_their_call_started(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """gql's sync execute closes its loop after each call; the renewal lives on.

    The call that passes renew_at returns at once; its loop is gone when the renewal
    lands, and the next call uses the new token. Nothing is left pending on any loop.
    """
    transport = make_oauth2()
    assert execute_on_threads(transport) == []
    assert transport.token is not None
    first = transport.token.authorization
    clock.advance(TTL - MARGIN + 1)
    emulator.freeze_token_endpoint(HANG_GUARD)  # the renewal held until the call is back
    try:
        assert execute_on_threads(transport) == []  # back before the renewal lands; loop closed
        assert transport.token.generation == 1
    finally:
        emulator.freeze_token_endpoint(0)
    asyncio.run(wait_until(renewed(transport, 2)))
    assert execute_on_threads(transport) == []
    gc.collect()
    assert sent_tokens(emulator) == [first, first, transport.token.authorization]
    assert emulator.counters.token_requests == 2
    assert "Task was destroyed" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
async def test_close_leaves_nothing_behind_while_a_renewal_runs(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """Closing mid-renewal leaves no task or session on the loop; the fetch ends on its own.

    The renewal is the token manager's, not the loop's: it lands for the next connection
    (as gql's sync execute connects and closes on every call), and its thread ends.
    """
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        clock.advance(TTL - MARGIN + 1)
        emulator.token_latency = 0.3
        await session.execute(COUNT)
    assert transport.session is None
    assert asyncio.all_tasks() == {asyncio.current_task()}
    await wait_until(renewed(transport, 2))
    await wait_until(
        lambda: not any(t.name == "gql-service-auth-token" for t in threading.enumerate())
    )
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
    assert emulator.counters.token_requests == 2


def test_a_program_that_exits_mid_renewal_exits_cleanly(emulator: Emulator) -> None:
    """Ending a program while a renewal waits for the token endpoint prints nothing."""
    client = emulator.recent_client
    program = textwrap.dedent(
        f"""
        import asyncio, warnings
        from gql import Client, gql
        from gql_service_auth import OAuth2Transport
        from gql_service_auth.emulator import ManualClock

        warnings.simplefilter("error")
        transport = OAuth2Transport(
            {emulator.graphql_url!r},
            token_url={emulator.token_url!r},
            client_id={client.client_id!r},
            client_secret={client.client_secret!r},
            clock=(clock := ManualClock()),
        )
        query = gql("{{ carriers(first: 1) {{ totalCount }} }}")

        async def main():
            async with Client(transport=transport) as session:
                await session.execute(query)
                clock.advance(3600 - 60 + 1)  # past renew_at: the next query renews ahead
                await session.execute(query)

        asyncio.run(main())
        print("done", flush=True)
        """
    )
    emulator.token_latency = 3.0  # the renewal is still waiting when the program ends
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    assert quiet(done.stderr) == ""  # dev mode's notes of slow steps are the machine's


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["upload"])
async def test_an_upload_goes_out_with_the_current_token_when_renewal_fails(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
) -> None:
    """The token endpoint is down past renew_at: uploads are sent with the token in use.

    The first waits for the renewal and, when it fails, goes with the current token; the
    next, within the backoff, fetches nothing. Past usable_until, one waits and fails.
    """
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        assert transport.token is not None
        first = transport.token.authorization
        emulator.fail_token_requests(8, 503)  # two fetches of 4 attempts
        clock.advance(TTL - MARGIN + 1)
        await session.execute(upload(b"one"), upload_files=True)
        await session.execute(upload(b"two"), upload_files=True)
        assert emulator.counters.token_requests == 1 + 4
        assert sent_tokens(emulator) == [first] * 3
        renewals = [e for e in events if e.name == "token_renewal_failed"]
        assert [(e.attempt, e.wait) for e in renewals] == [(1, 5.0)]
        clock.advance(MARGIN - GUARD)  # no longer usable
        with pytest.raises(TokenRequestError):
            await session.execute(upload(b"three"), upload_files=True)
    assert emulator.counters.token_requests == 1 + 8
    assert [e.reason for e in events if e.name == "token_request_failed"] == ["expired"]


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["loops"])
def test_threads_past_renew_at_share_one_background_renewal(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """8 threads' blocking calls past renew_at all go out at once; one renewal for them all."""
    transport = make_oauth2()
    assert execute_on_threads(transport) == []
    clock.advance(TTL - MARGIN + 1)
    emulator.freeze_token_endpoint(HANG_GUARD)  # the renewal held until all 8 are back
    try:
        assert execute_on_threads(transport, 8) == []
        assert transport.token is not None
        first = transport.token.authorization
        assert sent_tokens(emulator) == [first] * 9
    finally:
        emulator.freeze_token_endpoint(0)
    asyncio.run(wait_until(renewed(transport, 2)))
    assert emulator.counters.token_requests == 2


async def test_tokens_shorter_than_their_fetch_cost_one_fetch_at_a_time(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """0.3 s tokens that take 0.2 s to fetch: renewals back to back, never two at once.

    Each lands past its renew_at, so the next query renews again at once; queries in the
    gap past usable_until wait for it. No query fails and the fetches stay bounded.
    """
    emulator.token_ttl = 0.3
    emulator.token_latency = 0.2
    transport = make_oauth2(clock=time.monotonic)
    async with Client(transport=transport) as session:
        deadline = time.monotonic() + 1.5
        failed = 0

        async def loop() -> None:
            nonlocal failed
            for _ in range(10_000):  # bounded; the deadline ends it first
                if time.monotonic() >= deadline:
                    return
                try:
                    await session.execute(COUNT)
                except Exception:
                    failed += 1

        await asyncio.gather(*(loop() for _ in range(10)))
    assert failed == 0
    # One fetch at a time, each at least 0.2 s: at most 1.5 / 0.2 + 1 of them.
    assert emulator.counters.token_requests <= 8


async def test_an_outage_at_renew_at_holds_the_renewal_not_the_queries(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A hung token endpoint past renew_at: queries go on with the current token.

    The one renewal is held by the outage while they run, and lands once it ends.
    """
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        assert transport.token is not None
        first = transport.token.authorization
        emulator.freeze_token_endpoint(600)
        clock.advance(TTL - MARGIN + 1)
        await session.execute(COUNT)  # starts the renewal, which the outage holds
        await wait_until(lambda: emulator.counters.token_requests == 2)
        await asyncio.gather(*(session.execute(COUNT) for _ in range(20)))
        assert transport.token.generation == 1
        assert sent_tokens(emulator) == [first] * 22
        emulator.freeze_token_endpoint(0)
        await wait_until(renewed(transport, 2))
        await session.execute(COUNT)
    assert sent_tokens(emulator)[-1] == transport.token.authorization != first
    assert emulator.counters.token_requests == 2


def on_a_thread(call: Callable[[], object]) -> None:
    """Run ``call`` on a new thread with a loop of its own, closed afterwards."""
    errors: list[BaseException] = []

    def target() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            call()
        except BaseException as exc:  # re-raised below
            errors.append(exc)
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(20)
    if errors:
        raise errors[0]


def named(events: list[AuthEvent], name: str) -> list[AuthEvent]:
    return [e for e in events if e.name == name]


async def test_uploads_within_the_renewal_backoff_fetch_nothing(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
) -> None:
    """After a failed renewal, ten uploads within its backoff go with the token in use.

    An upload wishes for refresh_margin of lifetime, which is no longer left; while the
    failed renewal backs off, it gets what every request gets, and starts no fetch of its
    own against a token endpoint that is down.
    """
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        emulator.fail_token_requests(1000, 503)
        clock.advance(TTL - MARGIN + 1)
        await session.execute(COUNT)  # starts the background renewal, which fails
        await wait_until(lambda: bool(named(events, "token_renewal_failed")))
        before = emulator.counters.token_requests
        for _ in range(10):  # all within the 5 s backoff: the clock does not move
            await session.execute(upload(b"note"), upload_files=True)
        assert emulator.counters.token_requests == before
    assert len(emulator.mutations) == 10
    assert not named(events, "token_request_failed")


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["upload"])
async def test_an_upload_waiting_on_a_failed_renewal_is_sent_and_no_request_fails(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
) -> None:
    """An upload joins the background renewal; it fails; the upload goes with the token.

    So the one event, ``token_renewal_failed``, is true to its word: a renewal failed and
    no request did.
    """
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        clock.advance(TTL - MARGIN + 1)
        emulator.token_latency = 0.3
        emulator.fail_token_requests(4, 503)
        await session.execute(COUNT)  # background renewal in flight
        result = await session.execute(upload(b"note"), upload_files=True)
    assert result["uploadDocument"]["size"] == 4
    assert len(named(events, "token_renewal_failed")) == 1
    assert not named(events, "token_request_failed")


@pytest.mark.stacks("aiohttp", "httpx", reason=STACK_REASONS["inflight"])
async def test_refusal_during_background_renewal_joins_it(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
) -> None:
    """The token is revoked while its background renewal runs: re-sends join that flight."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        clock.advance(TTL - MARGIN + 1)
        emulator.freeze_token_endpoint(HANG_GUARD)  # held until all 20 were refused
        try:
            await session.execute(COUNT)  # background flight
            emulator.revoke_tokens()
            queries = asyncio.gather(*(session.execute(COUNT) for _ in range(20)))
            await wait_until(lambda: emulator.counters.unauthenticated_responses == 20)
        finally:
            emulator.freeze_token_endpoint(0)
        results = await queries
    assert len(results) == 20
    assert emulator.counters.token_requests == 2
    assert transport.token is not None
    assert transport.token.generation == 2


async def test_refusal_then_background_failure_then_foreground(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
) -> None:
    """Refused while the background renewal runs and that renewal fails: bounded, then ok."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        clock.advance(TTL - MARGIN + 1)
        emulator.token_latency = 0.3
        emulator.fail_token_requests(4, 503)
        await session.execute(COUNT)
        emulator.revoke_tokens()
        outcomes = await asyncio.gather(
            *(session.execute(COUNT) for _ in range(10)), return_exceptions=True
        )
        assert all(isinstance(o, TokenRequestError) for o in outcomes), outcomes
        emulator.token_latency = 0.0
        await session.execute(COUNT)
    assert emulator.counters.token_requests == 1 + 4 + 1


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["upload"])
def test_execute_timeout_while_background_renewal_runs(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """An upload waiting on a background renewal is cut by execute_timeout; others go on."""
    transport = make_oauth2()
    client = Client(transport=transport, execute_timeout=3)
    on_a_thread(lambda: client.execute(COUNT))
    clock.advance(TTL - MARGIN + 1)
    # The renewal is held until the test lets it go: whatever waits for it times out,
    # whatever does not answers, however slow the machine.
    emulator.freeze_token_endpoint(120)
    try:
        on_a_thread(lambda: client.execute(COUNT))  # starts it
        # The builtin: gql's execute_timeout raises it, which on 3.10 asyncio's is not.
        with pytest.raises(TimeoutError):
            on_a_thread(lambda: client.execute(upload(b"x"), upload_files=True))
        on_a_thread(lambda: client.execute(COUNT))  # still the current token, no wait
    finally:
        emulator.freeze_token_endpoint(0)
    asyncio.run(wait_until(renewed(transport, 2)))
    assert emulator.counters.token_requests == 2


async def test_refresh_margin_zero_and_tiny_default_expires_in(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
) -> None:
    """refresh_margin=0 and a 1 s default lifetime: renewed at the guard, once, not before."""
    emulator.advertised_ttl = 0  # ignored: the default lifetime applies
    transport = make_oauth2(refresh_margin=0, default_expires_in=1)
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        token = transport.token
        assert token is not None
        assert token.usable_until == pytest.approx(token.expires_at - 0.1)
        assert token.renew_at == token.usable_until
        clock.advance(0.85)
        await session.execute(COUNT)
        assert emulator.counters.token_requests == 1
        clock.advance(0.1)
        await session.execute(COUNT)
    assert emulator.counters.token_requests == 2


def test_renewal_failed_event_logged_once_per_failure(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    events: list[AuthEvent],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hook that raises on the fetch's thread: the renewal still lands its outcome."""
    seen: list[AuthEvent] = []

    def hook(event: AuthEvent) -> None:
        seen.append(event)
        raise RuntimeError("hook bug")

    transport = make_oauth2(on_event=hook)
    client = Client(transport=transport)
    on_a_thread(lambda: client.execute(COUNT))
    clock.advance(TTL - MARGIN + 1)
    emulator.fail_token_requests(4, 503)
    on_a_thread(lambda: client.execute(COUNT))
    asyncio.run(wait_until(lambda: any(e.name == "token_renewal_failed" for e in seen)))
    assert len([e for e in seen if e.name == "token_renewal_failed"]) == 1
    clock.advance(5.0)
    on_a_thread(lambda: client.execute(COUNT))
    asyncio.run(wait_until(renewed(transport, 2)))
    assert not any(
        r.levelno >= logging.ERROR and "hook_failed" not in r.getMessage() for r in caplog.records
    )
