"""One table's failure is that table's (coordinator/parking.py), and every table commit is
announced (coordinator/round_commit.py), against a real SQLite catalog with the control topic faked:

- a table whose commit keeps failing is parked after ``iceberg.control.commit.park-after-ms``:
  the round commits the other table and ends with a CommitComplete that keeps the checkpoint of
  the last round every table holds; the parked table's part stays pending (its files only),
  shown in /status and metrics; once it can commit, every held round goes in, exactly once;
- a table that already holds a round without its CommitToTable on the log (an attempt whose
  announcement failed, a coordinator stopped in between) is announced by the next attempt;
- a stop (``drain``) lets the table commits in flight finish and abandons a retry.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from coordinator import round_commit
from coordinator.round_commit import RoundCommits
from coordinator.service import Coordinator
from coordinator.state import Accepted, CoordinatorState
from icesink.shared.config import load_settings
from icesink.shared.errors import TableChangedError
from icesink.shared.protocol import (
    Claim, CommitComplete, CommitToTable, DataComplete, DataWritten, FileInfo, OffsetRange, Position, Resume,
    StartCommit, TopicPartition,
)
from tests.unit.test_coordinator_commit import (
    FakeReader, FlakyProducer, coordinator_of, data_file, round_commits, rows,
)

TP = TopicPartition("src", 0)


def coordinator(tmp_path: Any, catalog: Any, producer: Any, **extra: str) -> RoundCommits:
    """A round's commit (coordinator/round_commit.py) whose state has w1 own TP from 0."""
    return round_commits(settings(tmp_path, **extra), producer, catalog, owned())


def full_coordinator(tmp_path: Any, catalog: Any, producer: Any, **extra: str) -> Coordinator:
    """The same, within a coordinator (its control loop, its stop)."""
    return coordinator_of(settings(tmp_path, **extra), producer, catalog, owned())


def settings(tmp_path: Any, **extra: str) -> Any:
    return load_settings(None, None, {"topics": "src", "iceberg.tables": "db.a,db.b",
                                      "iceberg.catalog.type": "sql", "state.dir": str(tmp_path / "state"), **extra})


def owned() -> CoordinatorState:
    st = CoordinatorState()
    for off, ev in enumerate([Claim("w1", 1, (TP,)), Resume(1, "w1", 1, (Position(TP, 0),))]):
        st.apply(off, ev)
    return st


def respond(coord: RoundCommits | Coordinator, catalog: Any, round_id: str, start: int, ids: list[int]) -> None:
    """A round answered by w1 with ``ids`` for both tables: [start, start + len(ids))."""
    st = coord.session.state
    files = {t: data_file(catalog.load_table(t), f"{t}-{round_id}", ids) for t in ("db.a", "db.b")}
    off = st.last_offset + 1
    for ev in [StartCommit(1, round_id),
               DataWritten(round_id, round_id, "w1", "db.a", (files["db.a"],)),
               DataWritten(round_id, round_id, "w1", "db.b", (files["db.b"],)),
               DataComplete(round_id, round_id, "w1", 1, (OffsetRange(TP, start, start + len(ids)),), 2, None)]:
        st.apply(off, ev)
        off += 1


def failing_for(monkeypatch: Any, bad: set[str]) -> list[str]:
    """commit_table raises TableChangedError (retriable) for the tables in ``bad`` (a set the
    test may change); the calls, by table."""
    real = round_commit.commit_table
    calls: list[str] = []

    def commit(catalog: Any, table: str, *a: Any, **k: Any) -> Any:
        calls.append(table)
        if table in bad:
            raise TableChangedError(f"table {table}: expected it in catalog t, found none: dropped")
        return real(catalog, table, *a, **k)

    monkeypatch.setattr(round_commit, "commit_table", commit)
    return calls


def done_events(producer: FlakyProducer) -> list[CommitComplete]:
    return [e for e in producer.sent if isinstance(e, CommitComplete)]


