"""Figure 1's instruction counts: what each transport executes per request, every stack.

A machine's load moves times, never the instructions a request executes. Each contender
runs in a process of its own under valgrind's cachegrind (no cache simulation: it counts
the instructions), with no network: gql's transport of the stack and ours, each given a
canned answer where the stack's I/O would be (aiohttp: a stand-in session that merges the
headers as aiohttp does; requests: an adapter; httpx: its ``MockTransport``), and OAuth2's
token fetched once from a canned endpoint. Two runs per contender, of ``n`` and of no
requests after the same warm-up: their difference over ``n`` is the instructions of one
request, start-up and imports left out. ``PYTHONHASHSEED`` is fixed, so the count repeats
to a few hundred instructions a request.

The baseline is gql's transport sending the same ``Authorization`` with each request, as
ours do (a token changes). Run as a script, it is one such process:
``python _instructions.py <stack> <contender> <n>``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

STACKS = ("aiohttp", "requests", "httpx", "httpx async")
CONTENDERS = ("gql, header per request", "API key", "OAuth2")
URL = "http://127.0.0.1:9/graphql"  # never reached: every answer is canned
TOKEN_URL = "http://127.0.0.1:9/oauth2/token"
HEADER = {"Authorization": "Bearer lean-fixed"}
BODY = json.dumps({"data": {"carriers": {"totalCount": 25}}}).encode()
WARM_UP = 50


def _canned_token(transport: Any) -> None:
    """The OAuth2 contender's token, from a canned endpoint."""
    from gql_service_auth._core.token import TokenResponse

    async def fetch() -> TokenResponse:
        return TokenResponse("lean-1", expires_in=3600)

    tokens = transport._tokens if hasattr(transport, "_tokens") else transport._rules.tokens
    tokens._fetch = fetch


# -- aiohttp ---------------------------------------------------------------------------


class _CannedResponse:
    status = 200
    headers: ClassVar[dict[str, str]] = {"Content-Type": "application/json"}
    history = ()

    async def json(self, **_: Any) -> Any:
        return json.loads(BODY)

    async def text(self, **_: Any) -> str:
        return BODY.decode()

    async def __aenter__(self) -> _CannedResponse:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None


