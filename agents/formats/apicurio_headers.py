"""Apicurio's headers mode (``apicurio.registry.headers.enabled=true``, Apicurio 2.x's serde
default; issue 36): :func:`headers_to_frames`.

Apicurio 2.4's serializers with headers on (AbstractKafkaSerializer.serialize: the
DefaultHeadersHandler writes the headers, then serializeData(headers, ...)) write the value with
no magic byte and no id; the record's headers carry::

    apicurio.value.globalId     the global id, 8 bytes big-endian (ByteBuffer.putLong); with
      (or .contentId)           use-id=contentId the content id under apicurio.value.contentId
    apicurio.value.encoding     Avro: BINARY (or JSON: apicurio.registry.avro.encoding)
    apicurio.value.msgType      Protobuf: the Java class of the message (not read here)
    apicurio.protobuf.type      Protobuf: the message's simple name; no Ref in the value

The id is read as Apicurio's deserializer reads it (``headers.lastHeader``: the last header of
that name). A fetch's values are turned in bulk into the frame Apicurio writes with headers off
and an 8-byte id (magic ``0``, the id's 8 header bytes, for Protobuf a length-delimited ``Ref``
naming the message from ``apicurio.protobuf.type``, then the value): one Arrow join over the
fetch, the Refs built once per distinct message name. That frame is then read, grouped by id
and decoded in bulk exactly as the framed path reads it (agents/formats/registry_wire.py,
apicurio_proto.py), and every later step of the fetch (routing, Debezium, evolution) sees it.
The Python per record is one ``dict`` of its headers and a lookup per header read, as the
Kafka metadata's headers column does (agents/formats/extras.py).

A record whose id header is missing, null or not 8 bytes, whose Protobuf type header is
missing, or whose Avro encoding is not BINARY becomes ``NOTE`` then the reason in UTF-8: the
frame reader (``frames(..., notes=True)``) makes it a reject with that reason, so its record
goes to the dead letters with topic, partition and offset, and the rest keep flowing. A value
without either id header that starts with the magic byte ``0`` is read as the framed value it is
(Apicurio's deserializer falls back to that: AbstractKafkaDeserializer.deserialize, 2.4.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icesink.shared.registry_settings import ApicurioHeaders

#: The first byte of a value that is a reject's reason, not a frame (see the module's doc).
NOTE: Final = 0x01
_EMPTY: Final[dict[str, Any]] = {}
_OTHER: Final = {f"apicurio.{side}.{a}": f"apicurio.{side}.{b}" for side in ("value", "key")
                 for a, b in (("globalId", "contentId"), ("contentId", "globalId"))}


def headers_to_frames(values: Sequence[bytes | None], headers: Sequence[Any], h: ApicurioHeaders) -> list[bytes | None]:
    """``values`` in Apicurio's 8-byte-id frame, the id (and Protobuf message name) taken from
    ``headers`` (each record's: a sequence of (name, bytes) pairs or a mapping); the values that
    cannot be framed as ``NOTE`` + their reason."""
    if len(values) != len(headers):
        raise ValueError(f"apicurio headers: {len(values)} values but {len(headers)} records' headers")
    found = [dict(x) if x else _EMPTY for x in headers]
    ids = pa.array([d.get(h.id_header) for d in found], pa.binary())
    width = pc.fill_null(pc.binary_length(ids), -1).to_numpy(zero_copy_only=False)
    bad: dict[int, str] = {}
    other = _OTHER.get(h.id_header)  # the other kind of id's header: use-id says which is read
    framed: list[int] = []  # no id header, a framed value: read as framed, as Apicurio falls back to
    for k in np.flatnonzero(width != 8).tolist():
        value = values[k]
        if width[k] < 0 and value and value[0] == 0 and not (other and other in found[k]):
            framed.append(k)
            continue
        hint = f"; it has {other}: set use-id={other.rsplit('.', 1)[1]}" if other and other in found[k] else ""
        bad[k] = (f"no {h.id_header} record header (Apicurio's headers mode: the schema id travels there{hint})"
                  if width[k] < 0 else
                  f"record header {h.id_header} is {int(width[k])} bytes, not the 8 of Apicurio's big-endian long id")
    parts: list[Any] = [pa.scalar(b"\x00", pa.binary()), ids]
    if h.type_header is not None:  # Protobuf: the message's name, as the Ref Apicurio writes without headers
        names = pa.array([d.get(h.type_header) for d in found], pa.binary())
        for k in np.flatnonzero(names.is_null().to_numpy(zero_copy_only=False)).tolist():
            bad.setdefault(k, f"no {h.type_header} record header naming the Protobuf message")
        coded = names.dictionary_encode()
        refs = [None if n is None else _delimited(b"\x0a" + _varint(len(n)) + n) for n in coded.dictionary.to_pylist()]
        parts.append(pa.array(refs, pa.binary()).take(coded.indices))
    else:  # Avro: the encoding header, when there, must say BINARY
        encodings = pa.array([d.get(h.encoding_header) for d in found], pa.binary())
        other = pc.fill_null(pc.not_equal(encodings, pa.scalar(b"BINARY", pa.binary())), False)
        for k in np.flatnonzero(other.to_numpy(zero_copy_only=False)).tolist():
            bad.setdefault(k, f"record header {h.encoding_header} is {encodings[k].as_py()[:20]!r}: only Avro's "
                           "BINARY encoding is read (the producer's apicurio.registry.avro.encoding)")
    parts.append(pa.array(values, pa.binary()))
    out: list[bytes | None] = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.binary())).to_pylist()
    for k, why in bad.items():
        if values[k] is not None:  # a tombstone stays one (the frame reader says so)
            out[k] = bytes([NOTE]) + why.encode()
    for k in framed:
        out[k] = values[k]
    return out


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(body: bytes) -> bytes:
    return _varint(len(body)) + body
