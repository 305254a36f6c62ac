"""String and bytes values end to end (issue 36 point 6): a real worker process consumes values
that are not JSON objects from the embedded broker with ``value.converter`` = StringConverter
or ByteArrayConverter, schema evolution on, auto-creates a table of one value column (named
by ``iceberg.tables.value-column``) beside the key and Kafka metadata columns, and
dead-letters, for the String converter, a value that is not UTF-8, with its position. DuckDB
reads the table back, row for row."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytestmark = pytest.mark.integration

STRING = "org.apache.kafka.connect.storage.StringConverter"
BYTES = "org.apache.kafka.connect.converters.ByteArrayConverter"
N = 200
NOT_UTF8 = 77


def value(i: int) -> bytes:
    """Text (JSON text too: kept verbatim), a NUL, bytes that are not UTF-8."""
    if i == NOT_UTF8:
        return b"caf\xe9 latin-1"
    if i % 3 == 0:
        return json.dumps({"id": i}).encode()
    return f"line {i} \u00e9\u4e2d".encode() + (b"\x00" if i % 3 == 2 else b"") + (b"\xff" if i % 5 == 1 else b"")


async def send(bootstrap: str, topic: str) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
    await producer.start()
    try:
        futures = [await producer.send(topic, value(i), key=f"k{i}".encode(), partition=0) for i in range(N)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("converter", [STRING, BYTES], ids=["string", "bytes"])
def test_string_and_bytes_values_land_in_one_column(broker, catalog_props, tmp_path, converter):
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck
    from tests.support.sinkrun import wait_rows, write_config

    binary = converter == BYTES
    name = "bytes" if binary else "string"
    topic, table_name = f"raw-{name}", f"raw.{name}_values"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    asyncio.run(send(broker.bootstrap, topic))
    state = tmp_path / "state"
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table_name, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=state, group=f"raw-{name}-sink", **{
            "value.converter": converter,
            "iceberg.tables.value-column": "body",
            "iceberg.tables.key-column": "_key",
            "iceberg.tables.kafka-metadata-enabled": "true",
            "iceberg.tables.evolve-schema-enabled": "true",
            "errors.tolerance": "all",
        },
    )
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    bad = {i for i in range(N) if i == NOT_UTF8 or (i % 3 and i % 5 == 1)}  # not text: dead letters
    expected = N if binary else N - len(bad)
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, (table_name,), expected, timeout_s=150)
        time.sleep(3)  # another round: nothing is added twice
    finally:
        replicas.stop_all()

    table = catalog.load_table(table_name)
    # Only these: the JSON text among the values ({"id": ...}) evolves nothing.
    assert [(f.name, str(f.field_type)) for f in table.schema().fields][:3] == [
        ("body", "binary" if binary else "string"), ("_key", "string"), ("_kafka_metadata_topic", "string")]
    assert len(table.schema().fields) == 7
    con = duck.connect()
    rows = con.execute(
        "SELECT _kafka_metadata_offset, body, _key"
        f" FROM iceberg_scan('{duck.plain_path(table.metadata_location)}') ORDER BY 1"
    ).fetchall()
    kept = [i for i in range(N) if binary or i not in bad]
    assert [r[0] for r in rows] == kept  # each record exactly once
    for i, body, key in rows:
        assert (bytes(body) if binary else body) == (value(i) if binary else value(i).decode()), i
        assert key == f"k{i}"
    dead = state / "deadletter" / f"{topic}.jsonl"
    if binary:
        assert not dead.exists() or not dead.read_text().strip()
    else:
        lines = [json.loads(x) for x in dead.read_text().splitlines()]
        assert sorted((d["topic"], d["partition"], d["offset"]) for d in lines) == [(topic, 0, i) for i in sorted(bad)]
        assert all("not UTF-8" in json.dumps(d) and "body" in json.dumps(d) for d in lines), lines[0]
