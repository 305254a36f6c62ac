"""Schema changes that the worker and the coordinator share (no I/O): what a table's Arrow
schema must change to hold data of another schema (:func:`changes`: new fields, Iceberg
widenings, optionality), applying those changes (:func:`apply_changes`), and the encoding of a
worker's proposed schema on the control topic (:func:`to_proposal`, :func:`from_proposal`).

The worker (agents/evolution.py) finds what its batches need and proposes it; the coordinator
(coordinator/evolution.py) merges the proposals and updates the table. Both import this
module; neither imports the other.

Paths name nested fields: ``("customer", "address", "zip")``; a list's element is
``"element"`` (``("items", "element", "qty")``), as in pyiceberg's ``find_field``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import pyarrow as pa
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.types import IcebergType

from icesink.shared.protocol import SchemaProposal

__all__ = [
    "ELEMENT", "MAX_DECIMAL_PRECISION", "AddField", "Change", "MakeOptional", "Path", "Widen", "apply_changes", "changes",
    "find_field", "from_proposal", "holds", "iceberg_type", "identifier_paths", "is_list", "to_proposal",
]

Path: TypeAlias = tuple[str, ...]

ELEMENT = "element"
MAX_DECIMAL_PRECISION = 38  # Iceberg decimals


@dataclass(frozen=True)
class AddField:
    path: Path  # parent path + the new field's name
    type: pa.DataType


@dataclass(frozen=True)
class Widen:
    path: Path
    type: pa.DataType  # int64, float64 or a decimal of higher precision and the same scale


@dataclass(frozen=True)
class MakeOptional:
    path: Path


Change: TypeAlias = AddField | Widen | MakeOptional


# Comparing schemas --------------------------------------------------------------------------


def is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def find_field(struct_fields: Sequence[pa.Field], name: str, ci: bool) -> pa.Field | None:
    for f in struct_fields:
        if f.name == name:
            return f
    if ci:
        low = name.lower()
        for f in struct_fields:
            if f.name.lower() == low:
                return f
    return None


def _widening(base: pa.DataType, want: pa.DataType) -> pa.DataType | None:
    """The type ``base`` must widen to for values of ``want``, if that is an Iceberg promotion."""
    if pa.types.is_integer(base) and pa.types.is_integer(want) and want.bit_width > base.bit_width:
        return pa.int64() if want.bit_width > 32 else pa.int32()
    if pa.types.is_float32(base) and pa.types.is_float64(want):
        return pa.float64()
    if (pa.types.is_decimal(base) and pa.types.is_decimal(want) and want.scale == base.scale
            and want.precision > base.precision):
        return pa.decimal128(want.precision, base.scale)
    return None


def _nullable(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field optional and no field metadata (a new field's type)."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _nullable(f.type)) for f in t])
    if is_list(t):
        return pa.list_(_nullable(t.value_type))
    return t


def changes(
    base: pa.Schema, want: pa.Schema, *, case_insensitive: bool = False,
    keep_required: frozenset[Path] = frozenset(),
) -> list[Change]:
    """What ``base`` must change to hold every value of ``want`` (conflicts are no changes).

    ``keep_required`` lists paths that stay required whatever ``want`` says (identifier fields)."""
    out: list[Change] = []

    def walk(bfields: Sequence[pa.Field], wfields: Sequence[pa.Field], path: Path) -> None:
        seen: set[str] = set()
        for w in wfields:
            key = w.name.lower() if case_insensitive else w.name
            if key in seen:
                continue  # two spellings of one field (case-insensitive): the first decides
            seen.add(key)
            b = find_field(bfields, w.name, case_insensitive)
            if b is None:
                if not (pa.types.is_struct(w.type) and w.type.num_fields == 0):
                    out.append(AddField(path + (w.name,), _nullable(w.type)))
                continue
            here = path + (b.name,)
            if w.nullable and not b.nullable and here not in keep_required:
                out.append(MakeOptional(here))
            field_type(b.type, w.type, here)

    def field_type(bt: pa.DataType, wt: pa.DataType, here: Path) -> None:
        if pa.types.is_struct(bt) and pa.types.is_struct(wt):
            walk(list(bt), list(wt), here)
        elif is_list(bt) and is_list(wt):
            el = here + (ELEMENT,)
            if wt.value_field.nullable and not bt.value_field.nullable and el not in keep_required:
                out.append(MakeOptional(el))
            field_type(bt.value_type, wt.value_type, el)
        elif (wider := _widening(bt, wt)) is not None:
            out.append(Widen(here, wider))

    walk(list(base), list(want), ())
    return out


def holds(base: pa.Schema, data: pa.Schema, *, case_insensitive: bool = False) -> bool:
    """Whether a table of schema ``base`` can take data of schema ``data`` (cast by :func:`conform`)."""
    return not changes(base, data, case_insensitive=case_insensitive)


def apply_changes(schema: pa.Schema, todo: Sequence[Change], *, case_insensitive: bool = False) -> pa.Schema:
    """``schema`` with the changes applied (field metadata kept, new fields appended)."""

    def edit(fields: list[pa.Field], change: Change, depth: int) -> list[pa.Field]:
        path = change.path
        if depth == len(path) - 1 and isinstance(change, AddField):
            return [*fields, pa.field(path[-1], change.type)]
        target = find_field(fields, path[depth], case_insensitive)
        if target is None:
            return fields  # the parent went away: nothing to apply
        i = fields.index(target)
        fields = list(fields)
        fields[i] = edit_field(target, change, depth)
        return fields

    def edit_field(f: pa.Field, change: Change, depth: int) -> pa.Field:
        if depth == len(change.path) - 1:
            if isinstance(change, MakeOptional):
                return f.with_nullable(True)
            assert isinstance(change, Widen)
            return f.with_type(change.type)
        return f.with_type(edit_type(f.type, change, depth + 1))

    def edit_type(t: pa.DataType, change: Change, depth: int) -> pa.DataType:
        if is_list(t) and change.path[depth] == ELEMENT:
            el = t.value_field
            new_el = edit_field(el, change, depth) if depth < len(change.path) else el
            return pa.large_list(new_el) if pa.types.is_large_list(t) else pa.list_(new_el)
        if pa.types.is_struct(t):
            return pa.struct(edit(list(t), change, depth))
        return t

    fields = list(schema)
    for c in todo:
        fields = edit(fields, c, 0)
    return pa.schema(fields, metadata=schema.metadata)


# Proposals: Arrow schema <-> the SchemaProposal encoding (Iceberg schema JSON) --------------


def iceberg_schema(schema: pa.Schema | Schema) -> Schema:
    """Arrow schema without field ids (or an Iceberg schema) -> Iceberg schema with ids 1..n,
    as ``create_table`` converts it (pyiceberg 0.12's ``Catalog._convert_schema_if_needed``, by
    its public parts: the conversion without ids, then ids by name, then numbered afresh)."""
    from pyiceberg.io.pyarrow import pyarrow_to_schema
    from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE, TableProperties
    from pyiceberg.table.name_mapping import MappedField, NameMapping
    from pyiceberg.utils.config import Config

    if isinstance(schema, Schema):
        return assign_fresh_schema_ids(schema)
    ids = itertools.count(1)

    def mapped(name: str, t: pa.DataType) -> MappedField:
        return MappedField(field_id=next(ids), names=[name], fields=children(t))

    def children(t: pa.DataType) -> list[MappedField]:
        if isinstance(t, pa.DictionaryType):
            return children(t.value_type)
        if pa.types.is_struct(t):
            return [mapped(f.name, f.type) for f in t]
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return [mapped("element", t.value_type)]
        if pa.types.is_map(t):
            return [mapped("key", t.key_type), mapped("value", t.item_type)]
        return []

    mapping = NameMapping([mapped(f.name, f.type) for f in schema])
    downcast = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
    return assign_fresh_schema_ids(pyarrow_to_schema(schema, name_mapping=mapping, downcast_ns_timestamp_to_us=downcast,
                                                     format_version=TableProperties.DEFAULT_FORMAT_VERSION))


def _iceberg(schema: pa.Schema) -> Schema:
    return iceberg_schema(pa.schema([pa.field(f.name, _strip(f.type), f.nullable) for f in schema]))


def _strip(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _strip(f.type), f.nullable) for f in t])
    if is_list(t):
        return pa.list_(pa.field("element", _strip(t.value_type), t.value_field.nullable))
    return t


def iceberg_type(t: pa.DataType) -> IcebergType:
    """The Iceberg type of an Arrow type (fresh ids), for ``add_column``/``update_column``."""
    return _iceberg(pa.schema([pa.field("x", t)])).fields[0].field_type


def to_proposal(worker: str, table: str, schema: pa.Schema) -> SchemaProposal:
    body = json.loads(_iceberg(schema).model_dump_json())
    return SchemaProposal(worker, table, json.dumps(body, sort_keys=True, separators=(",", ":")))


def from_proposal(event: SchemaProposal) -> pa.Schema:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(Schema.model_validate_json(event.schema_json))


def identifier_paths(table: Table) -> frozenset[Path]:
    """Identifier fields stay required (Iceberg refuses optional identifier fields)."""
    schema = table.schema()
    paths = []
    for field_id in schema.identifier_field_ids:
        name = schema.find_column_name(field_id)
        assert name is not None, field_id  # pyiceberg checks identifier fields are the schema's
        paths.append(tuple(name.split(".")))
    return frozenset(paths)
