"""The committer's prepared manifest and manifest list writers (coordinator/iceberg_ext/manifest_writers.py):
the same bytes as pyiceberg 0.12's writers, one resolved writer per shape instead of one per
file, and a manifest list this process wrote is never read back by the next commit."""

from __future__ import annotations

import dataclasses
import os
from io import BytesIO
from pathlib import Path

import pyiceberg.avro.file as avro_file
import pytest
from pyiceberg import manifest as pyiceberg_manifest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile, DataFileContent, FileFormat, ManifestEntry, ManifestEntryStatus, ManifestWriter,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.update import snapshot as snapshot_module
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DateType, LongType, NestedField, StringType

from coordinator import committer
from coordinator.iceberg_ext import manifest_writers
from icesink.shared.catalogs import manifests_of
from tests.unit.test_coordinator_commit import TP, _accepted, rows

WIDE = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "day", DateType(), required=False),
              NestedField(3, "shop", StringType(), required=False))
BY_DAY_AND_SHOP = PartitionSpec(PartitionField(2, 1000, DayTransform(), "day_day"),
                                PartitionField(3, 1001, IdentityTransform(), "shop"), spec_id=1)
SYNC = b"0123456789abcdef"


def _entry(i: int, partition: Record) -> ManifestEntry:
    data_file = DataFile.from_args(
        content=DataFileContent.DATA, file_path=f"file:///wh/data/f{i}.parquet", file_format=FileFormat.PARQUET,
        partition=partition, record_count=10 + i, file_size_in_bytes=1000 + i,
        column_sizes={1: 10}, value_counts={1: 10 + i}, null_value_counts={1: 0},
        lower_bounds={1: (i).to_bytes(8, "little")}, upper_bounds={1: (i + 9).to_bytes(8, "little")},
    )
    data_file.spec_id = 0
    return ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=7, sequence_number=None,
                                   file_sequence_number=None, data_file=data_file)


def _write(writer: ManifestWriter, entries: list[ManifestEntry]) -> bytes:
    with writer:
        for e in entries:
            writer.add(e)
    writer.to_manifest_file()
    return Path(writer._output_file.location).read_bytes()


@pytest.fixture
def fixed_sync(monkeypatch):
    """The random sync marker of an Avro file, fixed, so two writers' bytes compare."""
    monkeypatch.setattr(os, "urandom", lambda n: SYNC[:n])


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("spec", [UNPARTITIONED_PARTITION_SPEC, BY_DAY_AND_SHOP], ids=["unpartitioned", "by-day-shop"])
def test_a_manifest_has_the_bytes_of_pyicebergs(tmp_path, fixed_sync, version, spec):
    io = PyArrowFileIO()
    partition = Record() if spec.is_unpartitioned() else Record(19000, "north")
    entries = [_entry(i, partition) for i in range(3)]
    for _ in range(2):  # the second time, from the prepared shape
        theirs = _write(pyiceberg_manifest.write_manifest(version, spec, WIDE, io.new_output(str(tmp_path / "a.avro")),
                                                          7, "deflate"), entries)
        ours = _write(manifest_writers.manifest_writer(version, spec, WIDE, io.new_output(str(tmp_path / "b.avro")),
                                                       7, "deflate"), entries)
        assert ours == theirs
        os.remove(tmp_path / "a.avro")
        os.remove(tmp_path / "b.avro")


@pytest.mark.parametrize("version", [1, 2])
def test_a_manifest_list_has_the_bytes_of_pyicebergs_and_is_remembered_as_read_back(tmp_path, fixed_sync, version):
    io = PyArrowFileIO()
    writer = pyiceberg_manifest.write_manifest(version, BY_DAY_AND_SHOP, WIDE, io.new_output(str(tmp_path / "m.avro")),
                                               7, "deflate")
    with writer:
        writer.add(_entry(1, Record(19000, "north")))
    manifests = [writer.to_manifest_file()]
    out: dict[str, bytes] = {}
    for name, make in (("theirs", pyiceberg_manifest.write_manifest_list),
                       ("ours", manifest_writers.write_manifest_list)):
        path = str(tmp_path / f"{name}.avro")
        with make(format_version=version, output_file=io.new_output(path), snapshot_id=7, parent_snapshot_id=3,
                  sequence_number=5, avro_compression="deflate") as list_writer:
            list_writer.add_manifests(manifests)
        out[name] = Path(path).read_bytes()
    assert out["ours"] == out["theirs"]
    ours_path = str(tmp_path / "ours.avro")
    remembered = manifests_of(_snapshot(ours_path), io)
    read_back = list(pyiceberg_manifest.read_manifest_list(io.new_input(ours_path)))
    assert remembered == read_back
    assert read_back[0].sequence_number == (5 if version == 2 else 0)


def _snapshot(manifest_list: str):  # type: ignore[no-untyped-def]
    from pyiceberg.table.snapshots import Snapshot

    return Snapshot(snapshot_id=7, parent_snapshot_id=3, sequence_number=5, manifest_list=manifest_list,
                    timestamp_ms=1, schema_id=0)


