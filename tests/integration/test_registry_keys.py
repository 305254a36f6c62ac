"""Registry-encoded keys in ``iceberg.tables.key-column`` end to end (issue 36 leftovers, point 1):
a real worker process on the embedded broker, ``key.converter`` and ``value.converter`` =
Confluent's AvroConverter against the real registry, keys and values produced by confluent-kafka's
``AvroSerializer`` (the key under the ``<topic>-key`` subject); one record has no key. pyiceberg
reads the table back: the key column is a struct of the key record's fields, null for the keyless
record, equal to what was produced."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

pytestmark = pytest.mark.integration

AVRO = "io.confluent.connect.avro.AvroConverter"
KEY: dict[str, Any] = {"type": "record", "name": "OrderKey", "namespace": "shop", "fields": [
    {"name": "shop", "type": "string"}, {"name": "id", "type": "long"}]}
VALUE: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}


def serialize(registry: Any, schema: dict[str, Any], topic: str, field: Any, records: list[Any]) -> list[Any]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import SerializationContext

    ser = AvroSerializer(SchemaRegistryClient(registry.client_config()), json.dumps(schema),
                         conf={"auto.register.schemas": True})
    return [None if r is None else ser(r, SerializationContext(topic, field)) for r in records]


async def send(bootstrap: str, topic: str, pairs: list[tuple[bytes | None, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(topic, v, key=k, partition=0) for k, v in pairs])
    finally:
        await producer.stop()


@pytest.mark.timeout(300)
def test_avro_serializer_keys_land_in_the_key_column_as_a_struct(broker, catalog_props, schema_registry, tmp_path):
    from confluent_kafka.serialization import MessageField
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import write_config

    topic, name = "avro-keyed", "avro.keyed"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    n = 40
    keys: list[Any] = [{"shop": f"s{i % 3}", "id": i} if i != 7 else None for i in range(n)]
    values = [{"id": i, "item": f"item-{i}"} for i in range(n)]
    pairs = list(zip(serialize(schema_registry, KEY, topic, MessageField.KEY, keys),
                     serialize(schema_registry, VALUE, topic, MessageField.VALUE, values), strict=True))
    asyncio.run(send(broker.bootstrap, topic, pairs))
    registry = {"schema.registry.url": schema_registry.url, "basic.auth.credentials.source": "USER_INFO",
                "basic.auth.user.info": schema_registry.user_info}
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=name, bootstrap=broker.bootstrap, catalog_props=catalog_props,
        state_dir=tmp_path / "state", group="avro-keys", **{
            "value.converter": AVRO, **{f"value.converter.{k}": v for k, v in registry.items()},
            "key.converter": AVRO, **{f"key.converter.{k}": v for k, v in registry.items()},
            "iceberg.tables.key-column": "_key", "iceberg.tables.auto-create-enabled": "true",
        })
    catalog = load_catalog("it", **catalog_props)
    want = [{"id": i, "item": f"item-{i}", "_key": keys[i]} for i in range(n)]
    got: list[dict[str, Any]] = []
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start()
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and len(got) < n:
            replicas.check_alive()
            if catalog.table_exists(name):
                got = sorted(catalog.load_table(name).scan().to_arrow().to_pylist(), key=lambda r: r["id"])
            time.sleep(1)
    finally:
        replicas.stop_all()
    assert got == want
    key_type = catalog.load_table(name).schema().find_field("_key").field_type
    assert [(f.name, str(f.field_type)) for f in key_type.fields] == [("shop", "string"), ("id", "long")]
