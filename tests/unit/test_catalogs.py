"""coordinator.iceberg_ext.catalogs.SqlCatalog against pyiceberg's own SQL catalog, on one real SQLite catalog
database: a commit from a current table skips the reload and leaves what pyiceberg's commit
leaves (snapshots, metadata log, the catalog row's previous location); a stale table, or a
pointer that moved between the check and the update, never loses another writer's commit; the
base metadata is never mutated; icesink.shared.iceberg.load_catalog picks it for SQL catalogs only."""

from __future__ import annotations

import gzip

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import IcebergTables
from pyiceberg.catalog.sql import SqlCatalog as PyicebergSqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import AssertRefSnapshotId
from pyiceberg.types import LongType, NestedField
from sqlalchemy import select

from icesink.shared import catalogs
from coordinator.iceberg_ext import catalogs as ext_catalogs
from coordinator.iceberg_ext.catalogs import SqlCatalog, staged_metadata

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


def _catalogs(tmp_path):
    props = {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    ours, theirs = SqlCatalog("c", **props), PyicebergSqlCatalog("c", **props)
    ours.create_namespace("db")
    return ours, theirs


def _ids(table) -> list[int]:
    return sorted(table.scan().to_arrow()["id"].to_pylist())


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def _row(catalog, name: str) -> tuple[str, str]:
    with catalog.engine.connect() as c:
        row = c.execute(select(IcebergTables.metadata_location, IcebergTables.previous_metadata_location)
                        .where(IcebergTables.table_name == name)).one()
    return row[0], row[1]


def test_a_current_table_commits_without_a_reload_and_leaves_what_pyiceberg_leaves(tmp_path, monkeypatch):
    ours, theirs = _catalogs(tmp_path)
    table = ours.create_table("db.t", schema=SCHEMA)
    table.append(_rows(1, 2))  # the first commit: the table is current, so the fast path
    loads: list[object] = []
    real_load = PyicebergSqlCatalog.load_table
    monkeypatch.setattr(PyicebergSqlCatalog, "load_table", lambda self, i: loads.append(i) or real_load(self, i))
    before = table.metadata_location
    base = table.metadata
    dumped = base.model_dump()
    table.append(_rows(3))
    table.transaction().set_properties(k="v").commit_transaction()
    assert loads == []  # no reload of the table in either commit
    assert base.model_dump() == dumped  # the metadata the commit started from is unchanged
    monkeypatch.undo()
    reread = theirs.load_table("db.t")  # pyiceberg's own catalog reads what ours wrote
    assert _ids(reread) == [1, 2, 3] and reread.properties["k"] == "v"
    assert reread.metadata == table.metadata and reread.metadata_location == table.metadata_location
    assert len(reread.snapshots()) == 2
    log = [e.metadata_file for e in reread.metadata.metadata_log]
    assert before in log and len(log) == 3  # every earlier metadata file is in the metadata log
    location, previous = _row(ours, "t")
    assert location == table.metadata_location and previous in log
    # the same commits on pyiceberg's catalog log the same number of metadata files
    plain = theirs.create_table("db.p", schema=SCHEMA)
    plain.append(_rows(1, 2))
    plain.append(_rows(3))
    plain.transaction().set_properties(k="v").commit_transaction()
    assert len(theirs.load_table("db.p").metadata.metadata_log) == 3


def test_a_stale_table_takes_pyicebergs_path_and_no_commit_is_lost(tmp_path):
    ours, theirs = _catalogs(tmp_path)
    ours.create_table("db.t", schema=SCHEMA)
    stale = ours.load_table("db.t")
    theirs.load_table("db.t").append(_rows(1))  # another writer commits meanwhile
    stale.append(_rows(2))  # refused by the catalog, refreshed and re-applied by pyiceberg
    now = ours.load_table("db.t")
    assert _ids(now) == [1, 2]
    # the metadata file written for the refused compare-and-set is deleted again
    files = {str(f) for f in (tmp_path / "wh" / "db" / "t" / "metadata").glob("*.metadata.json")}
    logged = {e.metadata_file.removeprefix("file://") for e in now.metadata.metadata_log}
    assert files == logged | {now.metadata_location.removeprefix("file://")}


def test_a_commit_from_a_current_table_runs_one_statement(tmp_path):
    from sqlalchemy import event

    ours, _ = _catalogs(tmp_path)
    table = ours.create_table("db.t", schema=SCHEMA)
    statements: list[str] = []
    event.listen(ours.engine, "before_cursor_execute", lambda *a: statements.append(a[2].split()[0]))
    table.append(_rows(1))
    table.append(_rows(2))
    assert statements == ["UPDATE", "UPDATE"]  # the compare-and-set only: no read of the pointer first


def test_a_pointer_that_moved_since_the_table_was_read_loses_no_commit(tmp_path, monkeypatch):
    ours, theirs = _catalogs(tmp_path)
    ours.create_table("db.t", schema=SCHEMA)
    mine = ours.load_table("db.t")
    theirs.load_table("db.t").append(_rows(1))  # lands after we read the table
    loads: list[object] = []
    real_load = PyicebergSqlCatalog.load_table
    monkeypatch.setattr(PyicebergSqlCatalog, "load_table", lambda self, i: loads.append(i) or real_load(self, i))
    ours.commit_table(mine, (), mine.transaction().set_properties(k="v")._updates)  # refused, then pyiceberg's path
    assert loads  # the refused compare-and-set sent the commit through pyiceberg's reload
    monkeypatch.undo()
    now = theirs.load_table("db.t")
    assert _ids(now) == [1] and now.properties["k"] == "v"
    # a snapshot-bound commit from the stale table is refused outright, the other's data kept
    with pytest.raises(CommitFailedException):
        ours.commit_table(mine, (AssertRefSnapshotId(snapshot_id=None, ref="main"),),  # main was empty
                          mine.transaction().set_properties(j="w")._updates)
    assert _ids(theirs.load_table("db.t")) == [1] and "j" not in theirs.load_table("db.t").properties


def test_staged_metadata_equals_pyicebergs_update_apart_from_the_deep_copy(tmp_path):
    from pyiceberg.table.update import update_table_metadata

    ours, _ = _catalogs(tmp_path)
    table = ours.create_table("db.t", schema=SCHEMA)
    table.append(_rows(1))
    updates = table.transaction().set_properties(a="1")._updates
    mine = staged_metadata(table.metadata, updates, table.metadata_location)
    theirs = update_table_metadata(table.metadata, updates, metadata_location=table.metadata_location)
    assert mine.model_copy(update={"last_updated_ms": 0}) == theirs.model_copy(update={"last_updated_ms": 0})


def test_load_catalog_uses_it_for_sql_catalogs_only(tmp_path):
    from icesink.shared.config import load_settings
    from icesink.shared.iceberg import load_catalog

    base = {"topics": "t", "iceberg.tables": "db.t", "state.dir": str(tmp_path / "state")}
    sql = load_catalog(load_settings(None, None, {**base, "iceberg.catalog.uri": f"sqlite:///{tmp_path}/c.db",
                                                  "iceberg.catalog.warehouse": f"file://{tmp_path}/wh"}))
    assert type(sql) is SqlCatalog and sql.properties["uri"] == f"sqlite:///{tmp_path}/c.db"
    custom = load_catalog(load_settings(None, None, {
        **base, "iceberg.catalog.py-catalog-impl": "pyiceberg.catalog.sql.SqlCatalog",
        "iceberg.catalog.uri": f"sqlite:///{tmp_path}/d.db", "iceberg.catalog.warehouse": f"file://{tmp_path}/wh"}))
    assert type(custom) is PyicebergSqlCatalog  # a user's own implementation is kept


def test_each_manifest_list_is_read_once_by_the_commits_and_maintenance(tmp_path, monkeypatch):
    """The coordinator reads the current manifest list of every table it commits to twice a
    round (the append's existing manifests, maintenance's check): a manifest list never
    changes, so the process reads each once (here as if another process had written them:
    one it wrote itself it never reads, tests/unit/test_manifest_writers.py). The table still
    reads back every row."""
    import uuid

    import pyiceberg.manifest as manifest
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    from coordinator.iceberg_ext import SpecAwareAppend
    from coordinator.maintenance import MaintenanceSettings, plan_compaction

    reads: list[str] = []
    real = manifest.read_manifest_list

    def counted(input_file):  # type: ignore[no-untyped-def]
        reads.append(input_file.location)
        return real(input_file)

    monkeypatch.setattr(manifest, "read_manifest_list", counted)
    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=Schema(NestedField(1, "id", LongType(), required=False)))
    settings = MaintenanceSettings(min_input_files=100)
    for i in range(4):
        files = list(_dataframe_to_data_files(table.metadata, _rows(i), table.io, write_uuid=uuid.uuid4()))
        with table.transaction() as tx, SpecAwareAppend.of(tx, {}) as append:
            for f in files:
                f.spec_id = table.metadata.default_spec_id
                append.append_data_file(f)
        catalogs._manifest_lists.clear()  # forget what this process wrote
        table = catalog.load_table("db.t")
        assert plan_compaction(table, MaintenanceSettings(min_input_files=2), {}) is not None or i == 0
        assert plan_compaction(table, settings, {}) is None
    assert reads and len(reads) == len(set(reads)), reads
    assert _ids(table) == [0, 1, 2, 3]


