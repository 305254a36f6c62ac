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
   An unpartitioned table gets ``ceil(bytes / target)`` files.
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
import uuid
from pathlib import Path
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
from pyiceberg.partitioning import PartitionField, PartitionSpec, partition_record_value
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyspark.sql import types as st

from icesink.errors import ConfigError, SparkWriteError
from spark_bridge.partitioning import partition_values
from spark_bridge.schema import arrow_only_column, name_mapping_mismatch, requires_name_mapping, spark_schema

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_TARGET_FILE_SIZE_BYTES", "SparkFileWriter", "SparkSettings"]

logger = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE_BYTES = 128 * 1024 * 1024

# Spark's name for a null (or empty) partition value.
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# SQL confs every session gets; all are runtime confs, so they also apply to Spark Connect.
_RUNTIME_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.fieldId.write.enabled": "true",
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
_SPARK_ESCAPED = frozenset(
    [chr(c) for c in range(0x01, 0x20)]
    + ['"', "#", "%", "'", "*", "/", ":", "=", "?", "\\", "\x7f", "{", "[", "]", "^"]
)
_UNESCAPE_RE = re.compile(r"%([0-9A-Fa-f]{2})")


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
    staging_dir: str | None = None  # owned by this writer: emptied on start

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

    def stages(self, location: str) -> bool:
        """Whether files for ``location`` are written locally first and then uploaded."""
        if self.staging_dir is None or self.stage == "never":
            return False
        if self.stage == "always":
            return True
        local_spark = self.remote is None and self.master.startswith("local")
        return local_spark and not _is_local(location)


@dataclass(frozen=True)
class _PartitionLabels:
    """Per partition field: the hidden column's name and label -> partition value."""

    column: str
    values: dict[str, Any]  # label -> value as stored in the partition Record


