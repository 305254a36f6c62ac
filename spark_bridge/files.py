"""Data files on disk and in object stores, for the Spark writer (spark_bridge/writer.py) and
compaction's rewrite (spark_bridge/rewrite.py): where a table's files go (its FileIO's file
system), the table's Parquet options, listing and moving written files, reading their footers
into pyiceberg :class:`DataFile` values, and writing with pyarrow the tables Spark cannot write.

No Spark here: every function is plain pyarrow and pyiceberg, blocking.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.orc as orc
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    PyArrowFileIO,
    _check_pyarrow_schema_compatible,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from icesink.shared.errors import ConfigError, SparkWriteError
from icesink.shared.reference_keys import AVRO_CODECS, AVRO_LEVEL_WHY, FILE_FORMATS_WRITTEN, FORMAT_WHY, ORC_CODECS
from spark_bridge.orc_stats import orc_metrics
from spark_bridge.labels import PartitionLabels, parse_partition_dirs, partition_directories
from spark_bridge.uris import is_local, spark_uri

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

__all__ = [
    "AVRO_SOURCE", "WRITE_OPTIONS", "FooterPlan", "arrow_parquet_options", "delete_quietly", "file_format", "filesystem",
    "is_local", "list_data_files", "parquet_options", "place", "read_data_files", "spark_uri", "spark_write_options",
    "write_with_arrow", "writer_properties",
]

logger = logging.getLogger(__name__)

# Hadoop options passed with every write (they reach Spark Connect servers too).
WRITE_OPTIONS: dict[str, str] = {
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

_METRICS_PREFIX = "write.metadata.metrics."
#: The data file name endings Spark (and pyarrow) write, per format.
_EXTENSIONS = (".parquet", ".orc", ".avro")
#: Spark's Avro data source: built into spark-sql since Spark 4 (the class; the short name ``avro``
#: is only registered by the separate spark-avro module, which pyspark does not ship).
AVRO_SOURCE = "org.apache.spark.sql.avro.AvroFileFormat"
_ORC_TAIL_BYTES = 256 * 1024  # read at first: an ORC file's postscript and footer, but for very wide schemas
_FORMATS = {"parquet": FileFormat.PARQUET, "orc": FileFormat.ORC, "avro": FileFormat.AVRO}


@dataclass
class FooterPlan:
    """What reading a table's footers needs from its schema and properties (:func:`read_data_files`)."""

    stats: dict[int, Any]  # compute_statistics_plan
    ids: dict[str, int]  # parquet_path_to_id_mapping
    checked: bool = False  # the files' Parquet schema was checked against the table's


def filesystem(table: Table, uri: str) -> tuple[pafs.FileSystem, str]:
    io = table.io
    if isinstance(io, PyArrowFileIO):
        scheme, netloc, path = PyArrowFileIO.parse_location(uri, io.properties)
        return io.fs_by_scheme(scheme, netloc), path
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


def list_data_files(fs: pafs.FileSystem, root: str) -> Iterator[tuple[str, int]]:
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
        if not base.endswith(_EXTENSIONS):
            raise SparkWriteError(f"unexpected file {relative!r} in {root}: not Parquet, ORC nor Avro")
        assert info.size is not None
        yield relative, info.size