class _CannedSession:
    """A stand-in for aiohttp's session: merges the request's headers with the session's
    defaults, as aiohttp does before any I/O, and answers at once."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def post(self, *_: Any, headers: Any = None, **__: Any) -> _CannedResponse:
        self._session._prepare_headers(headers)
        return _CannedResponse()


async def _aiohttp(contender: str, n: int) -> None:
    from gql.graphql_request import GraphQLRequest
    from gql.transport.aiohttp import AIOHTTPTransport

    from gql_service_auth import ApiKeyTransport, OAuth2Transport

    class HeaderPerRequest(AIOHTTPTransport):
        def _prepare_request(
            self, request: Any, extra_args: Any = None, upload: bool = False
        ) -> Any:
            return super()._prepare_request(request, {"headers": HEADER}, upload)

    transport: Any
    if contender == "API key":
        transport = ApiKeyTransport(URL, client_id="bench", client_secret="secret")
    elif contender == "OAuth2":
        transport = OAuth2Transport(
            URL, token_url=TOKEN_URL, client_id="bench", client_secret="secret", share_tokens=False
        )
        _canned_token(transport)
    else:
        transport = HeaderPerRequest(URL)
    await transport.connect()
    real = transport.session
    transport.session = _CannedSession(real)
    request = GraphQLRequest("query { carriers(first: 1) { totalCount } }")
    for _ in range(WARM_UP + n):
        await transport.execute(request)


# -- requests and httpx ----------------------------------------------------------------


def _requests_transport(contender: str) -> tuple[Any, dict[str, Any]]:
    import requests
    from gql.transport.requests import RequestsHTTPTransport

    from gql_service_auth.requests import ApiKeyRequestsTransport, OAuth2RequestsTransport

    class Canned(requests.adapters.BaseAdapter):
        def send(self, request: Any, **_: Any) -> Any:
            response = requests.Response()
            response.status_code = 200
            response._content = BODY
            response.headers["Content-Type"] = "application/json"
            response.encoding = "utf-8"
            response.request = request
            response.url = request.url
            return response

        def close(self) -> None:
            pass

    transport: Any
    if contender == "API key":
        transport = ApiKeyRequestsTransport(URL, client_id="bench", client_secret="secret")
    elif contender == "OAuth2":
        transport = OAuth2RequestsTransport(
            URL, token_url=TOKEN_URL, client_id="bench", client_secret="secret", share_tokens=False
        )
        _canned_token(transport)
    else:
        transport = RequestsHTTPTransport(URL)
    transport.connect()
    transport.session.mount("http://", Canned())
    return transport, ({"headers": HEADER} if contender == CONTENDERS[0] else {})


def _httpx_transport(contender: str, asynchronous: bool) -> tuple[Any, dict[str, Any]]:
    from gql.transport import httpx as gql_httpx

    from gql_service_auth import httpx as ours

    mock = gql_httpx.httpx.MockTransport(
        lambda request: gql_httpx.httpx.Response(
            200, content=BODY, headers={"Content-Type": "application/json"}
        )
    )
    credentials = {"client_id": "bench", "client_secret": "secret", "transport": mock}
    transport: Any
    if contender == "API key":
        kind = ours.ApiKeyHTTPXAsyncTransport if asynchronous else ours.ApiKeyHTTPXTransport
        transport = kind(URL, **credentials)
    elif contender == "OAuth2":
        kind = ours.OAuth2HTTPXAsyncTransport if asynchronous else ours.OAuth2HTTPXTransport
        transport = kind(URL, token_url=TOKEN_URL, share_tokens=False, **credentials)
        _canned_token(transport)
    else:
        kind = gql_httpx.HTTPXAsyncTransport if asynchronous else gql_httpx.HTTPXTransport
        transport = kind(URL, transport=mock)
    return transport, ({"headers": HEADER} if contender == CONTENDERS[0] else {})


def run(stack: str, contender: str, n: int) -> None:
    """One process's work: the warm-up, then ``n`` requests."""
    from gql.graphql_request import GraphQLRequest

    request = GraphQLRequest("query { carriers(first: 1) { totalCount } }")
    if stack == "aiohttp":
        asyncio.run(_aiohttp(contender, n))
    elif stack == "httpx async":
        transport, extra = _httpx_transport(contender, asynchronous=True)

        async def calls() -> None:
            await transport.connect()
            for _ in range(WARM_UP + n):
                await transport.execute(request, extra_args=extra)

        asyncio.run(calls())
    else:
        transport, extra = (
            _requests_transport(contender)
            if stack == "requests"
            else _httpx_transport(contender, asynchronous=False)
        )
        if stack == "httpx":
            transport.connect()
        for _ in range(WARM_UP + n):
            transport.execute(request, extra_args=extra)


# -- the figure ------------------------------------------------------------------------

_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def _instructions(stack: str, contender: str, n: int) -> int:
    command = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        __file__,
        stack,
        contender,
        str(n),
    ]
    env = dict(os.environ, PYTHONHASHSEED="0")
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, check=True
    )
    found = _REFS.search(done.stderr)
    assert found is not None, done.stderr[-2000:]
    return int(found.group(1).replace(",", ""))


def figure(n: int, stacks: tuple[str, ...] = STACKS) -> dict[str, Any]:
    """Instructions per request of each contender, each stack; two processes at a time."""
    if shutil.which("valgrind") is None:
        return {"skipped": "valgrind is not installed"}
    runs = [(s, c, count) for s in stacks for c in CONTENDERS for count in (0, n)]
    with ThreadPoolExecutor(2) as pool:
        counted = dict(zip(runs, pool.map(lambda run: _instructions(*run), runs), strict=True))
    figures: dict[str, Any] = {"requests_counted": n}
    for stack in stacks:
        per_request = {
            contender: (counted[(stack, contender, n)] - counted[(stack, contender, 0)]) / n
            for contender in CONTENDERS
        }
        base = per_request[CONTENDERS[0]]
        figures[stack] = {
            contender: {
                "instructions_per_request": round(value),
                "ratio": round(base / value, 3),
            }
            for contender, value in per_request.items()
        }
    return figures


def print_figure(rows: dict[str, Any]) -> None:
    print(
        "   instructions per request, no network (valgrind's cachegrind; ratio against gql's "
        "transport sending the header with each request; goal >= 0.99):"
    )
    if "skipped" in rows:
        print(f"     not counted: {rows['skipped']}")
        return
    for stack in STACKS:
        if stack not in rows:
            continue
        cells = "; ".join(
            f"{name} {row['instructions_per_request'] / 1000:.1f}k"
            + ("" if name == CONTENDERS[0] else f" (ratio {row['ratio']:.3f})")
            for name, row in rows[stack].items()
        )
        print(f"     {stack:<12} {cells}")


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    os._exit(0)  # no interpreter shut-down in the count
