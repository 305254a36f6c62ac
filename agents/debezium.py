"""Debezium change events -> change rows, in bulk (the reference sink's ``DebeziumTransform``).

A Debezium event ``{"before": {...}, "after": {...}, "op": "c", "source": {...}, ...}`` becomes
one row: the fields of ``after`` (of ``before`` for a delete) at the top level, plus a ``_cdc``
struct saying what happened:

=============  ==============  =================================================================
``_cdc.op``    string          ``I`` (Debezium ``c``, and ``r``: snapshot reads), ``U``, ``D``
``_cdc.ts``    timestamptz     when the change happened in the source database: ``source.ts_us``
                               (microseconds), else ``source.ts_ms``, else the event's own time
``_cdc.offset`` long           the Kafka offset of the change event
``_cdc.source`` string         ``{schema}.{table}`` (``{db}.{table}`` without a schema, MySQL;
                               ``{db}.{collection}``, MongoDB)
``_cdc.target`` string         ``cdc.target.pattern`` with ``{db}`` and ``{table}`` filled in
                               (``{db}`` is the schema where there is one, as in the reference)
``_cdc.lsn``   long            PostgreSQL's ``source.lsn``
``_cdc.position`` string       where in the source log: the PostgreSQL LSN, MySQL
                               ``binlog-file:position``, SQL Server ``change_lsn``, Oracle ``scn``
=============  ==============  =================================================================

The changes land append-only: every event is a row. Applying them to a mirror table comes later.

How a batch is converted: :func:`agents.convert.decode_json` reads every value against a
*wrapper* schema (the envelope, with the table's columns as the type of ``before`` and
``after``), then pyarrow.compute picks the image per row and builds ``_cdc``; no per-record
Python. Values written by the JsonConverter with schemas enabled (``{"schema": ..,
"payload": ..}``) are split and grouped by schema as the envelope format does
(:mod:`agents.formats`), and each group's payloads decoded in bulk; the group's Connect schema
says how temporal and decimal fields are encoded, which reaches ``decode_json`` as field
metadata (``icesink.epoch-unit``, ``icesink.decimal-encoding``). A value that is not a change
event with a row image (a tombstone, a truncate, a record of another kind) is a
:class:`~agents.convert.Reject`.

Schema evolution (``iceberg.tables.evolve-schema-enabled``, driven by the worker through
:mod:`agents.evolution`): with schemas, the row schema the groups state (``after``/``before``)
is what the table needs; without, the row images' values decide, as for plain JSON. ``_cdc``
never evolves. The key and Kafka metadata columns are added around the transform by the record
format (:meth:`agents.formats.RecordFormat.convert`), as the reference chains the transform
with ``KafkaMetadataTransform``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agents.convert import Converted, Reject, decode_json, if_else, infer_schema, struct_array
from agents.formats import ConnectSchemaError, Envelopes, Grow, connect_arrow_schema, decode_envelopes, decode_schema
from icesink.shared.config import CDC_ROUTE_FIELDS

if TYPE_CHECKING:
    from agents.formats.registry_values import RegistryValues
    from agents.transforms.values import ValueChain

__all__ = ["CDC_COLUMN", "CDC_TYPE", "DebeziumTransform"]

CDC_COLUMN: Final = "_cdc"
CDC_TYPE: Final = pa.struct([
    pa.field("op", pa.string()),
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("offset", pa.int64()),
    pa.field("source", pa.string()),
    pa.field("target", pa.string()),
    pa.field("lsn", pa.int64()),
    pa.field("position", pa.string()),
])
DEFAULT_TARGET_PATTERN: Final = "{db}.{table}"

#: The parts of ``source`` that are read; other connectors' fields are ignored.
_SOURCE: Final = pa.struct([
    pa.field("db", pa.string()),
    pa.field("schema", pa.string()),
    pa.field("table", pa.string()),
    pa.field("collection", pa.string()),  # MongoDB: its table
    pa.field("ts_ms", pa.int64()),
    pa.field("ts_us", pa.int64()),
    pa.field("lsn", pa.int64()),  # PostgreSQL
    pa.field("file", pa.string()),  # MySQL binlog
    pa.field("pos", pa.int64()),
    pa.field("change_lsn", pa.string()),  # SQL Server
    pa.field("scn", pa.string()),  # Oracle
])


@dataclass(frozen=True)
class DebeziumTransform:
    """``target_pattern``: ``cdc.target.pattern`` (checked by icesink.shared.config); ``schemas``: values
    carry the JsonConverter's schema envelope (``value.converter.schemas.enable``)."""

    target_pattern: str = DEFAULT_TARGET_PATTERN
    schemas: bool = False
    fold_case: bool = False  # iceberg.tables.schema-case-insensitive: row fields name columns ignoring case
    #: Schema-registry values (Debezium's AvroConverter): the events decoded per schema id, the
    #: registered ``Envelope`` schema stating the row image's types (as ``schemas`` does for JSON).
    registry: RegistryValues | None = field(default=None, compare=False, repr=False)
    #: The reference's MongoDebeziumTransform listed before it (JSON with schemas, checked at
    #: start): the events' extended-JSON ``before``/``after`` strings typed first
    #: (agents/transforms/mongo.py), the row image the documents' fields.
    mongo: ValueChain | None = field(default=None, compare=False, repr=False)
    _envelopes: Envelopes = field(default_factory=Envelopes, compare=False, repr=False)

    # Schemas ---------------------------------------------------------------------------------

    def infer_schema(self, values: Sequence[bytes]) -> pa.Schema:
        """Columns of an auto-created table: the row image's fields (all optional: a delete's
        ``before`` may hold the key only), then ``_cdc``.

        With schemas the types come from the Connect schema of the first event, mapped as the
        schema envelope format maps them (:func:`agents.formats.connect_iceberg_schema`: exact
        ints, decimals, timestamps, uuid); without, they are inferred from the JSON (a
        MicroTimestamp is then a long and a Connect decimal a base64 string: nothing in the
        value says more).
        """
        if self.registry is not None:  # the newest schema id's row image
            envelopes = self.registry.wanted(values)
            images = _row_fields(envelopes[-1]) if envelopes else []
            return pa.schema([_nullable(f) for f in images] + [pa.field(CDC_COLUMN, CDC_TYPE)])
        if self.mongo is not None:  # the documents' fields
            typed = self.mongo.out_schema(pa.schema([pa.field("after", pa.string())]), values).field("after").type
            return pa.schema([_nullable(f) for f in typed] + [pa.field(CDC_COLUMN, CDC_TYPE)])
        connect = _first_connect_schema(values) if self.schemas else None
        image = _row_connect_schema(connect) if connect is not None else None
        if connect is not None:
            stated = connect_arrow_schema(image) if image is not None else None
            fields = list(_encoded(stated, image)) if stated is not None and image is not None else []
        else:
            fields = list(self.row_schema(values))
        return pa.schema([_nullable(f) for f in fields] + [pa.field(CDC_COLUMN, CDC_TYPE)])

    def row_schema(self, values: Sequence[bytes]) -> pa.Schema:
        """The row images' fields as the JSON values show them (one inferring parse): what
        schemaless events need of a table (schema evolution), ``_cdc`` never among them."""
        envelope = infer_schema(values)
        if self.schemas and "payload" in envelope.names:
            payload = envelope.field("payload").type
            envelope = pa.schema(list(payload)) if pa.types.is_struct(payload) else pa.schema([])
        return pa.schema([f for f in _row_fields(envelope) if f.name != CDC_COLUMN])

    def _wrapper(self, row: Sequence[pa.Field]) -> pa.Schema:
        """The envelope (the payload, with schemas) with ``row`` as the type of the images."""
        image = pa.struct([_nullable(f) for f in row])
        return pa.schema([
            pa.field("before", image),
            pa.field("after", image),
            pa.field("op", pa.string()),
            pa.field("ts_ms", pa.int64()),
            pa.field("ts_us", pa.int64()),
            pa.field("source", _SOURCE),
        ])

    # Conversion ------------------------------------------------------------------------------

    def apply(self, values: Sequence[bytes], offsets: Sequence[int], schema: pa.Schema, *,
              grow: Grow | None = None, keys: Sequence[bytes | None] = ()) -> Converted:
        """Change rows for ``values`` (Kafka offsets ``offsets``), in ``schema`` (the table's).

        With schemas, events are grouped by Connect schema (as the envelope format groups
        records) and each group's row fields are read with the encodings its schema states;
        ``grow`` (schema evolution) is given the row schemas the groups state and returns the
        schema to decode against (``_cdc`` included, unchanged)."""
        if self.registry is not None:
            if grow is not None:
                schema = grow([pa.schema(_row_fields(stated)) for stated in self.registry.wanted(values)])
            row = [f for f in schema if f.name != CDC_COLUMN]
            decoded = self.registry.convert(values, self._wrapper(row))
        elif self.mongo is not None:  # the extended-JSON images typed into the wrapper's (no evolution: refused)
            row = [f for f in schema if f.name != CDC_COLUMN]
            wrapper = self._wrapper(row)
            wire = self.mongo.in_schema(wrapper)
            groups, not_envelopes = self._envelopes.group(values)
            raw = decode_envelopes(groups, not_envelopes, wire, lambda _: wire, fold_case=self.fold_case)
            decoded = self.mongo.apply(raw, wrapper, keys=keys)  # keys: a partial update's _id
        elif self.schemas:
            groups, not_envelopes = self._envelopes.group(values)
            if grow is not None:
                schema = grow([w for g in groups if (image := _row_connect_schema(g.schema)) is not None
                               and (w := connect_arrow_schema(image)) is not None])
            row = [f for f in schema if f.name != CDC_COLUMN]
            decoded = decode_envelopes(
                groups, not_envelopes, self._wrapper(row),
                lambda connect: self._wrapper(_encoded(pa.schema(row), _row_connect_schema(connect), self.fold_case)),
                fold_case=self.fold_case,
            )
        else:
            row = [f for f in schema if f.name != CDC_COLUMN]
            decoded = decode_json(values, self._wrapper(row), fold_case=self.fold_case)
        table, indices = decoded.table, decoded.indices
        cols = {name: table.column(name).combine_chunks() for name in table.column_names}
        op = cols["op"]
        deleted = pc.fill_null(pc.equal(op, "d"), False)
        image = if_else(deleted, cols["before"], cols["after"])
        bad = pc.or_(pc.is_null(op), pc.is_null(image))
        rejects = list(decoded.rejects)
        if pc.any(bad).as_py():
            for i, o in zip(np.flatnonzero(bad.to_numpy(zero_copy_only=False)), pc.filter(op, bad).to_pylist()):
                reason = ("not a Debezium change event: no op" if o is None
                          else f"Debezium event without a row image (op {o!r})")
                rejects.append(Reject(int(indices[i].as_py()), reason, None if o is None else "after"))
        arrays: dict[str, pa.Array] = {f.name: image.field(f.name) for f in row}
        offs = pa.array(offsets, type=pa.int64()).take(indices)
        arrays[CDC_COLUMN] = self._cdc(cols, op, offs)
        out = []
        for f in schema:
            arr = arrays.get(f.name)
            if arr is None or (f.name == CDC_COLUMN and not pa.types.is_struct(f.type)):
                arr = pa.nulls(len(image), f.type)
            elif f.name == CDC_COLUMN:
                arr = _fit_struct(arr, f.type)
            if not f.nullable:
                missing = pc.and_not(pc.is_null(arr), bad)
                if pc.any(missing).as_py():
                    for i in np.flatnonzero(missing.to_numpy(zero_copy_only=False)):
                        rejects.append(Reject(int(indices[i].as_py()), "required field is null or missing", f.name))
                    bad = pc.or_(bad, missing)
            out.append(arr)
        keep = pc.invert(bad)
        result = pa.Table.from_arrays(out, schema=schema).filter(keep)
        return Converted(result, pc.filter(indices, keep), tuple(sorted(rejects, key=lambda r: r.index)))

    def _cdc(self, cols: dict[str, pa.Array], op: pa.Array, offsets: pa.Array) -> pa.StructArray:
        source = cols["source"]
        ops = self._cdc_op(op)
        micros = pc.coalesce(
            source.field("ts_us"), pc.multiply(source.field("ts_ms"), 1000),
            cols["ts_us"], pc.multiply(cols["ts_ms"], 1000),
        )
        ts = micros.cast(pa.timestamp("us", tz="UTC"))
        db = pc.coalesce(source.field("schema"), source.field("db"))
        table = pc.coalesce(source.field("table"), source.field("collection"))
        lsn = source.field("lsn")
        binlog = pc.binary_join_element_wise(source.field("file"), source.field("pos").cast(pa.string()), ":")
        position = pc.coalesce(lsn.cast(pa.string()), binlog, source.field("change_lsn"), source.field("scn"))
        return pa.StructArray.from_arrays(
            [ops, ts, offsets, pc.binary_join_element_wise(db, table, "."), self._target(db, table), lsn, position],
            fields=list(CDC_TYPE),
        )

    @staticmethod
    def _cdc_op(op: pa.Array) -> pa.Array:
        """``_cdc.op``: D for Debezium ``d``, U for ``u``, I otherwise (``c``, snapshot ``r``)."""
        deleted = pc.fill_null(pc.equal(op, "d"), False)
        updated = pc.fill_null(pc.equal(op, "u"), False)
        return pc.if_else(deleted, "D", pc.if_else(updated, "U", "I"))

    def _target(self, db: pa.Array, table: pa.Array) -> pa.Array:
        parts: list[Any] = []
        for piece in re.split(r"(\{db\}|\{table\})", self.target_pattern):
            if piece == "{db}":
                parts.append(db)
            elif piece == "{table}":
                parts.append(table)
            elif piece:
                parts.append(piece)
        if not parts:
            return pa.nulls(len(db), pa.string())
        return pc.binary_join_element_wise(*parts, "")


    # Routing ---------------------------------------------------------------------------------

    def route_column(self, values: Sequence[bytes], field: str) -> Converted:
        """The string value of ``field`` for every change event, as routing reads it: a
        ``_cdc`` field (``_cdc.target``, ``_cdc.source`` or ``_cdc.op``) as the transform will
        fill it, else a (dotted) field of the row image (``after``; ``before`` for a delete).
        One bulk parse; the table's single column is that value (null where missing)."""
        cdc = field.startswith(f"{CDC_COLUMN}.")
        if cdc:
            part = field[len(CDC_COLUMN) + 1:]
            assert part in CDC_ROUTE_FIELDS, field  # checked by icesink.shared.config
            image: pa.DataType = pa.struct([])
        else:
            *parents, leaf = field.split(".")
            inner = pa.field(leaf, pa.string())
            for name in reversed(parents):
                inner = pa.field(name, pa.struct([inner]))
            image = pa.struct([inner])
        envelope = [pa.field("before", image), pa.field("after", image), pa.field("op", pa.string()),
                    pa.field("source", _SOURCE)]
        if self.mongo is not None:  # extended-JSON images, not read: a _cdc field only (checked at start)
            envelope = envelope[2:]
        if self.registry is not None:
            return self._registry_route_column(values, field, pa.schema(envelope))
        decoded = decode_json(values, pa.schema([pa.field("payload", pa.struct(envelope))] if self.schemas else envelope))
        table = decoded.table
        if self.schemas:
            payload = table.column("payload").combine_chunks()
            cols = {f.name: payload.field(f.name) for f in payload.type}
        else:
            cols = {name: table.column(name).combine_chunks() for name in table.column_names}
        op = cols["op"]
        if cdc:
            column = self._cdc_route(part, op, cols["source"])
        else:
            column = pc.if_else(pc.fill_null(pc.equal(op, "d"), False), cols["before"], cols["after"])
            for _ in field.split("."):
                column = pc.struct_field(column, [0])
        return Converted(pa.table({field: column}), decoded.indices, decoded.rejects)

    def _cdc_route(self, part: str, op: pa.Array, source: pa.StructArray) -> pa.Array:
        """The ``_cdc`` field ``part`` (target, source or op) as the transform will fill it."""
        db = pc.coalesce(source.field("schema"), source.field("db"))
        tbl = pc.coalesce(source.field("table"), source.field("collection"))
        if part == "target":
            return self._target(db, tbl)
        if part == "source":
            return pc.binary_join_element_wise(db, tbl, ".")
        return self._cdc_op(op)

    def _registry_route_column(self, values: Sequence[bytes], field: str, envelope: pa.Schema) -> Converted:
        """:meth:`route_column` of registry values: the events decoded per schema id, once for
        ``op`` and ``source``; a row image field read from ``after`` and ``before`` as text
        (numbers as their digits), each in one bulk decode of that field."""
        assert self.registry is not None
        no_image = pa.schema([f.with_type(pa.struct([])) if f.name in ("before", "after") else f for f in envelope])
        decoded = self.registry.convert(values, no_image)
        cols = {name: decoded.table.column(name).combine_chunks() for name in decoded.table.column_names}
        op = cols["op"]
        if field.startswith(f"{CDC_COLUMN}."):
            column = self._cdc_route(field[len(CDC_COLUMN) + 1:], op, cols["source"])
        else:
            rows = decoded.indices
            after = _by_index(self.registry.column(values, f"after.{field}"), len(values)).take(rows)
            before = _by_index(self.registry.column(values, f"before.{field}"), len(values)).take(rows)
            column = pc.if_else(pc.fill_null(pc.equal(op, "d"), False), before, after)
        return Converted(pa.table({field: column}), decoded.indices, decoded.rejects)


