"""Two replicas auto-creating one table at once: the SQL catalog reports the loser's namespace
or table creation as a database IntegrityError, not as 'already exists'. The loser must use
what the winner created, not stop the replica."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from agents.tables import create_target
from icesink.config import load_settings


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
