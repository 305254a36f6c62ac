"""The sink's exactly-once state in a table: written with each commit into the snapshot summary
and the table property ``icesink.<group>.state`` (one pyiceberg commit), read from the property
first, so another tool's snapshot expiry keeps deduplication and fencing; per sink group; the
control log's identity is checked. Real pyiceberg SQLite catalogs in a temp dir; no services."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file

from coordinator.committer import RoundCommit, commit_table
from coordinator.state import Accepted, Checkpoint
from icesink.shared.catalogs import sqlite_catalog_properties
from icesink.shared.errors import ControlLogError, FencedError, ProtocolError
from icesink.shared.protocol import OffsetRange, TopicPartition
from icesink.shared.iceberg import latest_sink_summary, local_path, to_file_info, total_rows
from icesink.shared.protocol import SinkState, state_property, summary_properties

TP = TopicPartition("src", 0)


@pytest.fixture
def catalog(tmp_path):  # type: ignore[no-untyped-def]
    cat = load_catalog("st", **sqlite_catalog_properties(tmp_path / "cat"))
    cat.create_namespace("db")
    cat.create_table("db.t", schema=pa.schema([pa.field("id", pa.int64())]))
    return cat


def _file(catalog, name: str, ids: range):  # type: ignore[no-untyped-def]
    table = catalog.load_table("db.t")
    path = f"{table.location()}/data/{name}.parquet"
    local_path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), local_path(path))
    return to_file_info(parquet_file_to_data_file(table.io, table.metadata, path), 0)


def _accepted(catalog, offset: int, ids: range) -> Accepted:  # type: ignore[no-untyped-def]
    return Accepted(offset, f"r{offset}", "w1", (OffsetRange(TP, ids.start, ids.stop),),
                    {"db.t": (_file(catalog, f"f{offset}", ids),)}, None)


def _commit(catalog, batch, *, group="g", epoch=1, log_id="log-a"):  # type: ignore[no-untyped-def]
    end = batch[-1].ranges[0].end
    cp = Checkpoint(through=batch[-1].offset + 1, positions={TP: end}, owners={TP: ("w1", 3)},
                    replay_from=batch[-1].offset + 2)
    return commit_table(catalog, "db.t", batch, RoundCommit(group=group, epoch=epoch, commit_id=batch[-1].commit_id,
                        positions={TP: end}, valid_through_ms=None, checkpoint=cp, log_id=log_id))


def _rows(catalog) -> int:  # type: ignore[no-untyped-def]
    return total_rows(catalog, "db.t")


def _foreign_append(catalog) -> None:  # type: ignore[no-untyped-def]
    catalog.load_table("db.t").append(pa.table({"id": pa.array([-1], pa.int64())}))


def test_state_is_written_to_the_property_with_the_snapshot(catalog) -> None:
    _commit(catalog, [_accepted(catalog, 5, range(0, 10))])
    table = catalog.load_table("db.t")
    state = SinkState.from_json(table.metadata.properties[state_property("g")], "test")
    assert (state.watermark, state.epoch, state.positions, state.log_id) == (5, 1, {TP: 10}, "log-a")
    assert (state.through, state.replay_from, state.owners) == (6, 7, {TP: ("w1", 3)})
    assert state.round_tables == {"db.t": 5}
    # One commit: the snapshot and the property land together (one metadata version more).
    assert table.current_snapshot().summary["icesink.control-log-id"] == "log-a"
    assert len(table.metadata.metadata_log) == 1


def test_snapshot_expiry_by_another_tool_keeps_deduplication(catalog) -> None:
    """commit, foreign append, expire the sink's snapshot, replay the same response: exact."""
    batch = [_accepted(catalog, 5, range(0, 10))]
    _commit(catalog, batch)
    sink_snapshot = catalog.load_table("db.t").current_snapshot().snapshot_id
    _foreign_append(catalog)
    catalog.load_table("db.t").maintenance.expire_snapshots().by_id(sink_snapshot).commit()
    table = catalog.load_table("db.t")
    assert table.snapshot_by_id(sink_snapshot) is None
    state = latest_sink_summary(table, "g")
    assert state is not None and state.watermark == 5 and state.source == "property"
    again = _commit(catalog, batch)  # a failed-over coordinator rolls the same response forward
    assert again.snapshot_id is None
    assert _rows(catalog) == 11


def test_snapshot_expiry_keeps_fencing(catalog) -> None:
    _commit(catalog, [_accepted(catalog, 5, range(0, 10))], epoch=4)
    sink_snapshot = catalog.load_table("db.t").current_snapshot().snapshot_id
    _foreign_append(catalog)
    catalog.load_table("db.t").maintenance.expire_snapshots().by_id(sink_snapshot).commit()
    with pytest.raises(FencedError, match="expected coordinator epoch <= 3, found 4"):
        _commit(catalog, [_accepted(catalog, 9, range(10, 20))], epoch=3)


