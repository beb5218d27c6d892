"""Renewal ahead of expiry and the shared post arguments, attacked at their boundaries.

Uploads in a failed renewal's backoff, refusals during a renewal, threads, timeouts,
fork, tiny lifetimes, copies and secrets. Through gql's ``Client`` against the emulator,
on the manual clock unless said.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import pickle
import threading
import time
from collections.abc import Callable

import pytest
from gql import Client
from gql.transport.exceptions import TransportConnectionFailed
from support import COUNT, renewed, secrets_shown, upload, wait_until

from gql_service_auth import AuthEvent, OAuth2Transport, TokenRequestError
from gql_service_auth.emulator import Emulator, ManualClock

TTL = 3600.0
MARGIN = 60.0
GUARD = 5.0


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
        emulator.token_latency = 0.3
        await session.execute(COUNT)  # background flight
        emulator.revoke_tokens()
        results = await asyncio.gather(*(session.execute(COUNT) for _ in range(20)))
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


def test_execute_timeout_while_background_renewal_runs(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """An upload waiting on a background renewal is cut by execute_timeout; others go on."""
    transport = make_oauth2()
    client = Client(transport=transport, execute_timeout=0.2)
    on_a_thread(lambda: client.execute(COUNT))
    clock.advance(TTL - MARGIN + 1)
    emulator.token_latency = 1.0
    on_a_thread(lambda: client.execute(COUNT))  # starts it
    # The builtin: gql's execute_timeout raises it, which on 3.10 asyncio's is not.
    with pytest.raises(TimeoutError):
        on_a_thread(lambda: client.execute(upload(b"x"), upload_files=True))
    on_a_thread(lambda: client.execute(COUNT))  # still the current token, at once
    asyncio.run(wait_until(renewed(transport, 2)))
    assert emulator.counters.token_requests == 2


async def test_refresh_margin_zero_and_tiny_default_expires_in(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
) -> None:
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


async def test_shared_args_copies_and_vars_hide_the_token(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    transport = make_oauth2(clock=time.monotonic, on_event=None)  # picklable settings
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        await session.execute(COUNT)  # the fast path builds the shared arguments
    assert transport.token is not None
    value = transport.token.value
    assert transport._shared_args is not None
    assert value not in repr(vars(transport))
    assert value not in repr(transport._shared_args)
    for clone in (
        copy.copy(transport),
        copy.deepcopy(transport),
        pickle.loads(pickle.dumps(transport)),
    ):
        assert getattr(clone, "_shared_args", None) is None
        assert value not in repr(vars(clone))
    with pytest.raises(TypeError):
        copy.copy(transport._shared_args)
    # read-only: a caller cannot mutate what concurrent requests share
    with pytest.raises(TypeError):
        transport._shared_args.args["headers"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        transport._shared_args.args["headers"]["Authorization"] = "x"


async def test_connection_failure_keeps_no_token_in_frame_locals(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """A GraphQL request that fails to connect: no token in any traceback frame's locals."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
    assert transport.token is not None
    value = transport.token.value
    transport.url = "http://127.0.0.1:9/graphql"  # nothing listens
    async with Client(transport=transport) as session:
        with pytest.raises(TransportConnectionFailed) as raised:
            await session.execute(COUNT)
    assert secrets_shown(raised.value, [value], own=__file__) == []


async def test_cancellation_keeps_no_token_in_frame_locals(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        assert transport.token is not None
        value = transport.token.value
        emulator.graphql_latency = 1.0 if hasattr(emulator, "graphql_latency") else 0
        task = asyncio.ensure_future(session.execute(COUNT))
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except BaseException as exc:
            caught: BaseException | None = exc
        else:
            caught = None
    if caught is not None:
        assert secrets_shown(caught, [value], own=__file__) == []


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


async def test_fork_while_a_background_renewal_is_in_flight(
    emulator: Emulator, clock: ManualClock, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The child neither waits on the parent's flight nor is stuck: it renews on its own."""
    from test_runtime_boundaries import _in_child

    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
        clock.advance(TTL - MARGIN + 1)
        emulator.token_latency = 2.0
        await session.execute(COUNT)  # the background renewal is in flight

        def child() -> None:
            loop = asyncio.new_event_loop()
            try:
                started = time.monotonic()
                loop.run_until_complete(_child_query(transport))
                assert time.monotonic() - started < 1.5, "the child waited for a renewal"
                assert transport._tokens._flight is not None  # its own renewal started
            finally:
                loop.close()

        code, how = await asyncio.to_thread(_in_child, child, 20)
    assert (code, how) == (0, "ok")


async def _child_query(transport: OAuth2Transport) -> None:
    async with Client(transport=transport) as session:
        await session.execute(COUNT)
