"""An event loop on a thread of its own, for work that must not run on a caller's loop.

gql's blocking ``Client.execute`` runs each call on a loop of its own and abandons it on
``execute_timeout``; a fork leaves the child without the parent's threads. State bound to
an event loop (a ``redis.asyncio`` client) therefore lives on a loop that belongs to no
caller: callers on any loop or thread submit coroutines to it and await the outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class LoopClosed(RuntimeError):
    """A call on a loop thread that is closing or closed."""


class LoopThread:
    """An event loop on a daemon thread, started on first use, shut down once.

    Args:
        name: The thread's name.
        on_shut: Run on the loop when it shuts down, after the calls under way were
            cancelled: closes what lives on the loop (a client and its sockets).
    """

    def __init__(self, name: str, on_shut: Callable[[], Awaitable[None]]) -> None:
        self._name = name
        self._on_shut = on_shut
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.closing = False
        # Orders submit() and shut(): a call is either submitted before shut() begins,
        # and so ends (in an error) before the loop stops, or refused; never cancelled
        # before it starts, by a loop stopping under it.
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"<LoopThread {self._name} running={self._loop is not None}>"

    def submit(self, call: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Run ``call`` on the loop, starting it on first use.

        Raises:
            LoopClosed: the loop thread is closing or closed.
        """
        with self._guard:
            if self.closing:
                call.close()
                raise LoopClosed(f"{self._name} is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=_serve, args=(loop,), name=self._name, daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return asyncio.run_coroutine_threadsafe(call, self._loop)

    def shut(self) -> None:
        """Cancel the calls under way, run ``on_shut``, stop the loop; about 2 s at most.

        From then on, calls are refused. Safe from any thread, the loop's own included.
        """
        with self._guard:
            self.closing = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return

        async def wind_down() -> None:
            # Calls under way first (they end in an error, so their callers go on without
            # them): one still connecting would open a socket after on_shut closed them.
            others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in others:
                task.cancel()
            if others:
                await asyncio.wait(others, timeout=0.5)
            await self._on_shut()

        if threading.current_thread() is thread:
            # Shut on its own thread (a last reference dropped there): nothing may wait
            # for this thread, so the loop stops once wind_down is done.
            loop.create_task(wind_down()).add_done_callback(lambda _: loop.stop())
            return
        future = asyncio.run_coroutine_threadsafe(wind_down(), loop)
        try:
            future.result(timeout=1.0)
        except (concurrent.futures.TimeoutError, Exception):
            future.cancel()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=1.0)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        close_own_loop(loop)


def close_own_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on a stopped loop of a thread's own, wait a little, close it.

    Bounded: tasks get a second to end, and the default executor is not waited for.
    """
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()  # shuts the default executor down without waiting for it
