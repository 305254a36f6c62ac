"""Kafka Connect's ``ValueToKey``: the record key becomes a struct of the value's ``fields`` (as
the value is at that step of the chain). The value is unchanged. icesink keeps a key only in
the key column (``iceberg.tables.key-column``): that column becomes the struct, built from the
decoded value columns (a field the value lacks is null, as Connect's ``value.get``)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from agents.convert import struct_array
from icesink.shared.transform_settings import TransformSpec

__all__ = ["ValueToKey"]


class ValueToKey:
    def __init__(self, spec: TransformSpec) -> None:
        self.fields = [f.strip() for f in spec.props["fields"].split(",") if f.strip()]

    def key_struct(self, s: pa.Schema) -> pa.StructType:
        """The key's type for a value of schema ``s`` at this step (a field it lacks: a string)."""
        return pa.struct([s.field(f) if f in s.names else pa.field(f, pa.string()) for f in self.fields])

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        return s

    def in_schema(self, t: pa.Schema, key: pa.StructType | None = None) -> pa.Schema:
        """``t`` and, to build a key column of type ``key``, the fields of it ``t`` lacks."""
        extra = [] if key is None else [c for c in key if c.name not in t.names]
        return pa.schema([*t, *extra])

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table:
        return pa.Table.from_arrays([table.column(f.name) if f.name in table.column_names
                                     else pa.nulls(table.num_rows, f.type) for f in out], schema=out)

    def key(self, table: pa.Table, key: pa.StructType) -> pa.Array:
        """The key column (of type ``key``) for the rows of ``table``."""
        children = [_child(table.column(c.name).combine_chunks(), c.type) if c.name in table.column_names
                    else pa.nulls(table.num_rows, c.type) for c in key]
        return struct_array(children, key, table.num_rows)


def _child(col: pa.Array, t: pa.DataType) -> pa.Array:
    """A value column as a field of the key. A nested one read as text (a later Cast$Key of the
    field, agents/transforms/keys.py) is ``{...}``: Cast fails it, as Connect fails a struct."""
    if pa.types.is_nested(col.type) and not pa.types.is_nested(t):
        return pc.if_else(col.is_null(), pa.scalar(None, t), pa.scalar("{...}", t))
    return col.cast(t)
