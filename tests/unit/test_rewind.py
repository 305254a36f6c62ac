"""``icesink offsets`` / ``rewind``: positions per snapshot read from a real (SQLite, local files)
table's summaries, the rewind's plan and refusals, and the rollback commit."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icesink.app.rewind import (
    RewindRefused, SnapshotPositions, format_offsets, format_targets, new_positions, parse_targets, pending_rewind,
    plan_rewind, roll_back, snapshot_positions,
)
from icesink.shared.iceberg import latest_sink_summary
from icesink.shared.protocol import SinkState, TopicPartition, state_property, summary_properties

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def _row(sid: int, writer: str, p0: int, p1: int | None = None) -> SnapshotPositions:
    pos = {TP0: p0} | ({TP1: p1} if p1 is not None else {})
    return SnapshotPositions(sid, 0, "append", writer, "c" if writer == "sink" else None, pos)


def test_targets_parse_topics_with_colons_and_refuse_bad_items():
    assert parse_targets("a:b:1:7, t:0:60") == {TopicPartition("a:b", 1): 7, TP0: 60}
    assert parse_targets(format_targets(parse_targets("t:0:60,a:b:1:7"))) == {TopicPartition("a:b", 1): 7, TP0: 60}
    for bad in ("t:0", "t:x:1", ":0:1", "t:0:-1", "t:0:1,t:0:2"):
        with pytest.raises(RewindRefused):
            parse_targets(bad)


def test_plan_picks_the_newest_snapshot_at_or_below_every_offset():
    rows = [_row(4, "sink", 100, 100), _row(3, "maintenance", 70, 80), _row(2, "sink", 70, 80),
            _row(1, "sink", 50, 50)]
    plan = plan_rewind("db.t", rows, {TP0: 70})
    assert plan.target.snapshot_id == 3 and [r.snapshot_id for r in plan.lost] == [4]
    plan = plan_rewind("db.t", rows, {TP0: 69})
    assert plan.target.snapshot_id == 1 and plan.rollback
    assert not plan_rewind("db.t", rows, {TP0: 100, TP1: 100}).rollback  # the head already holds nothing past
    # every partition the table's state knows goes to the target's position; one the target lacks: its beginning
    assert new_positions(plan, {TP0: 100, TP1: 100, TopicPartition("u", 0): 5}) == {
        TP0: 50, TP1: 50, TopicPartition("u", 0): None}


def test_plan_refuses_to_lose_another_writers_snapshot_and_names_it():
    rows = [_row(5, "sink", 100), _row(4, "other writer", 90), _row(3, "sink group g2", 90), _row(2, "sink", 90),
            _row(1, "sink", 40)]
    with pytest.raises(RewindRefused, match=r"snapshot\(s\) 4 \(other writer, append\), 3 \(sink group g2"):
        plan_rewind("db.t", rows, {TP0: 50})
    assert plan_rewind("db.t", rows, {TP0: 100}).target.snapshot_id == 5
    with pytest.raises(RewindRefused, match="no snapshot holds positions at or below t\\[0\\]@10|no snapshot"):
        plan_rewind("db.t", rows, {TP0: 10})


def _table(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("u", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    return catalog.create_table("db.t", pa.schema([("k", pa.int64())]))


def _commit(table, group: str | None, p0: int, first: int) -> None:
    tx = table.transaction()
    props = summary_properties(group, f"c{p0}", p0, {TP0: p0}, 1, None) if group else {}
    tx.append(pa.table({"k": pa.array(range(first, p0), pa.int64())}), snapshot_properties=props)
    if group:
        tx.set_properties({state_property(group): SinkState(None, f"c{p0}", p0, {TP0: p0}, 1, None).to_json()})
    tx.commit_transaction()


def test_positions_per_snapshot_and_a_rollback_commit(tmp_path):
    table = _table(tmp_path)
    _commit(table, "g", 10, 0)
    _commit(table, None, 12, 10)  # another writer: holds g's positions of the snapshot below
    _commit(table, "g", 30, 12)
    rows = snapshot_positions(table, "g", "main")
    assert [(r.writer, r.positions) for r in rows] == [("sink", {TP0: 30}), ("other writer", {TP0: 10}),
                                                       ("sink", {TP0: 10})]
    assert "other writer" in format_offsets(rows) and format_offsets(rows).count("\n") == 3
    plan = plan_rewind("db.t", rows, {TP0: 20})
    assert plan.target is rows[1]  # the other writer's snapshot is kept, not lost

    roll_back(table, "main", "g", rows[2].snapshot_id, {TP0: 10}, "t:0:20")  # refused above; forced here
    table.refresh()
    assert pending_rewind(table, "g") == "t:0:20" and pending_rewind(table, "h") is None
    assert table.current_snapshot().snapshot_id == rows[2].snapshot_id
    assert table.scan().to_arrow().num_rows == 10
    state = latest_sink_summary(table, "g")
    assert state is not None and state.positions == {TP0: 10} and state.watermark == 30  # watermark kept


def test_rows_past_an_offset_deleted_by_their_offset_columns_once(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    from icesink.app.rewind import delete_past, offset_columns

    catalog = SqlCatalog("u", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    m = "_kafka_metadata"
    table = catalog.create_table("db.m", pa.schema([("k", pa.int64()), (f"{m}_topic", pa.string()),
                                                    (f"{m}_partition", pa.int32()), (f"{m}_offset", pa.int64())]))
    assert offset_columns(table) is None  # no snapshot yet
    rows = pa.table({"k": pa.array(range(40), pa.int64()), f"{m}_topic": ["t"] * 40,
                     f"{m}_partition": pa.array([i % 2 for i in range(40)], pa.int32()),
                     f"{m}_offset": pa.array([i // 2 for i in range(40)], pa.int64())})
    tx = table.transaction()
    tx.append(rows, snapshot_properties=summary_properties("g", "c1", 7, {TP0: 20, TP1: 20}, 1, None))
    tx.set_properties({state_property("g"): SinkState(None, "c1", 7, {TP0: 20, TP1: 20}, 1, None).to_json()})
    tx.commit_transaction()
    cols = offset_columns(table)
    assert cols == (f"{m}_topic", f"{m}_partition", f"{m}_offset")
    for _ in range(2):  # a run again (after a crash past the commit) deletes nothing more
        delete_past(table, "main", "g", cols, {TP0: 15}, {TP0: 15, TP1: 20})
        table.refresh()
        left = table.scan().to_arrow()
        assert sorted(left["k"].to_pylist()) == sorted([k for k in range(40) if k % 2 or k // 2 < 15])
    state = latest_sink_summary(table, "g")
    assert state is not None and state.positions == {TP0: 15, TP1: 20} and state.watermark == 7
    assert snapshot_positions(table, "g", "main")[0].positions == {TP0: 15, TP1: 20}  # the group's snapshot

    nulls = catalog.create_table("db.n", table.schema())
    nulls.append(pa.table({"k": [1], f"{m}_topic": ["t"], f"{m}_partition": pa.array([0], pa.int32()),
                           f"{m}_offset": pa.array([None], pa.int64())}, schema=table.schema().as_arrow()))
    assert offset_columns(nulls) is None  # a row without its offset: roll back instead


def test_an_unfinished_rewind_stops_the_group_from_starting_naming_table_property_and_command(tmp_path):
    """A rewind killed after its table commit leaves the control log saying "read on from the old
    positions": the worker's start and the coordinator's recovery refuse, in one line naming the
    table, the property and the command to run again (also for a table only a round names)."""
    from icesink.shared.config import load_settings
    from icesink.shared.errors import ControlLogError, RewindPending
    from icesink.shared.iceberg import pending_rewinds, refuse_pending_rewind

    table = _table(tmp_path)
    _commit(table, "g", 10, 0)
    _commit(table, "g", 30, 10)
    settings = load_settings(None, None, {"topics": "t", "iceberg.tables": "db.t", "group.id": "g",
                                          "state.dir": str(tmp_path)})
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("u", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    assert pending_rewinds(catalog, settings) == {}
    refuse_pending_rewind(catalog, settings)  # nothing pending: starts
    rows = snapshot_positions(table, "g", "main")
    roll_back(table, "main", "g", rows[1].snapshot_id, {TP0: 10}, "t:0:20")
    assert pending_rewinds(catalog, settings) == {"db.t": "t:0:20"}
    with pytest.raises(RewindPending) as refused:
        refuse_pending_rewind(catalog, settings)
    line = str(refused.value)
    assert isinstance(refused.value, ControlLogError) and "\n" not in line
    assert "db.t" in line and "icesink.g.rewind-pending=t:0:20" in line
    assert "run `icesink rewind db.t --to t:0:20` again" in line
    other = load_settings(None, None, {"topics": "t", "iceberg.tables": "db.t", "group.id": "h",
                                       "state.dir": str(tmp_path)})
    refuse_pending_rewind(catalog, other)  # another group's rewind is not this group's
    # a routed table (not configured) is found through the round tables of a configured one
    routed = load_settings(None, None, {"topics": "t", "iceberg.tables": "db.x", "group.id": "g",
                                        "state.dir": str(tmp_path)})
    x = catalog.create_table("db.x", pa.schema([("k", pa.int64())]))
    state = SinkState(None, "c", 5, {TP0: 5}, 1, None, round_tables={"db.t": 30, "db.x": 5})
    x.transaction().set_properties({state_property("g"): state.to_json()}).commit_transaction()
    assert pending_rewinds(catalog, routed) == {"db.t": "t:0:20"}

    # the rewind's last step removes the marker: the group starts again
    from icesink.app.rewind import _clear_pending

    _clear_pending(catalog, "db.t", "g")
    refuse_pending_rewind(catalog, settings)


def test_a_coordinator_recovering_over_an_unfinished_rewind_refuses_before_it_reads_the_log(tmp_path):
    """coordinator/startup.py: the marker stops recovery (a ControlLogError: the service then
    refuses, answering no claim and committing nothing) before the log or the broker is read."""
    import asyncio

    from pyiceberg.catalog.sql import SqlCatalog

    from coordinator.session import Session
    from coordinator.startup import Recovery
    from icesink.shared.config import build
    from icesink.shared.errors import RewindPending
    from icesink.shared.metrics import Metrics
    from icesink.shared.offload import Offload

    table = _table(tmp_path)
    _commit(table, "g", 10, 0)
    _commit(table, "g", 30, 10)
    roll_back(table, "main", "g", snapshot_positions(table, "g", "main")[1].snapshot_id, {TP0: 10}, "t:0:20")
    catalog = SqlCatalog("u", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    settings = build({"topics": "t", "iceberg.tables": "db.t", "group.id": "g", "bootstrap.servers": "127.0.0.1:1"})

    async def go() -> None:
        recovery = Recovery(settings, "127.0.0.1:1", Session(), None, catalog, Offload(1), Metrics())  # type: ignore[arg-type]
        await recovery.recover(None)  # type: ignore[arg-type]

    with pytest.raises(RewindPending, match=r"run `icesink rewind db.t --to t:0:20` again"):
        asyncio.run(go())


def test_a_rewind_voids_responses_accepted_but_not_committed_before_it(tmp_path):
    """The sink stopped uncleanly after accepting a response (control offset 40) but before the
    table commit (watermark 30): that response's records start at the old positions, so
    committing it after the rewind would hold them twice. The rewind's table commit raises the
    table's control watermark to the log's last offset (45): recovery's replay then counts every
    response accepted before the rewind as held by the table (CoordinatorState.lacking) and
    commits none of them; the alter-positions after it sets where reading goes on."""
    from coordinator.state import Accepted, CoordinatorState
    from icesink.shared.protocol import FileInfo, OffsetRange

    table = _table(tmp_path)
    _commit(table, "g", 10, 0)
    _commit(table, "g", 30, 10)  # watermark 30
    rows = snapshot_positions(table, "g", "main")
    roll_back(table, "main", "g", rows[1].snapshot_id, {TP0: 10}, "t:0:20", watermark=45)
    table.refresh()
    state = latest_sink_summary(table, "g")
    assert state is not None and state.watermark == 45 and state.positions == {TP0: 10}
    roll_back(table, "main", "g", rows[1].snapshot_id, {TP0: 10}, "t:0:20", watermark=20)
    again = latest_sink_summary(table.refresh(), "g")
    assert again is not None and again.watermark == 45  # never lowered

    f = FileInfo("file:///wh/x.parquet", 10, 100, 0)
    st = CoordinatorState(pending=[Accepted(40, "r", "w", (OffsetRange(TP0, 30, 50),), {"db.t": (f,)}, None)])
    st.lacking({"db.t": state.watermark})
    assert st.pending == []


def test_a_rewind_that_needs_no_rollback_still_voids_what_the_log_accepted(tmp_path):
    from icesink.app.rewind import _void_accepted

    table = _table(tmp_path)
    _commit(table, "g", 10, 0)
    head = table.current_snapshot().snapshot_id
    _void_accepted(table, "g", "main", {TP0: 10}, "t:0:20", 45)
    table.refresh()
    state = latest_sink_summary(table, "g")
    assert state is not None and state.watermark == 45 and state.positions == {TP0: 10}
    assert pending_rewind(table, "g") == "t:0:20" and table.current_snapshot().snapshot_id == head
