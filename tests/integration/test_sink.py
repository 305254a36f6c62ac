"""The acceptance scenario with real processes: a Tansu broker, then a real Kafka broker (the
scenario runs on each), 2 worker processes (Faust + Spark), SQLite SQL catalog; every result
read back by DuckDB's iceberg extension.

One scenario in phases, because every worker start costs a Spark session:
  1. 2 replicas ingest pizzas into two tables (fan-out): an auto-created one and one created
     beforehand with a timestamp column and spec day(date_ordered), bucket(store_id, 8);
     a second source topic never receives data (idle partitions must not stall rounds);
  2. one replica is stopped gracefully mid-stream and another started;
  3. the whole group is stopped and started again.
After each phase both tables hold exactly the produced records.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration

TOPIC = "it-pizzas"
IDLE = "it-idle"
AUTO = "rpc.pizzas"
PARTED = "rpc.pizzas_by_day"
GROUP = "it-sink"


@pytest.fixture
def env(each_broker, tmp_path):
    broker = each_broker  # Tansu, then a real Kafka broker
    from pyiceberg.catalog import load_catalog

    from icesink.shared.catalogs import sqlite_catalog_properties
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import PIZZA_SCHEMA as schema
    from icesink.shared.partitioning import build_partition_spec, parse_partition_by

    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 6))
    asyncio.run(ensure_topic(broker.bootstrap, IDLE, 2))
    props = sqlite_catalog_properties(tmp_path / "catalog")
    catalog = load_catalog("it", **props)
    catalog.create_namespace("rpc")
    spec = build_partition_spec(parse_partition_by("day(date_ordered), bucket(store_id, 8)"), schema)
    catalog.create_table(PARTED, schema=schema, partition_spec=spec)
    config = {
        "topics": f"{TOPIC},{IDLE}",
        "iceberg.tables": f"{AUTO},{PARTED}",
        "iceberg.catalog": "it",
        **{f"iceberg.catalog.{k}": v for k, v in props.items()},
        "iceberg.tables.auto-create-enabled": "true",
        "iceberg.control.topic": "it-control",
        "iceberg.control.topic.replication-factor": 1,  # one Kafka broker
        "iceberg.control.commit.interval-ms": 3000,
        "iceberg.control.commit.timeout-ms": 20000,
        "group.id": GROUP,
        "bootstrap.servers": broker.bootstrap,
        "spark.master": "local[1]",
        "spark.driver.memory": "1g",
        "state.dir": str(tmp_path / "state"),
        # The test checks the snapshot history round by round; compaction would add to it
        # (maintenance has its own tests: test_maintenance.py).
        "maintenance.enabled": "false",
    }
    cfg = tmp_path / "sink.json"
    cfg.write_text(json.dumps(config))
    return broker, catalog, cfg, tmp_path


def produce(bootstrap, values):
    from icesink.app.pizzas import produce as send

    asyncio.run(send(bootstrap, TOPIC, values, partitions=6))


def total_rows(catalog, name):
    from icesink.shared.iceberg import total_rows as rows

    return rows(catalog, name)


def wait_rows(catalog, replicas, expected, timeout_s=900):
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        replicas.check_alive()
        seen = {name: total_rows(catalog, name) for name in (AUTO, PARTED)}
        if all(v >= expected for v in seen.values()):
            return seen
        time.sleep(1)
    logs = "\n".join(r.log_path.read_text()[-2000:] for r in replicas.replicas.values())
    raise AssertionError(f"expected {expected} rows, found {seen}\n{logs}")


def check_exact(catalog, name, order_ids):
    from tests.support import duck

    table = catalog.load_table(name)
    count, distinct = duck.count_and_distinct(table.metadata_location, "order_id")
    assert (count, distinct) == (len(order_ids), len(order_ids)), name
    con = duck.connect()
    got = {r[0] for r in con.execute(
        f"SELECT order_id FROM iceberg_scan('{duck.plain_path(table.metadata_location)}')").fetchall()}
    assert got == order_ids, f"{name}: missing {len(order_ids - got)}, unexpected {len(got - order_ids)}"


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"metric {name} not exported"
    return total


# A whole-group restart used to wait minutes on Tansu for the new group to form (a departed
# leader kept as leader; see agents/faust_app.py install_leave_group); the timeouts stay generous.
@pytest.mark.chaos
@pytest.mark.timeout(1800)
def test_pizzas_exactly_once_through_restarts(env):
    from icesink.app.pizzas import pizza_values
    from icesink.app.replicas import ReplicaSet

    broker, catalog, cfg, tmp = env
    values = pizza_values(100_000, seed=7, spread_days=3)
    order_ids = {json.loads(v)["order_id"] for v in values}
    assert len(order_ids) == 100_000
    replicas = ReplicaSet(cfg, tmp / "logs")
    try:
        # Phase 1: two replicas, 50k records.
        replicas.start("w1")
        replicas.start("w2")
        produce(broker.bootstrap, values[:50_000])
        wait_rows(catalog, replicas, 50_000)

        assert sum(metric(r.metrics_port, "icesink_rounds_committed_total") for r in replicas.replicas.values()) >= 1
        assert sum(metric(r.metrics_port, "icesink_records_consumed_total") for r in replicas.replicas.values()) >= 50_000

        # Phase 2: graceful stop of one replica mid-stream, another joins.
        sender = threading.Thread(target=produce, args=(broker.bootstrap, values[50_000:80_000]))
        sender.start()
        time.sleep(2)
        assert replicas.stop("w1") == 0
        replicas.start("w3")
        sender.join()
        wait_rows(catalog, replicas, 80_000)

        # Phase 3: the whole group stops and starts again.
        replicas.stop_all()
        replicas.start("w4")
        replicas.start("w5")
        produce(broker.bootstrap, values[80_000:])
        rows = wait_rows(catalog, replicas, 100_000)
        time.sleep(8)  # a few more rounds: nothing may be added twice
        assert {n: total_rows(catalog, n) for n in (AUTO, PARTED)} == {AUTO: 100_000, PARTED: 100_000}, rows
    finally:
        replicas.stop_all()

    for name in (AUTO, PARTED):
        check_exact(catalog, name, order_ids)
    check_snapshots(catalog, broker.bootstrap)
    check_partitions(catalog)


def check_snapshots(catalog, bootstrap):
    """One snapshot per table per round that had data; each summary holds icesink's state."""
    from icesink.shared.control import ControlReader
    from icesink.shared.protocol import CommitToTable

    async def committed_rounds():
        reader = ControlReader(bootstrap, "it-control", GROUP, {})
        await reader.start()
        out = []
        try:
            end = await reader.end_offset()
            await reader.seek(0)
            while await reader.position() < end:
                out += [ev for _, ev in await reader.read(1.0) if isinstance(ev, CommitToTable)]
        finally:
            await reader.stop()
        return out

    commits = asyncio.run(committed_rounds())
    for name in (AUTO, PARTED):
        table = catalog.load_table(name)
        snaps = table.snapshots()
        mine = [c for c in commits if c.table == name]
        assert len(snaps) == len(mine) >= 3, (name, len(snaps), len(mine))
        ids = [s.summary["icesink.commit-id"] for s in snaps]
        assert len(set(ids)) == len(ids) and set(ids) == {c.commit_id for c in mine}
        for s in snaps:
            positions = json.loads(s.summary["icesink.positions"])
            assert set(positions[TOPIC]) == {str(p) for p in range(6)}
            assert int(s.summary["icesink.control-watermark"]) >= 0
            assert int(s.summary["icesink.epoch"]) >= 1
        last = json.loads(snaps[-1].summary["icesink.positions"])
        assert sum(last[TOPIC].values()) == 100_000