@pytest.mark.parametrize("name", ["00001-a.metadata.json", "00001-a.gz.metadata.json"])
def test_metadata_files_are_pyicebergs_bytes_and_its_configuration_is_read_once(tmp_path, monkeypatch, name):
    from pyiceberg.serializers import ToOutputFile
    from pyiceberg.utils import config

    ours, _ = _catalogs(tmp_path)
    table = ours.create_table("db.t", schema=SCHEMA)
    table.append(_rows(1, 2))
    metadata = table.metadata.model_copy(update={"current_snapshot_id": None})  # None: legacy-current-snapshot-id
    ext_catalogs._legacy_current_snapshot_id.cache_clear()
    built: list[object] = []
    real_init = config.Config.__init__
    monkeypatch.setattr(config.Config, "__init__", lambda self: built.append(self) or real_init(self))
    for i in range(3):
        SqlCatalog._write_metadata(metadata, table.io, f"{tmp_path}/ours{i}-{name}")
    assert len(built) == 1  # once per process, not per file
    ToOutputFile.table_metadata(metadata, table.io.new_output(f"{tmp_path}/theirs-{name}"))
    assert _content(tmp_path / f"ours0-{name}") == _content(tmp_path / f"theirs-{name}")

    monkeypatch.setenv("PYICEBERG_LEGACY_CURRENT_SNAPSHOT_ID", "true")  # a process that starts with it set
    ext_catalogs._legacy_current_snapshot_id.cache_clear()
    SqlCatalog._write_metadata(metadata, table.io, f"{tmp_path}/ours-legacy-{name}")
    ToOutputFile.table_metadata(metadata, table.io.new_output(f"{tmp_path}/theirs-legacy-{name}"))
    legacy = _content(tmp_path / f"ours-legacy-{name}")
    assert legacy == _content(tmp_path / f"theirs-legacy-{name}") and legacy != _content(tmp_path / f"ours0-{name}")
    ext_catalogs._legacy_current_snapshot_id.cache_clear()


