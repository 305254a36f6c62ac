"""icesink deadletters replay against a real SQLite catalog (no broker, no Spark): the ranges
record, the selection, the exactly-once skip, and letters that fail again."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from icesink.shared.deadletter_table import SCHEMA, add_ranges, covered, ensure_table, letter_rows, parse_ranges
from agents.deadletter import Letter

DL = "rp.dead"


def test_ranges_merge_and_cover_offsets_in_bulk():
    text = add_ranges(parse_ranges("t:0:5-7"), [("t", 0, 7), ("t", 0, 9), ("t", 1, 3), ("u.v-w", 0, 4)])
    assert text == "t:0:5-8,t:0:9-10,t:1:3-4,u.v-w:0:4-5"
    letters = pa.table({"topic": ["t", "t", "t", "t", "t", "u.v-w"], "partition": [0, 0, 0, 0, 1, 0],
                        "offset": [4, 5, 8, 9, 3, 5]})
    assert covered(parse_ranges(text), letters).tolist() == [False, True, False, True, True, False]
    assert not covered({}, letters).any()


def _catalog(catalog_props: dict[str, str]) -> Any:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("rp")
    schema = Schema(NestedField(1, "id", StringType(), required=True), NestedField(2, "n", LongType(), required=False))
    for name in ("rp.a", "rp.b"):
        catalog.create_table(name, schema=schema)
    return catalog


def _letters(catalog: Any) -> None:
    """Ten dead letters on t-0 (offsets 0..9, "ident" where the tables want "id") and one malformed on t-1."""
    dl = ensure_table(catalog, DL)
    assert [f.name for f in dl.schema().fields] == [f.name for f in SCHEMA.fields]
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    letters = [Letter(b"k", json.dumps({"ident": f"x{i}", "n": i}).encode(), (), "t", 0, i, "missing-required",
                      "required field", "id", "rp.a,rp.b", 1_700_000_000_000, (("h", b"v"),)) for i in range(10)]
    letters.append(Letter(None, b'{"id": ', (), "t", 1, 3, "malformed", "malformed JSON", None, None))
    dl.append(letter_rows(letters, "g", schema_to_pyarrow(dl.schema())))


def _settings(catalog_props: dict[str, str], tmp_path: Any, **extra: Any) -> Any:
    from icesink.shared.config import build

    return build({"topics": "t", "iceberg.tables": "rp.a,rp.b", "state.dir": str(tmp_path), "group.id": "g",
                  "iceberg.catalog": "it", "deadletter.table": DL,
                  **{f"iceberg.catalog.{k}": v for k, v in catalog_props.items()}, **extra})


FIX = {"transforms": "fix", "transforms.fix.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
       "transforms.fix.renames": "ident:id"}


def ids(catalog: Any, name: str) -> list[str]:
    return sorted(catalog.load_table(name).scan().to_arrow()["id"].to_pylist())


def test_replay_lands_fixed_letters_once_and_leaves_the_rest(catalog_props, tmp_path):
    from icesink.app.deadletters import replay

    catalog = _catalog(catalog_props)
    _letters(catalog)
    # As the sink was: they fail again, nothing lands.
    again = replay(_settings(catalog_props, tmp_path), None, None, None)
    assert again.landed == {} and len(again.failed) == 11
    # A fixed transform, offsets 2..5 of t-0 only.
    fixed = _settings(catalog_props, tmp_path, **FIX)
    first = replay(fixed, None, ("t", 0, 2), 6)
    assert first.landed == {"rp.a": 4, "rp.b": 4} and first.failed == {}
    assert ids(catalog, "rp.a") == ids(catalog, "rp.b") == ["x2", "x3", "x4", "x5"]
    assert catalog.load_table("rp.a").properties[f"icesink.replayed.{DL}"] == "t:0:2-6"
    # All of them, by a query: 2..5 are skipped, the malformed one fails again (stays a dead letter).
    second = replay(fixed, "reason = 'missing-required' or reason = 'malformed'", None, None)
    assert second.landed == {"rp.a": 6, "rp.b": 6} and second.skipped == {"rp.a": 4, "rp.b": 4}
    assert list(second.failed) == [("t", 1, 3)] and "malformed JSON" in second.failed[("t", 1, 3)][1]
    assert ids(catalog, "rp.a") == ids(catalog, "rp.b") == sorted(f"x{i}" for i in range(10))
    assert replay(fixed, None, None, None).landed == {}  # the same again: nothing
    assert ids(catalog, "rp.a") == sorted(f"x{i}" for i in range(10))
    assert catalog.load_table(DL).scan().to_arrow().num_rows == 11  # dead letters stay


def test_a_table_that_holds_some_letters_gets_only_the_others(catalog_props, tmp_path):
    """As after a replay killed between its two tables' commits."""
    from icesink.app.deadletters import replay
    from icesink.shared.deadletter_table import property_key

    catalog = _catalog(catalog_props)
    _letters(catalog)
    a = catalog.load_table("rp.a")
    with a.transaction() as tx:  # rp.a took offsets 0..4 (and its rows) already
        tx.append(pa.table({"id": pa.array([f"x{i}" for i in range(5)], pa.string()), "n": pa.array([None] * 5, pa.int64())},
                           schema=pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("n", pa.int64())])))
        tx.set_properties({property_key(DL): "t:0:0-5"})
    done = replay(_settings(catalog_props, tmp_path, **FIX), None, None, None)
    assert done.landed == {"rp.a": 5, "rp.b": 10}
    assert ids(catalog, "rp.a") == ids(catalog, "rp.b") == sorted(f"x{i}" for i in range(10))


