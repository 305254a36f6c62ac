"""Schema evolution with real processes: two worker replicas (Faust + Spark), the embedded broker
and a SQLite catalog. Mid-stream a top-level field appears, then a field inside an existing
struct, then an int column (created as Iceberg int) gets values beyond int32. DuckDB's iceberg
extension reads every record exactly once with every value, the table has the new columns with
the right types, and evolution costs no snapshot and no data file."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PHASE = 1500  # records per phase; record i goes to partition i % 4


def records() -> list[dict]:
    out: list[dict] = []
    for i in range(4 * PHASE):
        phase = i // PHASE
        rec: dict = {"id": f"r{i}", "n": i, "meta": {"src": f"s{i % 7}"}}
        if phase >= 1:
            rec["color"] = ["red", "green", "blue"][i % 3]  # a new top-level field
        if phase >= 2:
            rec["meta"]["level"] = i % 5  # a new field in an existing struct
        if phase >= 3:
            rec["n"] = 2**40 + i  # beyond int32: n widens to long
        out.append(rec)
    return out


@pytest.mark.timeout(300)
def test_fields_appear_nest_and_widen_under_two_replicas(broker, catalog_props, tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, LongType, NestedField, StringType, StructType

    from icesink.duck import connect, plain_path
    from icesink.kafka_admin import ensure_topic
    from icesink.pizzas import produce
    from icesink.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, metric, wait_rows, write_config

    topic, table_name = "evolving", "ev.items"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 4))
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("ev")
    catalog.create_table(table_name, Schema(
        NestedField(1, "id", StringType(), required=False),
        NestedField(2, "n", IntegerType(), required=False),
        NestedField(3, "meta", StructType(NestedField(4, "src", StringType(), required=False)), required=False),
    ))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table_name, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group="evolve-sink",
        **{"iceberg.tables.evolve-schema-enabled": "true", "consumer.max-batch": 500},
    )
    values = records()
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r1 = replicas.start("r1")
        r2 = replicas.start("r2")
        # Phase by phase, each committed before the next starts: files of every schema version.
        for phase in range(4):
            part = values[phase * PHASE:(phase + 1) * PHASE]
            asyncio.run(produce(broker.bootstrap, topic, [json.dumps(r).encode() for r in part], partitions=4))
            wait_rows(catalog, replicas, (table_name,), (phase + 1) * PHASE, timeout_s=120)
        time.sleep(3)  # a late duplicate would show up here
        changes = sum(metric(r.metrics_port, "icesink_schema_changes_total") for r in (r1, r2))
        proposals = sum(metric(r.metrics_port, "icesink_schema_proposals_total") for r in (r1, r2))
        failures = sum(metric(r.metrics_port, "icesink_schema_change_failures_total") for r in (r1, r2))
        rejected = sum(metric(r.metrics_port, "icesink_records_rejected_total") for r in (r1, r2))
    finally:
        replicas.stop_all()

    assert_exact(catalog, table_name, {r["id"] for r in values}, key="id")
    table = catalog.load_table(table_name)
    schema = table.schema()
    assert schema.find_field("n").field_type == LongType()
    assert schema.find_field("color").field_type == StringType()
    assert schema.find_field("meta.level").field_type == LongType()
    assert [f.name for f in schema.fields] == ["id", "n", "meta", "color"]  # field ids kept, new ones appended
    assert schema.find_field("id").field_id == 1 and schema.find_field("meta.src").field_id == 4

    # Every value as written, read by DuckDB across files of every schema version.
    with connect(table.io.properties) as con:
        rows = con.execute(
            "SELECT id, n, color, meta.src, meta.level FROM iceberg_scan(?)", [plain_path(table.metadata_location)]
        ).fetchall()
    got = {row[0]: row[1:] for row in rows}
    for r in values:
        assert got[r["id"]] == (r["n"], r.get("color"), r["meta"]["src"], r["meta"].get("level")), r

    # Evolution is metadata only: one schema per applied change, no snapshot without data, and
    # the table's files are exactly the files its data snapshots added.
    assert rejected == 0 and failures == 0 and proposals >= 1
    assert changes == 3 and len(table.metadata.schemas) == 1 + changes  # one per phase that needed one
    snapshots = table.snapshots()
    assert len(snapshots) >= 4
    assert all(int(s.summary["added-data-files"]) > 0 and int(s.summary["added-records"]) > 0 for s in snapshots)
    files = table.inspect.files()
    assert files.num_rows == sum(int(s.summary["added-data-files"]) for s in snapshots)
    assert int(snapshots[-1].summary["total-data-files"]) == files.num_rows
    print(f"evolution: {changes:.0f} schema changes, {proposals:.0f} proposals, {len(snapshots)} snapshots, "
          f"{files.num_rows} files")
