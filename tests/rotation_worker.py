"""One process of a fleet whose credentials are rotated under it: run by the tests.

Its settings come as JSON in ``ROTATION_CONFIG``: ``graphql_url``, ``token_url``,
``method`` (``api_key`` or ``oauth2``), ``stack`` (``aiohttp``, ``requests``, ``httpx``
or ``httpx-async``), ``source`` (``file``: a :class:`CredentialsFile`; ``callable``: a
function reading the same file), ``path`` (the credentials file), ``check_every``,
``store_url`` (a ``file://`` directory for a LocalTokenStore, or ``null``), ``status``
(a file it rewrites after each query) and ``stop`` (a file whose existence ends it).

It queries without pause, one query at a time, and records in its status the queries
answered and failed, and whether a query sent with the new credentials was answered
(``switched``): one begun after ``credentials_changed`` was logged (an API key), or after
a token was fetched or loaded since (OAuth2).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from gql import Client, gql

from gql_service_auth import CredentialsFile, RetryPolicy
from gql_service_auth.local import LocalTokenStore

COUNT = gql("query { carriers(first: 1) { totalCount } }")
DEADLINE = 120.0
"""Seconds the worker runs at most, whatever happens."""


class Status(logging.Handler):
    """The worker's record, kept from the package's log records and its queries."""

    def __init__(self, method: str) -> None:
        super().__init__(logging.DEBUG)
        self.method = method
        #: 1 once new credentials were read; 2 once they are in use (an API key at once,
        #: OAuth2 with a token fetched or loaded since).
        self.phase = 0
        self.values: dict[str, Any] = {"ok": 0, "failed": 0, "errors": [], "switched": False}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "credentials_changed" in message:
            self.phase = 2 if self.method == "api_key" else 1
        elif self.phase == 1 and ("token_fetched" in message or "token_loaded" in message):
            # Logged just before the token is handed over: in use by the next query begun.
            self.landed = True

    landed = False

    def answered(self, phase: int) -> None:
        """A query begun in ``phase`` was answered: switched, if the new credentials were
        in use before it went."""
        self.values["ok"] += 1
        if phase == 2 and not self.values["switched"]:
            self.values["switched"] = True
            self.values["switched_at"] = time.time()  # wall clock: compared across processes
        if self.landed:
            self.phase = 2


def transport_of(config: dict[str, Any]) -> Any:
    path = Path(config["path"])
    source: Any = CredentialsFile(path, check_every=config["check_every"])
    if config["source"] == "callable":
        file = source

        def read() -> tuple[str, str]:
            return file.read()  # type: ignore[no-any-return]

        from gql_service_auth import CredentialsCallback

        source = CredentialsCallback(read, check_every=config["check_every"])
    stack, method = config["stack"], config["method"]
    if stack == "aiohttp":
        from gql_service_auth import ApiKeyTransport, OAuth2Transport

        api_key, oauth2 = ApiKeyTransport, OAuth2Transport
    elif stack == "requests":
        from gql_service_auth.requests import ApiKeyRequestsTransport, OAuth2RequestsTransport

        api_key, oauth2 = ApiKeyRequestsTransport, OAuth2RequestsTransport  # type: ignore[assignment]
    elif stack == "httpx":
        from gql_service_auth.httpx import ApiKeyHTTPXTransport, OAuth2HTTPXTransport

        api_key, oauth2 = ApiKeyHTTPXTransport, OAuth2HTTPXTransport  # type: ignore[assignment]
    else:
        from gql_service_auth.httpx import ApiKeyHTTPXAsyncTransport, OAuth2HTTPXAsyncTransport

        api_key, oauth2 = ApiKeyHTTPXAsyncTransport, OAuth2HTTPXAsyncTransport  # type: ignore[assignment]
    if method == "api_key":
        return api_key(config["graphql_url"], credentials=source)
    store = LocalTokenStore.from_url(config["store_url"]) if config.get("store_url") else None
    return oauth2(
        config["graphql_url"],
        token_url=config["token_url"],
        credentials=source,
        token_store=store,
        retry=RetryPolicy(timeout=10.0),
    )


def main() -> None:
    config: dict[str, Any] = json.loads(os.environ["ROTATION_CONFIG"])
    status = Status(config["method"])
    logger = logging.getLogger("gql_service_auth")
    logger.addHandler(status)
    logger.setLevel(logging.DEBUG)
    if os.environ.get("ROT_LOG"):
        logging.basicConfig(level=logging.DEBUG, format="%(relativeCreated)6d %(message)s")
    transport = transport_of(config)
    stop, out = Path(config["stop"]), Path(config["status"])
    asynchronous = config["stack"] in ("aiohttp", "httpx-async")
    deadline = time.monotonic() + DEADLINE

    def stopped() -> bool:  # a stat per query: the queries are what is measured
        return stop.exists() or time.monotonic() > deadline

    def record(failed: BaseException | None, phase: int) -> None:
        if failed is None:
            status.answered(phase)
        else:
            if status.landed:
                status.phase = 2
            status.values["failed"] += 1
            status.values["errors"].append(f"{type(failed).__name__}: {failed}"[:300])
        temporary = out.with_suffix(".tmp")
        temporary.write_text(json.dumps(status.values))
        os.replace(temporary, out)

    if asynchronous:

        async def run() -> None:
            async with Client(transport=transport) as session:
                while not stopped():
                    phase = status.phase
                    try:
                        await session.execute(COUNT)
                    except Exception as exc:
                        record(exc, phase)
                    else:
                        record(None, phase)

        asyncio.run(run())
    else:
        with Client(transport=transport) as session:
            while not stopped():
                phase = status.phase
                try:
                    session.execute(COUNT)
                except Exception as exc:
                    record(exc, phase)
                else:
                    record(None, phase)


if __name__ == "__main__":
    main()
