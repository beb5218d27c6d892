"""The emulator's GraphQL schema: the contract's ``carriers`` connection, and a little more.

The real schema is unknown beyond ``carriers(first: ...)``; the rest (``after``,
``pageInfo``, a mutation, an upload) exists so that gql's features can be exercised.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Protocol

from graphql import GraphQLError, GraphQLResolveInfo, GraphQLSchema, build_schema

SDL = """
\"\"\"A file sent with the GraphQL multipart request specification.\"\"\"
scalar Upload

type Carrier {
  id: ID!
  name: String!
}

type CarrierEdge {
  cursor: String!
  node: Carrier!
}

type PageInfo {
  hasNextPage: Boolean!
  endCursor: String
}

type CarrierConnection {
  edges: [CarrierEdge!]!
  pageInfo: PageInfo!
  totalCount: Int!
}

type UploadResult {
  filename: String
  contentType: String
  size: Int!
}

type Query {
  \"\"\"Carriers, a page at a time: pass the last endCursor as after.\"\"\"
  carriers(first: Int = 10, after: String): CarrierConnection!
  carrier(id: ID!): Carrier
}

type Mutation {
  renameCarrier(id: ID!, name: String!): Carrier!
  uploadDocument(file: Upload!): UploadResult!
}
"""

MAX_PAGE = 100

_Info = GraphQLResolveInfo[Any]

_PREFIXES = ("Atlas", "Borealis", "Cobalt", "Delta", "Ember", "Fjord", "Granite", "Harbor")
_SUFFIXES = ("Freight", "Logistics", "Cargo", "Express", "Shipping")


def seed_carriers(count: int) -> list[dict[str, str]]:
    """``count`` carriers with stable ids and names."""
    return [
        {
            "id": f"carrier-{index:03d}",
            "name": f"{_PREFIXES[index % len(_PREFIXES)]} "
            f"{_SUFFIXES[index // len(_PREFIXES) % len(_SUFFIXES)]} {index:03d}",
        }
        for index in range(1, count + 1)
    ]


@dataclass(frozen=True, slots=True)
class UploadedFile:
    """A file part of a multipart request, as the ``Upload`` scalar receives it."""

    filename: str | None
    content_type: str | None
    data: bytes


class SchemaState(Protocol):
    """What the resolvers read and change: the emulator's data and counters."""

    carriers: list[dict[str, str]]

    def record_mutation(self, field: str, arguments: dict[str, Any]) -> None: ...

    def take_field_refusal(self) -> bool: ...


def _cursor(index: int) -> str:
    return base64.urlsafe_b64encode(f"carrier:{index}".encode()).decode()


def _index(cursor: str) -> int:
    try:
        kind, _, number = base64.urlsafe_b64decode(cursor.encode()).decode().partition(":")
        if kind != "carrier":
            raise ValueError(kind)
        return int(number)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GraphQLError(f"invalid cursor {cursor!r}") from exc


def _state(info: _Info) -> SchemaState:
    state: SchemaState = info.context["state"]
    return state


def _refuse_if_asked(info: _Info) -> None:
    # Raised from inside the resolver, after whatever it changed: graphql-core gives the
    # error a path, and the non-null root field turns the whole answer into data: null.
    if _state(info).take_field_refusal():
        raise GraphQLError(
            "access token expired during execution", extensions={"code": "UNAUTHENTICATED"}
        )


def _carriers(_: object, info: _Info, first: int = 10, after: str | None = None) -> Any:
    if first < 0 or first > MAX_PAGE:
        raise GraphQLError(f"first must be between 0 and {MAX_PAGE}")
    _refuse_if_asked(info)
    carriers = _state(info).carriers
    start = _index(after) + 1 if after else 0
    page = carriers[start : start + first]
    edges = [{"cursor": _cursor(start + offset), "node": node} for offset, node in enumerate(page)]
    return {
        "edges": edges,
        "pageInfo": {
            "hasNextPage": start + len(page) < len(carriers),
            "endCursor": edges[-1]["cursor"] if edges else None,
        },
        "totalCount": len(carriers),
    }


def _carrier(_: object, info: _Info, id: str) -> Any:
    _refuse_if_asked(info)
    return next((c for c in _state(info).carriers if c["id"] == id), None)


def _rename(_: object, info: _Info, id: str, name: str) -> Any:
    state = _state(info)
    carrier = next((c for c in state.carriers if c["id"] == id), None)
    if carrier is None:
        raise GraphQLError(f"no carrier with id {id!r}")
    state.record_mutation("renameCarrier", {"id": id, "name": name})
    carrier["name"] = name
    _refuse_if_asked(info)
    return carrier


def _upload(_: object, info: _Info, file: object) -> Any:
    if not isinstance(file, UploadedFile):
        raise GraphQLError("file must be sent as a multipart upload")
    _state(info).record_mutation("uploadDocument", {"file": file})
    _refuse_if_asked(info)
    return {"filename": file.filename, "contentType": file.content_type, "size": len(file.data)}


def build() -> GraphQLSchema:
    """The schema with its resolvers attached."""
    schema = build_schema(SDL)
    assert schema.query_type is not None
    assert schema.mutation_type is not None
    schema.query_type.fields["carriers"].resolve = _carriers
    schema.query_type.fields["carrier"].resolve = _carrier
    schema.mutation_type.fields["renameCarrier"].resolve = _rename
    schema.mutation_type.fields["uploadDocument"].resolve = _upload
    return schema
