"""Schema evolution, coordinator side: one schema update per table per round (blocking; run
through Offload).

Workers propose the schema their buffered data needs (``SchemaProposal``). Before it sends a
StartCommit the coordinator, the group's only writer, merges the pending proposals of each
table in log order and applies what the table lacks (new fields, widenings, optionality) in
one ``update_schema`` commit: a metadata-only commit, no snapshot and no data file. Workers
reload the table at the StartCommit and write the data that needed it in that round.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow

from icesink.shared.schema_changes import (
    AddField, Change, MakeOptional, Path, Widen, apply_changes, changes, from_proposal, iceberg_type,
    identifier_paths,
)
from coordinator.requirements import AssertEpoch, validate
from icesink.shared.protocol import SchemaProposal

log = logging.getLogger(__name__)


def merge_proposals(
    base: pa.Schema, proposals: Sequence[SchemaProposal], *, case_insensitive: bool, keep_required: frozenset[Path],
) -> list[Change]:
    """The changes ``base`` needs to hold every proposal, merged in log order (the first
    proposal to add a field decides its type; later conflicting types are no evolution)."""
    merged = base
    for p in proposals:
        want = from_proposal(p)
        todo = changes(merged, want, case_insensitive=case_insensitive, keep_required=keep_required)
        merged = apply_changes(merged, todo, case_insensitive=case_insensitive)
    return changes(base, merged, case_insensitive=case_insensitive, keep_required=keep_required)


def apply_proposals(
    catalog: Catalog,
    table_name: str,
    proposals: Sequence[SchemaProposal],
    *,
    case_insensitive: bool,
    group: str,
    epoch: int,
) -> list[Change]:
    """Apply what ``proposals`` need to the table in one schema update; returns the changes
    (none if the table already holds them). Fenced like a data commit."""
    table = catalog.load_table(table_name)
    validate([AssertEpoch(table_name, epoch)], table, group)  # raises FencedError for an old coordinator
    todo = merge_proposals(
        schema_to_pyarrow(table.schema()), proposals,
        case_insensitive=case_insensitive, keep_required=identifier_paths(table),
    )
    if not todo:
        return []
    with table.update_schema(case_sensitive=not case_insensitive) as update:
        for c in todo:
            match c:
                case AddField():
                    update.add_column(c.path, iceberg_type(c.type), required=False)
                case Widen():
                    update.update_column(c.path, field_type=iceberg_type(c.type))
                case MakeOptional():
                    update.make_column_optional(c.path)
    return todo


def describe_changes(todo: Sequence[Change]) -> str:
    parts = []
    for c in todo:
        name = ".".join(c.path)
        match c:
            case AddField():
                parts.append(f"add {name} {iceberg_type(c.type)}")
            case Widen():
                parts.append(f"widen {name} to {iceberg_type(c.type)}")
            case MakeOptional():
                parts.append(f"make {name} optional")
    return ", ".join(parts)
