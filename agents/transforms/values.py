"""The transforms that change a record's value, as steps over its decoded Arrow columns.

Each step maps schemas both ways (``out_schema``: the value's fields after it, what an
auto-created table gets; ``in_schema``: what to decode so that it can give a table's columns)
and maps a decoded table (``apply``), column-wise. :class:`ValueChain` composes the configured
ones in order; :class:`agents.formats.RecordFormat` decodes against the chain's ``in_schema``
and applies it before the key and metadata columns are added."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import pyarrow as pa

import numpy as np

from agents.convert import Converted, Reject
from agents.transforms.cast import Cast
from agents.transforms.copy_value import CopyValue
from agents.transforms.hoist_field import HoistField
from agents.transforms.replace_field import ReplaceField
from agents.transforms.timestamp_converter import TimestampConverter
from agents.transforms.value_to_key import ValueToKey
from icesink.shared.transform_settings import TransformSpec

__all__ = ["ValueChain", "VALUE_KINDS"]

VALUE_KINDS = ("replace-field", "copy-value", "hoist-field", "cast", "timestamp-converter", "value-to-key")


class ValueStep(Protocol):
    def out_schema(self, s: pa.Schema) -> pa.Schema: ...

    def in_schema(self, t: pa.Schema) -> pa.Schema: ...

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table: ...


class ValueChain:
    def __init__(self, specs: Sequence[TransformSpec], key_column: str | None = None) -> None:
        self.steps: list[ValueStep] = []
        for s in specs:
            if s.kind == "replace-field":
                self.steps.append(ReplaceField(s))
            elif s.kind == "copy-value":
                self.steps.append(CopyValue(s))
            elif s.kind == "hoist-field":
                self.steps.append(HoistField(s))
            elif s.kind == "cast":
                self.steps.append(Cast(s))
            elif s.kind == "timestamp-converter":
                self.steps.append(TimestampConverter(s))
            elif s.kind == "value-to-key" and key_column is not None:
                self.steps.append(ValueToKey(s))
        #: ValueToKey's key column (the last one's, as its key is the one that stays), if any.
        self.key_column = key_column if any(isinstance(x, ValueToKey) for x in self.steps) else None

    def __bool__(self) -> bool:
        return bool(self.steps)

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        for step in self.steps:
            s = step.out_schema(s)
        return s

    def _to_key(self) -> ValueToKey | None:
        found = [x for x in self.steps if isinstance(x, ValueToKey)]
        return found[-1] if found else None

    def key_struct(self, s: pa.Schema) -> pa.StructType | None:
        """The key column's type that ValueToKey makes for values of schema ``s`` (None: none)."""
        last = self._to_key()
        for step in self.steps:
            if step is last:
                return step.key_struct(s)
            s = step.out_schema(s)
        return None

    def schemas(self, target: pa.Schema, key: pa.StructType | None = None) -> list[pa.Schema]:
        """The schema before each step and after the last, for a chain ending in ``target``
        (``key``: the key column's type that ValueToKey fills)."""
        out = [target]
        last = self._to_key()
        for step in reversed(self.steps):
            out.insert(0, step.in_schema(out[0], key) if step is last and isinstance(step, ValueToKey)
                       else step.in_schema(out[0]))
        return out

    def in_schema(self, target: pa.Schema, key: pa.StructType | None = None) -> pa.Schema:
        return pa.schema(list(self.schemas(target, key)[0]), metadata=target.metadata)

    def apply(self, converted: Converted, target: pa.Schema, key: pa.StructType | None = None) -> Converted:
        """``converted`` (decoded against :meth:`in_schema` of ``target``) as ``target``'s columns
        and, with ValueToKey and ``key``, the key column last."""
        table = converted.table
        failed: dict[int, tuple[str, str]] = {}  # row -> (reason, field): Cast's and TimestampConverter's
        key_array = None
        last = self._to_key()
        for step, out in zip(self.steps, self.schemas(target, key)[1:], strict=True):
            if step is last and isinstance(step, ValueToKey) and key is not None:
                key_array = step.key(table, key)
            if isinstance(step, (Cast, TimestampConverter)):
                table, bad = step.convert(table, out)
                for row, reason, name in bad:
                    failed.setdefault(row, (reason, name))  # a record fails at its first step, as in Connect
            else:
                table = step.apply(table, out)
        table = table.replace_schema_metadata(target.metadata)
        if key_array is not None and self.key_column is not None:
            table = table.append_column(pa.field(self.key_column, key_array.type), key_array)
        if not failed:
            return Converted(table, converted.indices, converted.rejects)
        keep = np.ones(table.num_rows, np.bool_)
        keep[list(failed)] = False
        index = converted.indices.to_numpy(zero_copy_only=False)
        rejects = [Reject(int(index[row]), reason, name) for row, (reason, name) in failed.items()]
        return Converted(table.filter(keep), converted.indices.filter(keep),
                         tuple(sorted([*converted.rejects, *rejects], key=lambda r: r.index)))
