"""Kafka Connect's ``ReplaceField$Value``: ``exclude`` and ``include`` (field lists) keep the
top-level fields that are not excluded and, with an include list, included; ``renames``
(``old:new`` pairs) renames the kept ones. Column-wise: the decode reads the old names, the
columns are renamed and selected (a column that the filter drops is null in an existing table
that has it, as Connect leaves it unset).

The decode coerces a field to the column it lands in, not to a same-named one: a dropped field
is not decoded at all (``exclude=store_id`` with a ``long`` column ``store_id`` takes the value
``"abc"``, as Connect drops the field before the sink converts), and a renamed one is decoded as
its new name's column (``renames=store_id:store_ref``: as ``store_ref``; the table's own
``store_id`` column, that no field fills then, is null)."""

from __future__ import annotations

import pyarrow as pa

from icesink.shared.transform_settings import TransformSpec

__all__ = ["ReplaceField"]


def _names(v: str) -> list[str]:
    return [x.strip() for x in v.split(",") if x.strip()]


class ReplaceField:
    def __init__(self, spec: TransformSpec) -> None:
        self.exclude = set(_names(spec.props.get("exclude", "")))
        self.include = set(_names(spec.props.get("include", "")))
        pairs = [p.split(":") for p in _names(spec.props.get("renames", ""))]
        self.renames = {a: b for a, b in pairs}  # checked at start: old:new
        self.back = {b: a for a, b in self.renames.items()}

    def keep(self, name: str) -> bool:
        return name not in self.exclude and (not self.include or name in self.include)

    def source(self, name: str) -> str | None:
        """The value field that fills output column ``name``, or None (dropped, or renamed away)."""
        src = self.back.get(name, name)
        if src == name and name in self.renames and self.renames[name] != name:
            return None  # the field of that name lands in another column
        return src if self.keep(src) else None

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        return pa.schema([f.with_name(self.renames.get(f.name, f.name)) for f in s if self.keep(f.name)])

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        return pa.schema([f.with_name(src) for f in t if (src := self.source(f.name)) is not None])

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table:
        arrays = []
        for f in out:
            src = self.source(f.name)
            if src is not None and src in table.column_names:
                col = table.column(src)  # no cast to its own type: Arrow refuses one of a null struct
                arrays.append(col if col.type.equals(f.type) else col.cast(f.type))
            else:
                arrays.append(pa.nulls(table.num_rows, f.type))
        return pa.Table.from_arrays(arrays, schema=out)
