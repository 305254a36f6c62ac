"""Commit branches with real processes (Tansu, a Faust + Spark worker, SQLite catalog): a config
with iceberg.tables.default-commit-branch=audit, one table overriding it with
iceberg.table.<table>.commit-branch, lands every record exactly once on each table's branch
and leaves main as it was, through a replica killed (SIGKILL) between the two table commits of
a round and restarted. Read back by pyiceberg (a scan of the branch's head) and DuckDB."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

# A kill -9 between a round's table commits and a restart, 2 minutes: in `./dev chaos`.
pytestmark = [pytest.mark.integration, pytest.mark.chaos]

TOPIC, GROUP = "br-events", "br-sink"
AUDITED, OTHER = "br.audited", "br.other"  # to the default branch "audit"; to its own branch "b2"
BRANCHES = {AUDITED: "audit", OTHER: "b2"}
POINT = "coordinator.between-table-commits"


def _branch_rows(catalog: Any, table: str, branch: str) -> int:
    head = catalog.load_table(table).snapshot_by_name(branch)
    return int(head.summary["total-records"]) if head is not None and head.summary is not None else 0


def _duck_ids(catalog: Any, table: str, snapshot_id: int) -> list[str]:
    from tests.support.duck import connect, plain_path

    loaded = catalog.load_table(table)
    with connect(loaded.io.properties) as con:
        rows = con.execute(f"SELECT id FROM iceberg_scan('{plain_path(loaded.metadata_location)}', "
                           f"snapshot_from_id => {int(snapshot_id)})").fetchall()
    return [r[0] for r in rows]


@pytest.mark.timeout(600)
def test_rounds_land_exactly_once_on_each_tables_branch_through_a_kill(broker, catalog_props, tmp_path: Path) -> None:
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import write_config

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("br")
    audited = catalog.create_table(AUDITED, schema=Schema(NestedField(1, "id", StringType(), required=False),
                                                          NestedField(2, "n", LongType(), required=False)))
    audited.append(pa.table({"id": ["main-0"], "n": pa.array([0], pa.int64())}))  # another writer's row on main
    main_head = catalog.load_table(AUDITED).current_snapshot()
    assert main_head is not None
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 2))
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "sink.json", topics=TOPIC, tables=f"{AUDITED},{OTHER}", bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=state, group=GROUP,
                       **{"iceberg.tables.default-commit-branch": "audit", f"iceberg.table.{OTHER}.commit-branch": "b2",
                          "fault.crash-at": POINT})
    values = [json.dumps({"id": f"k-{i}", "n": i}).encode() for i in range(4000)]
    keys = {f"k-{i}" for i in range(4000)}
    want = {AUDITED: len(keys) + 1, OTHER: len(keys)}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    began = time.monotonic()
    try:
        first = replicas.start("r1")
        asyncio.run(produce(broker.bootstrap, TOPIC, values[:2000], partitions=2))
        first.proc.wait(240)  # it kills itself between the round's two table commits
        assert first.proc.returncode == -signal.SIGKILL, first.log_path.read_text(errors="replace")[-3000:]
        assert (state / f"fault-{POINT}.fired").exists()
        replicas.replicas.pop("r1").log_handle.close()
        asyncio.run(produce(broker.bootstrap, TOPIC, values[2000:], partitions=2))
        replicas.start("r2")  # same state dir: recovery rolls the round in doubt forward
        deadline = time.monotonic() + 240
        while {t: _branch_rows(catalog, t, b) for t, b in BRANCHES.items()} != want:
            replicas.check_alive()
            assert time.monotonic() < deadline, {t: _branch_rows(catalog, t, b) for t, b in BRANCHES.items()}
            time.sleep(1)
        time.sleep(5)  # two more rounds: a late duplicate would show here
    finally:
        replicas.stop_all()
    print(f"wall {time.monotonic() - began:.0f}s")

    for table, branch in BRANCHES.items():
        loaded = catalog.load_table(table)
        head = loaded.snapshot_by_name(branch)
        assert head is not None, f"{table}: no branch {branch}"
        expected = sorted(keys | ({"main-0"} if table == AUDITED else set()))
        by_pyiceberg = loaded.scan(snapshot_id=head.snapshot_id).to_arrow().column("id").to_pylist()
        assert sorted(by_pyiceberg) == expected, f"{table}: pyiceberg read {len(by_pyiceberg)} rows on {branch}"
        by_duckdb = _duck_ids(catalog, table, head.snapshot_id)
        assert sorted(by_duckdb) == expected, f"{table}: DuckDB read {len(by_duckdb)} rows on {branch}"
        other_branch = ({"audit", "b2"} - {branch}).pop()
        assert other_branch not in loaded.metadata.refs, f"{table} has a branch {other_branch}"
    # main untouched: the audited table's main is the other writer's snapshot, the other table has none
    assert catalog.load_table(AUDITED).current_snapshot() == main_head
    assert catalog.load_table(OTHER).current_snapshot() is None
    assert catalog.load_table(AUDITED).scan().to_arrow().column("id").to_pylist() == ["main-0"]