class SparkFileWriter:
    """Owns one long-lived Spark session and writes Iceberg data files with it."""

    def __init__(self, settings: SparkSettings) -> None:
        settings.validate()
        self._settings = settings
        self._spark: SparkSession | None = None
        self._arrow_tables: set[str] = set()  # tables logged as written with pyarrow

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
            # Only this writer uses its staging directory: what is left there is from a crash.
            shutil.rmtree(s.staging_dir, ignore_errors=True)
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
            # A local session talks only to itself: keep its driver on loopback.
            loopback = (
                {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
                if s.master.startswith("local") else {}
            )
            for key, value in {**_LOCAL_CONF, **loopback, **_RUNTIME_CONF, **s.conf}.items():
                builder = builder.config(key, value)
            spark = builder.getOrCreate()
            spark.sparkContext.setLogLevel("WARN")
            _quiet_task_size_warnings(spark)
        self._spark = spark
        logger.info("spark session started (%s)", s.remote or s.master)

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
            return []
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

        options = {**_WRITE_OPTIONS, **_parquet_options(metadata.properties)}
        labels: list[_PartitionLabels] = []
        extended = data
        n_tuples = 1
        if not spec.is_unpartitioned():
            extended, labels, n_tuples = _with_label_columns(data, spec, schema)

        def run_job(job_fs: pafs.FileSystem, job_path: str, job_uri: str) -> None:
            if by_arrow:
                self._run_arrow_job(
                    arrow_schema, extended, labels, data, target_file_size_bytes, metadata.properties, job_fs, job_path
                )
            else:
                self._run_job(sp_schema, extended, labels, n_tuples, data, target_file_size_bytes, options, job_uri)

        if not self._settings.stages(out_uri):
            try:
                run_job(fs, out_path, out_uri)
                return self._data_files(table, fs, out_path, out_uri, labels)
            except FileExistsError:
                raise  # another writer's output: never delete it
            except Exception:
                _delete_quietly(fs, out_path)
                raise

        # Staged: Spark writes locally; the footers are read there; then every file is uploaded.
        assert self._settings.staging_dir is not None
        stage_root = Path(self._settings.staging_dir).resolve() / uuid.uuid4().hex
        stage_path = stage_root / file_prefix
        try:
            local_fs = pafs.LocalFileSystem()
            run_job(local_fs, str(stage_path), stage_path.as_uri())
            data_files = self._data_files(table, local_fs, str(stage_path), out_uri, labels)
            try:
                for relative, _ in _list_data_files(local_fs, str(stage_path)):
                    if fs.type_name == "local":  # object stores have no directories to make
                        fs.create_dir(f"{out_path}/{relative}".rsplit("/", 1)[0], recursive=True)
                    pafs.copy_files(
                        str(stage_path / relative), f"{out_path}/{relative}",
                        source_filesystem=local_fs, destination_filesystem=fs,
                    )
            except Exception as e:
                _delete_quietly(fs, out_path)
                raise SparkWriteError(f"could not upload {len(data_files)} staged files to {out_uri}: {e}") from e
            return data_files
        finally:
            shutil.rmtree(stage_root, ignore_errors=True)

    def _run_job(
        self, sp_schema: st.StructType, extended: pa.Table, labels: Sequence[_PartitionLabels], n_tuples: int,
        data: pa.Table, target_file_size_bytes: int, options: dict[str, str], out_uri: str,
    ) -> None:
        """One Spark job writing ``extended`` (data plus label columns) under ``out_uri``."""
        spark = self.spark
        options = dict(options)
        try:
            if not labels:
                n_files = max(1, math.ceil(data.nbytes / target_file_size_bytes))
                frame = spark.createDataFrame(data, schema=sp_schema)
                # One file: merge the input slices without a shuffle. More: balance rows round-robin.
                writer = (frame.coalesce(1) if n_files == 1 else frame.repartition(n_files)).write
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
        arrow_schema: pa.Schema, extended: pa.Table, labels: Sequence[_PartitionLabels], data: pa.Table,
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
            for directory, indices in _partition_directories(extended, labels):
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
        self, table: Table, fs: pafs.FileSystem, out_path: str, out_uri: str, labels: Sequence[_PartitionLabels]
    ) -> list[DataFile]:
        metadata = table.metadata
        schema = table.schema()
        stats_plan = compute_statistics_plan(schema, metadata.properties)
        id_mapping = parquet_path_to_id_mapping(schema)
        records: dict[tuple[str | None, ...], Record] = {}
        data_files: list[DataFile] = []
        checked_schema = False
        for relative, size in _list_data_files(fs, out_path):
            *dirs, _ = relative.split("/")
            key = _parse_partition_dirs(dirs, labels, relative)
            record = records.get(key)
            if record is None:
                record = Record(*[None if lbl is None else p.values[lbl] for lbl, p in zip(key, labels, strict=True)])
                records[key] = record
            file_uri = f"{out_uri}/{relative}"
            with fs.open_input_file(f"{out_path}/{relative}") as stream:
                parquet_metadata = pq.read_metadata(stream)
            if not checked_schema:
                _check_pyarrow_schema_compatible(
                    schema, parquet_metadata.schema.to_arrow_schema(), format_version=metadata.format_version
                )
                checked_schema = True
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
# Partition labels: Iceberg-like directory names that map back to exactly one value.


def spark_escape(text: str) -> str:
    """Spark's ``ExternalCatalogUtils.escapePathName``."""
    return "".join(f"%{ord(c):02X}" if c in _SPARK_ESCAPED else c for c in text)


def spark_unescape(text: str) -> str:
    return _UNESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), text)


def _label_column_names(spec: PartitionSpec, data_columns: Sequence[str]) -> list[str]:
    """The partition field's name, unless a data column has it (identity): then a suffix."""
    taken = set(data_columns)
    names: list[str] = []
    for pf in spec.fields:
        name = pf.name
        if name in taken:
            base = f"{pf.name}_{'identity' if str(pf.transform) == 'identity' else 'part'}"
            name, k = base, 0
            while name in taken:
                k += 1
                name = f"{base}_{k}"
        taken.add(name)
        names.append(name)
    return names


