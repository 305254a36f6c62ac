"""coordinator/key_index.py: the key -> (file, position) index of a mirror table, rebuilt from
the table (live files minus position deletes) and kept up to date round by round."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.types import LongType, NestedField, StringType

from coordinator.iceberg_ext.deletes import WithPositionDeletes, write_position_deletes
from coordinator.key_index import KeyIndex

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "v", StringType(), required=False))


class MirrorAppend(WithPositionDeletes, _FastAppendFiles):
    pass


@pytest.fixture
def table(tmp_path):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    t = catalog.create_table("db.mirror", schema=SCHEMA, properties={"format-version": "2"})
    t.append(pa.table({"id": pa.array([1, 2, 3, 4, 5], pa.int64()), "v": ["a", "b", "c", "d", "e"]}))
    return catalog.load_table("db.mirror")


def commit_round(table, index: KeyIndex, name: str, rows: dict[int, str], deleted: list[int]):
    """What the coordinator will do per round: old rows of changed keys -> position deletes,
    the new data file and the deletes in one snapshot, then the new rows indexed."""
    positions = index.take(pa.table({"id": pa.array(deleted, pa.int64())}))
    path = f"{table.location()}/data/{name}.parquet"
    schema = pa.schema([pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"1"}),
                        pa.field("v", pa.string(), metadata={b"PARQUET:field_id": b"2"})])
    data = pa.table({"id": list(rows), "v": list(rows.values())}, schema=schema)
    pq.write_table(data, path.removeprefix("file://"))
    with table.transaction() as tx:
        update = tx.update_snapshot()
        producer = MirrorAppend(operation=Operation.OVERWRITE, transaction=tx, io=update._io, branch=update._branch)
        producer.position_deletes = [write_position_deletes(table, positions)] if positions.num_rows else []
        with producer as append:
            append.append_data_file(parquet_file_to_data_file(table.io, table.metadata, path))
    index.add_file(path, data.select(["id"]))
    return table.refresh()


def test_the_index_follows_the_rounds_and_a_rebuild_from_the_table_agrees(table):
    index = KeyIndex.from_table(table, ["id"])
    assert len(index) == 5
    table = commit_round(table, index, "r1", {2: "B", 6: "f"}, deleted=[2, 5, 9])  # 9: absent, nothing to delete
    table = commit_round(table, index, "r2", {5: "E2"}, deleted=[2, 5])
    want = {1: "a", 3: "c", 4: "d", 5: "E2", 6: "f"}
    assert {r["id"]: r["v"] for r in table.scan().to_arrow().to_pylist()} == want
    rebuilt = KeyIndex.from_table(table, ["id"])  # a new coordinator after a failover
    assert rebuilt._where.keys() == index._where.keys() == want.keys()
    probe = pa.table({"id": pa.array([1, 3, 4, 5, 6], pa.int64())})
    assert sorted(rebuilt.take(probe).to_pylist(), key=str) == sorted(index.take(probe).to_pylist(), key=str)


def test_take_returns_the_positions_and_forgets_the_keys():
    index = KeyIndex(["a", "b"])
    index.add_file("f0", pa.table({"a": [1, 1, 2], "b": ["x", "y", "x"]}), skip=None)
    index.add_file("f1", pa.table({"a": [1, 3], "b": ["y", "z"]}))  # (1, y) moved to f1 row 0
    got = index.take(pa.table({"a": [1, 1, 7], "b": ["y", "x", "q"]}))
    assert got.to_pylist() == [{"file_path": "f1", "pos": 0}, {"file_path": "f0", "pos": 0}]
    assert len(index) == 2 and index.take(pa.table({"a": [1], "b": ["y"]})).num_rows == 0


def test_no_key_columns_is_refused():
    with pytest.raises(ValueError, match="key columns"):
        KeyIndex([])
