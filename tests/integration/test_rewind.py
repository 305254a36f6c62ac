"""``icesink offsets`` and ``icesink rewind`` with real processes: a worker (embedded broker, Spark,
SQLite catalog) ingests 200 records over two partitions in two batches (so two rounds at least);
``icesink offsets`` prints each snapshot's positions; ``icesink rewind`` refuses while the worker
runs (the broker lists its member), then, the worker stopped (``--assume-stopped``: Tansu keeps
listing the members of stopped consumers), is killed -9 right after its rollback; a worker started then
refuses to start (exit 2, one line naming the table, the pending property and the command); the rewind
is run again; the worker started again reads from the rolled-back positions and the table holds each record exactly once
(DuckDB and pyiceberg). Another writer's snapshot on top makes a second rewind refuse, naming it,
and change nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

TOPIC, TABLE, GROUP = "rewind-pizzas", "rw.pizzas", "rewind-sink"


def _icesink(cfg: Path, *args: str, sets: tuple[str, ...] = (), timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    extra = [a for s in sets for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "icesink", *args, "--config", str(cfg), *extra],
                          capture_output=True, text=True, timeout=timeout_s)
    # what it printed (pytest -s shows it: docs/rewind.md's transcripts come from here)
    print(f"$ icesink {' '.join(args)}  (exit {done.returncode})", done.stdout, done.stderr[-1500:], sep="\n")
    return done


def _offsets(cfg: Path) -> list[dict[str, Any]]:
    done = _icesink(cfg, "offsets", TABLE, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _by_partition(row: dict[str, Any]) -> dict[int, int]:
    return {p["partition"]: p["offset"] for p in row["positions"]}


def test_rewind_rolls_back_rereads_once_and_survives_a_kill(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.app.start_failures import cause_in_log
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import key_counts, wait_rows, write_config

    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 2))
    values = pizza_values(200, seed=38)
    keys = [json.loads(v)["order_id"] for v in values]
    cfg = write_config(tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=GROUP)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("w1")
        asyncio.run(produce(broker.bootstrap, TOPIC, values[:100], partitions=2))  # offsets 0..49 of each
        wait_rows(catalog, replicas, (TABLE,), 100, timeout_s=300)
        asyncio.run(produce(broker.bootstrap, TOPIC, values[100:], partitions=2))  # offsets 50..99 of each
        wait_rows(catalog, replicas, (TABLE,), 200, timeout_s=300)

        rows = _offsets(cfg)
        assert _by_partition(rows[0]) == {0: 100, 1: 100} and rows[0]["writer"] == "sink", rows
        assert any(_by_partition(r) == {0: 50, 1: 50} for r in rows), rows
        plain = _icesink(cfg, "offsets", TABLE, "--snapshot", str(rows[0]["snapshot_id"]))
        assert plain.returncode == 0 and f"{TOPIC}" in plain.stdout and " 100" in plain.stdout, plain

        running = _icesink(cfg, "rewind", TABLE, "--to", f"{TOPIC}:0:60")
        assert running.returncode == 3 and "running member" in running.stderr, running
        assert catalog.load_table(TABLE).current_snapshot().snapshot_id == rows[0]["snapshot_id"]
    finally:
        replicas.stop_all()

    # the newest snapshot with partition 0 at or below 60 holds partition 0 and 1 below 50 or so
    target = next(r for r in rows if _by_partition(r).get(0, 0) <= 60)
    crash = ("fault.crash-at=rewind.after-table-commit",)
    killed = _icesink(cfg, "rewind", TABLE, "--to", f"{TOPIC}:0:60", "--assume-stopped", sets=crash)
    assert killed.returncode == -9, killed
    assert catalog.load_table(TABLE).current_snapshot().snapshot_id == target["snapshot_id"]
    interrupted = _icesink(cfg, "offsets", TABLE)
    assert f"rewind {TABLE} --to {TOPIC}:0:60` again" in interrupted.stderr, interrupted.stderr
    # a worker started before the rewind is run again would read on from the old positions (the
    # records rolled back lost): it refuses to start, in one last line naming table, property and command
    early = _icesink(cfg, "worker", timeout_s=150)
    assert early.returncode == 2, early.stderr[-3000:]
    last = cause_in_log(early.stderr) or ""  # icesink's last line (the JVM's own warnings may follow it)
    assert TABLE in last and f"icesink.{GROUP}.rewind-pending={TOPIC}:0:60" in last, early.stderr[-3000:]
    assert f"run `icesink rewind {TABLE} --to {TOPIC}:0:60` again" in last, last
    assert catalog.load_table(TABLE).current_snapshot().snapshot_id == target["snapshot_id"]
    again = _icesink(cfg, "rewind", TABLE, "--to", f"{TOPIC}:0:60", "--assume-stopped", sets=crash)
    assert again.returncode == 0, again
    assert "no rollback needed" in again.stdout and "reads again from" in again.stdout, again.stdout
    assert "interrupted" not in _icesink(cfg, "offsets", TABLE).stderr
    assert catalog.load_table(TABLE).current_snapshot().snapshot_id == target["snapshot_id"]
    held = sum(_by_partition(target).values())
    assert held < 200 and key_counts(catalog, TABLE, "order_id").total() == held

    replicas = ReplicaSet(cfg, tmp_path / "logs2")
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, (TABLE,), 200, timeout_s=300)
    finally:
        replicas.stop_all()
    want = Counter(keys)
    assert key_counts(catalog, TABLE, "order_id") == want  # DuckDB
    scanned = catalog.load_table(TABLE).scan(selected_fields=("order_id",)).to_arrow()["order_id"].to_pylist()
    assert Counter(scanned) == want  # pyiceberg
    assert _by_partition(_offsets(cfg)[0]) == {0: 100, 1: 100}

    # another writer's snapshot on top: a rewind below it would lose it, refused in one line
    table = catalog.load_table(TABLE)
    table.append(table.scan(limit=1).to_arrow())
    foreign = table.current_snapshot().snapshot_id
    refused = _icesink(cfg, "rewind", TABLE, "--to", f"{TOPIC}:1:50", "--assume-stopped")
    assert refused.returncode == 3, refused
    assert str(foreign) in refused.stderr and "another writer" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert catalog.load_table(TABLE).current_snapshot().snapshot_id == foreign


def test_rewind_by_offset_columns_deletes_only_past_rows_and_survives_a_kill(broker, catalog_props, tmp_path):
    """With ``iceberg.tables.kafka-metadata-enabled`` the rows carry their offsets: the rewind
    deletes exactly the rows of partition 0 at or past offset 30 (partition 1 untouched, no
    rollback), is killed -9 right after that commit and run again; the worker re-reads partition
    0 from 30 only, and the table holds each record once."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import key_counts, sink_until, wait_rows, write_config

    topic, table_name = "rewind-meta", "rw.meta"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    values = pizza_values(120, seed=39)
    keys = [json.loads(v)["order_id"] for v in values]  # offset o of partition p holds values[2 * o + p]
    asyncio.run(produce(broker.bootstrap, topic, values, partitions=2))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table_name, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="rewind-meta-sink",
                       **{"iceberg.tables.kafka-metadata-enabled": "true"})
    sink_until(cfg, tmp_path / "logs", catalog, (table_name,), 120, timeout_s=300)
    before = catalog.load_table(table_name).current_snapshot().snapshot_id

    crash = ("fault.crash-at=rewind.after-table-commit",)
    args = ("rewind", table_name, "--to", f"{topic}:0:30", "--assume-stopped")
    killed = _icesink(cfg, *args, sets=crash)
    assert killed.returncode == -9 and "offset columns" in killed.stdout, killed
    again = _icesink(cfg, *args, sets=crash)
    assert again.returncode == 0 and "reads again from" in again.stdout, again
    table = catalog.load_table(table_name)
    kept = Counter([keys[2 * o] for o in range(30)] + [keys[2 * o + 1] for o in range(60)])
    assert key_counts(catalog, table_name, "order_id") == kept  # rows past 30 of partition 0 gone, nothing else
    assert before in {s.snapshot_id for s in table.snapshots()} and table.current_snapshot().snapshot_id != before

    replicas = ReplicaSet(cfg, tmp_path / "logs2")
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, (table_name,), 120, timeout_s=300)
    finally:
        replicas.stop_all()
    assert key_counts(catalog, table_name, "order_id") == Counter(keys)  # DuckDB
    scanned = catalog.load_table(table_name).scan(selected_fields=("order_id",)).to_arrow()["order_id"].to_pylist()
    assert Counter(scanned) == Counter(keys)  # pyiceberg


