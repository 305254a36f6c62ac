"""Cheaper table commits on pyiceberg 0.12, for the coordinator's many commits per round.

- :func:`staged_metadata`: ``update_table_metadata`` without its final deep copy of the whole
  metadata (a quarter of a commit's CPU, growing with the snapshots).
- :class:`SqlCatalog`: pyiceberg's SQL catalog (SQLite, PostgreSQL) whose commit starts from the
  caller's table, instead of loading and parsing its metadata file again (a third of a commit's
  CPU), and updates the pointer with one plain compare-and-set statement that succeeds only
  while the catalog still points at that table's metadata file. Anything else (a stale table,
  whose compare-and-set fails; a new table; a dialect without reliable row counts) takes
  pyiceberg's own path. It writes metadata files as pyiceberg does, but reads pyiceberg's
  configuration (files and environment) once per process, not for every file, and each
  snapshot's and log entry's JSON once (:class:`SnapshotJson`). Its ``create_table`` returns
  the table it wrote rather than reading it back.
  :func:`coordinator.iceberg_ext.install` makes ``icesink.shared.iceberg.load_catalog`` use it for
  every SQL catalog (:func:`icesink.shared.catalogs.use_sql_catalog`).

Both are pinned to pyiceberg 0.12 (pyproject.toml); tests/unit/test_catalogs.py holds them to
pyiceberg's own results.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from itertools import islice
from typing import Any, Final

import pyarrow as pa
from pyiceberg.catalog import LOCATION, WAREHOUSE_LOCATION, Catalog
from pyiceberg.catalog.sql import IcebergTables
from pyiceberg.catalog.sql import SqlCatalog as _PyicebergSqlCatalog
from pyiceberg.exceptions import TableAlreadyExistsError
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import NOOP_COMPRESSOR, Compressor
from pyiceberg.table import CommitTableResponse, StagedTable, Table, TableProperties
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, TableMetadataCommonFields, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.snapshots import MetadataLogEntry, Snapshot, SnapshotLogEntry
from pyiceberg.table.update import (
    AddSnapshotUpdate, TableRequirement, TableUpdate, _apply_table_update, _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties
from pyiceberg.utils.config import Config
from pyiceberg.utils.datetime import datetime_to_millis
from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from icesink.shared.catalogs import NewTable

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
        before, staged = staged, _apply_table_update(u, staged, context)
        if isinstance(u, AddSnapshotUpdate):
            _SNAPSHOT_INDEX.extended(staged.table_uuid, before.snapshots, staged.snapshots, u.snapshot)
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
    bench/history_bench.py). Any other id in an index of the table's list (:class:`SnapshotIndex`):
    a commit asks three times for its new snapshot's id, which is not there. Snapshot ids are
    unique, so the answer is the same."""
    snapshots = self.snapshots
    if snapshots and snapshots[-1].snapshot_id == snapshot_id:
        return snapshots[-1]
    return _SNAPSHOT_INDEX.find(self.table_uuid, snapshots, snapshot_id)


@dataclass(frozen=True)
class _Indexed:
    """A snapshot list and the positions by id it is looked up in (its length when indexed)."""

    snapshots: list[Snapshot]
    positions: dict[int, int]
    length: int


