"""SparkFileWriter against a real local Spark session, a SQLite SQL catalog and DuckDB as reader.

One Spark session for the module (it takes seconds to start). Each test gets its own catalog and
warehouse under tmp_path, commits the returned DataFiles with pyiceberg's fast_append, and reads
the table back with pyiceberg and with DuckDB's iceberg extension (loaded from its wheel).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import random
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, DayTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzType,
    UnknownType,
    UUIDType,
)
from pyspark.sql import types as st

from icesink.shared.errors import ConfigError, SparkWriteError
from icesink.app.pizzas import PIZZA_SCHEMA
from icesink.shared.partitioning import build_partition_spec, parse_partition_by
from icesink.shared.errors import UnsupportedTypeError
from spark_bridge.schema import arrow_only_column, name_mapping_properties, spark_schema
from spark_bridge.staging import MARKER
from spark_bridge.session import SparkSettings, available_cpus
from spark_bridge.writer import SparkFileWriter
from tests.support import duck
from icesink.app.embedded import free_port
from tests.support.spark_cluster import spark_home
from tests.support.tables import (
    assert_same_rows,
    commit,
    create_pizza_table,
    file_partition_counts,
    files_under,
    local_path,
    pizza_partition_counts,
    pizzas,
    sqlite_catalog,
)

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::FutureWarning")]



# ---------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(scope="module")
def writer() -> Iterator[SparkFileWriter]:
    w = SparkFileWriter(SparkSettings(master="local[2]", app_name="icesink-test"))
    w.start()
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def shuffling_writer(writer: SparkFileWriter) -> SparkFileWriter:
    """Same session, but every partitioned write is spread over tasks with repartition()."""
    w = SparkFileWriter(SparkSettings(master="local[2]", app_name="icesink-test", bytes_per_write_task=1))
    w.start()  # getOrCreate: the module's session, stopped by the writer fixture
    return w


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    return sqlite_catalog(tmp_path)


def duck_count_distinct(table: Table, key: str) -> tuple[int, int]:
    return duck.count_and_distinct(table.metadata_location, key)


# ---------------------------------------------------------------------------------------------
# Tests


def test_spark_schema_carries_field_ids_at_every_level() -> None:
    schema = Schema(
        NestedField(1, "a", LongType(), required=True),
        NestedField(2, "s", StructType(NestedField(3, "x", StringType()), NestedField(4, "ts", TimestampType()))),
        NestedField(5, "l", ListType(6, StructType(NestedField(7, "y", DecimalType(10, 2))), element_required=False)),
        NestedField(8, "m", MapType(9, StringType(), 10, LongType(), value_required=True)),
    )
    sp = spark_schema(schema)
    assert [f.metadata["parquet.field.id"] for f in sp.fields] == [1, 2, 5, 8]
    assert not sp["a"].nullable and sp["s"].nullable
    struct, array, mapping = sp["s"].dataType, sp["l"].dataType, sp["m"].dataType
    assert isinstance(struct, st.StructType) and isinstance(array, st.ArrayType) and isinstance(mapping, st.MapType)
    assert [f.metadata["parquet.field.id"] for f in struct.fields] == [3, 4]
    assert struct["ts"].dataType == st.TimestampNTZType()
    assert array.containsNull
    element = array.elementType
    assert isinstance(element, st.StructType)
    assert element["y"].metadata == {"parquet.field.id": 7}
    assert element["y"].dataType == st.DecimalType(10, 2)
    assert not mapping.valueContainsNull
    assert all(not f.metadata for f in spark_schema(schema, field_ids=False).fields)

    with pytest.raises(UnsupportedTypeError, match=r"'s\.u'.*uuid"):
        spark_schema(Schema(NestedField(1, "s", StructType(NestedField(2, "u", UUIDType())))))
    # ... which the writer hands to pyarrow; a type no writer has is refused, naming its column.
    nested = Schema(NestedField(1, "a", LongType()), NestedField(2, "l", ListType(3, FixedType(4))),
                    NestedField(4, "s", StructType(NestedField(5, "u", UUIDType()))))
    assert arrow_only_column(nested) == ("l.element", FixedType(4))
    assert arrow_only_column(schema) is None
    with pytest.raises(UnsupportedTypeError, match=r"'t\.x'.*cannot write Iceberg type unknown"):
        arrow_only_column(Schema(*nested.fields, NestedField(6, "t", StructType(NestedField(7, "x", UnknownType())))))
    with pytest.raises(UnsupportedTypeError, match=r"'tn'.*timestamp_ns.*format-version 3"):
        arrow_only_column(Schema(*nested.fields, NestedField(6, "tn", TimestampNanoType())))


def test_partitioned_pizzas_one_file_per_partition_read_back_by_pyiceberg_and_duckdb(
    writer: SparkFileWriter, shuffling_writer: SparkFileWriter, catalog: SqlCatalog
) -> None:
    table = create_pizza_table(catalog, "db.pizzas")
    data = pizzas(table, 20_000, seed=1)

    # Spread over tasks (repartition by the partition tuple); the second round below uses one task.
    files = shuffling_writer.write(table, data, file_prefix="round-1/worker-a")

    # One file per distinct partition tuple, each with the tuple Iceberg stores.
    rows = data.select(["store_id", "date_ordered"]).to_pylist()
    expected_tuples = pizza_partition_counts(rows)
    assert any(None in t for t in expected_tuples)  # null partitions are exercised
    assert len(files) == len(expected_tuples)
    assert file_partition_counts(files) == expected_tuples

    out_dir = local_path(table.location()) + "/data/round-1/worker-a"
    written = files_under(out_dir)
    assert all(name.endswith(".parquet") for name in written), written  # no _SUCCESS, .crc, _temporary
    assert len(written) == len(files)
    assert any(w.startswith("date_ordered_day=2024-01-02/store_id_bucket=") for w in written)
    assert any("date_ordered_day=__HIVE_DEFAULT_PARTITION__/" in w for w in written)

    for f in files:
        assert f.file_path.startswith(table.location() + "/data/round-1/worker-a/")
        assert f.file_format == FileFormat.PARQUET
        assert f.spec_id == table.spec().spec_id
        path = local_path(f.file_path)
        assert f.file_size_in_bytes == os.path.getsize(path)
        # Field ids are in the footer, and the file's rows all belong to its partition tuple.
        arrow_schema = pq.read_schema(path)
        assert [int(fld.metadata[b"PARQUET:field_id"]) for fld in arrow_schema] == [1, 2, 3, 4, 5, 6, 7]
        assert arrow_schema.field("date_ordered").type == pa.timestamp("us")
        content = pq.read_table(path).select(["store_id", "date_ordered"]).to_pylist()
        assert set(pizza_partition_counts(content)) == {(f.partition[0], f.partition[1])}
        assert f.value_counts[1] == f.record_count
        assert f.null_value_counts[5] == pq.read_table(path, columns=["meats"]).column(0).null_count
        assert f.lower_bounds and 1 in f.lower_bounds and 1 in f.upper_bounds

    table = commit(table, files, "c-1")
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert snapshot.summary is not None
    assert snapshot.summary["icesink.commit-id"] == "c-1"
    assert snapshot.summary["added-data-files"] == str(len(files))
    assert snapshot.summary["added-records"] == "20000"

    scanned = table.scan().to_arrow()
    assert_same_rows(scanned, data, "order_id")
    assert duck_count_distinct(table, "order_id") == (20_000, 20_000)

    # Partition pruning uses the partition tuples: filters still return exactly the right rows.
    seven = data.filter(pc.equal(data["store_id"], 7)).num_rows
    assert table.scan(row_filter="store_id = 7").to_arrow().num_rows == seven
    assert table.scan(row_filter="date_ordered IS NULL").to_arrow().num_rows == data["date_ordered"].null_count
    with duck.connect() as con:
        per_day = con.execute(
            "SELECT CAST(date_ordered AS DATE) AS d, count(*) FROM iceberg_scan(?) GROUP BY d ORDER BY d NULLS LAST",
            [local_path(table.metadata_location)],
        ).fetchall()
    expected_days = Counter(r["date_ordered"].date() if r["date_ordered"] else None for r in rows)
    assert dict(per_day) == dict(expected_days)

    # A second round in a fresh directory appends; the first round's files stay untouched.
    more = pizzas(table, 3_000, seed=2, start=20_000)
    files = writer.write(table, more, file_prefix="round-2/worker-a")
    assert file_partition_counts(files) == pizza_partition_counts(more.to_pylist())
    table = commit(table, files, "c-2")
    assert table.scan().to_arrow().num_rows == 23_000
    assert duck_count_distinct(table, "order_id") == (23_000, 23_000)
    with pytest.raises(FileExistsError):
        writer.write(table, more, file_prefix="round-2/worker-a")


def test_a_local_session_warms_up_with_a_throw_away_write_and_leaves_nothing(
    writer: SparkFileWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """warm_up() runs a small write twice so the JVM compiles the Arrow-to-Parquet path before
    the first round (bench/README.md), then once into ``write.warm-up-files`` partition
    directories (the per-file path of a partitioned table or a many-table round); its files are
    gone afterwards. start() does not: a replica asked to stop while starting must not wait for
    it (test_faults.py)."""
    staging = tmp_path / "staging"
    tracker = writer.spark.sparkContext.statusTracker()
    for files, jobs, said in ((40, 3, "spark warmed up: 2 writes of 5000 rows, then one into 40 files in"),
                              (0, 2, "spark warmed up: 2 writes of 5000 rows in")):
        warmed = SparkFileWriter(SparkSettings(master="local[2]", app_name="icesink-test", staging_dir=str(staging),
                                               warm_up_rows=5_000, warm_up_files=files))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="spark_bridge.writer"):
            warmed.start()  # getOrCreate: the module's session
            assert "spark warmed up" not in caplog.text
            before = set(tracker.getJobIdsForGroup(None))
            warmed.warm_up()
        assert said in caplog.text
        assert len(set(tracker.getJobIdsForGroup(None)) - before) == jobs
        assert "warm-up write failed" not in caplog.text
        assert [p.name for p in staging.rglob("*")] == [MARKER]  # start() made it; the warm-up left nothing
    # Rows come to wait for a real write: the warm-up ends after its first write; rows that
    # already wait (or a write that runs) when it would begin: it writes nothing.
    warmed = SparkFileWriter(SparkSettings(master="local[2]", app_name="icesink-test", staging_dir=str(staging),
                                           warm_up_rows=5_000, warm_up_files=40))
    for answers, jobs, said in (([True], 1, "spark warm-up ended after 1 of its 3 writes: rows wait for a write"),
                                ([], 0, "spark warm-up skipped: rows wait for a write, which warms the JVM up")):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="spark_bridge.writer"):
            warmed.start()
            before = set(tracker.getJobIdsForGroup(None))
            warmed.warm_up(idle=functools.partial(next, iter(answers), False))
        assert said in caplog.text
        assert len(set(tracker.getJobIdsForGroup(None)) - before) == jobs
        assert [p.name for p in staging.rglob("*")] == [MARKER]
    with pytest.raises(ConfigError, match="write.warm-up-rows"):
        SparkFileWriter(SparkSettings(warm_up_rows=-1))
    with pytest.raises(ConfigError, match="write.warm-up-files"):
        SparkFileWriter(SparkSettings(warm_up_files=-1))


def test_a_real_write_cancels_the_warm_ups_write_in_flight(
    catalog: SqlCatalog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real write that begins while a warm-up write runs (here its write of 500k rows into 400
    files) cancels that throw-away write (spark_bridge/warm_up.py): its job and tasks end, the
    warm-up says so and writes no more, leaves nothing in staging, and the real write's files
    read back whole."""
    staging = tmp_path / "staging"
    warmed = SparkFileWriter(SparkSettings(master="local[2]", app_name="icesink-test", staging_dir=str(staging),
                                           warm_up_rows=500_000, warm_up_files=400))
    warmed.start()  # getOrCreate: the module's session
    table = catalog.create_table("db.cancel", schema=PIZZA_SCHEMA)
    data = pizzas(table, 20_000, seed=5)
    with caplog.at_level(logging.INFO, logger="spark_bridge.writer"):
        warming = threading.Thread(target=warmed.warm_up)
        warming.start()
        deadline = time.monotonic() + 120
        while not any(staging.glob("icesink-warm-up-*/files")):  # the write into many files began
            assert warming.is_alive() and time.monotonic() < deadline, caplog.text
            time.sleep(0.02)
        files = warmed.write(table, data, file_prefix="r1")
        warming.join(60)
    assert not warming.is_alive()
    assert "spark warm-up write cancelled after 2 of its 3 writes: a real write takes the cores" in caplog.text
    assert "spark warmed up" not in caplog.text and "warm-up write failed" not in caplog.text
    tracker = warmed.spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 10  # the status store follows the scheduler's events a little later
    while tracker.getActiveStageIds() or [p.name for p in staging.rglob("*")] != [MARKER]:
        assert time.monotonic() < deadline, (tracker.getActiveStageIds(), list(staging.rglob("*"))[:5])
        time.sleep(0.05)
    table = commit(table, files, "c-1")
    assert duck_count_distinct(table, "order_id") == (20_000, 20_000)


