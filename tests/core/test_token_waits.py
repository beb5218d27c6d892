"""The token manager's waits: blocking threads and coroutines share one fetch, and a clock
that moves only when told takes over a re-send's wait (no network)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from unittest import mock

import pytest

from gql_service_auth import TokenRequestError
from gql_service_auth._core.token import AccessToken, TokenResponse, waits_on
from gql_service_auth._core.tokens import TokenManager
from gql_service_auth.emulator import ManualClock


class Fetcher:
    """A token endpoint stand-in: counts fetches; each takes ``delay`` seconds."""

    def __init__(self, delay: float = 0.2, *, fail: bool = False) -> None:
        self.delay = delay
        self.fail = fail
        self.calls = 0
        self.lock = threading.Lock()

    async def __call__(self) -> TokenResponse:
        with self.lock:
            self.calls += 1
            number = self.calls
        await asyncio.sleep(self.delay)
        if self.fail:
            raise TokenRequestError("endpoint down", retryable=True)
        return TokenResponse(f"token-{number}", expires_in=3600)


def manager(fetch: Fetcher, fetch_timeout: float = 5.0) -> TokenManager:
    return TokenManager(
        fetch, refresh_margin=60.0, default_expires_in=3600.0, fetch_timeout=fetch_timeout
    )


def in_threads(calls: list[Callable[[], object]]) -> list[object]:
    """What each call returned or raised, each call on a thread of its own, all at once."""
    results: list[object] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except BaseException as exc:  # the test reads it
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    return results


def values(results: list[object]) -> set[str]:
    return {r.value if isinstance(r, AccessToken) else repr(r) for r in results}


def test_blocking_callers_on_many_threads_share_one_fetch() -> None:
    fetch = Fetcher()
    tokens = manager(fetch)
    results = in_threads([tokens.get_blocking] * 8)
    assert fetch.calls == 1
    assert values(results) == {"token-1"}


def test_threads_and_coroutines_share_one_fetch() -> None:
    fetch = Fetcher(delay=0.3)
    tokens = manager(fetch)

    def on_a_loop() -> AccessToken:
        return asyncio.run(tokens.get())

    results = in_threads([tokens.get_blocking] * 3 + [on_a_loop] * 2)
    assert fetch.calls == 1
    assert values(results) == {"token-1"}


def test_a_failed_fetch_reaches_every_blocking_caller_as_its_own_error() -> None:
    tokens = manager(Fetcher(fail=True))
    errors = in_threads([tokens.get_blocking] * 4)
    assert all(isinstance(e, TokenRequestError) for e in errors)
    assert len({id(e) for e in errors}) == 4  # no chain of one shows in another's


def test_a_blocking_caller_after_a_refusal_waits_for_a_newer_token() -> None:
    fetch = Fetcher(delay=0.0)
    tokens = manager(fetch)
    first = tokens.get_blocking()
    assert tokens.invalidate(first)
    second = tokens.get_blocking(after=first.generation)
    assert second.generation > first.generation
    assert fetch.calls == 2


def test_a_blocking_wait_is_bounded_by_the_fetch_deadline() -> None:
    tokens = manager(Fetcher(delay=30.0), fetch_timeout=0.3)
    with pytest.raises(TokenRequestError, match=r"no token from .* within 0\.3 s"):
        tokens.get_blocking()


def test_a_blocking_callers_error_chain_holds_nothing_of_another_thread() -> None:
    """Each thread raises its own copy, outside any except: no other thread's context."""
    tokens = manager(Fetcher(delay=0.3, fail=True))
    go = threading.Barrier(2)

    def while_handling_a_secret() -> object:
        go.wait()
        try:
            raise ValueError("thread A's own error: hunter2")
        except ValueError:
            return tokens.get_blocking()

    def plainly() -> object:
        go.wait()
        return tokens.get_blocking()

    first, second = in_threads([while_handling_a_secret, plainly])
    assert isinstance(first, TokenRequestError)
    assert isinstance(second, TokenRequestError)
    chain, link = [], second
    while link is not None and len(chain) < 10:
        chain.append(link)
        link = link.__cause__ or link.__context__
    assert not any("hunter2" in str(e) for e in chain)


def test_a_blocking_caller_keeps_the_cause_of_a_fetch_that_broke() -> None:
    async def broken() -> TokenResponse:
        raise ZeroDivisionError("a bug in the fetcher")

    tokens = TokenManager(broken, refresh_margin=60.0, default_expires_in=3600.0, fetch_timeout=5)
    with pytest.raises(TokenRequestError, match="ZeroDivisionError") as info:
        tokens.get_blocking()
    assert isinstance(info.value.__cause__, ZeroDivisionError)


