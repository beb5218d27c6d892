"""GraphQL over a websocket (the ``graphql-transport-ws`` protocol) on the emulator's
``/graphql``, for clients that authenticate in ``connection_init``: the token goes as
``{"Authorization": "Bearer ..."}`` in its payload, is checked once, and a refused one
closes the socket with 4403, as servers of that protocol do.

Queries and mutations only: each ``subscribe`` message is answered with one ``next`` and a
``complete``. Beyond the contract (which names no websocket), as a test aid for code that
gives its token to a websocket client (see ``gql_service_auth.TokenProvider``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import WSMsgType, web

PROTOCOL = "graphql-transport-ws"
UNAUTHORIZED = 4403


async def serve(
    request: web.Request,
    authenticate: Callable[[str | None], str | None],
    execute: Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]],
    counted: Callable[[bool], None],
) -> web.WebSocketResponse:
    """One websocket: ``authenticate`` the ``connection_init`` payload's Authorization
    (``None``: accepted), then ``execute`` each operation; ``counted`` hears whether each
    connection was accepted."""
    socket = web.WebSocketResponse(protocols=(PROTOCOL,))
    await socket.prepare(request)
    accepted = False
    async for message in socket:
        if message.type != WSMsgType.TEXT:
            break
        try:
            data = json.loads(message.data)
        except ValueError:
            await socket.close(code=4400, message=b"not JSON")
            break
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "connection_init":
            payload = data.get("payload") if isinstance(data.get("payload"), dict) else {}
            header = payload.get("Authorization") if isinstance(payload, dict) else None
            refusal = authenticate(header if isinstance(header, str) else None)
            counted(refusal is None)
            if refusal is not None:
                await socket.close(code=UNAUTHORIZED, message=b"Forbidden")
                break
            accepted = True
            await socket.send_json({"type": "connection_ack"})
        elif kind == "ping":
            await socket.send_json({"type": "pong"})
        elif kind == "subscribe" and accepted:
            operation = data.get("payload") if isinstance(data.get("payload"), dict) else {}
            result = await execute(operation)
            await socket.send_json({"type": "next", "id": data.get("id"), "payload": result})
            await socket.send_json({"type": "complete", "id": data.get("id")})
        elif kind == "subscribe":
            await socket.close(code=4401, message=b"Unauthorized")
            break
    return socket
