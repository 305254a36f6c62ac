"""Two replicas auto-creating one table at once: the SQL catalog reports the loser's namespace
or table creation as a database IntegrityError, not as 'already exists'. The loser must use
what the winner created, not stop the replica."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from agents.tables import create_target
from icesink.shared.config import load_settings


class RacingCatalog(SqlCatalog):
    """The other replica creates the namespace (and the table) just before this one does."""

    race_table = False

    def create_namespace(self, namespace, properties=None):  # type: ignore[no-untyped-def, override]
        super().create_namespace(namespace, properties or {})
        raise RuntimeError("(sqlite3.IntegrityError) UNIQUE constraint failed: iceberg_namespace_properties")

    def create_table(self, identifier, schema, **kwargs):  # type: ignore[no-untyped-def, override]
        table = super().create_table(identifier, schema, **kwargs)
        if self.race_table:
            raise RuntimeError("(sqlite3.IntegrityError) UNIQUE constraint failed: iceberg_tables")
        return table


def settings():
    return load_settings(None, None, {"topics": "t", "iceberg.tables": "db.a", "iceberg.tables.auto-create-enabled": "true"})


@pytest.mark.parametrize("race_table", [False, True])
def test_a_lost_creation_race_uses_what_the_winner_created(tmp_path, race_table):
    catalog = RacingCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.race_table = race_table
    target = create_target(catalog, settings(), "db.a", pa.schema([("id", pa.int64())]))
    assert target.table.name() == ("db", "a")


def test_a_creation_failure_that_created_nothing_is_raised(tmp_path):
    class Broken(SqlCatalog):
        def create_namespace(self, namespace, properties=None):  # type: ignore[no-untyped-def, override]
            raise RuntimeError("catalog down")

    catalog = Broken("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    with pytest.raises(RuntimeError, match="catalog down"):
        create_target(catalog, settings(), "db.a", pa.schema([("id", pa.int64())]))


def test_a_created_table_holds_its_name_mapping_from_its_first_metadata_file(tmp_path):
    """The name mapping goes in with the creation (one metadata file, no second commit) and
    names the ids the catalog gave the columns, nested ones included; a user's own is kept."""
    from pyiceberg.table.name_mapping import create_mapping_from_schema

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    schema = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.string())),
                        ("where", pa.struct([("city", pa.string()), ("zip", pa.int32())])), ("n", pa.float64())])
    table = create_target(catalog, settings(), "db.a", schema).table
    again = catalog.load_table("db.a")
    assert again.metadata.metadata_log == []  # created with it: no later commit
    assert again.properties["schema.name-mapping.default"] == create_mapping_from_schema(again.schema()).model_dump_json()
    assert table.properties == again.properties
    own = load_settings(None, None, {"topics": "t", "iceberg.tables": "db.b", "iceberg.tables.auto-create-enabled": "true",
                                     "iceberg.tables.auto-create-props.schema.name-mapping.default": "[]"})
    assert create_target(catalog, own, "db.b", schema).table.properties["schema.name-mapping.default"] == "[]"


def test_a_creation_that_another_replica_replaced_uses_what_the_catalog_holds(tmp_path):
    """Seen in CI on SeaweedFS's REST catalog: two replicas created one table at the same moment,
    both creations succeeded, each at a location of its own, and the catalog kept the second. The
    first replica wrote its files under its own location for ever, and the coordinator refused
    every one of them (outside the table's location). A creator uses what the catalog holds."""

    class Overwritten(SqlCatalog):
        def create_table(self, identifier, schema, **kwargs):  # type: ignore[no-untyped-def, override]
            mine = super().create_table(identifier, schema, **kwargs)
            # The other replica's creation lands just after and replaces this one (its own location).
            super().drop_table(identifier)
            super().create_table(identifier, schema, location=f"file://{tmp_path}/wh/db/a-other", **kwargs)
            return mine

    catalog = Overwritten("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    target = create_target(catalog, settings(), "db.a", pa.schema([("id", pa.int64())]))
    assert target.table.location() == catalog.load_table("db.a").location() == f"file://{tmp_path}/wh/db/a-other"


@pytest.mark.parametrize("user", [None, "false"])
def test_tables_icesink_creates_keep_only_their_recent_metadata_files(tmp_path, user):
    """Every round's commit writes a metadata file of the whole history (about 600 KB after a
    few hundred snapshots) and Iceberg keeps every one by default: at 1 s rounds a table grew by
    600 KB a second and its commits slowed as the files piled up (issue 42 target 6). Tables the
    sink creates (auto-created, the dead-letter table) set Iceberg's
    write.metadata.delete-after-commit.enabled, which keeps the last
    write.metadata.previous-versions-max (100) files; a user's own value is kept."""
    from icesink.shared.deadletter_table import ensure_table

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    props = {"iceberg.tables.auto-create-props.write.metadata.previous-versions-max": "2"}
    if user is not None:
        props["iceberg.tables.auto-create-props.write.metadata.delete-after-commit.enabled"] = user
    s = load_settings(None, None, {"topics": "t", "iceberg.tables": "db.a",
                                   "iceberg.tables.auto-create-enabled": "true", **props})
    table = create_target(catalog, s, "db.a", pa.schema([("id", pa.int64())])).table
    for i in range(5):
        table.append(pa.table({"id": pa.array([i], pa.int64())}))
    files = list((tmp_path / "wh" / "db" / "a" / "metadata").glob("*.metadata.json"))
    assert len(files) == (6 if user == "false" else 3), sorted(f.name for f in files)
    letters = ensure_table(catalog, "db.letters")
    assert letters.properties.get("write.metadata.delete-after-commit.enabled") == "true"
