"""The reference's ``DmsTransform``: an AWS DMS record ``{"data": {...}, "metadata": {...}}``
becomes the fields of ``data`` plus a ``_cdc`` struct: ``op`` (``U`` for DMS ``update``, ``D``
for ``delete``, ``I`` otherwise), ``ts`` (``metadata.timestamp`` as given: a string in a table
icesink creates, converted into an existing column's type) and ``source``
(``{schema-name}.{table-name}``, ``null`` for a missing part, as Java's ``String.format``).
A record whose ``data`` or ``metadata`` is no object is dropped (the reference returns null),
one without ``metadata.operation`` is a reject (the reference fails on it). Schemaless values
only (checked at start), as the reference. Column-wise: one decode, then Arrow compute."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from agents.convert import struct_array
from icesink.shared.transform_settings import TransformSpec

__all__ = ["DmsTransform", "CDC"]

CDC = "_cdc"
_META = ("operation", "timestamp", "schema-name", "table-name")


class DmsTransform:
    def __init__(self, spec: TransformSpec) -> None:
        self.name = spec.name

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        data = s.field("data").type if "data" in s.names else None
        if data is None or not pa.types.is_struct(data):
            return pa.schema([pa.field(CDC, _cdc_type(pa.string()))])
        meta = s.field("metadata").type if "metadata" in s.names else None
        ts = meta.field("timestamp").type if meta is not None and pa.types.is_struct(meta) \
            and meta.get_field_index("timestamp") >= 0 else pa.string()
        return pa.schema([*(f for f in data if f.name != CDC), pa.field(CDC, _cdc_type(ts))])

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        cdc = t.field(CDC).type if CDC in t.names else None
        ts = cdc.field("ts").type if cdc is not None and pa.types.is_struct(cdc) \
            and cdc.get_field_index("ts") >= 0 else pa.string()
        meta = [pa.field(n, ts if n == "timestamp" else pa.string()) for n in _META]
        return pa.schema([pa.field("data", pa.struct([f.with_nullable(True) for f in t if f.name != CDC])),
                          pa.field("metadata", pa.struct(meta))])

    def screen(self, table: pa.Table) -> tuple[npt.NDArray[np.bool_], list[tuple[npt.NDArray[np.bool_], str, str | None]]]:
        data, meta = (table.column(n).combine_chunks() for n in ("data", "metadata"))
        drop = _mask(pc.or_(pc.is_null(data), pc.is_null(meta)))
        no_op = _mask(pc.is_null(pc.struct_field(meta, "operation"))) & ~drop
        return drop, [(no_op, "DMS record without metadata.operation", "metadata.operation")]

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table:
        data, meta = (table.column(n).combine_chunks() for n in ("data", "metadata"))
        arrays = []
        for f in out:
            if f.name == CDC and pa.types.is_struct(f.type):
                arrays.append(self._cdc(meta, f.type))
            elif data.type.get_field_index(f.name) >= 0:
                arrays.append(pc.struct_field(data, f.name).cast(f.type))
            else:
                arrays.append(pa.nulls(table.num_rows, f.type))
        return pa.Table.from_arrays(arrays, schema=out)

    @staticmethod
    def _cdc(meta: pa.StructArray, t: pa.StructType) -> pa.StructArray:
        operation = pc.struct_field(meta, "operation")
        op = pc.if_else(pc.equal(operation, "update"), "U", pc.if_else(pc.equal(operation, "delete"), "D", "I"))
        source = pc.binary_join_element_wise(*(pc.fill_null(pc.struct_field(meta, n), "null")
                                               for n in ("schema-name", "table-name")), ".")
        parts = {"op": op, "ts": pc.struct_field(meta, "timestamp"), "source": source}
        children = [parts[c.name].cast(c.type) if c.name in parts else pa.nulls(len(meta), c.type) for c in t]
        return struct_array(children, t, len(meta))


def _cdc_type(ts: pa.DataType) -> pa.StructType:
    return pa.struct([pa.field("op", pa.string()), pa.field("ts", ts), pa.field("source", pa.string())])


def _mask(a: pa.Array) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.fill_null(a, False).to_numpy(zero_copy_only=False), dtype=bool)
