"""Cheaper table commits on pyiceberg 0.12, for the coordinator's many commits per round.

- :func:`staged_metadata`: ``update_table_metadata`` without its final deep copy of the whole
  metadata (a quarter of a commit's CPU, growing with the snapshots).
- :func:`manifests_of`: a snapshot's manifests, each manifest list read once per process, and
  not at all when this process wrote it (:func:`remember_manifests`).
- :func:`sqlite_catalog_properties`: a SQL catalog in a local SQLite file that several
  processes share (the embedded stack's, the tests' and the benchmarks').
- :func:`sqlite_init_lock`: processes that open a new SQLite catalog together create its
  tables one at a time (pyiceberg checks, then creates: the others' CREATE TABLE failed).
- :class:`SqlCatalog`: pyiceberg's SQL catalog (SQLite, PostgreSQL) whose commit starts from the
  caller's table, instead of loading and parsing its metadata file again (a third of a commit's
  CPU), and updates the pointer with one plain compare-and-set statement that succeeds only
  while the catalog still points at that table's metadata file. Anything else (a stale table,
  whose compare-and-set fails; a new table; a dialect without reliable row counts) takes
  pyiceberg's own path. It writes metadata files as pyiceberg does, but reads pyiceberg's
  configuration (files and environment) once per process, not for every file.
  ``icesink.iceberg.load_catalog`` uses it for every SQL catalog.

All are pinned to pyiceberg 0.12 (pyproject.toml); tests/unit/test_catalogs.py holds them to
pyiceberg's own results.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Final

from cachetools import LRUCache
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestFile
from pyiceberg.serializers import Compressor
from pyiceberg.catalog.sql import IcebergTables
from pyiceberg.catalog.sql import SqlCatalog as _PyicebergSqlCatalog
from pyiceberg.table import CommitTableResponse, StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    TableRequirement, TableUpdate, _apply_table_update, _TableMetadataUpdateContext, _update_table_metadata_log,
)
from pyiceberg.utils.config import Config
from pyiceberg.utils.datetime import datetime_to_millis
from sqlalchemy import bindparam, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

__all__ = [
    "SQLITE_BUSY_TIMEOUT_S", "SqlCatalog", "manifests_of", "remember_manifests", "sqlite_catalog_properties",
    "sqlite_init_lock", "staged_metadata",
]

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
        self._write_metadata(metadata=metadata, io=table.io, metadata_path=location)
        with self.engine.begin() as connection:
            result = connection.execute(_SWAP_POINTER, {
                "catalog": self.name, "namespace": namespace, "name": name, "expected": table.metadata_location,
                "location": location})
        if result.rowcount < 1:  # stale (another writer committed) or gone: pyiceberg's path
            _delete_quietly(table.io, location)
            return super().commit_table(table, requirements, updates)
        return CommitTableResponse(metadata=metadata, metadata_location=location)

    @staticmethod
    def _write_metadata(metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:
        """pyiceberg 0.12's ``ToOutputFile.table_metadata``, the same bytes, without building a
        ``Config`` for every file: that searches for and parses pyiceberg's configuration file
        and walks the environment, 7% of a table commit's CPU (py-spy, bench/commit_bench.py)."""
        output = io.new_output(metadata_path)
        with output.create(overwrite=False) as stream:
            # None values are written when asked (legacy-current-snapshot-id dumps -1), as pyiceberg does.
            text = metadata.model_dump_json(exclude_none=not _legacy_current_snapshot_id())
            stream.write(Compressor.get_compressor(output.location).bytes_compressor()(text.encode("utf-8")))


@cache
def _legacy_current_snapshot_id() -> bool:
    """pyiceberg's ``legacy-current-snapshot-id`` setting, read once per process."""
    return bool(Config().get_bool("legacy-current-snapshot-id"))


# The pointer's compare-and-set, built once (building it took about 5% of a commit's CPU).
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


#: How long a SQLite connection of the catalog waits for another process's lock (seconds).
SQLITE_BUSY_TIMEOUT_S: Final = 30


