"""Schema-registry Avro: the Iceberg and Arrow schemas of an Avro schema (:func:`avro_plan`), and
the payloads of one schema id decoded in bulk (:func:`decode_avro`). No I/O.

The mapping is the one the reference sink produces from Confluent's AvroConverter
(``io.confluent.connect.avro.AvroData.toConnectSchema`` with its default settings, then Connect to
Iceberg as :mod:`agents.formats.connect_schema` maps it): records are structs, arrays lists, maps
``map<string, V>``, enums strings, ``[null, X]`` an optional X, a one-branch union its branch, any
other union a struct with one optional field per non-null branch, named by the branch's type
(``int``, ``string``, ``array``...) or, for a record, enum or fixed, by its short name; fixed and
bytes are binary, ``decimal`` a decimal, ``date`` a date, ``time-millis`` a time,
``timestamp-millis`` a timestamptz. Where AvroData has no Connect logical type (``uuid``,
``time-micros``, ``timestamp-micros``, ``local-timestamp-millis``/``-micros``: it gives a plain
string or long) the column has the type the Avro logical type names: uuid, time, timestamptz,
timestamp. docs/schema-registry.md ("Avro types") has the table.

Decoding: the payloads are laid out as one in-memory Avro object container (a header with the
writer schema, then one block of one record per payload, null codec) and read by fastavro's
compiled reader in one loop, then converted to Arrow with ``pa.Table.from_pylist`` into the target
schema. One block per payload keeps the payloads' bounds: a payload that does not decode
(truncated, garbage) fails inside its own block, becomes a :class:`Reject` naming the schema id
and the reason, and reading goes on from the next block. Non-null unions are read through a
writer schema that wraps each branch in a one-field record named as the struct field (a record of
one field is encoded as that field, so the bytes are the same), which fastavro returns as
``{"int": 5}``: the union struct with the other branches null.
"""

from __future__ import annotations

import functools
import io
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import fastavro
import pyarrow as pa
from fastavro.schema import SchemaParseException, UnknownType
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimeType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

from agents.convert.outcome import Converted, Reject
from agents.formats.registry_wire import RegistrySchemaError

_MAX_PRECISION: Final = 38
_PRIMITIVE: Final[Mapping[str, IcebergType]] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}
#: (Avro type, logical type) -> Iceberg type, decimals aside.
_LOGICAL: Final[Mapping[tuple[str, str], IcebergType]] = {
    ("int", "date"): DateType(),
    ("int", "time-millis"): TimeType(),
    ("long", "time-micros"): TimeType(),
    ("long", "timestamp-millis"): TimestamptzType(),
    ("long", "timestamp-micros"): TimestamptzType(),
    ("long", "local-timestamp-millis"): TimestampType(),
    ("long", "local-timestamp-micros"): TimestampType(),
    ("string", "uuid"): UUIDType(),
}
#: Logical types whose number is the Arrow column's own unit (days, microseconds): the writer
#: schema drops them, so fastavro gives the int and ``from_pylist`` takes it as is (measured in
#: bench/avro_bench.py). The millisecond ones stay (fastavro's datetime, converted to microseconds).
_AS_NUMBERS: Final = frozenset({"date", "time-micros", "timestamp-micros", "local-timestamp-micros"})
_NAMED: Final = frozenset({"record", "error", "enum", "fixed"})
#: (Avro type, ``connect.name``) -> the Avro logical type it is read as: Debezium's Avro
#: converter writes its temporal and uuid types as plain ints, longs and strings named by
#: ``connect.name`` (the JSON path reads the same names in Connect schemas:
#: agents/formats/connect_schema.py). The Nano types have no Avro logical type: they stay the
#: longs they are. io.debezium.time.ZonedTimestamp (an ISO-8601 string with its offset) is a
#: timestamptz as the JSON path types it: decoded as the string, then cast in bulk by Arrow
#: (:data:`ZONED`; a string that is no such timestamp is a reject naming the field).
_CONNECT_NAMES: Final[Mapping[tuple[str, str], str]] = {
    ("long", "io.debezium.time.Timestamp"): "local-timestamp-millis",
    ("long", "io.debezium.time.MicroTimestamp"): "local-timestamp-micros",
    ("int", "io.debezium.time.Date"): "date",
    ("int", "io.debezium.time.Time"): "time-millis",
    ("long", "io.debezium.time.MicroTime"): "time-micros",
    ("string", "io.debezium.data.Uuid"): "uuid",
}
ZONED: Final = "io.debezium.time.ZonedTimestamp"


