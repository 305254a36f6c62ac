"""Debezium's ``ExtractNewRecordState``: a change event becomes its row, column-wise.

The values are decoded against the envelope (``before`` and ``after`` typed as the table's row
columns, ``op``, ``source``, ``transaction`` and the top-level fields ``add.fields`` reads);
then, per column: the row is ``after``, or ``before`` for a delete (``after`` null) in the rewrite
modes, with ``__deleted`` ``"true"``/``"false"``; the ``add.fields`` columns follow. A delete in
the other modes (``tombstone``, the default, ``drop``, ``delete-to-tombstone``: a tombstone or
nothing, which a sink skips) and an event with neither image (a truncate) are dropped, as
Debezium drops them; a value without ``op`` is no change event (Debezium passes it on
unchanged; here it is a reject). Debezium unwraps only values whose schema is an Envelope: with
schemaless values the step is not built and the values pass unchanged
(:class:`agents.transforms.values.ValueChain`)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from agents.convert import if_else
from icesink.shared.transform_settings import TransformSpec, unwrap_options

__all__ = ["ExtractNewRecordState", "DELETED"]

DELETED = "__deleted"
_ENVELOPE = ("before", "after", "op", "source", "transaction")


class ExtractNewRecordState:
    def __init__(self, spec: TransformSpec) -> None:
        self.mode, self.fields = unwrap_options(spec.name, spec.props)
        self.rewrite = self.mode.startswith("rewrite")
        self.added = {column for _, _, column in self.fields}

    # Schemas ---------------------------------------------------------------------------------

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        image = [s.field(n).type for n in ("after", "before") if n in s.names and pa.types.is_struct(s.field(n).type)]
        if not image:
            return s  # no envelope: passed on unchanged
        row: dict[str, pa.Field] = {}
        for t in image:
            for f in t:
                row.setdefault(f.name, f.with_nullable(True))
        out = list(row.values())
        if self.rewrite:
            out.append(pa.field(DELETED, pa.string()))
        for struct, leaf, column in self.fields:
            found = self._stated(s, struct, leaf)
            if found is not None:
                out.append(pa.field(column, found.type))
        return pa.schema(out)

    @staticmethod
    def _stated(s: pa.Schema, struct: str, leaf: str) -> pa.Field | None:
        """The envelope's field an add.fields entry reads (its struct's, else the top level's)."""
        if struct and struct in s.names and pa.types.is_struct(s.field(struct).type):
            t = s.field(struct).type
            if t.get_field_index(leaf) >= 0:
                return t.field(leaf)
        return s.field(leaf) if leaf in s.names else None

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        row = pa.struct([f.with_nullable(True) for f in t if f.name not in self.added
                         and not (self.rewrite and f.name == DELETED)])
        structs: dict[str, list[pa.Field]] = {"source": [], "transaction": []}
        top: dict[str, pa.Field] = {}
        for struct, leaf, column in self.fields:
            if column not in t.names:
                continue
            f = pa.field(leaf, t.field(column).type)
            if struct and not any(x.name == leaf for x in structs.setdefault(struct, [])):
                structs[struct].append(f)
            if leaf not in _ENVELOPE:
                top.setdefault(leaf, f)  # read where the struct has no such field
        fields = [pa.field("before", row), pa.field("after", row), pa.field("op", pa.string())]
        fields += [pa.field(name, pa.struct(children)) for name, children in structs.items()
                   if children and name not in _ENVELOPE[:3]]
        fields += [f for f in top.values() if f.name not in structs]
        return pa.schema(fields)

    # Rows ------------------------------------------------------------------------------------

    def screen(self, table: pa.Table) -> tuple[npt.NDArray[np.bool_], list[tuple[npt.NDArray[np.bool_], str, str | None]]]:
        """Records dropped (deletes outside the rewrite modes, events without an image) and
        rejected (no ``op``: not a change event)."""
        after, before = (table.column(n).combine_chunks() for n in ("after", "before"))
        no_op = _mask(pc.is_null(table.column("op").combine_chunks()))
        none = _mask(pc.and_(pc.is_null(after), pc.is_null(before)))
        drop = none & ~no_op
        if not self.rewrite:
            drop |= _mask(pc.and_(pc.is_null(after), pc.is_valid(before)))
        return drop, [(no_op, "not a Debezium change event: no op (ExtractNewRecordState unwraps change events)", "op")]

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table:
        after, before = (table.column(n).combine_chunks() for n in ("after", "before"))
        deleted = pc.is_null(after)
        image = if_else(deleted, before, after)
        added = {column: (struct, leaf) for struct, leaf, column in self.fields}
        arrays = []
        for f in out:
            if self.rewrite and f.name == DELETED:
                arr: pa.Array = pc.if_else(deleted, "true", "false")
            elif f.name in added:
                arr = self._added(table, *added[f.name], f.type)
            elif image.type.get_field_index(f.name) >= 0:
                arr = pc.struct_field(image, f.name)
            else:
                arr = pa.nulls(table.num_rows, f.type)
            arrays.append(arr.cast(f.type))
        return pa.Table.from_arrays(arrays, schema=out)

    @staticmethod
    def _added(table: pa.Table, struct: str, leaf: str, t: pa.DataType) -> pa.Array:
        if struct and struct in table.column_names:
            parent = table.column(struct).combine_chunks()
            if parent.type.get_field_index(leaf) >= 0:
                inner = pc.struct_field(parent, leaf)
                if leaf in table.column_names and struct:  # the struct's when stated, as Debezium
                    return pc.coalesce(inner, table.column(leaf).combine_chunks().cast(inner.type))
                return inner
        if leaf in table.column_names:
            return table.column(leaf).combine_chunks()
        return pa.nulls(table.num_rows, t)


def _mask(a: pa.Array) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.fill_null(a, False).to_numpy(zero_copy_only=False), dtype=bool)
