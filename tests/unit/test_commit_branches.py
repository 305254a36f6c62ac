"""Commit branches (the reference sink's iceberg.tables.default-commit-branch and
iceberg.table.<table>.commit-branch): the settings, and the coordinator's commits and
exactly-once state on a table's branch, against a real SQLite catalog (docs/commits.md
"Branches")."""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pytest

from coordinator import committer
from coordinator.maintenance import MaintenanceSettings, plan_compaction
from coordinator.startup import Recovery
from icesink.shared.config import CommitBranches, build, load_settings
from icesink.shared.errors import ConfigError, TableChangedError
from icesink.shared.iceberg import branch_head, latest_sink_summary
from icesink.shared.protocol import TopicPartition, state_property
from coordinator.state import Accepted
from tests.unit.test_coordinator_commit import _accepted, data_file

TP = TopicPartition("src", 0)
BASE = {"topics": "src", "iceberg.tables": "db.a,db.b"}


# Settings ------------------------------------------------------------------------------------


def test_branch_keys_default_to_main_and_the_table_key_wins_over_the_default(caplog):
    assert build(BASE).commit_branch("db.a") == "main"
    with caplog.at_level(logging.WARNING):
        s = build({**BASE, "iceberg.tables.default-commit-branch": "audit", "iceberg.table.db.b.commit-branch": "b2"})
    assert "unknown settings ignored" not in caplog.text  # both keys are known now
    assert (s.commit_branch("db.a"), s.commit_branch("db.b")) == ("audit", "b2")
    assert s.commit_branches == CommitBranches("audit", (("db.b", "b2"),))
    only_table = build({**BASE, "iceberg.table.db.a.commit-branch": "x"})
    assert (only_table.commit_branch("db.a"), only_table.commit_branch("db.b")) == ("x", "main")


@pytest.mark.parametrize(("key", "value"), [
    ("iceberg.tables.default-commit-branch", " "),
    ("iceberg.table.db.a.commit-branch", "audit "),
    ("iceberg.table.db.zz.commit-branch", "audit"),  # a table the sink does not write
])
def test_a_bad_branch_key_is_refused_naming_it(key, value):
    with pytest.raises(ConfigError) as err:
        build({**BASE, key: value})
    assert err.value.key == key


def test_the_maintenance_settings_carry_the_branches():
    s = build({**BASE, "iceberg.tables.default-commit-branch": "audit"})
    assert MaintenanceSettings.of(s).branches.of("db.a") == "audit"


# Commits on a branch -----------------------------------------------------------------------------


def _round(offset: int, branch: str | None, epoch: int = 1) -> committer.RoundCommit:
    return committer.RoundCommit(group="g", epoch=epoch, commit_id=f"r{offset}", positions={TP: offset},
                                 valid_through_ms=None,
                                 branches=CommitBranches(branch) if branch else CommitBranches())


def _ids(table: Any, snapshot_id: int | None) -> list[int]:
    return sorted(table.scan(snapshot_id=snapshot_id).to_arrow().column("id").to_pylist())


def test_rounds_commit_to_the_branch_created_from_mains_snapshot_and_main_stays(two_tables):
    catalog = two_tables
    table = catalog.load_table("db.a")
    table.append(pa.table({"id": pa.array([100], pa.int64())}))  # another writer's row on main
    main_before = table.current_snapshot()
    assert main_before is not None
    committer.commit_table(catalog, "db.a", [_accepted(table, 1, "f1", [1, 2])], _round(1, "audit"))
    committer.commit_table(catalog, "db.a", [_accepted(table, 2, "f2", [3])], _round(2, "audit"))
    table = catalog.load_table("db.a")
    head = branch_head(table, "audit")
    assert head is not None
    assert table.current_snapshot() == main_before  # main untouched
    assert _ids(table, main_before.snapshot_id) == [100]
    assert _ids(table, head.snapshot_id) == [1, 2, 3, 100]  # forked from main, as the reference's toBranch
    # the first sink snapshot's parent is main's head: the branch was created there
    first = table.snapshot_by_id(head.parent_snapshot_id)  # type: ignore[arg-type]
    assert first is not None and first.parent_snapshot_id == main_before.snapshot_id


