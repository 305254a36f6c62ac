"""Apicurio's own Protobuf frame (``value.converter`` = ``io.apicurio.registry.utils.converter.ProtobufConverter``;
issue 36; and ``key.converter``): :func:`apicurio_frames`, :class:`ApicurioProtobufValues` and
:class:`ApicurioProtobufKeys`.

Apicurio's ProtobufKafkaSerializer (2.4: serdes/protobuf-serde; 3.x: serdes/generic/serde-common-protobuf),
headers off, writes each value as::

    0x00                    magic byte
    id                      4 bytes (Default4ByteIdHandler, Legacy4ByteIdHandler, as-confluent=true)
                            or 8 bytes (DefaultIdHandler, Legacy8ByteIdHandler), big-endian:
                            the content id or the global id (apicurio.registry.use-id)
    [indexes]               3.x with send-indexes=true only: Confluent's zigzag message indexes
    varint n, Ref (n bytes) Ref.writeDelimitedTo: message Ref { string name = 1; }, the simple name
                            of the value's message, a top-level message of the schema
    payload                 the message's Protobuf bytes

The header is read in bulk (:func:`agents.formats.registry_wire.frames` with the id's width);
the Refs too: the values whose Ref length fits one byte (names under 126 characters) are grouped
by that length and their Ref bytes compared as numpy rows (one pass per distinct Ref), so each
distinct Ref is parsed once per fetch; only longer Refs are read one by one. The Ref's name picks the message
(:class:`agents.formats.registry_values.RegistryValues` finds it among the schema's top-level
messages when it first meets the id). A value whose Ref runs past its end, does not parse, or
names no message of its schema is a reject naming what was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from agents.convert import Reject
from agents.formats.registry_keys import RegistryKeys
from agents.formats.registry_values import RegistryValues, SchemaById
from agents.formats.registry_wire import Frames, Selector, with_indexes, frames
from icesink.shared.registry_settings import ApicurioFrame, ApicurioHeaders, DecodeOptions


class ApicurioProtobufValues(RegistryValues):
    """Values in Apicurio's Protobuf frame, decoded per (id, Ref name) as Confluent's are per
    (schema id, message indexes); ``schema_of`` answers for the frame's kind of id."""

    def __init__(self, schema_of: SchemaById, frame: ApicurioFrame, options: DecodeOptions | None = None,
                 headers: ApicurioHeaders | None = None) -> None:
        super().__init__(schema_of, "protobuf", options, headers)
        self.frame = frame

    def _frames(self, values: Sequence[bytes]) -> Frames:
        return _cached_frames(self, self.frame, values)


class ApicurioProtobufKeys(RegistryKeys):
    """Keys in Apicurio's Protobuf frame (``key.converter`` = its ProtobufConverter): a message
    each, one struct key column, framed as :class:`ApicurioProtobufValues` frames values."""

    def __init__(self, schema_of: SchemaById, column: str, frame: ApicurioFrame,
                 options: DecodeOptions | None = None, headers: ApicurioHeaders | None = None) -> None:
        super().__init__(schema_of, column, "protobuf", options, headers)
        self.frame = frame

    def _frames(self, values: Sequence[bytes]) -> Frames:
        return _cached_frames(self, self.frame, values)


def _cached_frames(decoder: RegistryValues, frame: ApicurioFrame, values: Sequence[bytes]) -> Frames:
    """A fetch's values framed once (the decoder's ``_last``, as its base class keeps it)."""
    if decoder._last is None or decoder._last[0] is not values:
        decoder._last = (values, apicurio_frames(values, frame, notes=decoder.headers is not None))
    return decoder._last[1]


def apicurio_frames(values: Sequence[bytes], frame: ApicurioFrame, notes: bool = False) -> Frames:
    """Every value's id and Ref name (``Frames.indexes``: the names), payloads after the Ref.
    ``notes``: as :func:`agents.formats.registry_wire.frames`' (headers mode)."""
    f = frames(values, id_bytes=frame.id_bytes, notes=notes)
    if frame.indexes:  # skipped, as Apicurio's deserializer does: the Ref names the message
        f = with_indexes(f)
    return _with_refs(f)