def _content(path) -> bytes:
    """A metadata file's JSON (a gzip file's header holds its time of writing)."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz.metadata.json") else data


def test_each_snapshot_is_serialized_once_and_metadata_files_stay_pyicebergs_bytes(tmp_path, monkeypatch):
    """A commit's cost must not grow with the history (issue 42 target 6): the metadata file
    lists every snapshot the table keeps, and each is turned into JSON once, not at every
    commit; the file's bytes stay pyiceberg's, snapshot summaries (the sink state) included."""
    from pyiceberg.serializers import ToOutputFile

    ours, _ = _catalogs(tmp_path)
    table = ours.create_table("db.t", schema=SCHEMA)
    dumped: list[int] = []
    real = ext_catalogs.entry_json
    monkeypatch.setattr(ext_catalogs, "entry_json",
                        lambda s, x: (isinstance(s, Snapshot) and dumped.append(s.snapshot_id)) or real(s, x))
    for i in range(5):
        table.append(_rows(i), snapshot_properties={"icesink.commit-id": f"c{i}", "note": 'with "quotes" []'})
    assert len(table.metadata.snapshots) == 5
    assert sorted(dumped) == sorted(s.snapshot_id for s in table.metadata.snapshots)  # each once
    SqlCatalog._write_metadata(table.metadata, table.io, f"{tmp_path}/ours.metadata.json")
    ToOutputFile.table_metadata(table.metadata, table.io.new_output(f"{tmp_path}/theirs.metadata.json"))
    assert _content(tmp_path / "ours.metadata.json") == _content(tmp_path / "theirs.metadata.json")
    assert _ids(ours.load_table("db.t")) == [0, 1, 2, 3, 4]


def test_each_log_entry_is_serialized_once_and_metadata_files_stay_pyicebergs_bytes(tmp_path, monkeypatch):
    """The snapshot log (an entry per snapshot kept) and the metadata log (the last 100 files)
    were dumped whole at every commit: at 700 snapshots 0.36 ms of a 0.38 ms body, the largest
    part of what a commit at a long history costs more than a young table's (issue 42 target
    6). Each entry is turned into JSON once; the files stay pyiceberg's bytes as the logs
    grow, and as the metadata log drops its oldest files (previous-versions-max)."""
    from pyiceberg.serializers import ToOutputFile

    ours, _ = _catalogs(tmp_path)
    table = ours.create_table("db.t", schema=SCHEMA, properties={"write.metadata.previous-versions-max": "3"})
    dumped: list[object] = []
    real = ext_catalogs.entry_json
    monkeypatch.setattr(ext_catalogs, "entry_json", lambda e, x: dumped.append(e) or real(e, x))
    for i in range(6):
        table.append(_rows(i))
    metadata = table.metadata
    assert len(metadata.snapshot_log) == 6 and len(metadata.metadata_log) == 3
    assert len(dumped) == len(set(map(repr, dumped)))  # no entry twice
    SqlCatalog._write_metadata(metadata, table.io, f"{tmp_path}/ours.metadata.json")
    ToOutputFile.table_metadata(metadata, table.io.new_output(f"{tmp_path}/theirs.metadata.json"))
    assert _content(tmp_path / "ours.metadata.json") == _content(tmp_path / "theirs.metadata.json")
    assert _ids(ours.load_table("db.t")) == list(range(6))


def test_after_an_expiry_and_more_appends_metadata_files_stay_pyicebergs_bytes(tmp_path):
    """A round's commit extends the snapshot list its table's last metadata file joined; expiry
    removes snapshots from its front, and the next file lists them all again: both stay
    pyiceberg's bytes."""
    from pyiceberg.serializers import ToOutputFile
    from pyiceberg.table.update.snapshot import ExpireSnapshots

    from coordinator.iceberg_ext import MemoTransaction

    ours, _ = _catalogs(tmp_path)
    table = ours.create_table("db.t", schema=SCHEMA)
    for i in range(6):
        table.append(_rows(i), snapshot_properties={"icesink.commit-id": f"c{i}"})
    oldest = [s.snapshot_id for s in table.metadata.snapshots[:3]]
    ExpireSnapshots(MemoTransaction(table, autocommit=True)).by_ids(oldest).commit()
    for i in range(6, 8):
        table.append(_rows(i), snapshot_properties={"icesink.commit-id": f"c{i}"})
    assert len(table.metadata.snapshots) == 5
    for n, metadata in enumerate([table.metadata, ours.load_table("db.t").metadata]):
        SqlCatalog._write_metadata(metadata, table.io, f"{tmp_path}/ours{n}.metadata.json")
        ToOutputFile.table_metadata(metadata, table.io.new_output(f"{tmp_path}/theirs{n}.metadata.json"))
        assert _content(tmp_path / f"ours{n}.metadata.json") == _content(tmp_path / f"theirs{n}.metadata.json")
    assert _ids(ours.load_table("db.t")) == list(range(8))


