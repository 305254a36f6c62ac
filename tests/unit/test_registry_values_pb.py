"""Registry-framed Protobuf and JSON Schema values through the record format (issue 36, the
ProtobufConverter and JsonSchemaConverter in the worker), with a fake registry serving what a
real one serves: the ``.proto`` text (compiled by protoc, agents/formats/proto_text.py) and the
JSON Schema text. Plans per (schema id, message indexes), evolution across ids, rejects naming
the id, the converters' own keys."""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from pyiceberg.io.pyarrow import schema_to_pyarrow

from agents.evolution import Evolver
from agents.formats import RecordFormat
from agents.formats.proto_text import compile_proto
from agents.formats.registry_values import RegistryValues
from icesink.shared.config import build
from icesink.shared.errors import ConfigError
from icesink.shared.registry_settings import registry_settings
from tests.unit.test_raw_values import Msg

PROTOBUF = "io.confluent.connect.protobuf.ProtobufConverter"
JSON_SCHEMA = "io.confluent.connect.json.JsonSchemaConverter"
COMMON = 'syntax = "proto3";\npackage shop;\nmessage Money {\n  int64 cents = 1;\n}\n'
V1 = """syntax = "proto3";
package shop;
import "shop/common.proto";
import "google/protobuf/wrappers.proto";
message Note {
  string text = 1;
}
message Order {
  enum Size { S = 0; M = 1; L = 2; }
  int64 id = 1;
  Size size = 2;
  map<string, int32> attrs = 3;
  optional string coupon = 4;
  shop.Money total = 5;
  google.protobuf.Int64Value refund = 6;
  message Line {
    string sku = 1;
  }
  repeated Line lines = 7;
}
"""
V2 = V1.replace("  repeated Line lines = 7;\n", "  repeated Line lines = 7;\n  string note = 8;\n")


@dataclass(frozen=True)
class Registered:
    type: str
    text: str
    references: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Ref:
    name: str
    schema: Registered


class FakeRegistry:
    def __init__(self, schemas: dict[int, Registered]) -> None:
        self.schemas = schemas
        self.asked: list[int] = []

    async def __call__(self, schema_id: int) -> Registered | None:
        self.asked.append(schema_id)
        return self.schemas.get(schema_id)


def classes(text: str) -> dict[str, Any]:
    """Message classes of ``text`` (with the Money reference), compiled independently of the sink's plans."""
    main, refs = compile_proto(text, (("shop/common.proto", COMMON),))
    pool = descriptor_pool.DescriptorPool()
    from google.protobuf import wrappers_pb2

    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(wrappers_pb2.DESCRIPTOR.serialized_pb))
    for _, fdp in refs:
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(fdp))
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(main))
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"shop.{n}"))
            for n in ("Order", "Note", "Order.Line")}


def zigzag(n: int) -> bytes:
    v, out = (n << 1) ^ (n >> 63), b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def framed(schema_id: int, indexes: list[int], payload: bytes) -> bytes:
    ix = b"\x00" if indexes == [0] else zigzag(len(indexes)) + b"".join(zigzag(i) for i in indexes)
    return b"\x00" + struct.pack(">i", schema_id) + ix + payload


def registered(text: str) -> Registered:
    return Registered("PROTOBUF", text, (Ref("shop/common.proto", Registered("PROTOBUF", COMMON)),))


def fmt(converter: str, registry: Any, **extra: str) -> RecordFormat:
    s = build({"topics": "t", "iceberg.tables": "db.t", "value.converter": converter,
               "value.converter.schema.registry.url": "http://127.0.0.1:1", **extra})
    rs = registry_settings(s)
    assert rs is not None
    return RecordFormat(s, registry=RegistryValues(registry, rs.format, rs.options))


def run(f: RecordFormat, values: list[bytes], evolve: bool = True) -> Any:
    assert f.registry is not None
    asyncio.run(f.registry.prepare(values))
    created = f.table_schema(values[:1])
    assert created is not None
    growth = Evolver("w", evolve=evolve, case_insensitive=False).growth("db.t", schema_to_pyarrow(created))
    return growth.done(f.convert([Msg(v) for v in values], values, growth.schema, grow=growth))