def test_a_table_that_keeps_failing_is_parked_and_the_other_commits_every_round(tmp_path, two_tables, monkeypatch):
    monkeypatch.setattr(round_commit, "RETRY_BASE_S", 0.01)
    monkeypatch.setattr("coordinator.parking.RETRY_BASE_S", 0.0)
    bad = {"db.b"}
    calls = failing_for(monkeypatch, bad)
    producer = FlakyProducer(CommitToTable, fail=0)
    coord = coordinator(tmp_path, two_tables, producer, **{"iceberg.control.commit.park-after-ms": "50"})

    bad.clear()
    respond(coord, two_tables, "r0", 0, [0])  # a round every table holds
    asyncio.run(coord.commit("r0", partial=False))
    [r0] = done_events(producer)
    assert (r0.through, r0.positions, r0.replay_from) == (5, (Position(TP, 1),), 6)
    bad.add("db.b")
    respond(coord, two_tables, "r1", 1, [1, 2, 3])
    asyncio.run(coord.commit("r1", partial=False))
    assert rows(two_tables, "db.a") == 4 and rows(two_tables, "db.b") == 1
    assert calls.count("db.b") >= 3  # retried before it was parked
    first = done_events(producer)[-1]
    # The checkpoint of the last round every table holds, not past any of db.b's data.
    assert (first.commit_id, first.through, first.positions, first.replay_from) == ("r1", 5, (Position(TP, 1),), 6)
    [held] = coord.session.state.pending
    assert set(held.files) == {"db.b"}  # only what the parked table lacks is kept
    parked = coord.session.status["parked"]["db.b"]
    assert parked["held_responses"] == 1 and parked["held_files"] == 1 and "TableChangedError" in parked["error"]
    assert coord.metrics.table_parked.labels(table="db.b")._value.get() == 1
    assert coord.metrics.table_parked.labels(table="db.a")._value.get() == 0

    # Another round: db.a commits again; db.b gets one attempt and stays parked.
    before = calls.count("db.b")
    respond(coord, two_tables, "r2", 4, [4, 5])
    asyncio.run(coord.commit("r2", partial=False))
    assert rows(two_tables, "db.a") == 6 and rows(two_tables, "db.b") == 1
    assert calls.count("db.b") == before + 1
    second = done_events(producer)[-1]
    assert (second.through, second.positions, second.replay_from) == (5, (Position(TP, 1),), 6)
    assert [set(a.files) for a in coord.session.state.pending] == [{"db.b"}, {"db.b"}]
    assert coord.session.status["parked"]["db.b"]["held_responses"] == 2

    # The table is back: both held rounds go into one snapshot, and the checkpoint moves on.
    bad.clear()
    respond(coord, two_tables, "r3", 6, [6])
    asyncio.run(coord.commit("r3", partial=False))
    assert rows(two_tables, "db.a") == 7 and rows(two_tables, "db.b") == 7
    assert sorted(two_tables.load_table("db.b").scan().to_arrow()["id"].to_pylist()) == [0, 1, 2, 3, 4, 5, 6]
    last = done_events(producer)[-1]
    assert last.positions == (Position(TP, 7),) and last.through == coord.session.state.last_offset
    assert not coord.session.state.pending and coord.session.status["parked"] == {}
    assert coord.metrics.table_parked.labels(table="db.b")._value.get() == 0
    assert len(two_tables.load_table("db.b").snapshots()) == 2  # r0's, then one for every held round
    announced = [(e.table, e.commit_id) for e in producer.sent if isinstance(e, CommitToTable)]
    assert announced == [("db.a", "r0"), ("db.b", "r0"), ("db.a", "r1"), ("db.a", "r2"), ("db.a", "r3"),
                         ("db.b", "r3")]