class _Counted(list):
    """A snapshot list that counts the snapshots a search walks through."""

    walked = 0

    def __iter__(self):
        for s in super().__iter__():
            type(self).walked += 1
            yield s

    def __reversed__(self):
        for s in super().__reversed__():
            type(self).walked += 1
            yield s


def test_looking_up_the_current_snapshot_does_not_walk_the_history(tmp_path):
    """A commit looks up its parent (the current snapshot) about ten times; at a history of 700
    snapshots pyiceberg's search from the oldest made that a tenth of the commit (issue 42
    target 6). Installed (coordinator/iceberg_ext), the search starts at the newest, any other
    id is found in an index of the list made once, with the same answers for every id."""
    from coordinator import iceberg_ext

    iceberg_ext.install()
    ours, _ = _catalogs(tmp_path)
    table = ours.create_table("db.t", schema=SCHEMA)
    for i in range(30):
        table.append(_rows(i))
    metadata = table.metadata
    ids = [s.snapshot_id for s in metadata.snapshots]
    counted = metadata.model_copy(update={"snapshots": _Counted(metadata.snapshots)})
    _Counted.walked = 0
    assert counted.snapshot_by_id(metadata.current_snapshot_id).snapshot_id == ids[-1]
    assert _Counted.walked <= 1
    assert [counted.snapshot_by_id(i).snapshot_id for i in ids] == ids
    assert counted.snapshot_by_id(-1) is None
    # a commit asks three times for its new snapshot's id, which is not there: the list's index
    # is made once (a pass over the ids and one over the snapshots), not a walk per question
    fresh = metadata.model_copy(update={"snapshots": _Counted(metadata.snapshots)})
    _Counted.walked = 0
    assert [fresh.snapshot_by_id(i) for i in (-1, -2, -3)] == [None] * 3
    assert _Counted.walked <= 2 * len(ids)
    assert fresh.snapshot_by_id(ids[0]).snapshot_id == ids[0]