def _assign_labels(pf: PartitionField, schema: Schema, values: list[Any]) -> tuple[list[str | None], dict[str, Any]]:
    """A label per distinct value (None for null), unique and never empty or Spark's null name."""
    source_type = schema.find_field(pf.source_id).field_type
    stored = [None if v is None else partition_record_value(pf, v, schema) for v in values]
    human = [None if v is None else pf.transform.to_human_string(source_type, v) for v in stored]
    out: list[str | None] = [None] * len(values)
    used: set[str] = set()
    # Natural names first, so real values keep them; then the ones that need a suffix.
    for i, h in enumerate(human):
        if h is not None and h not in ("", HIVE_DEFAULT_PARTITION) and h not in used:
            out[i] = h
            used.add(h)
    for i, h in enumerate(human):
        if h is not None and out[i] is None:
            k = 1
            while f"{h}~{k}" in used:
                k += 1
            out[i] = f"{h}~{k}"
            used.add(f"{h}~{k}")
    mapping = {label: value for label, value in zip(out, stored, strict=True) if label is not None}
    return out, mapping


def _with_label_columns(
    data: pa.Table, spec: PartitionSpec, schema: Schema
) -> tuple[pa.Table, list[_PartitionLabels], int]:
    values = partition_values(data, spec, schema)
    names = _label_column_names(spec, data.column_names)
    labels: list[_PartitionLabels] = []
    extended = data
    for pf, name, column in zip(spec.fields, names, values.columns, strict=True):
        distinct = pc.unique(column)
        label_list, mapping = _assign_labels(pf, schema, distinct.to_pylist())
        index = pc.index_in(column, value_set=distinct, skip_nulls=False)
        extended = extended.append_column(name, pa.array(label_list, pa.string()).take(index))
        labels.append(_PartitionLabels(column=name, values=mapping))
    n_tuples = extended.select(names).group_by(names).aggregate([]).num_rows
    return extended, labels, n_tuples


def _partition_directories(
    extended: pa.Table, labels: Sequence[_PartitionLabels]
) -> Iterator[tuple[str, pa.Array | None]]:
    """(relative directory, row indices) per partition tuple, the way Spark names them
    (``col=label/...``, escaped, ``__HIVE_DEFAULT_PARTITION__`` for null); ("", None): all rows."""
    if not labels:
        yield "", None
        return
    segments: list[pa.Array] = []
    for lbl in labels:
        column = extended.column(lbl.column).combine_chunks()
        distinct = pc.unique(column)
        names = [
            f"{spark_escape(lbl.column)}={HIVE_DEFAULT_PARTITION if v is None else spark_escape(v)}"
            for v in distinct.to_pylist()
        ]
        segments.append(pa.array(names, pa.string()).take(pc.index_in(column, value_set=distinct, skip_nulls=False)))
    encoded = pc.dictionary_encode(pc.binary_join_element_wise(*segments, "/"))
    codes = encoded.indices.to_numpy()
    order = np.argsort(codes, kind="stable")
    bounds = np.cumsum(np.bincount(codes, minlength=len(encoded.dictionary)))
    for code, directory in enumerate(encoded.dictionary.to_pylist()):
        start = 0 if code == 0 else int(bounds[code - 1])
        yield directory, pa.array(order[start : int(bounds[code])])


def _parse_partition_dirs(
    dirs: Sequence[str], labels: Sequence[_PartitionLabels], relative: str
) -> tuple[str | None, ...]:
    if len(dirs) != len(labels):
        raise SparkWriteError(f"unexpected file {relative!r}: expected {len(labels)} partition directories")
    key: list[str | None] = []
    for part, lbl in zip(dirs, labels, strict=True):
        name, sep, value = part.partition("=")
        if not sep or spark_unescape(name) != lbl.column:
            raise SparkWriteError(f"unexpected directory {part!r} in {relative!r}: expected {lbl.column}=<value>")
        if value == HIVE_DEFAULT_PARTITION:
            key.append(None)
            continue
        label = spark_unescape(value)
        if label not in lbl.values:
            raise SparkWriteError(f"directory {part!r} in {relative!r} names no partition value of this write")
        key.append(label)
    return tuple(key)


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
