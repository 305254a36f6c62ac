"""Avro writers for a commit's manifests and manifest list, prepared once per shape.

For every manifest and manifest list it writes, pyiceberg 0.12 builds the entry schema (with
the table's partition type), converts it to Avro's JSON and resolves a writer tree for it:
a large share of a table commit's CPU, spent again for every table of a round routed to many
tables, although the shape only changes with the format version and the partition type
(see bench/README.md, commit_bench). The writers here do that once per shape and write the same bytes
(:class:`PreparedAvroFile`; only the random sync marker differs from file to file, as it does
in pyiceberg), with ints encoded in one write each (:class:`AvroEncoder`).

A manifest list written here is also remembered with the manifests it holds
(:func:`icesink.shared.catalogs.remember_manifests`), so the next commit to the table finds its
parent's manifests without reading the file it has just written.

:func:`manifest_writer` replaces pyiceberg's ``write_manifest`` for the committer's appends;
:func:`write_manifest_list` replaces ``write_manifest_list`` in
``pyiceberg.table.update.snapshot``, which every snapshot producer of this process calls
(:func:`install`, called by the composition root through :func:`coordinator.iceberg_ext.install`).
Pinned to pyiceberg 0.12's ``AvroOutputFile`` (its attributes,
``__enter__``, ``write_block`` and ``_write_header``), ``BinaryEncoder``,
``ManifestWriter.new_writer`` / ``_with_partition`` and ``ManifestListWriter.__enter__`` /
``add_manifests`` (pyproject.toml);
tests/unit/test_manifest_writers.py compares the bytes with pyiceberg's and fails if they change.
"""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, TypeVar

import pyiceberg.table.update.snapshot as _snapshot_module
from cachetools import LRUCache
from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.file import _SCHEMA_KEY, MAGIC, META_SCHEMA, SYNC_SIZE, AvroFileHeader, AvroOutputFile
from pyiceberg.avro.resolver import construct_writer, resolve_writer
from pyiceberg.avro.writer import Writer
from pyiceberg.io import OutputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION, MANIFEST_LIST_FILE_SCHEMAS, ManifestFile, ManifestListWriter, ManifestListWriterV1,
    ManifestListWriterV2, ManifestWriter, ManifestWriterV1, ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.typedef import StructProtocol, TableVersion
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from icesink.shared.catalogs import remember_manifests

__all__ = ["AvroEncoder", "PreparedAvroFile", "install", "installed", "manifest_writer", "write_manifest_list"]

D = TypeVar("D", bound=StructProtocol)

#: Shapes held: one per format version and partition type the process commits to.
SHAPES_HELD: Final = 256


@dataclass(frozen=True)
class _Shape:
    file_schema: Schema
    writer: Writer  # stateless: shared by every file of the shape, in any thread
    avro_json: str  # the file schema as Avro JSON, for the header


_shapes: LRUCache[tuple[Any, ...], _Shape] = LRUCache(maxsize=SHAPES_HELD)
_shapes_lock = threading.Lock()
_META_WRITER: Final = construct_writer(META_SCHEMA)


def _shape(key: tuple[Any, ...], file_schema: Callable[[], Schema], record_schema: Callable[[], Schema],
           schema_name: str) -> _Shape:
    with _shapes_lock:
        shape = _shapes.get(key)
    if shape is None:  # two threads may both build it: the same shape either way
        built = file_schema()
        shape = _Shape(
            built,
            resolve_writer(record_schema=record_schema(), file_schema=built),
            json.dumps(AvroSchemaConversion().iceberg_to_avro(built, schema_name=schema_name)),
        )
        with _shapes_lock:
            _shapes[key] = shape
    return shape


_ONE_BYTE: Final = tuple(bytes([i]) for i in range(0x80))


class AvroEncoder(BinaryEncoder):
    """pyiceberg's ``BinaryEncoder`` with Avro's zig-zag varint written in one call: pyiceberg
    writes a fresh one-byte ``bytes`` per byte of every int and long, and a manifest entry
    holds hundreds of them (file sizes, counts and the keys and lengths of every column's
    metrics). See bench/README.md, commit_bench."""

    def write_int(self, integer: int) -> None:
        datum = (integer << 1) ^ (integer >> 63)
        if 0 <= datum < 0x80:
            self._output_stream.write(_ONE_BYTE[datum])
            return
        out = bytearray()
        while datum & ~0x7F:
            out.append((datum & 0x7F) | 0x80)
            datum >>= 7
        out.append(datum)
        self._output_stream.write(bytes(out))


