"""Kafka Connect's ``HoistField$Value``: the whole value becomes one struct field named
``field``. Column-wise: the decoded columns become the children of one struct column."""

from __future__ import annotations

import pyarrow as pa

from agents.convert import struct_array
from icesink.shared.transform_settings import TransformSpec

__all__ = ["HoistField"]


class HoistField:
    def __init__(self, spec: TransformSpec) -> None:
        self.field = spec.props["field"]

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        return pa.schema([pa.field(self.field, pa.struct(list(s)))])

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        if self.field not in t.names or not pa.types.is_struct(t.field(self.field).type):
            return pa.schema([])  # the table has no such struct: nothing of the value lands
        return pa.schema(list(t.field(self.field).type))

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table:
        arrays = []
        for f in out:
            if f.name == self.field and pa.types.is_struct(f.type):
                children = [table.column(c.name).combine_chunks().cast(c.type) if c.name in table.column_names
                            else pa.nulls(table.num_rows, c.type) for c in f.type]
                arrays.append(struct_array(children, f.type, table.num_rows))
            else:
                arrays.append(pa.nulls(table.num_rows, f.type))
        return pa.Table.from_arrays(arrays, schema=out)
