"""The schema-registry wire format of a batch of values, read in bulk (:func:`frames`).

Confluent's serializers (Avro, Protobuf, JSON Schema; Apicurio's in its Confluent-compatible
mode) write each value as a magic byte ``0``, the schema id as a 4-byte big-endian integer,
then the payload. Protobuf payloads are preceded by the message indexes, the path of the
message in the schema's file: a zigzag varint count, then that many zigzag varints, with
``[0]`` (the file's first message) written as a single byte ``0``.

The header of every value is read at once with numpy over the batch's joined bytes (one
``pa.array`` of the values); only Protobuf values whose message is not the file's first have
their indexes read one by one. A value that is not in the format (too short, another magic
byte, indexes that run past its end) is a :class:`Reject` naming what was found, so it goes to
the dead letters and the rest of the batch keeps flowing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agents.convert import Reject

MAGIC: Final = 0
HEADER: Final = 5  # the magic byte and the schema id
#: What picks a value's message in a Protobuf schema: Confluent's message indexes, or the
#: top-level message's name in Apicurio's Ref (agents/formats/apicurio_proto.py).
Selector = tuple[int, ...] | str


class RegistrySchemaError(ValueError):
    """A registered schema that is malformed or cannot map to a table (its records are data
    errors): ``reason``, and the ``field`` it is about when there is one. Each format's decoder
    raises its own subclass (agents/formats/avro.py, protobuf.py, json_schema.py)."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(f"{reason} (at {field})" if field else reason)
        self.reason = reason
        self.field = field


@dataclass(frozen=True)
class Frames:
    """The values of a batch in the wire format: for each one kept (in input order) its input
    position, schema id, and payload as ``data[starts[k]:ends[k]]``; the others as rejects.
    ``indexes``: Protobuf message indexes per kept value (only when asked for), or the message
    name of Apicurio's Ref."""

    data: bytes
    positions: npt.NDArray[np.int64]
    ids: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    rejects: tuple[Reject, ...]
    indexes: tuple[Selector, ...] | None = None

    def payload(self, k: int) -> bytes:
        return self.data[self.starts[k]:self.ends[k]]

    def groups(self) -> dict[int, npt.NDArray[np.int64]]:
        """Kept values by schema id (row numbers into this object's arrays, ascending)."""
        order = np.argsort(self.ids, kind="stable")
        ids, first = np.unique(self.ids[order], return_index=True)
        return {int(i): part for i, part in zip(ids, np.split(order, first[1:]), strict=True)}


def frames(values: Sequence[bytes | None], *, protobuf: bool = False, id_bytes: int = 4, notes: bool = False) -> Frames:
    """Read the header of every value (and, with ``protobuf``, its message indexes). ``id_bytes``:
    the id's width (8: Apicurio's 8-byte ids, read as a signed long). ``notes``: a value whose
    first byte is ``0x01`` is a reject whose reason is the rest (Apicurio's headers mode,
    agents/formats/apicurio_headers.py)."""
    arr = pa.array(values, pa.binary())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4).astype(np.int64)
    data_buf = arr.buffers()[2]
    data = b"" if data_buf is None else data_buf.to_pybytes()
    raw = np.frombuffer(data, dtype=np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    lengths = ends - starts
    rejects: list[Reject] = []
    null = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    header = 1 + id_bytes
    short = ~null & (lengths < header)
    magic = np.full(n, -1, dtype=np.int64)
    has_byte = lengths > 0
    magic[has_byte] = raw[starts[has_byte]]
    wrong = ~null & ~short & (magic != MAGIC)
    for i in np.flatnonzero(null | short | wrong):
        note = notes and magic[i] == 0x01
        rejects.append(Reject(int(i), data[starts[i] + 1:ends[i]].decode("utf-8", "replace") if note
                              else _reason(bool(null[i]), int(lengths[i]), int(magic[i]), header), None))
    ok = ~(null | short | wrong)
    positions = np.flatnonzero(ok).astype(np.int64)
    s = starts[ok]
    if id_bytes == 8:  # Java's long, big-endian
        wide = np.zeros(len(s), dtype=np.uint64)
        for b in range(8):
            wide = (wide << np.uint64(8)) | raw[s + 1 + b].astype(np.uint64)
        ids = wide.view(np.int64)
    else:
        ids = (raw[s + 1].astype(np.int64) << 24) | (raw[s + 2].astype(np.int64) << 16) \
            | (raw[s + 3].astype(np.int64) << 8) | raw[s + 4].astype(np.int64)
        ids = np.where(ids >= 1 << 31, ids - (1 << 32), ids)  # Java's int: ids are signed
    out = Frames(data, positions, ids, s + header, ends[ok], tuple(rejects))
    return with_indexes(out) if protobuf else out


def _reason(null: bool, length: int, magic: int, header: int = HEADER) -> str:
    if null:
        return "no value (a tombstone) where a schema-registry value was expected"
    if length < header:
        return (f"not in the schema-registry wire format: {length} bytes, fewer than the {header} of the "
                "magic byte and schema id")
    hint = " (JSON text? set value.converter to JsonConverter)" if magic in (0x7B, 0x5B, 0x22) else ""
    return f"unknown magic byte 0x{magic:02x}: not in the schema-registry wire format{hint}"


def with_indexes(f: Frames) -> Frames:
    """``f`` with the Protobuf message indexes read and the payloads starting after them."""
    raw = np.frombuffer(f.data, dtype=np.uint8)
    starts = f.starts.copy()
    inbounds = starts < f.ends
    first = np.full(len(starts), -1, dtype=np.int64)
    first[inbounds] = raw[starts[inbounds]]
    indexes: list[Selector] = [(0,)] * len(starts)
    starts[first == 0] += 1  # the common case, [0], in one byte
    keep = np.ones(len(starts), dtype=np.bool_)
    rejects = list(f.rejects)
    for k in np.flatnonzero(first != 0):  # other messages: read their indexes one by one
        try:
            indexes[k], starts[k] = _read_indexes(f.data, int(starts[k]), int(f.ends[k]))
        except ValueError as exc:
            keep[k] = False
            rejects.append(Reject(int(f.positions[k]), f"Protobuf message indexes: {exc}", None))
    rejects.sort(key=lambda r: r.index)
    return Frames(f.data, f.positions[keep], f.ids[keep], starts[keep], f.ends[keep], tuple(rejects),
                  tuple(ix for ix, kept in zip(indexes, keep, strict=True) if kept))


def _read_indexes(data: bytes, at: int, end: int) -> tuple[tuple[int, ...], int]:
    count, at = _zigzag(data, at, end)
    if count < 0 or count > end - at:
        raise ValueError(f"a count of {count} at byte {at}, past the value's end")
    out = []
    for _ in range(count):
        index, at = _zigzag(data, at, end)
        if index < 0:
            raise ValueError(f"a negative index {index}")
        out.append(index)
    return tuple(out) or (0,), at


def _zigzag(data: bytes, at: int, end: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if at >= end or shift > 63:
            raise ValueError("a varint that runs past the value's end")
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), at
        shift += 7
