"""pyiceberg glue shared by agents and coordinator: the catalog, data files to and from the
protocol's FileInfo, and the sink state read back from a table (its keys and format:
icesink/shared/protocol/summary.py).

Blocking calls; callers run them off the event loop.
"""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from uuid import UUID

from pyiceberg.catalog import Catalog, load_catalog as _load_catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record
from pyiceberg.types import BinaryType, DecimalType, FixedType, IcebergType, UUIDType

from icesink.shared.config import MAIN_BRANCH, Settings
from icesink.shared.errors import ConfigError, RewindPending, TableChangedError
from icesink.shared.protocol import COMMIT_ID, EPOCH, GROUP, LOG_ID, POSITIONS, VALID_THROUGH, WATERMARK, FileInfo, SinkState
from icesink.shared.protocol.summary import flat_positions, rewind_pending_property, state_property

# What the tables the sink creates hold unless auto-create-props say otherwise: every commit
# writes a metadata file of the table's whole history (600 KB after some hundred snapshots), and
# Iceberg keeps each one unless told to delete all but the last write.metadata.previous-versions-max
# (100) after a commit: at 1 s rounds a table grew by that much a second, and its commits slowed.
CREATED_TABLE_PROPERTIES = {"write.metadata.delete-after-commit.enabled": "true"}



def catalog_properties(settings: Settings) -> dict[str, str]:
    if settings.embedded_catalog:
        from icesink.shared.catalogs import sqlite_catalog_properties

        directory = settings.state_dir.resolve() / "catalog"
        directory.mkdir(parents=True, exist_ok=True)
        return {**sqlite_catalog_properties(directory), **settings.catalog_props}
    return dict(settings.catalog_props)


def load_catalog(settings: Settings) -> Catalog:
    """The sink's catalog; a SQL catalog as :func:`icesink.shared.catalogs.sql_catalog_class` (once the
    composition root installed coordinator/iceberg_ext/: its cheaper commits)."""
    from pyiceberg.catalog.sql import SqlCatalog as _SqlCatalog

    from icesink.shared.catalogs import sql_catalog_class, sqlite_init_lock

    props = catalog_properties(settings)
    with sqlite_init_lock(props.get("uri", "")):  # replicas opening a new SQLite catalog together
        catalog = _load_catalog(settings.catalog_name, **props)
        sql_catalog = sql_catalog_class()
        if type(catalog) is _SqlCatalog and sql_catalog is not _SqlCatalog and "py-catalog-impl" not in props:
            catalog.engine.dispose()  # a user's own implementation (py-catalog-impl) is kept
            catalog = sql_catalog(catalog.name, **catalog.properties)
    return catalog


def total_rows(catalog: Catalog, name: str) -> int:
    """Rows in the table's current snapshot (0 if the table or a snapshot does not exist)."""
    if not catalog.table_exists(name):
        return 0
    snap = catalog.load_table(name).current_snapshot()
    if not snap:
        return 0
    total = snap.summary["total-records"] if snap.summary is not None else None
    assert total is not None, name  # pyiceberg writes every snapshot's summary with its totals
    return int(total)


def split_name(table: str) -> tuple[str, str]:
    namespace, _, name = table.rpartition(".")
    return namespace, name


# Data files <-> control events ---------------------------------------------------------------


def mirror_keys(settings: Settings, name: str, table: Table) -> tuple[str, ...] | None:
    """The key columns of mirror table ``name`` (docs/mirror-tables.md), None when the sink
    makes no mirror tables. The key: ``iceberg.table.<name>.id-columns``, else
    ``iceberg.tables.default-id-columns``, else the table's identifier fields. Raises
    :class:`ConfigError` naming the key for a table that cannot be a mirror table."""
    if not settings.mirror:
        return None
    key = "iceberg.tables.cdc-field" if settings.cdc_field is not None else "iceberg.tables.upsert-mode-enabled"
    value = settings.cdc_field if settings.cdc_field is not None else True
    if table.format_version < 2:
        raise ConfigError(key, value, f"tables of format version 2 (table {name} has format version "
                          f"{table.format_version}; mirror tables need position deletes)")
    schema = table.schema()
    keys = settings.id_columns(name) or tuple(schema.find_column_name(i) or "" for i in schema.identifier_field_ids)
    if not keys:
        raise ConfigError("iceberg.tables.default-id-columns", None,
                          f"the key columns of mirror table {name} (set it, iceberg.table.{name}.id-columns, or "
                          f"the table's identifier fields; {key}={value} makes every table a mirror table)")
    columns = [f.name for f in schema.fields]
    for k in keys:
        if k not in columns:
            raise ConfigError(
                settings.id_columns_key(name) if settings.id_columns(name) else f"table {name} identifier fields",
                ",".join(keys), f"top-level columns of mirror table {name} ({k!r} is not one of {', '.join(columns)})")
    return keys


