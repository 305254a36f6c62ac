"""Compaction's rewrite with a real local Spark (spark_bridge/rewrite.py): Spark reads the small
files by field id across schema evolution, drops the rows the position delete files name, keeps
required columns required, and the coordinator's compaction step commits the result; pyiceberg
and DuckDB read the same rows before and after, and so does Spark with the Iceberg Spark runtime
(the engine users query with). A table Spark cannot read by id (a list column)
goes through pyiceberg, said in the log; a table on S3 has its inputs copied locally and its
output uploaded."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFileContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, IntegerType, ListType, LongType, NestedField, StringType

from coordinator.iceberg_ext.deletes import WithPositionDeletes, write_position_deletes
from coordinator.maintenance import MaintenanceSettings, compact, live_files
from tests.support import duck
from spark_bridge.rewrite import rewrite_files
from spark_bridge.session import SparkSettings
from spark_bridge.writer import SparkFileWriter
from tests.support.spark_reader import SparkCatalogReader, SparkReader, assert_engines_agree, engine_rows
from tests.support.tables import sqlite_catalog

FALLBACK = "with pyiceberg"


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory):
    w = SparkFileWriter(SparkSettings(master="local[2]", app_name="icesink-rewrite-test", warm_up_rows=0,
                                      staging_dir=str(tmp_path_factory.mktemp("staging"))))
    w.start()
    try:
        yield w
    finally:
        w.stop()


class _MirrorAppend(WithPositionDeletes, _FastAppendFiles):
    pass


def _append(table: Any, writer: SparkFileWriter, data: pa.Table, prefix: str) -> list[Any]:
    files = writer.write(table, data, file_prefix=prefix)
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for f in files:
            append.append_data_file(f)
    return files


def _delete(table: Any, data_file: Any, positions: list[int]) -> None:
    deletes = write_position_deletes(
        table, pa.table({"file_path": [data_file.file_path] * len(positions), "pos": pa.array(positions, pa.int64())}),
        partition=data_file.partition, spec_id=data_file.spec_id)
    with table.transaction() as tx:
        update = tx.update_snapshot()
        producer = _MirrorAppend(operation=Operation.OVERWRITE, transaction=tx, io=update._io, branch=update._branch)
        producer.position_deletes = [deletes]
        with producer:
            pass


def _rows(table: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r.values()) for r in table.scan().to_arrow().to_pylist())


def _duck_rows(table: Any, columns: str) -> list[tuple[Any, ...]]:
    with duck.connect(table.io.properties) as con:
        return sorted(con.execute(
            f"SELECT {columns} FROM iceberg_scan('{duck.plain_path(table.metadata_location)}')").fetchall())


def _assert_spark_reads(spark: SparkCatalogReader, catalog: Any, name: str, want: list[tuple[Any, ...]]) -> None:
    """Spark with the Iceberg Spark runtime reads the rows ``want`` (pyiceberg's), as DuckDB does."""
    read = engine_rows(spark, catalog, name)
    assert_engines_agree(read, name)
    assert sorted(read["spark"]) == want


def _compact(writer: SparkFileWriter, catalog: Any, name: str, min_input_files: int,
             caplog: pytest.LogCaptureFixture) -> Any:
    """One compaction step through the coordinator's compact() with rewrite_files as its
    rewriter; it must commit. The rewrite module's log goes to ``caplog``."""
    def rewrite(table, files, deletes, prefix):  # type: ignore[no-untyped-def]
        return rewrite_files(writer, table, files, deletes, file_prefix=prefix, target_file_size_bytes=128 << 20)

    caplog.set_level(logging.INFO, logger="spark_bridge.rewrite")
    out = compact(catalog, name, MaintenanceSettings(min_input_files=min_input_files, target_file_size_bytes=128 << 20),
                  threading.Lock(), rewrite)
    assert out is not None and out.snapshot_id is not None
    return out


def test_spark_rewrites_evolved_files_with_deletes_and_keeps_every_row_and_field_id(
    writer: SparkFileWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture, spark_reader: SparkReader
) -> None:
    catalog = sqlite_catalog(tmp_path)
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "qty", IntegerType()),
                    NestedField(3, "name", StringType()), NestedField(4, "shop", StringType()),
                    identifier_field_ids=[1])
    spec = PartitionSpec(PartitionField(4, 1000, IdentityTransform(), "shop"))
    table = catalog.create_table("db.r", schema=schema, partition_spec=spec, properties={"format-version": "2"})
    old = []
    for r in range(3):  # the old schema: qty int, name
        ids = list(range(100 * r, 100 * r + 100))
        old += _append(table, writer, pa.table({
            "id": pa.array(ids, pa.int64()), "qty": pa.array([i % 7 for i in ids], pa.int32()),
            "name": [f"n{i}" for i in ids], "shop": ["a"] * 100,
        }, schema=pa.schema([pa.field("id", pa.int64(), nullable=False), ("qty", pa.int32()), ("name", pa.string()),
                             ("shop", pa.string())])), f"old-{r}")
        table = catalog.load_table("db.r")
    with table.update_schema() as update:  # rename, widen, add: Spark must map them by field id
        update.rename_column("name", "label")
        update.update_column("qty", LongType())
        update.add_column("extra", DoubleType())
    table = catalog.load_table("db.r")
    for r in range(3, 5):
        ids = list(range(100 * r, 100 * r + 100))
        _append(table, writer, pa.table({
            "id": pa.array(ids, pa.int64()), "qty": pa.array([i % 7 for i in ids], pa.int64()),
            "label": [f"n{i}" for i in ids], "shop": ["a"] * 100, "extra": [i / 2 for i in ids],
        }, schema=pa.schema([pa.field("id", pa.int64(), nullable=False), ("qty", pa.int64()), ("label", pa.string()),
                             ("shop", pa.string()), ("extra", pa.float64())])), f"new-{r}")
        table = catalog.load_table("db.r")
    _delete(table, old[0], [0, 5, 7, 99])
    table = catalog.load_table("db.r")
    _delete(table, old[0], [5, 6])  # 5 again: counted once
    table = catalog.load_table("db.r")
    before = _rows(table)
    assert len(before) == 500 - 5
    assert _duck_rows(table, "id, qty, label, shop, extra") == before
    spark = spark_reader.catalog(catalog.name, catalog.properties)
    _assert_spark_reads(spark, catalog, "db.r", before)  # position deletes and evolved files

    out = _compact(writer, catalog, "db.r", 4, caplog)
    assert FALLBACK not in caplog.text, caplog.text  # Spark read them
    assert (out.files_in, out.files_out, out.deletes_folded) == (5, 1, 2)
    table = catalog.load_table("db.r")
    live = live_files(table)
    assert [f.content for f in live] == [DataFileContent.DATA]
    assert tuple(live[0].partition) == ("a",)
    assert _rows(table) == before
    assert _duck_rows(table, "id, qty, label, shop, extra") == before
    _assert_spark_reads(spark, catalog, "db.r", before)  # the compacted file
    file_schema = pq.read_schema(duck.plain_path(live[0].file_path))
    ids = {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in file_schema}
    assert ids == {"id": 1, "qty": 2, "label": 3, "shop": 4, "extra": 5}
    assert not file_schema.field("id").nullable  # required stays required
    assert file_schema.field("qty").type == pa.int64()


