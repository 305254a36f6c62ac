"""Kafka Connect schemas to Iceberg and Arrow: the column types of an auto-created table
(:func:`connect_iceberg_schema`), what a record's schema asks of a table (:func:`connect_arrow_schema`),
and the schema ``decode_json`` reads payloads with (:func:`decode_schema`). No I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Final

import pyarrow as pa
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

from icesink.shared.errors import UnsupportedTypeError


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


#: The start of the reason of every record that is no envelope.
NOT_ENVELOPE: Final = 'not a Kafka Connect envelope {"schema": ..., "payload": ...}'


def _group_error(schema: Any) -> ConnectSchemaError | None:
    if schema is None:
        return ConnectSchemaError(f"{NOT_ENVELOPE}: the schema is null (written with schemas.enable=false?)")
    if not isinstance(schema, dict) or schema.get("type") != "struct":
        kind = schema.get("type") if isinstance(schema, dict) else type(schema).__name__
        return ConnectSchemaError(f"Connect schema: the value schema is {kind!r}; a table row needs a struct")
    return None