def place(local_fs: pafs.FileSystem, stage_path: str, fs: pafs.FileSystem, out_path: str, out_uri: str,
           n_files: int, *, move: bool = False) -> None:
    """Every file under ``stage_path`` to the same relative path under ``out_path`` of ``fs``
    (moved when that is a local path and ``move``, else copied); on failure nothing stays there.

    Moved, a stage directory on the same file system becomes ``out_path`` by one rename when
    that does not exist yet: no directory made and none removed per table and round. On ext4
    without a journal every file created for a minute after skips each removed inode, reading
    it: a round of 200 tables removed 200 directories, and its 600 commit files then cost up to
    0.9 ms of kernel CPU each (bench/README.md, "Files made and removed")."""
    try:
        listed = list(list_data_files(local_fs, stage_path))  # checked (and .crc removed) before any move
        if move and fs.type_name == "local" and _renamed(stage_path, out_path):
            return
        for relative, _ in listed:
            target = f"{out_path}/{relative}"
            if fs.type_name == "local":  # object stores have no directories to make
                fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
                if move:
                    shutil.move(f"{stage_path}/{relative}", target)
                    continue
            pafs.copy_files(f"{stage_path}/{relative}", target, source_filesystem=local_fs, destination_filesystem=fs)
    except Exception as e:
        delete_quietly(fs, out_path)
        raise SparkWriteError(f"could not upload {n_files} staged files to {out_uri}: {e}") from e


def _renamed(stage_path: str, out_path: str) -> bool:
    """``stage_path`` renamed to ``out_path`` (its parent made), or False: ``out_path`` exists
    (another writer's directory: files are moved into it one by one) or is on another device."""
    if os.path.lexists(out_path):
        return False
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    try:
        os.rename(stage_path, out_path)
    except OSError:  # EXDEV; or made meanwhile (ENOTEMPTY, EEXIST): the caller moves file by file
        return False
    return True


def delete_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        if fs.get_file_info(path).type != pafs.FileType.NotFound:
            fs.delete_dir(path)
    except Exception:
        logger.warning("could not remove partial output %s", path, exc_info=True)


def file_format(properties: Mapping[str, str]) -> FileFormat:
    """The format a table's files are written in (``write.format.default``; ConfigError for others)."""
    name = properties.get("write.format.default", "parquet")
    if name.lower() not in FILE_FORMATS_WRITTEN:
        raise ConfigError("write.format.default", name, FORMAT_WHY)
    return _FORMATS[name.lower()]


