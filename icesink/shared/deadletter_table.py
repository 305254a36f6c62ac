"""The dead-letter table (``deadletter.table``): its fixed schema, its rows, its creation.

A dead letter becomes a row buffered for this table in the chunk of the partition batch that
held the bad record (agents/ingest.py), so it is written and committed by the same round as
that batch's good rows, with the same partition positions: the round that moves a partition's
position past a bad record commits its row, and a re-read after a crash cannot double it
(docs/deadletters.md). Replay (icesink/app/deadletters.py) reads the rows back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType, IntegerType, ListType, LongType, NestedField, StringType, StructType, TimestamptzType,
)

from icesink.shared.errors import ConfigError
from icesink.shared.iceberg import CREATED_TABLE_PROPERTIES, split_name

log = logging.getLogger(__name__)

SCHEMA = Schema(
    NestedField(1, "topic", StringType(), required=True, doc="origin topic"),
    NestedField(2, "partition", IntegerType(), required=True, doc="origin partition"),
    NestedField(3, "offset", LongType(), required=True, doc="origin offset"),
    NestedField(4, "timestamp", TimestamptzType(), required=False, doc="the record's timestamp"),
    NestedField(5, "key", BinaryType(), required=False, doc="the record's key, as read"),
    NestedField(6, "value", BinaryType(), required=False, doc="the record's value, as read"),
    NestedField(7, "headers", ListType(8, StructType(
        NestedField(9, "key", StringType(), required=True),
        NestedField(10, "value", BinaryType(), required=False),
    ), element_required=True), required=False, doc="the record's own headers, in order"),
    NestedField(11, "reason", StringType(), required=True,
                doc="malformed, uncoercible, missing-required, missing-key, no-operation, too-large, no-route"),
    NestedField(12, "error", StringType(), required=False, doc="the error message"),
    NestedField(13, "field", StringType(), required=False, doc="dotted path of the field at fault"),
    NestedField(14, "tables", StringType(), required=False, doc="the target table(s) that rejected it"),
    NestedField(15, "connector", StringType(), required=True, doc="the sink group (group.id)"),
)
COLUMNS = tuple(f.name for f in SCHEMA.fields)
REQUIRED = ("topic", "partition", "offset", "value", "key", "headers", "timestamp")  # what replay reads


def letter_rows(letters: Sequence[Any], connector: str, schema: pa.Schema) -> pa.Table:
    """The rows of ``letters`` (agents/deadletter.py Letter) in the table's Arrow ``schema`` (rare: one
    Python row per letter)."""
    rows: list[dict[str, Any]] = [{
        "topic": x.topic, "partition": x.partition, "offset": x.offset,
        "timestamp": None if x.timestamp_ms is None else x.timestamp_ms * 1000,
        "key": x.key, "value": x.value,
        "headers": [{"key": k, "value": v} for k, v in x.original_headers],
        "reason": x.kind, "error": x.error, "field": x.field, "tables": x.tables, "connector": connector,
    } for x in letters]
    cols: dict[str, pa.Array] = {}
    for f in schema:
        values = [r.get(f.name) for r in rows]
        if pa.types.is_timestamp(f.type):  # micros since the epoch, whatever the unit
            cols[f.name] = pa.array(values, pa.int64()).cast(pa.timestamp("us", "UTC")).cast(f.type)
        else:
            cols[f.name] = pa.array(values, f.type)
    return pa.Table.from_arrays(list(cols.values()), schema=schema)


def ensure_table(catalog: Catalog, name: str) -> Table:
    """``name`` as the catalog has it, created with :data:`SCHEMA` if missing (also without
    ``iceberg.tables.auto-create-enabled``: the key asks for it). An existing table must have the
    columns replay reads."""
    try:
        table = catalog.load_table(name)
    except NoSuchTableError:
        namespace, _ = split_name(name)
        try:
            catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            pass
        except Exception:  # a lost race reported otherwise (SQL catalog); or it exists
            log.debug("namespace %s not created (it may exist)", namespace, exc_info=True)
        try:
            table = catalog.create_table(name, schema=SCHEMA, properties=CREATED_TABLE_PROPERTIES)
            log.info("created dead-letter table %s", name)
        except TableAlreadyExistsError:
            table = catalog.load_table(name)
    have = {f.name for f in table.schema().fields}
    if missing := [c for c in REQUIRED if c not in have]:
        raise ConfigError("deadletter.table", name, f"a table with columns {', '.join(COLUMNS)} (it lacks "
                          f"{', '.join(missing)}), or a name that does not exist yet (created with them)")
    return table


# Replay's record (icesink/app/deadletters.py): in a target table's properties, written in the
# same commit as the rows, the origin offsets of the letters whose rows the table holds.
Ranges = dict[tuple[str, int], list[tuple[int, int]]]  # (topic, partition) -> sorted [start, end)


def property_key(dl: str) -> str:
    return f"icesink.replayed.{dl}"


def parse_ranges(text: str | None) -> Ranges:
    """``topic:partition:start-end,...`` (end exclusive; topic names hold no ``:``)."""
    out: Ranges = {}
    for item in (text or "").split(","):
        if item:
            topic, partition, span = item.rsplit(":", 2)
            start, end = span.split("-")
            out.setdefault((topic, int(partition)), []).append((int(start), int(end)))
    return {tp: sorted(r) for tp, r in out.items()}


def format_ranges(ranges: Ranges) -> str:
    return ",".join(f"{t}:{p}:{s}-{e}" for (t, p), spans in sorted(ranges.items()) for s, e in spans)


def read_ranges(table: Table, dl: str) -> Ranges:
    return parse_ranges(table.properties.get(property_key(dl)))


def add_ranges(ranges: Ranges, keys: Iterable[tuple[str, int, int]]) -> str:
    """``ranges`` with the offsets ``keys`` (topic, partition, offset) added, merged, as text."""
    points: dict[tuple[str, int], list[tuple[int, int]]] = {tp: list(r) for tp, r in ranges.items()}
    for t, p, o in keys:
        points.setdefault((t, p), []).append((o, o + 1))
    merged: Ranges = {}
    for tp, spans in points.items():
        out: list[tuple[int, int]] = []
        for s, e in sorted(spans):
            if out and s <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], e))
            else:
                out.append((s, e))
        merged[tp] = out
    return format_ranges(merged)


def covered(ranges: Ranges, letters: pa.Table) -> npt.NDArray[np.bool_]:
    """For each row of ``letters`` (topic, partition, offset columns): whether ``ranges`` hold it."""
    out = np.zeros(letters.num_rows, dtype=bool)
    if not ranges or not letters.num_rows:
        return out
    topics = letters["topic"].to_numpy(zero_copy_only=False)
    partitions = letters["partition"].to_numpy(zero_copy_only=False)
    offsets = letters["offset"].to_numpy(zero_copy_only=False)
    for (t, p), spans in ranges.items():
        rows = np.flatnonzero((topics == t) & (partitions == p))
        starts = np.array([s for s, _ in spans], dtype=np.int64)
        ends = np.array([e for _, e in spans], dtype=np.int64)
        i = np.searchsorted(starts, offsets[rows], side="right") - 1
        out[rows] = (i >= 0) & (offsets[rows] < ends[np.maximum(i, 0)])
    return out
