"""pyiceberg's snapshot producers and transactions as icesink commits with them.

- :class:`MemoTransaction`: a transaction that stages its metadata once per change.
- :class:`SpecAwareAppend`: the committer's fast append (a manifest per partition spec, written
  in the committing thread, a mirror table's position deletes in the same snapshot).
- :class:`Replace`: maintenance's compaction commit (``replace``, able to remove delete files).
- :func:`check_before_retry`: run icesink's preconditions before pyiceberg retries a
  conflicting commit on the refreshed table.

Pinned to pyiceberg 0.12's ``Transaction`` (``_table``, ``_updates``,
``_rebuild_snapshot_updates``) and ``_SnapshotProducer`` internals (pyproject.toml; checked at
start-up by :func:`coordinator.iceberg_ext.install`).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import (
    DataFile, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile, ManifestWriter,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update import AssertRefSnapshotId, UpdatesAndRequirements
from pyiceberg.table.update.snapshot import _FastAppendFiles, _OverwriteFiles, _SnapshotProducer
from pyiceberg.typedef import EMPTY_DICT, Record

from coordinator.iceberg_ext.catalogs import staged_metadata
from coordinator.iceberg_ext.deletes import DeletesManifest, add_position_deletes
from coordinator.iceberg_ext.manifest_writers import manifest_writer
from icesink.shared.catalogs import manifests_of
from icesink.shared.config import MAIN_BRANCH
from icesink.shared.errors import TableChangedError

__all__ = ["MemoTransaction", "Replace", "SpecAwareAppend", "check_before_retry"]

P = TypeVar("P", bound=_SnapshotProducer[Any])


def check_before_retry(tx: Transaction, check: Callable[[Table], None]) -> None:
    """pyiceberg retries a conflicting commit by itself, re-applying the same changes on the
    refreshed table (``Transaction._rebuild_snapshot_updates``). Call ``check`` with the
    refreshed table first; raising (say ``CommitFailedException``) stops the retry. The
    transaction is held weakly: held by what the transaction holds, it made every commit a
    reference cycle (two table metadata and their lists) for the cyclic collector."""
    held = weakref.ref(tx)

    def checked_rebuild() -> None:
        me = held()
        if me is None:  # only the transaction calls it, while it lives
            return
        check(me._table)
        type(me)._rebuild_snapshot_updates(me)

    tx._rebuild_snapshot_updates = checked_rebuild  # type: ignore[method-assign]


def _producer(cls: type[P], tx: Transaction, props: dict[str, str], operation: Operation,
              branch: str = MAIN_BRANCH) -> P:
    """A snapshot producer of class ``cls`` in ``tx``, set up as ``tx.update_snapshot`` sets up
    pyiceberg's own (its file io, branch and snapshot properties); the snapshot goes to ``branch``."""
    update = tx.update_snapshot(snapshot_properties=props, branch=branch)
    return cls(operation=operation, transaction=tx, io=update._io, branch=update._branch,
               snapshot_properties=update._snapshot_properties)


