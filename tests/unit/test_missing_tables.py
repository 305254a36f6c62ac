"""A table a worker's records go to that does not exist, without auto-create (agents/missing.py):
refused on the group's first start; once the group has run, the partition with records for it
is held back (paused, nothing of its fetch taken, its range never passing them) while the
others go on, the table is looked up again with capped backoff, and once it is back the
partition reads on from where it stopped. The real-process test is
tests/integration/test_missing_tables.py."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pyarrow as pa
import pytest
from faust.types import TP

from agents import table_lookup as table_lookup_module
from agents.missing import RETRY_FIRST_S, RETRY_MAX_S, MissingTables
from agents.kafka.source_consumer import Fetched
from agents.table_lookup import GroupHistory
from agents.tables import Target
from icesink.shared.config import Settings, build
from icesink.shared.errors import ConfigError
from icesink.shared.protocol import TopicPartition
from icesink.shared.signing import Keyring
from tests.unit.test_backpressure import History, InlineOffload, make_parts

A, B = "db.a", "db.b"
P0, P1 = TopicPartition("t", 0), TopicPartition("t", 1)
SCHEMA = pa.schema([("id", pa.int64()), ("dest", pa.string())])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_look_ups_back_off_doubling_to_a_cap_and_a_table_back_frees_only_what_waits_for_nothing_else():
    clock = Clock()
    m = MissingTables(clock=clock, wall=lambda: 5.0)
    assert m.add(A) and not m.add(A)
    m.add(B)
    m.hold(P0, [A])
    m.hold(P1, [A, B])
    assert m.is_held(P0) and m.is_held(P1) and not m.is_held(TopicPartition("t", 2))
    assert m.due() == []
    clock.now += RETRY_FIRST_S
    assert m.due() == [A, B]
    waits = []
    for _ in range(8):
        m.still_missing(A)
        waits.append(m.tables[A].next_at - clock.now)
    assert waits == [min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** k) for k in range(1, 9)] and waits[-1] == RETRY_MAX_S
    m.still_missing(B, "OSError: catalog away")
    status = m.status()
    assert status[A] == {"since": 5.0, "attempts": 8, "held_partitions": ["t[0]", "t[1]"],
                         "next_attempt_in_s": RETRY_MAX_S, "error": None}
    assert status[B]["error"] == "OSError: catalog away" and status[B]["held_partitions"] == ["t[1]"]
    assert m.found(A) == [P0]  # P1 still waits for B
    assert m.found(B) == [P1] and m.tables == {}
    m.add(A)
    m.hold(P0, [A])
    m.release(P0)  # moved away, or read again from its Resume
    assert not m.is_held(P0) and m.found(A) == []


def worker(group_has_run: bool, monkeypatch, tables: dict[str, Target | None], settings: Settings | None = None,
           history: object = None, targets: dict[str, Target] | None = None, missing: MissingTables | None = None):
    """Two tables routed on ``dest``, partition 0 and 1 active from offset 0; ``tables``: what
    the catalog holds (load_target); ``history``: the group's past (a fake by default, saying
    whether the group has run)."""
    settings = settings or build({"topics": "t", "iceberg.tables": f"{A},{B}", "iceberg.tables.route-field": "dest",
                                  f"iceberg.table.{A}.route-regex": "a", f"iceberg.table.{B}.route-regex": "b"})
    history = history or History(has_run=group_has_run)
    w = make_parts(max_bytes=1 << 30, settings=settings, targets={A: Target(A, None, SCHEMA)} if targets is None
                   else targets, history=history, missing=missing or MissingTables(clock=Clock()))
    w.history = history
    w.buffers.claim(P1, 1)
    w.buffers.resume(P1, 0, now=0.0)
    w.replica.generation = 1
    monkeypatch.setattr(table_lookup_module, "load_target", lambda catalog, name, settings=None: tables.get(name))
    # the refusal names a missing namespace too (agents/tables.py not_created): this catalog has every one
    monkeypatch.setattr(table_lookup_module, "namespace_exists", lambda catalog, namespace: True)
    return w


def fetch(tp: TopicPartition, start: int, dests: str) -> Fetched:
    return Fetched({tp: [SimpleNamespace(
        topic=tp.topic, partition=tp.partition, offset=start + i, timestamp=None, key=None, headers=(),
        value=json.dumps({"id": start + i, "dest": d}).encode()) for i, d in enumerate(dests)]}, time.monotonic())


def calls(w) -> list:
    return [c for c in w.app.consumer.calls if c[0] in ("pause", "seek", "resume")]


def test_on_a_first_start_a_missing_table_is_refused_naming_the_setting(monkeypatch):
    w = worker(group_has_run=False, monkeypatch=monkeypatch, tables={})
    with pytest.raises(ConfigError, match="iceberg.tables.auto-create-enabled.*create table db.b"):
        asyncio.run(w.ingest.on_fetch(fetch(P1, 0, "ab")))
    assert w.buffers.partitions[P1].next_offset == 0


def test_once_the_group_has_run_the_partition_waits_for_the_table_and_reads_on_when_it_is_back(monkeypatch):
    tables: dict[str, Target | None] = {}
    w = worker(group_has_run=True, monkeypatch=monkeypatch, tables=tables)
    clock = w.missing.clock

    async def run():
        await w.ingest.on_fetch(fetch(P0, 0, "aaa"))  # a's records only: taken
        await w.ingest.on_fetch(fetch(P1, 0, "aab"))  # a record for b: nothing of the fetch is taken
        st0, st1 = w.buffers.partitions[P0], w.buffers.partitions[P1]
        assert st0.next_offset == 3 and st1.next_offset == 0 and st1.chunks == []
        assert calls(w) == [("pause", [TP("t", 1)])]
        assert w.missing.is_held(P1) and w.metrics.table_missing.labels(table=B)._value.get() == 1
        assert w.metrics.paused_partitions._value.get() == 1
        await w.ingest.on_fetch(fetch(P1, 3, "aaa"))  # in flight after the pause: skipped, read again later
        await w.ingest.on_fetch(fetch(P0, 3, "ab"))  # another partition with a record for b: held too, no look-up
        assert st1.next_offset == 0 and st0.next_offset == 3 and w.history.lookups == 1
        snap = w.buffers.take(1)  # a round reports neither past its first record for b
        assert sorted((str(r.tp), r.start, r.end) for r in snap.ranges) == [("t[0]", 0, 3), ("t[1]", 0, 0)]
        assert w.missing.status()[B]["held_partitions"] == ["t[0]", "t[1]"]

        await w.ingest.housekeep(clock.now)  # not due yet
        clock.now += RETRY_FIRST_S
        await w.ingest.housekeep(clock.now)  # still gone
        assert w.missing.tables[B].attempts == 1 and [c for c in calls(w) if c[0] != "pause"] == []
        tables[B] = Target(B, None, SCHEMA)  # recreated
        clock.now += RETRY_MAX_S
        await w.ingest.housekeep(clock.now)
        await asyncio.sleep(0.01)
        assert B in w.targets and not w.missing.tables
        assert w.metrics.table_missing.labels(table=B)._value.get() == 0
        after = [c for c in calls(w) if c[0] != "pause"]  # each sought back to where it stopped, then resumed
        for tp, offset in ((TP("t", 0), 3), (TP("t", 1), 0)):
            assert after.index(("seek", {tp: offset})) < after.index(("resume", [tp]))
        assert len(after) == 4
        await w.ingest.on_fetch(fetch(P1, 0, "aab"))
        await w.ingest.on_fetch(fetch(P0, 3, "ab"))
        snap = w.buffers.take(1)
        assert sorted((str(r.tp), r.start, r.end) for r in snap.ranges) == [("t[0]", 3, 5), ("t[1]", 0, 3)]
        rows = snap.tables()
        assert rows[B].num_rows == 2 and rows[A].num_rows == 3

    asyncio.run(run())
    assert w.failures == []


def test_a_table_missing_at_start_is_shown_at_once_and_a_held_partition_stays_paused_through_faust_resume(monkeypatch):
    w = worker(group_has_run=True, monkeypatch=monkeypatch, tables={})
    w.tables.wait_for(B)  # what TableLookup.load_configured does for a configured table it cannot load, once the group has run
    assert B in w.missing.status() and w.metrics.table_missing.labels(table=B)._value.get() == 1
    w.ownership.hold_paused_partitions()

    async def run():
        await w.ingest.on_fetch(fetch(P1, 0, "b"))
        assert w.history.lookups == 0 and w.missing.is_held(P1)
        w.app.consumer.resume_partitions([TP("t", 0), TP("t", 1)])  # Faust's resume after a rebalance
        assert w.app.consumer.calls[-1] == ("resume", [TP("t", 0)])
        await w.ownership.on_assigned(None, {TP("t", 0)})  # P1 moved away: nothing held for it any more
        assert not w.missing.is_held(P1) and w.missing.status()[B]["held_partitions"] == []

    w.replica.rebalanced = asyncio.Event()
    w.app.consumer_generation_id = 2
    monkeypatch.setattr("agents.ownership.group_member_id", lambda app: "m")
    asyncio.run(run())


DYNAMIC = {"topics": "t", "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "dest"}


def dynamic_worker(monkeypatch, tables: dict[str, Target | None], committed: set[str] | None, history: object = None):
    """Dynamic routing on ``dest`` (no configured table), without auto-create, once the group
    has run; ``committed``: the tables the group's control log shows it committed to."""
    return worker(group_has_run=True, monkeypatch=monkeypatch, tables=tables, targets={},
                  settings=build(DYNAMIC), history=history or History(True, committed))


