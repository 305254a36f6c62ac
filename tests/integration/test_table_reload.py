"""The table is the schema's truth (issue 39 point 5), with real processes: a worker replica
(Faust + Spark), the embedded broker and a SQLite catalog. While records flow, another tool
changes the table; the running worker picks the change up without a restart
(agents/schema_watch.py), with schema evolution off and on:

1. pyiceberg's ``update_schema`` adds ``note``; the records after it carry ``note``: every one
   of them has it in the table (rows committed before have it null);
2. pyiceberg renames ``n`` to ``amount`` and drops ``old``; Spark (with the Iceberg runtime,
   ``ALTER TABLE ... ADD COLUMN``) adds ``score``; the records after carry ``amount`` and
   ``score``: they land with both filled, and the older rows' ``n`` values read as ``amount``
   (same field id).

Every record is in the table exactly once (DuckDB), its values read back by pyiceberg and by
Spark with the Iceberg runtime."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PHASE = 200  # records per phase; record i goes to partition i % 2


def record(phase: int, i: int) -> dict:
    r: dict = {"id": f"p{phase}-{i}"}
    if phase < 3:
        r["n"] = i
        r["old"] = "o"
    else:
        r["amount"] = 1000 + i
        r["score"] = i * 3
    if phase >= 2:
        r["note"] = f"note-{i}"
    return r


@pytest.mark.parametrize("evolve", ["false", "true"])
def test_columns_changed_by_other_tools_are_filled_by_a_running_worker(broker, catalog_props, spark_reader, evolve,
                                                                      tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import assert_exact, wait_rows, write_config

    topic, table_name = f"reload-{evolve}", f"rl{evolve[0]}.items"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace(table_name.split(".")[0])
    catalog.create_table(table_name, Schema(
        NestedField(1, "id", StringType(), required=False),
        NestedField(2, "n", LongType(), required=False),
        NestedField(3, "old", StringType(), required=False),
    ))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table_name, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group=f"reload-{evolve}",
        **{"iceberg.tables.evolve-schema-enabled": evolve},
    )
    spark = spark_reader.catalog("it", catalog_props)
    phases = {p: [record(p, i) for i in range(PHASE)] for p in (1, 2, 3)}

    def send(p: int) -> None:
        asyncio.run(produce(broker.bootstrap, topic, [json.dumps(r).encode() for r in phases[p]], partitions=2))

    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("r1")
        send(1)
        wait_rows(catalog, replicas, (table_name,), PHASE, timeout_s=120)
        with catalog.load_table(table_name).update_schema() as update:  # another tool, the worker running
            update.add_column("note", StringType())
        send(2)
        wait_rows(catalog, replicas, (table_name,), 2 * PHASE, timeout_s=120)
        with catalog.load_table(table_name).update_schema() as update:
            update.rename_column("n", "amount")
            update.delete_column("old")
        spark.sql(f"ALTER TABLE it.{table_name} ADD COLUMN score bigint")
        send(3)
        wait_rows(catalog, replicas, (table_name,), 3 * PHASE, timeout_s=120)
    finally:
        replicas.stop_all()

    everything = [r for p in (1, 2, 3) for r in phases[p]]
    assert_exact(catalog, table_name, {r["id"] for r in everything}, key="id")
    table = catalog.load_table(table_name)
    assert [f.name for f in table.schema().fields] == ["id", "amount", "note", "score"]
    want = {r["id"]: (r.get("n", r.get("amount")), r.get("note"), r.get("score")) for r in everything}
    by_pyiceberg = {r["id"]: (r["amount"], r["note"], r["score"]) for r in table.scan().to_arrow().to_pylist()}
    assert by_pyiceberg == want
    by_spark = {r["id"]: (r["amount"], r["note"], r["score"]) for r in spark.table(table_name).to_pylist()}
    assert by_spark == want