def _json_value(v: Any) -> Any:
    """A partition Record value as a JSON scalar: decimals as their exact text, binary, fixed
    and uuid (bytes, or a UUID) as base64; :func:`_partition_value` reads them back by type."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, UUID):
        v = v.bytes
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode("ascii")
    raise TypeError(f"partition value {v!r} of type {type(v).__name__}: expected a JSON scalar, "
                    "Decimal, bytes or UUID (the partition Record types of Iceberg)")


def _partition_value(v: Any, result_type: IcebergType) -> Any:
    """A FileInfo partition value back as the partition Record holds it, for its field's
    result type (the inverse of :func:`_json_value`)."""
    if v is None:
        return None
    if isinstance(result_type, DecimalType):
        return Decimal(v) if isinstance(v, str) else Decimal(str(v))
    if isinstance(result_type, (BinaryType, FixedType, UUIDType)):
        return base64.b64decode(v, validate=True) if isinstance(v, str) else v
    return v


def file_spec(fi: FileInfo, table: Table) -> PartitionSpec:
    """The partition spec ``fi`` was written with, checked against its partition tuple. Raises
    :class:`TableChangedError` when the table no longer has it (dropped and recreated, or its
    metadata replaced): committing the file under another spec would mislabel its partition."""
    spec = table.specs().get(fi.spec_id)
    name = ".".join(table.name())
    if spec is None:
        raise TableChangedError(
            f"table {name}: expected partition spec id {fi.spec_id} (the spec file {fi.path} was written "
            f"with), found spec ids {sorted(table.specs())}: the table was dropped and recreated or its "
            "metadata replaced by another writer; restore it, or stop the sink and delete the group's "
            "control topic and state to start over"
        )
    if len(fi.partition) != len(spec.fields):
        raise TableChangedError(
            f"table {name}: expected {len(spec.fields)} partition values for spec id {fi.spec_id} "
            f"({_fields(spec)}), found {len(fi.partition)} in file {fi.path}: the table was recreated with "
            "other partitioning by another writer; restore it, or start the group over"
        )
    return spec


def to_file_info(df: DataFile, spec_id: int) -> FileInfo:
    """``spec_id``: the spec the file was written for (DataFile.from_args does not keep it)."""
    partition = tuple(_json_value(df.partition[i]) for i in range(len(df.partition)))
    return FileInfo(
        path=df.file_path,
        record_count=df.record_count,
        size_bytes=df.file_size_in_bytes,
        spec_id=spec_id,
        partition=partition,
        column_sizes=tuple(sorted((df.column_sizes or {}).items())),
        value_counts=tuple(sorted((df.value_counts or {}).items())),
        null_value_counts=tuple(sorted((df.null_value_counts or {}).items())),
        nan_value_counts=tuple(sorted((df.nan_value_counts or {}).items())),
        lower_bounds=tuple(sorted((df.lower_bounds or {}).items())),
        upper_bounds=tuple(sorted((df.upper_bounds or {}).items())),
        split_offsets=tuple(df.split_offsets or ()),
    )


def _fields(spec: PartitionSpec) -> str:
    return ", ".join(f"{f.name}={f.transform}" for f in spec.fields) or "unpartitioned"


def file_format_of(path: str) -> FileFormat:
    """A data file's format by its name's ending, as Iceberg's ``FileFormat.fromFileName``: the
    files Spark writes end in ``.orc``, ``.avro`` or ``.parquet`` (write.format.default, spark_bridge/files.py)."""
    if path.endswith(".orc"):
        return FileFormat.ORC
    return FileFormat.AVRO if path.endswith(".avro") else FileFormat.PARQUET


def to_data_file(fi: FileInfo, table: Table) -> DataFile:
    """The DataFile to commit, under the spec it was written with (:func:`file_spec`)."""
    spec = file_spec(fi, table)
    types = [f.field_type for f in spec.partition_type(table.schema()).fields]
    try:
        partition = Record(*(_partition_value(v, t) for v, t in zip(fi.partition, types, strict=True)))
    except (ValueError, ArithmeticError) as exc:  # binascii.Error is a ValueError
        raise TableChangedError(
            f"table {'.'.join(table.name())}: partition values {fi.partition!r} of file {fi.path} do not "
            f"fit spec id {fi.spec_id} ({_fields(spec)}): {exc}; the table was recreated by another writer"
        ) from exc
    df = DataFile.from_args(
        _table_format_version=table.format_version,
        content=DataFileContent.DATA,
        file_path=fi.path,
        file_format=file_format_of(fi.path),
        partition=partition,
        record_count=fi.record_count,
        file_size_in_bytes=fi.size_bytes,
        column_sizes=dict(fi.column_sizes),
        value_counts=dict(fi.value_counts),
        null_value_counts=dict(fi.null_value_counts),
        nan_value_counts=dict(fi.nan_value_counts),
        lower_bounds=dict(fi.lower_bounds),
        upper_bounds=dict(fi.upper_bounds),
        split_offsets=list(fi.split_offsets) or None,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
    )
    df.spec_id = fi.spec_id
    return df


# Sink state: reading it back from a table ---------------------------------------------------


def branch_head(table: Table, branch: str = MAIN_BRANCH) -> Snapshot | None:
    """The snapshot at the head of ``branch`` (None: the branch does not exist yet or has none)."""
    return table.snapshot_by_name(branch)


def ensure_branch(table: Table, name: str, branch: str) -> None:
    """Create ``branch`` of ``table`` (named ``name``) at main's current snapshot when it does not
    exist, as the reference sink's commit to a missing branch does (Iceberg's snapshot producer
    starts it from the table's current snapshot): the branch holds the table's rows so far, then
    the sink's. A table without a snapshot gets the branch from the commit's own snapshot.
    A tag of that name refuses the commit (TableChangedError: retried, the table parked)."""
    ref = table.metadata.refs.get(branch)
    if ref is not None and ref.snapshot_ref_type != SnapshotRefType.BRANCH:
        raise TableChangedError(f"table {name}: expected {branch!r} to be a branch to commit to "
                                f"(iceberg.tables.default-commit-branch), found a tag of that name; remove the tag "
                                "or set another commit branch")
    if ref is not None or branch == MAIN_BRANCH:
        return
    current = table.current_snapshot()
    if current is None:
        return
    try:
        table.manage_snapshots().create_branch(current.snapshot_id, branch).commit()
    except CommitFailedException:
        table.refresh()  # another writer changed the table meanwhile (or made the branch)
        if branch not in table.metadata.refs:
            raise


def latest_sink_summary(table: Table, group: str, branch: str = MAIN_BRANCH) -> SinkState | None:
    """``group``'s sink state in ``table``: the table property written with every commit of
    this version (it survives another tool's snapshot expiry), else, for tables written by
    older versions, the newest snapshot in the ancestry of ``branch`` (the one the group
    commits the table to: iceberg.tables.default-commit-branch) written by this group
    (snapshots of other writers carry no icesink keys and are walked past)."""
    raw = table.metadata.properties.get(state_property(group))
    if raw is not None:
        return SinkState.from_json(raw, f"table {'.'.join(table.name())} property {state_property(group)}")
    return _summary_walk(table, group, branch)


def pending_rewinds(catalog: Catalog, settings: Settings, more: Iterable[str] = ()) -> dict[str, str]:
    """Each table of the group (the configured ones, ``more``, and those its rounds name) that
    holds an interrupted rewind of the group, with the rewind's ``--to``."""
    from pyiceberg.exceptions import NoSuchTableError

    group = settings.group_id
    seen: set[str] = set()
    found: dict[str, str] = {}
    todo = [*settings.tables, *more]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            continue
        if (to := table.metadata.properties.get(rewind_pending_property(group))) is not None:
            found[name] = to
        state = latest_sink_summary(table, group, settings.commit_branch(name))
        if state is not None:
            todo += [t for t in state.round_tables if t not in seen]
    return found


def refuse_pending_rewind(catalog: Catalog, settings: Settings, more: Iterable[str] = ()) -> None:
    """:class:`RewindPending` naming the first table that holds an interrupted rewind of the group."""
    found = pending_rewinds(catalog, settings, more)
    if found:
        name, to = sorted(found.items())[0]
        raise RewindPending(
            f"table {name} holds an unfinished rewind of sink group {settings.group_id} (table property "
            f"{rewind_pending_property(settings.group_id)}={to}): the control log still says to read on from the old "
            f"positions, and starting would lose the records rolled back; run `icesink rewind {name} --to {to}` again "
            "to finish it (with the sink stopped), then start the sink")


def _summary_walk(table: Table, group: str, branch: str) -> SinkState | None:
    snap = branch_head(table, branch)
    while snap is not None:
        s = snap.summary
        if s is not None and s[GROUP] == group and s[COMMIT_ID] is not None:
            vt = s[VALID_THROUGH]
            return SinkState(
                snapshot_id=snap.snapshot_id,
                commit_id=str(s[COMMIT_ID]),
                watermark=int(s[WATERMARK] or -1),
                positions={tp: int(off) for tp, off in flat_positions(json.loads(s[POSITIONS] or "{}")).items()},
                epoch=int(s[EPOCH] or 0),
                valid_through_ms=int(vt) if vt is not None else None,
                log_id=s[LOG_ID],
            )
        if snap.parent_snapshot_id is None:
            return None
        snap = table.snapshot_by_id(snap.parent_snapshot_id)
    return None


def local_path(uri: str) -> Path:
    """A local filesystem path for a file:// URI or plain path."""
    return Path(uri.removeprefix("file://"))
