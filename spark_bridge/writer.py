"""Write Arrow tables as Iceberg data files with a long-lived Spark session.

Spark only writes plain Parquet files (no Iceberg runtime jar): this module turns an Arrow table
into files under ``<table location>/data/<file_prefix>/``, then reads each footer with pyarrow and
returns one pyiceberg :class:`DataFile` per file, ready for ``fast_append().append_data_file``.

The steps of one :meth:`SparkFileWriter.write` call:

1. Compute the partition values of every row with the table's spec (vectorised, in Arrow).
2. Give every partition field a string *label* per distinct value: Iceberg's human string
   (``2024-01-04`` for a day, ``3`` for a bucket), made unique and never empty, so that Spark's
   directory name maps back to exactly one value. Append the labels as extra columns whose names
   never replace a data column (an identity partition keeps its source column in the file).
3. ``createDataFrame(arrow)`` -> ``repartition(n, *labels)`` -> ``write.partitionBy(*labels)``:
   every partition tuple goes to one task, hence one file (split only past the target size).
   A batch smaller than ``bytes_per_write_task`` uses ``coalesce(1)`` instead of the shuffle:
   one task, still one file per tuple (Spark sorts a task's rows by partition before writing),
   and no shuffle (500k pizza rows: about 19 instead of 30-36 CPU seconds, measured here).
   An unpartitioned table gets ``ceil(bytes / target)`` files, each a run of neighbouring Arrow
   batches (``coalesce``, no shuffle).
4. List the output directory, read each footer, compute Iceberg metrics with pyiceberg's own
   functions, and map the file's directory back to its typed partition tuple.

A table with a column Spark has no type for (uuid, fixed[n]: see
:func:`spark_bridge.schema.arrow_only_column`), or with list or map columns but no name mapping
of its schema (a table created by another tool: Spark's files would have no ids there for
readers to find those columns by), is written by pyarrow instead of step 3
(:meth:`SparkFileWriter._run_arrow_job`): same directories, same file sizes, every field id;
steps 1, 2 and 4, staging and clean-up are shared.

The session is blocking: run these calls off the event loop, in one executor.
"""

from __future__ import annotations

import logging
import math
import re
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    PyArrowFileIO,
    _check_pyarrow_schema_compatible,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record
from pyspark.sql import types as st

from icesink.errors import ConfigError, SparkWriteError
from spark_bridge import class_archive, staging
from spark_bridge.labels import PartitionLabels, parse_partition_dirs, partition_directories, with_label_columns
from spark_bridge.localfs import session_conf
from spark_bridge.schema import arrow_only_column, name_mapping_mismatch, requires_name_mapping, spark_schema

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_TARGET_FILE_SIZE_BYTES", "SparkFileWriter", "SparkSettings"]

logger = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE_BYTES = 128 * 1024 * 1024