def test_a_dynamic_route_to_a_table_the_group_never_committed_to_is_not_held_but_refused(monkeypatch):
    """Only a table the group committed to (it existed, and was dropped) is waited for: a new
    route without auto-create goes the first start's way (refused naming the setting), rather
    than holding its partition for ever."""
    w = dynamic_worker(monkeypatch, {}, committed={"db.gone"})
    with pytest.raises(ConfigError, match="iceberg.tables.auto-create-enabled.*create table db.new"):
        asyncio.run(w.ingest.on_fetch(fetch(P1, 0, ["db.new"])))
    assert not w.missing.is_held(P1) and "db.new" not in w.missing.tables


def test_a_dynamic_route_to_a_table_the_group_committed_to_and_was_dropped_is_held(monkeypatch):
    w = dynamic_worker(monkeypatch, {}, committed={"db.gone"})
    asyncio.run(w.ingest.on_fetch(fetch(P1, 0, ["db.gone"])))
    assert w.missing.is_held(P1) and "db.gone" in w.missing.tables and w.failures == []
    asyncio.run(w.ingest.on_fetch(fetch(P0, 0, ["db.gone"])))
    assert w.missing.is_held(P0) and w.history.scans == 1  # the control log is read once


def test_the_tables_committed_to_are_read_from_the_control_log_once_and_followed_after(monkeypatch):
    from icesink.shared.protocol import CommitToTable, StartCommit

    log = [(0, StartCommit(1, "c1")), (1, CommitToTable(1, "c1", "db.gone", 5, 1, 1, 0)), (2, StartCommit(1, "c2"))]

    class Reader:
        opened = 0

        def __init__(self, *args, **kwargs) -> None:
            Reader.opened += 1
            self.at = 0

        async def start(self) -> None: ...
        async def stop(self) -> None: ...
        async def seek_to_beginning(self) -> int: return 0
        async def end_offset(self) -> int: return len(log)
        async def position(self) -> int: return self.at

        async def read(self, timeout_s: float):
            out, self.at = log[self.at:self.at + 2], min(len(log), self.at + 2)
            return out

    monkeypatch.setattr(table_lookup_module, "ControlReader", Reader)
    missing = MissingTables()
    history = GroupHistory(build(DYNAMIC), "b:9092", Keyring(), missing, {}, InlineOffload())
    assert asyncio.run(history.committed_tables()) == {"db.gone"}
    missing.committed_to("db.later")  # the control loop's CommitToTable
    assert asyncio.run(history.committed_tables()) == {"db.gone", "db.later"} and Reader.opened == 1


