"""Which files the coordinator may commit and delete: only data files under their table's own
location, and never one a snapshot references.

The control topic is input, not trust (design/exactly-once.md). A ``DataWritten`` naming a file
outside its table's location (or the table's ``write.data.path``) is refused when it is read, so
the coordinator neither commits nor deletes it: its response counts as incomplete and is rejected.
A file handed to deletion (a rejected or abandoned response) is deleted only if it lies under its
table's location, no snapshot of that table references it, and no accepted response names it.
Blocking (catalog, manifests, storage): call through ``Offload``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.schema import index_by_id
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType, BooleanType, DateType, DecimalType, DoubleType, FixedType, FloatType, IcebergType, IntegerType,
    ListType, LongType, MapType, StringType, StructType, TimestampNanoType, TimestamptzNanoType, TimestamptzType,
    TimestampType, TimeType, UUIDType,
)

from coordinator.gc import normalize, prune_write_dirs, referenced_files
from coordinator.state import TableFile

log = logging.getLogger(__name__)

_ROOT_PROPERTIES = ("write.data.path", "write.object-storage.path", "write.folder-storage.path")


def data_roots(table: Table) -> tuple[str, ...]:
    """The table's location and any data path its properties name, each ending in ``/``."""
    roots = {normalize(table.location())}
    roots.update(normalize(v) for k in _ROOT_PROPERTIES if (v := table.properties.get(k)))
    return tuple(sorted(r.rstrip("/") + "/" for r in roots))


def confined(path: str, roots: Iterable[str]) -> bool:
    p = normalize(path)
    return ".." not in p.split("/") and any(p.startswith(r) for r in roots)


class TableRoots:
    """Each table's data roots, loaded once per coordinator. ``loaded`` is handed each table
    loaded for them (the round commits' table cache: a new table's first commit starts from it
    instead of loading it again)."""

    def __init__(self, catalog: Catalog, loaded: Callable[[str, Table], None] | None = None) -> None:
        self.catalog = catalog
        self._loaded = loaded
        self._roots: dict[str, tuple[str, ...]] = {}

    def known(self, table: str) -> bool:
        """Whether ``outside`` answers for ``table`` without loading it."""
        return table in self._roots

    def outside(self, table: str, paths: Sequence[str]) -> list[str]:
        """The paths not under ``table``'s roots: all of them if the table does not exist."""
        roots = self._roots.get(table)
        if roots is None:
            try:
                loaded = self.catalog.load_table(table)
            except (NoSuchTableError, ValueError):  # ValueError: a name the catalog cannot look up
                return list(paths)
            roots = self._add(table, loaded)
        return [p for p in paths if not confined(p, roots)]

    def load(self, tables: Sequence[str]) -> None:
        """Load the tables not known yet in one call where the catalog can (icesink's SQL
        catalog: one query for all). Others, and tables not found, are left to :meth:`outside`."""
        load_tables = getattr(self.catalog, "load_tables", None)
        names = [t for t in tables if t not in self._roots]
        if load_tables is not None and names:
            for name, loaded in load_tables(names).items():
                self._add(name, loaded)

    def _add(self, table: str, loaded: Table) -> tuple[str, ...]:
        roots = self._roots[table] = data_roots(loaded)
        if self._loaded is not None:
            self._loaded(table, loaded)
        return roots


def delete_uncommitted(
    catalog: Catalog,
    files: Sequence[TableFile],
    accepted: set[str],
    manifests: dict[str, frozenset[str]],
) -> Counter[str]:
    """Delete files that can never be committed; keep (and log) any that the rules above
    protect. Returns how many were deleted (``deleted``) and kept, by reason."""
    out: Counter[str] = Counter()
    by_table: dict[str, list[TableFile]] = {}
    for tf in files:
        by_table.setdefault(tf.table, []).append(tf)
    for name, tfs in by_table.items():
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            log.warning("table %s does not exist: %d uncommitted files left to `icesink gc`", name, len(tfs))
            out["no-table"] += len(tfs)
            continue
        roots = data_roots(table)
        referenced = referenced_files(table, manifests)
        gone: list[str] = []
        for tf in tfs:
            path = normalize(tf.path)
            if not confined(tf.path, roots):
                log.error("not deleting %s: outside table %s (expected under %s)", tf.path, name, " or ".join(roots))
                out["outside-table"] += 1
            elif path in referenced:
                log.error("not deleting %s: a snapshot of %s references it (a committed file)", tf.path, name)
                out["committed"] += 1
            elif path in accepted:
                log.error("not deleting %s: an accepted response of %s names it", tf.path, name)
                out["accepted"] += 1
            else:
                try:
                    table.io.delete(tf.path)
                    log.info("deleted %s of table %s: its response was rejected or abandoned", tf.path, name)
                except FileNotFoundError:
                    pass
                except Exception as exc:  # noqa: BLE001 - cleanup never stops commits; gc retries
                    log.warning("could not delete uncommitted file %s (icesink gc will): %s", tf.path, exc)
                    out["delete-failed"] += 1
                    continue
                out["deleted"] += 1
                gone.append(tf.path)
        prune_write_dirs(table.location(), gone)
    return out


