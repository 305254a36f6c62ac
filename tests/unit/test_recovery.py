"""Where a recovering coordinator starts (coordinator/recovery.py): the control log's identity,
the checkpoint or the tables' sink state as the base, rounds in doubt, a truncated log."""

from __future__ import annotations

import pytest

from coordinator.recovery import adopt_states, as_checkpoint, check_log_identity, from_tables, table_positions
from coordinator.state import CoordinatorState
from icesink.shared.control import check_control_configs
from icesink.shared.errors import ControlLogError
from icesink.shared.protocol import TopicPartition
from icesink.shared.protocol import SinkState

A, B = TopicPartition("src", 0), TopicPartition("src", 1)


def state(watermark: int, through: int, replay_from: int, positions: dict[TopicPartition, int], *,
          commit_id: str = "r", log_id: str | None = "L1", round_tables: dict[str, int] | None = None,
          epoch: int = 2) -> SinkState:
    return SinkState(None, commit_id, watermark, positions, epoch, None, log_id=log_id, through=through,
                     replay_from=replay_from, owners={A: ("w1", 4), B: ("w2", 5)},
                     round_tables=round_tables or {}, source="property")


def test_a_recreated_topic_is_refused_by_its_id() -> None:
    with pytest.raises(ControlLogError, match="expected the log the sink state of table db.a came from "
                       r"\(topic id L1, watermark 40\), found topic id L2: the topic was deleted and created again"):
        check_log_identity({"db.a": state(40, 42, 43, {A: 9})}, "L2", 1000, "ctl")


def test_a_log_shorter_than_the_tables_state_is_refused_without_ids() -> None:
    """Brokers without topic ids, and tables written before log ids: the offsets tell."""
    with pytest.raises(ControlLogError, match="expected a log reaching past offset 40 .* found its end at offset 7"):
        check_log_identity({"db.a": state(40, 42, 43, {A: 9}, log_id=None)}, None, 7, "ctl")
    check_log_identity({"db.a": state(40, 42, 43, {A: 9})}, "L1", 41, "ctl")  # the same log: fine


def test_no_table_state_is_a_first_start() -> None:
    base = from_tables({}, 0, "ctl")
    assert base.checkpoint is None and base.start == 0


def test_the_newest_table_state_is_the_base() -> None:
    states = {
        "db.a": state(40, 42, 41, {A: 9, B: 3}, commit_id="r2", round_tables={"db.a": 40}),
        "db.b": state(20, 22, 21, {A: 5, B: 3}, commit_id="r1", round_tables={"db.b": 20}),
    }
    base = from_tables(states, 0, "ctl")
    assert base.checkpoint is not None and base.checkpoint.commit_id == "r2" and base.start == 41
    recovered = CoordinatorState.from_checkpoint(base.checkpoint)
    assert recovered.accepted == {A: 9, B: 3} and recovered.owners == {A: ("w1", 4), B: ("w2", 5)}
    assert table_positions(states) == {A: 9, B: 3}


def test_a_round_in_doubt_replays_from_the_table_that_lacks_it() -> None:
    """The coordinator died between the two table commits of r2: db.b lacks it."""
    states = {
        "db.a": state(40, 42, 38, {A: 9, B: 7}, commit_id="r2", round_tables={"db.a": 40, "db.b": 39}),
        "db.b": state(20, 22, 21, {A: 5, B: 3}, commit_id="r1", round_tables={"db.b": 20}),
    }
    base = from_tables(states, 0, "ctl")
    assert base.checkpoint is not None and base.checkpoint.commit_id == "r1" and base.start == 21
    assert "in doubt" in base.reason


def test_a_round_in_doubt_for_a_table_without_state_replays_the_whole_log() -> None:
    """The first round of db.b was in doubt: no state to start from but the log's beginning."""
    states = {"db.a": state(40, 42, 38, {A: 9}, commit_id="r1", round_tables={"db.a": 40, "db.b": 39})}
    base = from_tables(states, 0, "ctl")
    assert base.checkpoint is None and base.start == 0
    with pytest.raises(ControlLogError, match=r"db.b lack round r1 .* have no sink state; .* starts at 5"):
        from_tables(states, 5, "ctl")


