"""Files accepted for a table that was dropped and created again (auto-create, or by hand) are
committed into the new table only if its schema gives their field ids the same columns: a
table created again from other records numbers its columns anew, and the old files' columns
would be read as other columns. Else the commit is refused (TableChangedError: the table is
parked, nothing committed or deleted). Real pyiceberg SQLite catalog; no services."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from coordinator.committer import RoundCommit, commit_table
from coordinator.state import Accepted
from icesink.shared.catalogs import sqlite_catalog_properties
from icesink.shared.errors import TableChangedError
from icesink.shared.iceberg import local_path, to_file_info, total_rows
from icesink.shared.protocol import OffsetRange, TopicPartition

TP = TopicPartition("src", 0)
OLD = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(), required=False))


@pytest.fixture
def catalog(tmp_path):  # type: ignore[no-untyped-def]
    cat = load_catalog("rc", **sqlite_catalog_properties(tmp_path / "cat"))
    cat.create_namespace("db")
    cat.create_table("db.t", schema=OLD)
    return cat


def held_file(catalog) -> Accepted:  # type: ignore[no-untyped-def]
    """A file written for the table as it was (field ids 1: id, 2: name), accepted, not committed."""
    table = catalog.load_table("db.t")
    path = f"{table.location()}/data/held.parquet"
    local_path(path).parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"1"}),
                        pa.field("name", pa.string(), metadata={b"PARQUET:field_id": b"2"})])
    pq.write_table(pa.table({"id": [1, 2], "name": ["a", "b"]}, schema=schema), local_path(path))
    info = to_file_info(parquet_file_to_data_file(table.io, table.metadata, path), 0)
    return Accepted(5, "r5", "w1", (OffsetRange(TP, 0, 2),), {"db.t": (info,)}, None)


def commit(catalog, batch):  # type: ignore[no-untyped-def]
    return commit_table(catalog, "db.t", batch, RoundCommit(group="g", epoch=1, commit_id="r5", positions={TP: 2},
                        valid_through_ms=None))


def test_files_are_not_committed_into_a_table_created_again_with_other_field_ids(catalog):
    batch = [held_file(catalog)]
    catalog.drop_table("db.t")
    catalog.create_table("db.t", schema=Schema(NestedField(1, "name", StringType(), required=False),
                                               NestedField(2, "id", LongType(), required=False)))
    with pytest.raises(TableChangedError, match="field id 1") as info:
        commit(catalog, batch)
    assert info.value.retriable and "held.parquet" in str(info.value)
    assert catalog.load_table("db.t").current_snapshot() is None  # nothing committed


def test_files_are_committed_into_a_table_created_again_with_the_same_field_ids(catalog):
    batch = [held_file(catalog)]
    catalog.drop_table("db.t")
    catalog.create_table("db.t", schema=Schema(*OLD.fields, NestedField(3, "extra", LongType(), required=False)))
    assert commit(catalog, batch).files == 1
    assert total_rows(catalog, "db.t") == 2
    rows = catalog.load_table("db.t").scan().to_arrow()
    assert sorted(rows.column("name").to_pylist()) == ["a", "b"]