class MemoTransaction(Transaction):
    """A transaction that computes its staged metadata once per change. pyiceberg 0.12
    recomputes it (every update re-applied, then a deep copy of the whole metadata) on each
    read of ``table_metadata``, which a fast append does about sixteen times: a third of a
    commit's CPU, growing with the table's snapshot count. The result depends only on the
    table's metadata and the staged updates, both replaced (never mutated) on change, so it is
    cached on their identity. Pinned to pyiceberg 0.12's ``Transaction.table_metadata``
    (pyproject.toml); tests/unit/test_coordinator_commit.py checks the cache against it."""

    _memo: tuple[object, object, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        memo = self._memo
        if memo is None or memo[0] is not base or memo[1] is not updates:
            memo = self._memo = (base, updates, staged_metadata(base, updates))
        return memo[2]


class SpecAwareAppend(_FastAppendFiles):
    """A fast append that writes each file under the partition spec it was written with.
    pyiceberg 0.12 writes every added file into one manifest of the table's current default
    spec, which mislabels the partitions of files written before another writer changed the
    spec. Files of other specs get one manifest per spec here (a table may hold files of
    several specs); the snapshot summary still counts them all. The manifests are written in
    the committing thread (:meth:`_manifests`). Pinned to pyiceberg 0.12's
    ``_SnapshotProducer._manifests``, ``_summary`` and ``_added_data_files`` (pyproject.toml);
    tests/integration/test_table_changes.py fails if they change."""

    position_deletes: Sequence[DataFile] = ()

    @classmethod
    def of(cls, tx: Transaction, props: dict[str, str], deletes: list[DataFile] = [],  # noqa: B006
           branch: str = MAIN_BRANCH) -> SpecAwareAppend:
        """With ``deletes`` (a mirror table's position delete files) the snapshot also adds
        them, in a DELETES manifest, as an overwrite. ``branch``: the branch it commits to."""
        out = _producer(cls, tx, props, Operation.OVERWRITE if deletes else Operation.APPEND, branch)
        out.position_deletes = list(deletes)
        return out

    def _commit(self) -> UpdatesAndRequirements:
        """pyiceberg 0.12's, able to start a branch in a table without snapshots (its requirement
        refuses any branch but main there; Iceberg's own snapshot producer starts the branch
        from the new snapshot, and so does the reference sink's commit)."""
        updates, requirements = super()._commit()
        return updates, tuple(_AssertNewRef(ref=r.ref, snapshot_id=None)
                              if isinstance(r, AssertRefSnapshotId) and r.snapshot_id is None else r
                              for r in requirements)

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        """pyiceberg 0.12's, with a writer prepared once per shape (coordinator/iceberg_ext/manifest_writers.py)."""
        metadata = self._transaction.table_metadata
        return manifest_writer(metadata.format_version, spec, metadata.schema(), self.new_manifest_output(),
                               self._snapshot_id, self._compression)

    def _existing_manifests(self) -> list[ManifestFile]:
        """pyiceberg 0.12's, reading the parent's manifest list once per process
        (:func:`icesink.shared.catalogs.manifests_of`)."""
        if self._parent_snapshot_id is None:
            return []
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id)
        if parent is None:
            raise ValueError(f"Snapshot could not be found: {self._parent_snapshot_id}")
        return [m for m in manifests_of(parent, self._io)
                if m.has_added_files() or m.has_existing_files() or m.added_snapshot_id == self._snapshot_id]

    def _manifests(self) -> list[ManifestFile]:
        """pyiceberg 0.12's ``_SnapshotProducer._manifests`` for a fast append (nothing deleted,
        no post-processing), with a manifest per spec of the added files (other specs first, in
        order), run in this thread: pyiceberg hands the new manifest's write and the parent's
        manifest list to its executor and waits, thread hand-offs that each wait for the GIL
        again while a busy process's other threads hold it (a 200-table round's commits,
        bench/README.md)."""
        metadata = self._transaction.table_metadata
        default = metadata.default_spec_id
        by_spec: dict[int, list[DataFile]] = defaultdict(list)
        for f in self._added_data_files:
            by_spec[f.spec_id].append(f)
        specs = metadata.specs()
        added: list[ManifestFile] = []
        for spec_id in [*sorted(s for s in by_spec if s != default), *([default] if default in by_spec else [])]:
            if spec_id not in specs:  # to_data_file checked it; the table changed since
                raise TableChangedError(
                    f"table {'.'.join(self._transaction._table.name())}: expected partition spec id {spec_id} "
                    f"of {len(by_spec[spec_id])} files, found spec ids {sorted(specs)}")
            with self.new_manifest_writer(spec=specs[spec_id]) as writer:
                for f in by_spec[spec_id]:
                    writer.add(ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                        sequence_number=None, file_sequence_number=None, data_file=f,
                    ))
            added.append(writer.to_manifest_file())
        return added + self._existing_manifests() + add_position_deletes(self, self.position_deletes)

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # pyiceberg reads every added file's partition with the default spec (partition
        # metrics); files of another spec are counted without their partition tuple.
        default = self._transaction.table_metadata.default_spec_id
        every = self._added_data_files
        self._added_data_files = [f if f.spec_id == default else _unpartitioned_copy(f) for f in every]
        try:
            return super()._summary(snapshot_properties)
        finally:
            self._added_data_files = every


class _AssertNewRef(AssertRefSnapshotId):
    """The ref must not exist yet (as pyiceberg's, sent to a REST catalog as the same
    requirement), also in a table with no snapshot: pyiceberg 0.12 refuses a branch other than
    main there, a rule of its own client, not of the Iceberg spec."""

    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]  # as pyiceberg's
        if base_metadata is not None and not base_metadata.snapshots and self.ref not in base_metadata.refs:
            return
        super().validate(base_metadata)


