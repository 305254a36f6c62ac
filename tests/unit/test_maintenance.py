"""Table maintenance on a real SQLite catalog and local files (Spark replaced by pyiceberg's own
Parquet writer here; tests/integration/test_maintenance.py runs it with Spark and real replicas):
expiry keeps what it must and deletes only what expired snapshots alone referenced; compaction
rewrites one partition's small files into one replace snapshot without changing a row, and is
dropped, never half-applied, when its inputs are gone."""

from __future__ import annotations

import os
import threading
import uuid

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from coordinator.maintenance import (
    MAINTENANCE_KEY, MaintenanceSettings, commit_rewrite, compact, due_snapshots, expire, live_files, plan_compaction,
)
from tests.support.tables import local_path, sqlite_catalog

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "shop", StringType(), required=False))
SPEC = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "shop"))


def _rows(start: int, n: int, shop: str = "a") -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()), "shop": pa.array([shop] * n)})


@pytest.fixture
def table_and_catalog(tmp_path):
    catalog = sqlite_catalog(tmp_path)
    table = catalog.create_table("db.t", schema=SCHEMA, partition_spec=SPEC)
    return catalog, table


def _write(table, data, prefix):
    return list(_dataframe_to_data_files(table.metadata, data, table.io, write_uuid=uuid.uuid4()))


def _ids(table) -> list[int]:
    return sorted(table.scan().to_arrow()["id"].to_pylist())


def test_expiry_keeps_the_newest_and_the_young_and_deletes_only_what_expired_snapshots_alone_held(table_and_catalog):
    catalog, table = table_and_catalog
    for i in range(6):
        table.append(_rows(i * 10, 10))
    table = catalog.load_table("db.t")
    snaps = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)
    now = snaps[-1].timestamp_ms + 1
    assert due_snapshots(table, 60_000, 2, now) == []  # all young
    assert sorted(due_snapshots(table, 0, 2, now)) == sorted(s.snapshot_id for s in snaps[:4])
    lists = [local_path(s.manifest_list) for s in snaps]
    s = MaintenanceSettings(snapshot_max_age_ms=0, retain_last=2)
    out = expire(catalog, "db.t", s, threading.Lock(), {}, now_ms=now)
    table = catalog.load_table("db.t")
    assert out.snapshots == 4 and len(table.metadata.snapshots) == 2
    assert [os.path.exists(p) for p in lists] == [False] * 4 + [True] * 2  # fast appends share the rest
    assert _ids(table) == list(range(60))
    assert expire(catalog, "db.t", s, threading.Lock(), {}, now_ms=now).snapshots == 0  # nothing due now


def test_compaction_replaces_one_partitions_small_files_without_changing_a_row(table_and_catalog):
    catalog, table = table_and_catalog
    for i in range(5):
        table.append(pa.concat_tables([_rows(i * 10, 10, "a"), _rows(1000 + i, 1, "b")]))
    table = catalog.load_table("db.t")
    before = _ids(table)
    s = MaintenanceSettings(min_input_files=4, target_file_size_bytes=1 << 20)
    assert len(plan_compaction(table, s)) == 5
    assert plan_compaction(table, MaintenanceSettings(min_input_files=6, target_file_size_bytes=1 << 20)) == []
    out = compact(catalog, "db.t", s, threading.Lock(), _write)
    table = catalog.load_table("db.t")
    assert out is not None and out.files_in == 5 and out.files_out == 1 and out.snapshot_id is not None
    snap = table.current_snapshot()
    assert snap.summary.operation.value == "replace" and snap.summary[MAINTENANCE_KEY] == "compaction"
    assert _ids(table) == before
    by_shop = {f.partition[0]: 0 for f in live_files(table)}
    for f in live_files(table):
        by_shop[f.partition[0]] += 1
    assert sorted(by_shop.values()) == [1, 5]  # one step takes one partition
    out = compact(catalog, "db.t", s, threading.Lock(), _write)  # the next step takes the other
    assert out is not None and out.files_in == 5
    assert len(live_files(catalog.load_table("db.t"))) == 2 and _ids(catalog.load_table("db.t")) == before
    # after expiry, the replaced small files are gone from disk too
    old = [local_path(f.file_path) for f in plan_compaction(table, s)] or []
    s2 = MaintenanceSettings(snapshot_max_age_ms=0, retain_last=1)
    expire(catalog, "db.t", s2, threading.Lock(), {})
    table = catalog.load_table("db.t")
    assert len(table.metadata.snapshots) == 1 and _ids(table) == before
    assert not any(os.path.exists(p) for p in old)
    data_dir = local_path(table.location()) + "/data"
    on_disk = {os.path.join(d, f) for d, _, fs in os.walk(data_dir) for f in fs if f.endswith(".parquet")}
    assert on_disk == {local_path(f.file_path) for f in live_files(table)}


def test_a_rewrite_whose_inputs_are_gone_is_dropped_and_its_files_deleted(table_and_catalog):
    catalog, table = table_and_catalog
    for i in range(3):
        table.append(_rows(i * 10, 10))
    table = catalog.load_table("db.t")
    old = live_files(table)
    new = _write(table, table.scan().to_arrow(), "x")
    table.delete("id < 5")  # another writer rewrites one of the inputs meanwhile
    assert commit_rewrite(catalog, "db.t", old, new, threading.Lock()) is None
    assert not any(os.path.exists(local_path(f.file_path)) for f in new)
    assert _ids(catalog.load_table("db.t")) == list(range(5, 30))


def test_partitions_with_delete_files_are_not_compacted_yet(table_and_catalog):
    from pyiceberg.manifest import DataFileContent

    catalog, table = table_and_catalog
    for i in range(5):
        table.append(_rows(i * 10, 10))
    table = catalog.load_table("db.t")

    files = live_files(table)
    fake_delete = files[0].__class__.from_args(content=DataFileContent.POSITION_DELETES, file_path="x",
                                               file_format=files[0].file_format, partition=files[0].partition,
                                               record_count=1, file_size_in_bytes=10)
    fake_delete.spec_id = files[0].spec_id
    import coordinator.maintenance as m

    real = m.live_files
    assert len(plan_compaction(table, MaintenanceSettings(min_input_files=2, target_file_size_bytes=1 << 20))) == 5
    m.live_files = lambda t: files + [fake_delete]
    try:
        assert plan_compaction(table, MaintenanceSettings(min_input_files=2, target_file_size_bytes=1 << 20)) == []
    finally:
        m.live_files = real


def test_maintenance_settings_are_on_by_default_and_named_in_errors(tmp_path):
    import json

    from icesink.config import load_settings
    from icesink.errors import ConfigError

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"topics": "t", "iceberg.tables": "db.t"}))
    s = MaintenanceSettings.of(load_settings(path, {}))
    assert s == MaintenanceSettings()  # the documented defaults
    assert (s.min_input_files, s.retain_last, s.snapshot_max_age_ms) == (16, 10, 86_400_000)
    assert s.orphans_older_than_ms == 3 * 86_400_000 and s.orphans_every_s == 86_400
    off = load_settings(path, {"ICESINK_MAINTENANCE_ENABLED": "false"},
                        {"maintenance.compaction.min-input-files": "4", "maintenance.snapshots.retain-last": "2"})
    assert not off.maintenance_enabled and off.maintenance_min_input_files == 4 and off.maintenance_retain_last == 2
    with pytest.raises(ConfigError) as info:
        load_settings(path, {}, {"maintenance.snapshots.retain-last": "0"})
    assert "maintenance.snapshots.retain-last" in str(info.value)