def _with_refs(f: Frames) -> Frames:
    raw = np.frombuffer(f.data, dtype=np.uint8)
    n = len(f.starts)
    starts, ends = f.starts, f.ends
    names: npt.NDArray[np.object_] = np.full(n, None, dtype=object)
    after = np.zeros(n, dtype=np.int64)  # where each value's payload starts
    bad: dict[int, str] = {}
    first = np.full(n, -1, dtype=np.int64)
    inbounds = starts < ends
    first[inbounds] = raw[starts[inbounds]]
    for k in np.flatnonzero(~inbounds).tolist():
        bad[k] = "no Ref message after the id (the value ends there)"
    short = inbounds & (first < 0x80)  # a one-byte length: the common case, in bulk
    fits = short & (starts + 1 + first <= ends)
    for k in np.flatnonzero(short & ~fits).tolist():
        bad[k] = f"a Ref of {int(first[k])} bytes runs past the value's end"
    for length in np.unique(first[fits]).tolist():
        rows = np.flatnonzero(fits & (first == length))
        after[rows] = starts[rows] + 1 + length
        if length == 0:
            names[rows] = ""
            continue
        mat = raw[(starts[rows] + 1)[:, None] + np.arange(length)]
        left = np.arange(len(rows))
        while len(left):  # one pass per distinct Ref (a fetch's values name few message types)
            same = (mat[left] == mat[left[0]]).all(axis=1)
            got = _ref_name(mat[left[0]].tobytes())
            if isinstance(got, Exception):
                for k in rows[left[same]].tolist():
                    bad[k] = f"the Ref message does not parse: {got}"
            else:
                names[rows[left[same]]] = got
            left = left[~same]
    for k in np.flatnonzero(inbounds & ~short).tolist():  # a longer Ref: one by one
        try:
            size, at = _varint(f.data, int(starts[k]), int(ends[k]))
        except ValueError as exc:
            bad[k] = f"the Ref's length: {exc}"
            continue
        if at + size > ends[k]:
            bad[k] = f"a Ref of {size} bytes runs past the value's end"
            continue
        got = _ref_name(f.data[at:at + size])
        if isinstance(got, Exception):
            bad[k] = f"the Ref message does not parse: {got}"
            continue
        names[k], after[k] = got, at + size
    for k in np.flatnonzero(names == "").tolist():
        bad.setdefault(k, "the Ref names no message (an empty name)")
    keep = np.ones(n, dtype=np.bool_)
    keep[list(bad)] = False
    rejects = [*f.rejects, *(Reject(int(f.positions[k]), f"Apicurio Protobuf frame: {why}", None)
                             for k, why in bad.items())]
    rejects.sort(key=lambda r: r.index)
    kept: tuple[Selector, ...] = tuple(names[keep].tolist())
    return Frames(f.data, f.positions[keep], f.ids[keep], after[keep], ends[keep], tuple(rejects), kept)


def _ref_name(ref: bytes) -> str | ValueError:
    """The ``name`` (field 1, a string) of a serialized ``Ref``; other fields skipped, as Protobuf does."""
    name, at = "", 0
    try:
        while at < len(ref):
            tag, at = _varint(ref, at, len(ref))
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                _, at = _varint(ref, at, len(ref))
            elif wire == 2:
                size, at = _varint(ref, at, len(ref))
                if at + size > len(ref):
                    raise ValueError(f"field {field}'s {size} bytes run past the Ref's end")
                if field == 1:
                    name = ref[at:at + size].decode("utf-8")
                at += size
            elif wire in (1, 5):
                at += 8 if wire == 1 else 4
            else:
                raise ValueError(f"wire type {wire} at byte {at}")
            if field == 0:
                raise ValueError("field number 0")
        if at > len(ref):
            raise ValueError("a field runs past the Ref's end")
    except (ValueError, UnicodeDecodeError) as exc:
        return ValueError(str(exc))
    return name


def _varint(data: bytes, at: int, end: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if at >= end or shift > 63:
            raise ValueError("a varint that runs past the end")
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7