def test_the_local_jvm_runs_with_the_driver_options(writer: SparkFileWriter) -> None:
    """The JVM Spark started has our options (spark_bridge/session.py): exit on OutOfMemoryError,
    C2's raised thresholds (bench/README.md, ingest_bench "JIT thresholds"), and on two CPUs the
    serial collector."""
    jvm = writer.spark.sparkContext._jvm
    assert jvm is not None
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:+ExitOnOutOfMemoryError" in arguments
    assert "-XX:Tier4InvocationThreshold=50000" in arguments
    assert "-XX:Tier4BackEdgeThreshold=400000" in arguments
    # On two CPUs (these machines) the serial collector; on more the JVM's own choice.
    collectors = {bean.getName() for bean in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()}
    if available_cpus() <= 2:
        assert collectors == {"Copy", "MarkSweepCompact"}


def test_staged_write_uploads_files_and_cleans_the_staging_dir(
    writer: SparkFileWriter, catalog: SqlCatalog, tmp_path: Path
) -> None:
    """write.staging=always: Spark writes under the staging dir, the files are copied to the
    table location with the table's FileIO (for S3 see test_rest_catalog.py), nothing stays."""
    staging = tmp_path / "staging"
    staged = SparkFileWriter(SparkSettings(master="local[2]", app_name="icesink-test", stage="always",
                                           staging_dir=str(staging)))
    staging.mkdir()
    (staging / MARKER).write_text("")  # made by icesink: a crash's scratch directories go at start
    (staging / "icesink-stage-x" / "out").mkdir(parents=True)
    (staging / "icesink-stage-x" / "out" / "part-0.parquet").write_text("x")
    (staging / "notes").write_text("someone else's")
    staged.start()  # getOrCreate: the module's session; deletes only icesink's leftovers
    assert sorted(p.name for p in staging.iterdir()) == [MARKER, "notes"]
    table = create_pizza_table(catalog, "db.staged")
    data = pizzas(table, 5_000, seed=11)
    files = staged.write(table, data, file_prefix="round-1/w")
    assert file_partition_counts(files) == pizza_partition_counts(data.to_pylist())
    for f in files:
        assert f.file_path.startswith(table.location() + "/data/round-1/w/")
        assert f.file_size_in_bytes == os.path.getsize(local_path(f.file_path))
    assert sorted(p.name for p in staging.rglob("*")) == [MARKER, "notes"]
    table = commit(table, files, "c-1")
    assert duck_count_distinct(table, "order_id") == (5_000, 5_000)
    with pytest.raises(ConfigError, match="write.staging"):
        SparkFileWriter(SparkSettings(stage="always"))


