"""Every GraphQL document the README, the docs and the examples send is one the real
service is known to answer: valid against the contract's schema alone (../SERVICE.md:
``carriers(first:)``, a connection whose edges' nodes have ``id`` and ``name``).

The emulator knows more (``totalCount``, ``carrier(id:)``, mutations, uploads) for the
package's own tests; a reader who copies a block runs it against the service, where those
are unknown. The blocks also run against the emulator (test_readme.py); this checks what
they ask, so that they would run against a server that knows only the contract.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from graphql import GraphQLError, OperationDefinitionNode, build_schema, parse, validate
from test_readme import BLOCKS, ROOT

CONTRACT = build_schema(
    """
    type Query { carriers(first: Int): CarrierConnection }
    type CarrierConnection { edges: [CarrierEdge] }
    type CarrierEdge { node: Carrier }
    type Carrier { id: ID! name: String }
    """
)
"""What the contract says of the schema, and nothing more."""

EMULATOR_ONLY = {
    "examples/paginate_carriers.py": (
        "the emulator's pagination (after, pageInfo): the contract knows first alone, and "
        "getting-started.md says so where it lists the example"
    ),
}
"""Files that show the emulator's own schema on purpose, and why."""

_OPERATION = re.compile(r"^\s*(query|mutation|subscription)\b|^\s*\{", re.S)


def documents(code: str) -> list[str]:
    """The GraphQL documents a block of Python sends: every string that parses as an
    operation (``gql("...")``, ``{"query": ...}``), and the ``query`` of a JSON body."""
    found: list[str] = []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str | bytes):
            continue
        text = node.value.decode() if isinstance(node.value, bytes) else node.value
        if text.lstrip().startswith('{"'):  # a JSON body: its query
            try:
                body = json.loads(text)
            except ValueError:
                continue
            text = body.get("query", "") if isinstance(body, dict) else ""
        if not _OPERATION.match(text):
            continue
        try:
            document = parse(text)
        except GraphQLError:
            continue  # a dict literal's braces, a format string: not GraphQL
        if any(isinstance(d, OperationDefinitionNode) for d in document.definitions):
            found.append(text)
    return found


def _sources() -> list[tuple[str, str]]:
    blocks = [(f"{block.page}:{block.line}", block.code) for block in BLOCKS]
    examples = [
        (path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "examples").glob("*.py"))
    ]
    return blocks + [(name, code) for name, code in examples if name not in EMULATOR_ONLY]


SOURCES = _sources()


def test_the_docs_send_graphql_at_all() -> None:
    """The collector finds the documents: a page losing its queries fails here."""
    assert sum(len(documents(code)) for _, code in SOURCES) >= 40


@pytest.mark.parametrize(("where", "code"), SOURCES, ids=[name for name, _ in SOURCES])
def test_each_query_is_valid_against_the_contract(where: str, code: str) -> None:
    for text in documents(code):
        errors = validate(CONTRACT, parse(text))
        assert not errors, f"{where}: {text!r} is not the contract's: {errors[0].message}"


@pytest.mark.parametrize(
    "text",
    [
        "query ($id: ID!) { carrier(id: $id) { id name } }",
        "query { carriers(first: 1) { totalCount } }",
        "query ($after: String) { carriers(first: 10, after: $after) { edges { node { id } } } }",
        'mutation { renameCarrier(id: "c", name: "n") { id } }',
    ],
)
def test_what_only_the_emulator_knows_is_refused(text: str) -> None:
    """The check can fail: the emulator's extras are not the contract's."""
    assert documents(f"gql({text!r})") == [text]
    assert validate(CONTRACT, parse(text))


def test_the_emulator_only_files_exist() -> None:
    for name in EMULATOR_ONLY:
        assert Path(ROOT, name).is_file(), name