# SQL confs every session gets; all are runtime confs, so they also apply to Spark Connect.
_RUNTIME_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.fieldId.write.enabled": "true",
    # Compaction's reads (spark_bridge/rewrite.py) match columns by Iceberg field id.
    "spark.sql.parquet.fieldId.read.enabled": "true",
    "spark.sql.caseSensitive": "true",
    "spark.sql.shuffle.partitions": "8",
}
# Confs that only a locally started session can take (static or core confs).
_LOCAL_CONF: dict[str, str] = {
    # Local mode runs tasks in the driver JVM, which also holds the Arrow batches of a write.
    "spark.driver.memory": "2g",
    # An OutOfMemoryError can kill Spark's scheduler thread and leave the job waiting forever:
    # exit instead, so the write fails (SparkWriteError) and the owner restarts the process.
    "spark.driver.extraJavaOptions": "-XX:+ExitOnOutOfMemoryError",
    "spark.ui.enabled": "false",
    # Iceberg time columns: Spark 4.1+ writes TIME as Parquet TIME(MICROS) once enabled. Not
    # forced on Spark Connect servers, which may be older (a time column then fails to write).
    "spark.sql.timeType.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # createDataFrame(arrow) below this size (48 MB by default) becomes a LocalRelation: the
    # driver turns every row into an UnsafeRow and each analyzer and optimizer rule walks all of
    # them. 0 sends the Arrow batches to the write task as they are: a warm write of 60k rows
    # took half the time (bench/README.md). Not for Spark Connect, whose servers cache relations.
    "spark.sql.execution.arrow.localRelationThreshold": "0",
}
# Hadoop options passed with every write (they reach Spark Connect servers too).
_WRITE_OPTIONS: dict[str, str] = {
    "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}

# Iceberg table property -> Spark/parquet-mr write option.
_ICEBERG_CODECS = {
    "zstd": "zstd",
    "snappy": "snappy",
    "gzip": "gzip",
    "lz4": "lz4",
    "brotli": "brotli",
    "uncompressed": "uncompressed",
    "none": "uncompressed",
}

_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")


@dataclass(frozen=True)
class SparkSettings:
    """How to reach Spark. Frozen; built once at start-up."""

    master: str = "local[*]"  # ignored when remote is set
    remote: str | None = None  # Spark Connect URL "sc://host:port"
    conf: Mapping[str, str] = field(default_factory=dict)  # extra spark conf
    app_name: str = "icesink"
    # Upper bound on the write tasks of one call (each task writes whole partitions).
    max_write_tasks: int = 64
    # Arrow bytes per write task: smaller batches are written by one task without a shuffle.
    bytes_per_write_task: int = 128 * 1024 * 1024
    # Staging: a local Spark writes into staging_dir, then the files are uploaded to the table
    # location with the table's FileIO. "auto" stages when the location is not a local path
    # (s3://, gs://, ...: Spark would need the user's hadoop-aws jars) and Spark runs locally.
    stage: Literal["auto", "always", "never"] = "auto"
    staging_dir: str | None = None  # this writer's scratch directories (spark_bridge/staging.py)
    # Rows of a throw-away write run twice at start() by a local session (0: none): the JVM
    # loads and compiles the Arrow-to-Parquet path then instead of during the first round.
    warm_up_rows: int = 20_000
    # A local session's JVM maps the class-data archive built for its JVM and class path, when
    # there is one (spark_bridge/class_archive.py: it starts in about half the time).
    class_archive: bool = True

    def validate(self) -> None:
        if self.remote is not None and not self.remote.startswith("sc://"):
            raise ConfigError("spark.remote", self.remote, "a Spark Connect URL like sc://host:15002")
        if self.max_write_tasks < 1:
            raise ConfigError("SparkSettings.max_write_tasks", self.max_write_tasks, "a positive integer")
        if self.bytes_per_write_task < 1:
            raise ConfigError("SparkSettings.bytes_per_write_task", self.bytes_per_write_task, "a positive integer")
        if self.stage not in ("auto", "always", "never"):
            raise ConfigError("write.staging", self.stage, "one of auto, always, never")
        if self.stage == "always" and self.staging_dir is None:
            raise ConfigError("write.staging", self.stage, "auto or never when no staging directory is given")
        if self.warm_up_rows < 0:
            raise ConfigError("write.warm-up-rows", self.warm_up_rows, "0 or a positive number of rows")

    def stages(self, location: str) -> bool:
        """Whether files for ``location`` are written locally first and then uploaded."""
        if self.staging_dir is None or self.stage == "never":
            return False
        if self.stage == "always":
            return True
        local_spark = self.remote is None and self.master.startswith("local")
        return local_spark and not _is_local(location)


_METRICS_PREFIX = "write.metadata.metrics."


@dataclass
class _FooterPlan:
    """What reading a table's footers needs from its schema and properties (_data_files)."""

    stats: dict[int, Any]  # compute_statistics_plan
    ids: dict[str, int]  # parquet_path_to_id_mapping
    checked: bool = False  # the files' Parquet schema was checked against the table's


@dataclass(frozen=True)
class _Planned:
    """One table's write, checked and worked out (SparkFileWriter._plan)."""

    table: Table
    data: pa.Table
    extended: pa.Table  # data plus a label column per partition field
    labels: list[PartitionLabels]
    n_tuples: int
    sp_schema: st.StructType | None  # None: pyarrow writes it (arrow_schema)
    arrow_schema: pa.Schema | None
    options: dict[str, str]  # Spark's Parquet options
    out_uri: str
    fs: pafs.FileSystem
    out_path: str

    def group_key(self) -> tuple[str, ...]:
        """Writes with the same key can share one Spark job (SparkFileWriter.write_many)."""
        assert self.sp_schema is not None
        return (self.sp_schema.json(), *(lbl.column for lbl in self.labels), "|",
                *sorted(f"{k}={v}" for k, v in self.options.items()))


class SparkFileWriter:
    """Owns one long-lived Spark session and writes Iceberg data files with it."""

    def __init__(self, settings: SparkSettings) -> None:
        settings.validate()
        self._settings = settings
        self._spark: SparkSession | None = None
        self._arrow_tables: set[str] = set()  # tables logged as written with pyarrow
        # Rows per Arrow batch of createDataFrame(arrow) in a classic session, which makes a
        # partition of each batch (None on Spark Connect: the server decides).
        self._batch_rows: int | None = None

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            raise RuntimeError("SparkFileWriter is not started: call start() first")
        return self._spark

    def start(self) -> None:
        """Create the session (blocking: a local session takes seconds)."""
        if self._spark is not None:
            return
        from pyspark.sql import SparkSession

        s = self._settings
        if s.staging_dir is not None:
            staging.claim(s.staging_dir)  # a crash's leftovers go, if icesink made the directory
        if s.remote is not None:
            spark = SparkSession.builder.remote(s.remote).appName(s.app_name).create()
            for key, value in {**_RUNTIME_CONF, **s.conf}.items():
                try:
                    spark.conf.set(key, value)
                except Exception as e:
                    spark.stop()
                    raise ConfigError(
                        f"spark.conf.{key}", value, f"a runtime conf the Spark Connect server accepts ({e})"
                    ) from e
        else:
            builder = SparkSession.builder.master(s.master).appName(s.app_name)
            conf = self.startup_conf()
            if s.class_archive and s.master.startswith("local"):
                conf = class_archive.with_archive(conf)
            for key, value in conf.items():
                builder = builder.config(key, value)
            spark = builder.getOrCreate()
            spark.sparkContext.setLogLevel("WARN")
            _quiet_task_size_warnings(spark)
            self._batch_rows = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000") or 10000)
        self._spark = spark
        logger.info("spark session started (%s)", s.remote or s.master)

    def startup_conf(self) -> dict[str, str]:
        """The conf a classic (not Spark Connect) session starts with: ours, then the user's."""
        s = self._settings
        # A local session talks only to itself: keep its driver on loopback.
        loopback = (
            {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
            if s.master.startswith("local") else {}
        )
        # A local session's driver runs the tasks: its file: scheme can skip chmod processes.
        # Elsewhere executors lack the classes: Hadoop's own, also over a conf an earlier local
        # session of this process left in the JVM's system properties.
        fast_fs = (session_conf(s.conf) if s.master.startswith("local")
                   else {} if "spark.hadoop.fs.file.impl" in s.conf
                   else {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem"})
        return {**_LOCAL_CONF, **loopback, **_RUNTIME_CONF, **s.conf, **fast_fs}

    def warm_up(self) -> None:
        """A local session's throw-away writes (``write.warm-up-rows``; see :meth:`_warm_up`).
        Separate from :meth:`start` so a replica is running, and can stop within its bound,
        while the JVM warms up; :meth:`stop` ends it between writes."""
        s = self._settings
        if self._spark is not None and s.remote is None and s.warm_up_rows:
            self._warm_up(s.warm_up_rows)

    def _warm_up(self, rows: int, times: int = 2) -> None:
        """Write ``rows`` synthetic rows (the common column types, zstd) ``times`` into a
        temporary directory and delete them. A fresh JVM takes about 6 s of CPU for its first
        500k-row write and under 2 s once warm (bench/README.md): this moves that cost to
        start-up, where it overlaps joining the group. A failure is logged, never raised: the
        first real write then fails or succeeds on its own."""
        started = time.monotonic()
        ids = pa.array(np.arange(rows, dtype=np.int64))
        text = pc.cast(ids, pa.string())
        data = pa.table({
            "id": ids, "name": pc.binary_join_element_wise("name-", text, ""), "amount": pc.divide(ids, 7.0),
            "flag": pc.equal(pc.bit_wise_and(ids, 1), 0),
            "at": pc.cast(pc.multiply(ids, 1_000_000), pa.int64()).cast(pa.timestamp("us")),
        })
        sp_schema = st.StructType([
            st.StructField("id", st.LongType()), st.StructField("name", st.StringType()),
            st.StructField("amount", st.DoubleType()), st.StructField("flag", st.BooleanType()),
            st.StructField("at", st.TimestampNTZType()),
        ])
        root = staging.scratch(self._settings.staging_dir, "icesink-warm-up-")
        try:
            for i in range(times):
                if self._spark is None:  # stopped meanwhile
                    return
                self._run_job(sp_schema, data, [], 1, data, DEFAULT_TARGET_FILE_SIZE_BYTES,
                              {**_WRITE_OPTIONS, **_parquet_options({})}, (root / str(i)).as_uri())
            logger.info("spark warmed up: %d writes of %d rows in %.1f s", times, rows, time.monotonic() - started)
        except Exception as e:  # noqa: BLE001 - an optimisation only
            if self._spark is None:  # the session was stopped under it: the stop says so
                logger.info("spark warm-up ended by the session's stop")
            else:
                logger.warning("spark warm-up write failed (the first round pays the JVM's warm-up instead): %s", e)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def stop(self) -> None:
        spark, self._spark = self._spark, None
        if spark is not None:
            spark.stop()

    def write(
        self,
        table: Table,
        data: pa.Table,
        *,
        file_prefix: str,
        target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE_BYTES,
    ) -> list[DataFile]:
        """Write ``data`` as Parquet files of ``table`` and return their DataFiles (blocking).

        ``data`` must have the schema ``schema_to_pyarrow(table.schema())``. Files go under
        ``<table.location()>/data/<file_prefix>/``, which must not exist yet: give every call a
        fresh prefix. Raises :class:`SparkWriteError` (retriable) if Spark fails; the partial
        output is then removed.
        """
        planned = self._plan(table, data, file_prefix, target_file_size_bytes)
        return [] if planned is None else self._write_one(planned, target_file_size_bytes)

    def write_many(
        self,
        writes: Sequence[tuple[Table, pa.Table, str]],
        *,
        target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE_BYTES,
    ) -> list[list[DataFile]]:
        """:meth:`write` for several ``(table, data, file_prefix)`` at once: the DataFiles of each,
        in order. With a local Spark, tables whose files look alike (same Spark schema with field
        ids, same partition fields, same Parquet options: a topic routed to many tables) are
        written by ONE Spark job into a local scratch directory, one subdirectory per table,
        and the files then moved (or uploaded) to each table's location: a round of 200
        small tables costs one job, not 200. If any write fails, the files already placed for
        the others are removed too and the error is raised."""
        planned = [self._plan(t, d, p, target_file_size_bytes) for t, d, p in writes]
        out: list[list[DataFile]] = [[] for _ in planned]
        groups: dict[tuple[str, ...], list[tuple[int, _Planned]]] = {}
        for i, w in enumerate(planned):
            if w is not None and w.sp_schema is not None and self._local_spark():
                groups.setdefault(w.group_key(), []).append((i, w))
        done: list[_Planned] = []
        try:
            for members in groups.values():
                if len(members) > 1:
                    files = self._write_group([w for _, w in members], target_file_size_bytes)
                    for (i, w), f in zip(members, files, strict=True):
                        out[i] = f
                        done.append(w)
            grouped = {i for members in groups.values() if len(members) > 1 for i, _ in members}
            for i, w in enumerate(planned):
                if w is not None and i not in grouped:
                    out[i] = self._write_one(w, target_file_size_bytes)
                    done.append(w)
        except Exception:
            for w in done:
                _delete_quietly(w.fs, w.out_path)
            raise
        return out

    def _local_spark(self) -> bool:
        return self._settings.remote is None and self._settings.master.startswith("local")

    def _plan(self, table: Table, data: pa.Table, file_prefix: str, target_file_size_bytes: int) -> _Planned | None:
        """Check one write and work out how it goes (None: no rows)."""
        if not _PREFIX_RE.match(file_prefix):
            raise ValueError(
                f"file_prefix must be a relative path of [A-Za-z0-9._-] segments not starting with '.' or '_', "
                f"found {file_prefix!r}"
            )
        if target_file_size_bytes < 1:
            raise ValueError(f"target_file_size_bytes must be positive, found {target_file_size_bytes}")
        metadata = table.metadata
        schema = table.schema()
        spec = table.spec()
        arrow_only = arrow_only_column(schema)  # raises for a column no writer can write
        needs_mapping = arrow_only is None and requires_name_mapping(schema)
        unmapped = name_mapping_mismatch(schema, metadata.name_mapping()) if needs_mapping else None
        by_arrow = arrow_only is not None or unmapped is not None
        expected_columns = [f.name for f in schema.fields]
        if data.column_names != expected_columns:
            # createDataFrame maps columns by position: a different order would mix columns up.
            raise ValueError(
                f"data columns must be the table's columns in order: expected {expected_columns}, "
                f"found {data.column_names}"
            )
        if data.num_rows == 0:
            return None
        sp_schema: st.StructType | None = None
        arrow_schema: pa.Schema | None = None
        if by_arrow:
            table_name = ".".join(table.name())
            if table_name not in self._arrow_tables:
                self._arrow_tables.add(table_name)
                why = (f"column {arrow_only[0]!r} has type {arrow_only[1]}, which Spark cannot write"
                       if arrow_only is not None else
                       f"Spark-written files of its list or map columns need a name mapping ({unmapped}; "
                       f"set spark_bridge.schema.name_mapping_properties(table.schema()) to let Spark write it)")
                logger.info("table %s: %s: pyarrow writes its files, with every field id", table_name, why)
            arrow_schema = schema_to_pyarrow(schema, include_field_ids=True)
        else:
            # Spark cannot give list elements and map keys/values a field id. A file with some ids
            # but not all is misread by readers that trust ids (DuckDB reads such list elements as
            # NULL), so such tables get files without ids, which every reader maps by name.
            sp_schema = spark_schema(schema, field_ids=not needs_mapping)
            self.spark  # noqa: B018 - fails early when the session is not started

        data_root = metadata.properties.get("write.data.path", f"{table.location().rstrip('/')}/data")
        out_uri = f"{data_root.rstrip('/')}/{file_prefix}"
        fs, out_path = _filesystem(table, out_uri)
        if fs.get_file_info(out_path).type != pafs.FileType.NotFound:
            raise FileExistsError(f"output directory {out_uri} already exists: each write needs a fresh file_prefix")
        labels: list[PartitionLabels] = []
        extended = data
        n_tuples = 1
        if not spec.is_unpartitioned():
            extended, labels, n_tuples = with_label_columns(data, spec, schema)
        options = {**_WRITE_OPTIONS, **_parquet_options(metadata.properties)}
        return _Planned(table, data, extended, labels, n_tuples, sp_schema, arrow_schema, options, out_uri, fs, out_path)

    def _write_one(self, w: _Planned, target_file_size_bytes: int) -> list[DataFile]:
        def run_job(job_fs: pafs.FileSystem, job_path: str, job_uri: str) -> None:
            if w.sp_schema is None:
                assert w.arrow_schema is not None
                self._run_arrow_job(w.arrow_schema, w.extended, w.labels, w.data, target_file_size_bytes,
                                    w.table.metadata.properties, job_fs, job_path)
            else:
                self._run_job(w.sp_schema, w.extended, w.labels, w.n_tuples, w.data, target_file_size_bytes,
                              w.options, job_uri)

        if not self._settings.stages(w.out_uri):
            try:
                run_job(w.fs, w.out_path, w.out_uri)
                return self._data_files(w.table, w.fs, w.out_path, w.out_uri, w.labels)
            except FileExistsError:
                raise  # another writer's output: never delete it
            except Exception:
                _delete_quietly(w.fs, w.out_path)
                raise

        # Staged: Spark writes locally; the footers are read there; then every file is uploaded.
        assert self._settings.staging_dir is not None
        stage_root = staging.scratch(self._settings.staging_dir, "icesink-stage-")
        stage_path = stage_root / "out"
        try:
            local_fs = pafs.LocalFileSystem()
            run_job(local_fs, str(stage_path), stage_path.as_uri())
            data_files = self._data_files(w.table, local_fs, str(stage_path), w.out_uri, w.labels)
            _place(local_fs, str(stage_path), w.fs, w.out_path, w.out_uri, len(data_files))
            return data_files
        finally:
            shutil.rmtree(stage_root, ignore_errors=True)

    def _write_group(self, group: Sequence[_Planned], target_file_size_bytes: int) -> list[list[DataFile]]:
        """One Spark job for tables whose files look alike (:meth:`write_many`): their rows
        concatenated with a table-number column Spark partitions on first, written locally.
        A small group is written without a shuffle by one task per core, each taking a run of
        whole tables (createDataFrame makes a partition of each Arrow batch, and coalesce joins
        neighbours), so every table still gets one file per partition tuple, but the table at
        the seam between two tasks, which may get two: the JVM opens and closes a Parquet
        writer per file, the larger part of a round routed to many tables, on every core
        (bench/README.md)."""
        first = group[0]
        assert first.sp_schema is not None
        column = "icesink_table"
        while column in first.extended.column_names:
            column += "_"
        combined = pa.concat_tables([
            pa.Table.from_arrays(w.extended.columns, schema=first.extended.schema)
            .append_column(column, pa.array(np.full(w.data.num_rows, i, dtype=np.int32)))
            for i, w in enumerate(group)
        ])
        rows = sum(w.data.num_rows for w in group)
        nbytes = sum(w.data.nbytes for w in group)
        partition_columns = [column, *(lbl.column for lbl in first.labels)]
        sp_schema = st.StructType([*first.sp_schema.fields,
                                   *(st.StructField(c, st.StringType(), True) for c in partition_columns[1:]),
                                   st.StructField(column, st.IntegerType(), False)])
        stage_root = staging.scratch(self._settings.staging_dir, "icesink-tables-")
        try:
            n_tasks = max(1, min(sum(w.n_tuples for w in group), self._settings.max_write_tasks,
                                 math.ceil(nbytes / self._settings.bytes_per_write_task)))
            per_file = max(1, target_file_size_bytes // max(1, math.ceil(nbytes / rows)))
            options = {**first.options, "maxRecordsPerFile": str(per_file)}
            try:
                frame = self.spark.createDataFrame(combined, schema=sp_schema)
                quoted = ["`" + c.replace("`", "``") + "`" for c in partition_columns]
                if n_tasks == 1:  # no shuffle: each core's task takes a run of whole tables (see above)
                    frame = frame.coalesce(max(1, min(len(group), self.spark.sparkContext.defaultParallelism)))
                else:
                    frame = frame.repartition(n_tasks, *quoted)
                frame.write.partitionBy(*partition_columns).options(**options).mode("error").parquet(
                    (stage_root / "out").as_uri())
            except Exception as e:
                raise SparkWriteError(f"Spark failed to write {rows} rows of {len(group)} tables: {e}") from e
            local_fs = pafs.LocalFileSystem()
            out: list[list[DataFile]] = []
            job: dict[tuple[Any, ...], _FooterPlan] = {}
            try:
                for i, w in enumerate(group):
                    sub = f"{stage_root}/out/{column}={i}"
                    data_files = self._data_files(w.table, local_fs, sub, w.out_uri, w.labels, job=job)
                    _place(local_fs, sub, w.fs, w.out_path, w.out_uri, len(data_files), move=True)
                    out.append(data_files)
            except Exception:
                for w in group[: len(out)]:
                    _delete_quietly(w.fs, w.out_path)
                raise
            return out
        finally:
            shutil.rmtree(stage_root, ignore_errors=True)

    def _run_job(
        self, sp_schema: st.StructType, extended: pa.Table, labels: Sequence[PartitionLabels], n_tuples: int,
        data: pa.Table, target_file_size_bytes: int, options: dict[str, str], out_uri: str,
    ) -> None:
        """One Spark job writing ``extended`` (data plus label columns) under ``out_uri``."""
        spark = self.spark
        options = dict(options)
        try:
            if not labels:
                n_files = max(1, math.ceil(data.nbytes / target_file_size_bytes))
                frame = spark.createDataFrame(data, schema=sp_schema)
                # Merge neighbouring input slices (one per Arrow batch) into a task per file, without
                # a shuffle: each file is a run of consecutive rows. A round-robin shuffle cost twice
                # the write's CPU (bench/README.md); only when there are fewer slices than files (rows
                # of many kilobytes, or Spark Connect, whose slices are the server's) is it needed.
                slices = (len(data.to_batches(max_chunksize=self._batch_rows))
                          if self._batch_rows is not None and self._batch_rows > 0 else 1)
                writer = (frame.coalesce(n_files) if n_files <= slices else frame.repartition(n_files)).write
            else:
                columns = [lbl.column for lbl in labels]
                label_fields = [st.StructField(c, st.StringType(), True) for c in columns]
                frame = spark.createDataFrame(extended, schema=st.StructType([*sp_schema.fields, *label_fields]))
                # Each partition tuple must go to exactly one task, so to one file unless it holds
                # more than maxRecordsPerFile rows: one task for a small batch (no shuffle), else
                # hash-partition on the tuple.
                by_size = math.ceil(data.nbytes / self._settings.bytes_per_write_task)
                n_tasks = max(1, min(n_tuples, self._settings.max_write_tasks, by_size))
                if n_tasks == 1:
                    frame = frame.coalesce(1)
                else:
                    quoted = ["`" + c.replace("`", "``") + "`" for c in columns]  # dots are not nesting
                    frame = frame.repartition(n_tasks, *quoted)
                writer = frame.write.partitionBy(*columns)
                bytes_per_row = max(1, math.ceil(data.nbytes / data.num_rows))
                options["maxRecordsPerFile"] = str(max(1, target_file_size_bytes // bytes_per_row))
            writer.options(**options).mode("error").parquet(_spark_uri(out_uri))
        except Exception as e:
            if "PATH_ALREADY_EXISTS" in str(e):  # another writer took this prefix meanwhile: not ours
                raise FileExistsError(f"output directory {out_uri} was created by another writer") from e
            raise SparkWriteError(f"Spark failed to write {data.num_rows} rows to {out_uri}: {e}") from e

    @staticmethod
    def _run_arrow_job(
        arrow_schema: pa.Schema, extended: pa.Table, labels: Sequence[PartitionLabels], data: pa.Table,
        target_file_size_bytes: int, properties: Mapping[str, str], fs: pafs.FileSystem, root: str,
    ) -> None:
        """pyarrow instead of Spark (:meth:`_run_job`) for a table with columns Spark cannot write:
        the same layout (a ``label=value`` directory per partition tuple, escaped like Spark),
        one file per tuple split past the target size, the table's codec, every field id."""
        bytes_per_row = max(1, math.ceil(data.nbytes / data.num_rows))
        options = _arrow_parquet_options(properties, bytes_per_row)
        try:
            rows = data.cast(arrow_schema)  # the field ids, in nested types too
            if fs.type_name == "local":  # object stores have no directories to make
                fs.create_dir(root, recursive=True)
            for directory, indices in partition_directories(extended, labels):
                part = rows if indices is None else rows.take(indices)
                part_bytes = data.nbytes * part.num_rows / data.num_rows
                n_files = max(1, math.ceil(part_bytes / target_file_size_bytes))
                per_file = math.ceil(part.num_rows / n_files)
                if directory and fs.type_name == "local":
                    fs.create_dir(f"{root}/{directory}", recursive=True)
                for start in range(0, part.num_rows, per_file):
                    path = f"{root}/{directory}{'/' if directory else ''}part-{uuid.uuid4()}.parquet"
                    pq.write_table(part.slice(start, per_file), path, filesystem=fs, **options)
        except Exception as e:
            raise SparkWriteError(f"pyarrow failed to write {data.num_rows} rows to {root}: {e}") from e

    def _data_files(
        self, table: Table, fs: pafs.FileSystem, out_path: str, out_uri: str, labels: Sequence[PartitionLabels],
        *, partition: Record | None = None, job: dict[tuple[Any, ...], _FooterPlan] | None = None,
    ) -> list[DataFile]:
        """A DataFile per Parquet file under ``out_path``, its partition from its directories
        (``labels``), or ``partition`` for every file. ``job``: shared by the tables one Spark job
        wrote (:meth:`_write_group`; their files have one Parquet schema), so tables alike in
        schema and metrics settings share their statistics plan and one schema check."""
        metadata = table.metadata
        schema = table.schema()
        metrics = tuple(sorted((k, v) for k, v in metadata.properties.items() if k.startswith(_METRICS_PREFIX)))
        plan_key = (str(schema), metadata.format_version, metrics)  # str(schema) names every field id and type
        plan = job.get(plan_key) if job is not None else None
        if plan is None:
            plan = _FooterPlan(compute_statistics_plan(schema, metadata.properties), parquet_path_to_id_mapping(schema))
            if job is not None:
                job[plan_key] = plan
        stats_plan, id_mapping = plan.stats, plan.ids
        records: dict[tuple[str | None, ...], Record] = {}
        data_files: list[DataFile] = []
        for relative, size in _list_data_files(fs, out_path):
            *dirs, _ = relative.split("/")
            key = parse_partition_dirs(dirs, labels, relative) if partition is None else ()
            record = records.get(key) if partition is None else partition
            if record is None:
                record = Record(*[None if lbl is None else p.values[lbl] for lbl, p in zip(key, labels, strict=True)])
                records[key] = record
            file_uri = f"{out_uri}/{relative}"
            with fs.open_input_file(f"{out_path}/{relative}") as stream:
                parquet_metadata = pq.read_metadata(stream)
            if not plan.checked:
                _check_pyarrow_schema_compatible(
                    schema, parquet_metadata.schema.to_arrow_schema(), format_version=metadata.format_version
                )
                plan.checked = True
            statistics = data_file_statistics_from_parquet_metadata(
                parquet_metadata=parquet_metadata,
                stats_columns=stats_plan,
                parquet_column_mapping=id_mapping,
            )
            data_file = DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=file_uri,
                file_format=FileFormat.PARQUET,
                partition=record,
                file_size_in_bytes=size,
                sort_order_id=None,
                equality_ids=None,
                key_metadata=None,
                **statistics.to_serialized_dict(),
            )
            # Not a field of the manifest struct: from_args would drop it (pyiceberg 0.12).
            data_file.spec_id = metadata.default_spec_id
            data_files.append(data_file)
        return data_files

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _quiet_task_size_warnings(spark: SparkSession) -> None:
    """createDataFrame ships the Arrow batches inside the tasks: Spark warns on every write."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.scheduler.TaskSetManager", jvm.org.apache.logging.log4j.Level.ERROR
        )
    except Exception:  # logging only; never fail start-up for it
        logger.debug("could not lower TaskSetManager log level", exc_info=True)


# --------------------------------------------------------------------------------------------
# Files


def _filesystem(table: Table, uri: str) -> tuple[pafs.FileSystem, str]:
    io = table.io
    if isinstance(io, PyArrowFileIO):
        scheme, netloc, path = PyArrowFileIO.parse_location(uri, io.properties)
        return io.fs_by_scheme(scheme, netloc), path
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


def _is_local(uri: str) -> bool:
    """A path on this machine's filesystem (plain path or file://), not an object store."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    return scheme in ("", "file")


def _spark_uri(uri: str) -> str:
    """Hadoop's S3 connector is s3a; Iceberg's files keep their s3:// URIs."""
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://") :]
    return uri


def _list_data_files(fs: pafs.FileSystem, root: str) -> Iterator[tuple[str, int]]:
    """(relative path, size) of every Parquet file under root; removes Hadoop's .crc files."""
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    for info in sorted(infos, key=lambda i: i.path):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(root) :].lstrip("/")
        base = info.base_name
        if base.startswith(".") and base.endswith(".crc"):
            fs.delete_file(info.path)
            continue
        if base.startswith(("_", ".")) or any(p.startswith(("_", ".")) for p in relative.split("/")[:-1]):
            raise SparkWriteError(f"unexpected file {relative!r} left in {root} after the Spark job")
        if not base.endswith(".parquet"):
            raise SparkWriteError(f"unexpected non-Parquet file {relative!r} in {root}")
        assert info.size is not None
        yield relative, info.size


def _place(local_fs: pafs.FileSystem, stage_path: str, fs: pafs.FileSystem, out_path: str, out_uri: str,
           n_files: int, *, move: bool = False) -> None:
    """Every file under ``stage_path`` to the same relative path under ``out_path`` of ``fs``
    (moved when that is a local path and ``move``, else copied); on failure nothing stays there."""
    try:
        for relative, _ in _list_data_files(local_fs, stage_path):
            target = f"{out_path}/{relative}"
            if fs.type_name == "local":  # object stores have no directories to make
                fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
                if move:
                    shutil.move(f"{stage_path}/{relative}", target)
                    continue
            pafs.copy_files(f"{stage_path}/{relative}", target, source_filesystem=local_fs, destination_filesystem=fs)
    except Exception as e:
        _delete_quietly(fs, out_path)
        raise SparkWriteError(f"could not upload {n_files} staged files to {out_uri}: {e}") from e


def _delete_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        if fs.get_file_info(path).type != pafs.FileType.NotFound:
            fs.delete_dir(path)
    except Exception:
        logger.warning("could not remove partial output %s", path, exc_info=True)


def _codec(properties: Mapping[str, str]) -> str:
    codec_name = properties.get("write.parquet.compression-codec", "zstd").lower()
    codec = _ICEBERG_CODECS.get(codec_name)
    if codec is None:
        raise ConfigError("write.parquet.compression-codec", codec_name, f"one of {', '.join(sorted(_ICEBERG_CODECS))}")
    return codec


def _parquet_options(properties: Mapping[str, str]) -> dict[str, str]:
    codec = _codec(properties)
    options = {"compression": codec}
    if (level := properties.get("write.parquet.compression-level")) is not None and codec == "zstd":
        options["parquet.compression.codec.zstd.level"] = level
    if (row_group := properties.get("write.parquet.row-group-size-bytes")) is not None:
        options["parquet.block.size"] = row_group
    if (page := properties.get("write.parquet.page-size-bytes")) is not None:
        options["parquet.page.size"] = page
    return options


def _arrow_parquet_options(properties: Mapping[str, str], bytes_per_row: int) -> dict[str, Any]:
    """``pq.write_table`` arguments for the table's write.parquet.* properties (row groups by
    the in-memory size of the rows, roughly)."""
    codec = _codec(properties)
    options: dict[str, Any] = {"compression": "none" if codec == "uncompressed" else codec}
    if (level := _int_property(properties, "write.parquet.compression-level")) is not None and codec == "zstd":
        options["compression_level"] = level
    if (row_group := _int_property(properties, "write.parquet.row-group-size-bytes")) is not None:
        options["row_group_size"] = max(1, row_group // bytes_per_row)
    if (page := _int_property(properties, "write.parquet.page-size-bytes")) is not None:
        options["data_page_size"] = page
    return options


def _int_property(properties: Mapping[str, str], key: str) -> int | None:
    text = properties.get(key)
    try:
        return None if text is None else int(text)
    except ValueError:
        raise ConfigError(key, text, "an integer") from None