def test_unpartitioned_gives_one_file_or_ceil_of_target(writer: SparkFileWriter, catalog: SqlCatalog) -> None:
    table = catalog.create_table("db.flat", schema=PIZZA_SCHEMA)
    data = pizzas(table, 20_000, seed=3)

    files = writer.write(table, data, file_prefix="r1")
    assert len(files) == 1
    assert files[0].record_count == 20_000
    assert files[0].partition == files[0].partition.__class__()  # empty Record
    table = commit(table, files, "c-1")

    more = pizzas(table, 20_000, seed=4, start=20_000)
    target = more.nbytes // 3 + 1  # ceil(bytes / target) == 3
    files = writer.write(table, more, file_prefix="r2", target_file_size_bytes=target)
    assert len(files) == 3
    assert sum(f.record_count for f in files) == 20_000
    table = commit(table, files, "c-2")

    assert table.scan().to_arrow().num_rows == 40_000
    assert duck_count_distinct(table, "order_id") == (40_000, 40_000)
    assert writer.write(table, data.slice(0, 0), file_prefix="r3") == []


def test_a_large_unpartitioned_write_is_split_into_files_without_a_shuffle(
    writer: SparkFileWriter, catalog: SqlCatalog
) -> None:
    """Past the target size an unpartitioned batch gets several files. Spark already holds it as
    one partition per Arrow batch, so neighbouring batches are merged into a task per file: a
    round-robin shuffle cost more CPU than the write itself (bench/README.md, spark_write_bench), and it
    scattered the rows. Each file holds one run of consecutive rows, in consumed order."""
    table = catalog.create_table("db.large", schema=PIZZA_SCHEMA)
    data = pizzas(table, 60_000, seed=5)  # six Arrow batches of 10k rows for createDataFrame
    tracker = writer.spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    files = writer.write(table, data, file_prefix="r1", target_file_size_bytes=data.nbytes // 3 + 1)
    stages = [s for j in set(tracker.getJobIdsForGroup()) - before if (job := tracker.getJobInfo(j))
              for s in job.stageIds]
    assert len(files) == 3
    assert len(stages) == 1, f"a shuffle adds a stage: {stages}"
    runs = sorted(pc.cast(pc.utf8_slice_codeunits(pq.read_table(local_path(f.file_path), columns=["order_id"])
                                                   ["order_id"], 6), pa.int64()).to_pylist() for f in files)
    assert [r for run in runs for r in run] == list(range(60_000))
    table = commit(table, files, "c-1")
    assert duck_count_distinct(table, "order_id") == (60_000, 60_000)


def test_write_many_writes_alike_tables_in_one_spark_job_and_each_reads_back_exactly(
    writer: SparkFileWriter, catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round routed to many tables: the tables with the same schema and partition fields
    share one Spark job; every table gets its own files, partitions and rows, read back by
    DuckDB; a table of another schema and an empty one are written on their own. A table of the
    group whose metrics mode differs keeps its own column statistics."""
    alike = [create_pizza_table(catalog, f"db.many_{i}") for i in range(4)]
    with alike[3].transaction() as tx:
        tx.set_properties({"write.metadata.metrics.default": "counts"})
    alike[3] = catalog.load_table("db.many_3")
    flat = catalog.create_table("db.many_flat", schema=PIZZA_SCHEMA)
    datas = [pizzas(t, 2_000 + 500 * i, seed=20 + i, start=10_000 * i) for i, t in enumerate(alike)]
    writes = [(t, d, f"r1/w-{i}") for i, (t, d) in enumerate(zip(alike, datas, strict=True))]
    writes += [(flat, pizzas(flat, 3_000, seed=30), "r1/w-flat"), (flat, datas[0].slice(0, 0), "r1/w-none")]
    tracker = writer.spark.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup())
    results = writer.write_many(writes)
    assert len(tracker.getJobIdsForGroup()) - jobs_before == 2  # the four alike tables, then the flat one
    assert results[-1] == []
    for (table, data, prefix), files in zip(writes[:-1], results, strict=False):
        assert files and all(f.file_path.startswith(f"{table.location()}/data/{prefix}/") for f in files)
        if table is not flat:
            assert file_partition_counts(files) == pizza_partition_counts(data.to_pylist())
        bounds = [bool(f.lower_bounds) and bool(f.upper_bounds) for f in files]
        assert all(f.value_counts and f.null_value_counts is not None for f in files)
        assert bounds == [table is not alike[3]] * len(files), f"{table.name()}: bounds as its metrics mode says"
        assert sorted(files_under(local_path(table.location()) + f"/data/{prefix}")) == sorted(
            f.file_path.split(f"/data/{prefix}/", 1)[1] for f in files)
        table = commit(table, files, "c-1")
        assert duck_count_distinct(table, "order_id") == (data.num_rows, data.num_rows)
        assert_same_rows(table.scan().to_arrow(), data, "order_id")

    # One write failing fails the call and removes the files already placed for the others.
    again = [(t, d, f"r2/w-{i}") for i, (t, d) in enumerate(zip(alike, datas, strict=True))]
    again.append((flat, pizzas(flat, 100, seed=31), "r2/w-flat"))

    def broken(*args: Any, **kwargs: Any) -> None:
        raise SparkWriteError("injected")

    monkeypatch.setattr(writer, "_run_job", broken)  # the flat table's own job
    with pytest.raises(SparkWriteError, match="injected"):
        writer.write_many(again)
    for table, _, prefix in again:
        assert not os.path.exists(local_path(table.location()) + f"/data/{prefix}")


def test_partition_larger_than_target_is_split(writer: SparkFileWriter, catalog: SqlCatalog) -> None:
    spec = build_partition_spec(parse_partition_by("sauce"), PIZZA_SCHEMA)
    table = catalog.create_table("db.by_sauce", schema=PIZZA_SCHEMA, partition_spec=spec)
    data = pizzas(table, 12_000, seed=5)
    bytes_per_row = -(-data.nbytes // data.num_rows)
    max_records = 2_000
    files = writer.write(table, data, file_prefix="r1", target_file_size_bytes=max_records * bytes_per_row)

    per_sauce = Counter(data["sauce"].to_pylist())
    files_per_sauce = Counter(f.partition[0] for f in files)
    for sauce, count in per_sauce.items():
        assert files_per_sauce[sauce] == -(-count // max_records), sauce
    assert all(f.record_count <= max_records for f in files)
    # identity partition: the source column stays in the data file, directories read sauce_identity=...
    assert all("/sauce_identity=" in f.file_path for f in files)
    assert "sauce" in pq.read_schema(local_path(files[0].file_path)).names
    table = commit(table, files, "c-1")
    assert_same_rows(table.scan().to_arrow(), data, "order_id")


def test_awkward_identity_values_map_back_to_their_partitions(writer: SparkFileWriter, catalog: SqlCatalog) -> None:
    """Empty string, null, Spark's null name, path characters and timestamps as identity partitions."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType()),
        NestedField(3, "at", TimestampType()),
    )
    spec = build_partition_spec(parse_partition_by("name, at"), schema)
    table = catalog.create_table("db.awkward", schema=schema, partition_spec=spec)
    names = ["", None, "__HIVE_DEFAULT_PARTITION__", "a/b", "x:y=z%", "é 漢", "~1", "plain"]
    stamp = dt.datetime(2024, 1, 4, 10, 30)
    stamps = [stamp, None]
    rows: list[dict[str, Any]] = [{"id": i, "name": names[i % len(names)], "at": stamps[i % 2]} for i in range(400)]
    data = pa.Table.from_pylist(rows, schema=schema_to_pyarrow(schema))

    files = writer.write(table, data, file_prefix="r1")

    expected = Counter((r["name"], r["at"]) for r in rows)
    micros = {None: None, stamp: int(stamp.replace(tzinfo=dt.UTC).timestamp() * 1_000_000)}
    assert Counter({(f.partition[0], f.partition[1]): f.record_count for f in files}) == Counter(
        {(name, micros[at]): n for (name, at), n in expected.items()}
    )
    for f in files:
        content = pq.read_table(local_path(f.file_path)).to_pylist()
        assert {r["name"] for r in content} == {f.partition[0]}

    table = commit(table, files, "c-1")
    assert_same_rows(table.scan().to_arrow(), data, "id")
    assert table.scan(row_filter="name = ''").to_arrow().num_rows == expected_count(rows, "")
    assert table.scan(row_filter="name IS NULL").to_arrow().num_rows == expected_count(rows, None)
    assert duck_count_distinct(table, "id") == (400, 400)


def expected_count(rows: list[dict[str, Any]], name: str | None) -> int:
    return sum(1 for r in rows if r["name"] == name)


ALL_TYPES_SCHEMA = Schema(
    NestedField(1, "id", IntegerType(), required=True),
    NestedField(2, "flag", BooleanType()),
    NestedField(3, "f32", FloatType()),
    NestedField(4, "f64", DoubleType()),
    NestedField(5, "dec", DecimalType(20, 4)),
    NestedField(6, "name", StringType()),
    NestedField(7, "blob", BinaryType()),
    NestedField(8, "d", DateType()),
    NestedField(9, "ts", TimestampType()),
    NestedField(10, "tstz", TimestamptzType()),
)


def test_every_primitive_type_round_trips(writer: SparkFileWriter, catalog: SqlCatalog) -> None:
    import decimal

    spec = build_partition_spec(
        parse_partition_by("month(tstz), truncate(name, 2), bucket(blob, 4), d"), ALL_TYPES_SCHEMA
    )
    table = catalog.create_table("db.types", schema=ALL_TYPES_SCHEMA, partition_spec=spec)
    rnd = random.Random(8)
    rows: list[dict[str, Any]] = []
    for i in range(300):
        stamp = dt.datetime(2023, 12, 30) + dt.timedelta(seconds=rnd.randrange(5 * 86_400), microseconds=i)
        rows.append(
            {
                "id": i,
                "flag": rnd.choice([True, False, None]),
                "f32": rnd.choice([1.5, -0.25, None]),
                "f64": rnd.choice([rnd.random(), float("inf"), None]),
                "dec": decimal.Decimal(rnd.randrange(-(10**12), 10**12)) / 10_000,
                "name": rnd.choice(["alpha", "beta", "é漢字", "", None]),
                "blob": rnd.choice([b"\x00\x01", b"", b"abc", None]),
                "d": rnd.choice([dt.date(1969, 12, 31), dt.date(2024, 2, 29), None]),
                "ts": stamp,
                "tstz": stamp.replace(tzinfo=dt.UTC) if i % 7 else None,
            }
        )
    data = pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema()))

    files = writer.write(table, data, file_prefix="r1")
    assert len(files) == len({repr(f.partition) for f in files})  # one file per partition tuple
    table = commit(table, files, "c-1")

    assert_same_rows(table.scan().to_arrow(), data, "id")
    assert table.scan(row_filter="d = '2024-02-29'").to_arrow().num_rows == sum(
        1 for r in rows if r["d"] == dt.date(2024, 2, 29)
    )
    with duck.connect() as con:
        got = con.execute(
            "SELECT count(*), sum(dec), count(tstz), min(ts), max(d) FROM iceberg_scan(?)",
            [local_path(table.metadata_location)],
        ).fetchone()
    assert got is not None
    assert got[0] == 300
    assert got[1] == sum(r["dec"] for r in rows)
    assert got[2] == sum(1 for r in rows if r["tstz"] is not None)
    assert got[3] == min(r["ts"] for r in rows)
    assert got[4] == dt.date(2024, 2, 29)


