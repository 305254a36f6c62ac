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

from coordinator.gc import InFlight
from coordinator.maintenance import (
    MAINTENANCE_KEY, MaintenanceSettings, Plan, _partition_key, commit_rewrite, compact, due_snapshots, expire,
    live_files, plan_compaction,
)
from spark_bridge.rewrite import read_files
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


def _rewrite(table, data_files, delete_files, prefix):
    """Compaction's rewriter without Spark: pyiceberg reads (spark_bridge.rewrite's fallback)."""
    return _write(table, read_files(table, data_files, delete_files), prefix)


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
    assert len(plan_compaction(table, s).data) == 5
    assert plan_compaction(table, MaintenanceSettings(min_input_files=6, target_file_size_bytes=1 << 20)) is None
    out = compact(catalog, "db.t", s, threading.Lock(), _rewrite)
    table = catalog.load_table("db.t")
    assert out is not None and out.files_in == 5 and out.files_out == 1 and out.snapshot_id is not None
    snap = table.current_snapshot()
    assert snap.summary.operation.value == "replace" and snap.summary[MAINTENANCE_KEY] == "compaction"
    assert _ids(table) == before
    by_shop = {f.partition[0]: 0 for f in live_files(table)}
    for f in live_files(table):
        by_shop[f.partition[0]] += 1
    assert sorted(by_shop.values()) == [1, 5]  # one step takes one partition
    out = compact(catalog, "db.t", s, threading.Lock(), _rewrite)  # the next step takes the other
    assert out is not None and out.files_in == 5
    assert len(live_files(catalog.load_table("db.t"))) == 2 and _ids(catalog.load_table("db.t")) == before
    # after expiry, the replaced small files are gone from disk too
    old = [local_path(f.file_path) for f in plan_compaction(table, s).data]
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
    assert commit_rewrite(catalog, "db.t", Plan(old, [], _partition_key(old[0])), new, threading.Lock()) is None
    assert not any(os.path.exists(local_path(f.file_path)) for f in new)
    assert _ids(catalog.load_table("db.t")) == list(range(5, 30))


