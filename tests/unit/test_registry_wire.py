"""agents/formats/registry_wire.py: the schema-registry framing of a batch read in bulk (issue 36
point 1). tests/integration/test_schema_registry.py reads real serializers' bytes with it."""

from __future__ import annotations

import struct

import numpy as np

from agents.formats.registry_wire import frames


def framed(schema_id: int, payload: bytes, indexes: bytes = b"") -> bytes:
    return b"\x00" + struct.pack(">i", schema_id) + indexes + payload


def zigzag(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def test_ids_and_payloads_of_every_value_and_rejects_naming_what_was_found() -> None:
    values = [framed(1, b"a"), b'{"id": 1}', framed(300, b""), b"\x00\x01", None, framed(-2, b"xyz"),
              framed(1, b"bb"), b"\x05" + b"\x00" * 8]
    f = frames(values)  # type: ignore[arg-type]
    assert f.positions.tolist() == [0, 2, 5, 6]
    assert f.ids.tolist() == [1, 300, -2, 1]
    assert [f.payload(k) for k in range(4)] == [b"a", b"", b"xyz", b"bb"]
    reasons = {r.index: r.reason for r in f.rejects}
    assert sorted(reasons) == [1, 3, 4, 7]
    assert "unknown magic byte 0x7b" in reasons[1] and "JsonConverter" in reasons[1]
    assert "2 bytes, fewer than the 5" in reasons[3]
    assert "tombstone" in reasons[4]
    assert "unknown magic byte 0x05" in reasons[7]
    groups = f.groups()
    assert sorted(groups) == [-2, 1, 300]
    assert groups[1].tolist() == [0, 3] and groups[300].tolist() == [1]


def test_protobuf_message_indexes_the_one_byte_first_message_and_longer_paths() -> None:
    first = framed(7, b"P0", b"\x00")
    second = framed(7, b"P1", zigzag(1) + zigzag(1))  # [1]
    nested = framed(8, b"P2", zigzag(3) + zigzag(2) + zigzag(0) + zigzag(200))  # [2, 0, 200]
    bad = framed(7, b"", zigzag(40))  # a count past the end
    f = frames([first, second, nested, bad], protobuf=True)
    assert f.positions.tolist() == [0, 1, 2]
    assert f.indexes == ((0,), (1,), (2, 0, 200))
    assert [f.payload(k) for k in range(3)] == [b"P0", b"P1", b"P2"]
    [reject] = f.rejects
    assert reject.index == 3 and "Protobuf message indexes" in reject.reason and "count of 40" in reject.reason


def test_a_batch_of_nothing_but_rejects_and_an_empty_batch() -> None:
    f = frames([b"x", b""])
    assert len(f.positions) == 0 and [r.index for r in f.rejects] == [0, 1]
    empty = frames([])
    assert empty.ids.dtype == np.int64 and len(empty.ids) == 0 and not empty.rejects
