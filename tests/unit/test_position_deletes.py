"""coordinator/iceberg_ext/deletes.py: a round's new data file and a position delete file of rows in an
older file, committed in ONE snapshot through pyiceberg's fast append, read back exactly by a
pyiceberg scan and by DuckDB's iceberg extension (an engine that is not ours)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.types import LongType, NestedField, StringType

from coordinator.iceberg_ext.deletes import WithPositionDeletes, write_position_deletes
from tests.support import duck

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


def data_file(table, name: str, ids: list[int], values: list[str]):
    path = f"{table.location()}/data/{name}.parquet"
    schema = pa.schema([pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"1"}),
                        pa.field("v", pa.string(), metadata={b"PARQUET:field_id": b"2"})])
    pq.write_table(pa.table({"id": ids, "v": values}, schema=schema), path.removeprefix("file://"))
    return parquet_file_to_data_file(table.io, table.metadata, path)


def test_new_rows_and_position_deletes_of_old_rows_land_in_one_snapshot_and_read_back(table):
    [old] = [task.file.file_path for task in table.scan().plan_files()]
    # Keys 2 and 5 change: their old rows (positions 1 and 4) go, their new rows come.
    deletes = write_position_deletes(table, pa.table({"file_path": [old, old], "pos": pa.array([4, 1], pa.int64())}))
    assert deletes.content == DataFileContent.POSITION_DELETES and deletes.record_count == 2
    new = data_file(table, "round-2", [2, 5, 6], ["B", "E", "f"])
    with table.transaction() as tx:
        update = tx.update_snapshot()
        producer = MirrorAppend(operation=Operation.OVERWRITE, transaction=tx, io=update._io, branch=update._branch)
        producer.position_deletes = [deletes]
        with producer as append:
            append.append_data_file(new)
    table = table.refresh()
    assert len(table.snapshots()) == 2
    manifests = table.current_snapshot().manifests(table.io)
    assert sorted(m.content for m in manifests) == [ManifestContent.DATA, ManifestContent.DATA, ManifestContent.DELETES]
    want = {1: "a", 2: "B", 3: "c", 4: "d", 5: "E", 6: "f"}
    got = table.scan().to_arrow().to_pylist()
    assert {r["id"]: r["v"] for r in got} == want and len(got) == 6
    rows = duck.scan_rows(table.metadata_location)
    assert {r["id"]: r["v"] for r in rows} == want and len(rows) == 6


def test_a_format_version_1_table_is_refused(tmp_path):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    t = catalog.create_table("db.v1", schema=SCHEMA, properties={"format-version": "1"})
    with pytest.raises(ValueError, match="format version 2"):
        write_position_deletes(t, pa.table({"file_path": ["x"], "pos": pa.array([0], pa.int64())}))
