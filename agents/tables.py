"""Target tables of a worker: load, or auto-create from the first records (blocking calls).

When a table exists its schema is the truth and records are coerced to it. Auto-created
tables take the schema inferred from the first batch and the configured partition spec. Without
auto-create, a table that does not exist is refused on a group's first start (:func:`not_created`)
and waited for once the group has run (:func:`holds_group_state`, agents/missing.py).

How a column's JSON values are encoded can be stated in table properties, which become
field metadata of the target's Arrow schema (see agents/convert/):
``icesink.epoch-unit.<dotted column>`` = ``s`` | ``ms`` | ``us`` | ``ns`` for a timestamp, date or
time column whose numbers count another unit than ``iceberg.tables.timestamp-unit``;
``icesink.decimal-encoding.<dotted column>`` = ``connect-bytes`` for a decimal column that
receives Kafka Connect Decimal bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError, NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError,
)
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.types import DoubleType, FloatType, ListType, MapType, NestedField, PrimitiveType, StructType

from agents.convert import DECIMAL_ENCODING, EPOCH_UNIT, check_schema, with_field_metadata
from icesink.shared.catalogs import NewTable, sql_catalog_class
from icesink.shared.config import Settings
from icesink.shared.errors import ConfigError, ProtocolError, UnsupportedTypeError
from icesink.shared.reference_keys import ORC_MIRROR_WHY, UNMAPPED_FORMATS
from icesink.shared.iceberg import CREATED_TABLE_PROPERTIES, latest_sink_summary, mirror_keys, split_name
from icesink.shared.schema_changes import iceberg_schema
from icesink.shared.partitioning import build_partition_spec, parse_partition_by

NAME_MAPPING = "schema.name-mapping.default"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    name: str
    table: Table
    arrow_schema: pa.Schema  # what records are coerced to
    keys: tuple[str, ...] | None = None  # a mirror table's key columns (agents/mirror.py)


def target_of(name: str, table: Table, settings: Settings | None = None) -> Target:
    """The target ``name``; with ``settings`` making mirror tables, its key columns (a table
    that cannot be a mirror table raises :class:`ConfigError` naming the key)."""
    keys = None if settings is None else mirror_keys(settings, name, table)
    if keys is not None and (fmt := table.properties.get("write.format.default", "parquet")).lower() in UNMAPPED_FORMATS:
        raise ConfigError(f"table {name} property write.format.default", fmt, ORC_MIRROR_WHY)
    return Target(name, table, _with_column_metadata(name, schema_to_pyarrow(table.schema()), table.properties), keys)


def _with_column_metadata(name: str, schema: pa.Schema, properties: dict[str, str]) -> pa.Schema:
    """``schema`` with the field metadata of table properties ``icesink.<key>.<column>``."""
    metadata: dict[str, dict[str, str]] = {}
    for key in (EPOCH_UNIT, DECIMAL_ENCODING):
        for prop, value in properties.items():
            if prop.startswith(f"{key}."):
                metadata.setdefault(prop[len(key) + 1 :], {})[key] = value
    if not metadata:
        return schema
    try:
        out = with_field_metadata(schema, metadata)
    except KeyError as exc:
        raise ConfigError(
            f"table {name} properties icesink.*", sorted(metadata), f"columns of {name} ({exc.args[0]})"
        ) from None
    try:
        check_schema(out)
    except UnsupportedTypeError as exc:
        raise ConfigError(f"table {name} properties icesink.* of column {exc.field}", None, str(exc)) from None
    return out


def load_target(catalog: Catalog, name: str, settings: Settings | None = None) -> Target | None:
    try:
        return target_of(name, catalog.load_table(name), settings)
    except NoSuchTableError:
        return None


def not_created(name: str, namespace_exists: bool = True) -> ConfigError:
    """What refuses a missing table without auto-create on a group's first start (agents/missing.py):
    it names the table, and its namespace when that is missing too."""
    if namespace_exists:
        return ConfigError(
            "iceberg.tables.auto-create-enabled", False,
            f"true, or create table {name} before starting (it does not exist)",
        )
    namespace, _ = split_name(name)
    return ConfigError(
        "iceberg.tables.auto-create-enabled", False,
        f"true, or create namespace {namespace} and table {name} before starting (neither exists)",
    )


def holds_group_state(catalog: Catalog, names: list[str], group: str) -> bool:
    """Whether any of the tables ``names`` (as the catalog has them now) holds ``group``'s sink
    state: the group committed to it (agents/missing.py)."""
    for name in names:
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            continue
        try:
            if latest_sink_summary(table, group) is not None:
                return True
        except ProtocolError:  # a state property no longer readable is a state all the same
            return True
    return False


def namespace_exists(catalog: Catalog, namespace: str) -> bool:
    try:
        catalog.load_namespace_properties(namespace)
        return True
    except NoSuchNamespaceError:
        return False


def create_target(catalog: Catalog, settings: Settings, name: str, inferred: pa.Schema | Schema) -> Target:
    """Create ``name`` from an inferred Arrow (or Iceberg) schema; another replica may win the race."""
    if not settings.auto_create:
        raise not_created(name)
    plan = _creation(settings, name, inferred)
    try:
        created = _create_table(catalog, name, **plan)
        log.info("created table %s with schema %s and partition spec %s", name, created.schema(), created.spec())
        # What the catalog holds, not what this creation returned: a catalog that lets two
        # concurrent creations both succeed keeps one (SeaweedFS's REST catalog), and files
        # written under the other's location would be refused by the coordinator for ever.
        # A SQL catalog's creation (pyiceberg's, or the one icesink.shared.catalogs builds) returns
        # the table its insert of a unique row made current: loading it again cost 2 ms of the
        # 15 ms of CPU a new table took.
        try:
            creation = type(catalog).create_table
            sql = creation is SqlCatalog.create_table or creation is sql_catalog_class().create_table
            table = created if sql else catalog.load_table(name)
        except NoSuchTableError:  # dropped at once by another writer: the creation's own, as before
            table = created
        if table.location() != created.location():
            log.info("table %s was created again meanwhile by another replica, at %s: using that", name,
                     table.location())
    except TableAlreadyExistsError:
        table = catalog.load_table(name)
    except Exception as exc:  # a lost race reported as a database integrity error (SQL catalog)
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            raise exc from None
        log.info("table %s was created meanwhile by another replica", name)
    return _mapped_target(catalog, settings, name, table)


def create_targets(catalog: Catalog, settings: Settings, wanted: Mapping[str, pa.Schema | Schema]) -> dict[str, Target]:
    """:func:`create_target` for several tables. The SQL catalog icesink builds creates them in
    one transaction, each namespace read once (a fetch routed to 200 new dynamic tables made
    200 transactions, each reading its namespace). A namespace missing is created first; when
    one of the tables was taken meanwhile, none is, and each is created on its own as
    :func:`create_target` does. Other catalogs create one table after another."""
    batch = getattr(catalog, "create_table_batch", None)
    if not settings.auto_create or batch is None or len(wanted) < 2:
        return {name: create_target(catalog, settings, name, inferred) for name, inferred in wanted.items()}
    plans: dict[tuple[Any, ...], dict[str, Any]] = {}  # tables of one inferred schema and settings share their plan
    new = []
    for name, inferred in wanted.items():
        key = (inferred.to_string() if isinstance(inferred, pa.Schema) else inferred.model_dump_json(),
               settings.id_columns(name), settings.partition_by(name))
        if key not in plans:
            plans[key] = _creation(settings, name, inferred)
        new.append(NewTable(name, **plans[key]))
    try:
        try:
            made = batch(new)
        except NoSuchNamespaceError:  # a first start: the namespaces first, then the tables together
            for namespace in sorted({split_name(name)[0] for name in wanted}):
                _ensure_namespace(catalog, namespace)
            made = batch(new)
    except (TableAlreadyExistsError, NoSuchNamespaceError):
        return {name: create_target(catalog, settings, name, inferred) for name, inferred in wanted.items()}
    for table in made:
        log.info("created table %s with schema %s and partition spec %s", ".".join(table.name()), table.schema(),
                 table.spec())
    return {name: _mapped_target(catalog, settings, name, table) for name, table in zip(wanted, made, strict=True)}


def _creation(settings: Settings, name: str, inferred: pa.Schema | Schema) -> dict[str, Any]:
    """``create_table``'s schema, partition spec and properties for ``name`` from its inferred schema."""
    schema = iceberg_schema(inferred)
    schema = with_identifier_fields(schema, settings.id_columns(name), settings.id_columns_key(name), name)
    if settings.schema_force_optional:
        schema = _all_optional(schema)
    exprs = parse_partition_by(settings.partition_by(name) or "")
    try:
        spec = build_partition_spec(exprs, schema) if exprs else UNPARTITIONED_PARTITION_SPEC
    except ConfigError as exc:
        key = f"iceberg.table.{name}.partition-by" if name in settings.table_partition_by else (
            "iceberg.tables.default-partition-by")
        raise ConfigError(
            key, settings.partition_by(name),
            f"{exc.expected} (the column types were inferred from the first records of {name}; "
            "create the table yourself for other types)",
        ) from None
    # Readers map columns by name where a file lacks field ids (e.g. list elements). The mapping
    # is made from the schema as the catalog numbers it (fresh ids in order, as here); checked
    # by _mapped_target.
    properties = {**CREATED_TABLE_PROPERTIES, **settings.auto_create_props}
    properties.setdefault(NAME_MAPPING, create_mapping_from_schema(assign_fresh_schema_ids(schema)).model_dump_json())
    return {"schema": schema, "partition_spec": spec, "properties": properties}


