"""The coordinator's commit of mirror tables (coordinator/mirror.py, committer.py) against a
real SQLite catalog: rounds of collapsed changes (agents/mirror.py) with keys files, committed
as one snapshot per round holding new rows and position deletes; read back by a pyiceberg scan
and by DuckDB. A failover (a new coordinator with no index) rebuilds the index from the table;
a replayed round changes nothing; a partitioned table gets one delete file per partition; a
hypothesis test drives random change sequences over several rounds against a dict model."""

from __future__ import annotations

import itertools
import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import ManifestContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from agents.mirror import collapse
from coordinator.committer import RoundCommit, commit_table
from coordinator.mirror import MirrorIndexes
from coordinator.state import Accepted
from tests.support import duck
from icesink.shared.config import load_settings
from icesink.shared.errors import ConfigError
from icesink.shared.protocol import FileInfo, TopicPartition
from icesink.shared.iceberg import mirror_keys

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType(), required=False),
    NestedField(3, "region", StringType(), required=False), NestedField(4, "op", StringType(), required=False),
    identifier_field_ids=[1],
)
ARROW = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"1"}),
    pa.field("v", pa.string(), metadata={b"PARQUET:field_id": b"2"}),
    pa.field("region", pa.string(), metadata={b"PARQUET:field_id": b"3"}),
    pa.field("op", pa.string(), metadata={b"PARQUET:field_id": b"4"}),
])
TP = TopicPartition("cdc", 0)
_offsets = itertools.count(10)


def mirror_settings(tmp_path, **extra):
    return load_settings(None, None, {"topics": "cdc", "iceberg.tables": "db.m", "iceberg.catalog.type": "sql",
                                      "state.dir": str(tmp_path / "state"), "iceberg.tables.cdc-field": "op",
                                      "iceberg.tables.upsert-mode-enabled": "true", **extra})


def make_table(tmp_path, spec: PartitionSpec | None = None, version: str = "2"):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    kw = {"partition_spec": spec} if spec is not None else {}
    table = catalog.create_table("db.m", schema=SCHEMA, properties={"format-version": version}, **kw)
    os.makedirs(f"{table.location()}/data".removeprefix("file://"), exist_ok=True)
    return catalog


def response(catalog, changes: list[tuple[int, str | None, str]], region_of=lambda k: "eu") -> Accepted:
    """What a worker sends for one round of ``changes`` (key, value, op): the collapsed rows as
    data files (one per region, as Spark writes partitioned tables) and a keys file."""
    table = catalog.load_table("db.m")
    rows = pa.table({"id": [k for k, _, _ in changes], "v": [v for _, v, _ in changes],
                     "region": [region_of(k) for k, _, _ in changes], "op": [o for _, _, o in changes]}, schema=ARROW)
    out = collapse(rows, ["id"], "op", upsert=True)
    files: list[FileInfo] = []
    partitioned = not table.spec().is_unpartitioned()
    groups = sorted(set(out.rows.column("region").to_pylist())) if partitioned else [None]
    for region in groups:
        part = out.rows if region is None else out.rows.filter(pa.compute.equal(out.rows.column("region"), region))
        if not part.num_rows:
            continue
        path = f"{table.location()}/data/{uuid.uuid4().hex}.parquet"
        pq.write_table(part.cast(ARROW), path.removeprefix("file://"))
        files.append(FileInfo(path=path, record_count=part.num_rows, size_bytes=1, spec_id=table.spec().spec_id,
                              partition=(region,) if partitioned else ()))
    keys: tuple[FileInfo, ...] = ()
    if out.deleted_keys.num_rows:
        path = f"{table.location()}/data/{uuid.uuid4().hex}-keys.parquet"
        pq.write_table(out.deleted_keys, path.removeprefix("file://"))
        keys = (FileInfo(path=path, record_count=out.deleted_keys.num_rows, size_bytes=1, spec_id=0),)
    offset = next(_offsets)
    return Accepted(offset, f"r{offset}", "w1", (), {"db.m": tuple(files)}, None, {"db.m": keys} if keys else {})


def commit(catalog, mirrors, batch: list[Accepted]):
    return commit_table(catalog, "db.m", batch, RoundCommit(group="g", epoch=1, commit_id=batch[-1].commit_id,
                        positions={TP: batch[-1].offset}, valid_through_ms=None), mirrors=mirrors)


