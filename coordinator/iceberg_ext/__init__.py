"""The door to pyiceberg's internals: everything icesink does with pyiceberg's private parts
lives in this package, and the rest of icesink uses only what it exports.

- :mod:`coordinator.iceberg_ext.snapshots`: the committer's fast append, maintenance's replace,
  a transaction that stages its metadata once, icesink's checks before pyiceberg retries.
- :mod:`coordinator.iceberg_ext.manifest_writers`: manifests and manifest lists written with
  Avro writers prepared once per shape.
- :mod:`coordinator.iceberg_ext.deletes`: position delete files and their DELETES manifests.
- :mod:`coordinator.iceberg_ext.catalogs`: a SQL catalog with cheaper commits.

Importing it changes nothing in pyiceberg. :func:`install`, called by the composition root
(icesink/app/) in every process that commits, checks the installed pyiceberg against the pin in
pyproject.toml, then makes every snapshot producer of the process write its manifest list with
:func:`manifest_writers.write_manifest_list`, every table metadata look up snapshots from the newest
(:func:`catalogs.snapshot_by_id`) and ``icesink.shared.iceberg.load_catalog`` build SQL catalogs as
:class:`catalogs.SqlCatalog`. The commit paths call :func:`require_installed`.
"""

from __future__ import annotations

import threading

from coordinator.iceberg_ext import manifest_writers
from coordinator.iceberg_ext.catalogs import (
    SqlCatalog, install_snapshot_lookup, snapshot_lookup_installed, staged_metadata,
)
from coordinator.iceberg_ext.deletes import (
    DELETE_SCHEMA, DeletesManifest, WithPositionDeletes, add_position_deletes, write_position_deletes,
)
from coordinator.iceberg_ext.snapshots import MemoTransaction, Replace, SpecAwareAppend, check_before_retry
from icesink.shared.catalogs import sql_catalog_class, use_sql_catalog
from icesink.shared.errors import IcesinkError
from icesink.shared.pins import check_pinned_versions

__all__ = [
    "DELETE_SCHEMA", "DeletesManifest", "MemoTransaction", "NotInstalled", "Replace", "SpecAwareAppend", "SqlCatalog",
    "WithPositionDeletes", "add_position_deletes", "check_before_retry", "check_versions", "install", "installed",
    "require_installed", "staged_metadata", "write_position_deletes",
]

#: The distribution whose internals this package uses.
LIBRARIES = ("pyiceberg",)

_lock = threading.Lock()


class NotInstalled(IcesinkError):
    """A commit in a process whose composition root did not call :func:`install` (a bug)."""


def check_versions() -> None:
    """Raise :class:`icesink.shared.errors.ConfigError` unless the installed pyiceberg is the pinned one."""
    check_pinned_versions(LIBRARIES, "coordinator/iceberg_ext/")


def install() -> None:
    """Check the pinned pyiceberg, then install icesink's pyiceberg extensions in this process
    (idempotent): manifest lists written with prepared writers, snapshots looked up from the
    newest, SQL catalogs with cheaper commits. Called by the composition root before it builds
    anything that commits."""
    with _lock:
        if installed():
            return
        check_versions()
        manifest_writers.install()
        install_snapshot_lookup()
        use_sql_catalog(SqlCatalog)


def installed() -> bool:
    return manifest_writers.installed() and snapshot_lookup_installed() and sql_catalog_class() is SqlCatalog


def require_installed() -> None:
    """Raise :class:`NotInstalled` unless :func:`install` ran in this process."""
    if not installed():
        raise NotInstalled("coordinator.iceberg_ext.install() was not called in this process: its composition root "
                           "(icesink/app/) must install icesink's pyiceberg extensions before it commits")