class AvroSchemaError(RegistrySchemaError):
    """An Avro schema that is malformed or cannot map to a table (its records are data errors)."""


@dataclass(frozen=True)
class AvroPlan:
    """What one registered Avro schema gives: the table's columns and how to read its payloads."""

    iceberg: Schema  # the columns of a table for these records
    arrow: pa.Schema  # the same as Arrow (no field ids): what the payloads decode into
    writer: str  # the writer schema (JSON) fastavro reads the payloads with: unions wrapped
    parsed: Any  # the same, parsed by fastavro
    zoned: frozenset[str] = frozenset()  # paths of ZonedTimestamp strings read as timestamptz ("a.b", "xs[]", "m.value")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Walk:
    """One pass over a parsed Avro schema giving its Iceberg type and the decoding writer schema."""

    def __init__(self, named: Mapping[str, Any], zoned: set[str] | None = None) -> None:
        self._named = named  # full name -> parsed definition
        self.zoned: set[str] = set() if zoned is None else zoned  # paths of ZonedTimestamp strings
        self._emitted: set[str] = set()  # named types defined already in the writer schema
        self._visiting: list[str] = []  # records being walked (a name met again is a cycle)
        self._unions = 0
        self._ids = 0

    def id(self) -> int:
        self._ids += 1
        return self._ids

    def walk(self, schema: Any, path: str) -> tuple[IcebergType, bool, Any]:
        """(Iceberg type, optional?, writer schema) of an Avro schema at ``path``."""
        if isinstance(schema, list):
            return self._union(schema, path)
        if isinstance(schema, str):
            if schema in _PRIMITIVE:
                return _PRIMITIVE[schema], False, schema
            if schema == "null":
                raise AvroSchemaError("Avro schema: a null type stands alone (only a union branch may be null)", path or None)
            if schema in self._visiting:
                raise AvroSchemaError(f"Avro schema: {schema} contains itself; a table cannot hold a recursive type",
                                      path or None)
            if schema not in self._named:
                raise AvroSchemaError(f"Avro schema: unknown type {schema!r}", path or None)
            if schema in self._emitted:
                again, _, _ = _Walk(self._named, self.zoned).walk(self._named[schema], path)  # the type again, ids fresh below
                return _renumber(again, self), False, schema
            return self.walk(self._named[schema], path)
        if not isinstance(schema, dict):
            raise AvroSchemaError(f"Avro schema: expected a type name, list or object, found {schema!r}", path or None)
        kind = schema.get("type")
        logical = schema.get("logicalType")
        if kind == "string" and logical is None and schema.get("connect.name") == ZONED:
            self.zoned.add(path)
            return TimestamptzType(), False, "string"  # the string, cast by Arrow after decoding
        if logical is None and isinstance(kind, str) and isinstance(schema.get("connect.name"), str):
            logical = _CONNECT_NAMES.get((kind, schema["connect.name"]))
        if kind in ("record", "error"):
            return self._record(schema, path)
        if kind == "enum":
            self._emitted.add(schema["name"])
            return StringType(), False, _definition(schema, {"symbols": list(schema["symbols"])})
        if kind == "array":
            element, optional, items = self.walk(schema["items"], f"{path}[]")
            return ListType(self.id(), element, element_required=not optional), False, {"type": "array", "items": items}
        if kind == "map":
            value, optional, values = self.walk(schema["values"], f"{path}.value")
            key_id = self.id()
            return (MapType(key_id, StringType(), self.id(), value, value_required=not optional), False,
                    {"type": "map", "values": values})
        if logical == "decimal" and kind in ("bytes", "fixed"):
            t: IcebergType = _decimal(schema, path)
        elif kind == "fixed":
            t = BinaryType()
        elif isinstance(kind, str) and isinstance(logical, str) and (kind, logical) in _LOGICAL:
            t = _LOGICAL[(kind, logical)]
        elif isinstance(kind, str) and kind in _PRIMITIVE:
            t = _PRIMITIVE[kind]  # an unknown logical type: the type it annotates, as Avro says
        else:
            raise AvroSchemaError(f"Avro schema: unknown type {kind!r}", path or None)
        if logical in _AS_NUMBERS and (kind, logical) in _LOGICAL:
            return t, False, kind  # read as the number: Arrow takes it as the column's unit, no datetime per value
        keep = {k: v for k, v in schema.items() if k in ("type", "logicalType", "precision", "scale", "size")}
        if logical is not None:
            keep["logicalType"] = logical  # a Debezium connect.name read as its logical type
        if kind == "fixed":
            return t, False, _definition(schema, keep)
        return t, False, keep

    def _record(self, schema: Mapping[str, Any], path: str) -> tuple[IcebergType, bool, Any]:
        name = schema["name"]
        self._visiting.append(name)
        self._emitted.add(name)
        fields, written = [], []
        for f in schema["fields"]:
            t, optional, w = self.walk(f["type"], _join(path, f["name"]))
            fields.append(NestedField(self.id(), f["name"], t, required=not optional))
            written.append({"name": f["name"], "type": w})
        self._visiting.pop()
        return StructType(*fields), False, _definition(schema, {"fields": written})

    def _union(self, branches: list[Any], path: str) -> tuple[IcebergType, bool, Any]:
        """The writer schema keeps the branches in order: the union index is in the bytes."""
        others = [b for b in branches if b != "null"]
        nullable = len(others) < len(branches)
        if len(branches) == 1 or (len(branches) == 2 and nullable):  # AvroData: the branch itself
            t, _, w = self.walk(others[0], path) if others else self.walk("null", path)
            return t, nullable, ["null" if b == "null" else w for b in branches]
        fields: list[NestedField] = []
        written: list[Any] = []
        seen: set[str] = set()
        for b in branches:
            if b == "null":
                written.append("null")
                continue
            name = _branch_name(self._resolve(b))
            if name in seen:
                raise AvroSchemaError(f"Avro schema: two union branches map to the struct field {name!r}", path or None)
            seen.add(name)
            t, _, w = self.walk(b, _join(path, name))
            fields.append(NestedField(self.id(), name, t, required=False))
            self._unions += 1
            written.append({"type": "record", "name": f"icesink_union_{self._unions}", "fields": [{"name": name, "type": w}]})
        return StructType(*fields), nullable, written

    def _resolve(self, schema: Any) -> Any:
        return self._named.get(schema, schema) if isinstance(schema, str) else schema


