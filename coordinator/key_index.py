"""The key index of a mirror table: each live key -> (data file, row position), so the rows a
round's changes replace can be deleted by position (coordinator/iceberg_ext/deletes.py).

It is rebuilt from the table itself (the key columns of its live data files, minus the rows its
position delete files delete), so a new coordinator after a failover builds the same index
from the committed snapshot and nothing else has to be kept durably. Rebuilding reads every
live key once; a round afterwards costs what its changed keys cost: a dictionary lookup per
changed key and reading the key columns of the round's new files.

The index is a dict from key (a scalar, or a tuple for keys of several columns) to one int
packing the file's number and the row position (``file << 32 | pos``), which keeps it at about
100 bytes per key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.table import Table
from pyiceberg.typedef import Record

__all__ = ["KeyIndex", "read_keys"]

_POS_BITS = 32


class KeyIndex:
    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise ValueError("a mirror table's key index needs key columns, found none")
        self.keys = tuple(keys)
        self._files: list[str] = []
        self._file_ids: dict[str, int] = {}
        self._partitions: dict[str, tuple[int, Record]] = {}  # path -> (spec id, partition)
        self._where: dict[Any, int] = {}

    def __len__(self) -> int:
        return len(self._where)

    @classmethod
    def from_table(cls, table: Table, keys: Sequence[str], snapshot_id: int | None = None) -> KeyIndex:
        """The index of ``table``'s snapshot ``snapshot_id`` (None: the current one)."""
        index = cls(keys)
        tasks = list(table.scan(snapshot_id=snapshot_id).plan_files())
        deletes = _read_deletes(table, {d.file_path for t in tasks for d in t.delete_files})
        for task in tasks:
            deleted = _deleted_positions(deletes, task.file.file_path, task.delete_files)
            index.add_file(task.file.file_path, read_keys(table, task.file.file_path, index.keys), skip=deleted,
                           partition=(task.file.spec_id, task.file.partition))
        return index

    def add_file(self, path: str, keys: pa.Table, skip: np.ndarray | None = None,
                 partition: tuple[int, Record] | None = None) -> None:
        """Index the rows of a data file: ``keys`` holds its key columns in row order; rows at
        the positions in ``skip`` (deleted) are left out. A key already indexed now points here
        (the caller deleted its old row). ``partition``: the file's spec id and partition (a
        position delete file belongs to one)."""
        file_id = self._file_ids.get(path)
        if file_id is None:
            file_id = self._file_ids[path] = len(self._files)
            self._files.append(path)
        if partition is not None:
            self._partitions[path] = partition
        positions = np.arange(keys.num_rows, dtype=np.int64)
        if skip is not None and len(skip):
            keep = np.ones(keys.num_rows, dtype=bool)
            keep[skip] = False
            keys, positions = keys.filter(pa.array(keep)), positions[keep]
        packed = (positions | (file_id << _POS_BITS)).tolist()
        self._where.update(zip(self._key_list(keys), packed))

    def take(self, keys: pa.Table) -> pa.Table:
        """Remove ``keys`` from the index and return the rows they had as ``file_path``, ``pos``
        (the position deletes to write); keys that are not indexed are skipped."""
        found = [w for w in map(self._where.pop, self._key_list(keys), [None] * keys.num_rows) if w is not None]
        packed = np.asarray(found, dtype=np.int64)
        files = packed >> _POS_BITS
        return pa.table({
            "file_path": pa.array([self._files[i] for i in files.tolist()], pa.string()),
            "pos": pa.array(packed & ((1 << _POS_BITS) - 1), pa.int64()),
        })

    def partition(self, path: str) -> tuple[int, Record] | None:
        """The spec id and partition of an indexed data file (None: not given)."""
        return self._partitions.get(path)

    def _key_list(self, keys: pa.Table) -> list[Any]:
        columns = [keys.column(k).to_pylist() for k in self.keys]
        return columns[0] if len(columns) == 1 else list(zip(*columns))


def read_keys(table: Table, path: str, keys: Sequence[str]) -> pa.Table:
    """The key columns of data file ``path``, in row order."""
    with table.io.new_input(path).open() as f:
        return pq.read_table(f, columns=list(keys))


def _read_deletes(table: Table, paths: set[str]) -> dict[str, dict[str, np.ndarray]]:
    """Each position delete file, read once: data file path -> deleted positions."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for path in paths:
        with table.io.new_input(path).open() as f:
            rows = pq.read_table(f, columns=["file_path", "pos"])
        by_file: dict[str, np.ndarray] = {}
        for target in pc.unique(rows.column("file_path")).to_pylist():
            mine = rows.filter(pc.equal(rows.column("file_path"), target))
            by_file[target] = mine.column("pos").to_numpy()
        out[path] = by_file
    return out


def _deleted_positions(deletes: dict[str, dict[str, np.ndarray]], path: str, delete_files: Any) -> np.ndarray:
    """Row positions of ``path`` that the position delete files that apply to it delete."""
    found = [deletes[d.file_path][path] for d in delete_files if path in deletes[d.file_path]]
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
