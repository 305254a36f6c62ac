"""When a coordinator that has just recovered starts its first round (coordinator/session.py
``first_round_at``): a takeover keeps the group's cadence from its newest committed snapshot
instead of waiting a whole interval after its recovery (issue 42 target 5: kill -9 of the
coordinator's replica to the next committed snapshot); a group's first round counts its interval
from the process's launch (issue 42 target 1: launch to the first committed snapshot)."""

import asyncio

from coordinator.session import first_round_at

INTERVAL_S = 5.0
NOW = 1000.0  # the monotonic clock at the end of recovery
LAUNCHED = NOW - 3.0  # the replica's process began 3 s before (imports, the group's join)


def test_a_takeover_after_the_newest_snapshot_is_an_interval_old_starts_its_round_at_once():
    # the old coordinator was killed, its session expired (10 s), the new one recovered: 15 s since its last commit
    assert first_round_at(NOW, INTERVAL_S, since_commit_s=15.0, launched_at=LAUNCHED) == NOW


def test_a_takeover_soon_after_a_commit_keeps_the_cadence_of_the_group():
    assert first_round_at(NOW, INTERVAL_S, since_commit_s=2.0, launched_at=LAUNCHED) == NOW + 3.0


def test_a_first_start_with_no_committed_snapshot_counts_the_interval_from_the_launch():
    # the group's first start: the interval a user set counts from the start they see, not from
    # the end of the replica's start-up (3 s here): the first round 2 s after recovery, not 5
    assert first_round_at(NOW, INTERVAL_S, since_commit_s=None, launched_at=LAUNCHED) == NOW + 2.0
    # a start-up longer than the interval: at once
    assert first_round_at(NOW, INTERVAL_S, since_commit_s=None, launched_at=NOW - 60.0) == NOW


def test_a_snapshot_stamped_ahead_of_this_hosts_clock_waits_at_most_one_interval():
    assert first_round_at(NOW, INTERVAL_S, since_commit_s=-30.0, launched_at=LAUNCHED) == NOW + INTERVAL_S


def test_recovery_reads_when_each_table_last_committed_on_its_commit_branch(tmp_path):
    """Recovery's table read (a real SQLite catalog) gives the age of the newest snapshot of the
    tables it recovered: what the first round's time is worked out from."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    from coordinator.session import Session
    from coordinator.startup import Recovery
    from icesink.shared.config import build
    from icesink.shared.metrics import Metrics
    from icesink.shared.offload import Offload
    from icesink.shared.protocol import SinkState, TopicPartition, state_property, summary_properties

    catalog = SqlCatalog("u", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", pa.schema([("k", pa.int64())]))
    tp = TopicPartition("t", 0)
    tx = table.transaction()
    tx.append(pa.table({"k": pa.array(range(10), pa.int64())}),
              snapshot_properties=summary_properties("g", "c1", 10, {tp: 10}, 1, None))
    tx.set_properties({state_property("g"): SinkState(None, "c1", 10, {tp: 10}, 1, None).to_json()})
    tx.commit_transaction()
    committed_ms = catalog.load_table("db.t").current_snapshot().timestamp_ms
    settings = build({"topics": "t", "iceberg.tables": "db.t,db.none", "group.id": "g",
                      "bootstrap.servers": "127.0.0.1:1"})
    recovery = Recovery(settings, "127.0.0.1:1", Session(), None, catalog, Offload(1), Metrics())  # type: ignore[arg-type]
    states = recovery.table_states()
    assert list(states) == ["db.t"]
    assert recovery.since_commit_s(states, committed_ms + 7000) == 7.0
    assert recovery.since_commit_s([], committed_ms + 7000) is None


class ReplayLog:
    """A control log of ``events`` at offsets 0.. for recovery's replay: a read with nothing to
    return waits its whole timeout, as the broker's fetch does."""

    def __init__(self, events: list) -> None:
        self.events, self.at, self.waited_s = events, 0, 0.0

    async def seek(self, offset: int) -> None:
        self.at = offset

    async def position(self) -> int:
        return self.at

    async def end_offset(self) -> int:
        return len(self.events)

    async def read(self, timeout_s: float) -> list:
        batch = [(o, e) for o, e in enumerate(self.events) if o >= self.at][:2]
        if not batch:
            self.waited_s += timeout_s
        self.at += len(batch)
        return batch


async def replay_from(recovery, log: ReplayLog, loop, start: int) -> int:
    await log.seek(start)
    return int(await recovery.replay(loop, -1, {}))


def test_replay_reads_to_the_log_end_and_waits_for_no_event_past_it():
    """A first start (an empty log) or a checkpoint at the log's end: nothing to replay, and no
    read that waits 0.5 s for an event before the first claim is answered."""
    from coordinator.session import Session
    from coordinator.startup import Recovery
    from icesink.shared.config import build
    from icesink.shared.metrics import Metrics
    from icesink.shared.offload import Offload
    from icesink.shared.protocol import StartCommit

    class Loop:
        def __init__(self) -> None:
            self.applied: list[int] = []

        async def apply(self, offset: int, event, checkpoint_through: int = -1) -> bool:
            self.applied.append(offset)
            return True

    settings = build({"topics": "t", "iceberg.tables": "db.t", "group.id": "g", "bootstrap.servers": "127.0.0.1:1"})
    for events, start in (([], 0), ([StartCommit(1, f"r{i}") for i in range(5)], 0),
                          ([StartCommit(1, f"r{i}") for i in range(5)], 5)):
        log, loop = ReplayLog(events), Loop()
        recovery = Recovery(settings, "127.0.0.1:1", Session(), log, None, Offload(1), Metrics())  # type: ignore[arg-type]

        assert asyncio.run(replay_from(recovery, log, loop, start)) == len(events) - start
        assert loop.applied == list(range(start, len(events)))
        assert log.waited_s == 0, f"{len(events)} events from {start}: a read waited {log.waited_s} s"
