"""A local Spark session writes its files through spark_bridge/hadoop/'s file system: 200
partition files and their directories without a chmod process each (the machine's fork
counter, /proc/stat ``processes``, barely moves; with Hadoop's own file system it moves by
hundreds), with the usual permissions and no Hadoop checksum files, and the rows read back
exactly."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField

from spark_bridge.localfs import FILE_SYSTEM_CLASS
from spark_bridge.session import SparkSettings
from spark_bridge.writer import SparkFileWriter
from tests.support.tables import local_path, sqlite_catalog

pytestmark = pytest.mark.skipif(shutil.which("javac") is None, reason="needs javac (./dev installs a JDK)")


def _forks() -> int:
    with open("/proc/stat") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("processes "))


def _write_200_partitions(writer: SparkFileWriter, tmp_path: Path, name: str) -> tuple[int, list]:
    (tmp_path / name).mkdir()
    catalog = sqlite_catalog(tmp_path / name)
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "part", LongType()))
    table = catalog.create_table(f"db.{name}", schema=schema,
                                 partition_spec=PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "part")))
    data = pa.table({"id": pa.array(range(20_000), pa.int64()), "part": pa.array([i % 200 for i in range(20_000)], pa.int64())})
    writer.write(table, data, file_prefix="warm")  # the JVM's first write of this shape
    before = _forks()
    files = writer.write(table, data, file_prefix="counted")
    forks = _forks() - before
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for f in files:
            append.append_data_file(f)
    table = catalog.load_table(f"db.{name}")
    assert table.scan().to_arrow().num_rows == 20_000
    return forks, files


@pytest.mark.alone  # the fork counter is the machine's: no other test may start processes meanwhile
def test_a_local_session_writes_200_files_without_a_process_each(tmp_path: Path) -> None:
    writer = SparkFileWriter(SparkSettings(master="local[2]", app_name="icesink-localfs-test", warm_up_rows=0))
    writer.start()
    try:
        spark = writer.spark
        jvm, conf = spark.sparkContext._jvm, spark.sparkContext._jsc.hadoopConfiguration()
        assert conf.get("fs.file.impl") == FILE_SYSTEM_CLASS
        fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
        assert fs.getClass().getName() == FILE_SYSTEM_CLASS
        forks, files = _write_200_partitions(writer, tmp_path, "nio")
        assert len(files) == 200
        assert forks < 100, f"{forks} processes started while writing 200 files"
        path = Path(local_path(files[0].file_path))
        assert stat.S_IMODE(path.stat().st_mode) == 0o644 and stat.S_IMODE(path.parent.stat().st_mode) == 0o755
        assert not any(p.name.endswith(".crc") for p in path.parent.parent.rglob("*"))
        _no_checksum_files(jvm, conf, fs, tmp_path / "crc")
        # After writes (JobConf registered the file): Hadoop's 527 settings before spark_bridge/hadoop/'s.
        assert _settings_from(conf, "yarn-default.xml") == 0

        # The measure sees Hadoop's chmod processes: the same write through Hadoop's own
        # file system (the user's choice of spark.hadoop.fs.file.impl is kept) starts hundreds.
        writer.stop()
        stock = SparkFileWriter(SparkSettings(master="local[2]", app_name="icesink-localfs-test", warm_up_rows=0, conf={
            "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem",
            "spark.hadoop.fs.file.impl.disable.cache": "true"}))
        stock.start()
        try:
            assert stock.spark.sparkContext._jsc.hadoopConfiguration().get("fs.file.impl") != FILE_SYSTEM_CLASS
            forks, _ = _write_200_partitions(stock, tmp_path, "stock")
            assert forks >= 200, forks
        finally:
            stock.stop()
    finally:
        writer.stop()


def _settings_from(conf: Any, resource: str) -> int:
    """How many of a Hadoop conf's settings came from ``resource``. Every Spark job carries
    its session's whole conf to its tasks (each setting's source list gzipped on its own) and
    parquet-mr scans it for every file it opens: yarn-default.xml's 527 settings, which no
    local write reads, were half of it."""
    it, n = conf.iterator(), 0
    while it.hasNext():
        sources = conf.getPropertySources(it.next().getKey())
        n += bool(sources) and sources[-1] == resource
    return n


def _no_checksum_files(jvm: Any, conf: Any, fs: Any, root: Path) -> None:
    """Hadoop's local file system writes a .crc file beside each file: one more file to create,
    rename and delete per data file of a round. The session's writes none, Spark's jobs
    included, and still reads a checksummed file that Hadoop's own wrote."""
    root.mkdir()
    spark_path = jvm.org.apache.hadoop.fs.Path
    out = fs.create(spark_path((root / "plain.bin").as_uri()))
    out.write(b"icesink")
    out.close()
    assert sorted(p.name for p in root.iterdir()) == ["plain.bin"]

    checked = jvm.org.apache.hadoop.fs.LocalFileSystem()
    checked.initialize(jvm.java.net.URI("file:///"), conf)
    out = checked.create(spark_path((root / "checked.bin").as_uri()))
    out.write(b"checksummed")
    out.close()
    assert (root / ".checked.bin.crc").exists()
    stream = fs.open(spark_path((root / "checked.bin").as_uri()))
    assert [stream.read() for _ in range(12)] == [*b"checksummed", -1]  # -1: the end
    stream.close()
