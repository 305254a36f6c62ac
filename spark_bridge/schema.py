"""Iceberg schema -> Spark schema, carrying Iceberg field ids into the Parquet files Spark writes.

Every ``StructField`` gets the metadata ``{"parquet.field.id": <iceberg field id>}``; Spark's
Parquet writer (``spark.sql.parquet.fieldId.write.enabled``, on by default) then stores the id in
the file footer, which is how Iceberg readers map file columns to table columns.

Spark has no ``StructField`` for a list element or a map key/value, so it cannot write a field
id for them. A file with ids on some columns only is misread by readers that trust ids (DuckDB
1.5 returns such list elements as NULL and fails on such maps; pyiceberg refuses the file without
a name mapping). So tables with list or map columns get files *without any* field id, and every
reader maps their columns by name through the table's name mapping
(``schema.name-mapping.default``), the way Iceberg reads files of migrated tables: see
:func:`requires_name_mapping`, :func:`name_mapping_properties` and :func:`name_mapping_mismatch`.

Which Iceberg types Spark cannot write (uuid, fixed[n]: the writer writes such tables with
pyarrow) or no writer can write is :mod:`icesink.shared.writable_types`, a leaf the worker imports too:
:func:`~icesink.shared.writable_types.arrow_only_column` is re-exported here.
"""

from __future__ import annotations

from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.table.name_mapping import MappedField, NameMapping
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
)
from pyspark.sql import types as st

from icesink.shared.writable_types import ARROW_ONLY_TYPES, SPARK_PRIMITIVES, arrow_only_column, unsupported

__all__ = [
    "ARROW_ONLY_TYPES",
    "FIELD_ID_KEY",
    "arrow_only_column",
    "name_mapping_mismatch",
    "name_mapping_properties",
    "requires_name_mapping",
    "spark_schema",
]

FIELD_ID_KEY = "parquet.field.id"


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
    TimeType: st.TimeType(6),  # needs spark.sql.timeType.enabled (Spark 4.1+)
}
if set(_PRIMITIVES) != SPARK_PRIMITIVES:  # the leaf's list is what this module maps
    raise RuntimeError("icesink.shared.writable_types.SPARK_PRIMITIVES differs from Spark's types: "
                       f"{sorted(map(str, _PRIMITIVES))}")


def _spark_type(iceberg_type: IcebergType, path: str, ids: bool) -> st.DataType:
    if isinstance(iceberg_type, StructType):
        return st.StructType([_spark_field(f, path, ids) for f in iceberg_type.fields])
    if isinstance(iceberg_type, ListType):
        return st.ArrayType(
            _spark_type(iceberg_type.element_type, f"{path}.element", ids),
            containsNull=not iceberg_type.element_required,
        )
    if isinstance(iceberg_type, MapType):
        return st.MapType(
            _spark_type(iceberg_type.key_type, f"{path}.key", ids),
            _spark_type(iceberg_type.value_type, f"{path}.value", ids),
            valueContainsNull=not iceberg_type.value_required,
        )
    if isinstance(iceberg_type, DecimalType):
        return st.DecimalType(iceberg_type.precision, iceberg_type.scale)
    spark_type = _PRIMITIVES.get(type(iceberg_type))
    if spark_type is None:
        # ARROW_ONLY_TYPES (callers check arrow_only_column first), timestamp_ns, unknown, variant...
        raise unsupported(path, iceberg_type)
    return spark_type


def _spark_field(field: NestedField, parent: str | None, ids: bool) -> st.StructField:
    path = field.name if parent is None else f"{parent}.{field.name}"
    return st.StructField(
        field.name,
        _spark_type(field.field_type, path, ids),
        nullable=not field.required,
        metadata={FIELD_ID_KEY: field.field_id} if ids else {},
    )


def spark_schema(schema: Schema, *, field_ids: bool = True) -> st.StructType:
    """The Spark schema of an Iceberg schema, with Parquet field ids at every struct level.

    ``field_ids=False`` leaves them out (files then need the table's name mapping).
    Raises :class:`UnsupportedTypeError` naming the column for types Spark cannot write
    (:data:`ARROW_ONLY_TYPES`, unknown, variant, ...).
    """
    return st.StructType([_spark_field(f, None, field_ids) for f in schema.fields])


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

    ``schema`` must carry the table's own field ids: pass ``table.schema()`` (then
    ``tx.set_properties(...)``, as pyiceberg's own ``add_files`` does), or, to create the table
    with them, ``assign_fresh_schema_ids(schema)``, since ``create_table`` renumbers the ids.
    pyiceberg keeps the mapping up to date on later schema changes.
    """
    return {TableProperties.DEFAULT_NAME_MAPPING: schema.name_mapping.model_dump_json()}


def _paths(fields: list[MappedField], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int | None]:
    out: dict[tuple[str, ...], int | None] = {}
    for mapped in fields:
        for name in mapped.names:
            out[(*prefix, name)] = mapped.field_id
            out.update(_paths(mapped.fields, (*prefix, name)))
    return out


def name_mapping_mismatch(schema: Schema, mapping: NameMapping | None) -> str | None:
    """Why ``mapping`` would read Spark-written files of ``schema`` wrongly, or None if it is right."""
    if mapping is None:
        return "the table has no name mapping"
    found = _paths(list(mapping))
    for path, field_id in _paths(list(schema.name_mapping)).items():
        if found.get(path) != field_id:
            return f"the name mapping maps {'.'.join(path)!r} to field id {found.get(path)}, the schema has {field_id}"
    return None
