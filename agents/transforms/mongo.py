"""The reference's ``MongoDebeziumTransform``: a Debezium MongoDB change event, whose ``before``
and ``after`` are MongoDB extended-JSON strings, becomes the same envelope with ``before`` and
``after`` typed structs (:mod:`agents.transforms.bson` says which type each BSON type gets), for
the transforms after it (``ExtractNewRecordState`` makes rows of it). The other envelope fields
(``op``, ``ts_ms``, ``source``, ``updateDescription``, ...) pass as they are.

As the reference: an update without ``after`` (the connector's ``change_streams`` capture mode)
gets one built from ``before`` (empty without one) with ``updateDescription.updatedFields`` set
and ``removedFields`` removed, and the record key's ``id`` as ``_id`` if it has none; an event with none of ``before``, ``after``,
``updateDescription`` is malformed (the reference fails on it; here it is a reject), as is a
Debezium 1.x oplog update (``patch``, no ``after``: the reference cannot read it) and a document
that is no JSON object. Arrays are lists, or with ``array_handling_mode=document`` structs of
``_0``, ``_1``, .... Values with a Connect schema only (checked at start): the reference turns
values without an ``Envelope`` schema into tombstones, which a sink skips.

Column-wise: the strings of a batch (after, before and updatedFields together) are parsed in
one bulk JSON decode, the wrappers turned into values per column. The table's row image is
what the table-creating batch's documents hold, every field optional; a later document's field
the table lacks is left out (schema evolution is refused at start with this transform)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from agents.convert import decode_json
from agents.convert.arrays import strict_cast
from agents.transforms.bson import typed
from icesink.shared.transform_settings import TransformSpec

__all__ = ["MongoDebezium"]

_IMAGES = ("before", "after")
_UPDATE = "updateDescription"
_UPDATE_TYPE = pa.struct([pa.field("removedFields", pa.list_(pa.string())), pa.field("updatedFields", pa.string())])
Mask = npt.NDArray[np.bool_]


class MongoDebezium:
    def __init__(self, spec: TransformSpec) -> None:
        self.documents = spec.props.get("array_handling_mode", "array").strip().lower() == "document"

    # Schemas ---------------------------------------------------------------------------------

    def out_schema(self, s: pa.Schema, values: Sequence[bytes] = ()) -> pa.Schema:
        """``s`` (the envelope's Connect schema: the images strings) with the images typed as the
        documents of ``values`` (the raw events) hold them."""
        if not any(n in s.names for n in _IMAGES):
            return s
        image = self._image_type(values)
        return pa.schema([pa.field(f.name, image) if f.name in _IMAGES else f for f in s])

    def _image_type(self, values: Sequence[bytes]) -> pa.StructType:
        payload = pa.struct([pa.field("after", pa.string()), pa.field("before", pa.string()),
                             pa.field(_UPDATE, pa.struct([pa.field("updatedFields", pa.string())]))])
        decoded = decode_json(list(values), pa.schema([pa.field("payload", payload)])).table
        if not decoded.num_rows:
            return pa.struct([])
        p = decoded.column("payload").combine_chunks()
        texts = pa.concat_arrays([p.field("after"), p.field("before"), p.field(_UPDATE).field("updatedFields")])
        parsed, _ = self._parse(texts)
        return pa.struct([f.with_nullable(True) for f in parsed.type if "." not in f.name])

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        fields = [f.with_type(pa.string()) if f.name in _IMAGES else f for f in t if f.name not in (_UPDATE, "patch")]
        update = t.field(_UPDATE).type if _UPDATE in t.names and pa.types.is_struct(t.field(_UPDATE).type) else None
        extra = [f for f in update if _UPDATE_TYPE.get_field_index(f.name) < 0] if update is not None else []
        fields += [pa.field(_UPDATE, pa.struct([*_UPDATE_TYPE, *extra])), pa.field("patch", pa.string())]
        return pa.schema(fields)

    # Rows ------------------------------------------------------------------------------------

    def screen(self, table: pa.Table) -> tuple[Mask, list[tuple[Mask, str, str | None]]]:
        after, before, patch = (table.column(n).combine_chunks() for n in ("after", "before", "patch"))
        update = table.column(_UPDATE).combine_chunks()
        updated = pc.struct_field(update, "updatedFields")
        oplog = _mask(pc.and_(pc.is_null(after), pc.is_valid(patch)))
        none = _mask(pc.and_(pc.and_(pc.is_null(after), pc.is_null(before)), pc.is_null(updated))) & ~oplog
        return np.zeros(table.num_rows, dtype=bool), [
            (none, "malformed MongoDB change event: no after, before or updateDescription", "after"),
            (oplog, "a Debezium 1.x oplog update (patch): MongoDebeziumTransform reads change streams events", "patch"),
        ]

    def convert(self, table: pa.Table, out: pa.Schema, keys: Sequence[bytes | None] | None = None,
                ) -> tuple[pa.Table, list[tuple[Mask, str, str | None]]]:
        """``table`` (decoded against :meth:`in_schema`) as ``out``'s columns, and the rows whose
        documents could not be read (not a JSON object, or a value the column cannot hold).
        ``keys``: the rows' record keys, whose ``id`` a partial update without ``_id`` takes."""
        n = table.num_rows
        after, before = (table.column(n_).combine_chunks() for n_ in ("after", "before"))
        update = table.column(_UPDATE).combine_chunks()
        updated = pc.struct_field(update, "updatedFields")
        removed = pc.struct_field(update, "removedFields")
        image = next((f.type for f in out if f.name in _IMAGES and pa.types.is_struct(f.type)), pa.struct([]))
        parsed, bad = self._parse(pa.concat_arrays([after, before, updated]))
        dotted = np.zeros(3 * n, dtype=bool)
        for f in parsed.type:
            if "." in f.name:
                dotted |= _mask(pc.is_valid(pc.struct_field(parsed, f.name)))
        dotted = np.asarray(dotted.reshape(3, n).any(axis=0), dtype=bool)
        aligned, unfit = _align(parsed, image)
        bad = np.asarray((bad | unfit).reshape(3, n).any(axis=0), dtype=bool)
        typed_after, typed_before, typed_updated = (aligned.slice(i * n, n) for i in range(3))
        partial = pc.and_(pc.is_null(after), pc.is_valid(updated))
        built = _merge(typed_before, typed_updated, removed, image)
        at = image.get_field_index("_id")
        if keys is not None and at >= 0 and n:  # only the partial updates without an _id read their key
            need = np.flatnonzero(_mask(pc.and_(partial, pc.is_null(pc.struct_field(built, [at])))))
            if len(need):
                found = self._key_ids([keys[int(i)] for i in need], image.field(at).type)
                at_rows = np.full(n, -1, dtype=np.int64)
                at_rows[need] = np.arange(len(need))
                key_id = found.take(pa.array(at_rows, mask=at_rows < 0))
                children = [pc.coalesce(pc.struct_field(built, [i]), key_id) if i == at else pc.struct_field(built, [i])
                            for i in range(image.num_fields)]
                built = pa.StructArray.from_arrays(children, fields=list(image))
        images = {"after": pc.if_else(partial, built, typed_after) if n else typed_after, "before": typed_before}
        arrays = []
        for f in out:
            if f.name in images:
                arrays.append(images[f.name].cast(f.type))
            elif f.name in table.column_names:
                arrays.append(table.column(f.name).combine_chunks().cast(f.type))
            else:
                arrays.append(pa.nulls(n, f.type))
        reason = "MongoDB document not readable as the table's row (not a JSON object, or a value of another type)"
        nested = "a field name with a dot (a nested change in updatedFields, \"a.b\"): not applied yet"
        return pa.Table.from_arrays(arrays, schema=out), [(bad, reason, "after"), (dotted & ~bad, nested, "updateDescription")]

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table:
        return self.convert(table, out)[0]

    def _key_ids(self, keys: Sequence[bytes | None], t: pa.DataType) -> pa.Array:
        """The keys' ``id`` in type ``t`` (a Debezium MongoDB key: ``{"id": "<its extended
        JSON>"}``, with or without the JsonConverter's schema), as the reference reads it."""
        ids = pa.schema([pa.field("id", pa.string()), pa.field("payload", pa.struct([pa.field("id", pa.string())]))])
        decoded = decode_json([k or b"null" for k in keys], ids)
        text = pc.coalesce(pc.struct_field(decoded.table.column("payload").combine_chunks(), "id"),
                           decoded.table.column("id").combine_chunks())
        where = np.full(len(keys), -1, dtype=np.int64)
        where[decoded.indices.to_numpy(zero_copy_only=False)] = np.arange(len(decoded.indices))
        text = text.take(pa.array(where, mask=where < 0))
        parsed, _ = self._parse(pc.binary_join_element_wise('{"id": ', text, "}", ""))
        key_id, _ = _align(pc.struct_field(parsed, "id") if parsed.type.get_field_index("id") >= 0
                           else pa.nulls(len(keys)), t)
        return key_id

    def _parse(self, texts: pa.Array) -> tuple[pa.StructArray, Mask]:
        """The documents ``texts`` (null: none) as one typed struct column, and the rows that are
        no JSON object."""
        n = len(texts)
        bad = np.zeros(n, dtype=bool)
        valid = np.flatnonzero(_mask(pc.is_valid(texts)))
        if not len(valid):
            return pa.nulls(n, pa.struct([])), bad
        docs = texts.take(pa.array(valid)).cast(pa.binary()).to_pylist()
        decoded = decode_json(docs)
        bad[valid[[r.index for r in decoded.rejects]]] = True
        t = decoded.table
        rows = decoded.indices.to_numpy(zero_copy_only=False)
        if t.num_columns:
            struct = pa.StructArray.from_arrays([c.combine_chunks() for c in t.columns], names=t.column_names)
        else:
            struct = pa.array([{}] * t.num_rows, pa.struct([]))
        struct = typed(struct, self.documents)
        at = np.full(n, -1, dtype=np.int64)
        at[valid[rows]] = np.arange(len(rows))
        return struct.take(pa.array(at, mask=at < 0)), bad


def _merge(before: pa.StructArray, updated: pa.StructArray, removed: pa.Array, t: pa.StructType) -> pa.StructArray:
    """``before`` (empty where null) with ``updated``'s fields set and ``removed``'s removed."""
    n = len(before)
    flat = pc.list_flatten(removed)
    parents = pc.list_parent_indices(removed).to_numpy(zero_copy_only=False)
    children = []
    for i, f in enumerate(t):
        gone = np.zeros(n, dtype=bool)
        gone[parents[_mask(pc.equal(flat, f.name))]] = True
        v = pc.coalesce(pc.struct_field(updated, [i]), pc.struct_field(before, [i]))
        children.append(pc.if_else(pa.array(gone), pa.scalar(None, f.type), v) if gone.any() else v)
    if not t.num_fields:
        return pa.array([{}] * n, t)
    return pa.StructArray.from_arrays(children, fields=list(t))


def _align(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask]:
    """``arr`` in type ``t`` (struct fields by name, missing ones null, extra ones left out) and
    the rows holding a value ``t`` cannot (made null)."""
    n = len(arr)
    bad = np.zeros(n, dtype=bool)
    if arr.type == t:
        return arr, bad
    if pa.types.is_null(arr.type):
        return pa.nulls(n, t), bad
    if pa.types.is_struct(t) and pa.types.is_struct(arr.type):
        children = []
        for f in t:
            i = arr.type.get_field_index(f.name)
            if i < 0:
                children.append(pa.nulls(n, f.type))
                continue
            child, b = _align(pc.struct_field(arr, [i]), f.type)
            children.append(child)
            bad |= b
        if not t.num_fields:
            return pa.array([None if not v else {} for v in arr.is_valid().to_pylist()], t), bad
        return pa.StructArray.from_arrays(children, fields=list(t), mask=arr.is_null() if arr.null_count else None), bad
    if _is_list(t) and _is_list(arr.type):
        if arr.offset:
            arr = arr.take(pa.array(np.arange(n)))
        values, b = _align(arr.values, t.value_type)
        bad[np.unique(pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)[b[:len(pc.list_flatten(arr))]])] = True
        build = pa.LargeListArray if pa.types.is_large_list(arr.type) else pa.ListArray
        out = build.from_arrays(arr.offsets, values, mask=arr.is_null() if arr.null_count else None)
        return out.cast(t), bad
    if pa.types.is_struct(t) or _is_list(t) or pa.types.is_struct(arr.type) or _is_list(arr.type):
        return pa.nulls(n, t), _mask(pc.is_valid(arr))
    try:
        out, b2 = strict_cast(arr, t)
    except pa.ArrowNotImplementedError:
        return pa.nulls(n, t), _mask(pc.is_valid(arr))
    return out, bad if b2 is None else b2


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _mask(a: pa.Array) -> Mask:
    return np.asarray(pc.fill_null(a, False).to_numpy(zero_copy_only=False), dtype=bool)