def test_a_replayed_response_is_held_on_the_branch_not_committed_twice(two_tables):
    catalog = two_tables
    table = catalog.load_table("db.a")
    done = committer.commit_table(catalog, "db.a", [_accepted(table, 1, "f1", [1, 2])], _round(1, "audit"))
    again = committer.commit_table(catalog, "db.a", [_accepted(table, 1, "f1", [1, 2])], _round(1, "audit"))
    assert again.snapshot_id is None
    assert again.held is not None and again.held.snapshot_id == done.snapshot_id  # found in the branch's history
    table = catalog.load_table("db.a")
    assert _ids(table, branch_head(table, "audit").snapshot_id) == [1, 2]  # type: ignore[union-attr]
    assert table.current_snapshot() is None


def test_the_state_walk_reads_the_branchs_history_not_mains(two_tables):
    """Tables written before the state property (or with it removed) keep their state in the
    snapshot summaries only: recovery walks the commit branch's ancestry."""
    catalog = two_tables
    table = catalog.load_table("db.a")
    committer.commit_table(catalog, "db.a", [_accepted(table, 4, "f4", [1])], _round(4, "audit"))
    table = catalog.load_table("db.a")
    with table.transaction() as tx:
        tx.remove_properties(state_property("g"))
    table = catalog.load_table("db.a")
    assert latest_sink_summary(table, "g") is None  # main holds nothing of the group
    state = latest_sink_summary(table, "g", "audit")
    assert state is not None and state.watermark == 4 and state.positions == {TP: 4}
    held = committer.held_commit(table, "g", "audit")
    assert held is not None and held.snapshot_id == branch_head(table, "audit").snapshot_id  # type: ignore[union-attr]


def test_startup_reads_each_tables_state_on_its_own_branch(two_tables, tmp_path):
    catalog = two_tables
    for name, branch in (("db.a", "audit"), ("db.b", "b2")):
        table = catalog.load_table(name)
        files = {name: (data_file(table, f"f-{name}", [1]),)}
        accepted = Accepted(offset=3, commit_id="r3", worker="w1", ranges=(), valid_through_ms=None, files=files)
        committer.commit_table(catalog, name, [accepted], _round(3, branch))
        table = catalog.load_table(name)
        with table.transaction() as tx:
            tx.remove_properties(state_property("g"))
    settings = load_settings(None, None, {**BASE, "group.id": "g", "iceberg.catalog.type": "sql",
                                          "iceberg.tables.default-commit-branch": "audit",
                                          "iceberg.table.db.b.commit-branch": "b2", "state.dir": str(tmp_path)})
    startup = Recovery.__new__(Recovery)  # only its catalog reads
    startup.settings, startup.catalog, startup.group = settings, catalog, "g"
    startup._snapshot_ms = {}
    states = startup.table_states()
    assert {t: st.watermark for t, st in states.items()} == {"db.a": 3, "db.b": 3}
    # when each table last committed is read on its own branch too (the first round's time)
    heads = {t: catalog.load_table(t).snapshot_by_name(b).timestamp_ms for t, b in (("db.a", "audit"), ("db.b", "b2"))}
    assert startup._snapshot_ms == heads


def test_a_tag_of_the_branchs_name_refuses_the_commit(two_tables):
    catalog = two_tables
    table = catalog.load_table("db.a")
    table.append(pa.table({"id": pa.array([1], pa.int64())}))
    table.manage_snapshots().create_tag(table.current_snapshot().snapshot_id, "audit").commit()  # type: ignore[union-attr]
    with pytest.raises(TableChangedError, match="found a tag"):
        committer.commit_table(catalog, "db.a", [_accepted(table, 1, "f1", [2])], _round(1, "audit"))


