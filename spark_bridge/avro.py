"""Avro data files as Iceberg writes them, by Spark's Avro writer (``write.format.default=avro``).

Spark 4 has its Avro data source in spark-sql (:data:`spark_bridge.files.AVRO_SOURCE`; the short
name ``avro`` is registered only by the separate spark-avro module). Given the ``avroSchema``
option it writes that schema, its extra properties included, so :func:`avro_schema` gives it the
schema Iceberg's own Avro writer would (Java's ``TypeToSchema``): ``field-id`` on every field,
``element-id`` on arrays, ``key-id``/``value-id`` on maps, optional values as ``["null", T]``
unions, timestamps as ``timestamp-micros`` with ``adjust-to-utc``. Readers find every column by
its id, as in Iceberg's own files: no name mapping needed, renames read right.

Spark writes ``timestamp-micros`` from its TimestampType only (TimestampNTZ becomes
``local-timestamp-micros``, which Iceberg's reader refuses: "Unknown logical type"), so an
Iceberg ``timestamp`` column goes to Spark as a UTC timestamp of the same micros
(:func:`spark_types`, :func:`utc_timestamps`): the same long in the file.

No Spark session here: pyarrow, pyiceberg, JSON and pyspark's type classes.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from pyiceberg.schema import Schema, index_by_name
from pyiceberg.types import (
    BinaryType, BooleanType, DateType, DecimalType, DoubleType, FloatType, IcebergType, IntegerType, ListType,
    LongType, MapType, NestedField, StringType, StructType, TimestampType, TimestamptzType,
)
from pyspark.sql import types as st

__all__ = ["avro_schema", "avro_unwritable", "spark_types", "utc_timestamps"]

_PRIMITIVES: dict[type[IcebergType], Any] = {
    BooleanType: "boolean", IntegerType: "int", LongType: "long", FloatType: "float", DoubleType: "double",
    StringType: "string", BinaryType: "bytes", DateType: {"type": "int", "logicalType": "date"},
    TimestampType: {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": False},
    TimestamptzType: {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": True},
}


def avro_unwritable(schema: Schema) -> str | None:
    """Why Spark cannot write this schema's Avro files as Iceberg's (the column and its type), or None."""
    for name, field_id in sorted(index_by_name(schema).items(), key=lambda item: item[1]):
        t = schema.find_type(field_id)
        if isinstance(t, MapType) and not isinstance(t.key_type, StringType):
            return (f"column {name!r} is a map whose keys are not strings: Iceberg writes it to Avro as an array of "
                    "key-value records, which Spark's Avro writer cannot write a map as")
        if t.is_primitive and not isinstance(t, DecimalType) and type(t) not in _PRIMITIVES:
            return f"column {name!r} has type {t}, which Spark's Avro writer does not write as Iceberg's Avro type"
    return None


def avro_schema(schema: Schema) -> str:
    """The Avro schema (JSON) of Iceberg's Avro data files of ``schema``."""
    named: set[str] = set()  # a named Avro type is defined once, then referred to by name
    return json.dumps(_record(schema.as_struct(), "table", named))


def _record(struct: StructType, name: str, named: set[str]) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [_field(f, named) for f in struct.fields]}


def _field(field: NestedField, named: set[str]) -> dict[str, Any]:
    avro_type = _type(field.field_type, field.field_id, named)
    if field.required:
        return {"name": field.name, "type": avro_type, "field-id": field.field_id}
    return {"name": field.name, "type": ["null", avro_type], "default": None, "field-id": field.field_id}


def _optional(avro_type: Any, required: bool) -> Any:
    return avro_type if required else ["null", avro_type]


def _type(t: IcebergType, field_id: int, named: set[str]) -> Any:
    if isinstance(t, StructType):
        return _record(t, f"r{field_id}", named)
    if isinstance(t, ListType):
        return {"type": "array", "items": _optional(_type(t.element_type, t.element_id, named), t.element_required),
                "element-id": t.element_id}
    if isinstance(t, MapType):  # string keys (avro_unwritable refuses others)
        return {"type": "map", "values": _optional(_type(t.value_type, t.value_id, named), t.value_required),
                "key-id": t.key_id, "value-id": t.value_id}
    if isinstance(t, DecimalType):
        name = f"decimal_{t.precision}_{t.scale}"
        if name in named:
            return name
        named.add(name)
        size = next(n for n in range(1, 64) if 2 ** (8 * n - 1) > 10**t.precision)  # Iceberg's decimalRequiredBytes
        return {"type": "fixed", "name": name, "size": size, "logicalType": "decimal", "precision": t.precision,
                "scale": t.scale}
    return _PRIMITIVES[type(t)]


def spark_types(schema: st.StructType) -> st.StructType:
    """``schema`` with every TimestampNTZ a (UTC) Timestamp: what Spark writes as ``timestamp-micros``."""
    out = _spark_type(schema)
    assert isinstance(out, st.StructType)
    return out


def _spark_type(t: st.DataType) -> st.DataType:
    if isinstance(t, st.TimestampNTZType):
        return st.TimestampType()
    if isinstance(t, st.StructType):
        return st.StructType([st.StructField(f.name, _spark_type(f.dataType), f.nullable, f.metadata) for f in t.fields])
    if isinstance(t, st.ArrayType):
        return st.ArrayType(_spark_type(t.elementType), t.containsNull)
    if isinstance(t, st.MapType):
        return st.MapType(_spark_type(t.keyType), _spark_type(t.valueType), t.valueContainsNull)
    return t


def utc_timestamps(data: pa.Table) -> pa.Table:
    """``data`` with every timestamp without a zone (nested too) read as UTC: the same micros."""
    schema = pa.schema([f.with_type(_utc(f.type)) for f in data.schema])
    return data if schema.equals(data.schema) else data.cast(schema)


def _utc(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t) and t.tz is None:
        return pa.timestamp(t.unit, tz="UTC")
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_utc(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_utc(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_utc(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_utc(t.key_type)), t.item_field.with_type(_utc(t.item_type)))
    return t
