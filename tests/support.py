"""Queries and helpers shared by the tests."""

from __future__ import annotations

import asyncio
import io
import time
import traceback
from collections.abc import Callable, Iterator

from gql import FileVar, GraphQLRequest, gql

CARRIERS = gql("query { carriers(first: 10) { edges { node { id name } } } }")
"""The contract's authentication check query."""

COUNT = gql("query { carriers(first: 1) { totalCount } }")

RENAME = gql('mutation { renameCarrier(id: "carrier-001", name: "Renamed") { id name } }')

UPLOAD = gql("mutation ($file: Upload!) { uploadDocument(file: $file) { filename size } }")

UNAUTHENTICATED_ERROR = {"message": "expired", "extensions": {"code": "UNAUTHENTICATED"}}


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Yield to the loop until ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


def upload(data: bytes) -> GraphQLRequest:
    """The upload mutation with ``data`` as its file (send with ``upload_files=True``)."""
    file = FileVar(io.BytesIO(data), filename="note.txt", content_type="text/plain")
    return GraphQLRequest(UPLOAD, variable_values={"file": file})


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or during, each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def exception_texts(exc: BaseException) -> list[str]:
    """All a person or a crash reporter could see of ``exc``: traceback, str, repr, attributes."""
    texts = ["".join(traceback.format_exception(exc))]
    for link in exception_chain(exc):
        texts += [str(link), repr(link), repr(vars(link))]
    return texts
