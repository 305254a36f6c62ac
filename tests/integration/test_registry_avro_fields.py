"""Fields of Avro rows end to end (issue 36 point 1): a real worker process on the embedded
broker, ``value.converter`` = Confluent's AvroConverter against the real registry, values
produced by confluent-kafka's ``AvroSerializer``. Changes are routed on a nested Avro field
(``iceberg.tables.route-field=meta.table``, dynamic tables) into two mirror tables whose operation
is another nested field (``iceberg.tables.cdc-field=meta.op``, an Avro enum); DuckDB reads the
mirror tables back equal to the changes applied in order."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.integration.test_registry_avro_worker import send, serialize, serializer

pytestmark = pytest.mark.integration

AVRO = "io.confluent.connect.avro.AvroConverter"
CHANGE: dict[str, Any] = {"type": "record", "name": "Change", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "v", "type": ["null", "string"], "default": None},
    {"name": "meta", "type": {"type": "record", "name": "Meta", "fields": [
        {"name": "table", "type": "string"},
        {"name": "op", "type": {"type": "enum", "name": "Op", "symbols": ["c", "u", "d"]}},
    ]}},
]}


def change(table: str, i: int, v: str | None, op: str) -> dict[str, Any]:
    return {"id": i, "v": v, "meta": {"table": table, "op": op}}


@pytest.mark.timeout(300)
def test_avro_changes_are_routed_and_mirrored_on_nested_fields(broker, catalog_props, schema_registry, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck
    from tests.support.sinkrun import write_config

    topic = "avro-changes"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    changes = [
        change("Avro.A", 1, "a1", "c"), change("avro.b", 1, "b1", "c"), change("avro.a", 2, "a2", "c"),
        change("avro.a", 1, "a1'", "u"), change("avro.b", 2, "b2", "c"), change("avro.b", 1, None, "d"),
        change("avro.a", 3, "a3", "c"), change("avro.a", 2, None, "d"), change("avro.b", 2, "b2'", "u"),
    ]
    asyncio.run(send(broker.bootstrap, topic, serialize(serializer(schema_registry, CHANGE), topic, changes)))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables="", bootstrap=broker.bootstrap, catalog_props=catalog_props,
        state_dir=tmp_path / "state", group="avro-fields", **{
            "value.converter": AVRO,
            "value.converter.schema.registry.url": schema_registry.url,
            "value.converter.basic.auth.credentials.source": "USER_INFO",
            "value.converter.basic.auth.user.info": schema_registry.user_info,
            "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "meta.table",
            "iceberg.tables.cdc-field": "meta.op", "iceberg.tables.default-id-columns": "id",
            "iceberg.tables.auto-create-enabled": "true",
        })
    catalog = load_catalog("it", **catalog_props)
    want = {"avro.a": {1: "a1'", 3: "a3"}, "avro.b": {2: "b2'"}}
    got: dict[str, Any] = {}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start()
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and got != want:
            replicas.check_alive()
            for name in want:
                if catalog.table_exists(name):
                    rows = duck.scan_rows(catalog.load_table(name).metadata_location)
                    got[name] = {r["id"]: r["v"] for r in rows}
                    if len(rows) != len(got[name]):
                        got[name] = rows  # a key twice: never equal to want
            time.sleep(1)
    finally:
        replicas.stop_all()
    assert got == want
    rows = duck.scan_rows(catalog.load_table("avro.a").metadata_location)
    assert {r["meta"]["op"] for r in rows} == {"u", "c"}  # the enum lands as its text