NESTED_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(
        2,
        "payload",
        StructType(
            NestedField(3, "kind", StringType()),
            NestedField(4, "ts", TimestampType()),
            NestedField(5, "amount", DecimalType(10, 2)),
        ),
    ),
    NestedField(6, "tags", ListType(7, StringType(), element_required=False)),
    NestedField(8, "attrs", MapType(9, StringType(), 10, LongType(), value_required=False)),
)


def test_nested_struct_list_and_map(writer: SparkFileWriter, catalog: SqlCatalog) -> None:
    import decimal

    spec = build_partition_spec(parse_partition_by("day(payload.ts), payload.kind"), NESTED_SCHEMA)
    table = catalog.create_table("db.nested", schema=NESTED_SCHEMA, partition_spec=spec)
    with table.transaction() as tx:  # (create_table renumbers field ids: a mapping of the table's own schema)
        tx.set_properties(name_mapping_properties(table.schema()))
    rnd = random.Random(6)
    rows: list[dict[str, Any]] = []
    for i in range(2_000):
        payload = (
            None
            if i % 97 == 0
            else {
                "kind": rnd.choice(["a", "b", None]),
                "ts": dt.datetime(2024, 3, 1) + dt.timedelta(hours=rnd.randrange(72)),
                "amount": decimal.Decimal(rnd.randrange(-10_000, 10_000)) / 100,
            }
        )
        tags = None if i % 11 == 0 else [rnd.choice(["x", "y", None]) for _ in range(rnd.randrange(4))]
        attrs = None if i % 13 == 0 else [(f"k{j}", rnd.choice([j, None])) for j in range(rnd.randrange(3))]
        rows.append({"id": i, "payload": payload, "tags": tags, "attrs": attrs})
    data = pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema()))

    files = writer.write(table, data, file_prefix="r1")
    assert any(f.partition[0] is None and f.partition[1] is None for f in files)  # the null structs
    assert all("payload.ts_day=" in f.file_path and "/payload.kind=" in f.file_path for f in files)
    # No field ids at all in these files (Spark cannot id list elements): readers use the mapping.
    footer = pq.read_schema(local_path(files[0].file_path))
    assert all(not fld.metadata or b"PARQUET:field_id" not in fld.metadata for fld in footer)
    table = commit(table, files, "c-1")

    scanned = table.scan().to_arrow()
    assert_same_rows(scanned, data, "id")
    with duck.connect() as con:
        got = con.execute(
            "SELECT count(*), count(payload), sum(len(tags)), sum(cardinality(attrs)), sum(payload.amount) "
            "FROM iceberg_scan(?)",
            [local_path(table.metadata_location)],
        ).fetchone()
    assert got is not None
    assert got[0] == 2_000
    assert got[1] == sum(1 for r in rows if r["payload"] is not None)
    assert got[2] == sum(len(r["tags"]) for r in rows if r["tags"] is not None)
    assert got[3] == sum(len(r["attrs"]) for r in rows if r["attrs"] is not None)
    assert got[4] == sum(r["payload"]["amount"] for r in rows if r["payload"] is not None)


