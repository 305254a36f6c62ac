"""Avro, JSON Schema and Protobuf through a second real schema registry, Apicurio Registry 2.4.2 built
from Maven Central (tests/support/apicurio.py), and Java serializers (issue 36 point 7).

The first test produces with Apicurio's own Java ``AvroKafkaSerializer`` (a small producer,
tests/support/java/ApicurioProduce.java) set to Confluent's wire format
(``apicurio.registry.as-confluent``, ``use-id=contentId``, no headers) on the real Apache Kafka
broker; a worker reads them into one table with ``value.converter`` = Confluent's AvroConverter
pointed at Apicurio's Confluent-compatible API, and into another with Apicurio's converter class
pointed at Apicurio's own API, and pyiceberg reads back exactly what Java wrote, a second schema
version evolving each table. The second runs confluent-kafka's Python ``AvroSerializer``
against the same server, as the AxonOps tests do (test_registry_avro_worker.py). The third
produces with Apicurio's Java ``JsonSchemaKafkaSerializer``, read with Confluent's
JsonSchemaConverter. The fourth produces with Apicurio's Java ``ProtobufKafkaSerializer`` in
Apicurio's own frame (8-byte global id, its Ref message), read with Apicurio's ProtobufConverter
class name (docs/schema-registry.md, "Apicurio's Protobuf frame"). The fifth produces with the Avro
and Protobuf serializers in Apicurio 2's headers mode (``apicurio.registry.headers.enabled=true``: the
8-byte global id in a record header, the value bare), read with ``headers.enabled=true``
(docs/schema-registry.md, "Apicurio's headers mode").

In the chaos suite (``./dev chaos``, about 2.7 minutes for the three): the server takes 15-30 s
to start, the first build two minutes."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import io
import json
import struct
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.apicurio import ApicurioRegistry

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.chaos]

AVRO = "io.confluent.connect.avro.AvroConverter"
APICURIO_AVRO = "io.apicurio.registry.utils.converter.AvroConverter"
JSON_SCHEMA = "io.confluent.connect.json.JsonSchemaConverter"
#: What ApicurioProduce.record writes (its values are computed in :func:`expected`).
V1: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "coupon", "type": ["null", "string"], "default": None},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
N1, N2 = 30, 20


@pytest.fixture(scope="module")
def apicurio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApicurioRegistry]:
    server = ApicurioRegistry(tmp_path_factory.mktemp("apicurio"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def expected(i: int, v2: bool) -> dict[str, Any]:
    """The row ApicurioProduce.record(schema, i) becomes."""
    row: dict[str, Any] = {
        "id": i, "name": f"n{i}", "tags": [f"t{j}" for j in range(i % 3)], "coupon": f"C{i}" if i % 4 == 0 else None,
        "price": decimal.Decimal(i * 100 + i % 100).scaleb(-2), "day": dt.date(2026, 1, 1) + dt.timedelta(days=i),
        "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=1000 * i + 7),
    }
    row["note"] = (f"note{i}" if i % 2 else None) if v2 else None
    return row


def ccompat_schema(registry: ApicurioRegistry, schema_id: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"{registry.ccompat_url}/schemas/ids/{schema_id}", timeout=10) as response:
        return json.loads(json.loads(response.read())["schema"])


async def first_values(bootstrap: str, topic: str, offsets: list[int]) -> dict[int, bytes]:
    return {o: v for o, (v, _) in (await first_records(bootstrap, topic, offsets)).items()}


async def first_records(bootstrap: str, topic: str, offsets: list[int]) -> dict[int, tuple[bytes, dict[str, bytes]]]:
    """The value and headers (the last of each name) of each record at ``offsets``."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    out: dict[int, tuple[bytes, dict[str, bytes]]] = {}
    try:
        for offset in offsets:
            consumer.seek(tp, offset)
            record = await asyncio.wait_for(consumer.getone(), 30)
            assert record.value is not None
            out[record.offset] = (record.value, dict(record.headers))
    finally:
        await consumer.stop()
    return out