async def test_a_blocking_wait_on_a_loop_thread_without_threads_fails_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No thread for the fetch, and a loop running here: an error, never a stuck loop."""

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    tokens = manager(Fetcher(delay=0.0))
    with pytest.raises(TokenRequestError, match="this thread runs an event loop"):
        tokens.get_blocking()
    assert (await tokens.get()).value == "token-1"  # on the loop, it fetches for itself


def test_a_clock_takes_over_waits_only_with_a_wait_its_class_defines() -> None:
    """waits_on: a ManualClock advances by a wait (and not for a wait of 0, which only
    yields); a spy, an async ``wait`` or an ``advance`` alone keep the real sleep."""
    slept: list[float] = []

    manual = ManualClock(start=0.0)
    wait = waits_on(manual, slept.append)
    wait(0.0)
    wait(1.5)
    assert (manual(), slept) == (1.5, [0, 0])

    class AsyncWait:
        def __call__(self) -> float:
            return 0.0

        async def wait(self, seconds: float) -> None:
            raise AssertionError("never called")

    class AdvanceOnly:
        def __call__(self) -> float:
            return 0.0

        def advance(self, seconds: float) -> None:
            raise AssertionError("never called")

    spy = mock.Mock(side_effect=time.monotonic)
    for clock in (spy, AsyncWait(), AdvanceOnly()):
        slept.clear()
        waits_on(clock, slept.append)(0.3)
        assert slept == [0.3]
    assert not spy.wait.called


class StoreThenEndpoint:
    """A shared level stand-in: hands out, in turn, a fetched token, a token read from the
    store (with where it came from), then fetched ones; counts what the endpoint served."""

    shared = True

    def __init__(self) -> None:
        self.handed = 0
        self.fetched = 0

    async def obtain(self, fetch: object, **context: object) -> tuple[TokenResponse, object]:
        from gql_service_auth._core.provenance import Origin

        self.handed += 1
        if self.handed == 2:
            # A peer's replacement, requested now: newer than the refusal behind it.
            return TokenResponse("from-the-store", expires_in=3600), Origin(time.monotonic(), None)
        self.fetched += 1
        return TokenResponse(f"fetched-{self.fetched}", expires_in=3600), None


async def test_a_late_request_shares_the_fetch_after_a_refused_token_from_the_store() -> None:
    """Requests refused with one token share one renewal, and once that renewal is refused
    too a late one is told it is spent. A token read from the store is no renewal of this
    process's: its refusal leaves the late request the fetch that follows (a race seen
    under load: five queries after two revocations, one answered late)."""
    source = StoreThenEndpoint()
    tokens = TokenManager(
        Fetcher(delay=0),
        refresh_margin=60.0,
        default_expires_in=3600.0,
        fetch_timeout=5.0,
        source=source,  # type: ignore[arg-type]
    )
    first = await tokens.get()
    assert tokens.invalidate(first)  # the first refusal, by one request
    replacement = await tokens.get(after=first.generation)
    assert replacement.value == "from-the-store"
    assert tokens.invalidate(replacement)  # that request's re-send refused too
    # Another request refused with the first token, whose answer came only now.
    late = await tokens.get(after=first.generation)
    assert late.value == "fetched-2"
    assert source.fetched == 2


async def test_a_late_request_is_spent_once_a_fetched_renewal_was_refused() -> None:
    """The same wave, with the renewal fetched here: the late request is told it is spent,
    rather than each late request fetching one more (what stampedes a provider)."""
    from gql_service_auth._core.ledger import RenewalSpent

    tokens = manager(Fetcher(delay=0))
    first = await tokens.get()
    assert tokens.invalidate(first)
    renewal = await tokens.get(after=first.generation)
    assert tokens.invalidate(renewal)
    assert await tokens.get(after=first.generation) == RenewalSpent()


class AlwaysFromTheStore:
    """A store that keeps handing out peers' tokens (each refused in turn): a fleet whose
    revocations keep covering what the others stored."""

    shared = True

    def __init__(self) -> None:
        self.handed = 0

    async def obtain(self, fetch: object, **context: object) -> tuple[TokenResponse, object]:
        from gql_service_auth._core.provenance import Origin

        self.handed += 1
        if self.handed == 1:
            return TokenResponse("fetched", expires_in=3600), None
        return TokenResponse(f"stored-{self.handed}", expires_in=3600), Origin(
            time.monotonic(), None
        )


async def test_late_requests_after_refused_store_tokens_cost_one_more_read_at_most() -> None:
    """However many late requests a wave has, a refused token read from the store buys it
    one more take-off, not one per request: then the wave is spent."""
    from gql_service_auth._core.ledger import RenewalSpent

    source = AlwaysFromTheStore()
    tokens = TokenManager(
        Fetcher(delay=0),
        refresh_margin=60.0,
        default_expires_in=3600.0,
        fetch_timeout=5.0,
        source=source,  # type: ignore[arg-type]
    )
    first = await tokens.get()
    assert tokens.invalidate(first)
    spent = 0
    for _ in range(20):  # late requests refused with the first token, one after another
        token = await tokens.get(after=first.generation)
        if isinstance(token, RenewalSpent):
            spent += 1
        else:
            tokens.invalidate(token)  # the peer's token is refused too
    assert source.handed == 3  # the first token, the wave's renewal, one more
    assert spent == 18