def test_summary_walk_is_the_fallback_for_older_tables(catalog) -> None:
    """A table written before the property existed: its state comes from the snapshot summary."""
    table = catalog.load_table("db.t")
    props = summary_properties("g", "old", 7, {TP: 4}, 2, None)
    table.append(pa.table({"id": pa.array([1], pa.int64())}), snapshot_properties=props)
    _foreign_append(catalog)
    state = latest_sink_summary(catalog.load_table("db.t"), "g")
    assert state is not None and (state.watermark, state.epoch, state.source, state.log_id) == (7, 2, "summary", None)


def test_two_groups_keep_their_own_state(catalog) -> None:
    _commit(catalog, [_accepted(catalog, 5, range(0, 10))], group="g1")
    _commit(catalog, [_accepted(catalog, 3, range(100, 110))], group="g2", log_id="log-b")
    table = catalog.load_table("db.t")
    one, two = latest_sink_summary(table, "g1"), latest_sink_summary(table, "g2")
    assert one is not None and two is not None
    assert (one.watermark, one.log_id, two.watermark, two.log_id) == (5, "log-a", 3, "log-b")
    # g2's lower watermark does not make g1's response look new again.
    assert _commit(catalog, [_accepted(catalog, 5, range(0, 10))], group="g1").snapshot_id is None
    assert _rows(catalog) == 20


def test_state_of_another_control_log_stops_the_commit(catalog) -> None:
    _commit(catalog, [_accepted(catalog, 5, range(0, 10))], log_id="log-a")
    with pytest.raises(ControlLogError, match="expected sink state of control log log-b, found state of log log-a"):
        _commit(catalog, [_accepted(catalog, 2, range(10, 20))], log_id="log-b")
    assert _rows(catalog) == 10


def test_a_damaged_property_is_an_error_that_says_what_to_do(catalog) -> None:
    with catalog.load_table("db.t").transaction() as tx:
        tx.set_properties({state_property("g"): "{not json"})
    with pytest.raises(ProtocolError, match="Remove it to fall back"):
        latest_sink_summary(catalog.load_table("db.t"), "g")


def test_an_adopted_log_commits_over_state_of_the_old_one(catalog) -> None:
    """After iceberg.control.adopt-log-id: the old log's watermark counts for nothing on the new
    log (its offsets restart), the epoch still fences, the state then names the new log."""
    _commit(catalog, [_accepted(catalog, 50, range(0, 10))], log_id="log-a", epoch=2)
    done = commit_table(catalog, "db.t", [_accepted(catalog, 3, range(10, 20))], RoundCommit(group="g", epoch=3,
                        commit_id="n1", positions={TP: 20}, valid_through_ms=None, log_id="log-b", adopted=True))
    assert done.snapshot_id is not None and _rows(catalog) == 20
    state = latest_sink_summary(catalog.load_table("db.t"), "g")
    assert state is not None and (state.log_id, state.watermark) == ("log-b", 3)
    with pytest.raises(FencedError):
        commit_table(catalog, "db.t", [_accepted(catalog, 4, range(20, 30))], RoundCommit(group="g", epoch=1,
                     commit_id="n2", positions={TP: 30}, valid_through_ms=None, log_id="log-b", adopted=True))


def test_the_state_of_a_round_is_parsed_once_for_all_its_tables(monkeypatch) -> None:
    """The tables of a round hold the same state text, and each table commit reads its table's
    state: one JSON parse for all of them, and every reader gets dicts of its own."""
    import json

    from icesink.shared.protocol import summary

    text = SinkState(snapshot_id=None, commit_id="c1", watermark=7, positions={TP: 10}, epoch=1,
                     valid_through_ms=None, owners={TP: ("w", 2)},
                     round_tables={f"db.t{i}": 7 for i in range(200)}).to_json()
    parses: list[str] = []
    real_loads = json.loads
    monkeypatch.setattr(summary.json, "loads", lambda s: (parses.append(s), real_loads(s))[1])
    first = SinkState.from_json(text, "table db.t1")
    first.positions[TP] = 99  # a reader's own copy
    first.round_tables.clear()
    for i in range(2, 200):
        again = SinkState.from_json(text, f"table db.t{i}")
        assert again.positions == {TP: 10} and len(again.round_tables) == 200 and again.owners == {TP: ("w", 2)}
    assert len(parses) <= 1
    with pytest.raises(ProtocolError, match="table db.t9 property"):  # errors still name where
        SinkState.from_json("{not json", "table db.t9 property")
