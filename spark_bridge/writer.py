"""Write Arrow tables as Iceberg data files with a long-lived Spark session.

Spark only writes plain Parquet files (no Iceberg runtime jar): this module turns an Arrow table
into files under ``<table location>/data/<file_prefix>/``, then reads each footer with pyarrow and
returns one pyiceberg :class:`DataFile` per file, ready for ``fast_append().append_data_file``.
A table whose ``write.format.default`` is ``orc`` or ``avro`` gets ORC or Avro files instead
(ORC: plain, read by the table's name mapping; Avro: Spark's AvroFileFormat, built into spark-sql
since Spark 4, writing Iceberg's own Avro schema, field ids included: spark_bridge/avro.py), with
column metrics from the ORC footer (spark_bridge/orc_stats.py) or record counts only (Avro) (:func:`_check_format` says which
tables cannot: pyarrow-only columns; with ORC timestamptz columns or no full name mapping; with
Avro maps of non-string keys).

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
   and no shuffle (far less CPU; see bench/README.md, spark_write_bench).
   An unpartitioned table gets ``ceil(bytes / target)`` files, each a run of neighbouring Arrow
   batches (``coalesce``, no shuffle).
4. List the output directory, read each footer, compute Iceberg metrics with pyiceberg's own
   functions, and map the file's directory back to its typed partition tuple.

A table with a column Spark has no type for (uuid, fixed[n]: see
:func:`spark_bridge.schema.arrow_only_column`), or with list or map columns but no name mapping
of its schema (a table created by another tool: Spark's files would have no ids there for
readers to find those columns by), is written by pyarrow instead of step 3
(:func:`spark_bridge.files.write_with_arrow`): same directories, same file sizes, every field id;
steps 1, 2 and 4, staging and clean-up are shared.

The session (:class:`~spark_bridge.session.SparkSessionOwner`) is blocking: run these calls
off the event loop, in one executor. Paths, Parquet options and footers are
spark_bridge/files.py, shared with compaction's rewrite (spark_bridge/rewrite.py).
"""

from __future__ import annotations

import logging
import math
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema, index_by_name
from pyiceberg.types import TimestamptzType
from pyspark.sql import types as st

from icesink.shared.errors import ConfigError, SparkWriteError
from spark_bridge import staging
from spark_bridge.avro import avro_schema, avro_unwritable, spark_types, utc_timestamps
from spark_bridge.files import (
    WRITE_OPTIONS, FooterPlan, delete_quietly, file_format, filesystem, parquet_options, place, read_data_files, spark_uri,
    spark_write_options, write_with_arrow, writer_properties,
)
from spark_bridge.labels import PartitionLabels, with_label_columns
from spark_bridge.schema import arrow_only_column, name_mapping_mismatch, requires_name_mapping, spark_schema
from spark_bridge.session import SparkSessionOwner, SparkSettings
from spark_bridge.warm_up import WarmUp

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_TARGET_FILE_SIZE_BYTES", "SparkFileWriter"]

logger = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE_BYTES = 128 * 1024 * 1024

_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")


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
    options: dict[str, str]  # Spark's Parquet or ORC options
    out_uri: str
    fs: pafs.FileSystem
    out_path: str
    properties: dict[str, str]  # what its files are written with (files.writer_properties)
    fmt: str = "parquet"  # Spark's data source: parquet, orc or files.AVRO_SOURCE (write.format.default)

    def group_key(self) -> tuple[str, ...]:
        """Writes with the same key can share one Spark job (SparkFileWriter.write_many)."""
        assert self.sp_schema is not None
        return (self.sp_schema.json(), self.fmt, *(lbl.column for lbl in self.labels), "|",
                *sorted(f"{k}={v}" for k, v in self.options.items()))