def test_compaction_plans_on_the_commit_branch(two_tables):
    catalog = two_tables
    table = catalog.load_table("db.a")
    for off in range(1, 4):
        committer.commit_table(catalog, "db.a", [_accepted(table, off, f"f{off}", [off])], _round(off, "audit"))
    table = catalog.load_table("db.a")
    s = MaintenanceSettings(min_input_files=3)
    assert plan_compaction(table, s) is None  # main has no files
    plan = plan_compaction(table, s, branch="audit")
    assert plan is not None and len(plan.data) == 3


def test_a_mirror_table_applies_its_changes_on_the_branch_and_a_failover_rebuilds_the_index_there(tmp_path):
    """Main holds another writer's row for key 1; the branch forks from it, so the sink's update
    of key 1 deletes that row on the branch (by position) and main keeps it. A new coordinator
    (no index) rebuilds the key index from the branch's head, not main's."""
    from coordinator.mirror import MirrorIndexes
    from tests.unit.test_mirror_commit import ARROW, TP as MTP, make_table, mirror_settings, response

    catalog = make_table(tmp_path)
    catalog.load_table("db.m").append(pa.table({"id": [1], "v": ["main"], "region": ["eu"], "op": ["r"]}, schema=ARROW))
    main_head = catalog.load_table("db.m").current_snapshot()
    settings = mirror_settings(tmp_path, **{"iceberg.tables.default-commit-branch": "audit"})

    def commit(mirrors: MirrorIndexes, batch: list[Accepted]) -> committer.TableCommit:
        return committer.commit_table(catalog, "db.m", batch, committer.RoundCommit(
            group="g", epoch=1, commit_id=batch[-1].commit_id, positions={MTP: batch[-1].offset},
            valid_through_ms=None, branches=settings.commit_branches), mirrors=mirrors)

    def on(snapshot_id: int | None) -> dict[int, str]:
        got = catalog.load_table("db.m").scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
        out = {r["id"]: r["v"] for r in got}
        assert len(out) == len(got), f"a key twice: {sorted(r['id'] for r in got)}"
        return out

    commit(MirrorIndexes(settings), [response(catalog, [(1, "b1", "u"), (2, "b2", "c")])])
    failover = MirrorIndexes(settings)
    commit(failover, [response(catalog, [(2, None, "d"), (1, "b1x", "u"), (3, "b3", "c")])])
    table = catalog.load_table("db.m")
    assert on(branch_head(table, "audit").snapshot_id) == {1: "b1x", 3: "b3"}  # type: ignore[union-attr]
    assert table.current_snapshot() == main_head and on(main_head.snapshot_id) == {1: "main"}  # type: ignore[union-attr]


def test_compaction_rewrites_the_branchs_head_and_leaves_main(tmp_path):
    import threading

    from coordinator.maintenance import compact
    from tests.unit.test_maintenance import SCHEMA, SPEC, _rewrite, _rows
    from tests.support.tables import sqlite_catalog

    catalog = sqlite_catalog(tmp_path)
    table = catalog.create_table("db.t", schema=SCHEMA, partition_spec=SPEC)
    table.append(_rows(1000, 1))
    main_head = catalog.load_table("db.t").current_snapshot()
    table.manage_snapshots().create_branch(main_head.snapshot_id, "audit").commit()  # type: ignore[union-attr]
    for i in range(5):
        table.append(_rows(i * 10, 10), branch="audit")
    on_branch = lambda t: sorted(t.scan(snapshot_id=branch_head(t, "audit").snapshot_id).to_arrow()["id"].to_pylist())  # noqa: E731
    before = on_branch(catalog.load_table("db.t"))
    s = MaintenanceSettings(min_input_files=4, target_file_size_bytes=1 << 20, branches=CommitBranches("audit"))
    out = compact(catalog, "db.t", s, threading.Lock(), _rewrite, fence=("g", 1))
    table = catalog.load_table("db.t")
    assert out is not None and out.files_in == 6 and out.snapshot_id == branch_head(table, "audit").snapshot_id  # type: ignore[union-attr]
    assert branch_head(table, "audit").summary.operation.value == "replace"  # type: ignore[union-attr]
    assert on_branch(table) == before and len(before) == 51
    assert table.current_snapshot() == main_head  # main untouched