def test_a_table_spark_cannot_read_by_field_id_is_read_by_pyiceberg_and_said(
    writer: SparkFileWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    catalog = sqlite_catalog(tmp_path)
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "tags", ListType(3, StringType(), element_required=False)))
    table = catalog.create_table("db.l", schema=schema)
    for r in range(3):
        table.append(pa.table({"id": pa.array([r, r + 10], pa.int64()), "tags": [[f"t{r}"], []]}))
        table = catalog.load_table("db.l")
    before = _rows(table)
    out = _compact(writer, catalog, "db.l", 3, caplog)
    assert out.files_out == 1
    assert FALLBACK in caplog.text and "list or map" in caplog.text
    table = catalog.load_table("db.l")
    assert _rows(table) == before


@pytest.mark.timeout(300)
def test_a_table_on_s3_is_rewritten_from_local_copies_and_uploaded(
    writer: SparkFileWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

    s3 = SeaweedS3(tmp_path / "seaweed", "lake")
    s3.start()
    try:
        catalog = SqlCatalog("s3", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse="s3://lake/wh", **{
            "s3.endpoint": s3.endpoint, "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY,
            "s3.region": "us-east-1", "s3.path-style-access": "true"})
        catalog.create_namespace("db")
        table = catalog.create_table("db.s", schema=Schema(NestedField(1, "id", LongType()),
                                                            NestedField(2, "v", StringType())))
        files = []
        for r in range(3):
            files += _append(table, writer, pa.table({"id": pa.array(range(10 * r, 10 * r + 10), pa.int64()),
                                                      "v": [f"v{r}"] * 10}), f"r{r}")
            table = catalog.load_table("db.s")
        assert all(f.file_path.startswith("s3://lake/") for f in files)
        _delete(table, files[1], [1, 3])
        table = catalog.load_table("db.s")
        before = _rows(table)
        out = _compact(writer, catalog, "db.s", 4, caplog)
        assert out.files_out == 1
        assert FALLBACK not in caplog.text, caplog.text
        table = catalog.load_table("db.s")
        live = live_files(table)
        assert len(live) == 1 and live[0].file_path.startswith(f"{table.location()}/data/compacted-")
        assert _rows(table) == before and len(before) == 28
        assert _duck_rows(table, "id, v") == before
    finally:
        s3.stop()


def test_an_orc_table_is_compacted_into_orc_files_read_exactly_by_spark_and_pyiceberg(
    writer: SparkFileWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture, spark_reader: SparkReader
) -> None:
    """write.format.default=orc (issue 39): compaction reads the ORC files with pyiceberg (by the
    name mapping: they carry no field ids), applies a position delete and writes ORC again."""
    from pyiceberg.manifest import FileFormat

    from spark_bridge.schema import name_mapping_properties
    from tests.support.spark_reader import _rows as engine_sorted

    catalog = sqlite_catalog(tmp_path)
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "s", StringType(), required=False))
    table = catalog.create_table("db.o", schema=schema, properties={"write.format.default": "orc"})
    with table.transaction() as tx:
        tx.set_properties(name_mapping_properties(table.schema()))
    table = catalog.load_table("db.o")
    written = []
    for r in range(3):
        data = pa.table({"id": pa.array(range(r * 100, r * 100 + 100), pa.int64()), "s": [f"s{i}" for i in range(100)]})
        written += _append(table, writer, data, f"orc-{r}")
        table = catalog.load_table("db.o")
    assert {f.file_format for f in written} == {FileFormat.ORC}
    _delete(table, written[0], [0, 5])
    table = catalog.load_table("db.o")
    want = [(i, f"s{i % 100}") for i in range(300) if i not in (0, 5)]
    assert _rows(table) == want
    out = _compact(writer, catalog, "db.o", 3, caplog)
    assert out.files_out == 1
    assert FALLBACK in caplog.text and "ORC" in caplog.text
    table = catalog.load_table("db.o")
    live = list(table.inspect.files().to_pylist())
    assert [f["file_format"] for f in live] == ["ORC"] and live[0]["file_path"].endswith(".orc")
    assert _rows(table) == want
    spark = spark_reader.catalog(catalog.name, catalog.properties)
    read = {"spark": engine_sorted(spark.table("db.o").to_pylist(), ["id", "s"], set()),
            "pyiceberg": engine_sorted(table.scan().to_arrow().to_pylist(), ["id", "s"], set())}
    assert_engines_agree(read, "db.o (ORC files)")
    assert sorted(read["spark"]) == want