class PreparedAvroFile(AvroOutputFile[D]):
    """pyiceberg's ``AvroOutputFile`` with its writer and Avro schema JSON taken from a shape
    instead of resolved and converted for this file, and :class:`AvroEncoder` for its bytes."""

    def __init__(self, output_file: OutputFile, shape: _Shape, schema_name: str, metadata: dict[str, str]) -> None:
        # AvroOutputFile.__init__, but for resolve_writer
        self.output_file = output_file
        self.file_schema = shape.file_schema
        self.schema_name = schema_name
        self.sync_bytes = os.urandom(SYNC_SIZE)
        self.writer = shape.writer
        self.metadata = metadata
        self._avro_json = shape.avro_json

    def __enter__(self) -> PreparedAvroFile[D]:
        # AvroOutputFile.__enter__, but for the encoder
        self.output_stream = self.output_file.create(overwrite=True)
        self.encoder = AvroEncoder(self.output_stream)
        self._write_header()
        return self

    def write_block(self, objects: list[D]) -> None:
        # AvroOutputFile.write_block, but for the encoder
        in_memory = io.BytesIO()
        block_encoder = AvroEncoder(in_memory)
        for obj in objects:
            self.writer.write(block_encoder, obj)
        block_content = in_memory.getvalue()
        self.encoder.write_int(len(objects))
        if codec := self.compression_codec():
            content, content_length = codec.compress(block_content)
            self.encoder.write_int(content_length)
            self.encoder.write(content)
        else:
            self.encoder.write_int(len(block_content))
            self.encoder.write(block_content)
        self.encoder.write(self.sync_bytes)

    def _write_header(self) -> None:
        # AvroOutputFile._write_header, but for iceberg_to_avro and construct_writer(META_SCHEMA)
        codec_name = self.metadata.get(AVRO_CODEC_KEY, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT)
        if avro_codec_name := CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec_name):
            codec_name = avro_codec_name
        meta = {**self.metadata, _SCHEMA_KEY: self._avro_json, AVRO_CODEC_KEY: codec_name}
        _META_WRITER.write(self.encoder, AvroFileHeader(MAGIC, meta, self.sync_bytes))


class _PreparedManifest(ManifestWriter):
    def new_writer(self) -> AvroOutputFile[Any]:
        version = self.version
        # _with_partition depends on the format version and the partition type alone
        shape = _shape(("manifest", version, self._spec.partition_type(self._schema)),
                       lambda: self._with_partition(version), lambda: self._with_partition(DEFAULT_READ_VERSION),
                       "manifest_entry")
        return PreparedAvroFile(self._output_file, shape, "manifest_entry", self._meta)


class _ManifestV1(_PreparedManifest, ManifestWriterV1):
    pass


class _ManifestV2(_PreparedManifest, ManifestWriterV2):
    pass


def manifest_writer(format_version: TableVersion, spec: PartitionSpec, schema: Schema, output_file: OutputFile,
                    snapshot_id: int, avro_compression: Any) -> ManifestWriter:
    """pyiceberg's ``write_manifest``, with a prepared writer."""
    if format_version == 1:
        return _ManifestV1(spec, schema, output_file, snapshot_id, avro_compression)
    if format_version == 2:
        return _ManifestV2(spec, schema, output_file, snapshot_id, avro_compression)
    raise ValueError(f"Cannot write manifest for table version: {format_version}")


class _PreparedList(ManifestListWriter):
    _written: list[ManifestFile] | None = None

    def __enter__(self) -> ManifestListWriter:
        version = self._format_version
        shape = _shape(("manifest_list", version), lambda: MANIFEST_LIST_FILE_SCHEMAS[version],
                       lambda: MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION], "manifest_file")
        self._writer = PreparedAvroFile(self._output_file, shape, "manifest_file", self._meta)
        self._writer.__enter__()
        self._written = []
        return self

    def add_manifests(self, manifest_files: list[ManifestFile]) -> ManifestListWriter:
        prepared = [self.prepare_manifest(m) for m in manifest_files]
        self._writer.write_block(prepared)
        assert self._written is not None
        self._written.extend(prepared)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc_value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        super().__exit__(exc_type, exc_value, traceback)
        if exc_type is None and self._written is not None:  # the file is complete: what it holds
            remember_manifests(self._output_file.location, self._written)


class _ListV1(_PreparedList, ManifestListWriterV1):
    pass


class _ListV2(_PreparedList, ManifestListWriterV2):
    pass


def write_manifest_list(format_version: TableVersion, output_file: OutputFile, snapshot_id: int,
                        parent_snapshot_id: int | None, sequence_number: int | None,
                        avro_compression: Any) -> ManifestListWriter:
    """pyiceberg's ``write_manifest_list``, with a prepared writer; the list is remembered."""
    if format_version == 1:
        return _ListV1(output_file, snapshot_id, parent_snapshot_id, avro_compression)
    if format_version == 2:
        if sequence_number is None:
            raise ValueError(f"Sequence-number is required for V2 tables: {sequence_number}")
        return _ListV2(output_file, snapshot_id, parent_snapshot_id, sequence_number, avro_compression)
    raise ValueError(f"Cannot write manifest list for table version: {format_version}")


def install() -> None:
    """Every snapshot producer of this process writes its manifest list with
    :func:`write_manifest_list` (pyiceberg looks the function up in its module at each commit).
    Called by :func:`coordinator.iceberg_ext.install`, never on import."""
    _snapshot_module.write_manifest_list = write_manifest_list  # type: ignore[attr-defined]


def installed() -> bool:
    return _snapshot_module.write_manifest_list is write_manifest_list  # type: ignore[attr-defined]