def check_partitions(catalog):
    """Every data file of the partitioned table holds exactly one partition value, equal to
    the transforms of its rows, and each Spark write makes one file per partition touched."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.transforms import BucketTransform, DayTransform
    from pyiceberg.types import LongType, TimestampType

    from icesink.shared.iceberg import local_path

    table = catalog.load_table(PARTED)
    day = DayTransform().transform(TimestampType())
    bucket = BucketTransform(8).transform(LongType())
    files = table.inspect.files().to_pylist()
    assert files
    for f in files:
        data = pq.read_table(local_path(f["file_path"]), columns=["store_id", "date_ordered"])
        micros = data["date_ordered"].cast(pa.timestamp("us")).cast(pa.int64()).to_pylist()
        expected = {(day(ts), bucket(sid)) for sid, ts in zip(data["store_id"].to_pylist(), micros)}
        part = f["partition"]
        stored_day = part["date_ordered_day"]
        if isinstance(stored_day, dt.date):  # inspect.files() may render day() as a date
            stored_day = (stored_day - dt.date(1970, 1, 1)).days
        assert expected == {(stored_day, part["store_id_bucket"])}, f["file_path"]
    # Never a spray: one Spark write (its own directory under data/) makes one file per
    # partition tuple it touches.
    per_write: dict[str, list[tuple]] = {}
    for f in files:
        write_dir = f["file_path"].split("/data/", 1)[1].split("/", 1)[0]
        per_write.setdefault(write_dir, []).append(tuple(sorted(f["partition"].items())))
    for write_dir, tuples in per_write.items():
        assert len(tuples) == len(set(tuples)), f"write {write_dir}: several files for one partition"


def test_idle_partitions_do_not_delay_commits(broker, tmp_path):
    """Partition 1 of the data topic and both partitions of a second topic never receive a
    record. With a commit timeout of 5 minutes, rows still land within a few intervals and
    no round closes on the timeout: idle partitions answer every round."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.catalogs import sqlite_catalog_properties
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values
    from icesink.app.pizzas import produce as send
    from icesink.app.replicas import ReplicaSet

    asyncio.run(ensure_topic(broker.bootstrap, "idle-data", 2))
    asyncio.run(ensure_topic(broker.bootstrap, "idle-never", 2))
    props = sqlite_catalog_properties(tmp_path / "catalog")
    cfg = tmp_path / "idle.json"
    cfg.write_text(json.dumps({
        "topics": "idle-data,idle-never", "iceberg.tables": "rpc.idle",
        "iceberg.catalog": "idle", **{f"iceberg.catalog.{k}": v for k, v in props.items()},
        "iceberg.tables.auto-create-enabled": "true", "iceberg.control.topic": "idle-control",
        "iceberg.control.commit.interval-ms": 2000, "iceberg.control.commit.timeout-ms": 300000,
        "group.id": "idle-sink", "bootstrap.servers": broker.bootstrap, "spark.master": "local[1]",
        "state.dir": str(tmp_path / "state"),
    }))
    catalog = load_catalog("idle", **props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r = replicas.start("solo")
        wait_metric(r.metrics_port, "icesink_rounds_committed_total", 1, replicas)
        started = time.monotonic()
        asyncio.run(send(broker.bootstrap, "idle-data", pizza_values(2000, seed=3), partitions=1))
        while not (catalog.table_exists("rpc.idle") and total_rows(catalog, "rpc.idle") >= 2000):
            replicas.check_alive()
            assert time.monotonic() - started < 90, "rows did not land within 90 s"
            time.sleep(0.5)
        assert total_rows(catalog, "rpc.idle") == 2000
        assert metric(r.metrics_port, "icesink_rounds_partial_total") == 0
    finally:
        replicas.stop_all()


def wait_metric(port, name, at_least, replicas, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replicas.check_alive()
        try:
            if metric(port, name) >= at_least:
                return
        except (OSError, AssertionError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{name} did not reach {at_least}")


@pytest.mark.timeout(300)
def test_partition_spec_that_cannot_apply_stops_the_replica_naming_the_key(broker, tmp_path):
    """day() of a column the first records make a string: no retry can mend that, so the
    replica exits with code 2 and a message naming the key, instead of idling on."""
    from icesink.shared.catalogs import sqlite_catalog_properties
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values
    from icesink.app.pizzas import produce as send
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import write_config

    asyncio.run(ensure_topic(broker.bootstrap, "badspec", 1))
    cfg = write_config(tmp_path / "sink.json", topics="badspec", tables="rpc.badspec", bootstrap=broker.bootstrap,
                       catalog_props=sqlite_catalog_properties(tmp_path / "catalog"), state_dir=tmp_path / "state",
                       group="badspec", **{"iceberg.table.rpc.badspec.partition-by": "day(date_ordered)"})
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    r = replicas.start("solo")
    try:
        asyncio.run(send(broker.bootstrap, "badspec", pizza_values(100, seed=5), partitions=1))
        assert r.proc.wait(180) == 2
    finally:
        replicas.stop_all()
    log_text = r.log_path.read_text(errors="replace")
    assert "invalid setting 'iceberg.table.rpc.badspec.partition-by'" in log_text
    assert "(string)" in log_text and "day(date_ordered)" in log_text


def test_unexpected_error_in_ingest_stops_the_replica_instead_of_stalling(broker, tmp_path):
    """A bug while converting a batch (forced with fault.crash-at=worker.ingest-bug): Faust would
    restart its agent without that batch and the replica would answer empty rounds for ever.
    It stops with exit code 1 and the traceback instead, and nothing of the batch is committed."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.catalogs import sqlite_catalog_properties
    from icesink.shared.iceberg import total_rows
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values
    from icesink.app.pizzas import produce as send
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import write_config

    asyncio.run(ensure_topic(broker.bootstrap, "bug", 1))
    props = sqlite_catalog_properties(tmp_path / "catalog")
    cfg = write_config(tmp_path / "sink.json", topics="bug", tables="rpc.bug", bootstrap=broker.bootstrap,
                       catalog_props=props, state_dir=tmp_path / "state", group="bug",
                       **{"fault.crash-at": "worker.ingest-bug"})
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    r = replicas.start("solo")
    try:
        asyncio.run(send(broker.bootstrap, "bug", pizza_values(100, seed=5), partitions=1))
        assert r.proc.wait(180) == 1
    finally:
        replicas.stop_all()
    log_text = r.log_path.read_text(errors="replace")
    assert "ingest failed on a fetch of" in log_text and "Traceback" in log_text
    assert "RuntimeError: fault injection: an unexpected error while converting a batch" in log_text
    assert total_rows(load_catalog("it", **props), "rpc.bug") == 0