def _by_index(converted: Converted, n: int) -> pa.Array:
    """A one-column decode as ``n`` values by input index (null where it has no row)."""
    at = np.full(n, -1, dtype=np.int64)
    at[converted.indices.to_numpy(zero_copy_only=False)] = np.arange(len(converted.indices), dtype=np.int64)
    column = converted.table.column(0).combine_chunks().cast(pa.string())
    return column.take(pa.array(at, mask=at < 0))  # a null index takes a null


# Connect schemas (the JsonConverter's envelope) ------------------------------------------------


def _encoded(row: pa.Schema, image: dict[str, Any] | None, fold_case: bool = False) -> pa.Schema:
    """The row fields with the encodings the row's Connect schema states (none if malformed:
    the values decide, or are rejected)."""
    if image is None:
        return row
    try:
        return decode_schema(row, image, fold_case=fold_case)
    except ConnectSchemaError:
        return row


def _first_connect_schema(values: Sequence[bytes]) -> dict[str, Any] | None:
    """The Connect schema of the first value that has one (one JSON parse a batch)."""
    for v in values:
        if not v:
            continue
        try:
            doc = json.loads(v)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("schema"), dict):
            schema: dict[str, Any] = doc["schema"]
            return schema
    return None


def _row_connect_schema(envelope: Any) -> dict[str, Any] | None:
    """The schema of ``after`` (or ``before``) in a Debezium envelope schema."""
    listed = envelope.get("fields") if isinstance(envelope, dict) else None
    if not isinstance(listed, list):
        return None
    fields = {f.get("field"): f for f in listed if isinstance(f, dict)}
    for name in ("after", "before"):
        if fields.get(name, {}).get("type") == "struct":
            return fields[name]
    return None


# Small helpers ------------------------------------------------------------------------------------


def _row_fields(envelope: pa.Schema) -> list[pa.Field]:
    """Fields of ``after``, then those only ``before`` has (a batch of deletes has no ``after``)."""
    fields: dict[str, pa.Field] = {}
    for name in ("after", "before"):
        if name in envelope.names and pa.types.is_struct(envelope.field(name).type):
            for f in envelope.field(name).type:
                fields.setdefault(f.name, f)
    return list(fields.values())


def _nullable(f: pa.Field) -> pa.Field:
    if pa.types.is_struct(f.type):
        f = f.with_type(pa.struct([_nullable(c) for c in f.type]))
    return f.with_nullable(True)


def _fit_struct(arr: pa.StructArray, t: pa.StructType) -> pa.StructArray:
    """``arr`` in the table's ``_cdc`` type: children by name, missing ones null, cast."""
    children = []
    for f in t:
        idx = arr.type.get_field_index(f.name)
        child = arr.field(idx) if idx >= 0 else pa.nulls(len(arr), f.type)
        children.append(child.cast(f.type) if child.type != f.type else child)
    return struct_array(children, t, len(arr), arr.is_null() if arr.null_count else None)
