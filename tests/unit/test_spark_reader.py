"""The Spark reader's catalog conf (tests/support/spark_reader.py) and how it compares answers;
the reads themselves run against the real thing in tests/integration (test_connect.py,
test_partition_types.py, test_mirror.py)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from icesink.shared.catalogs import sqlite_catalog_properties
from tests.support.spark_reader import SparkReaderError, _rows, assert_engines_agree, jdbc_catalog_conf


def test_a_sqlite_sql_catalog_is_read_as_iceberg_jdbc_catalog_of_the_same_name(tmp_path):
    props = sqlite_catalog_properties(tmp_path / "cat dir", initialize=False)
    conf = jdbc_catalog_conf("it", props)
    assert conf == {
        "spark.sql.catalog.it": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.it.type": "jdbc",
        # the path alone: the SQLAlchemy URI's ?timeout= is not sqlite-jdbc's
        "spark.sql.catalog.it.uri": f"jdbc:sqlite:{tmp_path}/cat dir/catalog.db",
        "spark.sql.catalog.it.warehouse": props["warehouse"],
        "spark.sql.catalog.it.jdbc.init-catalog-tables": "false",
        "spark.sql.catalog.it.cache-enabled": "false",
    }


@pytest.mark.parametrize("props, named", [
    ({"uri": "postgresql+psycopg2://u@127.0.0.1:5432/db", "warehouse": "file:///w"}, "postgresql+psycopg2"),
    ({"uri": "sqlite:///relative.db", "warehouse": "file:///w"}, "sqlite:///relative.db"),
    ({"uri": "sqlite:////abs/catalog.db"}, "warehouse"),
])
def test_other_catalogs_are_refused_naming_what_was_found(props, named):
    with pytest.raises(SparkReaderError, match="expected") as failure:
        jdbc_catalog_conf("it", props)
    assert named in str(failure.value)


def test_rows_are_compared_as_every_engine_can_agree_on_them():
    u = uuid.UUID(int=7)
    spark = [{"id": 2, "u": str(u), "s": {"op": "U", "n": 1}}, {"id": 1, "u": None, "s": None}]
    pyiceberg = [{"id": 1, "u": None, "s": None}, {"id": 2, "u": u.bytes, "s": {"n": 1, "op": "U"}}]
    duckdb = [{"id": 2, "u": u, "s": {"op": "U", "n": 1}}, {"id": 1, "u": None, "s": None}]
    rows = {name: _rows(r, ["id", "u", "s"], {"u"}) for name, r in
            (("spark", spark), ("pyiceberg", pyiceberg), ("duckdb", duckdb))}
    assert_engines_agree(rows, "t")
    aware = dt.datetime(2024, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert _rows([{"t": aware}], ["t"], set()) == [(dt.datetime(2024, 1, 1, tzinfo=dt.UTC),)]


def test_a_difference_names_the_engine_and_the_rows():
    with pytest.raises(AssertionError) as failure:
        assert_engines_agree({"spark": [(1,), (2,)], "duckdb": [(1,), (2,)], "pyiceberg": [(1,), (3,)]}, "db.t")
    text = str(failure.value)
    assert "db.t: Spark's answer differs from ['pyiceberg']'s" in text
    assert "only Spark's (first 5): [(2,)]; only pyiceberg's: [(3,)]" in text
    with pytest.raises(AssertionError, match=r"\{7: \(2, 3\)\}"):
        assert_engines_agree({"spark": {7: 2, None: 1}, "duckdb": {7: 3, None: 1}}, "per store")


def test_a_reader_that_cannot_start_fails_the_first_read_with_its_log(tmp_path, monkeypatch):
    """Started in the background, a reader whose process dies (here: a Python without pyspark)
    fails the read that waits for it, naming why, never skipping it."""
    import sys

    from tests.support import spark_reader

    home = tmp_path / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "lib").mkdir()
    (home / "venv" / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setattr(spark_reader, "resolve", lambda: home)
    reader = spark_reader.SparkReader(tmp_path / "reader", start_timeout_s=60)
    reader.start_in_background()
    try:
        with pytest.raises(SparkReaderError, match="did not start") as failure:
            reader.catalog("it", sqlite_catalog_properties(tmp_path / "cat", initialize=False)).table("db.t")
        assert "exited with 1" in str(failure.value) and "pyspark" in str(failure.value)
    finally:
        reader.stop()
