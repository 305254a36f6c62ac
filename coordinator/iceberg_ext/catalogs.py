"""Cheaper table commits on pyiceberg 0.12, for the coordinator's many commits per round.

- :func:`staged_metadata`: ``update_table_metadata`` without its final deep copy of the whole
  metadata (a quarter of a commit's CPU, growing with the snapshots).
- :class:`SqlCatalog`: pyiceberg's SQL catalog (SQLite, PostgreSQL) whose commit starts from the
  caller's table, instead of loading and parsing its metadata file again (a third of a commit's
  CPU), and updates the pointer with one plain compare-and-set statement that succeeds only
  while the catalog still points at that table's metadata file. Anything else (a stale table,
  whose compare-and-set fails; a new table; a dialect without reliable row counts) takes
  pyiceberg's own path. It writes metadata files as pyiceberg does, but reads pyiceberg's
  configuration (files and environment) once per process, not for every file.
  :func:`coordinator.iceberg_ext.install` makes ``icesink.shared.iceberg.load_catalog`` use it for
  every SQL catalog (:func:`icesink.shared.catalogs.use_sql_catalog`).

Both are pinned to pyiceberg 0.12 (pyproject.toml); tests/unit/test_catalogs.py holds them to
pyiceberg's own results.
"""

from __future__ import annotations

import logging
import operator
import threading
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from itertools import islice
from typing import Final

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables
from pyiceberg.catalog.sql import SqlCatalog as _PyicebergSqlCatalog
from pyiceberg.io import FileIO
from pyiceberg.serializers import Compressor
from pyiceberg.table import CommitTableResponse, StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, TableMetadataCommonFields
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    TableRequirement, TableUpdate, _apply_table_update, _TableMetadataUpdateContext, _update_table_metadata_log,
)
from pyiceberg.utils.config import Config
from pyiceberg.utils.datetime import datetime_to_millis
from sqlalchemy import bindparam, update

__all__ = ["SqlCatalog", "staged_metadata"]

logger = logging.getLogger(__name__)


