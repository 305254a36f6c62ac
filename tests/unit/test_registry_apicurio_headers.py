"""Apicurio's headers mode (``apicurio.registry.headers.enabled=true``, Apicurio 2.x's serde
default; issue 36): values with no magic byte nor id, the id an 8-byte big-endian long in the
record header ``apicurio.value.globalId`` (or ``.contentId``), a Protobuf value's message named
by ``apicurio.protobuf.type``. Records with hand-built headers decoded through the decoder the
worker builds (agents/registry_source.py ``values_decoder``) with a fake registry; records
whose headers are missing or wrong are rejects naming the header; the keys act or are refused."""

from __future__ import annotations

import asyncio
import io
import struct
from typing import Any

import fastavro
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow

from agents.evolution import Evolver
from agents.formats import RecordFormat
from agents.formats.registry_keys import RegistryKeys
from agents.registry_source import values_decoder
from icesink.shared.config import build
from icesink.shared.errors import ConfigError
from icesink.shared.registry_settings import ApicurioHeaders, registry_settings
from tests.unit.test_raw_values import Msg
from tests.unit.test_registry_values import V1 as AVRO_V1
from tests.unit.test_registry_values import V2 as AVRO_V2
from tests.unit.test_registry_values import FakeRegistry as AvroRegistry
from tests.unit.test_registry_values_pb import V1 as PROTO_V1
from tests.unit.test_registry_values_pb import FakeRegistry as ProtoRegistry
from tests.unit.test_registry_values_pb import classes, registered

AVRO = "io.apicurio.registry.utils.converter.AvroConverter"
PROTOBUF = "io.apicurio.registry.utils.converter.ProtobufConverter"
PRE = "value.converter.apicurio.registry."
URL = "http://r:8080/apis/registry/v2"
ON = {PRE + "headers.enabled": "true"}
KEY = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]}


def settings(converter: str, **extra: str) -> Any:
    return build({"topics": "t", "iceberg.tables": "db.t", "value.converter": converter, PRE + "url": URL, **extra})


def fmt(converter: str, registry: Any, **extra: str) -> RecordFormat:
    s = settings(converter, **extra)
    rs = registry_settings(s)
    assert rs is not None
    return RecordFormat(s, registry=values_decoder(rs, registry))


def gid(n: int) -> bytes:
    return struct.pack(">q", n)


def avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def run(f: RecordFormat, messages: list[Msg]) -> Any:
    """As a worker's fetch: framed from the headers, schemas looked up, decoded with evolution."""
    assert f.registry is not None
    values = list(f.registry.framed([m.value for m in messages], [m.headers for m in messages]))
    asyncio.run(f.registry.prepare(values))
    created = f.table_schema(values)
    assert created is not None
    growth = Evolver("w", evolve=True, case_insensitive=False).growth("db.t", schema_to_pyarrow(created))
    return growth.done(f.convert(messages, values, growth.schema, grow=growth))


