"""Protobuf and JSON Schema through a schema registry end to end (issue 36): a real worker process
on the embedded broker, ``value.converter`` = Confluent's ProtobufConverter or JsonSchemaConverter
against the real registry (tests/conftest.py ``schema_registry``: AxonOps, basic auth), values
produced by confluent-kafka's own ``ProtobufSerializer`` and ``JSONSerializer``. The .proto text
is registered first (this server refuses the serializer's own registration, docs/schema-registry.md)
with a reference, and has what AxonOps' serialized descriptors lose (an enum, a map, proto3
``optional``): the worker compiles the text with protoc. A v2 schema with an added field evolves
the table; pyiceberg reads back exactly what was produced; a value that does not parse goes to the
dead letters naming its schema id."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from typing import Any

import pytest

from tests.integration.test_registry_avro_worker import send

pytestmark = pytest.mark.integration

PROTOBUF = "io.confluent.connect.protobuf.ProtobufConverter"
JSON_SCHEMA = "io.confluent.connect.json.JsonSchemaConverter"
MONEY = 'syntax = "proto3";\npackage pbw;\nmessage Money {\n  int64 cents = 1;\n  string currency = 2;\n}\n'
ORDER_V1 = """syntax = "proto3";
package pbw;
import "pbw/money.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Header {
  string source = 1;
}
message Order {
  enum Size { SMALL = 0; MEDIUM = 1; LARGE = 2; }
  message Line {
    string sku = 1;
    int32 qty = 2;
  }
  int64 id = 1;
  pbw.Money total = 2;
  repeated Line lines = 3;
  map<string, int64> attrs = 4;
  Size size = 5;
  oneof contact {
    string email = 6;
    int64 phone = 7;
  }
  google.protobuf.Timestamp at = 8;
  google.protobuf.Int32Value rating = 9;
  optional string coupon = 10;
}
"""
ORDER_V2 = ORDER_V1.replace("  optional string coupon = 10;\n", "  optional string coupon = 10;\n  string note = 11;\n")
T0 = dt.datetime(2026, 11, 29, 12, 0, 0, 250000, tzinfo=dt.UTC)
N1, N2 = 30, 10


def config(tmp_path: Any, broker: Any, catalog_props: Any, registry: Any, converter: str, topic: str, table: str,
           group: str) -> Any:
    from tests.support.sinkrun import write_config

    return write_config(
        tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group=group, **{
            "value.converter": converter,
            "value.converter.schema.registry.url": registry.url,
            "value.converter.basic.auth.credentials.source": "USER_INFO",
            "value.converter.basic.auth.user.info": registry.user_info,
            "iceberg.tables.evolve-schema-enabled": "true",
            "errors.tolerance": "all",
        },
    )


def sink(tmp_path: Any, cfg: Any, catalog: Any, name: str, rows: int) -> None:
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import wait_rows

    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, (name,), rows, timeout_s=200)
        time.sleep(3)  # another round: nothing is added twice
    finally:
        replicas.stop_all()


def order_classes(text: str) -> Any:
    """The producer's Order class, compiled by protoc from the text registered (as a user's build does)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2, wrappers_pb2

    from agents.formats.proto_text import compile_proto

    main, refs = compile_proto(text, (("pbw/money.proto", MONEY),))
    pool = descriptor_pool.DescriptorPool()
    for wk in (timestamp_pb2, wrappers_pb2):
        pool.AddSerializedFile(wk.DESCRIPTOR.serialized_pb)
    for _, ref in refs:
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(ref))
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(main))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("pbw.Order"))


