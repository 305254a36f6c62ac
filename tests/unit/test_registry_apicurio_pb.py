"""Apicurio's own Protobuf frame (issue 36; ``value.converter`` = Apicurio's ProtobufConverter):
frames built by hand from the layout in docs/schema-registry.md (magic byte, a 4- or 8-byte id,
optionally Confluent's message indexes, Apicurio's length-delimited ``Ref`` naming the message,
the payload), decoded through the record format with a fake registry; bad frames are rejects
saying what was wrong; the converter's keys act or are refused naming them."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from agents.formats import RecordFormat
from agents.formats.apicurio_proto import ApicurioProtobufValues, apicurio_frames
from icesink.shared.config import build
from icesink.shared.errors import ConfigError
from icesink.shared.registry_settings import ApicurioFrame, registry_settings
from tests.unit.test_registry_values_pb import V1, FakeRegistry, classes, registered, run, zigzag

CONVERTER = "io.apicurio.registry.utils.converter.ProtobufConverter"
PRE = "value.converter.apicurio.registry."
URL = "http://r:8080/apis/registry/v2"


def varint(n: int) -> bytes:
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])


def ref(name: str) -> bytes:
    """``Ref { name }`` as Ref.writeDelimitedTo writes it: its length, then field 1 (tag 0x0a)."""
    body = b"\x0a" + varint(len(name.encode())) + name.encode() if name else b""
    return varint(len(body)) + body


def framed(schema_id: int, name: str, payload: bytes, *, id_bytes: int = 8, indexes: bytes = b"") -> bytes:
    return b"\x00" + struct.pack(">q" if id_bytes == 8 else ">i", schema_id) + indexes + ref(name) + payload


def settings(**extra: str) -> Any:
    return build({"topics": "t", "iceberg.tables": "db.t", "value.converter": CONVERTER,
                  PRE + "url": URL, **extra})


GLOBAL = {PRE + "id-handler": "io.apicurio.registry.serde.DefaultIdHandler", PRE + "use-id": "globalId",
          PRE + "headers.enabled": "false"}


def fmt(registry: Any, **extra: str) -> RecordFormat:
    s = settings(**extra)
    rs = registry_settings(s)
    assert rs is not None and rs.apicurio_frame is not None
    return RecordFormat(s, registry=ApicurioProtobufValues(registry, rs.apicurio_frame, rs.options))


def test_eight_byte_global_ids_and_refs_pick_the_message_and_bad_frames_are_rejects() -> None:
    c = classes(V1)
    registry = FakeRegistry({(1 << 40) + 3: registered(V1)})
    gid = (1 << 40) + 3  # needs all 8 bytes
    o = c["Order"](id=1, size=1, attrs={"a": 2}, lines=[c["Order.Line"](sku="x")])
    o.total.cents = 5
    values = [framed(gid, "Order", o.SerializeToString()),
              framed(gid, "Note", c["Note"](text="hi").SerializeToString()),  # the file's first message
              framed(gid, "Order", c["Order"](id=2).SerializeToString()),
              framed(gid, "Nope", b""),                                   # names no message
              b"\x00" + struct.pack(">q", gid) + b"\x09\x0a\x05Order",    # a Ref past the value's end
              b"\x00" + struct.pack(">q", gid),                           # no Ref at all
              framed(gid, "", b"\x08\x01"),                               # an empty Ref
              b"\x00\x00\x00\x00\x01",                                    # a 4-byte frame: too short
              b"\x00" + struct.pack(">q", gid) + b"\x02\x0f\x00" + b"\x08\x01",  # a Ref that does not parse
              framed(7, "Order", b"\x08\x01")]                            # an id the registry lacks
    out = run(fmt(registry, **GLOBAL), values)
    assert set(registry.asked) == {gid, 7}
    got = out.converted
    assert got.indices.to_pylist() == [0, 1, 2]
    rows = got.table.to_pylist()
    assert rows[0]["id"] == 1 and rows[0]["size"] == "M" and rows[0]["attrs"] == [("a", 2)]
    assert rows[0]["total"] == {"cents": 5} and rows[0]["lines"] == [{"sku": "x"}]
    assert rows[1]["text"] == "hi" and rows[1]["id"] is None
    assert rows[2]["id"] == 2
    why = {r.index: r.reason for r in got.rejects}
    assert sorted(why) == [3, 4, 5, 6, 7, 8, 9]
    assert "'Nope'" in why[3] and "Note, Order" in why[3] and str(gid) in why[3]
    assert "runs past the value's end" in why[4]
    assert "no Ref message" in why[5]
    assert "empty name" in why[6]
    assert "fewer than the 9" in why[7]
    assert "does not parse" in why[8]
    assert "schema id 7 is unknown" in why[9]


def test_four_byte_content_ids_indexes_before_the_ref_and_long_names() -> None:
    name = "M" * 200  # a Ref longer than 127 bytes: a two-byte length, read one by one
    frame = ApicurioFrame(id_bytes=4, indexes=True)
    values = [framed(5, "Order", b"\x08\x01", id_bytes=4, indexes=zigzag(1) + zigzag(1)),
              framed(5, name, b"\x08\x02", id_bytes=4, indexes=b"\x00"),
              framed(6, "Order", b"\x08\x03", id_bytes=4, indexes=b"\x00")]
    f = apicurio_frames(values, frame)
    assert f.rejects == ()
    assert f.ids.tolist() == [5, 5, 6]
    assert f.indexes == ("Order", name, "Order")
    assert [f.payload(k) for k in range(3)] == [b"\x08\x01", b"\x08\x02", b"\x08\x03"]
    assert sorted(f.groups()) == [5, 6]


def test_the_converter_keys_act_or_are_refused_naming_them() -> None:
    rs = registry_settings(settings())  # Apicurio 3's defaults: 4-byte content ids, the ccompat API
    assert rs is not None and rs.apicurio_frame == ApicurioFrame(4, False, False)
    assert rs.urls == ("http://r:8080/apis/ccompat/v7",)
    rs = registry_settings(settings(**GLOBAL))
    assert rs is not None and rs.apicurio_frame == ApicurioFrame(8, True, False)
    assert rs.urls == (URL,)  # global ids: Apicurio's own API
    rs = registry_settings(settings(**{**GLOBAL, PRE + "as-confluent": "true", PRE + "use-id": "contentId",
                                       "value.converter.apicurio.registry.serde.read-indexes": "true"}))
    assert rs is not None and rs.apicurio_frame == ApicurioFrame(4, False, True)
    for extra, key in [({**GLOBAL, PRE + "headers.enabled": "true"}, PRE + "id-handler"),  # headers: no frame keys
                       ({PRE + "serde.read-type-ref": "false"}, PRE + "serde.read-type-ref"),
                       ({PRE + "id-handler": "io.apicurio.registry.serde.OptimisticFallbackIdHandler"},
                        PRE + "id-handler"),
                       ({PRE + "use-id": "contentHash"}, PRE + "use-id"),
                       ({PRE + "id-handler": "io.apicurio.registry.serde.DefaultIdHandler"}, PRE + "use-id"),
                       ({PRE + "as-confluent": "true", PRE + "use-id": "globalId"}, PRE + "headers.enabled"),
                       ({PRE + "serde.read-indexes": "maybe"}, PRE + "serde.read-indexes"),
                       ({"value.converter.apicurio.registry.deserializer.value.return-class": "X"},
                        "value.converter.apicurio.registry.deserializer.value.return-class")]:
        with pytest.raises(ConfigError) as e:
            settings(**extra)
        assert e.value.key == key, (extra, str(e.value))


def test_apicurios_protobuf_keys_fill_the_key_column_framed_and_from_headers() -> None:
    """``key.converter`` = Apicurio's ProtobufConverter: keys in its frame (headers off: 8-byte
    global id, the Ref) and in headers mode (``apicurio.key.globalId``, the message named by
    ``apicurio.protobuf.type.key``, as ProtobufSerdeHeaders names it for keys) fill a struct key
    column; a key that does not frame is a reject naming the key column."""
    import asyncio

    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from agents.registry_source import keys_decoder
    from tests.unit.test_raw_values import Msg

    c = classes(V1)
    registry = FakeRegistry({7: registered(V1)})
    kpre = "key.converter.apicurio.registry."
    base = {"topics": "t", "iceberg.tables": "db.t", "iceberg.tables.key-column": "_key", "key.converter": CONVERTER,
            kpre + "url": URL}
    key1, key2 = c["Order"](id=1).SerializeToString(), c["Order"](id=2, size=3).SerializeToString()
    for extra, keyed in [
        ({kpre + "id-handler": "io.apicurio.registry.serde.DefaultIdHandler", kpre + "use-id": "globalId",
          kpre + "headers.enabled": "false"},
         [(framed(7, "Order", key1), []), (framed(7, "Order", key2), []), (b"\x00\x00", [])]),
        ({kpre + "headers.enabled": "true"},
         [(key1, [("apicurio.key.globalId", struct.pack(">q", 7)), ("apicurio.protobuf.type.key", b"Order")]),
          (key2, [("apicurio.key.globalId", struct.pack(">q", 7)), ("apicurio.protobuf.type.key", b"Order"),
                  ("apicurio.protobuf.type", b"Note")]),
          (key1, [("apicurio.key.globalId", struct.pack(">q", 7))])]),  # no type header for the key
    ]:
        s = build({**base, **extra})
        rs = registry_settings(s, "key")
        assert rs is not None
        keys = keys_decoder(rs, registry, "_key")
        f = RecordFormat(s, keys=keys)
        messages = [Msg(b'{"n": %d}' % i, k, headers=h) for i, (k, h) in enumerate(keyed)]
        asyncio.run(keys.prepare(list(keys.framed([m.key for m in messages], [m.headers for m in messages]))))
        values = [m.value for m in messages]
        created = f.table_schema(values)
        assert created is not None
        out = f.convert(messages, values, schema_to_pyarrow(created, include_field_ids=False))
        got = out.table.to_pylist()
        want = [(0, 1, "S"), (1, 2, "UNKNOWN_ENUM_VALUE_Size_3")]  # size 3: a number the enum lacks
        assert [(r["n"], r["_key"]["id"], r["_key"]["size"]) for r in got] == want, extra
        assert [(r.index, r.field) for r in out.rejects] == [(2, "_key")], extra


def test_apicurios_own_api_answers_name_the_artifact_type() -> None:
    """Apicurio 2.4 answers ``/ids/globalIds/{id}`` with the text and a content type only
    (``application/x-protobuf``, or ``application/json`` for Avro and JSON Schema alike)."""
    from agents.registry_client import _artifact_type

    assert _artifact_type({"text": "syntax = 'proto3';", "content_type": "application/x-protobuf"}) == "PROTOBUF"
    assert _artifact_type({"text": '{"type": "record", "name": "A", "fields": []}',
                           "content_type": "application/json"}) == "AVRO"
    assert _artifact_type({"text": '"string"', "content_type": "application/json"}) == "AVRO"
    assert _artifact_type({"text": '{"type": "object"}', "content_type": "application/json"}) == "JSON"
    assert _artifact_type({"text": "x", "type": "protobuf"}) == "PROTOBUF"  # X-Registry-ArtifactType when sent
    assert _artifact_type({"text": "<a/>", "content_type": "application/xml"}) == "application/xml"
