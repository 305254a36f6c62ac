"""Avro keys (issue 36 point 1): ``key.converter`` = a registry converter with the same key family
as values (``key.converter.schema.registry.url``, credentials, PEM TLS), each key acting or
refused at start naming it; Debezium's Avro pipelines set both converters."""

from __future__ import annotations

import asyncio
import io
import json
import re
import struct
from dataclasses import dataclass
from typing import Any

import fastavro
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow

from agents.formats import RecordFormat
from agents.formats.extras import KeyColumnUnknown
from agents.formats.registry_keys import RegistryKeys
from tests.unit.test_raw_values import Msg
from tests.unit.test_registry_values import framed

from icesink.shared.config import Settings, build
from icesink.shared.errors import ConfigError
from icesink.shared.registry_settings import registry_settings

AVRO = "io.confluent.connect.avro.AvroConverter"


@dataclass
class Registered:
    type: str
    text: str
    references: tuple[Any, ...] = ()


class FakeRegistry:
    def __init__(self, schemas: dict[int, Any], kind: str) -> None:
        self.schemas, self.kind = schemas, kind

    async def __call__(self, schema_id: int) -> Registered | None:
        s = self.schemas.get(schema_id)
        return None if s is None else Registered(self.kind, json.dumps(s))


def settings(**extra: str) -> Settings:
    return build({"topics": "t", "iceberg.tables": "db.t", "key.converter": AVRO, **extra})


def test_an_avro_key_converter_takes_the_value_converters_key_family() -> None:
    s = settings(**{
        "key.converter.schema.registry.url": "http://a:8081,http://b:8081",
        "key.converter.basic.auth.credentials.source": "USER_INFO",
        "key.converter.basic.auth.user.info": "alice:k3y-secret",
        "key.converter.auto.register.schemas": "false",
    })
    r = registry_settings(s, "key")
    assert r is not None and r.format == "avro" and r.urls == ("http://a:8081", "http://b:8081")
    assert r.user_info is not None and r.user_info.get_secret_value() == "alice:k3y-secret"
    assert registry_settings(s) is None  # the value converter is JSON
    assert "k3y-secret" not in repr(s) and "k3y-secret" not in str(s.masked())
    assert "alice:k3y-secret" in s.secret_values() and "http://a:8081,http://b:8081" not in s.secret_values()


@pytest.mark.parametrize(("extra", "key"), [
    ({}, "key.converter.schema.registry.url"),
    ({"key.converter.schema.registry.url": "http://a:8081", "key.converter.colour": "red"}, "key.converter.colour"),
    ({"key.converter.schema.registry.url": "http://a:8081",
      "key.converter.basic.auth.credentials.source": "SASL_INHERIT"}, "key.converter.basic.auth.credentials.source"),
])
def test_bad_or_missing_key_converter_keys_are_refused_naming_the_key(extra: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**extra)
    assert err.value.key == key


KEY = {"type": "record", "name": "OrderKey", "fields": [{"name": "id", "type": "long"}, {"name": "shop", "type": "string"}]}


def keyed_format(key_schemas: dict[int, Any], kind: str = "avro", registered: str = "AVRO") -> RecordFormat:
    s = settings(**{"key.converter.schema.registry.url": "http://a:8081", "iceberg.tables.key-column": "_key"})
    assert s.key_column == "_key"  # accepted now
    keys = RegistryKeys(FakeRegistry(key_schemas, registered), "_key", kind)
    return RecordFormat(s, keys=keys)


def key_type(created: Any) -> str:
    return re.sub(r"\d+: ", "", str(created.find_field("_key").field_type))  # without field ids


def run(f: RecordFormat, messages: list[Msg]) -> Any:
    values = [m.value for m in messages]
    asyncio.run(f.keys.prepare([m.key for m in messages if m.key is not None]))  # type: ignore[union-attr]
    created = f.table_schema(values)
    assert created is not None
    return created, f.convert(messages, values, schema_to_pyarrow(created, include_field_ids=False))


