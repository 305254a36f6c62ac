"""Compaction's rewrite (coordinator/maintenance.py): Spark reads a partition's small data files,
drops the rows its position delete files name, and writes files of the target size.

:func:`rewrite_files` is the whole step. Spark reads the files itself (no row passes through
Python) with the table's current schema, matching Parquet columns by field id
(``spark.sql.parquet.fieldId.read.enabled``): renamed columns keep their values, added ones
read as null, ``int`` widens to ``long`` and ``float`` to ``double``, as Iceberg's schema
evolution says. The position deletes (small files, read with pyarrow) become a broadcast table
of ``(file name, row position)`` that the scan's ``_metadata.file_name`` and
``_metadata.row_index`` are anti-joined with. One task writes the surviving rows in their order,
``ceil(input bytes / target)`` files; their footers become DataFiles of the inputs' partition.

Spark cannot read every file faithfully by field id, so pyiceberg reads them instead (its scan
applies the same evolution and deletes) and :meth:`SparkFileWriter.write` writes them, when:
the table has list or map columns or columns only pyarrow writes (its files lack some ids, or
are written by pyarrow), a required field is nested in a struct, an input file has a column
without a field id (written by another tool), two inputs share a file name, or the Spark job
fails. The reason is logged. Either way the written rows are counted against the inputs' live
rows (records minus distinct deleted positions) and a mismatch fails the step, its files
deleted: a rewrite never changes the rows.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.manifest import DataFile, FileFormat
from pyiceberg.table import FileScanTask
from pyspark.sql import types as st

from icesink.shared.errors import SparkWriteError
from spark_bridge import staging
from spark_bridge.files import (
    WRITE_OPTIONS, delete_quietly, file_format, filesystem, is_local, parquet_options, place, read_data_files, spark_uri,
    writer_properties,
)
from spark_bridge.schema import arrow_only_column, requires_name_mapping, spark_schema
from spark_bridge.writer import SparkFileWriter

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import Column, DataFrame

__all__ = ["read_files", "rewrite_files"]

logger = logging.getLogger(__name__)

_FIELD_ID = b"PARQUET:field_id"
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def rewrite_files(
    writer: SparkFileWriter, table: Table, data_files: Sequence[DataFile], delete_files: Sequence[DataFile] = (),
    *, file_prefix: str, target_file_size_bytes: int,
) -> list[DataFile]:
    """The live rows of ``data_files`` (``delete_files`` applied) written again as files of
    the target size under ``<data>/<file_prefix>/``; raises :class:`SparkWriteError` if the
    written rows do not number the live rows (the new files are then deleted)."""
    name = ".".join(table.name())
    deleted = _deleted_positions(table, data_files, delete_files)
    expected = sum(f.record_count for f in data_files) - deleted.num_rows
    why = _why_pyiceberg_reads(writer, table, data_files)
    new: list[DataFile] | None = None
    if why is None:
        try:
            new = _spark_rewrite(writer, table, data_files, deleted, file_prefix, target_file_size_bytes, expected)
        except FileExistsError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyiceberg reads them instead; logged
            why = f"the Spark job failed ({type(exc).__name__}: {str(exc)[:500]})"
    if new is None:
        logger.info("%s: compaction reads %d files with pyiceberg: %s", name, len(data_files), why)
        data = read_files(table, data_files, delete_files)
        new = writer.write(table, data, file_prefix=file_prefix, target_file_size_bytes=target_file_size_bytes)
    written = sum(f.record_count for f in new)
    if written != expected:
        for f in new:
            _delete_file_quietly(table, f.file_path)
        raise SparkWriteError(
            f"{name}: compaction wrote {written} rows for the {expected} live rows of {len(data_files)} files "
            f"({deleted.num_rows} deleted by {len(delete_files)} delete files); its files were deleted")
    return new


def read_files(table: Table, files: Sequence[DataFile], deletes: Sequence[DataFile] = ()) -> pa.Table:
    """The live rows of ``files`` (position ``deletes`` applied) in the table's current schema,
    read by pyiceberg (schema evolution applied)."""
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    data = scan.to_table([FileScanTask(f, set(deletes)) for f in files])
    return data.cast(schema_to_pyarrow(table.schema()))


# --------------------------------------------------------------------------------------------


def _spark_rewrite(
    writer: SparkFileWriter, table: Table, data_files: Sequence[DataFile], deleted: pa.Table, prefix: str,
    target: int, expected: int,
) -> list[DataFile]:
    from pyspark.sql import functions as F

    spark = writer.spark
    settings = writer.session.settings
    local_spark = writer.session.local
    metadata = table.metadata
    data_root = metadata.properties.get("write.data.path", f"{table.location().rstrip('/')}/data")
    out_uri = f"{data_root.rstrip('/')}/{prefix}"
    fs, out_path = filesystem(table, out_uri)
    if fs.get_file_info(out_path).type != pafs.FileType.NotFound:
        raise FileExistsError(f"output directory {out_uri} already exists: each write needs a fresh file_prefix")
    scratch = staging.scratch(settings.staging_dir, "icesink-rewrite-")
    try:
        paths = _spark_inputs(table, data_files, scratch, local_spark)
        frame = spark.read.schema(spark_schema(table.schema(), field_ids=True)).parquet(*paths)
        columns = list(frame.columns)
        if deleted.num_rows:
            f_col, r_col = _fresh("icesink_file", columns), _fresh("icesink_row", columns)
            names = deleted.rename_columns([f_col, r_col])
            gone = F.broadcast(spark.createDataFrame(names))
            frame = (frame.select("*", F.col("_metadata.file_name").alias(f_col), F.col("_metadata.row_index").alias(r_col))
                     .join(gone, [f_col, r_col], "left_anti").select(*columns))
        frame = frame.select(*_required(frame, table))
        n_files = max(1, math.ceil(sum(f.file_size_in_bytes for f in data_files) / target))
        properties = writer_properties(table, settings.write_props)  # as the sink's own writes
        options = {**WRITE_OPTIONS, **parquet_options(properties),
                   "maxRecordsPerFile": str(max(1, math.ceil(expected / n_files)))}
        staged = settings.stages(out_uri)
        job_uri = (scratch / "out").as_uri() if staged else spark_uri(out_uri)
        try:
            frame.coalesce(1).write.options(**options).mode("error").parquet(job_uri)
            partition = data_files[0].partition
            if not staged:
                return read_data_files(table, fs, out_path, out_uri, [], partition=partition, properties=properties)
            local_fs = pafs.LocalFileSystem()
            new = read_data_files(table, local_fs, str(scratch / "out"), out_uri, [], partition=partition,
                                  properties=properties)
            place(local_fs, str(scratch / "out"), fs, out_path, out_uri, len(new), move=fs.type_name == "local")
            return new
        except FileExistsError:
            raise
        except Exception:
            delete_quietly(fs, out_path)
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _why_pyiceberg_reads(writer: SparkFileWriter, table: Table, data_files: Sequence[DataFile]) -> str | None:
    """Why Spark cannot rewrite these files by field id (None: it can)."""
    schema = table.schema()
    if file_format(writer_properties(table, writer.session.settings.write_props)) != FileFormat.PARQUET:
        return "the table writes ORC or Avro files (write.format.default), which the writer's path for them writes"
    if any(f.file_format != FileFormat.PARQUET for f in data_files):
        return "input files are ORC files, which carry no field ids (pyiceberg reads them by the name mapping)"
    if (arrow_only := arrow_only_column(schema)) is not None:
        return f"column {arrow_only[0]!r} has type {arrow_only[1]}, which Spark cannot write"
    if requires_name_mapping(schema):
        return "the table has list or map columns, whose Spark-written files lack field ids"
    for field in schema.fields:
        if _nested_required(field.field_type):
            return f"column {field.name!r} has a required nested field"
    names = [_base_name(f.file_path) for f in data_files]
    if len(set(names)) != len(names) or not all(_PLAIN_NAME.match(n) for n in names):
        return "input file names are not unique plain names (the deletes are matched by file name)"
    for f in data_files:
        file_fs, path = filesystem(table, f.file_path)
        with file_fs.open_input_file(path) as stream:
            missing = _without_field_id(pq.read_schema(stream))
        if missing is not None:
            return f"column {missing!r} of {f.file_path} has no field id (a file written by another tool)"
    return None


def _nested_required(t: Any) -> bool:
    from pyiceberg.types import StructType

    return isinstance(t, StructType) and any(c.required or _nested_required(c.field_type) for c in t.fields)


def _without_field_id(schema: pa.Schema) -> str | None:
    def visit(field: pa.Field, path: str) -> str | None:
        if not field.metadata or _FIELD_ID not in field.metadata:
            return path
        if pa.types.is_struct(field.type):
            for i in range(field.type.num_fields):
                child = field.type.field(i)
                if (found := visit(child, f"{path}.{child.name}")) is not None:
                    return found
        return None

    for field in schema:
        if (found := visit(field, field.name)) is not None:
            return found
    return None


def _spark_inputs(table: Table, data_files: Sequence[DataFile], scratch: Path, local_spark: bool) -> list[str]:
    """Paths Spark reads the inputs by: the files themselves, or (a local Spark, an object
    store) local copies under ``scratch`` with the same names."""
    if not local_spark or all(is_local(f.file_path) for f in data_files):
        return [spark_uri(f.file_path) for f in data_files]
    copies = scratch / "in"
    copies.mkdir()
    local_fs = pafs.LocalFileSystem()
    out = []
    for f in data_files:
        file_fs, path = filesystem(table, f.file_path)
        target = copies / _base_name(f.file_path)
        pafs.copy_files(path, str(target), source_filesystem=file_fs, destination_filesystem=local_fs)
        out.append(target.as_uri())
    return out


def _deleted_positions(table: Table, data_files: Sequence[DataFile], delete_files: Sequence[DataFile]) -> pa.Table:
    """Distinct ``(file name, row position)`` of ``data_files`` rows that ``delete_files`` delete."""
    schema = pa.schema([("file", pa.string()), ("pos", pa.int64())])
    if not delete_files:
        return schema.empty_table()
    by_path = {_normal(f.file_path): (_base_name(f.file_path), f.record_count) for f in data_files}
    parts = []
    for d in delete_files:
        file_fs, path = filesystem(table, d.file_path)
        with file_fs.open_input_file(path) as stream:
            rows = pq.read_table(stream, columns=["file_path", "pos"])
        paths = rows.column("file_path").unique().to_pylist()
        for p in paths:
            hit = by_path.get(_normal(p))
            if hit is None:
                continue
            pos = rows.filter(pc.equal(rows.column("file_path"), p)).column("pos")
            pos = pos.filter(pc.and_(pc.greater_equal(pos, 0), pc.less(pos, hit[1])))
            parts.append(pa.table([pa.array([hit[0]] * len(pos), pa.string()), pos.cast(pa.int64())], schema=schema))
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts).group_by(["file", "pos"]).aggregate([])


def _required(frame: DataFrame, table: Table) -> list[Column]:
    """The frame's columns, each required column of the table made non-nullable for Spark (a
    scan reads every column as nullable; the file must say REQUIRED as the table does): a null
    there fails the job; the literal after it is never used."""
    from pyspark.sql import functions as F

    out = []
    by_name = {f.name: f for f in frame.schema.fields}
    for field in table.schema().fields:
        spark_field = by_name[field.name]
        column = F.col(f"`{field.name.replace('`', '``')}`")
        if field.required:
            zero = _zero(spark_field.dataType)
            if zero is None:
                raise SparkWriteError(f"no way to keep required column {field.name!r} of type {spark_field.dataType} required")
            guard = F.when(column.isNull(), F.raise_error(F.lit(f"null in required column {field.name}"))).otherwise(column)
            column = F.coalesce(guard, zero)
        out.append(column.alias(field.name, metadata=spark_field.metadata))
    return out


def _zero(t: st.DataType) -> Column | None:
    """A non-null literal of type ``t``."""
    from pyspark.sql import functions as F

    if isinstance(t, (st.BooleanType, st.ByteType, st.ShortType, st.IntegerType, st.LongType, st.FloatType,
                      st.DoubleType, st.DecimalType, st.StringType)):
        return F.lit(0).cast(t)
    if isinstance(t, st.BinaryType):
        return F.lit("").cast(t)
    if isinstance(t, st.DateType):
        return F.lit(dt.date(1970, 1, 1))
    if isinstance(t, st.TimestampType):
        return F.lit(dt.datetime(1970, 1, 1, tzinfo=dt.UTC))
    if isinstance(t, st.TimestampNTZType):
        return F.lit(dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).cast(t)
    return None


def _fresh(name: str, taken: Sequence[str]) -> str:
    while name in taken:
        name += "_"
    return name


def _base_name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _normal(path: str) -> str:
    u = urlparse(path)
    return u.path if u.scheme in ("", "file") else u.netloc + u.path


def _delete_file_quietly(table: Table, path: str) -> None:
    try:
        table.io.delete(path)
    except Exception:  # noqa: BLE001 - an orphan for the sweep
        logger.warning("could not delete %s", path, exc_info=True)

