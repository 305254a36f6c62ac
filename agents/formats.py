"""Record formats around :func:`agents.convert.decode_json`: the Kafka Connect schema envelope,
and the record key and Kafka metadata as columns.

Connect envelope (``value.converter.schemas.enable=true``)
---------------------------------------------------------
JsonConverter writes each value as ``{"schema": {...}, "payload": {...}}``. The schema of each
record travels with it; a topic usually carries one or a few distinct schemas. A batch is split
into (schema text, payload bytes) per record with byte searches, grouped by identical schema
text, each distinct schema parsed once (cached), and each group's payloads decoded in bulk by
``decode_json``. The Connect schema decides:

- the column types of an auto-created table (:func:`connect_iceberg_schema`: logical types
  Timestamp -> timestamptz, Date -> date, Time -> time, Decimal -> decimal, Debezium's time,
  UUID and JSON names, ``optional`` -> not required);
- how JSON values are read into an existing table's columns: the table schema is the truth, the
  record's schema says the encoding (a Connect Timestamp is epoch milliseconds, a Decimal is
  base64 of the unscaled bytes), given to decode_json as Arrow field metadata
  (``icesink.epoch-unit``, ``icesink.decimal-encoding``; see :func:`decode_schema`);
- with schema evolution, what the table needs (:func:`connect_arrow_schema`, given to the
  ``grow`` of :meth:`RecordFormat.convert`: agents.evolution.Growth).

A record whose envelope is malformed (no ``schema`` or ``payload``, a schema that is not a
Connect struct schema, a Decimal whose scale differs from the column's) is a :class:`Reject`
naming the reason; it goes to the dead letters like any other bad record.

Key and metadata columns
------------------------
``iceberg.tables.key-column`` names a column holding the record key (a string for the String
and JSON key converters, binary for ByteArrayConverter). ``iceberg.tables.kafka-metadata-enabled``
adds the source position as the reference's KafkaMetadataTransform does: columns
``<field>_topic``, ``_partition``, ``_offset``, ``_timestamp`` and ``_headers`` (or, nested, a
struct ``<field>`` with those children), ``<field>`` defaulting to ``_kafka_metadata``. These
columns are built from the messages with Arrow, never read from the value. An existing table
gets those of them it has (a ``long`` timestamp column, as the reference SMT creates, gets epoch
milliseconds).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
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
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from agents.convert import Converted, EpochUnit, Reject, decode_json, infer_schema, struct_array
from icesink.schema_changes import iceberg_schema
from icesink.config import BYTES_CONVERTER, Settings
from icesink.errors import ConfigError, UnsupportedTypeError
from icesink.writable_types import arrow_only_column

__all__ = [
    "ConnectSchemaError",
    "Envelopes",
    "Grow",
    "RecordFormat",
    "connect_arrow_schema",
    "connect_iceberg_schema",
    "decode_envelopes",
    "decode_schema",
    "split_envelope",
]

#: Schema-driven evolution (agents.evolution.Growth): the stated schemas of a batch's record
#: groups -> the table schema to decode the batch against.
Grow: TypeAlias = Callable[[Sequence[pa.Schema]], pa.Schema]
#: Decodes the value columns of a batch against a schema, growing it first if given a Grow.
ValueDecoder: TypeAlias = Callable[[pa.Schema, "Grow | None"], Converted]


EPOCH_UNIT: Final = b"icesink.epoch-unit"
DECIMAL_ENCODING: Final = b"icesink.decimal-encoding"
CONNECT_BYTES: Final = b"connect-bytes"

_CONNECT = "org.apache.kafka.connect.data."
_DEBEZIUM_TIME = "io.debezium.time."
#: Logical names whose values are numbers counting a unit since the epoch (or since midnight).
EPOCH_UNITS: Final[Mapping[str, str]] = {
    _CONNECT + "Timestamp": "ms",
    _CONNECT + "Time": "ms",
    _DEBEZIUM_TIME + "Timestamp": "ms",
    _DEBEZIUM_TIME + "MicroTimestamp": "us",
    _DEBEZIUM_TIME + "NanoTimestamp": "ns",
    _DEBEZIUM_TIME + "Time": "ms",
    _DEBEZIUM_TIME + "MicroTime": "us",
    _DEBEZIUM_TIME + "NanoTime": "ns",
}
DECIMAL: Final = _CONNECT + "Decimal"
#: Logical name -> (Connect types it may annotate, Iceberg type).
_LOGICAL: Final[Mapping[str, tuple[frozenset[str], IcebergType]]] = {
    _CONNECT + "Timestamp": (frozenset({"int64"}), TimestamptzType()),
    _CONNECT + "Date": (frozenset({"int32"}), DateType()),
    _CONNECT + "Time": (frozenset({"int32"}), TimeType()),
    _DEBEZIUM_TIME + "Timestamp": (frozenset({"int64"}), TimestampType()),
    _DEBEZIUM_TIME + "MicroTimestamp": (frozenset({"int64"}), TimestampType()),
    _DEBEZIUM_TIME + "NanoTimestamp": (frozenset({"int64"}), TimestampType()),
    _DEBEZIUM_TIME + "ZonedTimestamp": (frozenset({"string"}), TimestamptzType()),
    _DEBEZIUM_TIME + "Date": (frozenset({"int32"}), DateType()),
    _DEBEZIUM_TIME + "Time": (frozenset({"int32"}), TimeType()),
    _DEBEZIUM_TIME + "MicroTime": (frozenset({"int64"}), TimeType()),
    _DEBEZIUM_TIME + "NanoTime": (frozenset({"int64"}), TimeType()),
    "io.debezium.data.Uuid": (frozenset({"string"}), UUIDType()),
    "io.debezium.data.Json": (frozenset({"string"}), StringType()),
}
_PRIMITIVE: Final[Mapping[str, IcebergType]] = {
    "int8": IntegerType(),
    "int16": IntegerType(),
    "int32": IntegerType(),
    "int64": LongType(),
    "float32": FloatType(),
    "float64": DoubleType(),
    "boolean": BooleanType(),
    "string": StringType(),
    "bytes": BinaryType(),
}
_DECIMAL_PRECISION: Final = "connect.decimal.precision"
_MAX_PRECISION: Final = 38
_SCHEMA_CACHE: Final = 256


# --------------------------------------------------------------------------------------------
# Connect schema -> Iceberg schema
# --------------------------------------------------------------------------------------------


class ConnectSchemaError(ValueError):
    """A Connect schema that is malformed or cannot map to a table (a data error per record)."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


