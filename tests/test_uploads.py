"""File uploads (``upload_files=True``) at once: each sends its own file, once, still open."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from gql import Client, FileVar, GraphQLRequest
from support import (
    COUNT,
    STACK_REASONS,
    UPLOAD,
    hold_token_fetch,
    settle,
)

from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import Emulator, ManualClock


@pytest.mark.parametrize("moment", ["cold", "renewal"])
async def test_concurrent_uploads_sharing_a_request_each_send_their_own_file(
    emulator: Emulator,
    clock: ManualClock,
    make_oauth2: Callable[..., OAuth2Transport],
    moment: str,
) -> None:
    """Uploads sharing one request, each with its own file, each upload that file once."""
    shared = GraphQLRequest(UPLOAD)
    sizes = range(1, 11)
    async with Client(transport=make_oauth2()) as session:
        await hold_token_fetch(session, emulator, clock, moment)
        with pytest.warns(DeprecationWarning, match="variable_values"):
            outcomes = await settle(
                *(
                    session.execute(
                        shared,
                        variable_values={
                            "file": FileVar(io.BytesIO(b"x" * size), filename=f"{size}.txt")
                        },
                        upload_files=True,
                    )
                    for size in sizes
                )
            )
    answers = [o["uploadDocument"] if isinstance(o, dict) else type(o).__name__ for o in outcomes]
    assert answers == [{"filename": f"{size}.txt", "size": size} for size in sizes]
    uploaded = sorted(
        (m.arguments["file"].filename, len(m.arguments["file"].data)) for m in emulator.mutations
    )
    assert uploaded == sorted((f"{size}.txt", size) for size in sizes)


@pytest.mark.stacks("aiohttp", reason=STACK_REASONS["kw"])
async def test_concurrent_uploads_on_a_valid_token_do_not_close_each_others_files(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport], tmp_path: Path
) -> None:
    """Uploads of files on disk queued for a connection each send their own, still open, file."""
    files = []
    for size in range(1, 6):
        path = tmp_path / f"{size}.txt"
        path.write_bytes(b"x" * size)
        files.append(FileVar(str(path), content_type="text/plain"))
    # One connection: each upload's file is opened when it is called and sent when the
    # previous upload has finished, as with any connection limit under load.
    transport = make_oauth2(client_session_args={"connector": aiohttp.TCPConnector(limit=1)})
    try:
        async with Client(transport=transport) as session:
            await session.execute(COUNT)
            outcomes = await settle(
                *(
                    session.execute(
                        GraphQLRequest(UPLOAD, variable_values={"file": file}), upload_files=True
                    )
                    for file in files
                )
            )
    finally:
        for file in files:
            if isinstance(file.f, io.IOBase):
                file.f.close()
    answers = [o["uploadDocument"] if isinstance(o, dict) else type(o).__name__ for o in outcomes]
    assert answers == [{"filename": f"{size}.txt", "size": size} for size in range(1, 6)]
    assert emulator.counters.mutations_run == 5