def test_a_round_in_doubt_with_its_events_deleted_is_refused() -> None:
    states = {
        "db.a": state(40, 42, 38, {A: 9}, commit_id="r2", round_tables={"db.a": 40, "db.b": 39}),
        "db.b": state(20, 22, 21, {A: 5}, commit_id="r1", round_tables={"db.b": 20}),
    }
    with pytest.raises(ControlLogError, match=r"db.b lack round r2 .* needs the log from offset 21, but it starts at 30"):
        from_tables(states, 30, "ctl")


def test_events_lost_after_a_complete_round_are_harmless() -> None:
    """Retention deleted the log up to 60 while the sink was stopped: nothing after the newest
    state names data of any table, so replay starts at the log's start, state from the table."""
    states = {"db.a": state(40, 42, 43, {A: 9}, commit_id="r2", round_tables={"db.a": 40})}
    base = from_tables(states, 60, "ctl")
    assert base.checkpoint is not None and base.checkpoint.through == 42 and base.start == 60
    assert as_checkpoint(states["db.a"]).positions[0].offset == 9


def test_a_compacted_control_topic_is_refused() -> None:
    with pytest.raises(ControlLogError, match="expected cleanup.policy=delete, found 'compact'"):
        check_control_configs("ctl", {"cleanup.policy": "compact"})
    check_control_configs("ctl", {"cleanup.policy": "delete", "retention.ms": "-1"})


def test_control_topic_replication_factor_setting() -> None:
    from icesink.shared.config import build
    from icesink.shared.errors import ConfigError

    base = {"topics": "t", "iceberg.tables": "db.t"}
    assert build(base).control_replication_factor == 3
    assert build(base | {"iceberg.control.topic.replication-factor": 1}).control_replication_factor == 1
    with pytest.raises(ConfigError, match="iceberg.control.topic.replication-factor"):
        build(base | {"iceberg.control.topic.replication-factor": 0})


def test_an_adopted_log_starts_the_group_over_from_the_tables_positions() -> None:
    """iceberg.control.adopt-log-id names the recreated topic: no refusal; every table's state of
    the old log becomes a state of the new one as of its start, at the tables' positions."""
    states = {
        "db.a": state(40, 42, 41, {A: 9, B: 3}, commit_id="r2", round_tables={"db.a": 40}),
        "db.b": state(20, 22, 21, {A: 5, B: 3}, commit_id="r1", round_tables={"db.b": 20}),
    }
    with pytest.raises(ControlLogError, match="set iceberg.control.adopt-log-id"):
        check_log_identity(states, "L2", 3, "ctl", adopt="other")
    assert check_log_identity(states, "L2", 3, "ctl", adopt="L2") is True
    adopted = adopt_states(states, "L2", 0)
    base = from_tables(adopted, 0, "ctl")
    assert base.checkpoint is not None and base.start == 0 and base.checkpoint.through == -1
    assert CoordinatorState.from_checkpoint(base.checkpoint).accepted == {A: 9, B: 3}
    assert all(st.log_id == "L2" and st.watermark == -1 for st in adopted.values())


def test_a_round_in_doubt_cannot_be_adopted() -> None:
    states = {
        "db.a": state(40, 42, 38, {A: 9}, commit_id="r2", round_tables={"db.a": 40, "db.b": 39}),
        "db.b": state(20, 22, 21, {A: 5}, commit_id="r1", round_tables={"db.b": 20}),
    }
    with pytest.raises(ControlLogError, match="cannot adopt control log L2: table.s. db.b lack round r2"):
        adopt_states(states, "L2", 0)


def test_a_partition_the_tables_hold_starts_at_their_position_not_the_hint() -> None:
    """Recovery.initial_positions asks no consumer group for a partition the tables' state holds."""
    import asyncio

    from coordinator.session import Session
    from coordinator.startup import Recovery
    from icesink.shared.config import build
    from icesink.shared.protocol import Position
    from icesink.shared.metrics import Metrics

    async def go() -> list[Position]:
        settings = build({"topics": "src", "iceberg.tables": "db.t", "bootstrap.servers": "127.0.0.1:1"})
        recovery = Recovery(settings, "127.0.0.1:1", Session(), None, None, None, Metrics())  # type: ignore[arg-type]
        recovery.table_positions = {A: 9, B: 4}
        return await recovery.initial_positions([A, B])

    assert asyncio.run(go()) == [Position(A, 9), Position(B, 4)]