def sqlite_catalog_properties(
    directory: str | os.PathLike[str], *, initialize: bool = True
) -> dict[str, str]:
    """Properties of a pyiceberg SQL catalog in a SQLite file inside ``directory``.

    Returns ``{"type": "sql", "uri": "sqlite:////<dir>/catalog.db?timeout=30",
    "warehouse": "file:///<dir>/warehouse"}`` for ``load_catalog(name, **props)``. Every
    process must use the same catalog *name*: the SQL catalog keys its rows by it.

    Several processes may open the catalog at once, so:

    - the ``timeout`` query parameter (SQLAlchemy passes it to ``sqlite3.connect``) makes a
      connection wait up to ``SQLITE_BUSY_TIMEOUT_S`` seconds for another process's lock instead
      of failing with "database is locked";
    - the file is switched to WAL journal mode (persistent in the file), so readers do not block
      the committer;
    - with ``initialize`` (default) the catalog tables are created here, once, so concurrent
      first opens do not race to create them.

    The directory must be on a local filesystem (SQLite locking and WAL need one).
    """
    root = Path(directory).resolve()
    warehouse = root / "warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    database = root / "catalog.db"
    props = {
        "type": "sql",
        "uri": f"sqlite:///{database}?timeout={SQLITE_BUSY_TIMEOUT_S}",
        "warehouse": f"file://{warehouse}",
    }
    with sqlite_init_lock(props["uri"]):
        try:
            with sqlite3.connect(database, timeout=SQLITE_BUSY_TIMEOUT_S) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.close()
        except sqlite3.Error as exc:
            logger.warning("could not switch %s to WAL mode (%s); continuing without", database, exc)
        if initialize:
            catalog = _PyicebergSqlCatalog("icesink-init", **props)
            catalog.engine.dispose()
    return props


@contextmanager
def sqlite_init_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive lock beside the SQLite file of ``uri`` (``<file>.init-lock``) while a
    process opens the catalog, when ``uri`` is one. pyiceberg's SQL catalog creates its tables
    when it finds none, by checking and then creating: processes opening a new catalog at once
    (replicas or ``icesink connect`` tasks starting together) all found none, and all but one
    failed with "table iceberg_tables already exists". Under the lock the first creates them and
    the others find them. Any other URI (PostgreSQL, in-memory SQLite, not SQL), or a directory
    that does not exist (opening the file fails and says so), takes no lock."""
    path = _sqlite_file(uri)
    if path is None or not path.parent.is_dir():
        yield
        return
    with open(path.with_name(path.name + ".init-lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _sqlite_file(uri: str) -> Path | None:
    try:
        url = make_url(uri)
    except ArgumentError:
        return None
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:" or \
            url.database.startswith("file:"):
        return None
    return Path(url.database)


# Manifest lists -------------------------------------------------------------------------------

#: Manifest lists held (about two per table the coordinator commits to: the current one and the
#: one before it). A list holds one entry per live manifest, a few dozen while maintenance
#: compacts: a few MB in all.
MANIFEST_LISTS_HELD: Final = 1024
_manifest_lists: LRUCache[str, tuple[ManifestFile, ...]] = LRUCache(maxsize=MANIFEST_LISTS_HELD)
_manifest_lists_lock = threading.Lock()


def manifests_of(snapshot: Snapshot, io: FileIO) -> list[ManifestFile]:
    """``snapshot.manifests(io)`` with each manifest list read once per process. A manifest list
    never changes once written, and the coordinator reads the current one of every table it
    commits to twice a round (the append's existing manifests, maintenance's check); pyiceberg
    reads the file again on every call (a tenth of a table commit's CPU at 200 tables)."""
    path = snapshot.manifest_list
    with _manifest_lists_lock:
        held = _manifest_lists.get(path)
    if held is None:
        held = tuple(snapshot.manifests(io))
        with _manifest_lists_lock:
            _manifest_lists[path] = held
    return list(held)


def remember_manifests(manifest_list: str, manifests: Sequence[ManifestFile]) -> None:
    """Hold what a manifest list just written holds, as :func:`manifests_of` would read it
    back: the next commit to the table reads its parent's manifests from here
    (coordinator/manifest_writers.py)."""
    with _manifest_lists_lock:
        _manifest_lists[manifest_list] = tuple(manifests)
