"""Figure 17: what a wrong secret costs the token endpoint, and a runaway against the budget.

One process, waves of 20 concurrent queries without pause for ``seconds``, through one
``OAuth2Transport``:

- wrong secret: the token endpoint refuses the credentials (``invalid_client``); the
  issue that asked for the budget measured 163 token requests and 163 WARNING lines in
  10 s before it;
- API refusing every token: each wave's token is refused, renewed once and refused again
  (a runaway renewal loop), against the default ``TokenBudget`` (120 requests a minute).

Counted by the emulator (token requests) and a handler on the package's logger (WARNING
records).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gql import Client, gql

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import Emulator

QUERY = gql("query { carriers(first: 1) { totalCount } }")
WAVE = 20


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


async def _waves(transport: OAuth2Transport, seconds: float) -> tuple[int, int]:
    waves = failed = 0
    until = time.monotonic() + seconds
    async with Client(transport=transport) as session:
        while time.monotonic() < until:
            outcomes = await asyncio.gather(
                *(session.execute(QUERY) for _ in range(WAVE)), return_exceptions=True
            )
            waves += 1
            failed += sum(isinstance(o, BaseException) for o in outcomes)
    return waves, failed


def _case(name: str, seconds: float) -> dict[str, Any]:
    from gql_service_auth._core.budget import LEDGERS

    LEDGERS.clear()
    with Emulator().run_in_thread() as emulator:
        client = emulator.recent_client
        secret = "wrong-secret" if name == "wrong secret" else client.client_secret
        emulator.refuse_all_tokens = name == "API refusing every token"
        transport = OAuth2Transport(
            emulator.graphql_url,
            token_url=emulator.token_url,
            client_id=client.client_id,
            client_secret=secret,
            share_tokens=False,
        )
        handler = _Warnings()
        logger = logging.getLogger("gql_service_auth")
        logger.addHandler(handler)
        try:
            waves, failed = asyncio.run(_waves(transport, seconds))
        finally:
            logger.removeHandler(handler)
        return {
            "seconds": seconds,
            "waves": waves,
            "queries_failed": failed,
            "token_requests": emulator.counters.token_requests,
            "warnings": handler.count,
        }


def figure(seconds: float) -> dict[str, Any]:
    # On a thread of its own: make bench calls it from its event loop, and each case runs
    # its own.
    with ThreadPoolExecutor(1) as pool:
        return {
            name: pool.submit(_case, name, seconds).result()
            for name in ("wrong secret", "API refusing every token")
        }


def print_figure(figures: dict[str, Any]) -> None:
    first = next(iter(figures.values()))
    print(
        f"\n17. What a runaway costs the token endpoint: one process, waves of {WAVE} queries "
        f"for {first['seconds']:g} s (before the budget, a wrong secret cost 163 token "
        "requests and 163 WARNING lines in 10 s)"
    )
    print(f"  {'case':<26} {'waves':>7} {'token requests':>15} {'WARNING lines':>14}")
    for name, row in figures.items():
        print(f"  {name:<26} {row['waves']:>7} {row['token_requests']:>15} {row['warnings']:>14}")
