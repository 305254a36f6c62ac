"""The columns built from the messages rather than the value: the record key and the Kafka
metadata (topic, partition, offset, timestamp, headers), as Arrow arrays (:class:`Extras`), and
their assembly with the decoded value columns (:func:`assemble`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import (
    BinaryType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from agents.convert import Converted, Reject, struct_array
from icesink.shared.errors import ConfigError

if TYPE_CHECKING:
    from agents.formats.registry_keys import RegistryKeys


_META_TYPES: Final[Mapping[str, tuple[pa.DataType, IcebergType]]] = {
    "topic": (pa.string(), StringType()),
    "partition": (pa.int32(), IntegerType()),
    "offset": (pa.int64(), LongType()),
    "timestamp": (pa.timestamp("us", tz="UTC"), TimestamptzType()),
    "headers": (
        pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
        ListType(0, StructType(NestedField(0, "key", StringType()), NestedField(0, "value", BinaryType()))),
    ),
}


@dataclass(frozen=True)
class Extras:
    """The columns built from the messages rather than the value."""

    key_column: str | None
    key_binary: bool
    metadata: str | None  # field name (or prefix), None when off
    nested: bool
    #: With a headers column (iceberg.tables.kafka-metadata-enabled); the reference's
    #: KafkaMetadataTransform adds topic, partition, offset and timestamp only.
    headers: bool = True
    #: InsertField$Value's columns: (column, source, required), icesink.shared.transform_settings.inserted_fields.
    inserted: tuple[tuple[str, str, bool], ...] = ()
    #: The key column is ValueToKey's struct (agents/transforms/value_to_key.py), built with the values.
    key_from_value: bool = False
    #: Registry-framed keys (key.converter = a registry converter): the key column's type and values.
    registry_keys: RegistryKeys | None = field(default=None, compare=False, repr=False)

    def _meta(self) -> list[str]:
        return [k for k in _META_TYPES if self.headers or k != "headers"]

    def names(self) -> set[str]:
        out = {self.key_column} if self.key_column else set()
        out |= {name for name, _, _ in self.inserted}
        if self.metadata:
            out |= {self.metadata} if self.nested else {f"{self.metadata}_{k}" for k in self._meta()}
        return out

    def iceberg_fields(self) -> list[NestedField]:
        out = []
        if self.key_column:
            out.append(NestedField(0, self.key_column, self._key_type()))
        if self.metadata:
            meta = [NestedField(0, k, t) for k, (_, t) in _META_TYPES.items() if k in self._meta()]
            if self.nested:
                out.append(NestedField(0, self.metadata, StructType(*meta)))
            else:
                out += [NestedField(0, f"{self.metadata}_{f.name}", f.field_type) for f in meta]
        for name, source, required in self.inserted:
            t = StringType() if source.startswith("static:") else _META_TYPES[source][1]
            out.append(NestedField(0, name, t, required=required))
        return out

    def columns(self, messages: Sequence[Any], target: pa.Schema) -> tuple[dict[str, pa.Array], list[Reject]]:
        """The extra columns ``target`` has, for every message; keys that cannot fill the key column are rejects."""
        out: dict[str, pa.Array] = {}
        rejects: list[Reject] = []
        names = set(target.names)
        if self.key_column and self.key_column in names and not self.key_from_value:
            out[self.key_column], rejects = self._keys(messages, target.field(self.key_column).type)
        if self.inserted:
            present = [(name, source) for name, source, _ in self.inserted if name in names]
            meta_of = metadata_arrays(messages, {s for _, s in present if not s.startswith("static:")})
            for name, source in present:
                t = target.field(name).type
                if source.startswith("static:"):
                    out[name] = pa.repeat(pa.scalar(source[len("static:"):], pa.string()), len(messages)).cast(t)
                else:
                    out[name] = _fit(meta_of[source], t, name)
        if not self.metadata:
            return out, rejects
        wanted = {k for k in self._meta() if (self.metadata if self.nested else f"{self.metadata}_{k}") in names}
        if not wanted:
            return out, rejects
        meta = metadata_arrays(messages, wanted if not self.nested else set(self._meta()))
        if self.nested:
            t = target.field(self.metadata).type
            if not pa.types.is_struct(t):
                raise ConfigError("iceberg.tables.kafka-metadata-field", self.metadata,
                                  f"a struct column for nested Kafka metadata (the table has {t})")
            children = [_fit(meta[c.name], c.type, f"{self.metadata}.{c.name}") if c.name in meta
                        else pa.nulls(len(messages), c.type) for c in t]
            out[self.metadata] = struct_array(children, t, len(messages))
        else:
            for k in wanted:
                name = f"{self.metadata}_{k}"
                out[name] = _fit(meta[k], target.field(name).type, name)
        return out, rejects

    def _key_type(self) -> IcebergType:
        if self.registry_keys is None or self.key_from_value:  # ValueToKey's: RecordFormat.with_extras sets it
            return BinaryType() if self.key_binary else StringType()
        found = self.registry_keys.key_type()
        if found is None:  # no record of the fetch that creates the table has a key schema
            raise KeyColumnUnknown(f"the type of key column {self.key_column!r}: no key of these records has a "
                                   "schema the registry holds")
        return found

    def _keys(self, messages: Sequence[Any], t: pa.DataType) -> tuple[pa.Array, list[Reject]]:
        assert self.key_column is not None
        if self.registry_keys is not None:
            keys = [m.key for m in messages]
            if self.registry_keys.headers is not None:  # Apicurio's headers mode: framed from the headers
                keys = list(self.registry_keys.framed(keys, [m.headers for m in messages]))
            return self.registry_keys.key_column(keys, t)
        return bytes_column([m.key for m in messages], t, "record key", self.key_column)


class KeyColumnUnknown(ValueError):
    """A table with a registry key column cannot be created yet: no key schema is known."""


def bytes_column(raw: Sequence[bytes | None], t: pa.DataType, what: str, column: str) -> tuple[pa.Array, list[Reject]]:
    """``raw`` as a column of type ``t`` (binary as they are, string when they are UTF-8 text:
    one bulk cast, and only when it fails a look for the bad ones, each a reject naming
    ``what`` and ``column``)."""
    arr = pa.array(raw, pa.binary())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return arr.cast(t), []
    try:
        return arr.cast(t), []
    except pa.ArrowInvalid:
        pass
    rejects, text = [], []
    for i, b in enumerate(raw):  # rare: find the ones that are not UTF-8
        try:
            text.append(None if b is None else bytes(b).decode("utf-8"))
        except UnicodeDecodeError as exc:
            text.append(None)
            rejects.append(Reject(i, f"{what} is not UTF-8 text (byte {exc.start}: {exc.reason})", column))
    return pa.array(text, t), rejects


def metadata_arrays(messages: Sequence[Any], wanted: set[str]) -> dict[str, pa.Array]:
    n = len(messages)
    out: dict[str, pa.Array] = {}
    if "topic" in wanted:
        out["topic"] = pa.array([m.topic for m in messages], pa.string())
    if "partition" in wanted:
        out["partition"] = pa.array(np.fromiter((m.partition for m in messages), np.int32, n))
    if "offset" in wanted:
        out["offset"] = pa.array(np.fromiter((m.offset for m in messages), np.int64, n))
    if "timestamp" in wanted:  # aiokafka's records: ms since the epoch; Kafka's -1 means none
        ms = np.fromiter((-1 if m.timestamp is None else m.timestamp for m in messages), np.int64, n)
        missing = ms < 0
        out["timestamp"] = pa.array(np.where(missing, 0, ms), mask=missing)
    if "headers" in wanted:
        out["headers"] = _headers(messages)
    return out


def _headers(messages: Sequence[Any]) -> pa.Array:
    t = _META_TYPES["headers"][0]
    lists = [_header_pairs(m.headers) for m in messages]
    offsets = np.zeros(len(lists) + 1, dtype=np.int32)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    pairs = [p for x in lists for p in x]
    keys = pa.array([k for k, _ in pairs], pa.string())
    values = pa.array([None if v is None else bytes(v) for _, v in pairs], pa.binary())
    entries = pa.StructArray.from_arrays([keys, values], fields=list(t.value_type))
    return pa.ListArray.from_arrays(pa.array(offsets), entries, type=t)


def _header_pairs(headers: Any) -> list[tuple[str, Any]]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k), v) for k, v in items]


def _fit(arr: pa.Array, t: pa.DataType, column: str) -> pa.Array:
    """A metadata array as the column type of an existing table (epoch ms for integer timestamps)."""
    if arr.type.equals(t):
        return arr
    if pa.types.is_timestamp(t) and pa.types.is_int64(arr.type):
        return arr.cast(pa.timestamp("ms", tz=t.tz)).cast(t)
    try:
        return arr.cast(t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ConfigError("iceberg.tables.kafka-metadata-enabled", True,
                          f"a table column {column!r} that can hold the Kafka metadata, not {t} ({exc})") from None


def assemble(converted: Converted, columns: dict[str, pa.Array], key_rejects: list[Reject], target: pa.Schema) -> Converted:
    """The decoded value columns and the extra columns (taken at the decoded rows), as ``target``."""
    rows = converted.indices
    table = converted.table
    rejects = list(converted.rejects)
    if key_rejects:
        bad = pa.array(np.isin(rows.to_numpy(), [r.index for r in key_rejects]))
        keep = pc.invert(bad)
        table, rows = table.filter(keep), rows.filter(keep)
        rejects = sorted(rejects + key_rejects, key=lambda r: r.index)
    arrays = []
    for f in target:
        if f.name in columns:
            arrays.append(columns[f.name].take(rows))
        else:
            arrays.append(table.column(f.name).combine_chunks() if table.num_rows else pa.array([], f.type))
    out = pa.Table.from_arrays(arrays, schema=target)
    return Converted(out, rows, tuple(rejects))