class SnapshotIndex:
    """Snapshots by id, for each table's last lists asked about. A metadata's list is never
    changed in place (the models are frozen; an update makes a new list), so an index serves
    while its list is alive: it is kept with the list (a list of another length is indexed
    again). A list a commit made from another by adding a snapshot (:func:`staged_metadata`,
    pyiceberg's AddSnapshotUpdate) shares that one's positions, the new snapshot's added
    (:meth:`extended`): indexing each commit's list anew read every snapshot of the history, at
    700 snapshots beside 199 other tables' histories 0.5 ms of a 4 ms commit (issue 42 target 6).
    The lists sharing positions all begin alike, so an id holds one position in all of them; a
    position found is checked against the list asked about."""

    TABLES: Final = 1024  # tables whose lists are kept: every table of a 200-table round
    PER_TABLE: Final = 8  # a commit's base, its staged and committed lists, maintenance's

    def __init__(self) -> None:
        self._tables: OrderedDict[object, list[_Indexed]] = OrderedDict()
        self._lock = threading.Lock()

    def find(self, table: object, snapshots: list[Snapshot], snapshot_id: int) -> Snapshot | None:
        """The snapshot of ``snapshots`` (table ``table``'s) with ``snapshot_id``, or None."""
        at = self._positions(table, snapshots).get(snapshot_id)
        if at is None or at >= len(snapshots):
            return None
        found = snapshots[at]
        return found if found.snapshot_id == snapshot_id else None

    def extended(self, table: object, base: list[Snapshot], snapshots: list[Snapshot], added: Snapshot) -> None:
        """``snapshots`` is ``base`` and ``added`` after it: it shares ``base``'s positions, if
        ``base`` has them and ``added``'s id has no other position there."""
        if len(snapshots) != len(base) + 1 or snapshots[-1] is not added or (base and snapshots[-2] is not base[-1]):
            return
        with self._lock:
            known = self._known(table, base)
            if known is None or known.positions.setdefault(added.snapshot_id, len(base)) != len(base):
                return
            self._keep(table, _Indexed(snapshots, known.positions, len(snapshots)))

    def _positions(self, table: object, snapshots: list[Snapshot]) -> dict[int, int]:
        with self._lock:
            known = self._known(table, snapshots)
            if known is not None:
                return known.positions
        positions = dict(zip(map(_SNAPSHOT_ID, snapshots), range(len(snapshots))))
        with self._lock:
            self._keep(table, _Indexed(snapshots, positions, len(snapshots)))
        return positions

    def _known(self, table: object, snapshots: list[Snapshot]) -> _Indexed | None:
        """``snapshots``' entry, kept as its table's newest (and the table as the newest)."""
        lists = self._tables.get(table, [])
        for i, entry in enumerate(lists):
            if entry.snapshots is snapshots and entry.length == len(snapshots):
                if i:
                    lists.insert(0, lists.pop(i))
                self._tables.move_to_end(table)
                return entry
        return None

    def _keep(self, table: object, entry: _Indexed) -> None:
        lists = self._tables.setdefault(table, [])
        lists.insert(0, entry)
        del lists[self.PER_TABLE:]
        self._tables.move_to_end(table)
        while len(self._tables) > self.TABLES:
            self._tables.popitem(last=False)


_SNAPSHOT_ID: Final = operator.attrgetter("snapshot_id")
_SNAPSHOT_INDEX: Final = SnapshotIndex()


def install_snapshot_lookup() -> None:
    """Every table metadata of this process finds snapshots with :func:`snapshot_by_id`."""
    TableMetadataCommonFields.snapshot_by_id = snapshot_by_id  # type: ignore[method-assign]


def snapshot_lookup_installed() -> bool:
    return TableMetadataCommonFields.snapshot_by_id is snapshot_by_id


