"""Debezium with Avro end to end (issue 36 point 5): Debezium-shaped Avro change events (the
``Envelope`` record with ``before``/``after`` of the table's ``Value`` record, ``source``, ``op``,
``ts_ms``, ``connect.name`` annotations as Debezium's AvroConverter registers them; keys as Avro
``Key`` records; tombstones as null values) produced with confluent-kafka's ``AvroSerializer``
against the real registry, read by a real worker with the Debezium transform and
``key.converter``/``value.converter`` = AvroConverter. The same events in Debezium's JSON form
go through a second worker with the JSON converter; DuckDB reads both changes tables back and
they hold the same changes (the Avro form's ``io.debezium.time.MicroTimestamp`` a timestamp
where schemaless JSON has its long, its ``io.debezium.time.ZonedTimestamp`` a timestamptz where
schemaless JSON has its string). A mirror table fed by the Avro events ends as the source
table did."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from typing import Any

import pytest

from tests.unit.test_debezium_avro import ENVELOPE, NS

pytestmark = pytest.mark.integration

AVRO = "io.confluent.connect.avro.AvroConverter"
KEY: dict[str, Any] = {"type": "record", "name": "Key", "namespace": NS, "fields": [{"name": "id", "type": "int"}],
                       "connect.name": f"{NS}.Key"}
EPOCH = dt.datetime(1970, 1, 1)
BASE_US = 1_772_000_000_000_000


def _row(i: int, name: str | None) -> dict[str, Any]:
    return {"id": i, "name": name, "updated": BASE_US + i, "born": 20_000 + i, "seen": BASE_US // 1000 + i,
            "shipped": f"2026-03-0{i}T10:00:00.25+02:00"}


def _event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, lsn: int) -> dict[str, Any]:
    return {"before": before, "after": after, "op": op, "ts_ms": 1_772_000_000_000 + lsn, "transaction": None,
            "source": {"version": "3.6.0", "connector": "postgresql", "name": "dbserver1",
                       "ts_ms": 1_771_999_999_000 + lsn, "snapshot": "false", "db": "shop", "sequence": None,
                       "ts_us": None, "schema": "public", "table": "accounts", "txId": 7, "lsn": lsn}}


#: (key id, event or None for a tombstone), in source order: a snapshot read, inserts, updates,
#: deletes (REPLICA IDENTITY FULL: the whole before image) each with its tombstone.
CHANGES: list[tuple[int, dict[str, Any] | None]] = [
    (1, _event("r", None, _row(1, "a"), 100)),
    (2, _event("c", None, _row(2, "b"), 101)),
    (1, _event("u", _row(1, "a"), _row(1, "a2"), 102)),
    (3, _event("c", None, _row(3, "c"), 103)),
    (2, _event("d", _row(2, "b"), None, 104)),
    (2, None),
    (3, _event("u", _row(3, "c"), _row(3, None), 105)),
    (4, _event("c", None, _row(4, "d"), 106)),
    (4, _event("d", _row(4, "d"), None, 107)),
    (4, None),
]
FINAL = {1: "a2", 3: None}  # the source table after the changes


async def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


def _avro_records(registry: Any, topic: str) -> list[tuple[bytes, bytes | None]]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient(registry.client_config())
    values = AvroSerializer(client, json.dumps(ENVELOPE), conf={"auto.register.schemas": True})
    keys = AvroSerializer(client, json.dumps(KEY), conf={"auto.register.schemas": True})
    return [(keys({"id": k}, SerializationContext(topic, MessageField.KEY)),
             None if e is None else values(e, SerializationContext(topic, MessageField.VALUE))) for k, e in CHANGES]


def _json_records() -> list[tuple[bytes, bytes | None]]:
    return [(json.dumps({"id": k}).encode(), None if e is None else json.dumps(e).encode()) for k, e in CHANGES]


def _config(tmp_path: Any, broker: Any, catalog_props: Any, topic: str, group: str, extra: dict[str, Any]) -> Any:
    from tests.support.sinkrun import write_config

    return write_config(
        tmp_path / f"{group}.json", topics=topic, tables="", bootstrap=broker.bootstrap, catalog_props=catalog_props,
        state_dir=tmp_path / group, group=group, **{
            "transforms": "debezium", "transforms.debezium.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform",
            "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "_cdc.target",
            "iceberg.tables.auto-create-enabled": "true", **extra,
        })


def _avro_keys(registry: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in ("key", "value"):
        out |= {f"{side}.converter": AVRO, f"{side}.converter.schema.registry.url": registry.url,
                f"{side}.converter.basic.auth.credentials.source": "USER_INFO",
                f"{side}.converter.basic.auth.user.info": registry.user_info}
    return out


def _rows(catalog: Any, name: str) -> list[dict[str, Any]]:
    from tests.support import duck

    if not catalog.table_exists(name):
        return []
    return sorted(duck.scan_rows(catalog.load_table(name).metadata_location), key=lambda r: r["_cdc"]["offset"])


@pytest.mark.timeout(300)
def test_avro_change_events_land_as_their_json_form_does(broker, catalog_props, schema_registry, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic

    catalog = load_catalog("it", **catalog_props)
    forms = {"avro": ("dbz-avro", _avro_records(schema_registry, "dbz-avro"), _avro_keys(schema_registry)),
             "json": ("dbz-json", _json_records(), {})}
    sets = []
    try:
        for form, (topic, records, extra) in forms.items():
            asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
            asyncio.run(_produce(broker.bootstrap, topic, records))
            pattern = {"transforms.debezium.cdc.target.pattern": f"dbz_{form}.{{db}}_{{table}}"}
            replicas = ReplicaSet(_config(tmp_path, broker, catalog_props, topic, f"dbz-{form}", {**extra, **pattern}),
                                  tmp_path / f"logs-{form}")
            replicas.start()
            sets.append(replicas)
        want = sum(e is not None for _, e in CHANGES)
        deadline = time.monotonic() + 200
        got: dict[str, list[dict[str, Any]]] = {}
        while time.monotonic() < deadline:
            for r in sets:
                r.check_alive()
            got = {form: _rows(catalog, f"dbz_{form}.public_accounts") for form in forms}
            if all(len(rows) >= want for rows in got.values()):
                break
            time.sleep(1)
        time.sleep(3)  # another round: nothing is added twice
        got = {form: _rows(catalog, f"dbz_{form}.public_accounts") for form in forms}
    finally:
        for r in sets:
            r.stop_all()
    avro, plain = got["avro"], got["json"]
    assert len(avro) == len(plain) == want, (avro, plain)
    for a, j in zip(avro, plain, strict=True):
        assert (a["id"], a["name"]) == (j["id"], j["name"])
        assert a["updated"] == EPOCH + dt.timedelta(microseconds=j["updated"])  # MicroTimestamp: a timestamp
        assert a["born"] == EPOCH.date() + dt.timedelta(days=j["born"])  # io.debezium.time.Date: a date
        assert a["seen"] == EPOCH + dt.timedelta(milliseconds=j["seen"])  # io.debezium.time.Timestamp
        assert a["shipped"] == dt.datetime.fromisoformat(j["shipped"])  # ZonedTimestamp: a timestamptz
        cdc_a = {**a["_cdc"], "target": a["_cdc"]["target"].replace("dbz_avro", "dbz_json")}
        assert cdc_a == j["_cdc"], (a["_cdc"], j["_cdc"])
    assert [(r["id"], r["_cdc"]["op"]) for r in avro] == [
        (1, "I"), (2, "I"), (1, "U"), (3, "I"), (2, "D"), (3, "U"), (4, "I"), (4, "D")]


@pytest.mark.timeout(300)
def test_avro_change_events_mirror_the_source_table(broker, catalog_props, schema_registry, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck

    topic = "dbz-avro-mirror"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    asyncio.run(_produce(broker.bootstrap, topic, _avro_records(schema_registry, topic)))
    cfg = _config(tmp_path, broker, catalog_props, topic, "dbz-avro-mirror", {
        **_avro_keys(schema_registry), "transforms.debezium.cdc.target.pattern": "dbzmirror.{db}_{table}",
        "iceberg.tables.cdc-field": "_cdc.op", "iceberg.tables.upsert-mode-enabled": "true",
        "iceberg.tables.default-id-columns": "id"})
    catalog = load_catalog("it", **catalog_props)
    name = "dbzmirror.public_accounts"
    got: Any = None
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start()
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:
            replicas.check_alive()
            if catalog.table_exists(name):
                rows = duck.scan_rows(catalog.load_table(name).metadata_location)
                got = {r["id"]: r["name"] for r in rows} if len({r["id"] for r in rows}) == len(rows) else rows
                if got == FINAL:
                    break
            time.sleep(1)
    finally:
        replicas.stop_all()
    assert got == FINAL