def test_protobuf_values_of_two_versions_and_two_messages_decode_per_id_and_indexes() -> None:
    c1, c2 = classes(V1), classes(V2)
    registry = FakeRegistry({1: registered(V1), 2: registered(V2)})
    f = fmt(PROTOBUF, registry)
    o1 = c1["Order"](id=1, size=2, attrs={"a": 1}, coupon="C", lines=[c1["Order.Line"](sku="x")])
    o1.total.cents = 5
    o1.refund.value = 7
    o2 = c2["Order"](id=2, note="hi")
    values = [framed(1, [1], o1.SerializeToString()), framed(2, [1], o2.SerializeToString()),
              framed(1, [0], c1["Note"](text="a note").SerializeToString()),  # the file's other message
              framed(1, [1], c1["Order"](id=3).SerializeToString()), framed(2, [1], b"\xff\xff")]
    out = run(f, values)
    assert sorted(set(registry.asked)) == [1, 2]
    asked = len(registry.asked)
    assert f.registry is not None
    asyncio.run(f.registry.prepare(values))
    assert len(registry.asked) == asked  # plans are kept per (id, indexes)
    assert out.proposal is not None  # Note's text and the v2 field evolve the table, as Connect schemas would
    got = out.converted.table
    assert got.column_names == ["id", "size", "attrs", "coupon", "total", "refund", "lines", "text", "note"]
    rows = got.to_pylist()
    assert rows[0] == {"id": 1, "size": "L", "attrs": [("a", 1)], "coupon": "C", "total": {"cents": 5},
                       "refund": {"value": 7}, "lines": [{"sku": "x"}], "text": None, "note": None}
    assert rows[1] == {"id": 2, "size": "S", "attrs": [], "coupon": None, "total": None, "refund": None,
                       "lines": [], "text": None, "note": "hi"}
    assert rows[2] == {**dict.fromkeys(got.column_names), "text": "a note"}
    assert rows[3]["id"] == 3 and rows[3]["coupon"] is None and rows[3]["size"] == "S"
    assert out.converted.indices.to_pylist() == [0, 1, 2, 3]
    [reject] = out.converted.rejects
    assert reject.index == 4 and "schema id 2" in reject.reason and "shop.Order" in reject.reason


def test_wrapper_for_nullables_gives_the_primitive_and_unknown_keys_are_refused() -> None:
    c1 = classes(V1)
    o = c1["Order"](id=1)
    o.refund.value = 9
    f = fmt(PROTOBUF, FakeRegistry({1: registered(V1)}), **{"value.converter.wrapper.for.nullables": "true"})
    out = run(f, [framed(1, [1], o.SerializeToString()), framed(1, [1], c1["Order"](id=2).SerializeToString())])
    assert out.converted.table.column("refund").to_pylist() == [9, None]
    for key, value in (("value.converter.flatten.unions", "true"),
                       ("value.converter.optional.for.proto2", "false"),
                       ("value.converter.enhanced.protobuf.schema.support", "true"),
                       ("value.converter.wrapper.for.nullables", "maybe"),
                       ("value.converter.use.optional.for.nonrequired", "true")):  # a JSON Schema key
        with pytest.raises(ConfigError) as e:
            fmt(PROTOBUF, FakeRegistry({}), **{key: value})
        assert e.value.key == key


def test_protobuf_schemas_that_do_not_compile_are_rejects_naming_the_id() -> None:
    f = fmt(PROTOBUF, FakeRegistry({4: Registered("PROTOBUF", "message Broken { int64 id = 1 }")}))
    values = [framed(4, [0], b"\x08\x01")]
    assert f.registry is not None
    asyncio.run(f.registry.prepare(values))
    assert f.table_schema(values) is None
    out = f.convert([Msg(v) for v in values], values, pa.schema([pa.field("id", pa.int64())]))
    assert out.table.num_rows == 0
    reason = out.rejects[0].reason
    assert reason.startswith("schema id 4: Protobuf schema does not compile: schema:1:"), reason
    assert "absl" not in reason


J1 = {"type": "object", "title": "Pizza", "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"},
    "toppings": {"type": "array", "items": {"type": "string"}}}, "required": ["id", "name", "toppings"]}
J2 = {**J1, "properties": {**J1["properties"], "cheese": {"oneOf": [{"type": "null"}, {"type": "string"}]}}}