def _check_format(table: Table, fmt: str, arrow_only: tuple[str, Any] | None, unmapped: str | None) -> None:
    """Refuse ORC or Avro files (``fmt``) Spark cannot write as readers need them: only Spark writes
    them here (pyarrow's fallback writes Parquet); Spark's ORC writer stores no Iceberg field ids, so
    every column of an ORC file is found by the table's name mapping (auto-created tables have one);
    Avro files carry Iceberg's own schema, ids included (spark_bridge/avro.py)."""
    name = ".".join(table.name())
    if arrow_only is not None:
        raise ConfigError("write.format.default", fmt, f"parquet for table {name}: its column {arrow_only[0]!r} has "
                          f"type {arrow_only[1]}, which Spark cannot write, and pyarrow writes it as Parquet only")
    if fmt == "orc" and (column := _timestamptz_column(table.schema())) is not None:
        raise ConfigError("write.format.default", "orc", f"parquet for table {name}: its column {column!r} is a "
                          "timestamptz, which Iceberg reads from ORC's TIMESTAMP_INSTANT only, and Spark's ORC writer "
                          "writes its timestamps as ORC TIMESTAMP")
    if fmt == "avro" and (why := avro_unwritable(table.schema())) is not None:
        raise ConfigError("write.format.default", "avro", f"parquet or orc for table {name}: its {why}")
    if unmapped is not None:
        raise ConfigError(f"table {name} property schema.name-mapping.default", None,
                          f"a name mapping of every column with write.format.default={fmt} ({unmapped}): Spark's "
                          f"{fmt.upper()} files carry no Iceberg field ids, readers map their columns by name "
                          "(spark_bridge.schema.name_mapping_properties)")


def _timestamptz_column(schema: Schema) -> str | None:
    """The first timestamptz column (dotted path, nested ones included), or None."""
    by_name = sorted(index_by_name(schema).items(), key=lambda item: item[1])
    return next((n for n, i in by_name if isinstance(schema.find_type(i), TimestamptzType)), None)