def rows_pyiceberg(catalog) -> dict[int, str | None]:
    got = catalog.load_table("db.m").scan().to_arrow().to_pylist()
    out = {r["id"]: r["v"] for r in got}
    assert len(out) == len(got), f"a key twice: {sorted(r['id'] for r in got)}"
    return out


def rows_duckdb(catalog) -> dict[int, str | None]:
    got = duck.scan_rows(catalog.load_table("db.m").metadata_location)
    out = {r["id"]: r["v"] for r in got}
    assert len(out) == len(got), f"a key twice: {sorted(r['id'] for r in got)}"
    return out


def test_rounds_of_changes_mirror_the_source_and_read_back_in_pyiceberg_and_duckdb(tmp_path):
    catalog = make_table(tmp_path)
    mirrors = MirrorIndexes(mirror_settings(tmp_path))
    commit(catalog, mirrors, [response(catalog, [(1, "a", "r"), (2, "b", "r"), (3, "c", "c"), (4, "d", "c")])])
    # update 2 twice (collapses), delete 3, delete an absent key, primary-key change 4 -> 40
    second = commit(catalog, mirrors, [response(catalog, [
        (2, "b1", "u"), (3, "c", "d"), (99, None, "d"), (2, "b2", "u"), (4, "d", "d"), (40, "d", "c")])])
    want = {1: "a", 2: "b2", 40: "d"}
    assert rows_pyiceberg(catalog) == want and rows_duckdb(catalog) == want
    table = catalog.load_table("db.m")
    snap = table.current_snapshot()
    assert snap.snapshot_id == second.snapshot_id and snap.summary.operation == Operation.OVERWRITE
    assert ManifestContent.DELETES in {m.content for m in snap.manifests(table.io)}
    # re-insert of a deleted key, insert of an existing key in upsert mode replaces it
    commit(catalog, mirrors, [response(catalog, [(3, "c-again", "c"), (1, "a2", "c")])])
    want = {1: "a2", 2: "b2", 3: "c-again", 40: "d"}
    assert rows_pyiceberg(catalog) == want and rows_duckdb(catalog) == want
    assert len(catalog.load_table("db.m").snapshots()) == 3  # one snapshot per round


def test_a_new_coordinator_rebuilds_the_index_and_a_replayed_round_changes_nothing(tmp_path):
    catalog = make_table(tmp_path)
    first = MirrorIndexes(mirror_settings(tmp_path))
    commit(catalog, first, [response(catalog, [(k, f"v{k}", "c") for k in range(10)])])
    round2 = [response(catalog, [(k, f"w{k}", "u") for k in range(0, 10, 2)])]
    commit(catalog, first, round2)
    snapshots = len(catalog.load_table("db.m").snapshots())
    failover = MirrorIndexes(mirror_settings(tmp_path))  # a new coordinator: no index yet
    again = commit(catalog, failover, round2)  # replay of a committed round: at or below the watermark
    assert again.snapshot_id is None and len(catalog.load_table("db.m").snapshots()) == snapshots
    commit(catalog, failover, [response(catalog, [(1, None, "d"), (2, "x", "u")])])
    want = {k: (f"w{k}" if k % 2 == 0 else f"v{k}") for k in range(10)}
    del want[1]
    want[2] = "x"
    assert rows_pyiceberg(catalog) == want and rows_duckdb(catalog) == want


def test_a_late_response_and_the_next_rounds_in_one_commit_apply_in_log_order(tmp_path):
    """A late response of the previous round committed with this round's: the later response's
    keys delete rows the earlier one adds in the same snapshot."""
    catalog = make_table(tmp_path)
    mirrors = MirrorIndexes(mirror_settings(tmp_path))
    commit(catalog, mirrors, [response(catalog, [(1, "a", "c")])])
    late = response(catalog, [(1, "a1", "u"), (2, "b", "c")])
    now = response(catalog, [(1, "a2", "u"), (2, None, "d")])
    commit(catalog, mirrors, [late, now])
    assert rows_pyiceberg(catalog) == {1: "a2"} and rows_duckdb(catalog) == {1: "a2"}
    # a new coordinator's index, rebuilt from that snapshot, applies the deletes of the same
    # snapshot's rows too: deleting key 1 now leaves nothing behind
    commit(catalog, MirrorIndexes(mirror_settings(tmp_path)), [response(catalog, [(1, None, "d"), (3, "c", "c")])])
    assert rows_pyiceberg(catalog) == {3: "c"} and rows_duckdb(catalog) == {3: "c"}