def test_a_parked_table_waits_for_its_backoff_and_an_error_no_retry_mends_is_not_parked(
        tmp_path, two_tables, monkeypatch):
    from icesink.shared.errors import ProtocolError

    monkeypatch.setattr(round_commit, "RETRY_BASE_S", 0.01)
    bad = {"db.b"}
    calls = failing_for(monkeypatch, bad)
    producer = FlakyProducer(CommitToTable, fail=0)
    coord = coordinator(tmp_path, two_tables, producer, **{"iceberg.control.commit.park-after-ms": "0"})
    respond(coord, two_tables, "r1", 0, [1])
    asyncio.run(coord.commit("r1", partial=False))
    assert calls.count("db.b") == 1  # parked at its first failure (park-after 0)
    respond(coord, two_tables, "r2", 1, [2])
    asyncio.run(coord.commit("r2", partial=False))
    assert calls.count("db.b") == 1, "tried again before its backoff (2 s) was over"
    assert rows(two_tables, "db.a") == 2 and coord.session.status["parked"]["db.b"]["next_try_s"] > 0

    def unreadable(catalog: Any, table: str, *a: Any, **k: Any) -> Any:
        raise ProtocolError(f"table {table} property icesink.g.state: expected icesink sink state JSON, found 'x'")

    monkeypatch.setattr(round_commit, "commit_table", unreadable)
    coord = coordinator(tmp_path / "2", two_tables, producer, **{"iceberg.control.commit.park-after-ms": "0"})
    respond(coord, two_tables, "r1", 0, [1])
    with pytest.raises(ProtocolError):
        asyncio.run(coord.commit("r1", partial=False))
    assert coord.session.status["phase"] == "round-failed" and not coord.session.status.get("parked")


def test_a_table_holding_a_round_without_its_announcement_is_announced_by_the_retry(tmp_path, two_tables, monkeypatch):
    """db.a commits, its CommitToTable send fails; the retry finds db.a holding the round (the
    watermark skips it) and must announce it: it used to announce nothing."""
    monkeypatch.setattr(round_commit, "RETRY_BASE_S", 0.01)
    producer = FlakyProducer(CommitToTable, fail=1)
    coord = coordinator(tmp_path, two_tables, producer)
    respond(coord, two_tables, "r1", 0, [1, 2, 3])
    asyncio.run(coord.commit("r1", partial=False))
    assert rows(two_tables, "db.a") == 3 and rows(two_tables, "db.b") == 3
    announced = sorted((e.table, e.commit_id) for e in producer.sent if isinstance(e, CommitToTable))
    assert announced == [("db.a", "r1"), ("db.b", "r1")]
    [late] = [e for e in producer.sent if isinstance(e, CommitToTable) and e.table == "db.a"]
    assert late.snapshot_id == two_tables.load_table("db.a").current_snapshot().snapshot_id
    assert late.records == 3 and late.files == 1
    assert coord.metrics.commits_announced_late._value.get() == 1


def test_a_stop_waits_for_the_commit_in_flight_and_abandons_a_retry(tmp_path, two_tables, monkeypatch):
    import threading

    real = round_commit.commit_table
    release = threading.Event()

    def slow(catalog: Any, table: str, *a: Any, **k: Any) -> Any:
        release.wait(5)
        return real(catalog, table, *a, **k)

    monkeypatch.setattr(round_commit, "commit_table", slow)
    producer = FlakyProducer(CommitToTable, fail=0)
    coord = full_coordinator(tmp_path, two_tables, producer)
    respond(coord, two_tables, "r1", 0, [1, 2])

    async def stop_mid_commit() -> None:
        coord._commit_task = asyncio.create_task(coord._rounds.commit("r1", partial=False))
        await asyncio.sleep(0.2)
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, release.set)
        await coord.drain(10)
        assert coord._commit_task.done()

    asyncio.run(stop_mid_commit())
    assert [type(e).__name__ for e in producer.sent] == ["CommitToTable", "CommitToTable", "CommitComplete"]

    # A table commit failing during the stop is not retried: the round stays pending.
    failing_for(monkeypatch, {"db.a"})
    producer = FlakyProducer(CommitToTable, fail=0)
    coord = full_coordinator(tmp_path / "2", two_tables, producer)
    respond(coord, two_tables, "r1", 0, [1, 2])

    async def stop_mid_retry() -> None:
        coord._commit_task = asyncio.create_task(coord._rounds.commit("r1", partial=False))
        await asyncio.sleep(0.3)  # the first attempt failed; it waits to retry
        await coord.drain(10)
        assert coord._commit_task.done()
        with pytest.raises(round_commit.Abandoned):
            coord._commit_task.result()
        coord._reap_commit_task()  # a stop: not a failure of the coordinator

    asyncio.run(stop_mid_retry())
    assert not producer.sent and len(coord.session.state.pending) == 1