def test_every_snapshot_producer_writes_its_manifest_list_with_the_prepared_writer():
    assert snapshot_module.write_manifest_list is manifest_writers.write_manifest_list


def test_commits_to_alike_tables_resolve_no_avro_writer_per_file(two_tables, monkeypatch):
    """pyiceberg resolves an Avro writer tree for every manifest and manifest list it writes
    (with the entry schema rebuilt and converted to Avro JSON each time); the committer's come
    from one prepared shape per format version and partition type."""
    from pyiceberg.avro import resolver

    resolved: list[str] = []
    real = resolver.resolve_writer

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        resolved.append("resolve")
        return real(*args, **kwargs)

    for module in (avro_file, manifest_writers):
        monkeypatch.setattr(module, "resolve_writer", counted)
    manifest_writers._shapes.clear()
    table_a, table_b = two_tables.load_table("db.a"), two_tables.load_table("db.b")
    for offset in range(1, 4):
        for name, table in (("db.a", table_a), ("db.b", table_b)):
            accepted = _accepted(table, offset, f"{name[-1]}{offset}", [offset])
            accepted = dataclasses.replace(accepted, files={name: accepted.files["db.a"]})
            committer.commit_table(two_tables, name, [accepted], committer.RoundCommit(group="g", epoch=1, commit_id=f"r{offset}",
                                   positions={TP: offset}, valid_through_ms=None))
    assert len(resolved) == 2, resolved  # a manifest's shape and a manifest list's, once each
    assert rows(two_tables, "db.a") == 3 and rows(two_tables, "db.b") == 3


def test_a_commit_does_not_read_back_the_manifest_list_the_last_one_wrote(two_tables):
    """The next commit to a table carries its parent's manifests over: it knows them from
    writing the parent's manifest list, so that file is not read (here it is gone), and the
    table reads whole."""
    table = two_tables.load_table("db.a")
    cache = committer.TableCache()
    committer.commit_table(two_tables, "db.a", [_accepted(table, 1, "f1", [1, 2])], committer.RoundCommit(group="g", epoch=1,
                           commit_id="r1", positions={TP: 1}, valid_through_ms=None), tables=cache)
    first = two_tables.load_table("db.a").current_snapshot()
    assert first is not None
    os.remove(first.manifest_list.removeprefix("file://"))
    committer.commit_table(two_tables, "db.a", [_accepted(table, 2, "f2", [3])], committer.RoundCommit(group="g", epoch=1,
                           commit_id="r2", positions={TP: 2}, valid_through_ms=None), tables=cache)
    now = two_tables.load_table("db.a")
    assert sorted(now.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]


def test_the_encoder_writes_pyicebergs_varints_in_one_write_each():
    import random

    from pyiceberg.avro.encoder import BinaryEncoder

    rng = random.Random(5)
    edges = [0, 1, -1, 63, -64, 64, -65, 127, -128, 128, 8191, -8192, 8192, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]
    for value in edges + [rng.randint(-(2**63), 2**63 - 1) for _ in range(2000)] + [rng.randint(-300, 300) for _ in range(300)]:
        theirs, ours = BytesIO(), _CountingStream()
        BinaryEncoder(theirs).write_int(value)
        manifest_writers.AvroEncoder(ours).write_int(value)
        assert ours.getvalue() == theirs.getvalue(), value
        assert ours.writes == 1, value


class _CountingStream:
    def __init__(self) -> None:
        self._buffer = BytesIO()
        self.writes = 0

    def write(self, b: bytes) -> int:
        self.writes += 1
        return self._buffer.write(b)

    def getvalue(self) -> bytes:
        return self._buffer.getvalue()


def test_a_prepared_manifest_and_list_encode_everything_with_the_one_write_encoder(tmp_path, monkeypatch):
    """The header, every block and the block framing go through :class:`AvroEncoder` (pyiceberg's
    encoder writes one bytes object per byte of each varint)."""
    used: list[int] = []

    class Counting(manifest_writers.AvroEncoder):
        def write_int(self, integer: int) -> None:
            used.append(integer)
            super().write_int(integer)

    monkeypatch.setattr(manifest_writers, "AvroEncoder", Counting)
    monkeypatch.setattr(avro_file.BinaryEncoder, "write_int", _refuse)
    io = PyArrowFileIO()
    writer = manifest_writers.manifest_writer(2, BY_DAY_AND_SHOP, WIDE, io.new_output(str(tmp_path / "m.avro")),
                                              7, "deflate")
    _write(writer, [_entry(i, Record(19000, "north")) for i in range(20)])
    with manifest_writers.write_manifest_list(format_version=2, output_file=io.new_output(str(tmp_path / "l.avro")),
                                              snapshot_id=7, parent_snapshot_id=3, sequence_number=5,
                                              avro_compression="deflate") as list_writer:
        list_writer.add_manifests([writer.to_manifest_file()])
    assert len(used) > 20 * 10
    monkeypatch.undo()  # pyiceberg reads the files back with its own decoder
    assert len(list(writer.to_manifest_file().fetch_manifest_entry(io))) == 20


def _refuse(self, integer: int) -> None:
    raise AssertionError("pyiceberg's per-byte encoder was used")