def staged_metadata(base: TableMetadata, updates: tuple[TableUpdate, ...],
                    metadata_location: str | None = None) -> TableMetadata:
    """pyiceberg 0.12's ``update_table_metadata(base, updates, metadata_location=...)`` without
    its final deep copy: the models are frozen and every update builds new containers, so the
    result shares what did not change with ``base`` and neither is ever mutated.
    ``metadata_location``: the base's metadata file, entered in the metadata log (a catalog
    commit); None for a transaction's staged view."""
    context = _TableMetadataUpdateContext()
    staged = base
    for u in updates:
        staged = _apply_table_update(u, staged, context)
    if context.has_changes():
        if metadata_location:
            staged = _update_table_metadata_log(staged, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == staged.last_updated_ms:
            staged = staged.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    staged.spec().check_compatible(staged.schema())
    staged.sort_order().check_compatible(staged.schema())
    return staged


def snapshot_by_id(self: TableMetadataCommonFields, snapshot_id: int) -> Snapshot | None:
    """pyiceberg 0.12's ``TableMetadataCommonFields.snapshot_by_id``, the newest first: a commit
    looks up its parent, the current snapshot, about ten times, and pyiceberg's search from the
    oldest walked the whole history each time (at 700 snapshots, a tenth of a round's commit;
    bench/history_bench.py). Any other id in one pass in C over the ids: an id not there (a new
    snapshot's, checked before it is added) was a walk over every snapshot in Python. Snapshot
    ids are unique, so the answer is the same."""
    snapshots = self.snapshots
    if snapshots and snapshots[-1].snapshot_id == snapshot_id:
        return snapshots[-1]
    try:
        return snapshots[list(map(_SNAPSHOT_ID, snapshots)).index(snapshot_id)]
    except ValueError:
        return None


_SNAPSHOT_ID: Final = operator.attrgetter("snapshot_id")


def install_snapshot_lookup() -> None:
    """Every table metadata of this process finds snapshots with :func:`snapshot_by_id`."""
    TableMetadataCommonFields.snapshot_by_id = snapshot_by_id  # type: ignore[method-assign]


def snapshot_lookup_installed() -> bool:
    return TableMetadataCommonFields.snapshot_by_id is snapshot_by_id


class SqlCatalog(_PyicebergSqlCatalog):
    """pyiceberg's SQL catalog with a commit that does not reload a table it was handed current."""

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...],
                     updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        if isinstance(table, StagedTable) or not self.engine.dialect.supports_sane_rowcount:
            return super().commit_table(table, requirements, updates)  # a new table, or no reliable row counts
        identifier = table.name()
        namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
        name = Catalog.table_name_from(identifier)
        # Committed as if ``table`` were current: metadata files never change, so it is when the
        # catalog still points at the file it was read from, and the statement below commits
        # only then (compare-and-set on the pointer), as pyiceberg's own commit does. No read of
        # the pointer first: a stale table is the rare case, and costs the metadata file written
        # for nothing (deleted again) before pyiceberg's path reloads it.
        current = table.metadata
        for requirement in requirements:
            requirement.validate(current)
        metadata = staged_metadata(current, updates, table.metadata_location)
        if metadata == current:  # nothing to write, if current: pyiceberg's path tells
            return super().commit_table(table, requirements, updates)
        version = self._parse_metadata_version(table.metadata_location) + 1
        location = load_location_provider(metadata.location, metadata.properties).new_table_metadata_file_location(
            version)
        listed = self._write_file(metadata, table.io, location)
        with self.engine.begin() as connection:
            result = connection.execute(_SWAP_POINTER, {
                "catalog": self.name, "namespace": namespace, "name": name, "expected": table.metadata_location,
                "location": location})
        if result.rowcount < 1:  # stale (another writer committed) or gone: pyiceberg's path
            _delete_quietly(table.io, location)
            return super().commit_table(table, requirements, updates)
        SNAPSHOT_JSON.keep(metadata, listed)
        return CommitTableResponse(metadata=metadata, metadata_location=location)

    @staticmethod
    def _write_metadata(metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:
        """pyiceberg's own commit paths (a new table, a stale one) write through :meth:`_write_file` too."""
        SqlCatalog._write_file(metadata, io, metadata_path)

    @staticmethod
    def _write_file(metadata: TableMetadata, io: FileIO, metadata_path: str) -> Listed:
        """pyiceberg 0.12's ``ToOutputFile.table_metadata``, the same bytes, without building a
        ``Config`` for every file: that searches for and parses pyiceberg's configuration file
        and walks the environment, for every commit (see bench/README.md, commit_bench --profile)."""
        output = io.new_output(metadata_path)
        with output.create(overwrite=False) as stream:
            # None values are written when asked (legacy-current-snapshot-id dumps -1), as pyiceberg does.
            data, listed = SNAPSHOT_JSON.dump(metadata, exclude_none=not _legacy_current_snapshot_id())
            stream.write(Compressor.get_compressor(output.location).bytes_compressor()(data))
        return listed  # each snapshot's JSON, kept once the file is committed (SnapshotJson.keep)


#: A snapshot's id, manifest list and parent id: what may differ between two snapshots of one id.
SnapshotKey = tuple[int, str, int | None]


@dataclass(frozen=True)
class Listed:
    """A metadata file's snapshots as JSON: each one's UTF-8 text by (id, manifest list, parent
    id), the texts joined as the file lists them, and the snapshots themselves in that order
    (frozen models: the next commit's metadata holds the same objects)."""

    texts: dict[SnapshotKey, bytes]
    joined: bytes
    snapshots: list[Snapshot]


NOTHING_LISTED: Final = Listed({}, b"", [])


class SnapshotJson:
    """A table's metadata file as JSON, each snapshot serialized once: a committed snapshot never
    changes, and a table's metadata file lists every snapshot it keeps, so dumping them all again
    made a commit's cost grow with the history (at 1 s rounds and ten minutes' retention, 700
    snapshots: about 40 % of a commit, its largest part; bench/history_bench.py). Keeps, per table (its
    uuid), the JSON of the snapshots of its last metadata file whose commit went through
    (:meth:`keep`): a refused commit's snapshot is made again by pyiceberg's retry under the same
    id with another manifest list, so only committed files are kept, keyed by id and manifest
    list, and parent id (pyiceberg's expiry drops the parent of a snapshot whose parent it
    removes). A commit that only adds snapshots (every round's) appends their JSON to the list
    joined before, without a pass over the kept ones (expiry's commit joins them all again). The
    bytes are pyiceberg's ``model_dump_json`` (tests/unit/test_catalogs.py)."""

    MARK: Final = '"snapshots":[]'

    def __init__(self) -> None:
        self._tables: dict[tuple[object, bool], Listed] = {}
        self._lock = threading.Lock()

    def dump(self, metadata: TableMetadata, *, exclude_none: bool) -> tuple[bytes, Listed]:
        """The metadata file's JSON (UTF-8), and its snapshots' for :meth:`keep`. The snapshot
        list is built as bytes, copied once into the file's: a 600 KB list joined, spliced into
        the text and encoded was three copies, a tenth of a commit at 700 snapshots."""
        with self._lock:
            known = self._tables.get((metadata.table_uuid, exclude_none), NOTHING_LISTED)
        snapshots = metadata.snapshots
        if known.snapshots and _extends(snapshots, known):  # snapshots added, none removed: the last list extended
            added = {_key(s): snapshot_json(s, exclude_none) for s in snapshots[len(known.snapshots):]}
            listed = Listed({**known.texts, **added}, b",".join([known.joined, *added.values()]), list(snapshots))
        else:
            keys = [_key(s) for s in snapshots]
            texts = {key: known.texts.get(key) or snapshot_json(s, exclude_none) for key, s in zip(keys, snapshots)}
            listed = Listed(texts, b",".join(texts[key] for key in keys), list(snapshots))
        body = metadata.model_copy(update={"snapshots": []}).model_dump_json(exclude_none=exclude_none)
        if body.count(self.MARK) != 1:  # not the layout this was written for: pyiceberg's own dump
            return metadata.model_dump_json(exclude_none=exclude_none).encode("utf-8"), NOTHING_LISTED
        head, tail = body.split(self.MARK)
        return b"".join([head.encode("utf-8"), b'"snapshots":[', listed.joined, b"]", tail.encode("utf-8")]), listed

    def keep(self, metadata: TableMetadata, listed: Listed) -> None:
        """``metadata``'s file is committed: its snapshots' JSON serves the table's next commits
        (only these: expired snapshots are let go)."""
        with self._lock:
            self._tables[(metadata.table_uuid, not _legacy_current_snapshot_id())] = listed


def snapshot_json(snapshot: Snapshot, exclude_none: bool) -> bytes:
    """One snapshot as its table's metadata file lists it (UTF-8)."""
    return snapshot.model_dump_json(exclude_none=exclude_none, by_alias=True).encode("utf-8")


def _key(snapshot: Snapshot) -> SnapshotKey:
    return snapshot.snapshot_id, snapshot.manifest_list, snapshot.parent_snapshot_id


def _extends(snapshots: list[Snapshot], known: Listed) -> bool:
    """Whether ``snapshots`` begin with ``known``'s: the same objects (a commit's metadata keeps
    its base's snapshots, a pass in C), else the same keys (a table loaded again)."""
    kept = len(known.snapshots)
    if len(snapshots) < kept:
        return False
    if all(map(operator.is_, islice(snapshots, kept), known.snapshots)):
        return True
    return list(map(_key, islice(snapshots, kept))) == list(map(_key, known.snapshots))


SNAPSHOT_JSON: Final = SnapshotJson()  # one per process, as the commits of every table share it


@cache
def _legacy_current_snapshot_id() -> bool:
    """pyiceberg's ``legacy-current-snapshot-id`` setting, read once per process."""
    return bool(Config().get_bool("legacy-current-snapshot-id"))


# The pointer's compare-and-set, built once (building it per commit showed in
# bench/README.md, commit_bench --profile).
_SWAP_POINTER: Final = (
    update(IcebergTables)
    .where(IcebergTables.catalog_name == bindparam("catalog"), IcebergTables.table_namespace == bindparam("namespace"),
           IcebergTables.table_name == bindparam("name"), IcebergTables.metadata_location == bindparam("expected"))
    .values(metadata_location=bindparam("location"), previous_metadata_location=bindparam("expected"))
)


def _delete_quietly(io: FileIO, path: str) -> None:
    try:
        io.delete(path)
    except Exception as exc:  # noqa: BLE001 - an unreferenced metadata file; icesink gc finds it
        logger.warning("could not delete unused metadata file %s: %s", path, exc)