def test_a_partitioned_mirror_table_gets_one_delete_file_per_partition(tmp_path):
    spec = PartitionSpec(PartitionField(source_id=3, field_id=1000, transform=IdentityTransform(), name="region"))
    catalog = make_table(tmp_path, spec)
    mirrors = MirrorIndexes(mirror_settings(tmp_path))
    region = lambda k: "eu" if k % 2 else "us"  # noqa: E731
    commit(catalog, mirrors, [response(catalog, [(k, f"v{k}", "c") for k in range(8)], region)])
    commit(catalog, mirrors, [response(catalog, [(k, f"w{k}", "u") for k in range(4)] + [(7, None, "d")], region)])
    want = {0: "w0", 1: "w1", 2: "w2", 3: "w3", 4: "v4", 5: "v5", 6: "v6"}
    assert rows_pyiceberg(catalog) == want and rows_duckdb(catalog) == want
    table = catalog.load_table("db.m")
    deletes = [e.data_file for m in table.current_snapshot().manifests(table.io)
               if m.content == ManifestContent.DELETES for e in m.fetch_manifest_entry(table.io)]
    assert sorted(d.partition[0] for d in deletes) == ["eu", "us"]
    failover = MirrorIndexes(mirror_settings(tmp_path))  # rebuilt index keeps the partitions
    commit(catalog, failover, [response(catalog, [(5, None, "d"), (6, "x", "u")], region)])
    want.pop(5)
    want[6] = "x"
    assert rows_pyiceberg(catalog) == want and rows_duckdb(catalog) == want


def _locations(index) -> dict:
    """A key index as key -> (data file, row position)."""
    return {k: (index._files[w >> 32], w & 0xFFFFFFFF) for k, w in index._where.items()}


def test_compaction_folds_the_delete_files_and_moves_the_key_index_in_place(tmp_path, caplog):
    """The default rule folds a partition at its first delete file; the compaction step moves
    the coordinator's key index to the new files (no rebuild at the next round: the index kept
    is the same object, at the replace snapshot, and equals one rebuilt from the table); the
    next rounds' deletes then hit the rows in the new files: exact in pyiceberg and DuckDB."""
    import logging
    import threading

    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    from coordinator.key_index import KeyIndex
    from coordinator.maintenance import MaintenanceSettings, compact, live_files, plan_compaction
    from spark_bridge.rewrite import read_files

    def rewrite(table, data_files, delete_files, prefix):  # pyiceberg reads, pyiceberg writes: no Spark here
        return list(_dataframe_to_data_files(table.metadata, read_files(table, data_files, delete_files), table.io,
                                             write_uuid=uuid.uuid4()))

    spec = PartitionSpec(PartitionField(source_id=3, field_id=1000, transform=IdentityTransform(), name="region"))
    catalog = make_table(tmp_path, spec)
    mirrors = MirrorIndexes(mirror_settings(tmp_path))
    region = lambda k: "eu" if k % 2 else "us"  # noqa: E731
    commit(catalog, mirrors, [response(catalog, [(k, f"v{k}", "c") for k in range(10)], region)])
    s = MaintenanceSettings(target_file_size_bytes=1 << 20)  # the defaults: 16 small files, or 1 delete file
    assert plan_compaction(catalog.load_table("db.m"), s) is None  # two data files, no delete file
    commit(catalog, mirrors, [response(catalog, [(1, "w1", "u"), (3, None, "d"), (10, "v10", "c")], region)])
    assert plan_compaction(catalog.load_table("db.m"), MaintenanceSettings(min_delete_files=2)) is None
    plan = plan_compaction(catalog.load_table("db.m"), s)
    assert plan is not None and len(plan.deletes) == 1 and plan.partition[1] == ("eu",) and len(plan.data) == 2
    index = mirrors._by_table["db.m"][1]
    out = compact(catalog, "db.m", s, threading.Lock(), rewrite, mirrors=mirrors)
    assert out is not None and out.snapshot_id is not None and out.deletes_folded == 1
    table = catalog.load_table("db.m")
    assert not [f for f in live_files(table) if f.content != f.content.DATA]  # no delete file is live
    kept_at, kept = mirrors._by_table["db.m"]
    assert kept is index and kept_at == out.snapshot_id == table.current_snapshot().snapshot_id
    assert _locations(kept) == _locations(KeyIndex.from_table(table, ["id"]))
    want = {k: f"v{k}" for k in range(11) if k != 3} | {1: "w1"}
    assert rows_pyiceberg(catalog) == want and rows_duckdb(catalog) == want
    with caplog.at_level(logging.INFO, logger="coordinator.mirror"):
        commit(catalog, mirrors, [response(catalog, [(1, None, "d"), (5, "x", "u"), (7, "y", "u")], region)])
    assert "rebuilt" not in caplog.text
    want.pop(1)
    want.update({5: "x", 7: "y"})
    assert rows_pyiceberg(catalog) == want and rows_duckdb(catalog) == want


