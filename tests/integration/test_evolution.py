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


def totals(replicas, *names: str) -> list[float]:
    """Each metric summed over the replicas."""
    from tests.support.sinkrun import metric

    return [sum(metric(r.metrics_port, f"icesink_{n}_total") for r in replicas) for n in names]


def assert_metadata_only(table) -> tuple[int, int]:
    """Evolution is metadata only: no snapshot without data, and the table's files are exactly
    the files its data snapshots added. Returns (snapshots, files)."""
    snapshots = table.snapshots()
    assert all(int(s.summary["added-data-files"]) > 0 and int(s.summary["added-records"]) > 0 for s in snapshots)
    files = table.inspect.files()
    assert files.num_rows == sum(int(s.summary["added-data-files"]) for s in snapshots)
    assert int(snapshots[-1].summary["total-data-files"]) == files.num_rows
    return len(snapshots), files.num_rows


def topic_and_table(broker, catalog_props, topic: str, partitions: int, table_name: str, *extra):  # type: ignore[no-untyped-def]
    """A new topic, and a table created as another tool would (no name mapping) in a new
    namespace: ``id`` string, ``n`` int, ``meta`` struct<src string>, then ``extra`` fields
    (field ids from 5 on). Returns the catalog."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, NestedField, StringType, StructType

    from icesink.shared.kafka_admin import ensure_topic

    asyncio.run(ensure_topic(broker.bootstrap, topic, partitions))
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace(table_name.split(".")[0])
    catalog.create_table(table_name, Schema(
        NestedField(1, "id", StringType(), required=False),
        NestedField(2, "n", IntegerType(), required=False),
        NestedField(3, "meta", StructType(NestedField(4, "src", StringType(), required=False)), required=False),
        *extra,
    ))
    return catalog


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
    from pyiceberg.types import LongType, StringType

    from tests.support.duck import connect, plain_path
    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, wait_rows, write_config

    topic, table_name = "evolving", "ev.items"
    catalog = topic_and_table(broker, catalog_props, topic, 4, table_name)
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table_name, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group="evolve-sink",
        **{"iceberg.tables.evolve-schema-enabled": "true", "consumer.max-batch": 500,
           "maintenance.enabled": "false"},  # assert_metadata_only reads the rounds' snapshot history
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
        changes, proposals, failures, rejected = totals(
            (r1, r2), "schema_changes", "schema_proposals", "schema_change_failures", "records_rejected")
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
    snapshots, files = assert_metadata_only(table)
    assert snapshots >= 4
    print(f"evolution: {changes:.0f} schema changes, {proposals:.0f} proposals, {snapshots} snapshots, {files} files")


def _connect_envelope(record: dict, phase: int) -> bytes:
    """The JsonConverter's output (schemas.enable=true): phase 1's schema adds a top-level and a
    nested optional field and widens ``n`` from int32 to int64."""
    meta = [{"field": "src", "type": "string", "optional": True}]
    fields = [{"field": "id", "type": "string", "optional": False},
              {"field": "n", "type": "int64" if phase else "int32", "optional": True},
              {"field": "meta", "type": "struct", "optional": True, "fields": meta}]
    if phase:
        meta.append({"field": "level", "type": "int32", "optional": True})
        fields.append({"field": "color", "type": "string", "optional": True})
    schema = {"type": "struct", "fields": fields, "optional": False, "name": "items.Value"}
    return json.dumps({"schema": schema, "payload": record}, separators=(",", ":")).encode()


@pytest.mark.timeout(150)
def test_connect_envelopes_evolve_under_two_replicas_with_key_and_metadata(broker, catalog_props, tmp_path: Path) -> None:
    from pyiceberg.types import IntegerType, LongType, NestedField, StringType

    from tests.support.duck import connect, plain_path
    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, wait_rows, write_config

    n_phase = 800
    topic, table_name = "evolving-envelopes", "ev.envelopes"
    catalog = topic_and_table(
        broker, catalog_props, topic, 4, table_name,
        NestedField(5, "_key", StringType(), required=False),
        NestedField(6, "_kafka_metadata_offset", LongType(), required=False),
        NestedField(7, "_kafka_metadata_partition", IntegerType(), required=False),
    )
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table_name, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group="evolve-envelopes",
        **{"iceberg.tables.evolve-schema-enabled": "true", "consumer.max-batch": 400,
           "value.converter.schemas.enable": "true", "iceberg.tables.key-column": "_key",
           "iceberg.tables.kafka-metadata-enabled": "true",
           "maintenance.enabled": "false"},  # assert_metadata_only reads the rounds' snapshot history
    )
    records: list[dict] = []
    for i in range(2 * n_phase):
        phase = i // n_phase
        rec: dict = {"id": f"e{i}", "n": 2**40 + i if phase else i, "meta": {"src": f"s{i % 7}"}}
        if phase:
            rec["meta"]["level"] = i % 5
            rec["color"] = ["red", "green", "blue"][i % 3]
        records.append(rec)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    started = time.monotonic()
    try:
        r1 = replicas.start("r1")
        r2 = replicas.start("r2")
        for phase in range(2):
            part = range(phase * n_phase, (phase + 1) * n_phase)
            asyncio.run(produce(broker.bootstrap, topic, [_connect_envelope(records[i], phase) for i in part],
                                keys=[f"k{i}".encode() for i in part], partitions=4))
            wait_rows(catalog, replicas, (table_name,), (phase + 1) * n_phase, timeout_s=60)
        time.sleep(2)  # a late duplicate would show up here
        changes, failures, rejected = totals((r1, r2), "schema_changes", "schema_change_failures", "records_rejected")
    finally:
        replicas.stop_all()

    assert_exact(catalog, table_name, {r["id"] for r in records}, key="id")
    table = catalog.load_table(table_name)
    schema = table.schema()
    assert schema.find_field("n").field_type == LongType()
    assert schema.find_field("color").field_type == StringType()
    assert schema.find_field("meta.level").field_type == IntegerType()  # as the Connect schema states
    assert [f.name for f in schema.fields][-1] == "color"
    with connect(table.io.properties) as con:
        rows = con.execute(
            "SELECT id, n, color, meta.src, meta.level, _key, _kafka_metadata_offset, _kafka_metadata_partition "
            "FROM iceberg_scan(?)", [plain_path(table.metadata_location)]).fetchall()
    got = {row[0]: row[1:] for row in rows}
    for i, r in enumerate(records):
        assert got[r["id"]][:5] == (r["n"], r.get("color"), r["meta"]["src"], r["meta"].get("level"), f"k{i}"), r
    # Kafka metadata: every (partition, offset) once, partition i % 4, offsets 0.. per partition
    positions = sorted((v[6], v[5]) for v in got.values())
    assert positions == sorted((p, o) for p in range(4) for o in range(2 * n_phase // 4))

    # One schema update holds all three changes (the second replica's proposal is then held).
    assert rejected == 0 and failures == 0 and changes == 1
    assert len(table.metadata.schemas) == 2
    snapshots, files = assert_metadata_only(table)
    print(f"envelope evolution: {changes:.0f} schema changes, {snapshots} snapshots, {files} files, "
          f"{time.monotonic() - started:.1f}s")


def shouty(i: int) -> dict:
    """Record i with its keys spelt in one of four ways at every level; from i = 200 on it also
    carries a new nested field, ``Level`` (then ``LEVEL``, ``level``: one column)."""
    spell = [str, str.upper, str.capitalize, str.lower][i % 4]
    meta: dict = {spell("src"): f"s{i % 7}"}
    if i >= 200:
        meta[["Level", "LEVEL", "level"][i % 3] if i >= 300 else "Level"] = i
    return {spell("id"): f"r{i}", spell("n"): i, spell("meta"): meta,
            spell("items"): [{spell("qty"): i}, {spell("qty"): -i}]}


@pytest.mark.timeout(200)
def test_case_insensitive_keys_fill_columns_at_every_level(broker, catalog_props, tmp_path: Path) -> None:
    """``schema-case-insensitive`` with evolution, real worker: keys in any case fill the
    top-level, nested and list-element columns; a new nested field spelt three ways adds one
    column holding all its values. DuckDB reads every value back."""
    from pyiceberg.types import IntegerType, ListType, NestedField, StructType

    from tests.support.duck import connect, plain_path
    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, wait_rows, write_config

    topic, table_name = "shouting", "ci.items"
    catalog = topic_and_table(  # no name mapping of its list column: pyarrow writes it
        broker, catalog_props, topic, 2, table_name,
        NestedField(5, "items", ListType(6, StructType(NestedField(7, "qty", IntegerType(), required=False)),
                                         element_required=False), required=False),
    )
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table_name, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group="ci-sink",
        **{"iceberg.tables.evolve-schema-enabled": "true", "iceberg.tables.schema-case-insensitive": "true"},
    )
    values = [shouty(i) for i in range(400)]
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r1 = replicas.start("r1")
        for lo, hi in ((0, 200), (200, 300), (300, 400)):  # committed before the next spelling comes
            asyncio.run(produce(broker.bootstrap, topic, [json.dumps(v).encode() for v in values[lo:hi]], partitions=2))
            wait_rows(catalog, replicas, (table_name,), hi, timeout_s=90)
        time.sleep(2)
        changes, rejected = totals((r1,), "schema_changes", "records_rejected")
    finally:
        replicas.stop_all()

    assert_exact(catalog, table_name, {f"r{i}" for i in range(400)}, key="id")
    table = catalog.load_table(table_name)
    assert [f.name for f in table.schema().fields] == ["id", "n", "meta", "items"]  # no second spelling
    assert [f.name for f in table.schema().find_field("meta").field_type.fields] == ["src", "Level"]
    assert rejected == 0 and changes == 1
    with connect(table.io.properties) as con:
        rows = con.execute(
            "SELECT id, n, meta.src, meta.Level, items FROM iceberg_scan(?)", [plain_path(table.metadata_location)]
        ).fetchall()
    got = {row[0]: row[1:] for row in rows}
    for i in range(400):
        assert got[f"r{i}"] == (i, f"s{i % 7}", i if i >= 200 else None, [{"qty": i}, {"qty": -i}]), i