def _mapped_target(catalog: Catalog, settings: Settings, name: str, table: Table) -> Target:
    """The target of a table just created, its name mapping set if the catalog numbered its
    columns otherwise than the mapping made before (or it is an older table)."""
    mapping = create_mapping_from_schema(table.schema()).model_dump_json()
    if table.properties.get(NAME_MAPPING) is None or (
            NAME_MAPPING not in settings.auto_create_props and table.properties[NAME_MAPPING] != mapping):
        try:  # an older table, or a catalog that numbered the columns otherwise
            with table.transaction() as tx:
                tx.set_properties({NAME_MAPPING: mapping})
        except Exception as exc:  # a concurrent creator set it first
            log.debug("name mapping not set on %s: %s", name, exc)
            table = catalog.load_table(name)
    return target_of(name, table, settings)


def _create_table(catalog: Catalog, name: str, **kwargs: Any) -> Table:
    """``catalog.create_table``, its namespace created first when the catalog says it is missing:
    no read of the namespace before each table (2 ms of a new table's 15 on the SQL catalog)."""
    try:
        return catalog.create_table(name, **kwargs)
    except NoSuchNamespaceError:
        pass
    _ensure_namespace(catalog, split_name(name)[0])
    return catalog.create_table(name, **kwargs)


def _ensure_namespace(catalog: Catalog, namespace: str) -> None:
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    except Exception:  # a lost race: some catalogs (SQL) report it as a database integrity error
        if not namespace_exists(catalog, namespace):
            raise
        log.info("namespace %s was created meanwhile by another replica", namespace)