def _unpartitioned_copy(f: DataFile) -> DataFile:
    """``f`` for the snapshot summary's counts only: same size and records, no partition."""
    return DataFile.from_args(
        content=f.content, file_path=f.file_path, file_format=f.file_format, partition=Record(),
        record_count=f.record_count, file_size_in_bytes=f.file_size_in_bytes,
    )


class Replace(_OverwriteFiles):
    """pyiceberg's overwrite, recorded as what it is (``replace``: same rows, other files), and
    able to remove delete files: pyiceberg 0.12 drops only data files and rewrites every
    manifest as a data manifest, so the manifests are written here by content (DELETES
    manifests with :class:`coordinator.iceberg_ext.deletes.DeletesManifest`). Summary totals are computed
    as for an overwrite (pyiceberg 0.12 computes none for replace), then the operation named."""

    live: Mapping[str, tuple[DataFile, ...]] = EMPTY_DICT  # live_files's cache: manifests known to hold no input

    @classmethod
    def of(cls, tx: Transaction, props: dict[str, str], live: Mapping[str, tuple[DataFile, ...]] | None = None,
           branch: str = MAIN_BRANCH) -> Replace:
        """A replace in ``tx`` with snapshot properties ``props``; ``live``: :func:`live_files`'s
        cache of the table (coordinator/maintenance.py), manifests known to hold no input;
        ``branch``: the branch whose head it rewrites."""
        out = _producer(cls, tx, props, Operation.OVERWRITE, branch)
        out.live = live if live is not None else {}
        return out

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        summary = super()._summary(snapshot_properties)
        return Summary(Operation.REPLACE, **summary.additional_properties)

    def _writer(self, content: ManifestContent, spec_id: int) -> ManifestWriter:
        if content == ManifestContent.DATA:
            return self.new_manifest_writer(self.spec(spec_id))
        return DeletesManifest(spec=self.spec(spec_id), schema=self.schema(), output_file=self.new_manifest_output(),
                               snapshot_id=self._snapshot_id, avro_compression=self._compression)

    def _rewritten(self, content: ManifestContent, spec_id: int, entries: list[ManifestEntry],
                   status: ManifestEntryStatus) -> ManifestFile:
        """A manifest of ``entries`` again, as EXISTING (kept) or DELETED (by this snapshot)."""
        with self._writer(content, spec_id) as writer:
            for e in entries:
                writer.add_entry(ManifestEntry.from_args(
                    status=status,
                    snapshot_id=e.snapshot_id if status == ManifestEntryStatus.EXISTING else self._snapshot_id,
                    sequence_number=e.sequence_number, file_sequence_number=e.file_sequence_number,
                    data_file=e.data_file))
        return writer.to_manifest_file()

    def _manifests(self) -> list[ManifestFile]:
        meta = self._transaction.table_metadata
        parent = meta.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id is not None else None
        removed = set(self._deleted_data_files)
        out: list[ManifestFile] = []
        found: set[DataFile] = set()
        gone: dict[tuple[ManifestContent, int], list[ManifestEntry]] = defaultdict(list)
        for m in manifests_of(parent, self._io) if parent is not None else []:
            known = self.live.get(m.manifest_path)
            if known is not None and not any(f in removed for f in known):
                out.append(m)  # no input in it: kept as it is, not read again
                continue
            entries = m.fetch_manifest_entry(self._io, discard_deleted=True)
            hit = [e for e in entries if e.data_file in removed]
            if not hit:
                out.append(m)
                continue
            found.update(e.data_file for e in hit)
            gone[(m.content, m.partition_spec_id)] += hit
            keep = [e for e in entries if e.data_file not in removed]
            if keep:
                out.append(self._rewritten(m.content, m.partition_spec_id, keep, ManifestEntryStatus.EXISTING))
        if missing := sorted(f.file_path for f in removed - found):
            raise CommitFailedException(f"files to replace are no longer live: {', '.join(missing)}")
        for (content, spec_id), entries in sorted(gone.items(), key=lambda kv: (kv[0][0].value, kv[0][1])):
            out.append(self._rewritten(content, spec_id, entries, ManifestEntryStatus.DELETED))
        if self._added_data_files:
            with self.new_manifest_writer(meta.spec()) as writer:
                for f in self._added_data_files:
                    writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                                                       sequence_number=None, file_sequence_number=None, data_file=f))
            out.append(writer.to_manifest_file())
        return out