def orders(cls: Any, first: int, n: int, v2: bool = False) -> tuple[list[Any], list[dict[str, Any]]]:
    """Messages and the rows each should be."""
    msgs, rows = [], []
    for i in range(first, first + n):
        m = cls(id=i, size=i % 3, attrs={"k": i} if i % 2 else {})
        m.lines.add(sku=f"s{i}", qty=i)
        if i % 3 == 0:
            m.email = f"c{i}@x"
        elif i % 3 == 1:
            m.phone = 5550000 + i
        if i % 4 == 0:
            m.total.cents, m.total.currency = 100 * i, "EUR"
            m.at.FromDatetime(T0 + dt.timedelta(seconds=i))
            m.rating.value = i
            m.coupon = f"C{i}"
        if v2:
            m.note = f"n{i}"
        msgs.append(m)
        rows.append({  # the oneof is contact_0 (ProtobufData's generate.index.for.unions=true)
            "contact_0": None if i % 3 == 2 else {"email": f"c{i}@x" if i % 3 == 0 else None,
                                                "phone": 5550000 + i if i % 3 == 1 else None},
            "id": i, "total": {"cents": 100 * i, "currency": "EUR"} if i % 4 == 0 else None,
            "lines": [{"sku": f"s{i}", "qty": i}], "attrs": [("k", i)] if i % 2 else [],
            "size": ["SMALL", "MEDIUM", "LARGE"][i % 3], "at": T0 + dt.timedelta(seconds=i) if i % 4 == 0 else None,
            "rating": {"value": i} if i % 4 == 0 else None,  # Int32Value: struct<value> (wrapper.for.nullables=false)
            "coupon": f"C{i}" if i % 4 == 0 else None, "note": f"n{i}" if v2 else None,
        })
    return msgs, rows


def producer_client(registry: Any) -> Any:
    """The producer's registry client. ProtobufSerializer asks for the latest version with
    ``?format=serialized``, which this server answers 500 for a schema with an enum (a nil
    dereference in its ``fieldToProto``, docs/schema-registry.md); Confluent's server answers the
    schema's FileDescriptorProto. This client answers that one call as Confluent's would: the
    descriptor protoc compiles from the text the registry holds (id, version and references are the
    registry's). The worker under test reads the real registry only."""
    import base64

    from confluent_kafka.schema_registry import RegisteredSchema, Schema, SchemaRegistryClient

    from agents.formats.proto_text import compile_proto

    class Client(SchemaRegistryClient):  # type: ignore[misc]
        def get_latest_version(self, subject_name: str, fmt: str | None = None) -> Any:
            latest = super().get_latest_version(subject_name)
            return self.compiled(latest) if fmt == "serialized" else latest

        def get_version(self, subject_name: str, version: Any = "latest", deleted: bool = False,
                        fmt: str | None = None) -> Any:
            found = super().get_version(subject_name, version, deleted)
            return self.compiled(found) if fmt == "serialized" else found

        def compiled(self, found: Any) -> Any:
            refs = tuple((r.name, super(Client, self).get_version(r.subject, r.version).schema.schema_str)
                         for r in found.schema.references)
            main, _ = compile_proto(found.schema.schema_str, refs)
            return RegisteredSchema(found.subject, found.version, found.schema_id, found.guid, Schema(
                base64.b64encode(main).decode(), "PROTOBUF", found.schema.references))

    return Client(registry.client_config())