def test_on_a_truncated_control_log_a_missing_dynamic_table_is_held_not_refused(monkeypatch):
    """The log the group's CommitToTable events are looked for in may be truncated (the
    coordinator truncates it every 10 minutes by default on Kafka): no CommitToTable there is no
    proof the group never committed to a table. Refusing it (exit code 2) stopped replica after
    replica; it is held, and shown, as a dropped table is."""
    from icesink.shared.protocol import StartCommit

    class Reader:
        def __init__(self, *args, **kwargs) -> None:
            self.at = 3

        async def start(self) -> None: ...
        async def stop(self) -> None: ...
        async def seek_to_beginning(self) -> int: return 3  # offsets 0-2 deleted
        async def end_offset(self) -> int: return 4
        async def position(self) -> int: return self.at

        async def read(self, timeout_s: float):
            self.at = 4
            return [(3, StartCommit(1, "c9"))]

    monkeypatch.setattr(table_lookup_module, "ControlReader", Reader)
    missing = MissingTables(clock=Clock())
    missing.group_has_run = True  # as read once before (GroupHistory.has_run)
    history = GroupHistory(build(DYNAMIC), "b:9092", Keyring(), missing, {}, InlineOffload())
    w = worker(group_has_run=True, monkeypatch=monkeypatch, tables={}, targets={},
               settings=build(DYNAMIC), history=history, missing=missing)
    asyncio.run(w.ingest.on_fetch(fetch(P1, 0, ["db.new"])))
    assert w.missing.is_held(P1) and "db.new" in w.missing.tables


