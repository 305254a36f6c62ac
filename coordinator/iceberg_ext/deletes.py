"""Position deletes for mirror tables, the coordinator's half of the representation (format
version 2, merge-on-read; never equality deletes: pyiceberg 0.12 refuses to read them).

A position delete file is Parquet with ``file_path`` (string, field id 2147483546) and ``pos``
(long, field id 2147483545), sorted by path then position; it applies to the rows of data files
whose data sequence number is at most its own, so it may sit in the same snapshot as new data.
pyiceberg 0.12 can read such files but has no public API to write them: :class:`DeletesManifest`
is its V2 manifest writer with DELETES content, and :func:`add_position_deletes` adds one
manifest of delete files to a snapshot producer (a fast append), so a round's data files and
its deletes go into one snapshot. Pinned to pyiceberg 0.12's ``ManifestWriterV2`` and
``_SnapshotProducer._manifests`` / ``new_manifest_output`` (pyproject.toml); the tests in
tests/unit/test_position_deletes.py fail if they change.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import (
    DataFile, DataFileContent, FileFormat, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.table import Table
from pyiceberg.typedef import Record

if TYPE_CHECKING:
    from pyiceberg.table.update.snapshot import _SnapshotProducer

    _Producer = _SnapshotProducer[Any]
else:
    _Producer = object  # at run time the mixin adds nothing but its methods

__all__ = ["DELETE_SCHEMA", "DeletesManifest", "WithPositionDeletes", "add_position_deletes", "write_position_deletes"]

FILE_PATH_ID = 2147483546
POS_ID = 2147483545
DELETE_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
    pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
])


class DeletesManifest(ManifestWriterV2):
    """A V2 manifest of delete files (``content`` DELETES in the manifest list and its metadata)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def write_position_deletes(
    table: Table, deletes: pa.Table, partition: Record | None = None, spec_id: int | None = None,
    prefix: str = "delete",
) -> DataFile:
    """Write ``deletes`` (columns ``file_path``, ``pos``) as one position delete file under the
    table's data location and describe it for a commit. A position delete file belongs to one
    partition: every deleted row's data file must be of ``partition`` under spec ``spec_id``
    (default: unpartitioned, the table's default spec). ``prefix`` starts its name (the
    coordinator's fence: icesink/shared/protocol/fences.py)."""
    if table.format_version < 2:
        raise ValueError(f"table {'.'.join(table.name())}: position deletes need format version 2, "
                         f"found {table.format_version}")
    rows = deletes.select(["file_path", "pos"]).cast(DELETE_SCHEMA)
    rows = rows.take(pc.sort_indices(rows, sort_keys=[("file_path", "ascending"), ("pos", "ascending")]))
    path = table.location_provider().new_data_location(f"{prefix}-{uuid.uuid4()}.parquet")
    output = table.io.new_output(path)
    with output.create() as stream:
        pq.write_table(rows, stream)
    size = len(table.io.new_input(path))
    df = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=path, file_format=FileFormat.PARQUET,
        partition=partition if partition is not None else Record(), record_count=rows.num_rows,
        file_size_in_bytes=size,
    )
    df.spec_id = table.metadata.default_spec_id if spec_id is None else spec_id  # from_args does not keep it
    return df


def add_position_deletes(producer: _SnapshotProducer[Any], delete_files: Iterable[DataFile]) -> list[ManifestFile]:
    """DELETES manifests listing ``delete_files`` as added in ``producer``'s snapshot (a
    pyiceberg snapshot producer inside its ``_manifests``): one per partition spec."""
    by_spec: dict[int, list[DataFile]] = {}
    for f in delete_files:
        by_spec.setdefault(f.spec_id, []).append(f)
    tx = producer._transaction
    out: list[ManifestFile] = []
    for spec_id, files in sorted(by_spec.items()):
        writer = DeletesManifest(
            spec=tx.table_metadata.specs()[spec_id], schema=producer.schema(),
            output_file=producer.new_manifest_output(),
            snapshot_id=producer._snapshot_id, avro_compression=producer._compression,
        )
        with writer:
            for f in files:
                writer.add(ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED, snapshot_id=producer._snapshot_id,
                    sequence_number=None, file_sequence_number=None, data_file=f,
                ))
        out.append(writer.to_manifest_file())
    return out


class WithPositionDeletes(_Producer):
    """Mixed in before a pyiceberg snapshot producer (``class P(WithPositionDeletes,
    _FastAppendFiles)``): its snapshot also adds ``position_deletes`` in a DELETES manifest."""

    position_deletes: Sequence[DataFile] = ()

    def _manifests(self) -> list[ManifestFile]:
        return super()._manifests() + add_position_deletes(self, self.position_deletes)