def test_tables_that_cannot_be_mirror_tables_are_refused_naming_the_key(tmp_path):
    catalog = make_table(tmp_path, version="1")
    with pytest.raises(ConfigError, match="format version 2") as e:
        mirror_keys(mirror_settings(tmp_path), "db.m", catalog.load_table("db.m"))
    assert e.value.key == "iceberg.tables.cdc-field"
    catalog.create_table("db.nokey", schema=Schema(NestedField(1, "x", LongType())), properties={"format-version": "2"})
    with pytest.raises(ConfigError, match="key columns of mirror table db.nokey") as e:
        mirror_keys(mirror_settings(tmp_path), "db.nokey", catalog.load_table("db.nokey"))
    assert e.value.key == "iceberg.tables.default-id-columns"
    with pytest.raises(ConfigError, match="'nope' is not one of") as e:
        mirror_keys(mirror_settings(tmp_path, **{"iceberg.tables": "db.m,db.nokey",
                                                 "iceberg.table.db.nokey.id-columns": "nope"}), "db.nokey",
                    catalog.load_table("db.nokey"))
    assert e.value.key == "iceberg.table.db.nokey.id-columns"
    assert mirror_keys(load_settings(None, None, {"topics": "cdc", "iceberg.tables": "db.m"}), "db.m",
                       catalog.load_table("db.m")) is None  # no mirror settings: an append table


OPS = st.sampled_from(["c", "u", "d", "r"])
ROUND = st.lists(st.tuples(st.integers(0, 12), st.text("abc", max_size=2), OPS), max_size=12)


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(ROUND, min_size=1, max_size=4), failover_at=st.integers(0, 4))
def test_random_rounds_of_changes_equal_a_dict_model(tmp_path_factory, rounds, failover_at):
    tmp = tmp_path_factory.mktemp("m")
    catalog = make_table(tmp)
    mirrors = MirrorIndexes(mirror_settings(tmp))
    model: dict[int, str] = {}
    for i, changes in enumerate(rounds):
        if i == failover_at:
            mirrors = MirrorIndexes(mirror_settings(tmp))
        if not changes:
            continue
        for key, value, op in changes:
            if op == "d":
                model.pop(key, None)
            else:
                model[key] = value
        commit(catalog, mirrors, [response(catalog, [(k, v, o) for k, v, o in changes])])
    assert rows_pyiceberg(catalog) == model
    assert rows_duckdb(catalog) == model


def test_the_delete_files_of_a_commit_the_catalog_refused_are_removed(tmp_path, monkeypatch):
    """A parked mirror table (dropped meanwhile, refused by the catalog) writes its position
    deletes again at every attempt: a commit the catalog surely refused leaves none behind."""
    from pyiceberg.exceptions import ForbiddenError, NoSuchTableError

    catalog = make_table(tmp_path)
    mirrors = MirrorIndexes(mirror_settings(tmp_path))
    commit(catalog, mirrors, [response(catalog, [(k, f"v{k}", "c") for k in range(4)])])
    data = f"{catalog.load_table('db.m').location()}/data".removeprefix("file://")
    before = set(os.listdir(data))
    for refusal in (NoSuchTableError("db.m dropped"), ForbiddenError("no commit permission")):
        batch = [response(catalog, [(1, None, "d"), (2, "x", "u")])]
        added = {p.rsplit("/", 1)[1] for a in batch for fs in (*a.files.values(), *a.deleted_keys.values())
                 for p in (f.path for f in fs)}

        def refuse(*a, _exc=refusal, **k):
            raise _exc

        monkeypatch.setattr(SqlCatalog, "commit_table", refuse)
        with pytest.raises(type(refusal)):
            commit(catalog, mirrors, batch)
        monkeypatch.undo()
        left = set(os.listdir(data)) - before - added
        assert not left, f"delete files of a refused commit ({type(refusal).__name__}) left behind: {left}"
        before |= added
