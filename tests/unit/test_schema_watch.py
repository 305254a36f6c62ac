"""A table changed by another tool while a worker runs (issue 39 point 5): the worker learns of
it without a restart and cheaply (agents/schema_watch.py), and buffered rows decoded against the
older schema are written to the new one by field id (agents/evolution.py conform, Evolver.ready)."""

from __future__ import annotations

import asyncio

import pyarrow as pa

from agents.buffer import Chunk
from agents.evolution import Evolver, conform
from agents.schema_watch import SchemaWatch, unknown_fields
from icesink.shared.protocol import TopicPartition


def _f(name: str, t: pa.DataType, fid: int | None) -> pa.Field:
    return pa.field(name, t, metadata=None if fid is None else {b"PARQUET:field_id": str(fid).encode()})


OLD = pa.schema([_f("id", pa.string(), 1), _f("n", pa.int64(), 2), _f("gone", pa.string(), 3)])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_unknown_fields_are_the_records_top_level_fields_the_table_lacks() -> None:
    assert unknown_fields(OLD, {"id", "n", "note"}, frozenset()) == {"note"}
    assert unknown_fields(OLD, {"id", "N"}, frozenset(), case_insensitive=True) == set()
    assert unknown_fields(OLD, {"id", "N"}, frozenset()) == {"N"}
    assert unknown_fields(OLD, {"id", "_kafka"}, frozenset({"_kafka"})) == set()  # built by the sink


def test_a_new_field_reloads_at_once_one_the_table_lacks_at_most_once_per_interval() -> None:
    clock = Clock()
    loads: list[str] = []
    tables = {"t": OLD, "u": OLD}

    async def load(name: str) -> pa.Schema | None:
        loads.append(name)
        return tables[name]

    watch = SchemaWatch(load, lambda s: s, min_interval_s=10.0, clock=clock)

    async def run() -> None:
        assert await watch.check("t", OLD, {"id", "n"}) is None  # nothing new: no catalog load
        assert loads == []
        assert await watch.check("t", OLD, {"id", "note"}) == OLD  # a field the cache lacks: reloaded
        assert loads == ["t"]
        clock.now += 1.0  # the table lacks it (dropped, as the reference sink drops it): not again before the interval
        assert await watch.check("t", OLD, {"id", "note"}) is None
        assert loads == ["t"]
        assert await watch.check("u", OLD, {"id", "note"}) == OLD  # each table has its own
        added = OLD.append(pa.field("other", pa.string()))
        tables["t"] = added  # another field, just added by another tool: reloaded at once, no interval
        assert await watch.check("t", OLD, {"id", "note", "other"}) == added
        assert loads == ["t", "u", "t"]
        clock.now += 10.0
        assert await watch.check("t", added, {"id", "note"}) == added  # the interval passed: looked again
        assert loads == ["t", "u", "t", "t"]

    asyncio.run(run())


def test_ever_new_fields_reload_at_most_once_per_interval_past_the_memory() -> None:
    clock = Clock()
    loads: list[str] = []

    async def load(name: str) -> pa.Schema | None:
        loads.append(name)
        return OLD

    watch = SchemaWatch(load, lambda s: s, min_interval_s=10.0, clock=clock, max_absent=2)

    async def run() -> None:
        for k in range(5):
            await watch.check("t", OLD, {"id", f"k{k}"})
        assert loads == ["t", "t"]  # k0 and k1 remembered; k2.. wait for the interval

    asyncio.run(run())


def test_conform_matches_top_level_columns_by_field_id_renamed_and_dropped() -> None:
    """Rows decoded before another tool renamed ``n`` to ``count``, dropped ``gone`` and added
    ``note``: written to the new schema, ``count`` keeps the values (same field id), ``gone`` is
    left out, ``note`` is null. By name alone the renamed column's values were lost."""
    new = pa.schema([_f("id", pa.string(), 1), _f("count", pa.int64(), 2), _f("note", pa.string(), 4)])
    data = pa.Table.from_pydict({"id": ["a", "b"], "n": [1, 2], "gone": ["x", "y"]}, schema=OLD)
    out = conform(data, new)
    assert out.schema.equals(new, check_metadata=True)
    assert out.to_pydict() == {"id": ["a", "b"], "count": [1, 2], "note": [None, None]}


def test_conform_does_not_fill_a_new_column_from_an_old_one_of_the_same_name() -> None:
    """Dropped and added again under the same name: a new column (new id), empty for old rows."""
    new = pa.schema([_f("id", pa.string(), 1), _f("n", pa.int64(), 2), _f("gone", pa.string(), 9)])
    data = pa.Table.from_pydict({"id": ["a"], "n": [1], "gone": ["x"]}, schema=OLD)
    assert conform(data, new).to_pydict() == {"id": ["a"], "n": [1], "gone": [None]}


def test_with_evolution_rows_of_a_dropped_or_renamed_column_are_ready_for_the_new_table() -> None:
    """A chunk decoded against the table before another tool dropped and renamed columns must
    not wait for ever (the table will never hold ``gone`` again, nor ``n`` by that name)."""
    new = pa.schema([_f("id", pa.string(), 1), _f("count", pa.int64(), 2)])
    data = pa.Table.from_pydict({"id": ["a"], "n": [1], "gone": ["x"]}, schema=OLD)
    chunk = Chunk(TopicPartition("t", 0), 1, {"tbl": data}, data.nbytes, 1)

    class T:
        arrow_schema = new

    ev = Evolver("w", evolve=True, case_insensitive=False)
    assert ev.ready({"tbl": T()})(chunk)
    # A field the evolved schema added (no field id yet) still waits for the table to hold it.
    grown = pa.Table.from_pydict({"id": ["a"], "extra": [1]},
                                 schema=pa.schema([_f("id", pa.string(), 1), pa.field("extra", pa.int64())]))
    assert not ev.ready({"tbl": T()})(Chunk(TopicPartition("t", 0), 1, {"tbl": grown}, grown.nbytes, 1))


def test_an_evolved_schema_follows_a_rename_and_a_drop_by_another_tool() -> None:
    """The worker's evolved schema S' (the table's columns then, plus ``extra`` it proposed)
    after another tool renamed ``n`` and dropped ``gone``: it keeps ``extra`` only, so the
    proposal it sends again does not add ``n`` and ``gone`` back under their old names."""
    ev = Evolver("w", evolve=True, case_insensitive=False)
    ev.schemas["t"] = OLD.append(pa.field("extra", pa.int64()))
    new = pa.schema([_f("id", pa.string(), 1), _f("count", pa.int64(), 2)])
    ev.refreshed("t", new)
    assert ev.schemas["t"].names == ["id", "count", "extra"]
    proposal = ev.pending_proposal("t", new)
    assert proposal is not None
    assert "gone" not in str(proposal) and '"n"' not in str(proposal) and "extra" in str(proposal)