def test_avro_ids_in_headers_are_grouped_per_id_and_bad_headers_are_rejects_naming_them() -> None:
    big = (1 << 40) + 2  # needs all 8 bytes
    registry = AvroRegistry({1: AVRO_V1, big: AVRO_V2})
    f = fmt(AVRO, registry, **ON)
    r1 = {"id": 1, "item": {"sku": "a"}, "tags": ["x"]}
    r2 = {"id": 2, "item": {"sku": "b"}, "tags": [], "note": "hi"}
    h1 = [("apicurio.value.globalId", gid(1)), ("apicurio.value.encoding", b"BINARY")]
    messages = [
        Msg(avro(AVRO_V1, r1), headers=h1, offset=0),
        Msg(avro(AVRO_V2, r2), headers=[("apicurio.value.globalId", gid(big))], offset=1),
        Msg(avro(AVRO_V1, {**r1, "id": 3}), headers=[("other", b"x"), ("apicurio.value.globalId", gid(9)),
                                                     ("apicurio.value.globalId", gid(1))], offset=2),  # the last counts
        Msg(avro(AVRO_V1, r1), headers=[], offset=3),                                           # no id header
        Msg(avro(AVRO_V1, r1), headers=[("apicurio.value.globalId", b"1")], offset=4),        # not 8 bytes
        Msg(avro(AVRO_V1, r1), headers=[("apicurio.value.globalId", None)], offset=5),        # a null header
        Msg(avro(AVRO_V1, r1), headers=[*h1[:1], ("apicurio.value.encoding", b"JSON")], offset=6),
        Msg(avro(AVRO_V1, r1), headers=[("apicurio.value.globalId", gid(77))], offset=7),     # unknown id
        Msg(b"\x00" + struct.pack(">i", 1) + avro(AVRO_V1, r1), headers=[("apicurio.value.contentId", gid(1))],
            offset=8),                                                                         # a framed value, no globalId
        Msg(b"\x00" + gid(1) + avro(AVRO_V1, {**r1, "id": 4}), headers=[], offset=9),       # framed, no id header
    ]
    out = run(f, messages)
    assert sorted(registry.asked) == [1, 77, big]  # once per id
    got = out.converted
    # A value with no id header that starts with the magic byte is read as framed, as Apicurio's
    # deserializer falls back to (AbstractKafkaDeserializer.deserialize, 2.4.2).
    assert got.indices.to_pylist() == [0, 1, 2, 9]
    assert got.table.to_pylist() == [{**r1, "note": None}, r2, {**r1, "id": 3, "note": None}, {**r1, "id": 4, "note": None}]
    why = {r.index: r.reason for r in got.rejects}
    assert sorted(why) == [3, 4, 5, 6, 7, 8]
    assert why[3].startswith("no apicurio.value.globalId record header") and why[5] == why[3]
    assert why[8].startswith(why[3][:-1]) and "it has apicurio.value.contentId: set use-id=contentId" in why[8]
    assert "apicurio.value.globalId is 1 bytes" in why[4]
    assert "apicurio.value.encoding is b'JSON'" in why[6]
    assert "schema id 77 is unknown" in why[7]


def test_content_ids_and_a_renamed_id_header() -> None:
    registry = AvroRegistry({5: AVRO_V1})
    r = {"id": 1, "item": {"sku": "a"}, "tags": []}
    f = fmt(AVRO, registry, **ON, **{PRE + "use-id": "contentId"})
    out = run(f, [Msg(avro(AVRO_V1, r), headers=[("apicurio.value.contentId", gid(5))])])
    assert out.converted.table.to_pylist() == [r]
    f = fmt(AVRO, registry, **ON, **{PRE + "headers.value.globalId.name": "my.id"})
    out = run(f, [Msg(avro(AVRO_V1, r), headers=[("my.id", gid(5))]),
                  Msg(avro(AVRO_V1, r), headers=[("apicurio.value.globalId", gid(5))])])
    assert out.converted.table.to_pylist() == [r]
    assert "no my.id record header" in out.converted.rejects[0].reason


def test_protobuf_message_named_by_the_type_header_not_a_ref() -> None:
    c = classes(PROTO_V1)
    big = (1 << 33) + 1
    registry = ProtoRegistry({big: registered(PROTO_V1)})
    f = fmt(PROTOBUF, registry, **ON)
    o = c["Order"](id=1, size=1, attrs={"a": 2}, lines=[c["Order.Line"](sku="x")])

    def hs(name: bytes | None, i: int = big) -> list[tuple[str, bytes]]:
        out = [("apicurio.value.globalId", gid(i)), ("apicurio.value.msgType", b"com.google.protobuf.DynamicMessage")]
        return out + ([("apicurio.protobuf.type", name)] if name is not None else [])

    long_name = b"N" * 200  # a Ref longer than one length byte
    messages = [Msg(o.SerializeToString(), headers=hs(b"Order")),
                Msg(c["Note"](text="hi").SerializeToString(), headers=hs(b"Note")),  # the file's first message
                Msg(c["Order"](id=2).SerializeToString(), headers=hs(b"Order")),
                Msg(b"\x08\x01", headers=hs(None)),                                   # no type header
                Msg(b"\x08\x01", headers=hs(b"Nope")),                                # names no message
                Msg(b"\x08\x01", headers=hs(long_name)),
                Msg(b"\x08\x01", headers=hs(b"Order")[1:])]                           # no id header
    out = run(f, messages)
    got = out.converted
    assert got.indices.to_pylist() == [0, 1, 2]
    rows = got.table.to_pylist()
    assert rows[0]["id"] == 1 and rows[0]["lines"] == [{"sku": "x"}] and rows[1]["text"] == "hi" and rows[2]["id"] == 2
    why = {r.index: r.reason for r in got.rejects}
    assert sorted(why) == [3, 4, 5, 6]
    assert "no apicurio.protobuf.type record header" in why[3]
    assert "'Nope'" in why[4] and str(big) in why[4]
    assert "'" + "N" * 200 + "'" in why[5]
    assert "no apicurio.value.globalId record header" in why[6]