class SparkFileWriter:
    """Writes Iceberg data files with one long-lived Spark session, which it owns."""

    def __init__(self, settings: SparkSettings, session: SparkSessionOwner | None = None) -> None:
        """``session``: a session for ``settings`` the caller made already (perhaps starting:
        icesink/app/cli.py asks for it before importing this module); else a new one."""
        if session is not None and session.settings is not settings:
            raise ValueError(f"session: expected one made with the writer's settings (app {settings.app_name}), "
                             f"found one for app {session.settings.app_name}")
        self.session = SparkSessionOwner(settings) if session is None else session
        self._warm = WarmUp(self.session, self._plain_write)
        self._arrow_tables: set[str] = set()  # tables logged as written with pyarrow

    @property
    def spark(self) -> SparkSession:
        return self.session.spark

    def start(self) -> None:
        """Create the session (blocking: a local session takes seconds), or wait for the start its
        maker began (``SparkSessionOwner.start_soon``: icesink/app/cli.py)."""
        self.session.start()

    def stop(self) -> None:
        # a warm-up write the stop cuts short is no error to log ("Aborting job", task failures)
        root = self._warm.root
        self.session.stop(quiet=self._warm.warming)
        if root is not None:  # its tasks may have written on after the warm-up's own clean-up
            shutil.rmtree(root, ignore_errors=True)

    def warm_up(self, idle: Callable[[], bool] = lambda: True) -> None:
        """A local session's throw-away writes (``write.warm-up-rows``; spark_bridge/warm_up.py).
        Separate from :meth:`start` so a replica is running, and can stop within its bound,
        while the JVM warms up; :meth:`stop` ends it between writes. ``idle``: whether the
        caller has no rows waiting for a write or being written, asked before each write (a
        real write then warms the JVM up as well, and a throw-away one beside it slows both: a
        round of 100k rows that waited for the session was committed 1.9-2.1 s after the start
        with the warm-up's first write beside its own, 1.6-1.8 s without; bench/README.md).
        A real write (:meth:`write`, :meth:`write_many`) cancels a warm-up write in flight."""
        s = self.session.settings
        if self.session.started and s.remote is None and s.warm_up_rows:
            if not idle():
                logger.info("spark warm-up skipped: rows wait for a write, which warms the JVM up instead")
                return
            self._warm.run(s.warm_up_rows, files=s.warm_up_files, idle=idle)

    def _plain_write(self, sp_schema: st.StructType, data: pa.Table, out_uri: str) -> None:
        """An unpartitioned Parquet write of ``data`` (the warm-up's)."""
        self._run_job(sp_schema, data, [], 1, data, DEFAULT_TARGET_FILE_SIZE_BYTES,
                      {**WRITE_OPTIONS, **parquet_options({})}, out_uri)

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
        with self._warm.real_write():  # a throw-away write in flight is cancelled (spark_bridge/warm_up.py)
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
        with self._warm.real_write():  # a throw-away write in flight is cancelled (spark_bridge/warm_up.py)
            return self._write_many(writes, target_file_size_bytes)

    def _write_many(self, writes: Sequence[tuple[Table, pa.Table, str]],
                    target_file_size_bytes: int) -> list[list[DataFile]]:
        planned = [self._plan(t, d, p, target_file_size_bytes) for t, d, p in writes]
        out: list[list[DataFile]] = [[] for _ in planned]
        groups: dict[tuple[str, ...], list[tuple[int, _Planned]]] = {}
        for i, w in enumerate(planned):
            if w is not None and w.sp_schema is not None and self.session.local:
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
                delete_quietly(w.fs, w.out_path)
            raise
        return out

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
        properties = writer_properties(table, self.session.settings.write_props)
        source, format_options = spark_write_options(properties)
        fmt = file_format(properties).name.lower()  # parquet, orc or avro
        needs_mapping = fmt == "orc" or (fmt == "parquet" and arrow_only is None and requires_name_mapping(schema))
        unmapped = name_mapping_mismatch(schema, metadata.name_mapping()) if needs_mapping else None
        if fmt != "parquet":
            _check_format(table, fmt, arrow_only, unmapped)
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
            if fmt == "avro":  # Iceberg's Avro schema; its timestamps from Spark's UTC ones (spark_bridge/avro.py)
                sp_schema = spark_types(sp_schema)
                format_options = {**format_options, "avroSchema": avro_schema(schema)}
            self.spark  # noqa: B018 - fails early when the session is not started

        data_root = metadata.properties.get("write.data.path", f"{table.location().rstrip('/')}/data")
        out_uri = f"{data_root.rstrip('/')}/{file_prefix}"
        fs, out_path = filesystem(table, out_uri)
        if fs.get_file_info(out_path).type != pafs.FileType.NotFound:
            raise FileExistsError(f"output directory {out_uri} already exists: each write needs a fresh file_prefix")
        labels: list[PartitionLabels] = []
        extended = data
        n_tuples = 1
        if not spec.is_unpartitioned():
            extended, labels, n_tuples = with_label_columns(data, spec, schema)
        if fmt == "avro" and sp_schema is not None:  # partition values from the rows as they are, first
            data, extended = utc_timestamps(data), utc_timestamps(extended)
        options = {**WRITE_OPTIONS, **format_options}
        return _Planned(table, data, extended, labels, n_tuples, sp_schema, arrow_schema, options, out_uri, fs, out_path,
                        properties, source)

    def _write_one(self, w: _Planned, target_file_size_bytes: int) -> list[DataFile]:
        def run_job(job_fs: pafs.FileSystem, job_path: str, job_uri: str) -> None:
            if w.sp_schema is None:
                assert w.arrow_schema is not None
                write_with_arrow(w.arrow_schema, w.extended, w.labels, w.data, target_file_size_bytes,
                                    w.properties, job_fs, job_path)
            else:
                self._run_job(w.sp_schema, w.extended, w.labels, w.n_tuples, w.data, target_file_size_bytes,
                              w.options, job_uri, w.fmt)

        if not self.session.settings.stages(w.out_uri):
            try:
                run_job(w.fs, w.out_path, w.out_uri)
                return read_data_files(w.table, w.fs, w.out_path, w.out_uri, w.labels, properties=w.properties)
            except FileExistsError:
                raise  # another writer's output: never delete it
            except Exception:
                delete_quietly(w.fs, w.out_path)
                raise

        # Staged: Spark writes locally; the footers are read there; then every file is uploaded.
        assert self.session.settings.staging_dir is not None
        stage_root = staging.scratch(self.session.settings.staging_dir, "icesink-stage-")
        stage_path = stage_root / "out"
        try:
            local_fs = pafs.LocalFileSystem()
            run_job(local_fs, str(stage_path), stage_path.as_uri())
            data_files = read_data_files(w.table, local_fs, str(stage_path), w.out_uri, w.labels, properties=w.properties)
            place(local_fs, str(stage_path), w.fs, w.out_path, w.out_uri, len(data_files))
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
        stage_root = staging.scratch(self.session.settings.staging_dir, "icesink-tables-")
        try:
            n_tasks = max(1, min(sum(w.n_tuples for w in group), self.session.settings.max_write_tasks,
                                 math.ceil(nbytes / self.session.settings.bytes_per_write_task)))
            per_file = max(1, target_file_size_bytes // max(1, math.ceil(nbytes / rows)))
            options = {**first.options, "maxRecordsPerFile": str(per_file)}
            try:
                frame = self.spark.createDataFrame(combined, schema=sp_schema)
                quoted = ["`" + c.replace("`", "``") + "`" for c in partition_columns]
                if n_tasks == 1:  # no shuffle: each core's task takes a run of whole tables (see above)
                    frame = frame.coalesce(max(1, min(len(group), self.spark.sparkContext.defaultParallelism)))
                else:
                    frame = frame.repartition(n_tasks, *quoted)
                frame.write.partitionBy(*partition_columns).options(**options).mode("error").format(first.fmt).save(
                    (stage_root / "out").as_uri())
            except Exception as e:
                raise SparkWriteError(f"Spark failed to write {rows} rows of {len(group)} tables: {e}") from e
            local_fs = pafs.LocalFileSystem()
            out: list[list[DataFile]] = []
            job: dict[tuple[Any, ...], FooterPlan] = {}
            try:
                for i, w in enumerate(group):
                    sub = f"{stage_root}/out/{column}={i}"
                    data_files = read_data_files(w.table, local_fs, sub, w.out_uri, w.labels, job=job,
                                                 properties=w.properties)
                    place(local_fs, sub, w.fs, w.out_path, w.out_uri, len(data_files), move=True)
                    out.append(data_files)
            except Exception:
                for w in group[: len(out)]:
                    delete_quietly(w.fs, w.out_path)
                raise
            return out
        finally:
            shutil.rmtree(stage_root, ignore_errors=True)

    def _run_job(
        self, sp_schema: st.StructType, extended: pa.Table, labels: Sequence[PartitionLabels], n_tuples: int,
        data: pa.Table, target_file_size_bytes: int, options: dict[str, str], out_uri: str, fmt: str = "parquet",
    ) -> None:
        """One Spark job writing ``extended`` (data plus label columns) under ``out_uri``."""
        spark = self.spark
        options = dict(options)
        try:
            if not labels:
                n_files = max(1, math.ceil(data.nbytes / target_file_size_bytes))
                frame = spark.createDataFrame(data, schema=sp_schema)
                # Merge neighbouring input slices (one per Arrow batch) into a task per file, without
                # a shuffle: each file is a run of consecutive rows. A round-robin shuffle cost more than
                # the write's CPU (bench/README.md, spark_write_bench); only when there are fewer slices than files (rows
                # of many kilobytes, or Spark Connect, whose slices are the server's) is it needed.
                slices = (len(data.to_batches(max_chunksize=self.session.batch_rows))
                          if self.session.batch_rows is not None and self.session.batch_rows > 0 else 1)
                writer = (frame.coalesce(n_files) if n_files <= slices else frame.repartition(n_files)).write
            else:
                columns = [lbl.column for lbl in labels]
                label_fields = [st.StructField(c, st.StringType(), True) for c in columns]
                frame = spark.createDataFrame(extended, schema=st.StructType([*sp_schema.fields, *label_fields]))
                # Each partition tuple must go to exactly one task, so to one file unless it holds
                # more than maxRecordsPerFile rows: one task for a small batch (no shuffle), else
                # hash-partition on the tuple.
                by_size = math.ceil(data.nbytes / self.session.settings.bytes_per_write_task)
                n_tasks = max(1, min(n_tuples, self.session.settings.max_write_tasks, by_size))
                if n_tasks == 1:
                    frame = frame.coalesce(1)
                else:
                    quoted = ["`" + c.replace("`", "``") + "`" for c in columns]  # dots are not nesting
                    frame = frame.repartition(n_tasks, *quoted)
                writer = frame.write.partitionBy(*columns)
                bytes_per_row = max(1, math.ceil(data.nbytes / data.num_rows))
                options["maxRecordsPerFile"] = str(max(1, target_file_size_bytes // bytes_per_row))
            writer.options(**options).mode("error").format(fmt).save(spark_uri(out_uri))
        except Exception as e:
            if "PATH_ALREADY_EXISTS" in str(e):  # another writer took this prefix meanwhile: not ours
                raise FileExistsError(f"output directory {out_uri} was created by another writer") from e
            raise SparkWriteError(f"Spark failed to write {data.num_rows} rows to {out_uri}: {e}") from e
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

