"""The post arguments requests share per credential (gql_service_auth._aiohttp.SharedArgs).

A unit test of a private piece: nothing public shows it. Requests in flight read it
concurrently, so it must be read-only all the way down, never copied, and hide its header.
"""

from __future__ import annotations

import copy
import pickle

import pytest

from gql_service_auth._aiohttp import SharedArgs


def test_shared_args_hide_the_header_refuse_copies_and_are_read_only() -> None:
    source = object()
    shared = SharedArgs(source, "Bearer secret-token")
    assert shared.source is source
    assert "secret-token" not in repr(shared)
    assert shared.args["headers"]["Authorization"] == "Bearer secret-token"
    with pytest.raises(TypeError):
        copy.copy(shared)
    with pytest.raises(TypeError):
        pickle.dumps(shared)
    with pytest.raises(TypeError):
        shared.args["headers"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        shared.args["headers"]["Authorization"] = "x"
