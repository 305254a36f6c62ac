"""Catalogs and manifest lists on pyiceberg 0.12, for the coordinator's many commits per round.

- :func:`manifests_of`: a snapshot's manifests, each manifest list read once per process, and
  not at all when this process wrote it (:func:`remember_manifests`).
- :func:`sqlite_catalog_properties`: a SQL catalog in a local SQLite file that several
  processes share (the embedded stack's, the tests' and the benchmarks').
- :func:`sqlite_init_lock`: processes that open a new SQLite catalog together create its
  tables one at a time (pyiceberg checks, then creates: the others' CREATE TABLE failed).
- :class:`NewTable`: one table of a SQL catalog's ``create_table_batch`` (the agents create a
  fetch's new dynamic tables together; the coordinator's SQL catalog has the method).
- :func:`use_sql_catalog`: the class :func:`icesink.shared.iceberg.load_catalog` builds a SQL catalog
  as (pyiceberg's own until :func:`coordinator.iceberg_ext.install` names its cheaper one).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pyarrow as pa
from cachetools import LRUCache
from pyiceberg.catalog.sql import SqlCatalog as _PyicebergSqlCatalog
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestFile
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Identifier, Properties
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

__all__ = [
    "SQLITE_BUSY_TIMEOUT_S", "NewTable", "manifests_of", "remember_manifests", "sql_catalog_class", "sqlite_catalog_properties",
    "sqlite_init_lock", "use_sql_catalog",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewTable:
    """One table of :meth:`SqlCatalog.create_table_batch`: ``create_table``'s arguments."""

    identifier: str | Identifier
    schema: Schema | pa.Schema
    partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC
    properties: Properties = field(default_factory=dict)
    location: str | None = None
    sort_order: SortOrder = UNSORTED_SORT_ORDER


_sql_catalog: type[_PyicebergSqlCatalog] = _PyicebergSqlCatalog


def use_sql_catalog(cls: type[_PyicebergSqlCatalog]) -> None:
    """Build SQL catalogs as ``cls`` from now on (:func:`icesink.shared.iceberg.load_catalog`)."""
    global _sql_catalog
    _sql_catalog = cls


def sql_catalog_class() -> type[_PyicebergSqlCatalog]:
    """The class a SQL catalog is built as: pyiceberg's, or the one :func:`use_sql_catalog` named."""
    return _sql_catalog


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
    (coordinator/iceberg_ext/manifest_writers.py)."""
    with _manifest_lists_lock:
        _manifest_lists[manifest_list] = tuple(manifests)
