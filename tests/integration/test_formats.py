"""Kafka Connect envelopes end to end: a real worker process (Faust + Spark) consumes
JsonConverter output (``schemas.enable=true``) from Tansu, auto-creates the table from the
Connect schema (logical types, not their base types; map<string, long> and map<string, struct>
columns filled from JSON objects, a map<int, string> from the arrays of pairs JsonConverter
writes for keys that are not strings), adds the key and Kafka metadata columns,
and dead-letters malformed envelopes with their position. DuckDB reads the table back.
A Debezium Uuid field becomes an Iceberg uuid column, which pyarrow writes (Spark cannot).
With ``schema-case-insensitive`` every fourth record spells its fields (schema and payload,
nested ones too) in upper case, and still fills the lower-case columns."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from tests.unit.test_formats import connect_decimal

pytestmark = pytest.mark.integration

TOPIC = "fmt-connect"
TABLE = "fmt.orders"
GROUP = "fmt-sink"
N = 300
BAD = {17: b'{"id": 17}', 140: b'{"schema": {"type": "string"}, "payload": "x"}', 250: b'{"schema":{"type":'}
C = "org.apache.kafka.connect.data."
SCHEMA = {
    "type": "struct", "name": "shop.Order", "optional": False,
    "fields": [
        {"field": "id", "type": "int64", "optional": False},
        {"field": "customer", "type": "string", "optional": True},
        {"field": "at", "type": "int64", "optional": True, "name": C + "Timestamp", "version": 1},
        {"field": "day", "type": "int32", "optional": True, "name": C + "Date", "version": 1},
        {"field": "amount", "type": "bytes", "optional": True, "name": C + "Decimal", "version": 1,
         "parameters": {"scale": "2", "connect.decimal.precision": "10"}},
        {"field": "shipped", "type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp"},
        {"field": "tags", "type": "array", "optional": True, "items": {"type": "string", "optional": False}},
        {"field": "ref", "type": "string", "optional": True, "name": "io.debezium.data.Uuid", "version": 1},
        {"field": "counts", "type": "map", "optional": True,
         "keys": {"type": "string", "optional": False}, "values": {"type": "int64", "optional": False}},
        {"field": "labels", "type": "map", "optional": True, "keys": {"type": "string", "optional": False},
         "values": {"type": "struct", "optional": True, "fields": [
             {"field": "n", "type": "int64", "optional": False},
             {"field": "note", "type": "string", "optional": True}]}},
        {"field": "slots", "type": "map", "optional": True,
         "keys": {"type": "int32", "optional": False}, "values": {"type": "string", "optional": True}},
    ],
}
BAD_MAP = 200  # a map value that is not an int64: dead-lettered naming the entry
AT0 = 1_700_000_000_000  # ms


def payload(i: int) -> dict:
    return {
        "id": i,
        "customer": f"c{i % 7}",
        "at": AT0 + i * 1001,
        "day": 19_000 + i,
        "amount": connect_decimal(Decimal(i * 137 - 5000).scaleb(-2), 2),
        "shipped": f"2024-03-01T10:00:{i % 60:02d}.25+02:00",
        "tags": [f"t{i % 3}"] * (i % 3),
        "ref": None if i % 9 == 0 else str(uuid.UUID(int=i * 0x9E3779B97F4A7C15 << 32)),
        # Keys in an order that is not sorted, a null struct value, an empty map, a null map.
        "counts": {"z": i, "a": -i, "big": 2**62 + i} if i % 5 else ({} if i % 10 else None),
        "labels": {f"l{i % 4}": {"n": i, "note": None if i % 2 else f"n{i}"}, "gone": None} if i % 3 else None,
        "slots": [[i, f"s{i}"], [-1, None]] if i % 2 else None,  # JsonConverter: int keys as pairs
    }


def shout(schema: dict, value: object) -> tuple[dict, object]:
    """``schema`` and ``value`` with every struct field name upper-cased, at every level (map
    keys are data: kept)."""
    kind = schema.get("type")
    if kind == "struct":
        fields = [shout(f, value.get(f["field"]) if isinstance(value, dict) else None) for f in schema["fields"]]
        out = dict(schema, fields=[dict(f, field=f["field"].upper()) for f, _ in fields])
        if not isinstance(value, dict):
            return out, value
        return out, {f["field"].upper(): v for (f, v), orig in zip(fields, schema["fields"]) if orig["field"] in value}
    if kind == "map":
        values, _ = shout(schema["values"], None)
        if isinstance(value, dict):
            return dict(schema, values=values), {k: shout(schema["values"], v)[1] for k, v in value.items()}
        return dict(schema, values=values), value
    return schema, value


async def send(bootstrap: str, records: list[tuple[bytes, bytes, list[tuple[str, bytes]], int]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
    await producer.start()
    try:
        futures = [await producer.send(TOPIC, value, key=key, headers=headers, partition=0, timestamp_ms=ts)
                   for key, value, headers, ts in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


@pytest.mark.timeout(240)
def test_connect_envelopes_with_key_and_metadata_columns(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from tests.support import duck
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import wait_rows, write_config
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 1))
    records = []
    for i in range(N):
        body = payload(i)
        if i == BAD_MAP:
            body["counts"] = {"a": 1, "b": "two"}
        schema, body = shout(SCHEMA, body) if i % 4 == 3 else (SCHEMA, body)
        value = BAD.get(i) or json.dumps({"schema": schema, "payload": body}, separators=(",", ":")).encode()
        headers = [("trace", f"tr-{i}".encode()), ("trace", b"\xff")] if i % 50 == 0 else []
        records.append((f"key-{i}".encode(), value, headers, AT0 + i))
    asyncio.run(send(broker.bootstrap, records))

    state = tmp_path / "state"
    cfg = write_config(
        tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap, catalog_props=catalog_props,
        state_dir=state, group=GROUP, **{
            "value.converter.schemas.enable": "true",
            "iceberg.tables.key-column": "_key",
            "iceberg.tables.kafka-metadata-enabled": "true",
            "errors.tolerance": "all",  # bad records to the local dead-letter file
            "iceberg.tables.schema-case-insensitive": "true",
        },
    )
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    expected = N - len(BAD) - 1
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, (TABLE,), expected, timeout_s=150)
        time.sleep(3)  # another round: nothing is added twice
    finally:
        replicas.stop_all()

    table = catalog.load_table(TABLE)
    types = {f.name: (str(f.field_type), f.required) for f in table.schema().fields}
    assert types == {
        "id": ("long", True), "customer": ("string", False), "at": ("timestamptz", False),
        "day": ("date", False), "amount": ("decimal(10, 2)", False), "shipped": ("timestamptz", False),
        "tags": ("list<string>", False), "ref": ("uuid", False),
        "counts": ("map<string, long>", False), "slots": ("map<int, string>", False),
        "labels": (types["labels"][0], False), "_key": ("string", False), "_kafka_metadata_topic": ("string", False),
        "_kafka_metadata_partition": ("int", False), "_kafka_metadata_offset": ("long", False),
        "_kafka_metadata_timestamp": ("timestamptz", False),
        "_kafka_metadata_headers": (types["_kafka_metadata_headers"][0], False),
    }
    labels = types["labels"][0]
    assert labels.startswith("map<string, struct<") and "n: required long" in labels and "note: optional string" in labels
    headers_type = types["_kafka_metadata_headers"][0]
    assert headers_type.startswith("list<struct<") and "key: optional string" in headers_type
    assert "value: optional binary" in headers_type

    con = duck.connect()
    rows = con.execute(
        "SELECT id, customer, \"at\", \"day\", amount, shipped, tags, counts, labels, _key,"
        " _kafka_metadata_topic, _kafka_metadata_partition, _kafka_metadata_offset,"
        " _kafka_metadata_timestamp, _kafka_metadata_headers,"
        " ref, slots"
        f" FROM iceberg_scan('{duck.plain_path(table.metadata_location)}') ORDER BY id"
    ).fetchall()
    ids = [i for i in range(N) if i not in BAD and i != BAD_MAP]
    assert [r[0] for r in rows] == ids  # each record exactly once
    for r in rows:
        i = r[0]
        p = payload(i)
        at, day, amount = r[2], r[3], r[4]
        assert at == datetime.fromtimestamp((AT0 + i * 1001) / 1000, UTC), i
        assert day == date.fromordinal(date(1970, 1, 1).toordinal() + 19_000 + i), i
        assert amount == Decimal(i * 137 - 5000).scaleb(-2), i
        assert r[1] == p["customer"]
        assert r[5] == datetime(2024, 3, 1, 8, 0, i % 60, 250_000, tzinfo=UTC), i
        assert list(r[6] or []) == p["tags"]
        assert r[7] == (None if p["counts"] is None else p["counts"]), i  # DuckDB maps keep entry order
        assert list((r[7] or {}).items()) == list((p["counts"] or {}).items()), i
        assert r[8] == p["labels"], i
        r = r[:7] + r[9:]
        assert r[7:11] == (f"key-{i}", TOPIC, 0, i)
        assert r[11] == datetime.fromtimestamp((AT0 + i) / 1000, UTC), i
        headers = [(h["key"], bytes(h["value"])) for h in r[12]]
        assert headers == ([("trace", f"tr-{i}".encode()), ("trace", b"\xff")] if i % 50 == 0 else []), i
        assert r[13] == (p["ref"] and uuid.UUID(p["ref"])), i
        assert r[14] == (None if p["slots"] is None else dict(p["slots"])), i

    lines = [json.loads(x) for x in (state / "deadletter" / f"{TOPIC}.jsonl").read_text().splitlines()]
    assert sorted((d["topic"], d["partition"], d["offset"]) for d in lines) == [
        (TOPIC, 0, i) for i in sorted([*BAD, BAD_MAP])
    ]
    by_offset = {d["offset"]: d for d in lines}
    assert "no 'schema' or 'payload' key" in by_offset[17]["error"]
    assert "a table row needs a struct" in by_offset[140]["error"]
    assert "malformed JSON" in by_offset[250]["error"]
    assert base64.b64decode(by_offset[17]["value"]) == BAD[17]
    assert by_offset[BAD_MAP]["field"] == "counts.b" and "cannot coerce 'two' to long" in by_offset[BAD_MAP]["error"]
