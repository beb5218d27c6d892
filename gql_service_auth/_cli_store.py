"""``gql-service-auth store``: try a token store URL end to end, as the transports use it.

Each step is a call of the :class:`~gql_service_auth.TokenStore` protocol on an identity
of its own, made up for the check (a random client id and secret), so that nothing of a
real identity is read or written, and nothing is left behind but a lock that expires:

1. ``connect``: the set-up (connection, TLS, AUTH, a cluster's slots, the scripts
   loaded; for a directory, opening SQLite), then a read;
2. ``lock`` and ``save``: the writes a fetching process makes;
3. ``load``: the token read back and opened (sealed with keys from the made-up secret);
4. ``discard`` and ``unlock``: the clean-up, by the same compare-and-delete a refused
   token gets.

A failing step says why, in the words a ``token_store_failed`` event would use, the
cause and fix included when known (a cluster node named by ``redis://``, a TLS
certificate, an ACL command missing).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._core.constants import ENV_TOKEN_STORE_URL
from ._core.settings import store_from_env
from ._stores.protocol import StoredToken, StoreFault, StoreTimeout, TokenIdentity, TokenStore


@dataclass
class StoreStep:
    name: str
    ok: bool
    latency_ms: float
    detail: str = ""


@dataclass
class StoreReport:
    location: str = ""
    ok: bool = False
    steps: list[StoreStep] = field(default_factory=list)


def open_store(url: str, environ: Mapping[str, str]) -> TokenStore:
    """The store ``url`` names, with the bounds the environment sets (as ``from_env()``).

    Raises:
        ConfigurationError: not a store URL, or a bound that is no number of seconds.
    """
    store = store_from_env({**environ, ENV_TOKEN_STORE_URL: url})
    assert store is not None  # the URL is not empty: argparse and the caller see to it
    return store


async def check_store(store: TokenStore) -> StoreReport:
    """Run the steps (module docstring) on ``store``; the first that fails ends the check."""
    report = StoreReport(location=str(getattr(store, "location", type(store).__name__)))
    # Several made-up identities for the first read: their keys fall in different slots,
    # so that a cluster node named by a plain redis:// URL answers MOVED for some.
    probes = [
        TokenIdentity(
            token_url="urn:gql-service-auth:store-check",
            client_id=f"store-check-{secrets.token_hex(8)}",
            client_secret=secrets.token_urlsafe(32),
        )
        for _ in range(_PROBES)
    ]
    probe = probes[0]
    owner = secrets.token_hex(16)
    value = f"store-check-{secrets.token_urlsafe(16)}"
    steps: list[tuple[str, Callable[[], Awaitable[Any]], Callable[[Any], str | None]]] = [
        ("connect", lambda: _load_each(store, probes), _expect(None, "a token was found")),
        ("lock", lambda: store.lock(probe, owner, 10.0), _expect(None, "the lock was held")),
        ("save", lambda: store.save(probe, StoredToken(value, 30.0, 30.0)), _expect(True)),
        ("load", lambda: store.load(probe), _same_token(value)),
        ("discard", lambda: store.discard(probe, value), _expect(True)),
        ("unlock", lambda: store.unlock(probe, owner), _expect(None)),
    ]
    connect_timeout = getattr(store, "connect_timeout", 0.0)
    for name, call, judge in steps:
        started = time.perf_counter()
        try:
            answer = await asyncio.wait_for(call(), store.timeout + connect_timeout + 1.0)
        except StoreTimeout as exc:  # says which bound ran out
            report.steps.append(StoreStep(name, False, _ms_since(started), str(exc)))
            return report
        except asyncio.TimeoutError:
            report.steps.append(StoreStep(name, False, _ms_since(started), "no answer"))
            return report
        except Exception as exc:
            error = exc.error if isinstance(exc, StoreFault) else type(exc).__name__
            detail = f"{error}: {str(exc)[:400]}"
            report.steps.append(StoreStep(name, False, _ms_since(started), detail))
            return report
        wrong = judge(answer)
        report.steps.append(StoreStep(name, wrong is None, _ms_since(started), wrong or ""))
        if wrong is not None:
            return report
    report.ok = True
    return report


_PROBES = 16
"""Identities the first read uses: with 3 nodes, all in one node's slots once in 14 million."""


async def _load_each(store: TokenStore, probes: list[TokenIdentity]) -> StoredToken | None:
    found = None
    for identity in probes:
        found = found or await store.load(identity)
    return found


def _expect(expected: object, meaning: str = "") -> Callable[[Any], str | None]:
    def judge(answer: Any) -> str | None:
        if answer == expected:
            return None
        return meaning or f"answered {answer!r}, not {expected!r}"

    return judge


def _same_token(value: str) -> Callable[[Any], str | None]:
    def judge(answer: Any) -> str | None:
        if isinstance(answer, StoredToken) and answer.access_token == value:
            return None
        if answer is None:
            return "the token saved was not found (another database, or a replica?)"
        return "the token read back differs from the token saved"

    return judge


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def print_store_report(report: StoreReport, out: Any) -> None:
    print(f"token store {report.location}", file=out)
    for step in report.steps:
        outcome = "ok" if step.ok else "FAILED"
        print(f"  {step.name:<8} {outcome:<6} {step.latency_ms:>8.1f} ms  {step.detail}", file=out)
    if report.ok:
        print("\nthe store works: processes with the same credentials share tokens", file=out)
