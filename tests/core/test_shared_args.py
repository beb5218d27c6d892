"""The post arguments requests share per credential (gql_service_auth._stacks.aiohttp.SharedArgs).

A unit test of a private piece: nothing public shows it. Requests in flight read it
concurrently, so its header must be read-only, never copied, and hidden. The dict around
the header is a plain one that only the transport's ``_post`` reads (gql copies it into
each request's arguments): a read-only proxy there cost 0.2 µs per request.
"""

from __future__ import annotations

import copy
import pickle

import pytest

from gql_service_auth._stacks.aiohttp import SharedArgs


def test_shared_args_hide_the_header_refuse_copies_and_keep_the_header_read_only() -> None:
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
        shared.args["headers"]["Authorization"] = "x"