_NAMES_PER_QUERY = 500  # SQLite's older builds take at most 999 parameters a statement


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

    def create_table(self, identifier: str | Identifier, schema: Schema | pa.Schema, location: str | None = None,
                     partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
                     sort_order: SortOrder = UNSORTED_SORT_ORDER, properties: Properties = EMPTY_DICT) -> Table:
        """pyiceberg 0.12's ``SqlCatalog.create_table`` less two reads of what it has at hand:
        whether the namespace exists is asked once (with its properties, for the table's
        location), not twice, and the table returned is the one written, not its metadata file
        read back and parsed (a round routed to 200 new tables creates them all first)."""
        return self.create_table_batch([NewTable(identifier, schema, partition_spec, properties, location, sort_order)])[0]

    def create_table_batch(self, tables: Sequence[NewTable]) -> list[Table]:
        """:meth:`create_table` for several tables in one transaction, each namespace's
        properties read once: a fetch routed to 200 new tables made 200 transactions and read
        its namespace 200 times (agents/tables.py ``create_targets``). All or none: a missing
        namespace raises NoSuchNamespaceError, a name taken (here or in the catalog)
        TableAlreadyExistsError, and then no table is created and no metadata file is left."""
        homes: dict[str, Properties] = {}  # namespace -> its properties
        rows, made, written = [], [], []
        try:
            for new in tables:
                namespace = Catalog.namespace_to_string(Catalog.namespace_from(new.identifier))
                table_name = Catalog.table_name_from(new.identifier)
                if namespace not in homes:  # NoSuchNamespaceError when it is missing
                    homes[namespace] = self.load_namespace_properties(namespace)
                location = (new.location or self._default_location(homes[namespace], namespace, table_name)).rstrip("/")
                version = int(new.properties.get(TableProperties.FORMAT_VERSION, TableProperties.DEFAULT_FORMAT_VERSION))
                schema = self._convert_schema_if_needed(new.schema, version)  # type: ignore[arg-type]
                metadata_location = load_location_provider(location, new.properties).new_table_metadata_file_location()
                metadata = new_table_metadata(location=location, schema=schema, partition_spec=new.partition_spec,
                                              sort_order=new.sort_order, properties=new.properties)
                io = load_file_io(properties=self.properties, location=metadata_location)
                self._write_metadata(metadata, io, metadata_location)
                written.append((io, metadata_location))
                rows.append(self._create_table_row(namespace, table_name, metadata_location))
                made.append(Table(identifier=Catalog.identifier_to_tuple(namespace) + (table_name,), metadata=metadata,
                                  metadata_location=metadata_location,
                                  io=self._load_file_io(metadata.properties, metadata_location), catalog=self))
            if len({(r["table_namespace"], r["table_name"]) for r in rows}) < len(rows):
                raise TableAlreadyExistsError(f"a table is named twice among {[t.name() for t in made]}")
            with Session(self.engine) as session:
                try:
                    session.execute(insert(IcebergTables), rows)
                    session.commit()
                except IntegrityError as e:
                    raise TableAlreadyExistsError(
                        "Table " + ("{table_namespace}.{table_name}".format(**rows[0]) if len(rows) == 1 else
                                    f"among {', '.join(str(t.name()) for t in made)}") + " already exists") from e
        except BaseException:
            for io, path in written:
                _delete_quietly(io, path)
            raise
        return made

    def load_tables(self, names: Sequence[str]) -> dict[str, Table]:
        """``load_table`` for several tables, their rows read by one query: a first round of 200
        new tables loaded them one query each (about 1.5 ms of ORM apiece on SQLite) before its
        first commit (coordinator/files.py ``TableRoots.load``). Each table's metadata file is
        read as ``load_table`` reads it. Names that are no table here, or no table name at all,
        are left out: ``load_table`` says why for each."""
        wanted: dict[tuple[str, str], str] = {}
        for name in names:
            try:
                wanted[(Catalog.namespace_to_string(Catalog.namespace_from(name)), Catalog.table_name_from(name))] = name
            except ValueError:  # no namespace
                continue
        by_namespace: dict[str, list[str]] = {}
        for namespace, table_name in wanted:
            by_namespace.setdefault(namespace, []).append(table_name)
        found: list[IcebergTables] = []
        with Session(self.engine) as session:
            for namespace, table_names in by_namespace.items():
                for start in range(0, len(table_names), _NAMES_PER_QUERY):
                    stmt = select(IcebergTables).where(
                        IcebergTables.catalog_name == self.name, IcebergTables.table_namespace == namespace,
                        IcebergTables.table_name.in_(table_names[start:start + _NAMES_PER_QUERY]))
                    if (type_filter := self._iceberg_type_filter()) is not None:
                        stmt = stmt.where(type_filter)
                    found.extend(session.scalars(stmt).all())
        return {wanted[(row.table_namespace, row.table_name)]: self._convert_orm_to_iceberg(row) for row in found}

    def _default_location(self, namespace_properties: Properties, namespace: str, table_name: str) -> str:
        if namespace_location := namespace_properties.get(LOCATION):
            return f"{namespace_location.rstrip('/')}/{table_name}"
        if warehouse := self.properties.get(WAREHOUSE_LOCATION):
            return f"{warehouse.rstrip('/')}/{namespace}/{table_name}"
        raise ValueError("No default path is set, please specify a location when creating a table")

    @staticmethod
    def _write_metadata(metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:
        """pyiceberg's own commit paths (a new table, a stale one) write through :meth:`_write_file` too."""
        SqlCatalog._write_file(metadata, io, metadata_path)

    @staticmethod
    def _write_file(metadata: TableMetadata, io: FileIO, metadata_path: str) -> tuple[Listed, ...]:
        """pyiceberg 0.12's ``ToOutputFile.table_metadata``, the same bytes, without building a
        ``Config`` for every file: that searches for and parses pyiceberg's configuration file
        and walks the environment, for every commit (see bench/README.md, commit_bench --profile)."""
        output = io.new_output(metadata_path)
        with output.create(overwrite=False) as stream:
            # None values are written when asked (legacy-current-snapshot-id dumps -1), as pyiceberg does.
            pieces, lists = SNAPSHOT_JSON.dump(metadata, exclude_none=not _legacy_current_snapshot_id())
            compressor = Compressor.get_compressor(output.location)
            if compressor is NOOP_COMPRESSOR:
                for piece in pieces:
                    stream.write(piece)
            else:
                stream.write(compressor.bytes_compressor()(b"".join(pieces)))
        return lists  # each entry's JSON, kept once the file is committed (SnapshotJson.keep)


#: A snapshot's id, manifest list and parent id: what may differ between two snapshots of one id.
SnapshotKey = tuple[int, str, int | None]


@dataclass(frozen=True)
class Listed:
    """One list of a metadata file as JSON: each entry's UTF-8 text by its key (a snapshot's
    :data:`SnapshotKey`, a log entry's values), the texts joined as the file lists them, and
    the entries themselves in that order (frozen models: the next commit's metadata holds the
    same objects)."""

    texts: dict[Hashable, bytes]
    joined: bytes
    items: list[Any]


NOTHING_LISTED: Final = Listed({}, b"", [])


class SnapshotJson:
    """A table's metadata file as JSON, each snapshot and each log entry serialized once: a
    committed snapshot never changes, and a table's metadata file lists every snapshot it
    keeps, one snapshot-log entry each, and its last metadata files (the metadata log), so
    dumping them all again made a commit's cost grow with the history (at 1 s rounds and ten
    minutes' retention, 700 snapshots: the snapshots about 40 % of a commit, the logs 0.36 ms
    more; bench/history_bench.py). Keeps, per table (its uuid), the JSON of the entries of its
    last metadata file whose commit went through (:meth:`keep`): a refused commit's snapshot is
    made again by pyiceberg's retry under the same id with another manifest list, so only
    committed files are kept, a snapshot keyed by id and manifest list, and parent id
    (pyiceberg's expiry drops the parent of a snapshot whose parent it removes). A commit that
    only adds entries to a list (every round's, to the snapshots and the snapshot log) appends
    their JSON to the list joined before, without a pass over the kept ones; a list that lost
    entries (expiry's commit; the metadata log, which drops its oldest file) is joined again
    from the texts kept. The bytes are pyiceberg's ``model_dump_json``
    (tests/unit/test_catalogs.py)."""

    def __init__(self) -> None:
        self._tables: dict[tuple[object, bool], tuple[Listed, ...]] = {}
        self._lock = threading.Lock()

    def dump(self, metadata: TableMetadata, *, exclude_none: bool) -> tuple[list[bytes], tuple[Listed, ...]]:
        """The metadata file's JSON (UTF-8) in pieces to write one after the other (a 600 KB
        file joined was one more copy of it), and its lists' for :meth:`keep`."""
        with self._lock:
            known = self._tables.get((metadata.table_uuid, exclude_none), ())
        lists = tuple(_listed(getattr(metadata, field), known[i] if known else NOTHING_LISTED, key, exclude_none)
                      for i, (field, _, key) in enumerate(_LISTS))
        body = metadata.model_copy(update={field: [] for field, _, _ in _LISTS}).model_dump_json(
            exclude_none=exclude_none)
        if any(body.count(mark) != 1 for _, mark, _ in _LISTS):  # not the layout this was written for
            return [metadata.model_dump_json(exclude_none=exclude_none).encode("utf-8")], ()
        pieces: list[bytes] = []
        at = 0
        for where, mark, listed in sorted((body.index(mark), mark, listed)
                                          for (_, mark, _), listed in zip(_LISTS, lists, strict=True)):
            pieces += [body[at:where].encode("utf-8"), mark[:-1].encode("utf-8"), listed.joined, b"]"]
            at = where + len(mark)
        pieces.append(body[at:].encode("utf-8"))
        return pieces, lists

    def keep(self, metadata: TableMetadata, lists: tuple[Listed, ...]) -> None:
        """``metadata``'s file is committed: its entries' JSON serves the table's next commits
        (only these: expired snapshots and dropped log entries are let go)."""
        if lists:
            with self._lock:
                self._tables[(metadata.table_uuid, not _legacy_current_snapshot_id())] = lists


def _listed(items: list[Any], known: Listed, key: Callable[[Any], Hashable], exclude_none: bool) -> Listed:
    """``items`` as :class:`Listed`, from what ``known`` (the table's last committed file's) holds."""
    if known.items and _extends(items, known, key):  # entries added, none removed: the last list extended
        added = {key(e): entry_json(e, exclude_none) for e in items[len(known.items):]}
        # The texts grow in place (a copy was a pass over them all): a key names one text, so
        # ``known`` still finds its own, and a list that loses entries starts a new dict below.
        known.texts.update(added)
        return Listed(known.texts, b",".join([known.joined, *added.values()]), list(items))
    keys = [key(e) for e in items]
    texts = {k: known.texts.get(k) or entry_json(e, exclude_none) for k, e in zip(keys, items, strict=True)}
    return Listed(texts, b",".join(texts[k] for k in keys), list(items))


def entry_json(entry: Snapshot | SnapshotLogEntry | MetadataLogEntry, exclude_none: bool) -> bytes:
    """One snapshot or log entry as its table's metadata file lists it (UTF-8)."""
    return entry.model_dump_json(exclude_none=exclude_none, by_alias=True).encode("utf-8")


def _key(snapshot: Snapshot) -> SnapshotKey:
    return snapshot.snapshot_id, snapshot.manifest_list, snapshot.parent_snapshot_id


def _extends(items: list[Any], known: Listed, key: Callable[[Any], Hashable]) -> bool:
    """Whether ``items`` begin with ``known``'s: the same objects (a commit's metadata keeps
    its base's entries, a pass in C), else the same keys (a table loaded again)."""
    kept = len(known.items)
    if len(items) < kept:
        return False
    if all(map(operator.is_, islice(items, kept), known.items)):
        return True
    return list(map(key, islice(items, kept))) == list(map(key, known.items))


# The lists a metadata file is spliced from: the field, its text in a body dumped with the list
# empty, and what tells two entries apart (a log entry: all it holds).
_LISTS: Final[tuple[tuple[str, str, Callable[[Any], Hashable]], ...]] = (
    ("snapshots", '"snapshots":[]', _key),
    ("snapshot_log", '"snapshot-log":[]', operator.attrgetter("snapshot_id", "timestamp_ms")),
    ("metadata_log", '"metadata-log":[]', operator.attrgetter("metadata_file", "timestamp_ms")),
)


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