def test_json_schema_values_of_two_versions_land_together_and_avro_ids_are_rejects() -> None:
    registry = FakeRegistry({1: Registered("JSON", json.dumps(J1)), 2: Registered("JSON", json.dumps(J2)),
                             3: Registered("AVRO", '"string"')})
    f = fmt(JSON_SCHEMA, registry)

    def js(i: int, v: dict[str, Any]) -> bytes:
        return b"\x00" + struct.pack(">i", i) + json.dumps(v).encode()

    values = [js(1, {"id": 1, "name": "a", "toppings": ["x"]}), js(2, {"id": 2, "name": "b", "toppings": [],
                                                                    "cheese": "brie"}),
              js(3, {"id": 3}), js(1, {"id": 4, "toppings": []})]
    out = run(f, values)
    assert out.proposal is not None
    assert out.converted.table.to_pylist() == [{"id": 1, "name": "a", "toppings": ["x"], "cheese": None},
                                               {"id": 2, "name": "b", "toppings": [], "cheese": "brie"}]
    reasons = {r.index: r.reason for r in out.converted.rejects}
    assert sorted(reasons) == [2, 3]
    assert "schema id 3 is a AVRO schema" in reasons[2]
    assert "schema id 1" in reasons[3]  # name is required


def test_use_optional_for_nonrequired_acts_as_in_json_schema_data() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}},
              "required": ["id"]}
    values = [b"\x00\x00\x00\x00\x01" + json.dumps({"id": 1}).encode()]
    strict = run(fmt(JSON_SCHEMA, FakeRegistry({1: Registered("JSON", json.dumps(schema))})), values)
    assert strict.converted.table.num_rows == 0 and "note" in str(strict.converted.rejects[0])  # JsonSchemaData's default
    loose = run(fmt(JSON_SCHEMA, FakeRegistry({1: Registered("JSON", json.dumps(schema))}),
                    **{"value.converter.use.optional.for.nonrequired": "true"}), values)
    assert loose.converted.table.to_pylist() == [{"id": 1, "note": None}]


def test_a_fetch_with_no_table_and_no_usable_schema_is_all_rejects() -> None:
    f = fmt(PROTOBUF, FakeRegistry({}))  # the registry holds no id: no table can be created
    values = [framed(7, [0], b"\x08\x01"), b"junk"]
    assert f.registry is not None
    asyncio.run(f.registry.prepare(values))
    assert f.table_schema(values) is None
    out = f.convert([Msg(v) for v in values], values, None)
    assert out.table.num_rows == 0
    assert [r.index for r in out.rejects] == [0, 1] and "schema id 7 is unknown" in out.rejects[0].reason


CONTACT = """syntax = "proto3";
package shop;
message Contact {
  enum Kind { HOME = 0; WORK = 1; }
  int64 id = 1;
  optional string nick = 2;
  oneof via {
    string email = 3;
    int64 phone = 4;
  }
  Kind kind = 5;
}
"""


def test_oneofs_are_named_with_their_index_and_enums_are_ints_as_the_keys_say() -> None:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    main, _ = compile_proto(CONTACT)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(main))
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Contact"))
    values = [framed(1, [0], cls(id=1, email="a@b", kind=1).SerializeToString())]
    registry = {1: Registered("PROTOBUF", CONTACT)}
    default = run(fmt(PROTOBUF, FakeRegistry(registry)), values).converted.table
    assert default.to_pylist() == [{"via_0": {"email": "a@b", "phone": None}, "id": 1, "nick": None, "kind": "WORK"}]
    plain = run(fmt(PROTOBUF, FakeRegistry(registry), **{"value.converter.generate.index.for.unions": "false",
                                                         "value.converter.int.for.enums": "true"}), values)
    assert plain.converted.table.to_pylist() == [{"via": {"email": "a@b", "phone": None}, "id": 1, "nick": None,
                                                  "kind": 1}]


def test_an_enum_number_the_schema_lacks_is_named_as_java_names_it() -> None:
    """Protobuf 3 enums are open: a number the writer knew and the schema does not is kept, named
    ``UNKNOWN_ENUM_VALUE_<Enum>_<n>`` as Java's ProtobufData names it (it failed the whole decode:
    Arrow had no kernel joining a str and a large_string)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    main, _ = compile_proto(CONTACT)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(main))
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Contact"))
    values = [framed(1, [0], cls(id=1, kind=1).SerializeToString()), framed(1, [0], cls(id=2, kind=7).SerializeToString())]
    got = run(fmt(PROTOBUF, FakeRegistry({1: Registered("PROTOBUF", CONTACT)})), values).converted
    assert [r["kind"] for r in got.table.to_pylist()] == ["WORK", "UNKNOWN_ENUM_VALUE_Kind_7"]