def pb_serialize(registry: Any, cls: Any, topic: str, msgs: list[Any]) -> list[bytes]:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = ProtobufSerializer(cls, producer_client(registry), {
        "use.deprecated.format": False, "auto.register.schemas": False, "use.latest.version": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [ser(m, ctx) for m in msgs]


@pytest.mark.timeout(300)
def test_protobuf_serializer_values_land_and_evolve(broker, catalog_props, schema_registry, tmp_path):
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic

    topic, name = "pb-orders", "pbw.orders"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    client = SchemaRegistryClient(schema_registry.client_config())
    client.register_schema("pbw-money", Schema(MONEY, "PROTOBUF"))
    ref = [SchemaReference("pbw/money.proto", "pbw-money", 1)]
    v1_id = client.register_schema(f"{topic}-value", Schema(ORDER_V1, "PROTOBUF", ref))
    c1, c2 = order_classes(ORDER_V1), order_classes(ORDER_V2)
    m1, r1 = orders(c1, 0, N1)
    values = pb_serialize(schema_registry, c1, topic, m1)
    assert values[0][1:5] == v1_id.to_bytes(4, "big") and values[0][5:7] == b"\x02\x02"  # indexes [1]: Order
    bad = values[0][:7] + b"\xff\xff\xff"  # a payload that does not parse
    client.register_schema(f"{topic}-value", Schema(ORDER_V2, "PROTOBUF", ref))
    m2, r2 = orders(c2, N1, N2, v2=True)
    asyncio.run(send(broker.bootstrap, topic, [*values[:N1 // 2], bad, *values[N1 // 2:],
                                               *pb_serialize(schema_registry, c2, topic, m2)]))
    sink(tmp_path, config(tmp_path, broker, catalog_props, schema_registry, PROTOBUF, topic, name, "pb-sink"),
         catalog, name, N1 + N2)

    table = catalog.load_table(name)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert list(types) == ["contact_0", "id", "total", "lines", "attrs", "size", "at", "rating", "coupon", "note"]
    assert types["attrs"].startswith("map<string, long>") and types["size"] == "string"
    assert types["at"] == "timestamptz" and types["rating"].startswith("struct<")
    got = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert got == r1 + r2
    dead = tmp_path / "state" / "deadletter" / f"{topic}.jsonl"
    letters = [json.loads(x) for x in dead.read_text().splitlines()]
    assert [(d["topic"], d["partition"], d["offset"]) for d in letters] == [(topic, 0, N1 // 2)]
    assert f"schema id {v1_id}" in json.dumps(letters[0]) and "does not parse" in json.dumps(letters[0])


PIZZA_V1: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Pizza", "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "slices": {"type": "integer", "connect.type": "int32"},
        "baked": {"type": "string", "format": "date-time"},
        "dough": {"type": "object", "properties": {"kind": {"type": "string"}, "hours": {"type": "number"}},
                  "required": ["kind", "hours"]},
        "toppings": {"type": "array", "items": {"type": "string"}},
        "extra": {"oneOf": [{"type": "null"}, {"type": "string"}]},
    },
    "required": ["id", "name", "slices", "baked", "dough", "toppings"],
    "additionalProperties": False,  # closed: the registry's BACKWARD check lets v2 add a property
}
PIZZA_V2 = {**PIZZA_V1, "properties": {**PIZZA_V1["properties"], "oven": {"oneOf": [{"type": "null"},
                                                                                    {"type": "string"}]}}}


def pizza(i: int, v2: bool = False) -> dict[str, Any]:
    out = {"id": i, "name": f"p{i}", "slices": i % 9, "baked": (T0 + dt.timedelta(minutes=i)).isoformat(),
           "dough": {"kind": "sour" if i % 2 else "yeast", "hours": i / 4}, "toppings": [f"t{j}" for j in range(i % 3)],
           "extra": None if i % 2 else f"e{i}"}
    if v2:
        out["oven"] = f"o{i}"
    return out


@pytest.mark.timeout(300)
def test_json_serializer_values_land_and_evolve(broker, catalog_props, schema_registry, tmp_path):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic

    topic, name = "js-pizzas", "pbw.pizzas"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = []
    for schema, first, n, v2 in ((PIZZA_V1, 0, N1, False), (PIZZA_V2, N1, N2, True)):
        ser = JSONSerializer(json.dumps(schema), SchemaRegistryClient(schema_registry.client_config()))
        values += [ser(pizza(i, v2), ctx) for i in range(first, first + n)]
    asyncio.run(send(broker.bootstrap, topic, values))
    sink(tmp_path, config(tmp_path, broker, catalog_props, schema_registry, JSON_SCHEMA, topic, name, "js-sink"),
         catalog, name, N1 + N2)

    table = catalog.load_table(name)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert list(types) == [*PIZZA_V1["properties"], "oven"]
    assert types["slices"] == "int" and types["baked"] == "timestamptz" and types["dough"].startswith("struct<")
    got = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    want = [{**pizza(i, i >= N1), "baked": T0 + dt.timedelta(minutes=i)} for i in range(N1 + N2)]
    assert got == [{**w, "oven": w.get("oven")} for w in want]
    assert not (tmp_path / "state" / "deadletter" / f"{topic}.jsonl").exists()
