"""Iceberg schema -> Spark schema, carrying Iceberg field ids into the Parquet files Spark writes.

Every ``StructField`` gets the metadata ``{"parquet.field.id": <iceberg field id>}``; Spark's
Parquet writer (``spark.sql.parquet.fieldId.write.enabled``, on by default) then stores the id in
the file footer, which is how Iceberg readers map file columns to table columns.

Spark has no ``StructField`` for a list element or a map key/value, so it writes no field id for
them. Readers then need the table's name mapping (``schema.name-mapping.default``) to read such
columns: see :func:`requires_name_mapping` and :func:`name_mapping_properties`.
"""

from __future__ import annotations

from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
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
)
from pyspark.sql import types as st

from icesink.errors import IcesinkError

__all__ = [
    "FIELD_ID_KEY",
    "UnsupportedTypeError",
    "name_mapping_properties",
    "requires_name_mapping",
    "spark_schema",
]

FIELD_ID_KEY = "parquet.field.id"


class UnsupportedTypeError(IcesinkError):
    """A table column has an Iceberg type that Spark's Parquet writer cannot write."""

    def __init__(self, column: str, iceberg_type: IcebergType) -> None:
        self.column = column
        self.iceberg_type = iceberg_type
        super().__init__(
            f"column {column!r} has Iceberg type {iceberg_type}, which Spark cannot write to Parquet: "
            "expected boolean, int, long, float, double, decimal, string, binary, date, timestamp, "
            "timestamptz, struct, list or map; change the column type or write this table without Spark"
        )


_PRIMITIVES: dict[type[IcebergType], st.DataType] = {
    BooleanType: st.BooleanType(),
    IntegerType: st.IntegerType(),
    LongType: st.LongType(),
    FloatType: st.FloatType(),
    DoubleType: st.DoubleType(),
    StringType: st.StringType(),
    BinaryType: st.BinaryType(),
    DateType: st.DateType(),
    TimestampType: st.TimestampNTZType(),
    TimestamptzType: st.TimestampType(),
}


def _spark_type(iceberg_type: IcebergType, path: str) -> st.DataType:
    if isinstance(iceberg_type, StructType):
        return st.StructType([_spark_field(f, path) for f in iceberg_type.fields])
    if isinstance(iceberg_type, ListType):
        return st.ArrayType(
            _spark_type(iceberg_type.element_type, f"{path}.element"),
            containsNull=not iceberg_type.element_required,
        )
    if isinstance(iceberg_type, MapType):
        return st.MapType(
            _spark_type(iceberg_type.key_type, f"{path}.key"),
            _spark_type(iceberg_type.value_type, f"{path}.value"),
            valueContainsNull=not iceberg_type.value_required,
        )
    if isinstance(iceberg_type, DecimalType):
        return st.DecimalType(iceberg_type.precision, iceberg_type.scale)
    spark_type = _PRIMITIVES.get(type(iceberg_type))
    if spark_type is None:
        # uuid, time, fixed, timestamp_ns, timestamptz_ns, unknown, variant, geometry...
        raise UnsupportedTypeError(path, iceberg_type)
    return spark_type


def _spark_field(field: NestedField, parent: str | None) -> st.StructField:
    path = field.name if parent is None else f"{parent}.{field.name}"
    return st.StructField(
        field.name,
        _spark_type(field.field_type, path),
        nullable=not field.required,
        metadata={FIELD_ID_KEY: field.field_id},
    )


def spark_schema(schema: Schema) -> st.StructType:
    """The Spark schema of an Iceberg schema, with Parquet field ids at every struct level.

    Raises :class:`UnsupportedTypeError` naming the column for types Spark cannot write
    (uuid, time, fixed, nanosecond timestamps, ...).
    """
    return st.StructType([_spark_field(f, None) for f in schema.fields])


def requires_name_mapping(schema: Schema) -> bool:
    """Whether Spark-written files of this schema lack some field ids (list or map columns)."""
    return any(isinstance(f.field_type, (ListType, MapType)) for f in _all_fields(schema.as_struct()))


def _all_fields(struct: StructType) -> list[NestedField]:
    out: list[NestedField] = []
    for field in struct.fields:
        out.append(field)
        out.extend(_nested_fields(field.field_type))
    return out


def _nested_fields(iceberg_type: IcebergType) -> list[NestedField]:
    if isinstance(iceberg_type, StructType):
        return _all_fields(iceberg_type)
    if isinstance(iceberg_type, ListType):
        return [iceberg_type.element_field, *_nested_fields(iceberg_type.element_type)]
    if isinstance(iceberg_type, MapType):
        return [
            iceberg_type.key_field,
            iceberg_type.value_field,
            *_nested_fields(iceberg_type.key_type),
            *_nested_fields(iceberg_type.value_type),
        ]
    return []


def name_mapping_properties(schema: Schema) -> dict[str, str]:
    """Table properties that let readers map Spark-written list/map columns by name.

    Set them when creating the table (``catalog.create_table(..., properties=...)``) or in the
    commit transaction (``tx.set_properties(...)``), as pyiceberg's own ``add_files`` does.
    pyiceberg keeps the mapping up to date on later schema changes.
    """
    return {TableProperties.DEFAULT_NAME_MAPPING: schema.name_mapping.model_dump_json()}