def test_bad_selections_are_refused_naming_the_flag(catalog_props, tmp_path):
    from icesink.app.cli import main
    from icesink.app.deadletters import replay
    from icesink.shared.errors import ConfigError

    catalog = _catalog(catalog_props)
    _letters(catalog)
    with pytest.raises(ConfigError, match="--where"):
        replay(_settings(catalog_props, tmp_path), "reason ===", None, None)
    with pytest.raises(SystemExit) as exit_:
        main(["deadletters", "replay", "--set", "topics=t", "--from", "t:0", "--to", "3"])
    assert exit_.value.code == 2


def test_a_replay_whose_commit_another_replay_overtook_stops_and_loses_nothing(catalog_props, tmp_path, monkeypatch):
    """Two replays at once: B (offsets 6..9) commits to rp.a while A (2..5) holds a table loaded
    before. pyiceberg retries A's conflicting commit by itself on the refreshed table; with the
    ranges property A planned from the old one, B's ranges would be overwritten, and B's letters
    replayed a second time by the next replay. A must stop instead ("one replay at a time"), and
    run again it adds its own letters only."""
    import threading

    from icesink.app.deadletters import replay
    from icesink.shared import faults
    from icesink.shared.deadletter_table import parse_ranges, property_key, read_ranges
    from icesink.shared.errors import ConfigError

    catalog = _catalog(catalog_props)
    _letters(catalog)
    fixed = _settings(catalog_props, tmp_path, **{**FIX, "iceberg.tables": "rp.a"})
    overtaken: list[bool] = []

    def other_replay_commits(settings: Any, point: str) -> None:  # at A's first table commit, B commits
        if point == "replay.before-table-commit" and not overtaken:
            overtaken.append(True)
            t = threading.Thread(target=replay, args=(fixed, None, ("t", 0, 6), 10))
            t.start()
            t.join()

    monkeypatch.setattr(faults, "hold_point_blocking", other_replay_commits)
    with pytest.raises(ConfigError, match="one replay at a time"):
        replay(fixed, None, ("t", 0, 2), 6)
    assert read_ranges(catalog.load_table("rp.a"), DL) == parse_ranges("t:0:6-10")
    assert ids(catalog, "rp.a") == [f"x{i}" for i in range(6, 10)]
    done = replay(fixed, None, ("t", 0, 2), 10)  # A again, over both selections: B's letters skipped
    assert done.landed == {"rp.a": 4} and done.skipped == {"rp.a": 4}
    assert ids(catalog, "rp.a") == sorted(f"x{i}" for i in range(2, 10))
    assert catalog.load_table("rp.a").properties[property_key(DL)] == "t:0:2-10"