def test_avro_record_keys_fill_the_key_column_as_a_struct_null_keys_null_bad_keys_rejects() -> None:
    f = keyed_format({7: KEY})
    messages = [Msg(b'{"n": 1}', framed(7, KEY, {"id": 1, "shop": "a"})), Msg(b'{"n": 2}', None),
                Msg(b'{"n": 3}', b"\x00\x00\x00\x00\x07\xff"), Msg(b'{"n": 4}', framed(7, KEY, {"id": 4, "shop": "d"}))]
    created, out = run(f, messages)
    assert key_type(created) == "struct<id: required long, shop: required string>"
    assert out.table.to_pylist() == [{"n": 1, "_key": {"id": 1, "shop": "a"}}, {"n": 2, "_key": None},
                                     {"n": 4, "_key": {"id": 4, "shop": "d"}}]
    assert [(r.index, r.field) for r in out.rejects] == [(2, "_key")]
    assert "record key" in out.rejects[0].reason and "schema id 7" in out.rejects[0].reason


@pytest.mark.parametrize(("schema", "key", "iceberg"), [
    ("string", "k-1", "string"), ("long", 2**40, "long"),
    ({"type": "enum", "name": "Colour", "symbols": ["RED", "BLUE"]}, "BLUE", "string"),
])
def test_primitive_avro_keys_fill_the_key_column_as_the_scalar(schema: Any, key: Any, iceberg: str) -> None:
    f = keyed_format({3: schema})
    out_key = io.BytesIO()
    fastavro.schemaless_writer(out_key, fastavro.parse_schema(schema), key)
    created, out = run(f, [Msg(b'{"n": 1}', b"\x00" + struct.pack(">i", 3) + out_key.getvalue())])
    assert key_type(created) == iceberg
    assert out.table.to_pylist() == [{"n": 1, "_key": key}] and not out.rejects


def test_json_schema_keys_objects_as_structs_primitives_as_scalars() -> None:
    obj = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    f = keyed_format({1: obj, 2: {"type": "string"}}, "json", "JSON")
    frame = b"\x00" + struct.pack(">i", 1) + b'{"id": 5}'
    created, out = run(f, [Msg(b'{"n": 1}', frame)])
    assert key_type(created) == "struct<id: required long>"
    assert out.table.to_pylist() == [{"n": 1, "_key": {"id": 5}}]
    f = keyed_format({2: {"type": "string"}}, "json", "JSON")
    created, out = run(f, [Msg(b'{"n": 1}', b"\x00" + struct.pack(">i", 2) + b'"k-9"')])
    assert key_type(created) == "string"
    assert out.table.to_pylist() == [{"n": 1, "_key": "k-9"}]


def test_no_key_schema_known_yet_creates_no_table() -> None:
    f = keyed_format({7: KEY})
    asyncio.run(f.keys.prepare([]))  # type: ignore[union-attr]
    with pytest.raises(KeyColumnUnknown):
        f.table_schema([b'{"n": 1}'])


def test_json_key_converters_still_take_their_keys_with_no_effect() -> None:
    s = build({"topics": "t", "iceberg.tables": "db.t", "key.converter": "org.apache.kafka.connect.json.JsonConverter",
               "key.converter.schemas.enable": "false"})
    assert registry_settings(s, "key") is None


