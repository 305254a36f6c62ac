"""MongoDB extended JSON (the strings Debezium's MongoDB connector puts in ``before``/``after``)
as typed Arrow columns, the types the reference's ``MongoDataConverter`` gives each BSON type.

The strings are parsed as plain JSON in one bulk decode (:func:`agents.convert.decode_json`, the
batch's schema inferred), so a wrapper such as ``{"$oid": "..."}`` arrives as a struct column
whose fields all start with ``$``; :func:`typed` then turns each wrapper column into its value,
column-wise:

====================================================  ==========================================
``$oid``, ``$numberDecimal``, ``$symbol``, ``$code``  string (as the reference: text)
``$numberLong`` / ``$numberInt``                      long / int
``$numberDouble`` (``"NaN"``, ``"Infinity"`` too)      double
``$date`` (millis, ``{"$numberLong"}``, ISO text)     timestamptz (Connect ``Timestamp``)
``$timestamp`` ``{t, i}``                             timestamptz of ``t`` seconds
``$binary`` (``{base64, subType}``, legacy text)      binary
``$regularExpression`` / ``$regex`` + ``$options``    struct ``regex``, ``options``
``$code`` + ``$scope``                                struct ``code``, ``scope``
``$minKey``, ``$maxKey``, ``$undefined``              null (the reference has no field for them)
====================================================  ==========================================

Plain JSON numbers are longs or doubles, strings strings, objects structs; arrays are lists
(``array_handling_mode=array``) or structs of ``_0``, ``_1``, ... (``document``). A column whose
rows hold different wrappers (an ``_id`` that is an ObjectId in one document and a long in
another) becomes their text. Leaf module: no I/O."""

from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["TIMESTAMP", "typed"]

TIMESTAMP = pa.timestamp("us", tz="UTC")
_REGEX = pa.struct([pa.field("regex", pa.string()), pa.field("options", pa.string())])


def typed(arr: pa.Array, document_arrays: bool = False) -> pa.Array:
    """``arr`` (a column as plain JSON decodes extended JSON) with its wrappers as their values."""
    t = arr.type
    if pa.types.is_struct(t):
        if t.num_fields and all(f.name.startswith("$") for f in t):
            return _wrapper(arr, document_arrays)
        children = [typed(pc.struct_field(arr, [i]), document_arrays) for i in range(t.num_fields)]
        fields = [pa.field(f.name, c.type) for f, c in zip(t, children, strict=True)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=arr.is_null() if arr.null_count else None)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if arr.offset:  # a slice: offsets into its parent's values
            arr = arr.take(pa.array(np.arange(len(arr))))
        values = typed(arr.values, document_arrays)
        if document_arrays:
            return _as_document(arr, values)
        return pa.ListArray.from_arrays(arr.offsets, values, mask=arr.is_null() if arr.null_count else None)
    return arr


def _as_document(arr: pa.ListArray, values: pa.Array) -> pa.Array:
    """A list column as a struct of ``_0``, ``_1``, ... (as many as the longest list), as the
    reference's ``array_handling_mode=document``."""
    offsets = arr.offsets.to_numpy()
    lengths = np.diff(offsets)
    width = int(lengths.max()) if len(lengths) else 0
    children = []
    for i in range(width):
        has = lengths > i
        at = pa.array(np.where(has, offsets[:-1] + i, 0), mask=~has)
        children.append(values.take(at))
    fields = [pa.field(f"_{i}", values.type) for i in range(width)]
    if not fields:
        return pa.array([{} if v else None for v in arr.is_valid().to_pylist()], pa.struct([]))
    return pa.StructArray.from_arrays(children, fields=fields, mask=arr.is_null() if arr.null_count else None)


def _wrapper(arr: pa.StructArray, document_arrays: bool) -> pa.Array:
    names = [f.name for f in arr.type]
    groups = []
    for key, members in _GROUPS:
        if key in names:
            groups.append((key, [m for m in members if m in names]))
    unknown = [n for n in names if not any(n in m for _, m in groups)]
    if unknown:  # not extended JSON: a document whose field names start with $
        children = [typed(pc.struct_field(arr, [i]), document_arrays) for i in range(arr.type.num_fields)]
        fields = [pa.field(f.name, c.type) for f, c in zip(arr.type, children, strict=True)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=arr.is_null() if arr.null_count else None)
    outs = [_CONVERT[key](arr, members, document_arrays) for key, members in groups]
    if len(outs) == 1:
        out = outs[0]
    else:  # different wrappers in different rows: their text
        out = pc.coalesce(*(_text(o) for o in outs))
    return pc.if_else(arr.is_null(), pa.scalar(None, out.type), out) if arr.null_count else out


def _text(a: pa.Array) -> pa.Array:
    if pa.types.is_timestamp(a.type):
        return pc.strftime(a, format="%Y-%m-%dT%H:%M:%S.%fZ")
    if pa.types.is_struct(a.type) or pa.types.is_binary(a.type):
        return pa.nulls(len(a), pa.string())
    return a.cast(pa.string())


