"""Mirror tables, the coordinator's half of a commit (docs/mirror-tables.md): the round's
accepted responses, in control-log order, turned into the position deletes of the rows their
changes replace or delete, against the table's key index. Blocking (reads the keys files and
the key columns of new data files): runs inside the table's commit, through Offload.

The index is trusted only for the snapshot it was built or last updated for: it is taken out
of :class:`MirrorIndexes` for a commit and put back with the new snapshot id only once the
commit went through, so any failed, ambiguous or conflicting commit leaves no index behind and
the next attempt rebuilds it from the table (which a new coordinator after a failover does too).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from coordinator.gc import prune_write_dirs
from coordinator.iceberg_ext.deletes import write_position_deletes
from coordinator.key_index import KeyIndex
from coordinator.state import Accepted
from icesink.shared.config import Settings
from icesink.shared.errors import TableChangedError
from icesink.shared.protocol import FileInfo
from icesink.shared.iceberg import branch_head, mirror_keys, to_data_file

log = logging.getLogger(__name__)

__all__ = ["MirrorIndexes", "delete_keys_files", "position_deletes"]


class MirrorIndexes:
    """The key index of each mirror table the coordinator commits to, with the snapshot it
    describes. Tables commit in parallel threads, each touching only its own entry."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._by_table: dict[str, tuple[int | None, KeyIndex]] = {}

    def keys(self, name: str, table: Table) -> tuple[str, ...] | None:
        """The key columns of ``name`` if the sink makes mirror tables (None: an append table)."""
        return mirror_keys(self.settings, name, table)

    def take(self, name: str, table: Table, keys: tuple[str, ...]) -> KeyIndex:
        """The index of the head of ``table``'s commit branch, removed from here until :meth:`keep`:
        the one kept after the last commit if the branch has not moved since, else rebuilt."""
        snapshot = branch_head(table, self.settings.commit_branch(name))
        current = snapshot.snapshot_id if snapshot is not None else None
        with self._lock:
            kept = self._by_table.pop(name, None)
        if kept is not None and kept[0] == current and kept[1].keys == keys:
            return kept[1]
        started = time.monotonic()
        index = KeyIndex.from_table(table, keys, current) if current is not None else KeyIndex(keys)
        log.info("table %s: key index rebuilt from snapshot %s: %d keys in %.2fs", name, current, len(index),
                 time.monotonic() - started)
        return index

    def keep(self, name: str, snapshot_id: int | None, index: KeyIndex) -> None:
        with self._lock:
            self._by_table[name] = (snapshot_id, index)

    def forget(self, name: str) -> None:
        with self._lock:
            self._by_table.pop(name, None)

    def rewritten(self, name: str, parent: int | None, snapshot: int | None,
                  files: Sequence[tuple[str, pa.Table, tuple[int, Any]]] | None) -> bool:
        """Compaction replaced data files of ``name`` in ``snapshot`` (whose parent is
        ``parent``) by ``files`` (path, key columns in row order, spec id and partition): the same
        live rows at new positions. The index kept for ``parent`` moves to them in place (each of
        their keys, all live before, now points at its new row) and is kept for ``snapshot``; an
        index of another snapshot, or ``files`` None (not read), is dropped and rebuilt at the
        next round. Called under the table's commit lock, so no round holds the index. Returns
        whether it moved."""
        with self._lock:
            kept = self._by_table.pop(name, None)
        if kept is None or files is None or parent is None or kept[0] != parent:
            return False
        index = kept[1]
        for path, keys, partition in files:
            index.add_file(path, keys, partition=partition)
        self.keep(name, snapshot, index)
        log.info("table %s: key index moved to the %d files of compaction snapshot %s", name, len(files), snapshot)
        return True


def position_deletes(table: Table, name: str, index: KeyIndex, todo: Sequence[Accepted],
                     prefix: str = "delete") -> list[DataFile]:
    """Apply ``todo`` (responses above the table's watermark) to ``index`` in control-log
    order: each response's keys files take their keys' rows out of the index (those rows are
    deleted), then the key columns of its new data files go in. Returns the position delete
    files written for the taken rows (one per partition; none when no committed row goes),
    named after ``prefix``. Keys that are not in the index (a delete of an absent key) delete
    nothing."""
    taken: list[pa.Table] = []
    for a in sorted(todo, key=lambda a: a.offset):
        for kf in a.deleted_keys.get(name, ()):
            keys = _read(table, kf, index.keys)
            taken.append(index.take(keys))
        for f in a.files.get(name, ()):
            df = to_data_file(f, table)
            index.add_file(f.path, _read(table, f, index.keys), partition=(df.spec_id, df.partition))
    rows = pa.concat_tables(taken) if taken else None
    if rows is None or rows.num_rows == 0:
        return []
    by_partition: dict[tuple[int, object], list[int]] = {}
    paths = rows.column("file_path").to_pylist()
    partitions: dict[str, tuple[int, Record | None]] = {}
    for i, path in enumerate(paths):
        where = partitions.get(path)
        if where is None:
            where = partitions[path] = index.partition(path) or (table.metadata.default_spec_id, None)
        by_partition.setdefault((where[0], _hashable(where[1])), []).append(i)
    out: list[DataFile] = []
    for (spec_id, _), positions in by_partition.items():
        part = rows.take(pa.array(positions))
        record = (index.partition(part.column("file_path")[0].as_py()) or (spec_id, None))[1]
        out.append(write_position_deletes(table, part, record, spec_id, prefix))
    return out


def _hashable(record: Record | None) -> object:
    return None if record is None else tuple(record[i] for i in range(len(record)))


def _read(table: Table, f: FileInfo, keys: Sequence[str]) -> pa.Table:
    """The key columns of a keys file or a data file of the round, in row order."""
    try:
        with table.io.new_input(f.path).open() as stream:
            return pq.read_table(stream, columns=list(keys))
    except (KeyError, ValueError, pa.ArrowInvalid) as exc:
        raise TableChangedError(
            f"table {'.'.join(table.name())}: expected key columns {list(keys)} in {f.path}, could not read them "
            f"({exc}); the table's key columns changed since the file was written") from exc


def delete_keys_files(catalog: Catalog, paths: dict[str, list[str]]) -> None:
    """Delete the keys files of a committed round (by table; checked to lie under their table
    when read). A failure leaves an orphan for ``icesink gc``: logged, never raised."""
    for name, files in paths.items():
        try:
            table = catalog.load_table(name)
            for path in files:
                try:
                    table.io.delete(path)
                except FileNotFoundError:
                    pass
            prune_write_dirs(table.location(), files)
        except Exception as exc:  # noqa: BLE001 - cleanup never stops commits
            log.warning("could not delete the keys files of table %s (icesink gc will): %s", name, exc)
