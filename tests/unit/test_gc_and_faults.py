"""Pure parts of orphan gc and fault injection."""

import pytest

from coordinator.gc import normalize, parse_duration
from icesink.shared.config import load_settings
from icesink.shared.errors import ConfigError
from icesink.shared.faults import should_crash


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("6h", 21600), ("3d", 259200), ("0s", 0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_duration_names_the_flag():
    with pytest.raises(ConfigError, match="--older-than"):
        parse_duration("soon")


def test_one_spelling_per_file():
    assert normalize("file:///w/t/data/a.parquet") == normalize("/w/t/data/a.parquet") == "/w/t/data/a.parquet"
    assert normalize("s3://bucket/t/a.parquet") == normalize("bucket/t/a.parquet")


def test_a_fault_point_fires_once_per_state_dir(tmp_path):
    s = load_settings(None, {}, {"topics": "a", "iceberg.tables": "n.t", "state.dir": str(tmp_path),
                                 "fault.crash-at": "worker.mid-response"})
    assert not should_crash(s, "worker.during-write")
    assert should_crash(s, "worker.mid-response")
    assert not should_crash(s, "worker.mid-response")


def _state(positions: dict, epoch: int = 1):
    from icesink.shared.protocol import SinkState

    return SinkState(None, "c", 10, positions, epoch, None)


def test_a_worker_file_is_dead_only_once_its_groups_position_in_the_table_passed_its_start():
    from icesink.shared.protocol import OffsetRange, TopicPartition
    from icesink.shared.protocol.fences import fence_of, judge, worker_files_prefix

    p0, p1 = TopicPartition("pizzas.v1", 0), TopicPartition("pizzas.v1", 1)
    ranges = (OffsetRange(p0, 500, 500), OffsetRange(p1, 120, 180))  # fenced by the first with data: p1 at 120
    prefix = worker_files_prefix("sink-a", ranges, "early-1a2b3c4d-w1-7")
    fence = fence_of(f"{prefix}-0/shop=s1/part-0001.parquet")
    assert fence is not None and (fence.partition, fence.start) == (1, 120)
    assert fence_of(f"x/{prefix}-keys-0a1b.parquet") == fence  # a keys file, under a hashed directory
    assert fence_of("early-1a2b3c4d-w1-7-0/part-0.parquet") is None  # written before fences

    assert not judge(fence, {}).dead  # its group has no state in the table: keep
    assert not judge(fence, {"sink-b": _state({p1: 10_000})}).dead  # another group's position says nothing
    assert not judge(fence, {"sink-a": _state({p0: 900})}).dead  # no position of its partition yet
    assert not judge(fence, {"sink-a": _state({p1: 120})}).dead  # a round may still commit it
    verdict = judge(fence, {"sink-a": _state({p1: 121})})
    assert verdict.dead and "121" in verdict.reason
    assert judge(fence, {}, retired=["sink-a"]).dead
    assert worker_files_prefix("sink-a", (OffsetRange(p0, 5, 5),), "r-w1-1") == "r-w1-1"  # no data: no file


def test_a_coordinator_file_is_dead_once_a_later_epoch_of_its_group_committed():
    from icesink.shared.protocol.fences import coordinator_prefix, fence_of, judge

    fence = fence_of(coordinator_prefix("sink-a", 4, "compacted-17000-1") + "/part-0.parquet")
    assert fence is not None and fence.epoch == 4
    assert not judge(fence, {"sink-a": _state({}, epoch=4)}).dead
    assert judge(fence, {"sink-a": _state({}, epoch=5)}).dead
    assert fence_of(coordinator_prefix("sink-a", 4, "delete") + "-6c1f.parquet") == fence
