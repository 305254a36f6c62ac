"""Cast$Value, TimestampConverter$Value and ValueToKey (issue 39) with a real worker process, a
real broker and a real catalog: a chain of ReplaceField, Cast, two TimestampConverters and
ValueToKey (the key column ``_key`` becomes the struct of two converted value fields) shapes an
auto-created table; values that cannot be cast or parsed go to the dead-letter topic naming
topic, partition, offset and field while the rest land. DuckDB reads the table back, row for row."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest

pytestmark = pytest.mark.integration

C = "org.apache.kafka.connect.transforms."
N = 60
NOT_A_NUMBER = {7, 31}  # "qty" is no integer: Cast fails
NOT_A_TIME = {12, 44}  # "at" does not match the format: TimestampConverter fails


def value(i: int) -> bytes:
    return json.dumps({
        "id": i, "qty": "x" if i in NOT_A_NUMBER else str(i * 1000),  # int16: 1000 * i wraps past 32767
        "price": i + 0.75, "paid": i % 2,
        "at": "soon" if i in NOT_A_TIME else f"2024-03-{1 + i % 28:02d} 10:{i:02d}:00",
        "day": 1_700_000_000 + i * 86_400,
    }).encode()


def expected_row(i: int) -> dict[str, Any]:
    wrapped = (i * 1000 + 2**15) % 2**16 - 2**15  # Short.shortValue of a Long, as Connect's Cast
    at = dt.datetime(2024, 3, 1 + i % 28, 10, i, tzinfo=dt.UTC)
    return {"order_id": str(i), "qty": wrapped, "price": i, "paid": bool(i % 2), "at": at,
            "day": dt.date(2023, 11, 14) + dt.timedelta(days=i), "_key": {"order_id": str(i), "at": at}}


@pytest.mark.timeout(240)
def test_cast_and_timestamp_converter_chain_lands_exact_rows_and_dead_letters_the_rest(broker, catalog_props,
                                                                                      tmp_path) -> None:
    from pyiceberg.catalog import load_catalog

    from agents import deadletter as dl
    from icesink.app.pizzas import produce
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck
    from tests.support.sinkrun import read_topic, sink_until, write_config

    topic, table, dlq = "conv-orders", "conv.orders", "conv-orders-dlq"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    asyncio.run(produce(broker.bootstrap, topic, [value(i) for i in range(N)], partitions=1,
                        keys=[f"k{i}".encode() for i in range(N)]))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group="conv-sink", **{
            "transforms": "names,casts,at,day,key", "iceberg.tables.key-column": "_key",
            "transforms.names.type": f"{C}ReplaceField$Value", "transforms.names.renames": "id:order_id",
            "transforms.casts.type": f"{C}Cast$Value",
            "transforms.casts.spec": "order_id:string,qty:int16,price:int64,paid:boolean",
            "transforms.at.type": f"{C}TimestampConverter$Value", "transforms.at.field": "at",
            "transforms.at.target.type": "Timestamp", "transforms.at.format": "yyyy-MM-dd HH:mm:ss",
            "transforms.day.type": f"{C}TimestampConverter$Value", "transforms.day.field": "day",
            "transforms.day.target.type": "Date", "transforms.day.unix.precision": "seconds",
            "transforms.key.type": f"{C}ValueToKey", "transforms.key.fields": "order_id,at",  # as converted
            "errors.deadletterqueue.topic.name": dlq, "errors.deadletterqueue.topic.replication.factor": 1,
        })
    catalog = load_catalog("it", **catalog_props)
    bad = NOT_A_NUMBER | NOT_A_TIME
    sink_until(cfg, tmp_path / "logs", catalog, (table,), N - len(bad))

    loaded = catalog.load_table(table)
    assert [(f.name, str(f.field_type)) for f in loaded.schema().fields] == [
        ("order_id", "string"), ("qty", "int"), ("price", "long"), ("paid", "boolean"), ("at", "timestamptz"),
        ("day", "date"), ("_key", "struct<8: order_id: optional string, 9: at: optional timestamptz>")]  # int16: int
    rows = sorted(duck.scan_rows(loaded.metadata_location, loaded.io.properties), key=lambda r: int(r["order_id"]))
    assert rows == [expected_row(i) for i in range(N) if i not in bad]

    letters = read_topic(broker.bootstrap, dlq, len(bad), timeout_s=60)
    seen = {}
    for r in letters:
        h = dict(r.headers)
        assert (h[dl.H_TOPIC], h[dl.H_PARTITION]) == (topic.encode(), b"0")
        seen[int(h[dl.H_OFFSET])] = (h[dl.H_FIELD].decode(), h[dl.H_MESSAGE].decode())
    assert sorted(seen) == sorted(bad)
    for i in NOT_A_NUMBER:
        assert seen[i][0] == "qty" and "value (x) cannot be cast to int16" in seen[i][1]
    for i in NOT_A_TIME:
        assert seen[i][0] == "at" and "value (soon) does not match pattern" in seen[i][1]


BAD_KEYS = {5, 13}  # a JSON string key: Cast$Key to int64 fails


@pytest.mark.timeout(240)
def test_key_transforms_cast_hoist_and_rename_json_keys_in_the_key_column(broker, catalog_props, tmp_path) -> None:
    """JSON keys (JsonConverter) through Cast$Key int64, HoistField$Key and ReplaceField$Key: the
    key column is the struct {order_id: long}; a key that does not cast is dead-lettered."""
    from pyiceberg.catalog import load_catalog

    from agents import deadletter as dl
    from icesink.app.pizzas import produce
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck
    from tests.support.sinkrun import read_topic, sink_until, write_config

    topic, table, dlq, n = "keyt-orders", "keyt.orders", "keyt-orders-dlq", 20
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    keys = [b'"oops"' if i in BAD_KEYS else str(1000 + i).encode() for i in range(n)]
    asyncio.run(produce(broker.bootstrap, topic, [json.dumps({"n": i}).encode() for i in range(n)],
                        partitions=1, keys=keys))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group="keyt-sink", **{
            "key.converter": "org.apache.kafka.connect.json.JsonConverter", "key.converter.schemas.enable": "false",
            "transforms": "cast,hoist,names", "iceberg.tables.key-column": "_key",
            "transforms.cast.type": f"{C}Cast$Key", "transforms.cast.spec": "int64",
            "transforms.hoist.type": f"{C}HoistField$Key", "transforms.hoist.field": "id",
            "transforms.names.type": f"{C}ReplaceField$Key", "transforms.names.renames": "id:order_id",
            "errors.deadletterqueue.topic.name": dlq, "errors.deadletterqueue.topic.replication.factor": 1,
        })
    catalog = load_catalog("it", **catalog_props)
    sink_until(cfg, tmp_path / "logs", catalog, (table,), n - len(BAD_KEYS))

    loaded = catalog.load_table(table)
    assert [(f.name, str(f.field_type)) for f in loaded.schema().fields] == [
        ("n", "long"), ("_key", "struct<3: order_id: optional long>")]
    rows = sorted(duck.scan_rows(loaded.metadata_location, loaded.io.properties), key=lambda r: r["n"])
    assert rows == [{"n": i, "_key": {"order_id": 1000 + i}} for i in range(n) if i not in BAD_KEYS]
    letters = read_topic(broker.bootstrap, dlq, len(BAD_KEYS), timeout_s=60)
    seen = {int(dict(r.headers)[dl.H_OFFSET]): dict(r.headers)[dl.H_FIELD].decode() for r in letters}
    assert seen == {i: "_key" for i in BAD_KEYS}


@pytest.mark.timeout(240)
def test_fields_dropped_renamed_or_cast_land_in_an_existing_tables_columns_as_connect(broker, catalog_props,
                                                                                     tmp_path) -> None:
    """An existing table with a ``long`` ``store_id`` and ``legacy``: ReplaceField renames
    ``store_id`` to the string ``store_ref`` and excludes ``legacy``, Cast makes the number
    ``code`` a string. The text in ``store_id`` and ``legacy`` never meets their long columns
    (Connect drops or renames them before the sink converts): every record lands, those columns null."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from icesink.app.pizzas import produce
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck
    from tests.support.sinkrun import sink_until, write_config

    topic, table, n = "drop-orders", "dropns.orders", 30
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("dropns")
    catalog.create_table(table, schema=Schema(
        NestedField(1, "id", LongType()), NestedField(2, "store_id", LongType()),
        NestedField(3, "store_ref", StringType()), NestedField(4, "legacy", LongType()),
        NestedField(5, "code", StringType())))
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    values = [json.dumps({"id": i, "store_id": f"abc-{i}", "legacy": "x", "code": i * 10}).encode() for i in range(n)]
    asyncio.run(produce(broker.bootstrap, topic, values, partitions=1))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group="drop-sink", **{
            "transforms": "r,c",
            "transforms.r.type": f"{C}ReplaceField$Value", "transforms.r.exclude": "legacy",
            "transforms.r.renames": "store_id:store_ref",
            "transforms.c.type": f"{C}Cast$Value", "transforms.c.spec": "code:string",
        })
    sink_until(cfg, tmp_path / "logs", catalog, (table,), n)

    loaded = catalog.load_table(table)
    rows = sorted(duck.scan_rows(loaded.metadata_location, loaded.io.properties), key=lambda r: r["id"])
    assert rows == [{"id": i, "store_id": None, "store_ref": f"abc-{i}", "legacy": None, "code": str(i * 10)}
                    for i in range(n)]
    assert sorted(loaded.scan().to_arrow().column("store_ref").to_pylist()) == sorted(f"abc-{i}" for i in range(n))