def confluent_converter(registry: ApicurioRegistry) -> dict[str, str]:
    """Confluent's AvroConverter on Apicurio's Confluent-compatible API."""
    return {"value.converter": AVRO, "value.converter.schema.registry.url": registry.ccompat_url}


def apicurio_converter(registry: ApicurioRegistry) -> dict[str, str]:
    """Apicurio 2's converter as a Kafka Connect user would set it for Confluent's frame: its own
    API's URL (the sink reads /apis/ccompat/v7 beside it) and the producer's three settings."""
    pre = "value.converter.apicurio.registry."
    return {"value.converter": APICURIO_AVRO, pre + "url": registry.registry_url, pre + "as-confluent": "true",
            pre + "use-id": "contentId", pre + "headers.enabled": "false"}


def sink(tmp_path: Path, bootstrap: str, catalog: Any, catalog_props: Any, converter: dict[str, str], topic: str,
         table: str, rows: int) -> None:
    from tests.support.sinkrun import sink_until, write_config

    run = tmp_path / table
    run.mkdir()
    cfg = write_config(
        run / "sink.json", topics=topic, tables=table, bootstrap=bootstrap, catalog_props=catalog_props,
        state_dir=run / "state", group=f"{table}-sink", **converter, **{
            "iceberg.tables.evolve-schema-enabled": "true",
            "iceberg.control.topic.replication-factor": "1",  # one Kafka broker
        })
    sink_until(cfg, run / "logs", catalog, (table,), rows, timeout_s=150)
    assert not (run / "state" / "deadletter" / f"{topic}.jsonl").exists()


def read_back(catalog: Any, name: str) -> list[dict[str, Any]]:
    return sorted(catalog.load_table(name).scan().to_arrow().to_pylist(), key=lambda r: r["id"])


@pytest.mark.timeout(400)
def test_java_serializer_records_land_exactly(kafka, catalog_props, apicurio, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.apicurio import produce

    topic = "apicurio-java"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(kafka.bootstrap, topic, 1))
    (tmp_path / "v1.avsc").write_text(json.dumps(V1))
    (tmp_path / "v2.avsc").write_text(json.dumps(V2))
    sent = produce(kafka.bootstrap, topic, apicurio.registry_url, tmp_path / "v1.avsc", 0, N1)
    sent += produce(kafka.bootstrap, topic, apicurio.registry_url, tmp_path / "v2.avsc", N1, N2)
    assert sent == [(i, i) for i in range(N1 + N2)]

    # Confluent's wire format: magic 0, a 4-byte id that the Confluent-compatible API resolves, no headers
    values = asyncio.run(first_values(kafka.bootstrap, topic, [0, N1]))
    ids = []
    for offset, schema in ((0, V1), (N1, V2)):
        assert values[offset][0] == 0, values[offset][:8]
        (schema_id,) = struct.unpack(">i", values[offset][1:5])
        fields = ccompat_schema(apicurio, schema_id)["fields"]
        assert [f["name"] for f in fields] == [f["name"] for f in schema["fields"]]
        ids.append(schema_id)
    assert ids[0] != ids[1]

    # the same records through Confluent's converter and through Apicurio's, into one table each
    for name, converter in (("apicurio.java", confluent_converter(apicurio)),
                            ("apicurio.java_apicurio", apicurio_converter(apicurio))):
        sink(tmp_path, kafka.bootstrap, catalog, catalog_props, converter, topic, name, N1 + N2)
        table = catalog.load_table(name)
        assert [f.name for f in table.schema().fields] == [f["name"] for f in V2["fields"]]  # note: evolved in
        types = {f.name: str(f.field_type) for f in table.schema().fields}
        assert (types["price"], types["day"], types["at"]) == ("decimal(9, 2)", "date", "timestamptz")
        assert read_back(catalog, name) == [expected(i, v2=i >= N1) for i in range(N1 + N2)], name


