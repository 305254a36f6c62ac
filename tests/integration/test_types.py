"""Type fidelity end to end: one real worker (Faust + Spark) over a real Tansu topic into a
SQLite-catalog table with a column of every type icesink writes, read back by DuckDB (uuid
and fixed columns make the worker write that table with pyarrow: Spark has no type for them).

Records carry each type in every encoding decode_json accepts (ISO strings with and without
offsets, epoch counts in the configured default unit and in a unit stated by a table
property, day counts, base64, Kafka Connect decimal bytes, nested structs). The values must
land exactly (1700000000123456 us is 2023-11-14 22:13:20.123456, not the year 55000); bad
values are dead-lettered with their field, not nulled. A second, auto-created table checks
the ``timestamp-fields`` rule (timestamp vs timestamptz from the first records).
"""

from __future__ import annotations

import asyncio
import json

import pytest

pytestmark = pytest.mark.integration

TOPIC = "ty-events"
TYPED, AUTO = "ty.typed", "ty.auto"
GROUP = "ty-sink"
T0 = 1700000000123456  # 2023-11-14 22:13:20.123456 UTC, in microseconds

GOOD = [
    {  # ISO strings, offsets, units from table properties
        "id": 1, "ts": "2023-11-14 22:13:20.123456", "tsz": "2023-11-14T23:13:20.123456+01:00",
        "ts_us": T0, "d": "2023-11-14", "t": "22:13:20.123456", "amount": "12.34", "amount_cb": "BNI=",
        "dbl": 1.5, "b": "AAEC", "s": {"n": 1, "at": "2023-11-14T22:13:20.123456Z"},
        "u": "0f8fad5b-d9cb-469f-a165-70867728950e", "fx": "AAECAw==",
    },
    {  # epoch counts in the default unit (ms), day counts, numbers
        "id": 2, "ts": 1700000000123, "tsz": 1700000000123, "ts_us": str(T0), "d": 19675, "t": 80000123,
        "amount": 12.3, "amount_cb": "+y4=", "dbl": -0.25, "b": "", "s": {"n": -5, "at": 1700000000000},
        "u": "7C9E6679-7425-40DE-944B-E07FC1F90AE7", "fx": "/////w==",
    },
    {  # nanoseconds truncated to microseconds; nulls and missing fields
        "id": 3, "ts": "2023-11-14T22:13:20.123456789", "tsz": "2023-11-14T22:13:20Z",
        "ts_us": "2023-11-14T22:13:20.123456Z", "d": "1970-01-01", "t": "00:00:00", "amount": "-99999999.99",
        "amount_cb": None, "b": "/w==", "s": None, "u": None,
    },
]
BAD = [  # (record, field at fault)
    ({"id": 4, "ts_us": T0 * 1000}, "ts_us"),  # nanoseconds where microseconds are stated: year 55000
    ({"id": 5, "amount": "1.234"}, "amount"),
    ({"id": 6, "b": "AAE"}, "b"),
    ({"id": 7, "s": {"n": 1, "at": "tomorrow"}}, "s.at"),
    ({"id": 8, "t": "24:00:00"}, "t"),
    ({"id": 9, "u": "0f8fad5b-d9cb-469f-a165-70867728950"}, "u"),  # one hex digit short
    ({"id": 10, "fx": "AAEC"}, "fx"),  # 3 bytes for fixed[4]
]


