"""Which Iceberg types icesink's file writers can write: a leaf (pyiceberg types only, no
pyspark), so the worker checks a new table's schema without loading Spark.

Spark's Parquet writer (spark_bridge/schema.py maps these types to Spark's) writes
:data:`SPARK_PRIMITIVES`, decimals, structs, lists and maps. It has no type for Iceberg's uuid
(FIXED_LEN_BYTE_ARRAY(16) with the UUID logical type) and fixed[n]: tables with such columns are
written with pyarrow instead (:data:`ARROW_ONLY_TYPES`, :func:`arrow_only_column`).
Format-version 3 types (timestamp_ns, timestamptz_ns, unknown...) are refused: pyarrow could
write them, but pyiceberg 0.12, which commits, cannot write format-version 3 metadata.
"""

from __future__ import annotations

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from icesink.shared.errors import UnsupportedTypeError

__all__ = ["ARROW_ONLY_TYPES", "SPARK_PRIMITIVES", "arrow_only_column", "unsupported"]

#: Primitive types Spark's Parquet writer writes (decimals too, with their precision and scale).
SPARK_PRIMITIVES: frozenset[type[IcebergType]] = frozenset({
    BooleanType, IntegerType, LongType, FloatType, DoubleType, StringType, BinaryType, DateType,
    TimestampType, TimestamptzType, TimeType,  # time needs spark.sql.timeType.enabled (Spark 4.1+)
})

#: Types Spark's Parquet writer has no type for, written with pyarrow instead.
ARROW_ONLY_TYPES: tuple[type[IcebergType], ...] = (UUIDType, FixedType)


def unsupported(column: str, iceberg_type: IcebergType) -> UnsupportedTypeError:
    """A table column has an Iceberg type that neither Spark nor the pyarrow writer can write."""
    return UnsupportedTypeError(
        column, iceberg_type, "icesink cannot write Iceberg type",
        "boolean, int, long, float, double, decimal, string, binary, fixed, uuid, date, time, timestamp, "
        "timestamptz, struct, list or map",
        "change the column type or write this table with another tool (format-version 3 types such as "
        "timestamp_ns need format-version 3 metadata, which pyiceberg 0.12 cannot commit)",
    )


def arrow_only_column(schema: Schema) -> tuple[str, IcebergType] | None:
    """The first column (dotted path) whose type only pyarrow can write (:data:`ARROW_ONLY_TYPES`),
    with its type; None when Spark can write every column.

    Raises :class:`UnsupportedTypeError` naming a column that neither can write (timestamp_ns,
    unknown, variant...).
    """
    found: tuple[str, IcebergType] | None = None

    def visit(iceberg_type: IcebergType, path: str) -> None:
        nonlocal found
        if isinstance(iceberg_type, StructType):
            for f in iceberg_type.fields:
                visit(f.field_type, f"{path}.{f.name}")
        elif isinstance(iceberg_type, ListType):
            visit(iceberg_type.element_type, f"{path}.element")
        elif isinstance(iceberg_type, MapType):
            visit(iceberg_type.key_type, f"{path}.key")
            visit(iceberg_type.value_type, f"{path}.value")
        elif isinstance(iceberg_type, ARROW_ONLY_TYPES):
            found = found or (path, iceberg_type)
        elif not isinstance(iceberg_type, DecimalType) and type(iceberg_type) not in SPARK_PRIMITIVES:
            raise unsupported(path, iceberg_type)

    for f in schema.fields:
        visit(f.field_type, f.name)
    return found