def test_a_mirror_partition_with_delete_files_is_folded_and_reads_the_same(tmp_path):
    """Position deletes (as the coordinator writes them for mirror tables) over several rounds;
    one compaction step rewrites the partition with the deletes applied and drops the delete
    files: pyiceberg and DuckDB read the same rows before and after, and no delete file is live."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import parquet_file_to_data_file
    from pyiceberg.manifest import DataFileContent, ManifestContent
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _FastAppendFiles

    from coordinator.iceberg_ext.deletes import WithPositionDeletes, write_position_deletes
    from tests.support import duck

    class MirrorAppend(WithPositionDeletes, _FastAppendFiles):
        pass

    catalog = sqlite_catalog(tmp_path)
    table = catalog.create_table("db.m", schema=SCHEMA, properties={"format-version": "2"})
    arrow = pa.schema([pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"1"}),
                       pa.field("shop", pa.string(), metadata={b"PARQUET:field_id": b"2"})])
    files = []
    for r in range(4):  # round r: ids 10r..10r+9; then the even ids of the previous round are deleted
        path = f"{table.location()}/data/round-{r}.parquet"
        os.makedirs(os.path.dirname(local_path(path)), exist_ok=True)
        pq.write_table(pa.table({"id": list(range(10 * r, 10 * r + 10)), "shop": [f"v{r}"] * 10}, schema=arrow),
                       local_path(path))
        new = parquet_file_to_data_file(table.io, table.metadata, path)
        deletes = [write_position_deletes(table, pa.table({"file_path": [files[-1]] * 5,
                                                           "pos": pa.array([0, 2, 4, 6, 8], pa.int64())}))] if files else []
        with table.transaction() as tx:
            update = tx.update_snapshot()
            producer = MirrorAppend(operation=Operation.OVERWRITE if deletes else Operation.APPEND, transaction=tx,
                                    io=update._io, branch=update._branch)
            producer.position_deletes = deletes
            with producer as append:
                append.append_data_file(new)
        files.append(path)
        table = catalog.load_table("db.m")
    expected = sorted(i for r in range(4) for i in range(10 * r, 10 * r + 10) if r == 3 or i % 2)
    assert _ids(table) == expected

    def duck_ids() -> list[int]:
        t = catalog.load_table("db.m")
        with duck.connect(t.io.properties) as con:
            return sorted(r[0] for r in con.execute(
                f"SELECT id FROM iceberg_scan('{duck.plain_path(t.metadata_location)}')").fetchall())

    assert duck_ids() == expected
    assert plan_compaction(table, MaintenanceSettings(min_delete_files=4, target_file_size_bytes=1 << 20)) is None
    s = MaintenanceSettings(target_file_size_bytes=1 << 20)  # the default: due at the first delete file
    plan = plan_compaction(table, s)  # 4 small data files + 3 delete files: due, and folded whole
    assert plan is not None and len(plan.data) == 4 and len(plan.deletes) == 3
    out = compact(catalog, "db.m", s, threading.Lock(), _rewrite)
    assert out is not None and out.snapshot_id is not None and out.deletes_folded == 3 and out.files_out == 1
    table = catalog.load_table("db.m")
    assert _ids(table) == expected and duck_ids() == expected
    assert [f.content for f in live_files(table)] == [DataFileContent.DATA]
    assert {m.content for m in table.current_snapshot().manifests(table.io)} <= {ManifestContent.DATA,
                                                                                  ManifestContent.DELETES}
    summary = table.current_snapshot().summary
    assert summary.operation == Operation.REPLACE and summary["total-data-files"] == "1"
    assert summary["total-records"] == str(len(expected))
    assert plan_compaction(table, s) is None  # nothing left to do


def test_a_partition_that_gains_delete_files_meanwhile_is_not_rewritten(table_and_catalog):
    catalog, table = table_and_catalog
    for i in range(3):
        table.append(_rows(i * 10, 10))
    table = catalog.load_table("db.t")
    old = live_files(table)
    plan = Plan(old, [], _partition_key(old[0]))
    stale = Plan(old, [old[0]], _partition_key(old[0]))  # planned with a delete file that is not there
    new = _write(table, table.scan().to_arrow(), "x")
    assert commit_rewrite(catalog, "db.t", stale, new, threading.Lock()) is None
    new = _write(table, table.scan().to_arrow(), "y")
    assert commit_rewrite(catalog, "db.t", plan, new, threading.Lock()) is not None
    assert _ids(catalog.load_table("db.t")) == list(range(30))


def test_maintenance_settings_are_on_by_default_and_named_in_errors(tmp_path):
    import json

    from icesink.shared.config import load_settings
    from icesink.shared.errors import ConfigError

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"topics": "t", "iceberg.tables": "db.t"}))
    s = MaintenanceSettings.of(load_settings(path, {}))
    assert s == MaintenanceSettings()  # the documented defaults
    assert (s.min_input_files, s.min_delete_files, s.retain_last, s.snapshot_max_age_ms) == (16, 1, 10, 600_000)
    assert s.orphans_older_than_ms == 3 * 86_400_000 and s.orphans_every_s == 86_400
    off = load_settings(path, {"ICESINK_MAINTENANCE_ENABLED": "false"},
                        {"maintenance.compaction.min-input-files": "4", "maintenance.snapshots.retain-last": "2"})
    assert not off.maintenance_enabled and off.maintenance_min_input_files == 4 and off.maintenance_retain_last == 2
    with pytest.raises(ConfigError) as info:
        load_settings(path, {}, {"maintenance.snapshots.retain-last": "0"})
    assert "maintenance.snapshots.retain-last" in str(info.value)


def test_the_maintainer_runs_passes_sweeps_orphans_and_retries_failures_with_backoff(table_and_catalog, tmp_path):
    """The coordinator's schedule: a due table gets expiry and a compaction step (metrics and
    /status report them); the orphan sweep deletes an old unreferenced file but keeps what the
    control log names in flight; a table that fails is retried after a backoff and reported."""
    import asyncio
    import json
    import time as clock

    from prometheus_client import CollectorRegistry

    from coordinator.maintainer import Maintainer
    from coordinator.maintenance import TableLocks
    from icesink.shared.config import load_settings
    from icesink.shared.metrics import Metrics

    catalog, table = table_and_catalog
    for i in range(5):
        table.append(_rows(i * 10, 10))
    data_dir = local_path(catalog.load_table("db.t").location()) + "/data"
    orphan, in_flight = os.path.join(data_dir, "orphan.parquet"), os.path.join(data_dir, "in-flight.parquet")
    for path in (orphan, in_flight):
        with open(path, "wb") as f:
            f.write(b"x")
        os.utime(path, (clock.time() - 7200, clock.time() - 7200))
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"topics": "t", "iceberg.tables": "db.t"}))
    metrics = Metrics(CollectorRegistry())
    status: dict = {}

    async def protected(start: int | None) -> InFlight:
        return InFlight(frozenset({"file://" + in_flight}), 0, "test")

    m = Maintainer(load_settings(path, {}), catalog, metrics, status, TableLocks(), _rewrite, protected)
    m.s = MaintenanceSettings(min_input_files=4, target_file_size_bytes=1 << 20, snapshot_max_age_ms=0, retain_last=2,
                              orphans_older_than_ms=3_600_000, orphans_every_s=0.0)

    async def run() -> None:
        m.due(["db.t", "db.missing"])
        deadline = clock.monotonic() + 30
        while clock.monotonic() < deadline:
            m.poll()
            await asyncio.sleep(0.05)
            if status["maintenance"].get("db.t", {}).get("orphans_deleted") is not None and \
                    "db.missing" in status["maintenance"]:
                break
        await m.stop()

    asyncio.run(run())
    report = status["maintenance"]
    assert report["db.t"]["error"] is None and report["db.t"]["expired_snapshots"] >= 3
    assert report["db.t"]["compaction"]["files_in"] == 5
    assert report["db.t"]["orphans_deleted"] == 1
    assert not os.path.exists(orphan) and os.path.exists(in_flight)
    assert "NoSuchTable" in report["db.missing"]["error"] and report["db.missing"]["attempt"] >= 1
    assert metrics.maintenance_failures.labels(table="db.missing", step="maintain")._value.get() >= 1
    assert metrics.maintenance_files_rewritten.labels(table="db.t")._value.get() == 5
    assert metrics.maintenance_orphans_deleted.labels(table="db.t")._value.get() == 1
    assert _ids(catalog.load_table("db.t")) == list(range(50))


def test_compaction_planning_reads_each_manifest_once_and_none_while_too_few_files(table_and_catalog, monkeypatch):
    """Planning runs after every round for every table: below min-input-files live files the
    manifest list alone says nothing is due; above, each manifest is read once and then kept
    (manifests never change)."""
    from pyiceberg.manifest import ManifestFile

    catalog, table = table_and_catalog
    reads: list[str] = []
    real = ManifestFile.fetch_manifest_entry

    def counted(self, *a, **k):
        reads.append(self.manifest_path)
        return real(self, *a, **k)

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", counted)
    s = MaintenanceSettings(min_input_files=4, target_file_size_bytes=1 << 20)
    cache: dict = {}
    for i in range(3):
        table.append(_rows(i * 10, 10))
        table = catalog.load_table("db.t")
        assert plan_compaction(table, s, cache) is None
    assert reads == []  # 3 live files < 4: no manifest read
    table.append(_rows(30, 10))
    table = catalog.load_table("db.t")
    assert plan_compaction(table, s, cache) is not None
    assert len(reads) == 4 == len(set(reads))
    table.append(_rows(40, 10))
    table = catalog.load_table("db.t")
    assert plan_compaction(table, s, cache) is not None
    assert len(reads) == 5  # only the new manifest
    assert len(cache) == 5


def _cached_maintainer(catalog, tmp_path, status: dict, cache, s: MaintenanceSettings):
    """A Maintainer of table db.t beside the rounds' ``cache``, with settings ``s``, and a
    coroutine function that runs one pass over db.t to its end."""
    import asyncio
    import json

    from prometheus_client import CollectorRegistry

    from coordinator.maintainer import Maintainer
    from coordinator.maintenance import TableLocks
    from icesink.shared.config import load_settings
    from icesink.shared.metrics import Metrics

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"topics": "t", "iceberg.tables": "db.t"}))

    async def protected(start: int | None) -> InFlight:
        return InFlight(frozenset(), 0, "test")

    m = Maintainer(load_settings(path, {}), catalog, Metrics(CollectorRegistry()), status, TableLocks(), _rewrite,
                   protected, tables=cache)
    m.s = s

    async def one_pass() -> None:
        m.due(["db.t"])
        m.poll()
        while m._task is not None and not m._task.done():
            await asyncio.sleep(0.01)
        m.poll()

    return m, one_pass


def test_a_pass_with_nothing_due_in_the_rounds_view_reads_no_catalog(table_and_catalog, tmp_path):
    """After every round the maintainer checks each committed table: when the rounds' cached
    table (TableCache) shows nothing due, neither expiry nor compaction loads the table (a round
    of 200 tables would load each twice); once something is due there, it loads the current
    table and acts on that."""
    import asyncio

    from coordinator.committer import TableCache

    catalog, table = table_and_catalog
    for i in range(3):
        table.append(_rows(i * 10, 10))
    loads: list[str] = []
    real_load = catalog.load_table

    def counted(name, *a, **k):
        loads.append(str(name))
        return real_load(name, *a, **k)

    catalog.load_table = counted  # type: ignore[method-assign]
    status: dict = {}
    cache = TableCache()
    cache.put("db.t", real_load("db.t"))
    m, one_pass = _cached_maintainer(catalog, tmp_path, status, cache, MaintenanceSettings(
        min_input_files=4, target_file_size_bytes=1 << 20, snapshot_max_age_ms=3_600_000, retain_last=10,
        orphans_every_s=3600.0))

    async def run() -> None:
        await one_pass()  # 3 small files, 3 snapshots: nothing due
        assert loads == [] and status["maintenance"]["db.t"]["error"] is None
        table.append(_rows(30, 10))  # a 4th small file: compaction is due
        cache.put("db.t", real_load("db.t"))
        await one_pass()
        await m.stop()

    asyncio.run(run())
    assert loads, "a due compaction works on the table loaded from the catalog"
    assert status["maintenance"]["db.t"]["compaction"]["files_in"] == 4
    assert _ids(real_load("db.t")) == list(range(40))


@pytest.mark.parametrize("cached", [True, False])
def test_a_pass_that_commits_leaves_the_table_it_committed_in_the_rounds_cache(table_and_catalog, tmp_path, cached):
    """Expiry and compaction put the table their commit left into the rounds' TableCache instead
    of dropping the entry: the next round commits on it without a catalog read (at a history of
    hundreds of snapshots a load parses its whole metadata file: issue 42's flat commit cost).
    A table the cache does not hold (the rounds commit in processes, each with its own cache)
    is not put there: the entry would go stale and hide what is due."""
    import asyncio

    from coordinator.committer import TableCache

    catalog, table = table_and_catalog
    for i in range(4):
        table.append(_rows(i * 10, 10))
    status: dict = {}
    cache = TableCache()
    if cached:
        cache.put("db.t", catalog.load_table("db.t"))
    m, one_pass = _cached_maintainer(catalog, tmp_path, status, cache, MaintenanceSettings(
        min_input_files=4, target_file_size_bytes=1 << 20, snapshot_max_age_ms=0, retain_last=1,
        orphans_every_s=3600.0))

    async def run() -> None:
        await one_pass()
        await m.stop()

    asyncio.run(run())
    done = status["maintenance"]["db.t"]
    assert done["error"] is None and done["expired_snapshots"] >= 3 and done["compaction"]["files_in"] == 4, done
    got, current = cache.get("db.t"), catalog.load_table("db.t")
    assert _ids(current) == list(range(40))
    if not cached:
        assert got is None
        return
    assert got is not None, "the pass dropped the table from the rounds' cache"
    assert got.metadata_location == current.metadata_location
    assert len(got.metadata.snapshots) == len(current.metadata.snapshots)


def test_a_maintenance_error_no_retry_mends_waits_the_longest_backoff_at_once(table_and_catalog, tmp_path):
    """Maintenance never stops the coordinator, but it branches on ``retriable`` too: a
    transient failure is retried after a short backoff that doubles; one no retry mends waits
    the cap at once, and /status says which it was."""
    import asyncio
    import json
    import time as clock

    from prometheus_client import CollectorRegistry

    from coordinator.maintainer import Maintainer
    from coordinator.maintenance import TableLocks
    from icesink.shared.config import load_settings
    from icesink.shared.errors import ProtocolError
    from icesink.shared.metrics import Metrics

    catalog, _ = table_and_catalog
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"topics": "t", "iceberg.tables": "db.t"}))
    status: dict = {}

    async def protected(start: int | None) -> InFlight:
        return InFlight(frozenset(), 0, "test")

    m = Maintainer(load_settings(path, {}), catalog, Metrics(CollectorRegistry()), status, TableLocks(), _rewrite,
                   protected)

    async def fails(error: Exception):
        async def step(table: str) -> dict:
            raise error
        before = clock.monotonic()
        await m._step("db.t", "maintain", step)
        return m._retry["db.t"].retry_at - before

    transient = asyncio.run(fails(OSError("catalog unreachable")))
    assert transient < 10 and status["maintenance"]["db.t"]["retriable"] is True
    m._retry.clear()
    lasting = asyncio.run(fails(ProtocolError("table db.t property icesink.g.state: expected sink state JSON")))
    assert lasting >= m.RETRY_CAP_S - 1 and status["maintenance"]["db.t"]["retriable"] is False


class _WatchedLock:
    """The table's lock, knowing whether it is held (to count what is read under it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = False

    def __enter__(self):
        self._lock.acquire()
        self.held = True
        return self

    def __exit__(self, *exc):
        self.held = False
        self._lock.release()


def _count_reads_under(lock: _WatchedLock, monkeypatch) -> dict[str, list[str]]:
    """Manifest lists and manifests read, in all and while ``lock`` is held."""
    from pyiceberg.manifest import ManifestFile
    from pyiceberg.table.snapshots import Snapshot

    reads: dict[str, list[str]] = {"all": [], "locked": []}
    real_list, real_entries = Snapshot.manifests, ManifestFile.fetch_manifest_entry

    def manifests(self, io):
        reads["all"].append(self.manifest_list)
        if lock.held:
            reads["locked"].append(self.manifest_list)
        return real_list(self, io)

    def entries(self, *a, **k):
        reads["all"].append(self.manifest_path)
        if lock.held:
            reads["locked"].append(self.manifest_path)
        return real_entries(self, *a, **k)

    monkeypatch.setattr(Snapshot, "manifests", manifests)
    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", entries)
    return reads


def test_expiry_holds_the_table_lock_for_its_commit_alone(table_and_catalog, monkeypatch):
    """A round's commit takes the same lock: expiry reads no manifest list and no manifest
    while it holds it (it once walked every kept snapshot under it: 12.6 s at 1,500)."""
    catalog, table = table_and_catalog
    for i in range(30):
        table.append(_rows(i * 10, 10))
    now = max(s.timestamp_ms for s in catalog.load_table("db.t").metadata.snapshots) + 1
    lock = _WatchedLock()
    reads = _count_reads_under(lock, monkeypatch)
    out = expire(catalog, "db.t", MaintenanceSettings(snapshot_max_age_ms=0, retain_last=10), lock, {}, now_ms=now)
    assert out.snapshots == 20 and len(catalog.load_table("db.t").metadata.snapshots) == 10
    assert reads["all"] and reads["locked"] == []
    assert _ids(catalog.load_table("db.t")) == list(range(300))


def test_a_compaction_commit_reads_under_the_lock_only_the_manifests_holding_its_inputs(table_and_catalog,
                                                                                        monkeypatch):
    catalog, table = table_and_catalog
    for i in range(12):  # one manifest per append: partition a, then b, a, b...
        table.append(_rows(i * 10, 10, "ab"[i % 2]))
    lock = _WatchedLock()
    reads = _count_reads_under(lock, monkeypatch)
    s = MaintenanceSettings(min_input_files=6, target_file_size_bytes=1 << 20)
    out = compact(catalog, "db.t", s, lock, _rewrite, {})
    assert out is not None and out.files_in == 6
    table = catalog.load_table("db.t")
    inputs = {m.manifest_path for m in table.snapshot_by_id(table.current_snapshot().parent_snapshot_id)
              .manifests(table.io) if m.added_files_count}
    assert 0 < len(reads["locked"]) <= 6, reads["locked"]  # of the 12 manifests, the 6 with an input
    assert set(reads["locked"]) <= inputs
    assert _ids(table) == list(range(120))


def test_a_tables_history_and_metadata_stay_flat_at_the_default_settings(table_and_catalog, monkeypatch):
    """A round every 30 s (simulated: snapshot timestamps and expiry's clock) for an hour, with
    the default maintenance settings: once the retention is reached, the snapshot count stays
    within it and a tenth more, and the metadata file stops growing. (bench/history_bench.py
    measures 1 s and 5 s rounds.)"""
    import pyiceberg.table.snapshots as snapshots

    catalog, table = table_and_catalog
    clock = [1_700_000_000.0]

    class Clock:
        def time(self) -> float:
            return clock[0]

    monkeypatch.setattr(snapshots, "time", Clock())
    s = MaintenanceSettings()
    step_s, rounds = 30, 120
    kept = max(s.retain_last, s.snapshot_max_age_ms // 1000 // step_s + 1)
    counts, sizes = [], []
    for r in range(rounds):
        clock[0] += step_s
        table.append(_rows(r * 10, 10))
        expire(catalog, "db.t", s, threading.Lock(), {}, now_ms=int(clock[0] * 1000))
        table = catalog.load_table("db.t")
        counts.append(len(table.metadata.snapshots))
        sizes.append(os.path.getsize(local_path(table.metadata_location)))
    settled = rounds // 2
    assert kept < rounds // 2, "the default retention must be reached within the simulated hour"
    assert max(counts[settled:]) <= kept + kept // 10 + 1, counts
    assert max(sizes[settled:]) <= 1.15 * min(sizes[settled:]), sizes
    assert _ids(table) == list(range(rounds * 10))
