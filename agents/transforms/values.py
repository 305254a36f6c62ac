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
import pyarrow as pa

from agents.convert import Converted, Reject
from agents.transforms.copy_value import CopyValue
from agents.transforms.dms import DmsTransform
from agents.transforms.hoist_field import HoistField
from agents.transforms.json_to_map import JsonToMap
from agents.transforms.mongo import MongoDebezium
from agents.transforms.replace_field import ReplaceField
from agents.transforms.unwrap import ExtractNewRecordState
from icesink.shared.transform_settings import TransformSpec

__all__ = ["ValueChain", "VALUE_KINDS", "mongo_before_debezium"]

VALUE_KINDS = ("replace-field", "copy-value", "hoist-field", "unwrap", "dms", "json-to-map", "mongo-debezium")


class ValueStep(Protocol):
    def out_schema(self, s: pa.Schema) -> pa.Schema: ...

    def in_schema(self, t: pa.Schema) -> pa.Schema: ...

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table: ...


class ValueChain:
    """``schemas``: the values state a schema (Connect envelopes, a schema registry):
    ExtractNewRecordState acts on them only, as Debezium (schemaless values pass it unchanged).
    A step with ``screen(table)`` drops and rejects records before its ``apply``; one with
    ``convert(table, out)`` rejects records its ``apply`` cannot convert."""

    def __init__(self, specs: Sequence[TransformSpec], schemas: bool = True) -> None:
        self.steps: list[ValueStep] = []
        for s in specs:
            if s.kind == "unwrap" and schemas:
                self.steps.append(ExtractNewRecordState(s))
            elif s.kind == "dms":
                self.steps.append(DmsTransform(s))
            elif s.kind == "json-to-map":
                self.steps.append(JsonToMap(s))
            elif s.kind == "mongo-debezium" and not any(x.kind == "debezium" for x in specs):
                self.steps.append(MongoDebezium(s))  # before DebeziumTransform it is that one's (agents/debezium.py)
            if s.kind == "replace-field":
                self.steps.append(ReplaceField(s))
            elif s.kind == "copy-value":
                self.steps.append(CopyValue(s))
            elif s.kind == "hoist-field":
                self.steps.append(HoistField(s))

    def __bool__(self) -> bool:
        return bool(self.steps)

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

    def schemas(self, target: pa.Schema) -> list[pa.Schema]:
        """The schema before each step and after the last, for a chain ending in ``target``."""
        out = [target]
        for step in reversed(self.steps):
            out.insert(0, step.in_schema(out[0]))
        return out

    def in_schema(self, target: pa.Schema) -> pa.Schema:
        return pa.schema(list(self.schemas(target)[0]), metadata=target.metadata)

    def apply(self, converted: Converted, target: pa.Schema, keys: Sequence[bytes | None] = ()) -> Converted:
        """``converted`` (decoded against :meth:`in_schema` of ``target``) as ``target``'s columns.
        ``keys``: the records' keys by input index (MongoDebeziumTransform's ``_id`` of a partial update)."""
        table, indices, rejects = converted.table, converted.indices, list(converted.rejects)
        for step, out in zip(self.steps, self.schemas(target)[1:], strict=True):
            screen = getattr(step, "screen", None)
            if screen is not None and table.num_rows:
                drop, bad = screen(table)
                at = indices.to_numpy(zero_copy_only=False)
                for mask, reason, field in bad:
                    rejects += [Reject(int(i), reason, field) for i in at[mask]]
                    drop = drop | mask
                if drop.any():
                    keep = pa.array(~drop)
                    table, indices = table.filter(keep), indices.filter(keep)
            convert = getattr(step, "convert", None)
            if convert is None:
                table = step.apply(table, out)
                continue
            at = indices.to_numpy(zero_copy_only=False)
            table, failed = convert(table, out, [keys[i] for i in at] if keys else None)
            drop = np.zeros(table.num_rows, dtype=bool)
            for mask, reason, field in failed:
                rejects += [Reject(int(i), reason, field) for i in at[mask & ~drop]]
                drop |= mask
            if drop.any():
                keep = pa.array(~drop)
                table, indices = table.filter(keep), indices.filter(keep)
        rejects.sort(key=lambda r: r.index)
        return Converted(table.replace_schema_metadata(target.metadata), indices, tuple(rejects))


def mongo_before_debezium(specs: Sequence[TransformSpec]) -> ValueChain | None:
    """MongoDebeziumTransform as DebeziumTransform runs it first (both listed, checked at start), or None."""
    mongo = [s for s in specs if s.kind == "mongo-debezium"]
    return ValueChain(mongo) if mongo and any(s.kind == "debezium" for s in specs) else None