def with_identifier_fields(schema: Schema, columns: tuple[str, ...], key: str, table: str) -> Schema:
    """``schema`` with ``columns`` (dotted paths for nested struct fields) as identifier fields,
    which Iceberg requires to be required primitive columns that are not float or double."""
    if not columns:
        return schema
    ids = []
    for column in columns:
        try:
            f = schema.find_field(column)
        except ValueError:
            raise ConfigError(
                key, ",".join(columns),
                f"columns of {table} (the first records have {', '.join(n.name for n in schema.fields)}; "
                f"{column!r} is not among them)",
            ) from None
        if not isinstance(f.field_type, PrimitiveType) or isinstance(f.field_type, (FloatType, DoubleType)):
            raise ConfigError(key, ",".join(columns), f"primitive, non-floating columns ({column} is {f.field_type})")
        ids.append(f.field_id)
    required = set(ids)
    for column in columns:  # a nested identifier field needs required parents too
        parts = column.split(".")
        required.update(schema.find_field(".".join(parts[:i])).field_id for i in range(1, len(parts)))
    return Schema(*_required(schema.fields, required), identifier_field_ids=ids)


def _required(fields: tuple[NestedField, ...], ids: set[int]) -> list[NestedField]:
    out = []
    for f in fields:
        t = f.field_type
        if isinstance(t, StructType):
            t = StructType(*_required(t.fields, ids))
        out.append(NestedField(f.field_id, f.name, t, required=f.required or f.field_id in ids, doc=f.doc))
    return out


def _all_optional(schema: Schema) -> Schema:
    """schema-force-optional: every column optional but the identifier fields (and their parents)."""
    keep = set(schema.identifier_field_ids)

    def walk(fields: tuple[NestedField, ...]) -> tuple[list[NestedField], bool]:
        out, any_kept = [], False
        for f in fields:
            t, inner = f.field_type, False
            if isinstance(t, StructType):
                children, inner = walk(t.fields)
                t = StructType(*children)
            elif isinstance(t, ListType):
                t = ListType(t.element_id, t.element_type, element_required=False)
            elif isinstance(t, MapType):
                t = MapType(t.key_id, t.key_type, t.value_id, t.value_type, value_required=False)
            kept = f.field_id in keep or inner
            any_kept = any_kept or kept
            out.append(NestedField(f.field_id, f.name, t, required=f.required and kept, doc=f.doc))
        return out, any_kept

    return Schema(*walk(schema.fields)[0], identifier_field_ids=list(schema.identifier_field_ids))



