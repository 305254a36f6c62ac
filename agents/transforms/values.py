"""The transforms that change a record's value, as steps over its decoded Arrow columns.

Each step maps schemas both ways (``out_schema``: the value's fields after it, what an
auto-created table gets; ``in_schema``: what to decode so that it can give a table's columns)
and maps a decoded table (``apply``), column-wise. :class:`ValueChain` composes the configured
ones in order; :class:`agents.formats.RecordFormat` decodes against the chain's ``in_schema``
and applies it before the key and metadata columns are added."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agents.convert import Converted, Reject
from agents.transforms.cast import Cast
from agents.transforms.copy_value import CopyValue
from agents.transforms.dms import DmsTransform
from agents.transforms.hoist_field import HoistField
from agents.transforms.json_to_map import JsonToMap
from agents.transforms.mongo import MongoDebezium
from agents.transforms.replace_field import ReplaceField
from agents.transforms.timestamp_converter import TimestampConverter
from agents.transforms.unwrap import ExtractNewRecordState
from agents.transforms.value_to_key import ValueToKey
from icesink.shared.transform_settings import TransformSpec

__all__ = ["ValueChain", "VALUE_KINDS", "mongo_before_debezium"]

VALUE_KINDS = ("replace-field", "copy-value", "hoist-field", "unwrap", "dms", "json-to-map", "mongo-debezium", "cast",
               "timestamp-converter", "value-to-key")


class ValueStep(Protocol):
    def out_schema(self, s: pa.Schema) -> pa.Schema: ...

    def in_schema(self, t: pa.Schema) -> pa.Schema: ...

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table: ...


class ValueChain:
    """``schemas``: the values state a schema (Connect envelopes, a schema registry):
    ExtractNewRecordState acts on them only, as Debezium (schemaless values pass it unchanged).
    A step with ``screen(table)`` drops and rejects records before its ``apply``; Cast's and
    TimestampConverter's records that do not convert are rejected at that step (a record fails
    at its first step, as in Connect), as are MongoDebeziumTransform's (its ``convert``).
    ``key_column``: where ValueToKey's key lands."""

    def __init__(self, specs: Sequence[TransformSpec], schemas: bool = True, key_column: str | None = None) -> None:
        self.steps: list[ValueStep] = []
        for s in specs:
            if s.kind == "unwrap":
                if schemas:
                    self.steps.append(ExtractNewRecordState(s))
            elif s.kind == "dms":
                self.steps.append(DmsTransform(s))
            elif s.kind == "json-to-map":
                self.steps.append(JsonToMap(s))
            elif s.kind == "mongo-debezium":
                if not any(x.kind == "debezium" for x in specs):  # else DebeziumTransform's (agents/debezium.py)
                    self.steps.append(MongoDebezium(s))
            elif s.kind == "replace-field":
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

    @property
    def needs_keys(self) -> bool:
        """Whether :meth:`apply` reads the records' keys (MongoDebeziumTransform's partial updates)."""
        return any(isinstance(x, MongoDebezium) for x in self.steps)

    def wrap(self, values: Sequence[bytes]) -> Sequence[bytes]:
        """The values as the JSON decode reads them (JsonToMapTransform's ``json.root``: each one
        the ``payload`` of an object); JsonToMap comes first (checked at start)."""
        first = self.steps[0] if self.steps else None
        return first.wrap(values) if isinstance(first, JsonToMap) else values

    def out_schema(self, s: pa.Schema, values: Sequence[bytes] = ()) -> pa.Schema:
        """``values``: the raw values, for a step whose types are in them (MongoDebeziumTransform's
        documents; it comes first, checked at start)."""
        for step in self.steps:
            s = step.out_schema(s, values) if isinstance(step, MongoDebezium) else step.out_schema(s)
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

    def apply(self, converted: Converted, target: pa.Schema, key: pa.StructType | None = None,
              keys: Sequence[bytes | None] = ()) -> Converted:
        """``converted`` (decoded against :meth:`in_schema` of ``target``) as ``target``'s columns
        and, with ValueToKey and ``key``, the key column last. ``keys``: the records' keys by input
        index, when :attr:`needs_keys` (MongoDebeziumTransform's ``_id`` of a partial update)."""
        table, indices, rejects = converted.table, converted.indices, list(converted.rejects)
        key_array: pa.Array | None = None
        last = self._to_key()
        for step, out in zip(self.steps, self.schemas(target, key)[1:], strict=True):
            screen = getattr(step, "screen", None)
            if screen is not None and table.num_rows:
                drop, bad = screen(table)
                at = indices.to_numpy(zero_copy_only=False)
                for mask, reason, field in bad:
                    rejects += [Reject(int(i), reason, field) for i in at[mask]]
                    drop = drop | mask
                if drop.any():
                    table, indices, key_array = _keep(~drop, table, indices, key_array)
            if step is last and isinstance(step, ValueToKey) and key is not None:
                key_array = step.key(table, key)
            if isinstance(step, MongoDebezium):
                at = indices.to_numpy(zero_copy_only=False)
                table, bad = step.convert(table, out, [keys[i] for i in at] if keys else None)
                drop = np.zeros(table.num_rows, dtype=bool)
                for mask, reason, field in bad:
                    rejects += [Reject(int(i), reason, field) for i in at[mask & ~drop]]
                    drop |= mask
                if drop.any():
                    table, indices, key_array = _keep(~drop, table, indices, key_array)
            elif isinstance(step, (Cast, TimestampConverter)):
                table, failed = step.convert(table, out)
                if failed:
                    at = indices.to_numpy(zero_copy_only=False)
                    first: dict[int, tuple[str, str]] = {}
                    for row, reason, name in failed:
                        first.setdefault(row, (reason, name))  # one reject a record, its first field's
                    rejects += [Reject(int(at[row]), reason, name) for row, (reason, name) in first.items()]
                    keep = np.ones(table.num_rows, np.bool_)
                    keep[list(first)] = False
                    table, indices, key_array = _keep(keep, table, indices, key_array)
            else:
                table = step.apply(table, out)
        table = table.replace_schema_metadata(target.metadata)
        if key_array is not None and self.key_column is not None:
            table = table.append_column(pa.field(self.key_column, key_array.type), key_array)
        rejects.sort(key=lambda r: r.index)
        return Converted(table, indices, tuple(rejects))


def _keep(keep: npt.NDArray[np.bool_], table: pa.Table, indices: pa.Array,
          key_array: pa.Array | None) -> tuple[pa.Table, pa.Array, pa.Array | None]:
    """The rows of ``keep`` of a batch in the chain: its columns, record indices and key."""
    mask = pa.array(keep)
    return table.filter(mask), indices.filter(mask), None if key_array is None else key_array.filter(mask)


def mongo_before_debezium(specs: Sequence[TransformSpec]) -> ValueChain | None:
    """MongoDebeziumTransform as DebeziumTransform runs it first (both listed, checked at start), or None."""
    mongo = [s for s in specs if s.kind == "mongo-debezium"]
    return ValueChain(mongo) if mongo and any(s.kind == "debezium" for s in specs) else None