def test_a_commit_reads_no_snapshot_of_the_history_to_choose_its_snapshots_id(tmp_path, monkeypatch):
    """pyiceberg draws a new snapshot's id and asks whether the table has it. The table's list
    was new (the last commit's), so each commit indexed its whole history to answer: at 700
    snapshots, beside 199 other tables' histories in memory, 0.5 ms of a 4 ms commit (issue 42
    target 6, bench/history_bench.py). A list one commit made from another shares that one's
    index; the answers stay pyiceberg's, also for 40 tables committed in turn."""
    from coordinator import iceberg_ext
    from coordinator.iceberg_ext.snapshots import MemoTransaction

    def append(table, rows):
        with MemoTransaction(table) as tx:  # the committer's transaction
            tx.append(rows)

    iceberg_ext.install()
    ours, _ = _catalogs(tmp_path)
    tables = [ours.create_table(f"db.t{i}", schema=SCHEMA) for i in range(40)]
    for n in range(3):
        for t in tables:
            append(t, _rows(n))
    read = []
    real = ext_catalogs._SNAPSHOT_ID
    monkeypatch.setattr(ext_catalogs, "_SNAPSHOT_ID", lambda s: read.append(s) or real(s))
    for t in tables:
        append(t, _rows(3))
    assert read == []
    for k, t in enumerate(tables):
        metadata, neighbour = t.metadata, tables[k - 1].metadata
        ids = [s.snapshot_id for s in metadata.snapshots]
        assert len(ids) == 4
        assert [metadata.snapshot_by_id(i).snapshot_id for i in ids] == ids
        assert [metadata.snapshot_by_id(s.snapshot_id) for s in neighbour.snapshots] == [None] * 4
        assert _ids(ours.load_table(t.name())) == [0, 1, 2, 3]
    # a list that is not one commit's extension of another is indexed on its own
    other = tables[0].metadata.model_copy(update={"snapshots": tables[0].metadata.snapshots[1:]})
    assert other.snapshot_by_id(tables[0].metadata.snapshots[0].snapshot_id) is None
    assert other.snapshot_by_id(tables[0].metadata.snapshots[1].snapshot_id) is tables[0].metadata.snapshots[1]


def test_a_list_asked_about_again_stays_indexed_among_newer_ones(monkeypatch):
    """Each table keeps its last ``PER_TABLE`` lists' indexes (ext_catalogs.SnapshotIndex); the
    one a table's commits keep asking about (its current metadata's, between maintenance's
    and staged lists) is kept as the newest each time it is found, not dropped after
    ``PER_TABLE`` others and indexed again."""
    index = ext_catalogs.SnapshotIndex()
    read = []
    real = ext_catalogs._SNAPSHOT_ID
    monkeypatch.setattr(ext_catalogs, "_SNAPSHOT_ID", lambda s: read.append(s) or real(s))
    often = [Snapshot(snapshot_id=i, timestamp_ms=i, manifest_list=f"m{i}") for i in (1, 2)]
    assert index.find("t", often, 2) is often[1]
    assert len(read) == 2  # indexed once
    for k in range(3 * index.PER_TABLE):
        other = [Snapshot(snapshot_id=100 + k, timestamp_ms=k, manifest_list=f"o{k}")]
        assert index.find("t", other, 100 + k) is other[0]
        assert index.find("t", often, 1) is often[0]
        assert index.find("t", often, 100 + k) is None
    assert sum(s in often for s in read) == 2  # never indexed again


