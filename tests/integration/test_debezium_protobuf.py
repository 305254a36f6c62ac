"""Debezium's change events in Protobuf end to end (issue 36 leftovers, point 3): the event shape
(``before``/``after`` messages of the row, ``source``, ``op``, ``ts_ms``;
tests/unit/test_debezium_protobuf.py) produced with confluent-kafka's ``ProtobufSerializer``
against the real registry (its ``.proto`` text registered first: this server refuses the
serializer's own registration, docs/schema-registry.md), tombstones as null values, read by a
real worker with the Debezium transform and ``value.converter`` = ProtobufConverter. DuckDB reads
the changes table back: the change rows in order, as the Avro and JSON forms give them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.integration.test_debezium_avro import _produce
from tests.integration.test_registry_protobuf_worker import pb_serialize
from tests.unit.test_debezium_protobuf import PROTO, envelope_class

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_protobuf_change_events_land_as_change_rows(broker, catalog_props, schema_registry, tmp_path):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck
    from tests.support.sinkrun import write_config

    topic = "dbz-proto"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    SchemaRegistryClient(schema_registry.client_config()).register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF"))
    cls = envelope_class()

    def event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, lsn: int) -> Any:
        return cls(op=op, ts_ms=1_772_000_000_000 + lsn, before=before, after=after, source={
            "version": "3.6.0", "connector": "postgresql", "name": "dbserver1", "ts_ms": 1_771_999_999_000 + lsn,
            "snapshot": "false", "db": "shop", "schema": "public", "table": "accounts", "txId": 7, "lsn": lsn})

    changes = [(1, event("r", None, {"id": 1, "name": "a", "updated": 5}, 100)),
               (2, event("c", None, {"id": 2, "name": "b"}, 101)),
               (1, event("u", {"id": 1, "name": "a"}, {"id": 1, "name": "a2", "updated": 6}, 102)),
               (2, event("d", {"id": 2, "name": "b"}, None, 103)), (2, None)]
    values = iter(pb_serialize(schema_registry, cls, topic, [e for _, e in changes if e is not None]))
    records = [(str(k).encode(), None if e is None else next(values)) for k, e in changes]
    asyncio.run(_produce(broker.bootstrap, topic, records))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables="", bootstrap=broker.bootstrap, catalog_props=catalog_props,
        state_dir=tmp_path / "state", group="dbz-proto", **{
            "transforms": "debezium", "transforms.debezium.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform",
            "transforms.debezium.cdc.target.pattern": "dbz_proto.{db}_{table}",
            "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "_cdc.target",
            "iceberg.tables.auto-create-enabled": "true",
            "value.converter": "io.confluent.connect.protobuf.ProtobufConverter",
            "value.converter.schema.registry.url": schema_registry.url,
            "value.converter.basic.auth.credentials.source": "USER_INFO",
            "value.converter.basic.auth.user.info": schema_registry.user_info,
        })
    catalog = load_catalog("it", **catalog_props)
    name = "dbz_proto.public_accounts"  # {db}: a PostgreSQL source's schema, as in test_debezium_avro
    rows: list[dict[str, Any]] = []
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start()
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and len(rows) < 4:
            replicas.check_alive()
            if catalog.table_exists(name):
                rows = sorted(duck.scan_rows(catalog.load_table(name).metadata_location), key=lambda r: r["_cdc"]["offset"])
            time.sleep(1)
    finally:
        replicas.stop_all()
    assert [(r["id"], r["name"], r["updated"], r["_cdc"]["op"], r["_cdc"]["offset"]) for r in rows] == [
        (1, "a", 5, "I", 0), (2, "b", None, "I", 1), (1, "a2", 6, "U", 2), (2, "b", None, "D", 3)]
