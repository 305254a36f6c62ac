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


def _write_dir(name: str) -> str:
    from icesink.shared.protocol import OffsetRange, TopicPartition
    from icesink.shared.protocol.fences import worker_files_prefix

    return worker_files_prefix("sink-a", (OffsetRange(TopicPartition("pizzas.v1", 0), 10, 20),), name) + "-0"


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_deleting_a_writes_files_removes_the_directories_they_leave_empty_and_nothing_else(tmp_path):
    import os

    from coordinator.gc import prune_write_dirs

    location = tmp_path / "wh" / "t"
    data = location / "data"
    w1, w2, w3 = (data / _write_dir(f"r-w1-{i}") for i in (1, 2, 3))
    gone = [_touch(w1 / "shop=a" / "part-0.parquet"), _touch(w1 / "shop=b" / "part-1.parquet")]
    gone.append(_touch(w2 / "part-0.parquet"))
    kept = _touch(w2 / "part-1.parquet")  # another file of that write still lives
    gone.append(_touch(data / "plain" / "part-9.parquet"))  # another tool's directory: no fence
    gone.append(_touch(w3 / "part-0.parquet"))
    outside = tmp_path / "elsewhere" / _write_dir("r-w1-4")
    gone.append(_touch(outside / "part-0.parquet"))  # not under the table's location
    for p in gone:
        os.remove(p)

    uris = [f"file://{p}" if i % 2 else str(p) for i, p in enumerate(gone)]  # both spellings, as normalize()
    assert prune_write_dirs(location.as_uri(), uris) == 4  # w1's two partition directories, w1, w3
    assert not w1.exists() and not w3.exists()
    assert kept.exists() and (data / "plain").is_dir() and outside.is_dir()
    assert data.is_dir()  # never the table's own directories
    assert prune_write_dirs(location.as_uri(), uris) == 0  # again: nothing left to remove
    assert prune_write_dirs("s3://bucket/wh/t", [f"s3://bucket/wh/t/data/{w2.name}/part-1.parquet"]) == 0


def test_the_sweep_finds_empty_write_directories_older_than_the_grace_period(tmp_path):
    import os
    from pathlib import Path
    from urllib.parse import urlparse

    import pyarrow as pa

    from coordinator.gc import find_orphans, remove_empty_dirs
    from icesink.shared.catalogs import sqlite_catalog_properties
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("it", **sqlite_catalog_properties(tmp_path / "catalog"))
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=pa.schema([("id", pa.int64())]))
    data = Path(urlparse(table.location()).path) / "data"
    old, young = data / _write_dir("r-w1-1"), data / _write_dir("r-w1-2")
    (old / "shop=a").mkdir(parents=True)
    young.mkdir(parents=True)
    (data / "plain").mkdir()  # not a write directory: left alone
    _touch(data / _write_dir("r-w1-3") / "part-0.parquet")  # an orphan file, young: kept
    for d in (old / "shop=a", old, data / "plain"):
        os.utime(d, (1, 1))

    found = find_orphans(table, 3600, ())
    assert found.empty_dirs == [str(old / "shop=a")]  # the empty leaf; its parent holds it
    assert found.orphans == []
    assert remove_empty_dirs(table, found.empty_dirs) == 2  # the leaf, then its emptied write directory
    assert not old.exists() and young.is_dir() and (data / "plain").is_dir()