def test_a_created_table_is_the_one_written_and_its_namespace_is_read_once(tmp_path, monkeypatch):
    """A round routed to 200 new tables creates them all first (issue 42 target 3): pyiceberg's
    creation asked whether the namespace exists twice (once more for its location) and read
    the table it had just written back from its file. The table returned is the one written,
    equal to what pyiceberg's catalog loads; a missing namespace and a taken name fail as
    pyiceberg's do."""
    from pyiceberg.exceptions import NoSuchNamespaceError, TableAlreadyExistsError

    ours, theirs = _catalogs(tmp_path)
    asked: list[object] = []
    for method in ("namespace_exists", "load_table"):
        real = getattr(PyicebergSqlCatalog, method)
        monkeypatch.setattr(PyicebergSqlCatalog, method,
                            lambda self, *a, real=real, method=method, **k: asked.append(method) or real(self, *a, **k))
    table = ours.create_table("db.t", schema=SCHEMA, properties={"k": "v"})
    assert asked == ["namespace_exists"]
    monkeypatch.undo()
    loaded = theirs.load_table("db.t")
    assert table.metadata == loaded.metadata and table.metadata_location == loaded.metadata_location
    assert table.name() == loaded.name() and table.io.properties == loaded.io.properties
    table.append(_rows(1))
    assert _ids(theirs.load_table("db.t")) == [1]
    with pytest.raises(NoSuchNamespaceError):
        ours.create_table("nowhere.t", schema=SCHEMA)
    with pytest.raises(TableAlreadyExistsError):
        ours.create_table("db.t", schema=SCHEMA)
    placed = ours.create_table("db.placed", schema=SCHEMA, location=f"file://{tmp_path}/elsewhere")
    assert placed.metadata == theirs.load_table("db.placed").metadata
    with pytest.raises(NoSuchNamespaceError):
        ours.create_table("nowhere.p", schema=SCHEMA, location=f"file://{tmp_path}/p")


def test_tables_created_together_are_pyicebergs_tables_and_all_or_none_is_created(tmp_path):
    """A fetch routed to many new tables creates them together (agents/tables.py
    ``create_targets``): one transaction, each namespace read once; each table what pyiceberg's
    catalog loads, where pyiceberg's own creation would have put it (a namespace with a location
    property, one without). A missing namespace or a name taken creates none of them and leaves
    no metadata file."""
    from pyiceberg.exceptions import NoSuchNamespaceError, TableAlreadyExistsError
    from sqlalchemy import event

    from icesink.shared.catalogs import NewTable

    ours, theirs = _catalogs(tmp_path)
    ours.create_namespace("placed", {"location": f"file://{tmp_path}/placed-here/"})
    commits: list[object] = []
    event.listen(ours.engine, "commit", commits.append)
    names = ["db.a", "placed.b", "db.c", "placed.d"]
    made = ours.create_table_batch([NewTable(n, SCHEMA, properties={"k": n}) for n in names])
    assert len(commits) == 1
    for name, table in zip(names, made, strict=True):
        loaded = theirs.load_table(name)
        assert table.metadata == loaded.metadata and table.metadata_location == loaded.metadata_location
        assert table.name() == loaded.name() and loaded.properties["k"] == name
        namespace, _, short = name.partition(".")
        assert table.location() == theirs._get_default_warehouse_location(namespace, short)
    assert made[1].location() == f"file://{tmp_path}/placed-here/b"
    made[2].append(_rows(7))
    assert _ids(theirs.load_table("db.c")) == [7]

    def metadata_files() -> int:
        return len(list(tmp_path.rglob("*.metadata.json")))

    before = metadata_files()
    with pytest.raises(NoSuchNamespaceError):
        ours.create_table_batch([NewTable("db.e", SCHEMA), NewTable("nowhere.f", SCHEMA)])
    with pytest.raises(TableAlreadyExistsError):
        ours.create_table_batch([NewTable("db.e", SCHEMA), NewTable("db.a", SCHEMA)])
    with pytest.raises(TableAlreadyExistsError):
        ours.create_table_batch([NewTable("db.e", SCHEMA), NewTable("db.e", SCHEMA)])
    assert not theirs.table_exists("db.e") and metadata_files() == before
