"""The reference's ``CopyValue``: the value of top-level ``source.field`` copied to
``target.field`` (added after the other fields, of the source's type). Column-wise: the source
column is decoded once and taken again as the target column."""

from __future__ import annotations

import pyarrow as pa

from icesink.shared.transform_settings import TransformSpec

__all__ = ["CopyValue"]


class CopyValue:
    def __init__(self, spec: TransformSpec) -> None:
        self.source = spec.props["source.field"]
        self.target = spec.props["target.field"]

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        if self.source not in s.names:
            return s
        kept = [f for f in s if f.name != self.target]
        return pa.schema([*kept, s.field(self.source).with_name(self.target)])

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        fields = [f for f in t if f.name != self.target]
        if self.source not in t.names and self.target in t.names:
            fields.append(t.field(self.target).with_name(self.source))  # read for the copy only
        return pa.schema(fields)

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table:
        arrays = []
        for f in out:
            name = self.source if f.name == self.target else f.name
            col = table.column(name) if name in table.column_names else pa.nulls(table.num_rows, f.type)
            arrays.append(col.cast(f.type))
        return pa.Table.from_arrays(arrays, schema=out)