@pytest.mark.timeout(300)
def test_every_type_lands_exactly(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        DateType,
        DecimalType,
        DoubleType,
        FixedType,
        LongType,
        NestedField,
        StructType,
        TimestampType,
        TimestamptzType,
        TimeType,
        UUIDType,
    )

    from tests.support import duck
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import wait_rows, write_config

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("ty")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "ts", TimestampType()),
        NestedField(3, "tsz", TimestamptzType()),
        NestedField(4, "ts_us", TimestamptzType()),
        NestedField(5, "d", DateType()),
        NestedField(6, "t", TimeType()),
        NestedField(7, "amount", DecimalType(10, 2)),
        NestedField(8, "amount_cb", DecimalType(10, 2)),
        NestedField(9, "dbl", DoubleType()),
        NestedField(10, "b", BinaryType()),
        NestedField(11, "s", StructType(NestedField(12, "n", LongType()), NestedField(13, "at", TimestamptzType()))),
        NestedField(14, "u", UUIDType()),
        NestedField(15, "fx", FixedType(4)),
    )
    catalog.create_table(TYPED, schema=schema, properties={
        "icesink.epoch-unit.ts_us": "us", "icesink.decimal-encoding.amount_cb": "connect-bytes",
    })
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 1))
    state = tmp_path / "state"
    cfg = write_config(
        tmp_path / "sink.json", topics=TOPIC, tables=f"{TYPED},{AUTO}", bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=state, group=GROUP,
        **{"iceberg.table.ty.auto.timestamp-fields": r"ts|tsz|s\.at", "errors.tolerance": "all"},
    )
    records = [*GOOD, *(r for r, _ in BAD)]
    asyncio.run(produce(broker.bootstrap, TOPIC, [json.dumps(r).encode() for r in records], partitions=1))
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, (TYPED,), len(GOOD), timeout_s=200)
        wait_rows(catalog, replicas, (AUTO,), len(records) - 1, timeout_s=60)  # s.at 'tomorrow' is bad there too
    finally:
        replicas.stop_all()

    table = catalog.load_table(TYPED)
    con = duck.connect()
    rows = con.execute(
        "SELECT id, CAST(ts AS VARCHAR), epoch_us(tsz), epoch_us(ts_us), CAST(d AS VARCHAR), CAST(t AS VARCHAR), "
        "CAST(amount AS VARCHAR), CAST(amount_cb AS VARCHAR), dbl, b, s.n, epoch_us(s.at), CAST(u AS VARCHAR), fx "
        f"FROM iceberg_scan('{duck.plain_path(table.metadata_location)}') ORDER BY id"
    ).fetchall()
    assert rows == [
        (1, "2023-11-14 22:13:20.123456", T0, T0, "2023-11-14", "22:13:20.123456", "12.34", "12.34", 1.5,
         b"\x00\x01\x02", 1, T0, "0f8fad5b-d9cb-469f-a165-70867728950e", b"\x00\x01\x02\x03"),
        (2, "2023-11-14 22:13:20.123", T0 - 456, T0, "2023-11-14", "22:13:20.123",
         "12.30", "-12.34", -0.25, b"", -5, T0 - 123456, "7c9e6679-7425-40de-944b-e07fc1f90ae7", b"\xff" * 4),
        (3, "2023-11-14 22:13:20.123456", T0 - 123456, T0, "1970-01-01", "00:00:00", "-99999999.99", None, None,
         b"\xff", None, None, None, None),
    ]

    # Bad values were dead-lettered with the field at fault, not stored as nulls.
    letters = [json.loads(line) for line in (state / "deadletter" / f"{TOPIC}.jsonl").read_text().splitlines()]
    # One letter per record: a record both tables reject for the same reason names both.
    assert sorted((x["offset"], x["field"]) for x in letters if TYPED in x["table"].split(",")) == [
        (len(GOOD) + i, field) for i, (_, field) in enumerate(BAD)
    ]
    assert "ms since" not in json.dumps(letters) and "us since the epoch is out of range" in json.dumps(letters)
    assert [(x["offset"], x["field"]) for x in letters if AUTO in x["table"].split(",")] == [(len(GOOD) + 3, "s.at")]

    # The auto-created table: the timestamp-fields rule picked the types from the values.
    auto = catalog.load_table(AUTO)
    types = {f.name: str(f.field_type) for f in auto.schema().fields}
    assert types["ts"] == "timestamp" and types["tsz"] == "timestamptz" and types["ts_us"] == "string"
    assert str(auto.schema().find_field("s.at").field_type) == "timestamptz"
    got = con.execute(
        f"SELECT id, CAST(ts AS VARCHAR), epoch_us(tsz) FROM iceberg_scan('{duck.plain_path(auto.metadata_location)}') "
        "WHERE id <= 3 ORDER BY id"
    ).fetchall()
    assert got == [
        (1, "2023-11-14 22:13:20.123456", T0),
        (2, "2023-11-14 22:13:20.123", T0 - 456),
        (3, "2023-11-14 22:13:20.123456", T0 - 123456),
    ]