def test_list_and_map_tables_without_a_name_mapping_are_written_by_pyarrow(
    writer: SparkFileWriter, catalog: SqlCatalog
) -> None:
    """A table created by another tool has no name mapping (or a wrong one: create_table
    renumbers ids). Spark's files of list/map columns would have no ids for readers to find
    them by, so pyarrow writes such tables, with every field id; DuckDB and pyiceberg read them."""
    spec = build_partition_spec(parse_partition_by("payload.kind"), NESTED_SCHEMA)
    bare = catalog.create_table("db.nested_bare", schema=NESTED_SCHEMA, partition_spec=spec)
    wrong = catalog.create_table(  # a mapping of the caller's ids, not the table's
        "db.nested_wrong", schema=NESTED_SCHEMA, partition_spec=spec, properties=name_mapping_properties(NESTED_SCHEMA)
    )
    for i, table in enumerate((bare, wrong)):
        rows = [{"id": j, "payload": {"kind": "ab"[j % 2], "ts": None, "amount": None}, "tags": ["x"] * (j % 3),
                 "attrs": [(f"k{j}", j)] if j % 2 else None} for j in range(100)]
        data = pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema()))
        files = writer.write(table, data, file_prefix=f"r{i}")
        assert len(files) == 2 and all("/payload.kind=" in f.file_path for f in files)
        footer = pq.read_schema(local_path(files[0].file_path))
        element = footer.field("tags").type.value_field
        assert element.metadata and b"PARQUET:field_id" in element.metadata  # ids even on list elements
        table = commit(table, files, f"c-{i}")
        assert_same_rows(table.scan().to_arrow(), data, "id")
        with duck.connect() as con:
            got = con.execute(
                "SELECT count(*), sum(len(tags)), sum(cardinality(attrs)) FROM iceberg_scan(?)",
                [local_path(table.metadata_location)],
            ).fetchone()
        assert got == (100, sum(j % 3 for j in range(100)), 50)


