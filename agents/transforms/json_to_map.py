"""The reference's ``JsonToMapTransform``: a JSON text value (StringConverter, checked at start)
becomes a row. ``json.root=false`` (the default): each top-level field a column, a non-empty
object a ``map<string, string>`` of its fields' text (a string as is, anything else its JSON, as
Jackson's ``toString``: ``null`` for null), arrays of objects ``list<map<string, string>>``,
other values their own type. ``json.root=true``: the whole object one ``payload``
``map<string, string>`` column. Column-wise: the values are decoded as JSON against the
table's columns (:func:`agents.convert.decode_json` gives a string or map column a value's JSON
text); a value that is not a JSON object is a reject (the reference fails on it).

Where the schema is inferred (an auto-created table), whole numbers make a ``long`` column
(Jackson's ``int`` when they fit: the reference creates an ``int`` column from a first record
that has small ones) and a field that is only null or an empty array in the creating batch a
string (list) column (the reference leaves it out until it holds a value)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icesink.shared.transform_settings import TransformSpec

__all__ = ["JsonToMap", "PAYLOAD"]

PAYLOAD = "payload"
_MAP = pa.map_(pa.string(), pa.string())


class JsonToMap:
    def __init__(self, spec: TransformSpec) -> None:
        self.root = spec.props.get("json.root", "false").strip().lower() == "true"

    def wrap(self, values: Sequence[bytes]) -> Sequence[bytes]:
        """With ``json.root``: each value as the ``payload`` of an object, decoded as a map."""
        if not self.root:
            return values
        return [b'{"payload":' + v + b"}" for v in values]

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        if self.root:
            return pa.schema([pa.field(PAYLOAD, _MAP)])
        return pa.schema([pa.field(f.name, t) for f in s if (t := _jackson(f.type)) is not None])

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        return t

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table:
        arrays = []
        for f in out:
            col = table.column(f.name).combine_chunks() if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
            arrays.append(_null_text(col) if _text_map(col.type) else col)
        return pa.Table.from_arrays(arrays, schema=out)


def _text_map(t: pa.DataType) -> bool:
    return bool(pa.types.is_map(t) and (pa.types.is_string(t.item_type) or pa.types.is_large_string(t.item_type)))


def _jackson(t: pa.DataType, element: bool = False) -> pa.DataType | None:
    """The Connect type JsonToMapUtils gives a value of inferred type ``t`` (None: no field):
    an object a map (a field's only when not empty; an array's always)."""
    if pa.types.is_struct(t):
        return _MAP if t.num_fields or element else None
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _jackson(t.value_type, element=True)
        return None if inner is None else pa.list_(inner)
    return t


def _null_text(col: pa.MapArray) -> pa.Array:
    """A map's null values as Jackson's text of a JSON null: ``"null"``."""
    if not col.items.null_count:
        return col
    if col.offset:  # a slice: offsets into its parent's items, which from_arrays cannot take with a mask
        col = col.take(pa.array(np.arange(len(col))))
    items = pc.fill_null(col.items, "null")
    return pa.MapArray.from_arrays(col.offsets, col.keys, items, type=col.type, mask=col.is_null())