def test_recovery_keeps_only_what_the_tables_lack():
    st = CoordinatorState()
    f = FileInfo("file:///wh/x.parquet", 1, 1, 0)
    st.pending = [Accepted(5, "r", "w", (), {"db.a": (f,), "db.b": (f,)}, None),
                  Accepted(9, "r", "w", (), {"db.a": (f,), "db.b": (f,)}, None),
                  Accepted(11, "r", "w", (), {}, None)]
    st.lacking({"db.a": 20, "db.b": 6})
    assert [(a.offset, set(a.files)) for a in st.pending] == [(9, {"db.b"}), (11, set())]
    st.committed(list(st.pending), held={"db.b"})
    assert [(a.offset, set(a.files)) for a in st.pending] == [(9, {"db.b"})]
    st.apply(12, CommitToTable(1, "r", "db.b", 7, 1, 1, 9))
    assert st.announced_through("db.b") == 9 and st.announced_through("db.a") == -1
    # A mirror table's deletes-only response held for it keeps its table (its commit finds it
    # there) and its keys files (deleted by the round that commits them), whatever the watermark.
    deletes = Accepted(13, "r", "w", (), {"db.m": (), "db.a": (f,)}, None, {"db.m": (f,)})
    st.pending = [deletes]
    st.lacking({"db.m": 20, "db.a": 20})
    assert [(a.files, a.deleted_keys) for a in st.pending] == [({"db.m": ()}, {"db.m": (f,)})]
    st.pending = [deletes]
    st.committed([deletes], held={"db.m"})
    assert [(a.files, a.deleted_keys) for a in st.pending] == [({"db.m": ()}, {"db.m": (f,)})]