def test_protobuf_keys_fill_the_key_column_as_a_struct_of_the_message() -> None:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    from agents.formats.proto_text import compile_proto

    text = 'syntax = "proto3";\npackage k;\nmessage Other { string x = 1; }\nmessage Key { int32 id = 1; string shop = 2; }\n'
    main, _ = compile_proto(text, ())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(main))
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("k.Key"))
    frame = b"\x00" + struct.pack(">i", 4) + b"\x02\x02" + cls(id=3, shop="s").SerializeToString()  # indexes [1]
    s = settings(**{"key.converter": "io.confluent.connect.protobuf.ProtobufConverter",
                    "key.converter.schema.registry.url": "http://a:8081", "iceberg.tables.key-column": "_key"})

    async def schema_of(schema_id: int) -> Registered | None:
        return Registered("PROTOBUF", text) if schema_id == 4 else None

    f = RecordFormat(s, keys=RegistryKeys(schema_of, "_key", "protobuf"))
    created, out = run(f, [Msg(b'{"n": 1}', frame), Msg(b'{"n": 2}', None)])
    assert key_type(created) == "struct<id: optional int, shop: optional string>"
    assert out.table.to_pylist() == [{"n": 1, "_key": {"id": 3, "shop": "s"}}, {"n": 2, "_key": None}]


def test_key_transforms_rename_drop_hoist_and_add_to_registry_keys() -> None:
    c = "org.apache.kafka.connect.transforms."
    s = settings(**{"key.converter.schema.registry.url": "http://a:8081", "iceberg.tables.key-column": "_key",
                    "transforms": "r,h,i", "transforms.r.type": f"{c}ReplaceField$Key", "transforms.r.exclude": "shop",
                    "transforms.r.renames": "id:order_id", "transforms.h.type": f"{c}HoistField$Key",
                    "transforms.h.field": "k", "transforms.i.type": f"{c}InsertField$Key", "transforms.i.offset.field": "o"})
    f = RecordFormat(s, keys=RegistryKeys(FakeRegistry({7: KEY}, "AVRO"), "_key", "avro"))
    messages = [Msg(b'{"n": 1}', framed(7, KEY, {"id": 1, "shop": "a"}), offset=5), Msg(b'{"n": 2}', None, offset=6)]
    created, out = run(f, messages)
    assert key_type(created) == "struct<k: optional struct<order_id: required long>, o: optional long>"
    assert out.table.to_pylist() == [{"n": 1, "_key": {"k": {"order_id": 1}, "o": 5}},
                                     {"n": 2, "_key": {"k": None, "o": 6}}]  # a null key hoisted: {k: null}


def test_hoist_field_key_wraps_a_primitive_registry_key() -> None:
    c = "org.apache.kafka.connect.transforms."
    s = settings(**{"key.converter.schema.registry.url": "http://a:8081", "iceberg.tables.key-column": "_key",
                    "transforms": "h", "transforms.h.type": f"{c}HoistField$Key", "transforms.h.field": "id"})
    f = RecordFormat(s, keys=RegistryKeys(FakeRegistry({3: "long"}, "AVRO"), "_key", "avro"))
    out_key = io.BytesIO()
    fastavro.schemaless_writer(out_key, fastavro.parse_schema("long"), 2**40)
    created, out = run(f, [Msg(b'{"n": 1}', b"\x00" + struct.pack(">i", 3) + out_key.getvalue())])
    assert key_type(created) == "struct<id: optional long>"
    assert out.table.to_pylist() == [{"n": 1, "_key": {"id": 2**40}}] and not out.rejects


def test_a_null_registry_key_stays_null_through_replace_field_key() -> None:
    c = "org.apache.kafka.connect.transforms."
    s = settings(**{"key.converter.schema.registry.url": "http://a:8081", "iceberg.tables.key-column": "_key",
                    "transforms": "r", "transforms.r.type": f"{c}ReplaceField$Key", "transforms.r.include": "shop"})
    f = RecordFormat(s, keys=RegistryKeys(FakeRegistry({7: KEY}, "AVRO"), "_key", "avro"))
    created, out = run(f, [Msg(b'{"n": 1}', framed(7, KEY, {"id": 1, "shop": "a"})), Msg(b'{"n": 2}', None)])
    assert key_type(created) == "struct<shop: required string>"
    assert out.table.to_pylist() == [{"n": 1, "_key": {"shop": "a"}}, {"n": 2, "_key": None}]
