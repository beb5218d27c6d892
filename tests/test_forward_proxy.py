"""A forward proxy reads the CONNECT request in clear text: no credential may be in it.

An ``https://`` API through an ``http://`` proxy: aiohttp asks the proxy for a tunnel with a
``CONNECT`` request whose headers it builds from the session's default headers. The
credential must go inside the tunnel only, with each request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from gql import Client
from gql.transport.exceptions import TransportConnectionFailed
from support import COUNT, STACK_REASONS

from gql_service_auth import ApiKeyTransport, OAuth2Transport
from gql_service_auth.emulator import Emulator


class RecordingProxy:
    """Records each request head it is sent, and answers 502: no tunnel is ever made."""

    def __init__(self) -> None:
        self.heads: list[str] = []
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            self.heads.append(head.decode("latin-1"))
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[RecordingProxy]:
    recording = RecordingProxy()
    server = await asyncio.start_server(recording.handle, "127.0.0.1", 0)
    recording.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield recording
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["kw"])
@pytest.mark.parametrize("kind", ["api_key", "oauth2"])
async def test_the_proxy_sees_no_credential_in_the_connect_request(
    emulator: Emulator,
    proxy: RecordingProxy,
    kind: str,
    make_oauth2: Callable[..., OAuth2Transport],
) -> None:
    # The API behind the proxy is never reached (the proxy answers 502); the token comes
    # from the emulator directly (token_session_args={}).
    options = {"client_session_args": {"proxy": proxy.url}}
    transport: ApiKeyTransport | OAuth2Transport
    if kind == "api_key":
        transport = ApiKeyTransport(
            "https://127.0.0.1:9/graphql",
            client_id=emulator.recent_client.client_id,
            client_secret=emulator.recent_client.client_secret,
            **options,
        )
    else:
        transport = make_oauth2(
            url="https://127.0.0.1:9/graphql", token_session_args={}, **options
        )
    async with Client(transport=transport) as session:
        for _ in range(3):  # the first request, then the fast path with a cached credential
            with pytest.raises(TransportConnectionFailed, match="502"):
                await session.execute(COUNT)
    assert len(proxy.heads) == 3
    assert all(head.startswith("CONNECT 127.0.0.1:9 ") for head in proxy.heads)
    secrets = [emulator.recent_client.client_secret]
    if isinstance(transport, OAuth2Transport):
        assert transport.token is not None
        secrets.append(transport.token.value)
    for head in proxy.heads:
        assert not any(secret in head for secret in secrets), head.split("\r\n", 1)[0]
        assert "authorization:" not in head.lower()
