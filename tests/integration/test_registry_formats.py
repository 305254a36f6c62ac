"""Protobuf and JSON Schema payloads from confluent-kafka's own serializers, decoded in bulk by
agents/formats/protobuf.py and agents/formats/json_schema.py with the schema fetched by id through
icesink's RegistryClient from the real registry (AxonOps, the session's ``schema_registry``; issue
36 points 2 and 3). The Protobuf schema is registered as .proto text (this server refuses the
serializer's own registration, docs/schema-registry.md) with a reference, the message class is
built from the descriptor the registry serves (``?format=serialized``, what generated code is
compiled from), and ProtobufSerializer writes the message indexes of the file's second message.
This server's serialized descriptors are lossy (docs/schema-registry.md): an enum field makes it
answer 500, map fields lose ``map_entry`` and proto3 ``optional`` its flag, so the schema here has
none of them; tests/unit/test_protobuf.py covers them with descriptors as protoc writes them."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import struct
from typing import Any

import pytest
from pydantic import SecretStr

from agents.formats.json_schema import decode_json_schema, json_schema_plan
from agents.formats.protobuf import decode_protobuf, protobuf_plan
from agents.formats.registry_wire import frames
from agents.registry_client import RegisteredSchema, RegistryAuth, RegistryClient
from tests.support.schema_registry import SchemaRegistry

pytestmark = pytest.mark.integration

MONEY_PROTO = 'syntax = "proto3";\npackage fmt;\nmessage Money {\n  int64 cents = 1;\n  string currency = 2;\n}\n'
ORDER_PROTO = """syntax = "proto3";
package fmt;
import "fmt/money.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Note {
  string text = 1;
}
message Order {
  int64 id = 1;
  fmt.Money total = 3;
  repeated string tags = 4;
  oneof contact {
    string email = 6;
    int64 phone = 7;
  }
  google.protobuf.Timestamp at = 9;
  google.protobuf.Int64Value refund = 10;
  bytes raw = 11;
  repeated fmt.Money parts = 12;
}
"""
PIZZA_JSON = {
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Pizza", "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "slices": {"type": "integer", "connect.type": "int32"},
        "baked": {"type": "string", "format": "date-time"},
        "toppings": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "grams": {"oneOf": [{"type": "null"}, {"type": "number"}]}}}},
    },
    "required": ["id", "name"],
}
T0 = dt.datetime(2026, 11, 29, 12, 0, 0, 250000, tzinfo=dt.UTC)


def sr_client(server: SchemaRegistry) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient(server.client_config())


def fetch(server: SchemaRegistry, schema_id: int, *, serialized: bool = False) -> RegisteredSchema:
    async def run() -> RegisteredSchema | None:
        client = RegistryClient([server.url], RegistryAuth(user_info=SecretStr(server.user_info)))
        try:
            return await (client.serialized(schema_id) if serialized else client.schema(schema_id))
        finally:
            await client.close()

    found = asyncio.run(run())
    assert found is not None, schema_id
    return found


def test_protobuf_serializer_values_decode_in_bulk_with_the_registered_schema(schema_registry: SchemaRegistry) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaReference
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2, wrappers_pb2

    client = sr_client(schema_registry)
    client.register_schema("t-fmt-money", Schema(MONEY_PROTO, "PROTOBUF"))
    order_id = client.register_schema("t-fmt-order-value", Schema(ORDER_PROTO, "PROTOBUF", [
        SchemaReference("fmt/money.proto", "t-fmt-money", 1)]))

    registered = fetch(schema_registry, order_id, serialized=True)
    assert registered.type == "PROTOBUF" and registered.id == order_id
    [ref] = registered.references
    assert ref.name == "fmt/money.proto"
    refs = ((ref.name, ref.schema.text),)
    # The producer's class, compiled from the descriptors the registry serves (as protoc would).
    pool = descriptor_pool.DescriptorPool()
    for wk in (timestamp_pb2, wrappers_pb2):
        pool.AddSerializedFile(wk.DESCRIPTOR.serialized_pb)
    money = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(ref.schema.text))
    money.name = "fmt/money.proto"
    pool.Add(money)
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(registered.text)))
    order = message_factory.GetMessageClass(pool.FindMessageTypeByName("fmt.Order"))

    messages = [order(id=1, tags=["a", "b"], email="x@y", raw=b"\x00\xff"),
                order(id=2, phone=5551234), order(id=3)]
    messages[0].total.cents, messages[0].total.currency = 1250, "EUR"
    messages[0].at.FromDatetime(T0)
    messages[0].refund.value = 300
    messages[1].parts.add(cents=1)
    messages[1].parts.add(cents=2, currency="USD")
    serializer = ProtobufSerializer(order, client, {"use.deprecated.format": False, "auto.register.schemas": False,
                                                   "use.latest.version": True})
    ctx = SerializationContext("t-fmt-order", MessageField.VALUE)
    values: list[bytes] = [v for m in messages if (v := serializer(m, ctx)) is not None]
    values.insert(1, values[0][:-5])  # a truncated value among them
    framed = frames(values, protobuf=True)
    assert not framed.rejects and set(framed.indexes or ()) == {(1,)}  # Order: the file's second message
    ((schema_id, rows),) = framed.groups().items()
    assert schema_id == order_id

    plan = protobuf_plan(registered.text, (1,), refs)
    out = decode_protobuf([framed.payload(int(k)) for k in rows], plan, plan.arrow, schema_id=schema_id,
                          positions=[int(framed.positions[k]) for k in rows])
    out.validate()
    assert out.indices.to_pylist() == [0, 2, 3]
    assert [r.index for r in out.rejects] == [1] and f"schema id {order_id} (fmt.Order)" in out.rejects[0].reason
    assert out.table.to_pylist() == [
        {"contact": {"email": "x@y", "phone": None}, "id": 1,
         "total": {"cents": 1250, "currency": "EUR"}, "tags": ["a", "b"], "at": T0, "refund": 300,
         "raw": b"\x00\xff", "parts": []},
        {"contact": {"email": None, "phone": 5551234}, "id": 2, "total": None, "tags": [],
         "at": None, "refund": None, "raw": b"",
         "parts": [{"cents": 1, "currency": ""}, {"cents": 2, "currency": "USD"}]},
        {"contact": None, "id": 3, "total": None, "tags": [], "at": None, "refund": None, "raw": b"", "parts": []},
    ]


def test_json_serializer_values_decode_in_bulk_with_the_registered_schema(schema_registry: SchemaRegistry) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = JSONSerializer(json.dumps(PIZZA_JSON), sr_client(schema_registry))
    ctx = SerializationContext("t-fmt-pizza", MessageField.VALUE)
    records = [
        {"id": 1, "name": "margherita", "slices": 8, "baked": T0.isoformat(),
         "toppings": [{"name": "basil", "grams": 2.5}, {"name": "salt", "grams": None}]},
        {"id": 2, "name": "marinara"},
    ]
    values: list[bytes] = [v for r in records if (v := serializer(r, ctx)) is not None]
    schema_id = struct.unpack(">bI", values[0][:5])[1]
    values.append(values[0][:5] + b'{"id": "seven", "name": "x"}')  # not what the schema says
    framed = frames(values)
    ((found_id, rows),) = framed.groups().items()
    assert found_id == schema_id

    registered = fetch(schema_registry, schema_id)
    assert registered.type == "JSON" and json.loads(registered.text) == PIZZA_JSON
    plan = json_schema_plan(registered.text)
    out = decode_json_schema([framed.payload(int(k)) for k in rows], plan, plan.arrow, schema_id=schema_id,
                             positions=[int(framed.positions[k]) for k in rows])
    out.validate()
    assert out.indices.to_pylist() == [0, 1]
    assert out.table.to_pylist() == [
        {"id": 1, "name": "margherita", "slices": 8, "baked": T0,
         "toppings": [{"name": "basil", "grams": 2.5}, {"name": "salt", "grams": None}]},
        {"id": 2, "name": "marinara", "slices": None, "baked": None, "toppings": None},
    ]
    assert [(r.index, r.field) for r in out.rejects] == [(2, "id")]
    assert out.rejects[0].reason.startswith(f"JSON Schema record of schema id {schema_id}: ")