def test_files_of_a_dropped_table_are_kept_when_read_and_judged_against_its_location_when_it_commits(
        tmp_path, two_tables, monkeypatch):
    """A new coordinator replaying a parked (dropped) table's responses cannot check their files
    against a location: they are kept, not refused (refusing them used to reject the accepted
    response in replay). Its commit checks them: a table recreated elsewhere stays parked, its
    files neither committed nor deleted; recreated where they are, it takes them."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    monkeypatch.setattr("coordinator.parking.RETRY_BASE_S", 0.0)
    producer = FlakyProducer(CommitToTable, fail=0)
    coord = full_coordinator(tmp_path, two_tables, producer, **{"iceberg.control.commit.park-after-ms": "0"})
    location = two_tables.load_table("db.b").location()
    f = data_file(two_tables.load_table("db.b"), "db.b-r1", [1, 2])
    two_tables.drop_table("db.b")
    events = [StartCommit(1, "r1"), DataWritten("r1", "x", "w1", "db.b", (f,)),
              DataComplete("r1", "x", "w1", 1, (OffsetRange(TP, 0, 2),), 1, None)]

    async def read() -> None:
        for off, ev in enumerate(events, start=2):
            assert await coord._admit(off, ev)
            coord.session.state.apply(off, ev)

    asyncio.run(read())
    assert not coord.session.state.take_rejected() and len(coord.session.state.pending) == 1
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    two_tables.create_table("db.b", schema=schema, location=f"{tmp_path}/elsewhere")
    asyncio.run(coord._rounds.commit("r1", partial=False))
    assert "outside it" in coord.session.status["parked"]["db.b"]["error"] and rows(two_tables, "db.b") == 0
    assert os.path.exists(f.path.removeprefix("file://"))
    two_tables.drop_table("db.b")
    two_tables.create_table("db.b", schema=schema, location=location)
    asyncio.run(coord._rounds.commit("r2", partial=False))
    assert rows(two_tables, "db.b") == 2 and not coord.session.status["parked"] and not coord.session.state.pending


def respond_a(coord: RoundCommits | Coordinator, catalog: Any, round_id: str, start: int, ids: list[int]) -> None:
    """A round answered by w1 with ``ids`` for db.a alone."""
    st = coord.session.state
    f = data_file(catalog.load_table("db.a"), f"db.a-{round_id}", ids)
    off = st.last_offset + 1
    for ev in [StartCommit(1, round_id), DataWritten(round_id, round_id, "w1", "db.a", (f,)),
               DataComplete(round_id, round_id, "w1", 1, (OffsetRange(TP, start, start + len(ids)),), 1, None)]:
        st.apply(off, ev)
        off += 1


def test_truncation_never_passes_the_replay_start_of_a_parked_table(tmp_path, two_tables, monkeypatch):
    """The held checkpoint's replay start is newer than the parked table's own state (its last
    commit was rounds before). Truncating the log to the checkpoint's replay start leaves a
    recovery from the tables (the checkpoint unusable: expired group offsets) refused for good:
    the table lacks a round and its replay start is gone. The truncation stops at it."""
    from coordinator.recovery import from_tables
    from icesink.shared.control import ControlLogTruncator
    from icesink.shared.errors import ControlLogError
    from icesink.shared.iceberg import latest_sink_summary

    floors: list[Any] = []

    async def truncate(self: Any, floor: Any = None) -> dict[str, Any]:
        floors.append(floor)
        return {}

    monkeypatch.setattr(ControlLogTruncator, "truncate", truncate)
    monkeypatch.setattr("coordinator.parking.RETRY_BASE_S", 0.0)
    bad: set[str] = set()
    failing_for(monkeypatch, bad)
    producer = FlakyProducer(CommitToTable, fail=0)
    coord = full_coordinator(tmp_path, two_tables, producer, **{"iceberg.control.commit.park-after-ms": "0"})
    respond(coord, two_tables, "r0", 0, [0])  # both tables; db.b's state: replay from 6
    asyncio.run(coord._rounds.commit("r0", partial=False))
    respond_a(coord, two_tables, "ra", 1, [1])  # db.a alone: the checkpoint replays from 9
    asyncio.run(coord._rounds.commit("ra", partial=False))
    bad.add("db.b")
    respond(coord, two_tables, "r1", 2, [2])
    asyncio.run(coord._rounds.commit("r1", partial=False))
    held = done_events(producer)[-1]
    assert "db.b" in coord._parked and held.replay_from == 9
    states = {t: latest_sink_summary(two_tables.load_table(t), coord.group) for t in ("db.a", "db.b")}
    assert states["db.b"].replay_from == 6
    with pytest.raises(ControlLogError):  # the hole: the log truncated at the checkpoint's replay start
        from_tables(states, held.replay_from, "control")

    assert coord._maintainer.truncate is not None
    asyncio.run(coord._maintainer.truncate())
    assert floors == [(6, "db.b")], "the truncation was not held at the parked table's replay start"
    from_tables(states, 6, "control")  # recovery from the tables works with the log truncated there


def test_the_truncator_plan_stops_at_the_floor_and_replay_floor_names_what_needs_the_log(monkeypatch):
    from coordinator.log_floor import replay_floor
    from icesink.shared import control
    from icesink.shared.protocol import SinkState

    class Consumer:
        def __init__(self, **k: Any) -> None: ...
        async def start(self) -> None: ...
        async def stop(self) -> None: ...
        def assign(self, tps: Any) -> None: ...
        async def beginning_offsets(self, tps: Any) -> Any:
            return {tp: 0 for tp in tps}

    async def needs(self: Any, consumer: Any, tp: Any, group: str) -> int:
        return 9  # the checkpoint's replay start

    async def scan(self: Any, consumer: Any, tp: Any, start: int, end: int) -> None:
        self._scanned = end

    monkeypatch.setattr(control, "AIOKafkaConsumer", Consumer)
    monkeypatch.setattr(control.ControlLogTruncator, "_needs", needs)
    monkeypatch.setattr(control.ControlLogTruncator, "_scan", scan)
    t = control.ControlLogTruncator("127.0.0.1:9", "control", "g", {})
    assert asyncio.run(t.plan())["before"] == 9
    assert asyncio.run(t.plan((6, "db.b"))) == {"log_start": 0, "held_by": "g (table db.b)", "before": 6}
    assert asyncio.run(t.plan((12, "db.b")))["before"] == 9

    def state(wm: int, replay_from: int, rounds: dict[str, int]) -> SinkState:
        return SinkState(1, "r", wm, {}, 1, None, through=wm + 1, replay_from=replay_from, round_tables=rounds)

    healthy = {"db.a": state(10, 12, {"db.a": 10, "db.b": 11}), "db.b": state(11, 12, {"db.a": 10, "db.b": 11})}
    assert replay_floor(healthy, set()) is None  # the checkpoint alone limits it
    assert replay_floor({}, set()) is None
    lacking = {**healthy, "db.b": state(4, 6, {"db.a": 3, "db.b": 4})}
    assert replay_floor(lacking, set()) == (6, "db.b")  # a round in doubt: db.b lacks it
    assert replay_floor(lacking, {"db.b"}) == (6, "db.b")
    assert replay_floor({"db.a": healthy["db.a"]}, {"db.b"}) == (0, "db.b")  # dropped: no state


def test_the_loop_counts_every_record_read_as_applied_other_groups_too(tmp_path, two_tables):
    """On a control topic shared by several groups the reader returns none of the other groups'
    records, but the position moves past them: the loop's applied offset must follow, or
    _caught_up (a late announcement) waits for an offset it never applies (30 s)."""
    coord = full_coordinator(tmp_path, two_tables, FlakyProducer(CommitToTable, fail=0))

    class Reader(FakeReader):
        def __init__(self) -> None:
            super().__init__()
            self.at, self.reads = 0, 0

        async def position(self) -> int:
            return self.at

        async def end_offset(self) -> int:
            return 10

        async def read(self, timeout_s: float) -> list[Any]:
            self.reads += 1
            self.at = 10  # ten records of another group, none returned
            await asyncio.sleep(0.01)
            return []

    reader = coord._reader = coord._rounds._reader = Reader()  # type: ignore[assignment]
    coord._next_round_at = float("inf")

    async def go() -> None:
        loop = asyncio.create_task(coord._loop())
        while reader.reads < 3:
            await asyncio.sleep(0.01)
        try:
            assert coord.session.applied_next == 10, "records of other groups read but not counted as applied"
            await asyncio.wait_for(coord._rounds._caught_up(), 5)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)

    asyncio.run(go())


def test_a_stopped_coordinator_clears_its_parked_gauges(tmp_path, two_tables, monkeypatch):
    """Leadership moved (or the coordinator stopped): the new leader reports the table parked if
    it still is; the old one must not keep icesink_table_parked at 1 (the alert fired for ever)."""
    monkeypatch.setattr("coordinator.parking.RETRY_BASE_S", 0.0)
    failing_for(monkeypatch, {"db.b"})
    coord = full_coordinator(tmp_path, two_tables, FlakyProducer(CommitToTable, fail=0),
                        **{"iceberg.control.commit.park-after-ms": "0"})
    respond(coord, two_tables, "r1", 0, [1])
    asyncio.run(coord._rounds.commit("r1", partial=False))
    gauge = coord.metrics.table_parked.labels(table="db.b")
    assert gauge._value.get() == 1

    class Reader(FakeReader):
        async def start(self) -> None: ...
        async def stop(self) -> None: ...

    coord._reader = Reader()  # type: ignore[assignment]

    async def recover() -> None:
        raise asyncio.CancelledError  # the coordinator is cancelled (leadership moved)

    monkeypatch.setattr(coord, "_recover", recover)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(coord.run())
    assert gauge._value.get() == 0, "a stopped coordinator left its parked table's gauge at 1"
    assert coord.metrics.commit_retrying.labels(table="db.b")._value.get() == 0


def test_a_parked_table_is_tried_after_the_healthy_ones(tmp_path, two_tables, monkeypatch):
    """A round commits its first table alone, then the others: a parked table first held every
    healthy table's commit up behind its failing attempt."""
    monkeypatch.setattr("coordinator.parking.RETRY_BASE_S", 0.0)
    calls = failing_for(monkeypatch, {"db.a"})
    coord = coordinator(tmp_path, two_tables, FlakyProducer(CommitToTable, fail=0),
                        **{"iceberg.control.commit.park-after-ms": "0"})
    respond(coord, two_tables, "r1", 0, [1])
    asyncio.run(coord.commit("r1", partial=False))
    assert "db.a" in coord._parked
    calls.clear()
    respond(coord, two_tables, "r2", 1, [2])
    asyncio.run(coord.commit("r2", partial=False))
    assert calls == ["db.b", "db.a"], "the parked table was tried before the healthy one"