# ---------------------------------------------------------------------------------------------
# Columns Spark cannot write (uuid, fixed, nanosecond timestamps): pyarrow writes those tables


UUID_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "u", UUIDType()),
    NestedField(3, "f", FixedType(16)),
    NestedField(4, "name", StringType()),
    NestedField(5, "at", TimestampType()),
    NestedField(6, "inner", StructType(NestedField(7, "ref", UUIDType()), NestedField(8, "code", FixedType(3)))),
    NestedField(9, "tags", ListType(10, StringType(), element_required=False)),
)


def uuid_rows(n: int, *, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    names = ["", None, "a/b", "x:y=z%", "é 漢", "__HIVE_DEFAULT_PARTITION__", "plain"]
    return [
        {
            "id": i,
            "u": None if i % 17 == 0 else uuid.UUID(int=rnd.getrandbits(128), version=4),
            "f": None if i % 19 == 0 else rnd.randbytes(16),
            "name": names[i % len(names)],
            "at": dt.datetime(2024, 1, 1) + dt.timedelta(seconds=rnd.randrange(3 * 86_400)),
            "inner": None if i % 23 == 0 else {
                "ref": None if i % 5 == 0 else uuid.UUID(int=rnd.getrandbits(128)), "code": rnd.randbytes(3)
            },
            "tags": None if i % 7 == 0 else [rnd.choice(["x", None]) for _ in range(rnd.randrange(3))],
        }
        for i in range(n)
    ]


def uuid_table(rows: list[dict[str, Any]], table: Table) -> pa.Table:
    """Rows as the worker's decode_json builds them: uuid columns of the arrow.uuid extension type."""
    schema = schema_to_pyarrow(table.schema())
    def raw(u: uuid.UUID | None) -> bytes | None:
        return None if u is None else u.bytes

    as_bytes = [
        {**r, "u": raw(r["u"]), "inner": r["inner"] and {**r["inner"], "ref": raw(r["inner"]["ref"])}} for r in rows
    ]
    return pa.Table.from_pylist(as_bytes, schema=_storage_schema(schema)).cast(schema)


def _storage_schema(schema: pa.Schema) -> pa.Schema:
    def storage(t: pa.DataType) -> pa.DataType:
        if isinstance(t, pa.BaseExtensionType):
            return t.storage_type
        if pa.types.is_struct(t):
            return pa.struct([f.with_type(storage(f.type)) for f in t])
        return t

    return pa.schema([f.with_type(storage(f.type)) for f in schema])


def assert_uuid_footer(path: str, schema: Schema) -> None:
    """Spec-correct types: uuid is FIXED_LEN_BYTE_ARRAY(16) with the UUID logical type, fixed[n]
    is FIXED_LEN_BYTE_ARRAY(n); every column, list elements too, carries its field id."""
    footer = pq.read_metadata(path).schema
    columns = {footer.column(i).path: footer.column(i) for i in range(len(footer))}
    expected = [("u", 16, "UUID"), ("f", 16, "None"), ("inner.ref", 16, "UUID"), ("inner.code", 3, "None")]
    for name, width, logical in expected:
        col = columns[name]
        assert (col.physical_type, col.length, str(col.logical_type)) == ("FIXED_LEN_BYTE_ARRAY", width, logical), name
    arrow = pq.read_schema(path)
    ids = {name: str(schema.find_field(name).field_id).encode() for name in ("tags.element", "inner.ref")}
    assert arrow.field("tags").type.value_field.metadata[b"PARQUET:field_id"] == ids["tags.element"]
    assert arrow.field("inner").type.field("ref").metadata[b"PARQUET:field_id"] == ids["inner.ref"]


def assert_uuid_rows_by_duckdb(table: Table, rows: list[dict[str, Any]]) -> None:
    got = sorted(duck.scan_rows(table.metadata_location), key=lambda r: r["id"])
    assert [(r["id"], r["u"], r["f"], r["name"], r["inner"], r["tags"]) for r in got] == [
        (r["id"], r["u"], r["f"], r["name"], r["inner"], r["tags"]) for r in rows
    ]


def test_partitioned_uuid_and_fixed_columns_are_written_by_pyarrow(
    writer: SparkFileWriter, catalog: SqlCatalog, caplog: pytest.LogCaptureFixture
) -> None:
    spec = build_partition_spec(parse_partition_by("day(at), name, bucket(u, 2)"), UUID_SCHEMA)
    table = catalog.create_table("db.uuids", schema=UUID_SCHEMA, partition_spec=spec)
    rows = uuid_rows(3_000, seed=21)
    data = uuid_table(rows, table)
    bytes_per_row = -(-data.nbytes // data.num_rows)
    max_records = 40  # one (day, name, bucket) tuple holds about 3000 / 42 = 71 rows

    with caplog.at_level(logging.INFO, logger="spark_bridge.writer"):
        files = writer.write(table, data, file_prefix="r1", target_file_size_bytes=max_records * bytes_per_row)
        writer.write(table, data.slice(0, 10), file_prefix="r0")  # logged once per table
    assert sum("column 'u' has type uuid, which Spark cannot write" in m for m in caplog.messages) == 1

    # One directory per tuple, escaped like Spark's, split past the target size.
    day, bucket = DayTransform().transform(TimestampType()), BucketTransform(2).transform(UUIDType())
    tuples = Counter((day(r["at"]), r["name"], bucket(r["u"])) for r in rows)
    per_tuple = Counter((f.partition[0], f.partition[1], f.partition[2]) for f in files)
    assert set(per_tuple) == set(tuples)
    assert all(per_tuple[t] == -(-n // max_records) for t, n in tuples.items())
    assert sum(f.record_count for f in files) == 3_000
    assert any("/name_identity=a%2Fb/" in f.file_path for f in files)
    assert any("/name_identity=__HIVE_DEFAULT_PARTITION__/" in f.file_path for f in files)  # null
    assert_uuid_footer(local_path(files[0].file_path), table.schema())

    table = commit(table, files, "c-1")
    assert_same_rows(table.scan().to_arrow(), data, "id")
    assert_uuid_rows_by_duckdb(table, rows)
    # Filters on uuid and fixed go through the files' bounds (pyarrow 26 cannot compare uuids: DuckDB).
    with duck.connect() as con:
        found = con.execute(
            "SELECT list(id ORDER BY id) FROM iceberg_scan(?) WHERE u = ?::UUID OR f = ?",
            [local_path(table.metadata_location), str(rows[5]["u"]), rows[8]["f"]],
        ).fetchone()
    assert found == ([5, 8],)


def test_unpartitioned_uuid_table_honours_target_size_codec_staging_and_cleans_up(
    catalog: SqlCatalog, tmp_path: Path
) -> None:
    """No Spark session at all: the pyarrow path needs none. Staged like Spark's output."""
    staging = tmp_path / "staging"
    staged = SparkFileWriter(SparkSettings(stage="always", staging_dir=str(staging)))
    table = catalog.create_table(
        "db.flat_uuids", schema=UUID_SCHEMA, properties={"write.parquet.compression-codec": "snappy"}
    )
    rows = uuid_rows(2_000, seed=22)
    data = uuid_table(rows, table)
    files = staged.write(table, data, file_prefix="r1/w", target_file_size_bytes=data.nbytes // 3 + 1)
    assert len(files) == 3 and sorted(f.record_count for f in files) == [666, 667, 667]
    assert not any(p.is_file() for p in staging.rglob("*"))
    for f in files:
        assert f.file_path.startswith(table.location() + "/data/r1/w/part-")
        assert f.file_size_in_bytes == os.path.getsize(local_path(f.file_path))
        assert pq.read_metadata(local_path(f.file_path)).row_group(0).column(1).compression == "SNAPPY"
        assert_uuid_footer(local_path(f.file_path), table.schema())
        assert set(f.lower_bounds) >= {1, 2, 3}  # pyiceberg's metrics of the footer
    table = commit(table, files, "c-1")
    assert_same_rows(table.scan().to_arrow(), data, "id")
    assert_uuid_rows_by_duckdb(table, rows)

    # A failure after some files were written leaves nothing behind, staged or not: the last
    # partition's directory name is longer than the filesystem allows.
    by_name = catalog.create_table("db.by_name", schema=UUID_SCHEMA,
                                   partition_spec=build_partition_spec(parse_partition_by("name"), UUID_SCHEMA))
    long_name = [*rows[:100], {**rows[100], "name": "n" * 300}]
    for i, w in enumerate([staged, SparkFileWriter(SparkSettings())]):
        with pytest.raises(SparkWriteError, match="pyarrow failed to write 101 rows"):
            w.write(by_name, uuid_table(long_name, by_name), file_prefix=f"r{i}/w")
        assert not os.path.exists(local_path(by_name.location()) + f"/data/r{i}/w")
    assert not any(p.is_file() for p in staging.rglob("*"))
    with pytest.raises(SparkWriteError):  # pyarrow validates the rows as Spark does
        staged.write(table, data.set_column(0, "id", pa.array([None] * 2_000, pa.int64())), file_prefix="r3")


# ---------------------------------------------------------------------------------------------
# Spark Connect


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server started from the pyspark package (spark-submit, local[2])."""
    home = spark_home()
    port = free_port()
    log_path = tmp_path_factory.mktemp("connect") / "server.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            os.path.join(home, "bin", "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            "local[2]",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.driver.memory=1g",
            "spark-internal",
        ],
        env={**os.environ, "SPARK_HOME": home},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"Spark Connect server exited with {process.returncode}: {log_path.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"Spark Connect server did not listen within 120 s: {log_path.read_text()[-3000:]}")
                time.sleep(0.25)
        yield f"sc://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        log.close()


def test_spark_connect_writes_committable_files(
    connect_server: str, catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pyspark marks the whole process as "Spark Connect mode" once a remote session exists; restore
    # the variable afterwards so the classic session of the other tests is unaffected.
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    table = create_pizza_table(catalog, "db.remote_pizzas")
    data = pizzas(table, 5_000, seed=7)

    remote = SparkFileWriter(SparkSettings(remote=connect_server))
    remote.start()
    try:
        files = remote.write(table, data, file_prefix="remote-1")
    finally:
        remote.stop()

    assert file_partition_counts(files) == pizza_partition_counts(data.to_pylist())
    out_dir = local_path(table.location()) + "/data/remote-1"
    assert all(name.endswith(".parquet") for name in files_under(out_dir))
    assert [int(f.metadata[b"PARQUET:field_id"]) for f in pq.read_schema(local_path(files[0].file_path))] == list(
        range(1, 8)
    )

    table = commit(table, files, "remote-c-1")
    assert_same_rows(table.scan().to_arrow(), data, "order_id")
    assert duck_count_distinct(table, "order_id") == (5_000, 5_000)


def test_a_group_of_small_tables_is_written_by_a_task_per_core_with_one_file_per_table(
    writer: SparkFileWriter, catalog: SqlCatalog
) -> None:
    """A round routed to many small tables: no shuffle, but each of the session's cores (two
    here) writes a run of whole tables, so the per-file work of the Parquet writer is shared;
    each table still gets one file with all its rows."""
    tables = [catalog.create_table(f"db.small_{i}", schema=PIZZA_SCHEMA) for i in range(6)]
    datas = [pizzas(t, 300, seed=40 + i, start=1_000 * i) for i, t in enumerate(tables)]
    tracker = writer.spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    results = writer.write_many([(t, d, f"r1/w-{i}") for i, (t, d) in enumerate(zip(tables, datas, strict=True))])
    jobs = [tracker.getJobInfo(j) for j in set(tracker.getJobIdsForGroup()) - before]
    tasks = [tracker.getStageInfo(s).numTasks for job in jobs if job for s in job.stageIds
             if tracker.getStageInfo(s) is not None]
    assert max(tasks) == 2, tasks
    for table, data, files in zip(tables, datas, results, strict=True):
        assert len(files) == 1 and files[0].record_count == 300
        table = commit(table, files, "c-1")
        assert_same_rows(table.scan().to_arrow(), data, "order_id")
