"""A lean stand-in for the service, for overhead runs: it does as little as a server can.

The emulator runs graphql-core on every request, which would hide the transport's own cost.
This server checks the Authorization header's shape, answers canned bytes, and counts.

    python benchmarks/_lean_server.py [--token-latency SECONDS]

It prints its port on the first line, serves on 127.0.0.1 until stdin closes, and answers
GET /stats with its counters.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiohttp import web

ANSWER = b'{"data": {"carriers": {"totalCount": 25}}}'
REFUSED = (
    b'{"data": null, "errors": [{"message": "no", "extensions": {"code": "UNAUTHENTICATED"}}]}'
)


def build(token_latency: float) -> web.Application:
    counters = {"token_requests": 0, "graphql_requests": 0}

    async def graphql(request: web.Request) -> web.Response:
        counters["graphql_requests"] += 1
        await request.read()
        header = request.headers.get("Authorization", "")
        ok = header.startswith(("Bearer lean-", "SERVICE-API-KEY "))
        return web.Response(body=ANSWER if ok else REFUSED, content_type="application/json")

    async def token(request: web.Request) -> web.Response:
        counters["token_requests"] += 1
        await request.post()
        if token_latency:
            await asyncio.sleep(token_latency)
        body = {
            "access_token": f"lean-{counters['token_requests']}",
            "token_type": "Bearer",
            "expires_in": 3600,
        }
        return web.json_response(body)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(counters)

    app = web.Application()
    app.router.add_post("/graphql", graphql)
    app.router.add_post("/oauth2/token", token)
    app.router.add_get("/stats", stats)
    return app


async def serve(token_latency: float) -> None:
    runner = web.AppRunner(build(token_latency), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    # Serve until the parent closes our stdin (or goes away).
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--token-latency", type=float, default=0.0)
    asyncio.run(serve(parser.parse_args().token_latency))
