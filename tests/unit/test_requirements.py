"""A table commit's preconditions (coordinator/requirements.py): frozen values whose
``validate`` raises "expected X, found Y", built once per commit and checked in order."""

import dataclasses
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.exceptions import CommitFailedException

from coordinator.requirements import (
    AssertControlLog, AssertEpoch, AssertFieldIds, AssertFilesConfined, AssertNoOtherCommit, AssertWatermark,
    applied_watermark, retry_requirements, sink_state_requirements, validate,
)
from icesink.shared.errors import ControlLogError, FencedError, TableChangedError
from icesink.shared.protocol import SinkState


def state(epoch: int = 1, watermark: int = 7, log_id: str | None = "L1") -> SinkState:
    return SinkState(snapshot_id=None, commit_id="r1", watermark=watermark, positions={}, epoch=epoch,
                     valid_through_ms=None, log_id=log_id)


def test_a_newer_epoch_fences_and_an_older_or_equal_one_passes():
    with pytest.raises(FencedError, match=r"table db.a: expected coordinator epoch <= 1, found 2"):
        AssertEpoch("db.a", 1).validate(None, state(epoch=2))  # type: ignore[arg-type]
    AssertEpoch("db.a", 2).validate(None, state(epoch=2))  # type: ignore[arg-type]
    AssertEpoch("db.a", 1).validate(None, None)  # type: ignore[arg-type]


def test_state_of_another_control_log_is_refused_unless_adopted_or_unknown():
    with pytest.raises(ControlLogError, match=r"expected sink state of control log L2, found state of log L1"):
        AssertControlLog("db.a", "L2").validate(None, state())  # type: ignore[arg-type]
    AssertControlLog("db.a", "L2", adopted=True).validate(None, state())  # type: ignore[arg-type]
    AssertControlLog("db.a", None).validate(None, state())  # type: ignore[arg-type]
    AssertControlLog("db.a", "L1").validate(None, state(log_id=None))  # type: ignore[arg-type]
    assert applied_watermark(state(), "L2", adopted=True) == -1 and applied_watermark(state(), "L1", False) == 7
    assert applied_watermark(None, "L1", False) == -1


def test_a_moved_watermark_and_any_conflict_on_a_mirror_commit_make_the_commit_replan():
    with pytest.raises(CommitFailedException, match=r"control watermark moved from 5 to 7"):
        AssertWatermark("db.a", 5, "L1").validate(None, state())  # type: ignore[arg-type]
    AssertWatermark("db.a", 7, "L1").validate(None, state())  # type: ignore[arg-type]
    with pytest.raises(CommitFailedException, match=r"another commit landed during a mirror commit"):
        AssertNoOtherCommit("db.a").validate(None, state())  # type: ignore[arg-type]


def test_requirements_are_frozen_values_checked_in_order():
    reqs = retry_requirements("db.a", 1, 7, "L1")
    assert [type(r) for r in reqs] == [AssertEpoch, AssertControlLog, AssertWatermark]
    assert retry_requirements("db.a", 1, 7, "L1", replan=True) == (AssertNoOtherCommit("db.a"),)
    assert sink_state_requirements("db.a", 3, "L1") == (AssertEpoch("db.a", 3), AssertControlLog("db.a", "L1"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        reqs[0].epoch = 9  # type: ignore[misc]


def test_validate_reads_the_tables_state_and_stops_at_the_first_failure(two_tables):
    table = two_tables.load_table("db.a")
    assert validate(sink_state_requirements("db.a", 1, "L1"), table, "g") is None  # no state: nothing to fence

    class Boom:
        def validate(self, table, state):
            raise AssertionError("not reached")

    with pytest.raises(CommitFailedException):
        validate([AssertNoOtherCommit("db.a"), Boom()], table, "g")


def test_files_outside_the_table_or_with_other_field_ids_are_refused(two_tables, tmp_path):
    table = two_tables.load_table("db.a")
    inside = f"{table.location()}/data/f.parquet"
    with pytest.raises(TableChangedError, match=r"expected its 2 accepted data files under its location"):
        AssertFilesConfined("db.a", (inside, "file:///elsewhere/f.parquet")).validate(table, None)
    AssertFilesConfined("db.a", (inside,)).validate(table, None)
    local = inside.removeprefix("file://")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    field = pa.field("name", pa.int64(), metadata={b"PARQUET:field_id": b"1"})  # the table's field 1 is "id"
    pq.write_table(pa.table({"name": pa.array([1], pa.int64())}, schema=pa.schema([field])), local)
    with pytest.raises(TableChangedError, match=r"expected its accepted data files written with its schema's field ids"):
        AssertFieldIds("db.a", (inside,)).validate(table, None)


def test_files_whose_columns_have_other_types_at_the_same_ids_are_refused(two_tables, tmp_path):
    """A table dropped and created again with the same names but other types (``id`` long, then
    string): names alone would pass, and the files would be read as the wrong type."""
    table = two_tables.load_table("db.a")  # field 1: id long
    path = f"{table.location()}/data/g.parquet"
    local = path.removeprefix("file://")
    os.makedirs(os.path.dirname(local), exist_ok=True)

    def write(t: pa.DataType, value: object) -> None:
        field = pa.field("id", t, metadata={b"PARQUET:field_id": b"1"})
        pq.write_table(pa.table({"id": pa.array([value], t)}, schema=pa.schema([field])), local)

    write(pa.string(), "x")
    with pytest.raises(TableChangedError, match=r"field id 1 .*string in the file, long in the table"):
        AssertFieldIds("db.a", (path,)).validate(table, None)
    write(pa.int32(), 1)  # int is promoted to long: the table reads it
    AssertFieldIds("db.a", (path,)).validate(table, None)
    write(pa.int64(), 1)
    AssertFieldIds("db.a", (path,)).validate(table, None)