def _child(arr: pa.StructArray, name: str) -> pa.Array:
    return pc.struct_field(arr, [arr.type.get_field_index(name)])  # null where the struct is


def _number(a: pa.Array, t: pa.DataType) -> pa.Array:
    if pa.types.is_struct(a.type):  # {"$numberLong": "..."} inside another wrapper
        a = _child(a, a.type.field(0).name)
    return a.cast(t)


def _date(arr: pa.StructArray, members: list[str], _: bool) -> pa.Array:
    v = _child(arr, "$date")
    if pa.types.is_struct(v.type):
        v = _child(v, "$numberLong") if v.type.get_field_index("$numberLong") >= 0 else pa.nulls(len(v), pa.int64())
    if pa.types.is_string(v.type):
        digits = pc.fill_null(pc.match_substring_regex(v, r"^-?\d+$"), False)
        iso = pc.if_else(digits, pa.scalar(None, pa.string()), v).cast(pa.timestamp("ms", tz="UTC"))
        millis = pc.if_else(digits, v, pa.scalar(None, pa.string())).cast(pa.int64())
        return pc.coalesce(iso.cast(TIMESTAMP), pc.multiply(millis, 1000).cast(TIMESTAMP))
    return pc.multiply(v.cast(pa.int64()), 1000).cast(TIMESTAMP)


def _timestamp(arr: pa.StructArray, members: list[str], _: bool) -> pa.Array:
    v = _child(arr, "$timestamp")
    seconds = _child(v, "t") if pa.types.is_struct(v.type) and v.type.get_field_index("t") >= 0 else pa.nulls(len(v), pa.int64())
    return pc.multiply(seconds.cast(pa.int64()), 1_000_000).cast(TIMESTAMP)


def _binary(arr: pa.StructArray, members: list[str], _: bool) -> pa.Array:
    v = _child(arr, "$binary")
    if pa.types.is_struct(v.type):
        v = _child(v, "base64") if v.type.get_field_index("base64") >= 0 else pa.nulls(len(v), pa.string())
    # Arrow has no base64 decode: the (rare) binary values are decoded one by one
    return pa.array([None if s is None else base64.b64decode(s) for s in v.to_pylist()], pa.binary())


def _regex(arr: pa.StructArray, members: list[str], _: bool) -> pa.Array:
    if "$regularExpression" in members:
        v = _child(arr, "$regularExpression")
        pattern = _child(v, "pattern") if v.type.get_field_index("pattern") >= 0 else pa.nulls(len(v), pa.string())
        options = _child(v, "options") if v.type.get_field_index("options") >= 0 else pa.nulls(len(v), pa.string())
    else:
        pattern = _child(arr, "$regex")
        options = _child(arr, "$options") if "$options" in members else pa.nulls(len(arr), pa.string())
    return pa.StructArray.from_arrays([pattern.cast(pa.string()), options.cast(pa.string())], fields=list(_REGEX))


def _code(arr: pa.StructArray, members: list[str], document_arrays: bool) -> pa.Array:
    code = _child(arr, "$code").cast(pa.string())
    if "$scope" not in members:
        return code
    scope = typed(_child(arr, "$scope"), document_arrays)
    return pa.StructArray.from_arrays([code, scope], names=["code", "scope"])


def _as(t: pa.DataType, name: str) -> Callable[[pa.StructArray, list[str], bool], pa.Array]:
    return lambda arr, members, _: _number(_child(arr, name), t)


def _nothing(arr: pa.StructArray, members: list[str], _: bool) -> pa.Array:
    return pa.nulls(len(arr), pa.string())


#: Each wrapper: its key and the keys that go with it.
_GROUPS: list[tuple[str, list[str]]] = [
    ("$oid", ["$oid"]), ("$numberLong", ["$numberLong"]), ("$numberInt", ["$numberInt"]),
    ("$numberDouble", ["$numberDouble"]), ("$numberDecimal", ["$numberDecimal"]), ("$symbol", ["$symbol"]),
    ("$date", ["$date"]), ("$timestamp", ["$timestamp"]), ("$binary", ["$binary", "$type"]),
    ("$regularExpression", ["$regularExpression"]), ("$regex", ["$regex", "$options"]),
    ("$code", ["$code", "$scope"]), ("$minKey", ["$minKey"]), ("$maxKey", ["$maxKey"]), ("$undefined", ["$undefined"]),
]
_CONVERT: dict[str, Callable[[pa.StructArray, list[str], bool], pa.Array]] = {
    "$oid": _as(pa.string(), "$oid"), "$numberLong": _as(pa.int64(), "$numberLong"),
    "$numberInt": _as(pa.int32(), "$numberInt"), "$numberDouble": _as(pa.float64(), "$numberDouble"),
    "$numberDecimal": _as(pa.string(), "$numberDecimal"), "$symbol": _as(pa.string(), "$symbol"),
    "$date": _date, "$timestamp": _timestamp, "$binary": _binary, "$regularExpression": _regex, "$regex": _regex,
    "$code": _code, "$minKey": _nothing, "$maxKey": _nothing, "$undefined": _nothing,
}