@pytest.mark.timeout(300)
def test_confluent_kafka_serializer_against_apicurio(kafka, catalog_props, apicurio, tmp_path):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from tests.integration.test_registry_avro_worker import V1 as ORDER, order, send, serialize

    topic, name = "apicurio-python", "apicurio.python"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(kafka.bootstrap, topic, 1))
    client = SchemaRegistryClient({"url": apicurio.ccompat_url})
    ser = AvroSerializer(client, json.dumps(ORDER), conf={"auto.register.schemas": True})
    records = [order(i) for i in range(N1)]
    values = serialize(ser, topic, records)
    (schema_id,) = struct.unpack(">i", values[0][1:5])
    assert ccompat_schema(apicurio, schema_id)["name"] == "Order"
    asyncio.run(send(kafka.bootstrap, topic, values))

    sink(tmp_path, kafka.bootstrap, catalog, catalog_props, confluent_converter(apicurio), topic, name, N1)
    got = read_back(catalog, name)
    assert [r["id"] for r in got] == list(range(N1))
    assert [(r["customer"], r["items"], r["price"], r["day"]) for r in got] == [
        ({"name": r["customer"]["name"], "vip": r["customer"]["vip"]}, r["items"], r["price"], r["day"]) for r in records]


ORDER_JSON: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "coupon": {"oneOf": [{"type": "null"}, {"type": "string"}]},
    },
    "required": ["id", "name", "tags"],
}


@pytest.mark.timeout(300)
def test_java_json_schema_serializer_records_land_exactly(kafka, catalog_props, apicurio, tmp_path):
    """Apicurio 2.4's JsonSchemaKafkaSerializer cannot register a schema: it is registered through
    the Confluent-compatible API first, and the serializer finds it (find-latest) by the subject
    its TopicIdStrategy names. Read with Confluent's JsonSchemaConverter."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.apicurio import produce

    topic, name = "apicurio-json", "apicurio.json"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(kafka.bootstrap, topic, 1))
    client = SchemaRegistryClient({"url": apicurio.ccompat_url})
    schema_id = client.register_schema(f"{topic}-value", Schema(json.dumps(ORDER_JSON), "JSON"))
    sent = produce(kafka.bootstrap, topic, apicurio.registry_url, None, 0, N1, kind="json")
    assert sent == [(i, i) for i in range(N1)]
    value = asyncio.run(first_values(kafka.bootstrap, topic, [0]))[0]
    assert value[0] == 0 and struct.unpack(">i", value[1:5]) == (schema_id,), value[:8]

    sink(tmp_path, kafka.bootstrap, catalog, catalog_props,
         {"value.converter": JSON_SCHEMA, "value.converter.schema.registry.url": apicurio.ccompat_url},
         topic, name, N1)
    assert read_back(catalog, name) == [
        {"id": i, "name": f"n{i}", "tags": [f"t{j}" for j in range(i % 3)], "coupon": f"C{i}" if i % 4 == 0 else None}
        for i in range(N1)]


APICURIO_PROTOBUF = "io.apicurio.registry.utils.converter.ProtobufConverter"
#: What ApicurioProduce.protoRecord writes: Order is the file's second message, so its Ref matters.
ORDER_PROTO = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Address {
  string city = 1;
  int32 zip = 2;
}
message Order {
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  int64 id = 1;
  string name = 2;
  Address address = 3;
  repeated string tags = 4;
  map<string, int32> counts = 5;
  Status status = 6;
  google.protobuf.Timestamp at = 7;
}
"""


