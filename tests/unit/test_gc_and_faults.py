"""Pure parts of orphan gc and fault injection."""

import pytest

from coordinator.gc import normalize, parse_duration
from icesink.config import load_settings
from icesink.errors import ConfigError
from icesink.faults import should_crash


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
