"""One process of a fleet sharing tokens through a token store: run by the tests as a subprocess.

Its settings come as JSON in the ``FLEET_CONFIG`` environment variable (``redis_url``, or
``store_url`` for any store URL: ``file://`` for a LocalTokenStore, any other form, such as
``rediss://``, ``redis+cluster://`` or ``redis+sentinel://``, for a RedisTokenStore; the
store's ``timeout`` from ``store_timeout``, its ``connect_timeout`` from ``connect_timeout``,
each its default when absent). It connects, says
``ready`` on stdout, then for each line read on stdin (``go``) runs one phase and prints
its outcome as one JSON line: ``concurrency`` queries at once, or, with ``seconds``, that
many workers querying for that long, each waiting ``pause`` seconds between its queries.
It ends at end of input. ``FLEET_LOG=1`` logs its events to stderr.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
import time
from typing import Any

from gql import Client, gql

from gql_service_auth import AuthEvent, OAuth2Transport, RetryPolicy
from gql_service_auth.local import LocalTokenStore
from gql_service_auth.redis import RedisTokenStore

COUNT = gql("query { carriers(first: 1) { totalCount } }")


async def main() -> None:
    config: dict[str, Any] = json.loads(os.environ["FLEET_CONFIG"])
    if os.environ.get("FLEET_LOG"):
        import logging

        logging.basicConfig(
            level=logging.DEBUG, format="%(relativeCreated)6d %(threadName)s %(name)s %(message)s"
        )
        logging.getLogger("gql").setLevel(logging.WARNING)
    events: collections.Counter[str] = collections.Counter()
    store_failures: collections.Counter[str] = collections.Counter()

    def count(event: AuthEvent) -> None:
        events[event.name] += 1
        if event.name == "token_store_failed":  # what failed, in words: no secret in it
            store_failures[f"{event.error}: {event.detail}"] += 1

    # No redis_url (or store_url): each process on its own, as without a store (the
    # benchmark's baseline). A file:// store_url is a LocalTokenStore.
    store: RedisTokenStore | LocalTokenStore | None = None
    url = config.get("store_url") or config.get("redis_url")
    if url:
        opener = (
            LocalTokenStore.from_url if url.startswith("file://") else RedisTokenStore.from_url
        )
        # connect_timeout only when given: a package before it (a benchmark's "before"
        # run) has no such argument.
        bounds = (
            {"connect_timeout": config["connect_timeout"]} if "connect_timeout" in config else {}
        )
        store = opener(
            url,
            cooldown=config.get("cooldown", 10.0),
            timeout=config.get("store_timeout", 0.25),
            **bounds,
        )
    transport = OAuth2Transport(
        config["graphql_url"],
        token_url=config["token_url"],
        client_id=config["client_id"],
        client_secret=config["client_secret"],
        retry=RetryPolicy(timeout=config.get("retry_timeout", 8.0)),
        refresh_margin=config.get("refresh_margin", 60.0),
        token_store=store,
        on_event=count,
    )
    loop = asyncio.get_running_loop()
    async with Client(
        transport=transport, execute_timeout=config.get("execute_timeout", 30)
    ) as session:
        print("ready", flush=True)
        while await loop.run_in_executor(None, sys.stdin.readline):
            latencies: list[float] = []
            failures: list[str] = []

            async def one(
                latencies: list[float] = latencies, failures: list[str] = failures
            ) -> None:
                began = time.monotonic()
                try:
                    await session.execute(COUNT)
                except Exception as exc:
                    failures.append(type(exc).__name__)
                latencies.append(time.monotonic() - began)

            async def back_to_back(until: float, pause: float = config.get("pause", 0.0)) -> None:
                while time.monotonic() < until:
                    await one()
                    await asyncio.sleep(pause)

            if "seconds" in config:
                until = time.monotonic() + config["seconds"]
                await asyncio.gather(*(back_to_back(until) for _ in range(config["concurrency"])))
            else:
                await asyncio.gather(*(one() for _ in range(config["concurrency"])))
            outcome = {
                "queries": len(latencies),
                "failures": failures,
                "slowest": max(latencies, default=0.0),
                "events": dict(events),
                "store_failures": dict(store_failures),
            }
            print(json.dumps(outcome), flush=True)
    if store is not None:
        store.close()


if __name__ == "__main__":
    asyncio.run(main())