def test_rewind_voids_a_round_accepted_but_never_committed(broker, catalog_props, tmp_path):
    """A worker is killed -9 inside a round (``fault.crash-at=coordinator.before-table-commit``:
    its coordinator accepted the responses, no table holds them); the rewind run then (the sink
    stopped) raises the group's control watermark in the table's state, so the worker started
    after it never commits that round (recovery would roll it forward, and its records, read again
    from the rewound positions, would be in the table twice): each record once, and the log says
    the coordinator announced the raised watermark ("holds round ... that was never announced")."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import key_counts, wait_rows, write_config

    topic, table_name, group = "rewind-void", "rw.void", "rewind-void-sink"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    values = pizza_values(200, seed=40)
    keys = [json.loads(v)["order_id"] for v in values]
    common = {"topics": topic, "tables": table_name, "bootstrap": broker.bootstrap, "catalog_props": catalog_props,
              "state_dir": tmp_path / "state", "group": group}
    cfg = write_config(tmp_path / "sink.json", **common)
    crashing = write_config(tmp_path / "crash.json", **common,
                            **{"fault.crash-at": "coordinator.before-table-commit"})
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("w1")
        asyncio.run(produce(broker.bootstrap, topic, values[:60], partitions=2))  # offsets 0..29 of each
        wait_rows(catalog, replicas, (table_name,), 60, timeout_s=300)
        asyncio.run(produce(broker.bootstrap, topic, values[60:120], partitions=2))  # 30..59
        wait_rows(catalog, replicas, (table_name,), 120, timeout_s=300)
    finally:
        replicas.stop_all()
    committed = _offsets_of(cfg, table_name)

    replicas = ReplicaSet(crashing, tmp_path / "logs2")
    w = replicas.start("w1")
    asyncio.run(produce(broker.bootstrap, topic, values[120:], partitions=2))  # 60..99
    assert w.proc.wait(300) == -9  # killed itself inside the round that holds some of them
    replicas.stop_all()
    assert "SIGKILL at coordinator.before-table-commit" in w.log_path.read_text(errors="replace")
    assert key_counts(catalog, table_name, "order_id").total() == 120
    assert _offsets_of(cfg, table_name) == committed

    target = next(r for r in committed if _by_partition(r).get(0, 0) <= 40)
    rewound = _icesink(cfg, "rewind", table_name, "--to", f"{topic}:0:40", "--assume-stopped")
    assert rewound.returncode == 0, rewound
    assert f"rollback of main to snapshot {target['snapshot_id']}" in rewound.stdout, rewound.stdout
    held = sum(_by_partition(target).values())
    assert held < 120 and key_counts(catalog, table_name, "order_id").total() == held

    replicas = ReplicaSet(cfg, tmp_path / "logs3")
    try:
        r = replicas.start("w1")
        wait_rows(catalog, replicas, (table_name,), 200, timeout_s=300)
        reread = sum(100 - o for o in _by_partition(target).values())  # from the rolled-back positions on
        _wait_read(cfg, table_name, {0: 100, 1: 100}, r, replicas, reread)
    finally:
        replicas.stop_all()
    want = Counter(keys)
    assert key_counts(catalog, table_name, "order_id") == want  # DuckDB
    scanned = catalog.load_table(table_name).scan(selected_fields=("order_id",)).to_arrow()["order_id"].to_pylist()
    assert Counter(scanned) == want  # pyiceberg
    assert "that was never announced" in r.log_path.read_text(errors="replace")


def _offsets_of(cfg: Path, table: str) -> list[dict[str, Any]]:
    done = _icesink(cfg, "offsets", table, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _wait_read(cfg: Path, table: str, want: dict[int, int], replica: Any, replicas: Any, reread: int,
               timeout_s: float = 300) -> None:
    """Until the table's head holds ``want``, the worker consumed the ``reread`` records again and
    buffers none that no CommitComplete covered (``icesink_uncommitted_age_seconds`` 0): every
    record read again is committed, so a duplicate would show."""
    import time

    from tests.support.sinkrun import metric

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replicas.check_alive()
        consumed = metric(replica.metrics_port, "icesink_records_consumed_total")
        if (consumed >= reread and metric(replica.metrics_port, "icesink_uncommitted_age_seconds") == 0
                and _by_partition(_offsets_of(cfg, table)[0]) == want):
            return
        time.sleep(2)
    raise AssertionError(f"{table} never reached {want} with {reread} records read again: {_offsets_of(cfg, table)[:2]}")