FIELD_ID = b"PARQUET:field_id"


def _file_fields(fields: Iterable[pa.Field], out: dict[int, tuple[str | None, pa.DataType]],
                 named: bool = True) -> dict[int, tuple[str | None, pa.DataType]]:
    """Each field id of an Arrow schema read from a Parquet footer with its field's name and type.
    Names of list elements and map keys and values are the writer's own (``element``, ``item``...):
    only top-level and struct fields' names are kept (None for the others); nested ones are walked
    all the same."""
    for f in fields:
        raw = (f.metadata or {}).get(FIELD_ID)
        if raw is not None:
            out[int(raw)] = (f.name if named else None, f.type)
        t = f.type
        if pa.types.is_struct(t):
            _file_fields((t.field(i) for i in range(t.num_fields)), out)
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            _file_fields([t.value_field], out, named=False)
        elif pa.types.is_map(t):
            _file_fields([t.key_field, t.item_field], out, named=False)
    return out


def field_id_mismatch(table: Table, paths: Sequence[str]) -> str | None:
    """Where a data file's field ids name other columns than the table's schema gives them, or
    columns of a type the table's cannot read (a table dropped and created again numbers its
    columns anew, maybe with the same names), or None. Reads each file's footer: for a table
    that holds none of the group's state yet (fresh, or created again)."""
    by_id = index_by_id(table.schema())
    for path in paths:
        if path.endswith((".orc", ".avro")):  # Spark's ORC and Avro files have no field ids: read by the name mapping
            continue
        with table.io.new_input(path).open() as stream:
            found = _file_fields(pq.read_schema(stream), {})
        for field_id, (name, file_type) in sorted(found.items()):
            field = by_id.get(field_id)
            if field is None:
                continue
            if name is not None and field.name != name:
                return (f"{path}: field id {field_id} is column {name!r} in the file, {field.name!r} in the "
                        "table's schema")
            if not readable_as(file_type, field.field_type):
                return (f"{path}: field id {field_id} ({field.name!r}) is {file_type} in the file, "
                        f"{field.field_type} in the table's schema")
    return None


def readable_as(file_type: pa.DataType, table_type: IcebergType) -> bool:
    """Whether a Parquet column of ``file_type`` (as Arrow reads it) holds values of the Iceberg
    ``table_type``: the same kind, and no wider than it (int into long, float into double, a
    decimal of the same scale and no more digits), as Iceberg's type promotion allows."""
    kind, size = _file_kind(file_type)
    want, room = _table_kind(table_type)
    return kind == want and size <= room


def _file_kind(t: pa.DataType) -> tuple[str, int]:
    if isinstance(t, pa.BaseExtensionType):  # arrow.uuid and the like: what they are stored as
        return _file_kind(t.storage_type)
    if pa.types.is_integer(t):
        return "integer", t.bit_width
    if pa.types.is_floating(t):
        return "floating", t.bit_width
    if pa.types.is_decimal(t):
        return f"decimal scale {t.scale}", t.precision
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string", 0
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary", 0
    if pa.types.is_timestamp(t):
        return ("timestamptz" if t.tz else "timestamp"), 0
    for kind, test in (("boolean", pa.types.is_boolean), ("date", pa.types.is_date), ("time", pa.types.is_time),
                       ("struct", pa.types.is_struct), ("map", pa.types.is_map)):
        if test(t):
            return kind, 0
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return "list", 0
    return str(t), 0


def _table_kind(t: IcebergType) -> tuple[str, int]:
    widths = {IntegerType: ("integer", 32), LongType: ("integer", 64), FloatType: ("floating", 32),
              DoubleType: ("floating", 64), StringType: ("string", 0), BinaryType: ("binary", 0),
              UUIDType: ("binary", 0), BooleanType: ("boolean", 0), DateType: ("date", 0), TimeType: ("time", 0),
              TimestampType: ("timestamp", 0), TimestamptzType: ("timestamptz", 0),
              TimestampNanoType: ("timestamp", 0), TimestamptzNanoType: ("timestamptz", 0),
              StructType: ("struct", 0), ListType: ("list", 0), MapType: ("map", 0)}
    if isinstance(t, DecimalType):
        return f"decimal scale {t.scale}", t.precision
    if isinstance(t, FixedType):
        return "binary", 0
    return widths.get(type(t), (str(t), 0))