def test_headers_settings_act_or_are_refused_naming_the_key() -> None:
    for converter in (AVRO, PROTOBUF):
        rs = registry_settings(settings(converter, **ON))
        assert rs is not None and rs.global_ids and rs.urls == (URL,)  # global ids: Apicurio's own API
        assert rs.apicurio_headers == ApicurioHeaders("apicurio.value.globalId", True,
                                                      "apicurio.protobuf.type" if converter == PROTOBUF else None)
        rs = registry_settings(settings(converter, **ON, **{PRE + "use-id": "contentId",
                                                            PRE + "headers.handler":
                                                            "io.apicurio.registry.serde.headers.DefaultHeadersHandler"}))
        assert rs is not None and not rs.global_ids and rs.urls == ("http://r:8080/apis/ccompat/v7",)
        assert rs.apicurio_headers is not None and rs.apicurio_headers.id_header == "apicurio.value.contentId"
    for extra, key in [({PRE + "as-confluent": "true"}, PRE + "as-confluent"),
                       ({PRE + "id-handler": "io.apicurio.registry.serde.DefaultIdHandler"}, PRE + "id-handler"),
                       ({PRE + "use-id": "other"}, PRE + "use-id"),
                       ({PRE + "headers.handler": "my.Handler"}, PRE + "headers.handler"),
                       ({PRE + "headers.value.artifactId.name": "a"}, PRE + "headers.value.artifactId.name"),
                       ({PRE + "headers.value.contentId.name": "a"}, PRE + "headers.value.contentId.name")]:
        with pytest.raises(ConfigError) as e:
            settings(AVRO, **ON, **extra)
        assert e.value.key == key
    with pytest.raises(ConfigError) as e:  # a header name without headers on would be ignored
        settings(AVRO, **{PRE + "headers.enabled": "false", PRE + "use-id": "contentId",
                          PRE + "headers.value.globalId.name": "x"})
    assert e.value.key == PRE + "headers.value.globalId.name"


def test_avro_keys_with_ids_in_key_headers_fill_the_key_column() -> None:
    s = build({"topics": "t", "iceberg.tables": "db.t", "iceberg.tables.key-column": "_key", "key.converter": AVRO,
               "key.converter.apicurio.registry.url": URL, "key.converter.apicurio.registry.headers.enabled": "true"})
    rs = registry_settings(s, "key")
    assert rs is not None and rs.apicurio_headers is not None and rs.apicurio_headers.id_header == "apicurio.key.globalId"
    f = RecordFormat(s, keys=RegistryKeys(AvroRegistry({4: KEY}), "_key", "avro", rs.options, rs.apicurio_headers))
    both = [("apicurio.value.globalId", gid(99)), ("apicurio.key.globalId", gid(4)),
            ("apicurio.key.encoding", b"BINARY")]
    messages = [Msg(b'{"n": 1}', avro(KEY, {"id": 1}), headers=both),
                Msg(b'{"n": 2}', None, headers=both[:1]),                                 # no key: null
                Msg(b'{"n": 3}', avro(KEY, {"id": 3}), headers=both[:1]),                 # no key id header
                Msg(b'{"n": 4}', avro(KEY, {"id": 4}), headers=[("apicurio.key.globalId", gid(4))])]
    keyed = [m for m in messages if m.key is not None]
    assert f.keys is not None
    asyncio.run(f.keys.prepare(list(f.keys.framed([m.key for m in keyed], [m.headers for m in keyed]))))
    values = [m.value for m in messages]
    created = f.table_schema(values)
    assert created is not None
    out = f.convert(messages, values, schema_to_pyarrow(created, include_field_ids=False))
    assert out.table.to_pylist() == [{"n": 1, "_key": {"id": 1}}, {"n": 2, "_key": None}, {"n": 4, "_key": {"id": 4}}]
    assert [(r.index, r.field) for r in out.rejects] == [(2, "_key")]
    assert "no apicurio.key.globalId record header" in out.rejects[0].reason
