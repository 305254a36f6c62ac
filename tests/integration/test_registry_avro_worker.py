"""Avro through a schema registry end to end (issue 36 points 2 and 7): a real worker process
on the embedded broker, ``value.converter`` = Confluent's AvroConverter against the real
registry (tests/conftest.py ``schema_registry``: AxonOps, basic auth), values produced by
confluent-kafka's own ``AvroSerializer``. The table is auto-created from the registered schema,
a v2 schema with an added optional field evolves it, a record naming an unknown schema id goes
to the dead letters naming the id, and pyiceberg reads back exactly what was produced. A second
test stops the registry while records of a schema id the worker has not seen arrive: the fetch
waits (/status shows it), and once the registry is back the records land, none lost."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import io
import json
import struct
import time
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.integration

AVRO = "io.confluent.connect.avro.AvroConverter"
V1: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "name", "type": "string"}, {"name": "vip", "type": "boolean"}]}},
    {"name": "items", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "int"}},
    {"name": "size", "type": {"type": "enum", "name": "Size", "symbols": ["S", "M", "L"]}},
    {"name": "coupon", "type": ["null", "string"], "default": None},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
]}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
N1, N2 = 40, 20


def order(i: int, v2: bool = False) -> dict[str, Any]:
    out = {
        "id": i, "customer": {"name": f"c{i}", "vip": i % 2 == 0}, "items": [f"i{j}" for j in range(i % 3)],
        "attrs": {"k": i} if i % 2 else {}, "size": "SML"[i % 3], "coupon": None if i % 4 else f"C{i}",
        "price": decimal.Decimal(f"{i}.{i % 100:02d}"), "day": dt.date(2026, 1, 1) + dt.timedelta(days=i),
        "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=1000 * i + 7),
        "ref": str(uuid.UUID(int=i + 1)),
    }
    if v2:
        out["note"] = f"n{i}" if i % 2 else None
    return out


def serializer(registry: Any, schema: dict[str, Any]) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return AvroSerializer(SchemaRegistryClient(registry.client_config()), json.dumps(schema),
                          conf={"auto.register.schemas": True})


def serialize(ser: Any, topic: str, records: list[dict[str, Any]]) -> list[bytes]:
    from confluent_kafka.serialization import MessageField, SerializationContext

    return [ser(r, SerializationContext(topic, MessageField.VALUE)) for r in records]


def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """A value naming ``schema_id`` in the wire format, written by fastavro (no registry asked)."""
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">i", schema_id) + out.getvalue()


async def send(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(topic, v, partition=0) for v in values])
    finally:
        await producer.stop()


def config(tmp_path: Any, broker: Any, catalog_props: Any, registry: Any, topic: str, table: str, group: str) -> Any:
    from tests.support.sinkrun import write_config

    return write_config(
        tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group=group, **{
            "value.converter": AVRO,
            "value.converter.schema.registry.url": registry.url,
            "value.converter.basic.auth.credentials.source": "USER_INFO",
            "value.converter.basic.auth.user.info": registry.user_info,
            "iceberg.tables.evolve-schema-enabled": "true",
            "errors.tolerance": "all",
        },
    )


def rows_of(catalog: Any, name: str) -> list[dict[str, Any]]:
    return sorted(catalog.load_table(name).scan().to_arrow().to_pylist(), key=lambda r: r["id"])


@pytest.mark.timeout(300)
def test_avro_serializer_values_land_evolve_and_unknown_ids_dead_letter(broker, catalog_props, schema_registry,
                                                                       tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import wait_rows

    topic, name = "avro-orders", "avro.orders"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    v1 = [order(i) for i in range(N1)]
    v2 = [order(i, v2=True) for i in range(N1, N1 + N2)]
    values = serialize(serializer(schema_registry, V1), topic, v1)
    unknown = framed(987_654, V1, order(999))
    # v1 records, one naming an id the registry does not hold, then v2 records (a new id)
    asyncio.run(send(broker.bootstrap, topic, [*values[:N1 // 2], unknown, *values[N1 // 2:],
                                               *serialize(serializer(schema_registry, V2), topic, v2)]))
    replicas = ReplicaSet(config(tmp_path, broker, catalog_props, schema_registry, topic, name, "avro-sink"),
                          tmp_path / "logs")
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, (name,), N1 + N2, timeout_s=200)
        time.sleep(3)  # another round: nothing is added twice
    finally:
        replicas.stop_all()

    table = catalog.load_table(name)
    assert [f.name for f in table.schema().fields] == [f["name"] for f in V2["fields"]]  # note: evolved in
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert types["price"] == "decimal(9, 2)" and types["day"] == "date" and types["at"] == "timestamptz"
    assert types["ref"] == "uuid" and types["size"] == "string" and types["attrs"].startswith("map<string, int>")
    got = rows_of(catalog, name)
    expected = [{**r, "note": None} for r in v1] + v2
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        want = {**want, "attrs": list(want["attrs"].items()), "ref": uuid.UUID(want["ref"]).bytes}
        row = {**row, "ref": row["ref"] if isinstance(row["ref"], bytes) else uuid.UUID(str(row["ref"])).bytes}
        assert row == want, (row, want)
    dead = tmp_path / "state" / "deadletter" / f"{topic}.jsonl"
    letters = [json.loads(x) for x in dead.read_text().splitlines()]
    assert [(d["topic"], d["partition"], d["offset"]) for d in letters] == [(topic, 0, N1 // 2)]
    assert "schema id 987654 is unknown" in json.dumps(letters[0])


@pytest.mark.timeout(300)
def test_a_registry_outage_holds_the_fetch_and_nothing_is_lost(broker, catalog_props, tmp_path):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.schema_registry import SchemaRegistry
    from tests.support.sinkrun import http_json, metric, total_rows, wait_rows, wait_up

    topic, name = "avro-outage", "avro.outage"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    registry = SchemaRegistry(tmp_path / "registry")  # its own: this test stops it
    registry.start()
    replicas = ReplicaSet(config(tmp_path, broker, catalog_props, registry, topic, name, "avro-outage-sink"),
                          tmp_path / "logs")
    try:
        asyncio.run(send(broker.bootstrap, topic, serialize(serializer(registry, V1), topic,
                                                            [order(i) for i in range(N1)])))
        replicas.start("w1")
        wait_rows(catalog, replicas, (name,), N1, timeout_s=150)
        wait_up(replicas)
        port = replicas.replicas["w1"].metrics_port
        assert http_json(port)["schema_registry"]["state"] == "available"

        registry.stop()  # in-memory: its schemas are gone too, registered again below in the same order
        # v2 records naming id 2, which the worker has not seen: it must ask the registry, which is down
        asyncio.run(send(broker.bootstrap, topic, [framed(2, V2, order(i, v2=True)) for i in range(N1, N1 + N2)]))
        deadline = time.monotonic() + 60
        while http_json(port)["schema_registry"]["state"] != "unavailable":
            replicas.check_alive()
            assert time.monotonic() < deadline, http_json(port)["schema_registry"]
            time.sleep(0.5)
        status = http_json(port)["schema_registry"]
        assert status["attempts"] >= 1 and "Connect" in status["error"], status
        assert metric(port, "icesink_schema_registry_waiting") == 1
        assert metric(port, "icesink_schema_registry_failures_total") >= 1
        time.sleep(4)  # rounds go on meanwhile: the waiting fetch is not taken, nothing of it committed
        assert total_rows(catalog, name) == N1
        assert http_json(port)["partitions"][f"{topic}[0]"]["next_offset"] == N1, http_json(port)["partitions"]

        registry.start()
        client = SchemaRegistryClient(registry.client_config())
        assert client.register_schema(f"{topic}-value", Schema(json.dumps(V1), "AVRO")) == 1
        assert client.register_schema(f"{topic}-value", Schema(json.dumps(V2), "AVRO")) == 2
        wait_rows(catalog, replicas, (name,), N1 + N2, timeout_s=120)
        time.sleep(3)  # another round: nothing is added twice
        assert http_json(port)["schema_registry"]["state"] == "available"
        assert metric(port, "icesink_schema_registry_waiting") == 0
    finally:
        replicas.stop_all()
        registry.stop()
    got = rows_of(catalog, name)
    assert [r["id"] for r in got] == list(range(N1 + N2))
    assert [r["note"] for r in got[N1:]] == [order(i, v2=True)["note"] for i in range(N1, N1 + N2)]
    assert not (tmp_path / "state" / "deadletter" / f"{topic}.jsonl").exists()