def _fields(schema: Mapping[str, Any], path: str) -> list[Mapping[str, Any]]:
    fields = schema.get("fields")
    if not isinstance(fields, list) or not all(isinstance(f, dict) for f in fields):
        raise ConnectSchemaError("Connect schema: a struct needs a list of field schemas in 'fields'", path or None)
    for f in fields:
        if not isinstance(f.get("field"), str):
            raise ConnectSchemaError("Connect schema: a struct field needs a 'field' name", path or None)
    return fields


def _child(schema: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    child = schema.get(key)
    if not isinstance(child, dict):
        raise ConnectSchemaError(f"Connect schema: {schema.get('type')} needs a schema in {key!r}", path or None)
    return child


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _decimal_type(schema: Mapping[str, Any], path: str) -> DecimalType:
    params = schema.get("parameters") or {}
    try:
        scale = int(params["scale"])
        precision = int(params.get(_DECIMAL_PRECISION, _MAX_PRECISION))
    except (KeyError, TypeError, ValueError):
        raise ConnectSchemaError(
            f"Connect schema: a Decimal needs an integer 'scale' parameter, found {params!r}", path or None,
        ) from None
    if not 0 <= scale <= precision <= _MAX_PRECISION:
        raise ConnectSchemaError(
            f"Connect schema: Decimal precision {precision} and scale {scale} do not fit "
            f"0 <= scale <= precision <= {_MAX_PRECISION}",
            path or None,
        )
    return DecimalType(precision, scale)


class _Ids:
    """Placeholder field ids (renumbered by assign_fresh_schema_ids)."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def __call__(self) -> int:
        return next(self._next)


def _iceberg_type(schema: Mapping[str, Any], path: str, ids: _Ids) -> IcebergType:
    kind = schema.get("type")
    name = schema.get("name")
    if name == DECIMAL and kind == "bytes":
        return _decimal_type(schema, path)
    if isinstance(name, str) and name in _LOGICAL:
        kinds, logical = _LOGICAL[name]
        if kind not in kinds:
            raise ConnectSchemaError(
                f"Connect schema: logical type {name} annotates {'/'.join(sorted(kinds))}, found {kind!r}",
                path or None,
            )
        return logical
    if kind == "struct":
        return StructType(*_nested_fields(schema, path, ids))
    if kind == "array":
        items = _child(schema, "items", path)
        element = _iceberg_type(items, f"{path}[]", ids)
        return ListType(ids(), element, element_required=not items.get("optional", False))
    if kind == "map":
        keys, values = _child(schema, "keys", path), _child(schema, "values", path)
        key_type = _iceberg_type(keys, f"{path}.key", ids)
        if not key_type.is_primitive:  # JsonConverter writes other keys as [key, value] pairs: read as such
            raise UnsupportedTypeError(
                path, f"map<{keys.get('type')}, ...>", "Connect maps keyed by a struct, array or map are not "
                "supported:", "map<K, X> with K a primitive type", "key the map by a primitive value",
            )
        value_type = _iceberg_type(values, f"{path}.value", ids)
        return MapType(ids(), key_type, ids(), value_type, value_required=not values.get("optional", False))
    primitive = _PRIMITIVE.get(kind) if isinstance(kind, str) else None
    if primitive is None:
        raise ConnectSchemaError(
            f"Connect schema: unknown type {kind!r} (expected one of {', '.join(_PRIMITIVE)}, struct, array, map)",
            path or None,
        )
    return primitive


def _nested_fields(schema: Mapping[str, Any], path: str, ids: _Ids) -> list[NestedField]:
    out = []
    for f in _fields(schema, path):
        name = f["field"]
        out.append(NestedField(
            ids(), name, _iceberg_type(f, _join(path, name), ids), required=not f.get("optional", False),
            doc=f.get("doc") if isinstance(f.get("doc"), str) else None,
        ))
    return out


def connect_iceberg_schema(schema: Mapping[str, Any]) -> Schema:
    """The Iceberg schema of a table for records of this Connect (struct) schema.

    Raises :class:`ConnectSchemaError` for a malformed schema or one that is not a struct, and
    :class:`UnsupportedTypeError` for maps keyed by a struct, array or map.
    """
    if not isinstance(schema, dict):
        raise ConnectSchemaError(f"Connect schema: expected a JSON object, found {type(schema).__name__}")
    if schema.get("type") != "struct":
        raise ConnectSchemaError(
            f"Connect schema: the value schema is {schema.get('type')!r}; a table row needs a struct"
        )
    return assign_fresh_schema_ids(Schema(*_nested_fields(schema, "", _Ids())))


def connect_arrow_schema(schema: Mapping[str, Any]) -> pa.Schema | None:
    """The Arrow schema (no field ids) of :func:`connect_iceberg_schema`: what a record of this
    Connect schema needs of a table. None for a schema that cannot map (its records are rejects)."""
    try:
        return schema_to_pyarrow(connect_iceberg_schema(schema), include_field_ids=False)
    except (ConnectSchemaError, UnsupportedTypeError):
        return None


# --------------------------------------------------------------------------------------------
# Table schema + Connect schema -> the schema decode_json reads payloads with
# --------------------------------------------------------------------------------------------


def _encoding(t: pa.DataType, connect: Mapping[str, Any], path: str) -> dict[bytes, bytes]:
    """Field metadata saying how a JSON value of this Connect schema encodes a column of type ``t``."""
    name = connect.get("name")
    if name == DECIMAL and connect.get("type") == "bytes" and pa.types.is_decimal(t):
        scale = _decimal_type(connect, path).scale
        if scale != t.scale:
            raise ConnectSchemaError(
                f"Connect Decimal with scale {scale} cannot fill column decimal({t.precision}, {t.scale}): "
                "the unscaled bytes would be read with the wrong scale",
                path,
            )
        return {DECIMAL_ENCODING: CONNECT_BYTES}
    unit = EPOCH_UNITS.get(name) if isinstance(name, str) else None
    if unit is not None and (pa.types.is_timestamp(t) or pa.types.is_time(t)):
        return {EPOCH_UNIT: unit.encode()}
    return {}


def _decode_fields(
    fields: Sequence[pa.Field], connect: Mapping[str, Any], path: str, fold_case: bool,
) -> list[pa.Field]:
    """``fields`` with the encodings of the Connect struct schema's fields of the same name
    (ignoring case with ``fold_case``; the exact spelling first)."""
    listed = _fields(connect, path)
    by_name = {c["field"]: c for c in listed}
    by_lower: dict[str, Mapping[str, Any]] = {}
    if fold_case:
        for entry in listed:
            by_lower.setdefault(entry["field"].lower(), entry)  # the first spelling, as values fold
    out = []
    for f in fields:
        c = by_name.get(f.name) or by_lower.get(f.name.lower())
        out.append(f if c is None else _decode_field(f, c, _join(path, f.name), fold_case))
    return out


def _decode_field(f: pa.Field, connect: Mapping[str, Any], path: str, fold_case: bool) -> pa.Field:
    t = f.type
    if pa.types.is_struct(t) and connect.get("type") == "struct":
        return f.with_type(pa.struct(_decode_fields(list(t), connect, path, fold_case)))
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and connect.get("type") == "array":
        element = _decode_field(t.value_field, _child(connect, "items", path), f"{path}[]", fold_case)
        return f.with_type(pa.large_list(element) if pa.types.is_large_list(t) else pa.list_(element))
    if pa.types.is_map(t) and connect.get("type") == "map":
        key = _decode_field(t.key_field, _child(connect, "keys", path), f"{path}.key", fold_case)
        item = _decode_field(t.item_field, _child(connect, "values", path), f"{path}.value", fold_case)
        return f.with_type(pa.map_(key, item, keys_sorted=t.keys_sorted))
    extra = _encoding(t, connect, path)
    if not extra:
        return f
    return f.with_metadata({**(f.metadata or {}), **extra})


def decode_schema(target: pa.Schema, connect: Mapping[str, Any], *, fold_case: bool = False) -> pa.Schema:
    """``target`` (the table's columns: the truth) with each field's encoding taken from the
    record's Connect schema as decode_json field metadata. Columns the Connect schema lacks stay
    as they are (null when absent); Connect fields the table lacks are ignored. ``fold_case``:
    Connect fields name columns ignoring case (``schema-case-insensitive``)."""
    error = _group_error(connect)
    if error is not None:
        raise error
    try:
        connect_iceberg_schema(connect)  # the whole record schema must be well formed
    except UnsupportedTypeError:
        pass  # a column the table may not have; decode_json refuses it if the table does
    return pa.schema(_decode_fields(list(target), connect, "", fold_case), metadata=target.metadata)


# --------------------------------------------------------------------------------------------
# Envelopes
# --------------------------------------------------------------------------------------------

_HEAD: Final = re.compile(rb'\s*\{\s*"schema"\s*:\s*')
_SEP: Final = b',"payload":'
_WS: Final = " \t\r\n"
_NOT_ENVELOPE: Final = 'not a Kafka Connect envelope {"schema": ..., "payload": ...}'


def _split_fast(value: bytes) -> tuple[bytes, bytes] | None:
    """(schema text, payload bytes) of JsonConverter's compact output, or None to look closer.
    A wrong cut (a "payload" key inside the schema) yields schema text that does not parse."""
    head = _HEAD.match(value)
    if head is None:
        return None
    cut = value.find(_SEP, head.end())
    end = len(value.rstrip())
    if cut < 0 or value[end - 1 : end] != b"}":
        return None
    return value[head.end() : cut], value[cut + len(_SEP) : end - 1]


def split_envelope(value: bytes | None) -> tuple[Any, bytes] | str:
    """(parsed schema, payload bytes) of one envelope in any key order and spacing, or the
    reason it is not one. The per-record path: the bulk path uses byte searches."""
    if value is None:
        return f"{_NOT_ENVELOPE}: the record value is null (a tombstone)"
    try:
        text = bytes(value).decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        return f"malformed JSON: invalid UTF-8 at byte {exc.start} ({exc.reason})"
    decoder = json.JSONDecoder()
    found: dict[str, tuple[int, int, Any]] = {}
    i = len(text) - len(text.lstrip(_WS))
    try:
        if text[i : i + 1] != "{":
            return f"{_NOT_ENVELOPE}: the value is not a JSON object"
        i += 1
        while True:
            i += len(text[i:]) - len(text[i:].lstrip(_WS))
            if text[i : i + 1] == "}" and not found:
                break
            key, i = decoder.raw_decode(text, i)
            i += len(text[i:]) - len(text[i:].lstrip(_WS))
            if text[i : i + 1] != ":" or not isinstance(key, str):
                raise ValueError("expected a key and ':'")
            i += 1
            i += len(text[i:]) - len(text[i:].lstrip(_WS))
            start = i
            item, i = decoder.raw_decode(text, i)
            if key in found:
                return f"{_NOT_ENVELOPE}: duplicate key {key!r}"
            found[key] = (start, i, item)
            i += len(text[i:]) - len(text[i:].lstrip(_WS))
            if text[i : i + 1] == ",":
                i += 1
                continue
            if text[i : i + 1] == "}":
                break
            raise ValueError("expected ',' or '}'")
        if text[i + 1 :].strip(_WS):
            raise ValueError("text after the object")
    except (ValueError, RecursionError) as exc:
        return f"malformed JSON: {exc}"
    missing = [k for k in ("schema", "payload") if k not in found]
    if missing:
        hint = " (was it written with value.converter.schemas.enable=false?)" if len(missing) == 2 else ""
        return f"{_NOT_ENVELOPE}: no {' or '.join(repr(k) for k in missing)} key{hint}"
    start, end, _ = found["payload"]
    return found["schema"][2], text[start:end].encode()


@dataclass(frozen=True)
class Group:
    schema: Any  # the parsed Connect schema
    indices: list[int]
    payloads: list[bytes]


_NOT_JSON: Final = object()


class Envelopes:
    """Splits batches of envelopes and groups them by schema; parsed schemas are cached."""

    def __init__(self) -> None:
        self._parsed: dict[bytes, Any] = {}  # schema text -> parsed schema, or _NOT_JSON

    def _parse(self, text: bytes) -> Any:
        try:
            return self._parsed[text]
        except KeyError:
            pass
        if len(self._parsed) >= _SCHEMA_CACHE:
            self._parsed.clear()
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            parsed = _NOT_JSON
        self._parsed[text] = parsed
        return parsed

    def group(self, values: Sequence[bytes | None]) -> tuple[list[Group], list[Reject]]:
        """Records grouped by identical schema text (input order within a group), and the
        records that are no envelope."""
        by_text: dict[bytes, list[int]] = {}
        schemas: dict[bytes, Any] = {}
        payloads: list[bytes] = [b""] * len(values)
        slow: list[int] = []
        for i, value in enumerate(values):
            parts = _split_fast(value) if value is not None else None
            parsed = self._parse(parts[0]) if parts is not None else _NOT_JSON
            if parts is None or parsed is _NOT_JSON:  # not compact JsonConverter output, or a wrong cut
                slow.append(i)
                continue
            by_text.setdefault(parts[0], []).append(i)
            schemas[parts[0]] = parsed
            payloads[i] = parts[1]
        rejects: list[Reject] = []
        for i in slow:
            found = split_envelope(values[i])
            if isinstance(found, str):
                rejects.append(Reject(i, found, None))
                continue
            text = json.dumps(found[0], sort_keys=True).encode()
            by_text.setdefault(text, []).append(i)
            schemas[text] = found[0]
            payloads[i] = found[1]
        groups = []
        for text, indices in by_text.items():
            indices.sort()
            groups.append(Group(schemas[text], indices, [payloads[i] for i in indices]))
        return groups, rejects


def _group_error(schema: Any) -> ConnectSchemaError | None:
    if schema is None:
        return ConnectSchemaError(f"{_NOT_ENVELOPE}: the schema is null (written with schemas.enable=false?)")
    if not isinstance(schema, dict) or schema.get("type") != "struct":
        kind = schema.get("type") if isinstance(schema, dict) else type(schema).__name__
        return ConnectSchemaError(f"Connect schema: the value schema is {kind!r}; a table row needs a struct")
    return None


# --------------------------------------------------------------------------------------------
# Key and metadata columns
# --------------------------------------------------------------------------------------------

_META_TYPES: Final[Mapping[str, tuple[pa.DataType, IcebergType]]] = {
    "topic": (pa.string(), StringType()),
    "partition": (pa.int32(), IntegerType()),
    "offset": (pa.int64(), LongType()),
    "timestamp": (pa.timestamp("us", tz="UTC"), TimestamptzType()),
    "headers": (
        pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
        ListType(0, StructType(NestedField(0, "key", StringType()), NestedField(0, "value", BinaryType()))),
    ),
}


@dataclass(frozen=True)
class _Extras:
    """The columns built from the messages rather than the value."""

    key_column: str | None
    key_binary: bool
    metadata: str | None  # field name (or prefix), None when off
    nested: bool

    def names(self) -> set[str]:
        out = {self.key_column} if self.key_column else set()
        if self.metadata:
            out |= {self.metadata} if self.nested else {f"{self.metadata}_{k}" for k in _META_TYPES}
        return out

    def iceberg_fields(self) -> list[NestedField]:
        out = []
        if self.key_column:
            out.append(NestedField(0, self.key_column, BinaryType() if self.key_binary else StringType()))
        if self.metadata:
            meta = [NestedField(0, k, t) for k, (_, t) in _META_TYPES.items()]
            if self.nested:
                out.append(NestedField(0, self.metadata, StructType(*meta)))
            else:
                out += [NestedField(0, f"{self.metadata}_{f.name}", f.field_type) for f in meta]
        return out

    def columns(self, messages: Sequence[Any], target: pa.Schema) -> tuple[dict[str, pa.Array], list[Reject]]:
        """The extra columns ``target`` has, for every message; keys that cannot fill the key column are rejects."""
        out: dict[str, pa.Array] = {}
        rejects: list[Reject] = []
        names = set(target.names)
        if self.key_column and self.key_column in names:
            out[self.key_column], rejects = self._keys(messages, target.field(self.key_column).type)
        if not self.metadata:
            return out, rejects
        wanted = {k for k in _META_TYPES if (self.metadata if self.nested else f"{self.metadata}_{k}") in names}
        if not wanted:
            return out, rejects
        meta = _metadata_arrays(messages, wanted if not self.nested else set(_META_TYPES))
        if self.nested:
            t = target.field(self.metadata).type
            if not pa.types.is_struct(t):
                raise ConfigError("iceberg.tables.kafka-metadata-field", self.metadata,
                                  f"a struct column for nested Kafka metadata (the table has {t})")
            children = [_fit(meta[c.name], c.type, f"{self.metadata}.{c.name}") if c.name in meta
                        else pa.nulls(len(messages), c.type) for c in t]
            out[self.metadata] = struct_array(children, t, len(messages))
        else:
            for k in wanted:
                name = f"{self.metadata}_{k}"
                out[name] = _fit(meta[k], target.field(name).type, name)
        return out, rejects

    def _keys(self, messages: Sequence[Any], t: pa.DataType) -> tuple[pa.Array, list[Reject]]:
        raw = pa.array([m.key for m in messages], pa.binary())
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return raw.cast(t), []
        try:
            return raw.cast(t), []
        except pa.ArrowInvalid:
            pass
        rejects, keys = [], []
        for i, m in enumerate(messages):  # rare: find the keys that are not UTF-8
            try:
                keys.append(None if m.key is None else bytes(m.key).decode("utf-8"))
            except UnicodeDecodeError as exc:
                keys.append(None)
                rejects.append(Reject(i, f"record key is not UTF-8 text (byte {exc.start}: {exc.reason})",
                                      self.key_column))
        return pa.array(keys, t), rejects


def _metadata_arrays(messages: Sequence[Any], wanted: set[str]) -> dict[str, pa.Array]:
    n = len(messages)
    out: dict[str, pa.Array] = {}
    if "topic" in wanted:
        out["topic"] = pa.array([m.topic for m in messages], pa.string())
    if "partition" in wanted:
        out["partition"] = pa.array(np.fromiter((m.partition for m in messages), np.int32, n))
    if "offset" in wanted:
        out["offset"] = pa.array(np.fromiter((m.offset for m in messages), np.int64, n))
    if "timestamp" in wanted:  # aiokafka's records: ms since the epoch; Kafka's -1 means none
        ms = np.fromiter((-1 if m.timestamp is None else m.timestamp for m in messages), np.int64, n)
        missing = ms < 0
        out["timestamp"] = pa.array(np.where(missing, 0, ms), mask=missing)
    if "headers" in wanted:
        out["headers"] = _headers(messages)
    return out


def _headers(messages: Sequence[Any]) -> pa.Array:
    t = _META_TYPES["headers"][0]
    lists = [_header_pairs(m.headers) for m in messages]
    offsets = np.zeros(len(lists) + 1, dtype=np.int32)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    pairs = [p for x in lists for p in x]
    keys = pa.array([k for k, _ in pairs], pa.string())
    values = pa.array([None if v is None else bytes(v) for _, v in pairs], pa.binary())
    entries = pa.StructArray.from_arrays([keys, values], fields=list(t.value_type))
    return pa.ListArray.from_arrays(pa.array(offsets), entries, type=t)


def _header_pairs(headers: Any) -> list[tuple[str, Any]]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k), v) for k, v in items]


def _fit(arr: pa.Array, t: pa.DataType, column: str) -> pa.Array:
    """A metadata array as the column type of an existing table (epoch ms for integer timestamps)."""
    if arr.type.equals(t):
        return arr
    if pa.types.is_timestamp(t) and pa.types.is_int64(arr.type):
        return arr.cast(pa.timestamp("ms", tz=t.tz)).cast(t)
    try:
        return arr.cast(t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ConfigError("iceberg.tables.kafka-metadata-enabled", True,
                          f"a table column {column!r} that can hold the Kafka metadata, not {t} ({exc})") from None


# --------------------------------------------------------------------------------------------
# The record format of a worker
# --------------------------------------------------------------------------------------------


class RecordFormat:
    """How a worker turns a partition's messages into rows of one table, per its settings."""

    def __init__(self, settings: Settings) -> None:
        self.envelope = settings.value_converter_schemas_enable
        metadata = settings.kafka_metadata_field if settings.kafka_metadata else None
        self.extras = _Extras(
            settings.key_column, settings.key_converter == BYTES_CONVERTER, metadata, settings.kafka_metadata_nested,
        )
        self.plain = not self.envelope and not self.extras.names()
        self.fold_case = settings.schema_case_insensitive
        self._envelopes = Envelopes()

    def table_schema(
        self, values: Sequence[bytes], *, timestamp_fields: re.Pattern[str] | None = None
    ) -> pa.Schema | Schema | None:
        """The schema of an auto-created table for these records (None: no record tells it).
        ``timestamp_fields``: a regex of JSON string fields to create as timestamps."""
        if self.plain:
            return infer_schema(values, timestamp_fields=timestamp_fields)
        if self.envelope:
            schema = None
            for value in values:
                parts = split_envelope(value)
                if isinstance(parts, str):
                    continue
                try:
                    schema = connect_iceberg_schema(parts[0])
                    break
                except ConnectSchemaError:
                    continue  # that record is a reject
            if schema is None:
                return None
        else:
            schema = iceberg_schema(infer_schema(values, timestamp_fields=timestamp_fields))
        return self.with_extras(schema)

    def with_extras(self, schema: pa.Schema | Schema) -> Schema:
        """An auto-created table's schema: the value columns, then the key and metadata columns.
        Raises UnsupportedTypeError naming a column that cannot be filled or written."""
        schema = iceberg_schema(schema)
        decode_json([], schema_to_pyarrow(schema))  # raises UnsupportedTypeError naming the column
        schema = assign_fresh_schema_ids(Schema(*schema.fields, *self.extras.iceberg_fields()))
        arrow_only_column(schema)  # likewise for types no writer can write (Spark or pyarrow)
        return schema

    def convert(
        self, messages: Sequence[Any], values: Sequence[bytes], target: pa.Schema | None, *,
        epoch_unit: EpochUnit = "ms", grow: Grow | None = None, decode_values: ValueDecoder | None = None,
    ) -> Converted:
        """Rows of ``target`` (a table's Arrow schema) for ``messages``; the rest are rejects.
        ``target`` None: the table does not exist and no record could create it.

        ``grow`` (schema-driven evolution, envelope values or ``decode_values``): given the
        stated schemas of the value columns, returns the table schema to decode against.
        ``decode_values``: decodes the value columns instead of this format (a transform such
        as Debezium's); the key and metadata columns are added to its rows all the same."""
        if self.plain and decode_values is None:
            assert target is not None
            return decode_json(values, target, epoch_unit=epoch_unit, fold_case=self.fold_case)
        extra = self.extras.names()
        full = target

        def values_of(schema: pa.Schema) -> pa.Schema:
            return pa.schema([f for f in schema if f.name not in extra], metadata=schema.metadata) if extra else schema

        def grow_values(wanted: Sequence[pa.Schema]) -> pa.Schema:
            nonlocal full
            assert grow is not None
            full = grow(wanted)  # the key and metadata columns never evolve: not in the values
            return values_of(full)

        value_schema = values_of(target) if target is not None else None
        if decode_values is not None:
            assert value_schema is not None
            converted = decode_values(value_schema, grow_values if grow is not None else None)
        elif self.envelope:
            groups, rejects = self._envelopes.group([m.value for m in messages])
            if grow is not None and value_schema is not None:
                value_schema = grow_values([w for g in groups if (w := connect_arrow_schema(g.schema)) is not None])
            converted = decode_envelopes(groups, rejects, value_schema, fold_case=self.fold_case)
        else:
            assert value_schema is not None
            converted = decode_json(values, value_schema, epoch_unit=epoch_unit, fold_case=self.fold_case)
        if full is None or not extra:
            return converted
        columns, key_rejects = self.extras.columns(messages, full)
        return _assemble(converted, columns, key_rejects, full)


def decode_envelopes(
    groups: Sequence[Group], rejects: list[Reject], target: pa.Schema | None,
    decode_as: Callable[[Any], pa.Schema] | None = None, *, fold_case: bool = False,
) -> Converted:
    """Each group's payloads decoded in bulk against ``decode_as(its Connect schema)`` (default:
    :func:`decode_schema` of ``target``), as ``target``, in input order. A group whose schema
    cannot fill the table (``ConnectSchemaError``) is rejects, naming why. ``fold_case``: keys
    and Connect fields name columns ignoring case, at every level."""
    tables: list[pa.Table] = []
    indices: list[npt.NDArray[np.int64]] = []
    rejects = list(rejects)
    for g in groups:
        try:
            if target is None:
                raise ConnectSchemaError("the table does not exist and no record of the batch could create it")
            schema = decode_schema(target, g.schema, fold_case=fold_case) if decode_as is None else decode_as(g.schema)
        except ConnectSchemaError as exc:
            rejects += [Reject(i, exc.reason, exc.field) for i in g.indices]
            continue
        part = decode_json(g.payloads, schema, fold_case=fold_case)
        positions = np.asarray(g.indices, dtype=np.int64)
        rejects += [Reject(int(positions[r.index]), r.reason, r.field) for r in part.rejects]
        tables.append(part.table.cast(target))
        indices.append(positions[part.indices.to_numpy()])
    table = pa.concat_tables(tables) if tables else (target or pa.schema([])).empty_table()
    order = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    if len(tables) > 1:  # groups interleave: back to input order
        sort = np.argsort(order, kind="stable")
        table, order = table.take(pa.array(sort)), order[sort]
    return Converted(table, pa.array(order, pa.int64()), tuple(sorted(rejects, key=lambda r: r.index)))


def _assemble(converted: Converted, columns: dict[str, pa.Array], key_rejects: list[Reject], target: pa.Schema) -> Converted:
    """The decoded value columns and the extra columns (taken at the decoded rows), as ``target``."""
    rows = converted.indices
    table = converted.table
    rejects = list(converted.rejects)
    if key_rejects:
        bad = pa.array(np.isin(rows.to_numpy(), [r.index for r in key_rejects]))
        keep = pc.invert(bad)
        table, rows = table.filter(keep), rows.filter(keep)
        rejects = sorted(rejects + key_rejects, key=lambda r: r.index)
    arrays = []
    for f in target:
        if f.name in columns:
            arrays.append(columns[f.name].take(rows))
        else:
            arrays.append(table.column(f.name).combine_chunks() if table.num_rows else pa.array([], f.type))
    out = pa.Table.from_arrays(arrays, schema=target)
    return Converted(out, rows, tuple(rejects))
