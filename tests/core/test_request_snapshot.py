"""What a request sends, read off it once (gql_service_auth._stacks.gql.snapshot): no network.

A re-send sends what the call started with, whatever the caller changes meanwhile; leaves
(a FileVar) stay the objects they were, shared parts and cycles keep their shape.
"""

from __future__ import annotations

import sys
from typing import Any

from gql import FileVar, GraphQLRequest, gql

from gql_service_auth._stacks.gql import rebuild, snapshot

QUERY = gql("query ($f: Filter) { carriers(filter: $f) { totalCount } }")


def test_nested_variables_are_copied_and_leaves_kept() -> None:
    file = FileVar("unused.txt")
    shared = {"ids": [1, 2]}
    variables: dict[str, Any] = {"f": {"a": shared, "b": shared, "t": (1, [2])}, "file": file}
    taken = rebuild(snapshot(GraphQLRequest(QUERY, variable_values=variables)))
    variables["f"]["a"]["ids"].append(3)  # the caller changes its own objects afterwards
    variables["f"]["t"][1].append(4)
    sent = taken.variable_values
    assert sent is not None
    assert sent["f"] == {"a": {"ids": [1, 2]}, "b": {"ids": [1, 2]}, "t": (1, [2])}
    assert sent["f"]["a"] is sent["f"]["b"]  # shared once, as in the original
    assert sent["file"] is file


def test_a_cycle_stays_a_cycle_and_nesting_too_deep_is_sent_as_it_is() -> None:
    cyclic: dict[str, Any] = {"id": 1}
    cyclic["self"] = cyclic
    copied = snapshot(GraphQLRequest(QUERY, variable_values=cyclic))[1]
    assert copied is not cyclic
    assert copied["self"] is copied
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(sys.getrecursionlimit() + 10):
        inner["x"] = inner = {}
    assert snapshot(GraphQLRequest(QUERY, variable_values=deep))[1] is deep
