"""Partition labels: the directory names of a Spark-written partition tuple, Iceberg-like
(``2024-01-04`` for a day, ``3`` for a bucket), made unique and never empty so that each maps
back to exactly one partition value (spark_bridge/writer.py, steps 2 and 4)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.partitioning import PartitionField, PartitionSpec, partition_record_value
from pyiceberg.schema import Schema

from icesink.shared.errors import SparkWriteError
from icesink.shared.partitioning import partition_values

# Spark's name for a null (or empty) partition value.
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_SPARK_ESCAPED = frozenset(
    [chr(c) for c in range(0x01, 0x20)]
    + ['"', "#", "%", "'", "*", "/", ":", "=", "?", "\\", "\x7f", "{", "[", "]", "^"]
)
_UNESCAPE_RE = re.compile(r"%([0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class PartitionLabels:
    """Per partition field: the hidden column's name and label -> partition value."""

    column: str
    values: dict[str, Any]  # label -> value as stored in the partition Record


def spark_escape(text: str) -> str:
    """Spark's ``ExternalCatalogUtils.escapePathName``."""
    return "".join(f"%{ord(c):02X}" if c in _SPARK_ESCAPED else c for c in text)


def spark_unescape(text: str) -> str:
    return _UNESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), text)


def label_column_names(spec: PartitionSpec, data_columns: Sequence[str]) -> list[str]:
    """The partition field's name, unless a data column has it (identity): then a suffix."""
    taken = set(data_columns)
    names: list[str] = []
    for pf in spec.fields:
        name = pf.name
        if name in taken:
            base = f"{pf.name}_{'identity' if str(pf.transform) == 'identity' else 'part'}"
            name, k = base, 0
            while name in taken:
                k += 1
                name = f"{base}_{k}"
        taken.add(name)
        names.append(name)
    return names


def assign_labels(pf: PartitionField, schema: Schema, values: list[Any]) -> tuple[list[str | None], dict[str, Any]]:
    """A label per distinct value (None for null), unique and never empty or Spark's null name."""
    source_type = schema.find_field(pf.source_id).field_type
    stored = [None if v is None else partition_record_value(pf, v, schema) for v in values]
    human = [None if v is None else pf.transform.to_human_string(source_type, v) for v in stored]
    out: list[str | None] = [None] * len(values)
    used: set[str] = set()
    # Natural names first, so real values keep them; then the ones that need a suffix.
    for i, h in enumerate(human):
        if h is not None and h not in ("", HIVE_DEFAULT_PARTITION) and h not in used:
            out[i] = h
            used.add(h)
    for i, h in enumerate(human):
        if h is not None and out[i] is None:
            k = 1
            while f"{h}~{k}" in used:
                k += 1
            out[i] = f"{h}~{k}"
            used.add(f"{h}~{k}")
    mapping = {label: value for label, value in zip(out, stored, strict=True) if label is not None}
    return out, mapping


def with_label_columns(
    data: pa.Table, spec: PartitionSpec, schema: Schema
) -> tuple[pa.Table, list[PartitionLabels], int]:
    values = partition_values(data, spec, schema)
    names = label_column_names(spec, data.column_names)
    labels: list[PartitionLabels] = []
    extended = data
    for pf, name, column in zip(spec.fields, names, values.columns, strict=True):
        distinct = pc.unique(column)
        label_list, mapping = assign_labels(pf, schema, distinct.to_pylist())
        index = pc.index_in(column, value_set=distinct, skip_nulls=False)
        extended = extended.append_column(name, pa.array(label_list, pa.string()).take(index))
        labels.append(PartitionLabels(column=name, values=mapping))
    n_tuples = extended.select(names).group_by(names).aggregate([]).num_rows
    return extended, labels, n_tuples


def partition_directories(
    extended: pa.Table, labels: Sequence[PartitionLabels]
) -> Iterator[tuple[str, pa.Array | None]]:
    """(relative directory, row indices) per partition tuple, the way Spark names them
    (``col=label/...``, escaped, ``__HIVE_DEFAULT_PARTITION__`` for null); ("", None): all rows."""
    if not labels:
        yield "", None
        return
    segments: list[pa.Array] = []
    for lbl in labels:
        column = extended.column(lbl.column).combine_chunks()
        distinct = pc.unique(column)
        names = [
            f"{spark_escape(lbl.column)}={HIVE_DEFAULT_PARTITION if v is None else spark_escape(v)}"
            for v in distinct.to_pylist()
        ]
        segments.append(pa.array(names, pa.string()).take(pc.index_in(column, value_set=distinct, skip_nulls=False)))
    encoded = pc.dictionary_encode(pc.binary_join_element_wise(*segments, "/"))
    codes = encoded.indices.to_numpy()
    order = np.argsort(codes, kind="stable")
    bounds = np.cumsum(np.bincount(codes, minlength=len(encoded.dictionary)))
    for code, directory in enumerate(encoded.dictionary.to_pylist()):
        start = 0 if code == 0 else int(bounds[code - 1])
        yield directory, pa.array(order[start : int(bounds[code])])


def parse_partition_dirs(
    dirs: Sequence[str], labels: Sequence[PartitionLabels], relative: str
) -> tuple[str | None, ...]:
    if len(dirs) != len(labels):
        raise SparkWriteError(f"unexpected file {relative!r}: expected {len(labels)} partition directories")
    key: list[str | None] = []
    for part, lbl in zip(dirs, labels, strict=True):
        name, sep, value = part.partition("=")
        if not sep or spark_unescape(name) != lbl.column:
            raise SparkWriteError(f"unexpected directory {part!r} in {relative!r}: expected {lbl.column}=<value>")
        if value == HIVE_DEFAULT_PARTITION:
            key.append(None)
            continue
        label = spark_unescape(value)
        if label not in lbl.values:
            raise SparkWriteError(f"directory {part!r} in {relative!r} names no partition value of this write")
        key.append(label)
    return tuple(key)