@pytest.mark.parametrize("log_events, state, committed", [
    ("empty rounds", False, False), ("a commit to a table", False, True), ("empty rounds", True, True),
])
def test_a_group_whose_rounds_all_came_before_its_first_record_has_committed_nothing(monkeypatch, log_events, state,
                                                                                    committed):
    """A new group's first round comes one interval after its replica's launch: on a fast
    interval it can complete before the first record, which commits the coordinator's offset
    and no table. Such a group has run (where its signing began) but committed nothing, so a
    configured table missing now is a first start's typo, refused, not waited for (issue 42:
    test_start_failures hung on it). A CommitToTable in its control log, or a table holding its
    sink state, is a commit."""
    from icesink.shared.protocol import CommitComplete, CommitToTable, StartCommit

    log = [(0, StartCommit(1, "c1")), (1, CommitComplete(1, "c1", 0, ()))]
    if log_events == "a commit to a table":
        log.insert(1, (1, CommitToTable(1, "c1", "db.t", 5, 1, 1, 0)))

    class Reader:
        def __init__(self, *args, **kwargs) -> None:
            self.at = 0

        async def start(self) -> None: ...
        async def stop(self) -> None: ...
        async def committed(self) -> int: return len(log)  # the coordinator's offset: the rounds completed
        async def seek_to_beginning(self) -> int: return 0
        async def end_offset(self) -> int: return len(log)
        async def position(self) -> int: return self.at

        async def read(self, timeout_s: float):
            out, self.at = log[self.at:], len(log)
            return out

    monkeypatch.setattr(table_lookup_module, "ControlReader", Reader)
    monkeypatch.setattr(table_lookup_module, "holds_group_state", lambda *_: state)
    history = GroupHistory(build(DYNAMIC), "b:9092", Keyring(), MissingTables(), {}, InlineOffload())
    assert asyncio.run(history.has_run())
    assert asyncio.run(history.has_committed()) is committed