def spark_write_options(properties: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """Spark's data source (``parquet``, ``orc`` or :data:`AVRO_SOURCE`) and its write options for the
    table's properties: ``write.parquet.*`` (:func:`parquet_options`), ``write.orc.compression-codec``
    (Iceberg's default zlib) or ``write.avro.compression-codec`` (Iceberg's default gzip: Avro's deflate)."""
    fmt = file_format(properties)
    if fmt == FileFormat.PARQUET:
        return "parquet", parquet_options(properties)
    if fmt == FileFormat.AVRO:
        avro_codec = properties.get("write.avro.compression-codec", "gzip").lower()
        if avro_codec not in AVRO_CODECS:
            raise ConfigError("write.avro.compression-codec", avro_codec, f"one of {', '.join(AVRO_CODECS)}")
        if (level := properties.get("write.avro.compression-level")) is not None:
            raise ConfigError("write.avro.compression-level", level, AVRO_LEVEL_WHY)
        return AVRO_SOURCE, {"compression": AVRO_CODECS[avro_codec]}
    codec = properties.get("write.orc.compression-codec", "zlib").lower()
    if codec not in ORC_CODECS:
        raise ConfigError("write.orc.compression-codec", codec, f"one of {', '.join(ORC_CODECS)}")
    return "orc", {"compression": codec}


def _codec(properties: Mapping[str, str]) -> str:
    if file_format(properties) != FileFormat.PARQUET:
        raise ConfigError("write.format.default", properties["write.format.default"],
                          "parquet for Parquet options (spark_write_options gives an ORC or Avro table's)")
    codec_name = properties.get("write.parquet.compression-codec", "zstd").lower()
    codec = _ICEBERG_CODECS.get(codec_name)
    if codec is None:
        raise ConfigError("write.parquet.compression-codec", codec_name, f"one of {', '.join(sorted(_ICEBERG_CODECS))}")
    return codec


def parquet_options(properties: Mapping[str, str]) -> dict[str, str]:
    codec = _codec(properties)
    options = {"compression": codec}
    if (level := properties.get("write.parquet.compression-level")) is not None and codec == "zstd":
        options["parquet.compression.codec.zstd.level"] = level
    if (row_group := properties.get("write.parquet.row-group-size-bytes")) is not None:
        options["parquet.block.size"] = row_group
    if (page := properties.get("write.parquet.page-size-bytes")) is not None:
        options["parquet.page.size"] = page
    if (dictionary := properties.get("write.parquet.dict-size-bytes")) is not None:
        options["parquet.dictionary.page.size"] = dictionary
    return options


def arrow_parquet_options(properties: Mapping[str, str], bytes_per_row: int) -> dict[str, Any]:
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
    if (dictionary := _int_property(properties, "write.parquet.dict-size-bytes")) is not None:
        options["dictionary_pagesize_limit"] = dictionary
    return options


def writer_properties(table: Table, write_props: Mapping[str, str]) -> dict[str, str]:
    """The properties a table's files are written with: its own, then ``iceberg.tables.write-props.*``,
    which win (as the reference's writer takes them)."""
    return {**table.metadata.properties, **write_props} if write_props else dict(table.metadata.properties)


def _int_property(properties: Mapping[str, str], key: str) -> int | None:
    text = properties.get(key)
    try:
        return None if text is None else int(text)
    except ValueError:
        raise ConfigError(key, text, "an integer") from None


def write_with_arrow(
    arrow_schema: pa.Schema, extended: pa.Table, labels: Sequence[PartitionLabels], data: pa.Table,
    target_file_size_bytes: int, properties: Mapping[str, str], fs: pafs.FileSystem, root: str,
) -> None:
    """pyarrow instead of Spark (``SparkFileWriter._run_job``) for a table with columns Spark
    cannot write: the same layout (a ``label=value`` directory per partition tuple, escaped like Spark),
    one file per tuple split past the target size, the table's codec, every field id."""
    bytes_per_row = max(1, math.ceil(data.nbytes / data.num_rows))
    options = arrow_parquet_options(properties, bytes_per_row)
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


def read_data_files(
    table: Table, fs: pafs.FileSystem, out_path: str, out_uri: str, labels: Sequence[PartitionLabels],
    *, partition: Record | None = None, job: dict[tuple[Any, ...], FooterPlan] | None = None,
    properties: Mapping[str, str] | None = None,
) -> list[DataFile]:
    """A DataFile per Parquet file under ``out_path``, its partition from its directories
    (``labels``), or ``partition`` for every file. ``job``: shared by the tables one Spark job
    wrote (``SparkFileWriter._write_group``; their files have one Parquet schema), so tables
    alike in schema and metrics settings share their statistics plan and one schema check.
    ``properties``: what the files were written with (:func:`writer_properties`; the table's own
    by default): their write.metadata.metrics.* modes give each column's metrics."""
    metadata = table.metadata
    schema = table.schema()
    props = dict(metadata.properties if properties is None else properties)
    metrics = tuple(sorted((k, v) for k, v in props.items() if k.startswith(_METRICS_PREFIX)))
    plan_key = (str(schema), metadata.format_version, metrics)  # str(schema) names every field id and type
    plan = job.get(plan_key) if job is not None else None
    if plan is None:
        plan = FooterPlan(compute_statistics_plan(schema, props), parquet_path_to_id_mapping(schema))
        if job is not None:
            job[plan_key] = plan
    stats_plan, id_mapping = plan.stats, plan.ids
    fmt = file_format(props)
    records: dict[tuple[str | None, ...], Record] = {}
    data_files: list[DataFile] = []
    for relative, size in list_data_files(fs, out_path):
        *dirs, _ = relative.split("/")
        key = parse_partition_dirs(dirs, labels, relative) if partition is None else ()
        record = records.get(key) if partition is None else partition
        if record is None:
            record = Record(*[None if lbl is None else p.values[lbl] for lbl, p in zip(key, labels, strict=True)])
            records[key] = record
        file_uri = f"{out_uri}/{relative}"
        if fmt != FileFormat.PARQUET:
            data_files.append(_counted_data_file(fmt, fs, f"{out_path}/{relative}", file_uri, record, size,
                                                 metadata.default_spec_id, schema, stats_plan))
            continue
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


def _counted_data_file(fmt: FileFormat, fs: pafs.FileSystem, path: str, uri: str, partition: Record, size: int,
                       spec_id: int, schema: Schema, plan: dict[int, Any]) -> DataFile:
    """An ORC or Avro file's DataFile. ORC: its record count and column metrics from its footer's
    statistics, by the table's metrics modes (spark_bridge/orc_stats.py); Avro: its record count
    (the blocks'), no column metrics. Readers find an ORC file's columns by the table's name mapping
    (Spark's ORC writer stores no Iceberg ids); Avro files carry Iceberg's schema, ids included."""
    with fs.open_input_file(path) as stream:
        if fmt == FileFormat.ORC:
            stats = _orc_stats(stream, path, size, schema, plan)
        else:
            stats = {"record_count": avro_record_count(stream)}
    data_file = DataFile.from_args(
        content=DataFileContent.DATA, file_path=uri, file_format=fmt, partition=partition,
        file_size_in_bytes=size, sort_order_id=None, equality_ids=None, key_metadata=None, **stats,
    )
    data_file.spec_id = spec_id
    return data_file


def _orc_stats(stream: Any, path: str, size: int, schema: Schema, plan: dict[int, Any]) -> dict[str, Any]:
    """An ORC file's record count and column metrics (spark_bridge/orc_stats.py); its record count
    alone, logged, when its tail cannot be read here (a codec or layout this reader lacks)."""
    tail = min(size, _ORC_TAIL_BYTES)
    stream.seek(size - tail)
    data = stream.read(tail)
    try:
        try:
            return orc_metrics(data, schema, plan)
        except ValueError:  # a footer longer than the tail read, say
            stream.seek(0)
            return orc_metrics(stream.read(), schema, plan)
    except Exception as exc:  # noqa: BLE001 - metrics are optional; the count is not
        logger.warning("ORC file %s: no column metrics (%s: %s); its record count only", path, type(exc).__name__, exc)
        stream.seek(0)
        return {"record_count": orc.ORCFile(stream).nrows}


def avro_record_count(stream: Any) -> int:
    """The records of an Avro object container file: the sum of its blocks' counts, each block
    skipped by its byte size (no codec needed, nothing decoded). ``stream``: seekable, binary."""
    end = stream.seek(0, 2)
    stream.seek(0)
    if stream.read(4) != b"Obj\x01":
        raise SparkWriteError("not an Avro object container file (no Obj\\x01 magic)")
    while True:  # the header's metadata map: blocks of string keys and bytes values
        entries = _avro_long(stream)
        if entries is None or entries == 0:
            break
        if entries < 0:
            _avro_long(stream)  # the block's byte size
            entries = -entries
        for _ in range(2 * entries):
            stream.seek(_avro_long(stream) or 0, 1)
    stream.seek(16, 1)  # sync marker
    total = 0
    while (count := _avro_long(stream)) is not None:
        total += count
        if stream.seek((_avro_long(stream) or 0) + 16, 1) > end:  # the block's bytes, then its sync marker
            raise SparkWriteError("truncated Avro file: its last block runs past the end")
    return total


def _avro_long(stream: Any) -> int | None:
    """The Avro long (zig-zag varint) at the stream's position; None at the end of the stream."""
    shift = result = 0
    while True:
        byte = stream.read(1)
        if not byte:
            if shift:
                raise SparkWriteError("truncated Avro file: a varint runs past the end")
            return None
        value = int(byte[0])
        result |= (value & 0x7F) << shift
        if not value & 0x80:
            return (result >> 1) ^ -(result & 1)
        shift += 7