def _branch_name(schema: Any) -> str:
    """AvroData's field name for a union branch (``unionMemberFieldName``, enhanced schema support off)."""
    kind = schema if isinstance(schema, str) else schema.get("type")
    if isinstance(schema, dict) and kind in _NAMED:
        return str(schema["name"]).rsplit(".", 1)[-1]
    return "record" if kind == "error" else str(kind)


def _definition(schema: Mapping[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A named type's definition under its full name (a name without a dot in the null namespace)."""
    name = schema["name"]
    head: dict[str, Any] = {"type": schema["type"], "name": name}
    if "." not in name:
        head["namespace"] = ""
    return {**head, **body}


def _decimal(schema: Mapping[str, Any], path: str) -> DecimalType:
    precision, scale = schema.get("precision"), schema.get("scale", 0)
    if not isinstance(precision, int) or not isinstance(scale, int) or not 0 <= scale <= precision:
        raise AvroSchemaError(f"Avro schema: a decimal needs integers 0 <= scale <= precision, found precision "
                              f"{precision!r} and scale {scale!r}", path or None)
    if precision > _MAX_PRECISION:
        raise AvroSchemaError(f"Avro schema: decimal precision {precision} is over Iceberg's {_MAX_PRECISION}", path or None)
    return DecimalType(precision, scale)


def _renumber(t: IcebergType, walk: _Walk) -> IcebergType:
    """``t`` with fresh placeholder ids from ``walk`` (a named type used twice)."""
    if isinstance(t, StructType):
        return StructType(*(NestedField(walk.id(), f.name, _renumber(f.field_type, walk), required=f.required)
                            for f in t.fields))
    if isinstance(t, ListType):
        return ListType(walk.id(), _renumber(t.element_type, walk), element_required=t.element_required)
    if isinstance(t, MapType):
        key_id = walk.id()
        return MapType(key_id, t.key_type, walk.id(), _renumber(t.value_type, walk), value_required=t.value_required)
    return t


@functools.lru_cache(maxsize=256)
def avro_plan(text: str, references: tuple[str, ...] = ()) -> AvroPlan:
    """The plan of a registered Avro schema (``references``: the texts of the schemas it references,
    each after those it references). Raises :class:`AvroSchemaError` for a schema that is not
    valid Avro, is not a record, or cannot map to a table."""
    named: dict[str, Any] = {}
    try:
        for ref in references:
            fastavro.parse_schema(json.loads(ref), named_schemas=named, _write_hint=False)
        parsed = fastavro.parse_schema(json.loads(text), named_schemas=named, _write_hint=False)
    except (ValueError, SchemaParseException, UnknownType, KeyError, TypeError) as e:
        raise AvroSchemaError(f"Avro schema: not valid Avro ({type(e).__name__}: {e})") from None
    root = named.get(parsed, parsed) if isinstance(parsed, str) else parsed
    if not isinstance(root, dict) or root.get("type") not in ("record", "error"):
        kind = root.get("type") if isinstance(root, dict) else root
        raise AvroSchemaError(f"Avro schema: the value schema is {kind!r}; a table row needs a record")
    walk = _Walk(named)
    t, _, writer = walk.walk(root, "")
    assert isinstance(t, StructType)
    iceberg = assign_fresh_schema_ids(Schema(*t.fields))
    return AvroPlan(iceberg, schema_to_pyarrow(iceberg, include_field_ids=False), json.dumps(writer),
                    fastavro.parse_schema(writer), frozenset(walk.zoned))


def avro_iceberg_schema(text: str, references: tuple[str, ...] = ()) -> Schema:
    """The Iceberg schema of a table for records of this Avro schema (see :func:`avro_plan`)."""
    return avro_plan(text, references).iceberg


def avro_arrow_schema(text: str, references: tuple[str, ...] = ()) -> pa.Schema:
    """The Arrow schema records of this Avro schema decode into (see :func:`avro_plan`)."""
    return avro_plan(text, references).arrow


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)  # zigzag, as Avro writes a long
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _header(writer: str, sync: bytes) -> bytes:
    meta = {b"avro.schema": writer.encode(), b"avro.codec": b"null"}
    parts = [b"Obj\x01", _varint(len(meta))]
    for k, v in meta.items():
        parts += [_varint(len(k)), k, _varint(len(v)), v]
    return b"".join([*parts, _varint(0), sync])


_ONE: Final = _varint(1)


#: Restarts of the container read after payloads that do not decode; past them the rest of the
#: batch is read payload by payload (as fast per record: bench/README.md, avro_bench.py), so a batch
#: of garbage costs one pass, not one copy of the rest per bad payload.
_RESTARTS: Final = 4


def _records(header: bytes, blocks: Sequence[bytes], payloads: Sequence[bytes], writer: Any,
             on_error: Callable[[int, Exception], None]) -> Iterator[Any]:
    """Each payload's record, in order; a payload that does not decode is reported to
    ``on_error(k, exception)`` and reading goes on from the next one."""
    start = 0
    for _ in range(_RESTARTS + 1):
        if start >= len(blocks):
            return
        k = start
        try:
            for record in fastavro.reader(io.BytesIO(b"".join([header, *blocks[start:]]))):
                yield record
                k += 1
            return
        except Exception as e:  # noqa: BLE001 - whatever the bytes make the reader raise is the reason
            on_error(k, e)
            start = k + 1
    for k in range(start, len(payloads)):
        try:
            record = fastavro.schemaless_reader(io.BytesIO(payloads[k]), writer, None)
        except Exception as e:  # noqa: BLE001 - as above
            on_error(k, e)
            continue
        yield record


def decode_avro(
    payloads: Sequence[bytes], schema: AvroPlan, target: pa.Schema, *, schema_id: int,
    positions: Sequence[int] | None = None,
) -> Converted:
    """The payloads of one schema id (each an Avro binary record, the wire header removed) as rows of
    ``target`` (the table's columns: fields by name; absent ones null). ``positions``: each payload's
    index in the batch (default 0..n-1), carried into :attr:`Converted.indices` and the rejects.
    Bytes after a whole record are ignored, as Confluent's deserializer ignores them."""
    where = list(range(len(payloads))) if positions is None else list(positions)
    if len(where) != len(payloads):
        raise ValueError(f"positions: expected one per payload ({len(payloads)}), found {len(where)}")
    sync = os.urandom(16)
    blocks = [b"".join((_ONE, _varint(len(p)), p, sync)) for p in payloads]
    failed: dict[int, str] = {}

    def on_error(k: int, e: Exception) -> None:
        failed[k] = f"Avro payload of schema id {schema_id} does not decode: {type(e).__name__}: {e}"

    rows = list(_records(_header(schema.writer, sync), blocks, payloads, schema.parsed, on_error))
    kept = [k for k in range(len(payloads)) if k not in failed]
    read = _zoned_as_strings(target, schema.zoned) if schema.zoned else target
    try:
        table = pa.Table.from_pylist(rows, schema=read)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        table, kept = _one_by_one(rows, kept, read, schema_id, failed)
    if read is not target:  # ZonedTimestamp strings to timestamptz: one Arrow cast
        table, kept = _zoned_cast(table, kept, target, schema.zoned, schema_id, failed)
    rejects = tuple(Reject(where[k], reason, None) for k, reason in sorted(failed.items()))
    return Converted(table, pa.array([where[k] for k in kept], pa.int64()), rejects)


def _zoned_as_strings(target: pa.Schema, zoned: frozenset[str]) -> pa.Schema:
    """``target`` with the timestamp columns at the ``zoned`` paths read as strings."""

    def walk(t: pa.DataType, path: str) -> pa.DataType:
        if path in zoned and pa.types.is_timestamp(t):
            return pa.string()
        if pa.types.is_struct(t):
            return pa.struct([f.with_type(walk(f.type, _join(path, f.name))) for f in t])
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            make = pa.large_list if pa.types.is_large_list(t) else pa.list_
            return make(t.value_field.with_type(walk(t.value_type, f"{path}[]")))
        if pa.types.is_map(t):
            return pa.map_(t.key_field, t.item_field.with_type(walk(t.item_type, f"{path}.value")))
        return t

    return pa.schema([f.with_type(walk(f.type, f.name)) for f in target], metadata=target.metadata)


def _zoned_cast(table: pa.Table, kept: list[int], target: pa.Schema, zoned: frozenset[str], schema_id: int,
                failed: dict[int, str]) -> tuple[pa.Table, list[int]]:
    """``table`` as ``target``: the ZonedTimestamp strings parsed in bulk by Arrow; when one is no
    timestamp with an offset, the rows that fail are found one by one and become rejects."""

    def cast(t: pa.Table) -> pa.Table:
        return pa.Table.from_arrays([_parse_zoned(t.column(f.name).combine_chunks(), f.type, f.name, zoned)
                                     for f in target], schema=target)

    try:
        return cast(table), kept
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    good, ok = [], []
    for i, k in enumerate(kept):  # rare: a bad ZonedTimestamp string
        try:
            good.append(cast(table.slice(i, 1)))
            ok.append(k)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            failed[k] = f"Avro record of schema id {schema_id}: a {ZONED} is not an ISO-8601 timestamp with an offset ({e})"
    return (pa.concat_tables(good) if good else target.empty_table()), ok


def _parse_zoned(arr: pa.Array, t: pa.DataType, path: str, zoned: frozenset[str]) -> pa.Array:
    """``arr`` (read with the zoned paths as strings) as type ``t``: those strings cast to timestamps.
    Children of a null struct are nulled first (they hold placeholders, not strings to parse)."""
    if path in zoned and pa.types.is_timestamp(t):
        return arr.cast(t)
    if pa.types.is_struct(t) and arr.type != t:
        children = arr.flatten()  # the struct's nulls carried into its children
        parts = [_parse_zoned(c, f.type, _join(path, f.name), zoned) for c, f in zip(children, t, strict=True)]
        return pa.StructArray.from_arrays(parts, fields=list(t), mask=arr.is_null())
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and arr.type != t:
        values = _parse_zoned(arr.values, t.value_type, f"{path}[]", zoned)
        return type(arr).from_arrays(arr.offsets, values, type=t, mask=arr.is_null())
    return arr.cast(t) if arr.type != t else arr


def _one_by_one(
    rows: list[Any], kept: list[int], target: pa.Schema, schema_id: int, failed: dict[int, str],
) -> tuple[pa.Table, list[int]]:
    """The rows that fit ``target`` (a batch where some do not: found one by one)."""
    good, ok = [], []
    for row, k in zip(rows, kept, strict=True):
        try:
            pa.Table.from_pylist([row], schema=target)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:
            failed[k] = f"Avro record of schema id {schema_id} does not fit the table: {type(e).__name__}: {e}"
            continue
        good.append(row)
        ok.append(k)
    return pa.Table.from_pylist(good, schema=target), ok