@pytest.mark.timeout(300)
def test_java_protobuf_serializer_in_apicurios_own_frame_lands_exactly(kafka, catalog_props, apicurio, tmp_path):
    """Apicurio 2.4's ProtobufKafkaSerializer with its defaults but headers off writes its own frame:
    magic 0, an 8-byte global id (DefaultIdHandler, use-id=globalId), the length-delimited Ref
    naming the message, the payload; it registers the file and its import of timestamp.proto
    itself. Read with Apicurio's ProtobufConverter class name and those keys (the sink asks
    Apicurio's own API for the global id and its references)."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.apicurio import produce

    topic, name = "apicurio-protobuf", "apicurio.protobuf"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(kafka.bootstrap, topic, 1))
    sent = produce(kafka.bootstrap, topic, apicurio.registry_url, order_descriptor(tmp_path), 0, N1, kind="protobuf")
    assert sent == [(i, i) for i in range(N1)]

    value = asyncio.run(first_values(kafka.bootstrap, topic, [0]))[0]
    assert value[0] == 0, value[:16]
    (global_id,) = struct.unpack(">q", value[1:9])
    assert value[9:17] == b"\x07\x0a\x05Order", value[:24]  # Ref { name: "Order" }, its length first
    with urllib.request.urlopen(f"{apicurio.registry_url}/ids/globalIds/{global_id}", timeout=10) as response:
        assert b"message Order" in response.read()

    pre = "value.converter.apicurio.registry."
    sink(tmp_path, kafka.bootstrap, catalog, catalog_props,
         {"value.converter": APICURIO_PROTOBUF, pre + "url": apicurio.registry_url,
          pre + "id-handler": "io.apicurio.registry.serde.DefaultIdHandler", pre + "use-id": "globalId",
          pre + "headers.enabled": "false"}, topic, name, N1)
    table = catalog.load_table(name)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert (types["status"], types["at"]) == ("string", "timestamptz"), types
    assert types["counts"].startswith("map<string, int"), types
    assert read_back_orders(catalog, name) == [expected_order(i) for i in range(N1)]


def expected_order(i: int) -> dict[str, Any]:
    """The row ApicurioProduce.protoRecord(order, i) becomes."""
    return {
        "id": i, "name": f"n{i}", "address": {"city": f"c{i % 5}", "zip": i * 10},
        "tags": [f"t{j}" for j in range(i % 3)], "counts": [(f"k{j}", i + j) for j in range(i % 2 + 1)],
        "status": ("NEW", "PAID", "SHIPPED")[i % 3],
        "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i, microseconds=7)}


def read_back_orders(catalog: Any, name: str) -> list[dict[str, Any]]:
    got = read_back(catalog, name)
    for row in got:  # a Protobuf map has no order (its entries may come back in any)
        row["counts"] = sorted(row["counts"])
    return got


def order_descriptor(tmp_path: Path) -> Path:
    """ORDER_PROTO as the serialized FileDescriptorProto ApicurioProduce registers and writes."""
    from google.protobuf import descriptor_pb2

    from agents.formats.proto_text import compile_proto

    main, _ = compile_proto(ORDER_PROTO)
    fdp = descriptor_pb2.FileDescriptorProto.FromString(main)
    fdp.name = "shop/order.proto"
    (tmp_path / "order.desc").write_bytes(fdp.SerializeToString())
    return tmp_path / "order.desc"


@pytest.mark.timeout(400)
def test_java_serializers_in_apicurios_headers_mode_land_exactly(kafka, catalog_props, apicurio, tmp_path):
    """Apicurio 2.4's AvroKafkaSerializer and ProtobufKafkaSerializer with their defaults, headers
    on (apicurio.registry.headers.enabled=true): the value bare, the 8-byte global id in the record
    header apicurio.value.globalId, the Protobuf message's name in apicurio.protobuf.type. Read
    with Apicurio's converter classes and headers.enabled=true (global ids through Apicurio's own
    API); a second Avro schema version evolves the table."""
    import fastavro
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.apicurio import produce

    catalog = load_catalog("it", **catalog_props)
    pre = "value.converter.apicurio.registry."
    headers_on = {pre + "url": apicurio.registry_url, pre + "headers.enabled": "true"}

    topic, name = "apicurio-headers-avro", "apicurio.headers_avro"
    asyncio.run(ensure_topic(kafka.bootstrap, topic, 1))
    (tmp_path / "v1.avsc").write_text(json.dumps(V1))
    (tmp_path / "v2.avsc").write_text(json.dumps(V2))
    sent = produce(kafka.bootstrap, topic, apicurio.registry_url, tmp_path / "v1.avsc", 0, N1, headers=True)
    sent += produce(kafka.bootstrap, topic, apicurio.registry_url, tmp_path / "v2.avsc", N1, N2, headers=True)
    assert sent == [(i, i) for i in range(N1 + N2)]
    records = asyncio.run(first_records(kafka.bootstrap, topic, [1, N1]))
    ids = []
    for offset, schema in ((1, V1), (N1, V2)):
        value, headers = records[offset]
        assert headers["apicurio.value.encoding"] == b"BINARY", headers
        (global_id,) = struct.unpack(">q", headers["apicurio.value.globalId"])
        ids.append(global_id)
        # the value is the bare Avro record: no magic byte, no id
        assert fastavro.schemaless_reader(io.BytesIO(value), fastavro.parse_schema(schema))["id"] == offset
    assert ids[0] != ids[1]
    sink(tmp_path, kafka.bootstrap, catalog, catalog_props, {"value.converter": APICURIO_AVRO, **headers_on},
         topic, name, N1 + N2)
    assert [f.name for f in catalog.load_table(name).schema().fields] == [f["name"] for f in V2["fields"]]
    assert read_back(catalog, name) == [expected(i, v2=i >= N1) for i in range(N1 + N2)]

    topic, name = "apicurio-headers-protobuf", "apicurio.headers_protobuf"
    asyncio.run(ensure_topic(kafka.bootstrap, topic, 1))
    sent = produce(kafka.bootstrap, topic, apicurio.registry_url, order_descriptor(tmp_path), 0, N1,
                   kind="protobuf", headers=True)
    assert sent == [(i, i) for i in range(N1)]
    value, headers = asyncio.run(first_records(kafka.bootstrap, topic, [1]))[1]
    assert headers["apicurio.protobuf.type"] == b"Order" and len(headers["apicurio.value.globalId"]) == 8, headers
    assert value[:2] == b"\x08\x01", value[:16]  # the bare message: field 1 (id) = 1, no Ref
    sink(tmp_path, kafka.bootstrap, catalog, catalog_props, {"value.converter": APICURIO_PROTOBUF, **headers_on},
         topic, name, N1)
    assert read_back_orders(catalog, name) == [expected_order(i) for i in range(N1)]


@pytest.mark.timeout(400)
def test_java_protobuf_keys_fill_the_key_column_in_both_frames(kafka, catalog_props, apicurio, tmp_path):
    """Apicurio 2.4's ProtobufKafkaSerializer as the key serializer too (the key: the same Order),
    headers off (its own frame, the Ref) and on (apicurio.key.globalId, apicurio.protobuf.type.key):
    key.converter = Apicurio's ProtobufConverter fills iceberg.tables.key-column with the key
    message as a struct, each row's key equal to what Java wrote."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.apicurio import produce

    catalog = load_catalog("it", **catalog_props)
    for headers in (False, True):
        topic, name = f"apicurio-keys-{headers}".lower(), f"apicurio.keys_{'headers' if headers else 'framed'}"
        asyncio.run(ensure_topic(kafka.bootstrap, topic, 1))
        sent = produce(kafka.bootstrap, topic, apicurio.registry_url, order_descriptor(tmp_path), 0, N1,
                       kind="protobuf", headers=headers, keyed=True)
        assert sent == [(i, i) for i in range(N1)]
        converter: dict[str, str] = {"iceberg.tables.key-column": "_key"}
        for side in ("value", "key"):
            pre = f"{side}.converter.apicurio.registry."
            converter |= {f"{side}.converter": APICURIO_PROTOBUF, pre + "url": apicurio.registry_url,
                          pre + "headers.enabled": str(headers).lower()}
            if not headers:
                converter |= {pre + "id-handler": "io.apicurio.registry.serde.DefaultIdHandler",
                              pre + "use-id": "globalId"}
        sink(tmp_path, kafka.bootstrap, catalog, catalog_props, converter, topic, name, N1)
        got = read_back_orders(catalog, name)
        keys = [row.pop("_key") for row in got]
        for key in keys:
            key["counts"] = sorted(key["counts"])
        assert got == [expected_order(i) for i in range(N1)], headers
        assert keys == [expected_order(i) for i in range(N1)], headers
