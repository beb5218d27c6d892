"""Load loops shared by the benchmark and the soak: bounded in count and in time."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def query_until(session: Any, query: Any, deadline: float, workers: int) -> tuple[int, int]:
    """Run ``workers`` loops of ``query`` until ``time.monotonic()`` passes ``deadline``.

    Returns:
        ``(ok, failed)``: how many queries succeeded and how many raised.
    """
    ok = failed = 0

    async def worker() -> None:
        nonlocal ok, failed
        for _ in range(10_000_000):  # bounded; the deadline ends it first
            if time.monotonic() >= deadline:
                return
            try:
                await session.execute(query)
                ok += 1
            except Exception:
                failed += 1

    await asyncio.gather(*(worker() for _ in range(workers)))
    return ok, failed
