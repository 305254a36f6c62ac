"""Schema evolution, worker side (no I/O): find what a batch needs that the table lacks, decode
the batch so that nothing is lost, and cast buffered data to the table's schema at write time.

With ``iceberg.tables.evolve-schema-enabled`` each routed batch is checked against the
worker's *evolved schema* S' of its table (the table's Arrow schema plus what earlier batches
needed): new top-level and nested fields (found by one inferring parse), integers beyond int,
floats beyond float, decimals beyond their precision (found by decoding against a *relaxed*
schema with the wide types and checking the values), and nulls in required columns. The batch
is decoded against S' (grown as needed), so its values are buffered even though the table
cannot hold them yet; the worker proposes S' to the coordinator (``SchemaProposal``), which
applies one schema update per table before the next round. At that round the worker reloads
the table, writes the chunks the refreshed schema holds (:func:`holds`), cast with
:func:`conform` to the table's exact Arrow schema (its field ids, order, wider types, nulls
for columns the chunk lacks), and keeps the others for a later round.

Records that state their schema (Kafka Connect envelopes, Debezium events with schemas) need
no inspection of values: :class:`Growth` grows S' by :func:`changes` of the stated schemas
(agents/formats.py maps them), before the batch is decoded against S'. Everything after is
shared: the proposal, the coordinator's update, :func:`holds` and :func:`conform` at the round.

A type conflict that is not a widening (text in a long column, long into int is fine) is no
evolution: decode_json coerces or rejects as without evolution. Fields whose values are all
null are not added (there is nothing to lose), as the reference sink does.

Paths name nested fields: ``("customer", "address", "zip")``; a list's element is
``"element"`` (``("items", "element", "qty")``), as in pyiceberg's ``find_field``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agents.buffer import Buffers, Chunk
from agents.convert import Converted, decode_json, infer_schema, struct_array
from icesink.shared.protocol import SchemaProposal
from icesink.shared.schema_changes import (  # what the worker shares with the coordinator
    ELEMENT, MAX_DECIMAL_PRECISION, AddField, Path, apply_changes, changes, find_field, holds, is_list, to_proposal,
)

__all__ = ["Evolver", "Growth", "as_named_by", "conform", "field_id"]

_FLOAT32_MAX = float(np.finfo(np.float32).max)

# Casting data ------------------------------------------------------------------------------


def _cast(arr: pa.Array, t: pa.DataType, ci: bool) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        return pa.chunked_array([_cast(c, t, ci) for c in arr.chunks], type=t)
    if arr.type.equals(t):
        return arr
    if pa.types.is_struct(t) and pa.types.is_struct(arr.type):
        have = list(arr.type)
        children = []
        for f in t:
            src = find_field(have, f.name, ci)
            children.append(
                pa.nulls(len(arr), f.type) if src is None
                else _cast(arr.field(arr.type.get_field_index(src.name)), f.type, ci)
            )
        return struct_array(children, t, len(arr), arr.is_null() if arr.null_count else None)
    if is_list(t) and is_list(arr.type):
        values = _cast(arr.values, t.value_type, ci)
        cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        offsets = arr.offsets
        if pa.types.is_large_list(t) != pa.types.is_large_list(arr.type):
            offsets = pc.cast(offsets, pa.int64() if pa.types.is_large_list(t) else pa.int32())
        out = cls.from_arrays(offsets, values, type=t, mask=arr.is_null() if arr.null_count else None)
        return out
    # float64 -> float32 rounds, as decode_json does; other casts are exact (values fit).
    return pc.cast(arr, t, safe=not (pa.types.is_float32(t) and pa.types.is_float64(arr.type)))


_FIELD_ID = b"PARQUET:field_id"


def field_id(f: pa.Field) -> bytes | None:
    """A column's Iceberg field id, as schema_to_pyarrow puts it in the field's metadata."""
    return None if f.metadata is None else f.metadata.get(_FIELD_ID)


def _source(have: list[pa.Field], by_id: Mapping[bytes, pa.Field], f: pa.Field, ci: bool) -> pa.Field | None:
    """The column of the data that fills ``f``: the one of the same field id (a column another
    tool renamed keeps its id), else the one of its name that has no other id (one dropped and
    added again under its name is another column, empty for older rows)."""
    fid = field_id(f)
    if fid is not None and fid in by_id:
        return by_id[fid]
    src = find_field(have, f.name, ci)
    if src is not None and fid is not None and field_id(src) not in (None, fid):
        return None
    return src


def as_named_by(table: pa.Schema, data: pa.Schema) -> pa.Schema:
    """``data``'s schema as :func:`conform` maps it to ``table``: top-level columns with a field
    id named as the table names that id now (renamed by another tool), left out when the table
    no longer has it (dropped); columns without an id (evolution's) as they are."""
    by_id = {fid: f for f in table if (fid := field_id(f)) is not None}
    out = []
    for f in data:
        fid = field_id(f)
        if fid is None:
            out.append(f)
        elif fid in by_id:
            out.append(f.with_name(by_id[fid].name))
    return pa.schema(out)


def conform(data: pa.Table, schema: pa.Schema, *, case_insensitive: bool = False) -> pa.Table:
    """``data`` as a table of exactly ``schema``: top-level columns matched by field id, else
    by name (ignoring case if asked: :func:`_source`), in the schema's order, cast to its
    types; missing columns are nulls, columns the schema lacks (dropped) are left out."""
    if data.schema.equals(schema, check_metadata=True):
        return data
    have = list(data.schema)
    by_id = {fid: f for f in have if (fid := field_id(f)) is not None}
    columns = []
    for f in schema:
        src = _source(have, by_id, f, case_insensitive)
        if src is None:
            columns.append(pa.nulls(data.num_rows, f.type))
        else:
            col = data.column(data.schema.get_field_index(src.name)).combine_chunks()
            columns.append(_cast(col, f.type, case_insensitive))
    return pa.Table.from_arrays(columns, schema=schema)


# What a decoded batch needs ----------------------------------------------------------------


def _relaxed(schema: pa.Schema, keep_required: frozenset[Path]) -> pa.Schema:
    """The decode schema: wide numeric types, every field optional but identifier fields."""

    def rtype(t: pa.DataType, path: Path) -> pa.DataType:
        if pa.types.is_integer(t):
            return pa.int64()
        if pa.types.is_float32(t):
            return pa.float64()
        if pa.types.is_decimal(t):
            return pa.decimal128(MAX_DECIMAL_PRECISION, t.scale)
        if pa.types.is_struct(t):
            return pa.struct([rfield(f, path + (f.name,)) for f in t])
        if is_list(t):
            el = rfield(t.value_field, path + (ELEMENT,))
            return pa.large_list(el) if pa.types.is_large_list(t) else pa.list_(el)
        return t

    def rfield(f: pa.Field, path: Path) -> pa.Field:
        out = f.with_type(rtype(f.type, path))
        return out if path in keep_required else out.with_nullable(True)

    return pa.schema([rfield(f, (f.name,)) for f in schema], metadata=schema.metadata)


def _observed(arr: pa.Array, t: pa.DataType, f: pa.Field, cur: pa.DataType | None) -> pa.Field | None:
    """The narrowest field of type like ``t`` that holds ``arr`` (decoded against the relaxed
    type); None when there is nothing to keep: every value null, or a new list that has no
    element yet (its element type is unknown, as in the reference sink). ``arr`` holds only
    the values that exist (a struct's children where the struct is valid, a list's elements);
    ``cur`` is the field's type in the evolved schema, None for a field new in this batch."""
    if len(arr) == arr.null_count:
        return None
    nullable = arr.null_count > 0 or f.nullable
    if pa.types.is_struct(t):
        valid = arr.filter(arr.is_valid()) if arr.null_count else arr
        known = list(cur) if cur is not None and pa.types.is_struct(cur) else []
        children = []
        for i, cf in enumerate(t):
            was = find_field(known, cf.name, False)
            child = _observed(valid.field(i), cf.type, cf, was.type if was is not None else None)
            if child is not None:
                children.append(child)
            elif not cf.nullable:  # all null where the parent is valid: it must become optional
                children.append(cf.with_nullable(True))
        if cur is None and not children:
            return None
        return f.with_type(pa.struct(children)).with_nullable(nullable)
    if is_list(t):
        values = arr.flatten()
        was = cur.value_type if cur is not None and is_list(cur) else None
        el = _observed(values, t.value_type, t.value_field, was)
        if el is None:
            if was is None:
                return None  # no element to learn the type from: wait for one
            el = t.value_field.with_nullable(t.value_field.nullable or len(values) > 0)
        return f.with_type(pa.large_list(el) if pa.types.is_large_list(t) else pa.list_(el)).with_nullable(nullable)
    if pa.types.is_integer(t) and pa.types.is_integer(arr.type) and arr.type.bit_width > t.bit_width:
        lo, hi = pc.min_max(arr).values()
        fits = -(2 ** (t.bit_width - 1)) <= lo.as_py() and hi.as_py() < 2 ** (t.bit_width - 1)
        return f.with_type(t if fits else pa.int64()).with_nullable(nullable)
    if pa.types.is_float32(t) and pa.types.is_float64(arr.type):
        finite = pc.filter(arr, pc.is_finite(arr))
        big = len(finite) and pc.max(pc.abs(finite)).as_py() > _FLOAT32_MAX
        return f.with_type(pa.float64() if big else t).with_nullable(nullable)
    if pa.types.is_decimal(t) and pa.types.is_decimal(arr.type):
        biggest = pc.max(pc.abs(arr)).as_py()
        digits = max(biggest.adjusted() + 1, 0) if biggest else 0
        precision = min(MAX_DECIMAL_PRECISION, max(t.precision, digits + t.scale))
        return f.with_type(pa.decimal128(precision, t.scale)).with_nullable(nullable)
    return f.with_type(t).with_nullable(nullable)


def _observed_schema(data: pa.Table, schema: pa.Schema, current: pa.Schema) -> pa.Schema:
    out = []
    known = list(current)
    for f in schema:
        was = find_field(known, f.name, False)
        got = _observed(data.column(f.name).combine_chunks(), f.type, f.with_nullable(False),
                        was.type if was is not None else None)
        if got is not None:
            out.append(got)
        elif not f.nullable:
            out.append(f.with_nullable(True))
    return pa.schema(out)


# The worker's evolved schemas ------------------------------------------------------------------


@dataclass
class Decoded:
    converted: Converted
    proposal: SchemaProposal | None  # to send: the evolved schema grew past the table


class Evolver:
    """Per worker: the evolved schema S' of each table and the last one proposed."""

    def __init__(self, worker: str, *, evolve: bool, case_insensitive: bool) -> None:
        self.worker = worker
        self.evolve = evolve
        self.case_insensitive = case_insensitive
        self.schemas: dict[str, pa.Schema] = {}  # table -> S' (only while it differs from the table)
        self.proposed: dict[str, pa.Schema] = {}

    def schema_for(self, name: str, table_schema: pa.Schema) -> pa.Schema:
        return self.schemas.get(name, table_schema)

    def decode(
        self, name: str, table_schema: pa.Schema, values: Sequence[bytes],
        keep_required: frozenset[Path] = frozenset(), *,
        infer: Callable[[], pa.Schema] | None = None,
        decode: Callable[[pa.Schema], Converted] | None = None,
        frozen: frozenset[str] = frozenset(),
    ) -> Decoded:
        """Decode ``values`` against what they need (their values decide: schemaless JSON).

        ``infer`` gives the fields the records have (default: the JSON values' own, by one
        inferring parse) and ``decode`` decodes the batch against a schema (default:
        decode_json of the values, folding key case if asked); the Debezium transform and the
        key/metadata columns pass their own (which fold case the same way). Top-level columns
        in ``frozen`` never evolve (``_cdc``, key and metadata columns: built by the sink, not
        the source)."""
        current = self.schema_for(name, table_schema)
        inferred = infer_schema(values) if infer is None else infer()
        ci = self.case_insensitive
        adds = [c for c in changes(current, inferred, case_insensitive=ci)
                if isinstance(c, AddField) and c.path[0] not in frozen]
        candidate = apply_changes(current, adds) if self.evolve else current
        probe = _relaxed(candidate, keep_required) if self.evolve else candidate
        converted = decode_json(values, probe, fold_case=ci) if decode is None else decode(probe)
        table = converted.table
        if not self.evolve:
            return Decoded(converted, None)
        if table.num_rows:
            need = [c for c in changes(current, _observed_schema(table, candidate, current), case_insensitive=ci,
                                       keep_required=keep_required) if c.path[0] not in frozen]
        else:
            need = []
        final = apply_changes(current, need, case_insensitive=ci) if need else current
        table = conform(table, final, case_insensitive=ci)
        proposal = self._settle(name, table_schema, final) if need else None
        return Decoded(Converted(table, converted.indices, converted.rejects), proposal)

    def growth(
        self, name: str, table_schema: pa.Schema, keep_required: frozenset[Path] = frozenset(),
        frozen: frozenset[str] = frozenset(),
    ) -> Growth:
        """Evolution by stated schemas (a Connect schema says what its records need) for one batch."""
        return Growth(self, name, table_schema, keep_required, frozen)

    def _settle(self, name: str, table_schema: pa.Schema, final: pa.Schema) -> SchemaProposal | None:
        """S' is now ``final`` (it grew): the proposal to send, if it holds more than was proposed."""
        self.schemas[name] = final
        if holds(self.proposed.get(name, table_schema), final, case_insensitive=self.case_insensitive):
            return None
        self.proposed[name] = final
        return to_proposal(self.worker, name, final)

    def refreshed(self, name: str, table_schema: pa.Schema) -> None:
        """The table was reloaded: keep S' only for what the table still lacks (its columns
        matched by field id: one another tool renamed or dropped is not proposed again)."""
        mine = self.schemas.get(name)
        if mine is None:
            return
        mine = as_named_by(table_schema, mine)
        ci = self.case_insensitive
        need = changes(table_schema, mine, case_insensitive=ci)
        if need:
            self.schemas[name] = apply_changes(table_schema, need, case_insensitive=ci)
        else:
            del self.schemas[name]
            self.proposed.pop(name, None)

    def pending_proposal(self, name: str, table_schema: pa.Schema) -> SchemaProposal | None:
        """Re-send at a round: S' still needs changes the table lacks."""
        mine = self.schemas.get(name)
        if mine is None or holds(table_schema, mine, case_insensitive=self.case_insensitive):
            return None
        return to_proposal(self.worker, name, mine)

    def tables_to_reload(self, buffers: Buffers, targets: Mapping[str, Any]) -> set[str]:
        """Tables some buffered chunk was decoded for with a schema other than the table's."""
        out = set()
        for st in buffers.partitions.values():
            for chunk in st.chunks:
                for name, t in chunk.by_table().items():
                    if name not in out and not t.schema.equals(targets[name].arrow_schema):
                        out.add(name)
        return out

    def ready(self, targets: Mapping[str, Any]) -> Callable[[Chunk], bool]:
        """Whether a chunk can be written now: its tables hold every column it has."""
        ci = self.case_insensitive
        return lambda chunk: all(
            t.schema.equals(targets[name].arrow_schema)
            or holds(targets[name].arrow_schema, as_named_by(targets[name].arrow_schema, t.schema), case_insensitive=ci)
            for name, t in chunk.by_table().items()
        )

    def conformer(self, targets: Mapping[str, Any]) -> Callable[[str, pa.Table], pa.Table]:
        """Casts a chunk's rows to its table's exact Arrow schema (real field ids) for writing."""
        ci = self.case_insensitive
        return lambda name, t: conform(t, targets[name].arrow_schema, case_insensitive=ci)


class Growth:
    """Schema-driven evolution of one table for one batch (the Kafka Connect envelope, Debezium
    events with schemas): the records' schemas state the types, so no value is inspected.

    Called with the stated schemas of the batch's record groups, it grows S' by what they need
    (:func:`changes`: new top-level and nested fields, int -> long, float -> double, wider
    decimals, required -> optional) and returns S', the schema to decode the batch against;
    :meth:`done` records S' and gives the proposal to send. The reference sink evolves the same
    way: from the record's schema, a field added even while its values are null."""

    def __init__(self, evolver: Evolver, name: str, table_schema: pa.Schema,
                 keep_required: frozenset[Path], frozen: frozenset[str]) -> None:
        self.evolver = evolver
        self.name = name
        self.table_schema = table_schema
        self.keep_required = keep_required
        self.frozen = frozen
        self.schema = evolver.schema_for(name, table_schema)  # S'
        self.grew = False

    def __call__(self, wanted: Sequence[pa.Schema]) -> pa.Schema:
        if not self.evolver.evolve:
            return self.schema
        ci = self.evolver.case_insensitive
        for want in wanted:
            want = pa.schema([f for f in want if f.name not in self.frozen])
            need = changes(self.schema, want, case_insensitive=ci, keep_required=self.keep_required)
            if need:
                self.schema = apply_changes(self.schema, need, case_insensitive=ci)
                self.grew = True
        return self.schema

    def done(self, converted: Converted) -> Decoded:
        """The batch decoded against S' (its table has S' exactly), and the proposal to send."""
        proposal = self.evolver._settle(self.name, self.table_schema, self.schema) if self.grew else None
        return Decoded(converted, proposal)

