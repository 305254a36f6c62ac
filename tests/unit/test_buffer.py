"""Worker buffers: which records are taken after a (re)activation, ranges, restore."""

from dataclasses import dataclass

import pytest

import pyarrow as pa

from agents.buffer import Buffers, Chunk
from icesink.shared.protocol import OffsetRange, TopicPartition

P = TopicPartition("t", 0)
Q = TopicPartition("t", 1)


@dataclass
class M:  # an aiokafka ConsumerRecord, as far as select() looks
    offset: int


def chunk(tp, start, end):
    t = pa.table({"x": list(range(start, end))})
    return Chunk(tp, end, {"db.t": t}, t.nbytes, t.num_rows)


def active(b, tp, pos, at=10.0):
    b.claim(tp, 1)
    b.resume(tp, pos, now=at)


def test_takes_contiguous_offsets_and_drops_duplicates():
    b = Buffers(10**9)
    active(b, P, 5)
    st = b.partitions[P]
    taken, suspect = st.select([M(3), M(4), M(5), M(6)], 20)
    assert [m.offset for m in taken] == [5, 6] and suspect is None


def test_a_record_past_the_expected_offset_is_never_taken_on_one_sight():
    b = Buffers(10**9)
    active(b, P, 5, at=10.0)
    st = b.partitions[P]
    assert st.select([M(8)], 9.0) == ([], None)  # stale prefetch from before the seek: ignored
    taken, suspect = st.select([M(8), M(9)], 11.0)  # fresh: suspected, not taken
    assert taken == [] and suspect == 8


def test_a_gap_is_confirmed_only_by_the_same_offset_after_two_seeks():
    b = Buffers(10**9)
    active(b, P, 5, at=10.0)
    st = b.partitions[P]
    st.suspect_gap(8)
    st.suspect_gap(8)  # same sight, no seek in between: not confirmed
    assert st.confirmed_gap is None
    st.seeks += 1
    st.suspect_gap(9)  # another offset after the seek: a stale batch, start over
    assert st.confirmed_gap is None
    st.seeks += 1
    st.suspect_gap(9)
    assert st.confirmed_gap == 9
    taken, _ = st.select([M(9), M(10)], 12.0)
    assert [m.offset for m in taken] == [9, 10]


def test_nothing_taken_while_claiming():
    b = Buffers(10**9)
    b.claim(P, 1)
    assert b.partitions[P].select([M(0)], 99.0) == ([], None)


def test_take_reports_every_active_partition_including_idle_ones():
    b = Buffers(10**9)
    active(b, P, 0)
    active(b, Q, 7)
    b.add(chunk(P, 0, 3), last_offset=2, last_record_ms=None)
    snap = b.take(1)
    assert snap.ranges == (OffsetRange(P, 0, 3), OffsetRange(Q, 7, 7))
    assert snap.tables()["db.t"].num_rows == 3 and b.nbytes == 0
    assert b.take(1).ranges == (OffsetRange(P, 3, 3), OffsetRange(Q, 7, 7))


def test_restore_after_a_failed_write_puts_data_back_first():
    b = Buffers(10**9)
    active(b, P, 0)
    b.add(chunk(P, 0, 3), 2, None)
    snap = b.take(1)
    b.add(chunk(P, 3, 5), 4, None)
    b.restore(snap)
    again = b.take(1)
    assert again.ranges == (OffsetRange(P, 0, 5),)
    assert again.tables()["db.t"]["x"].to_pylist() == [0, 1, 2, 3, 4]


def test_resume_keeps_buffers_only_when_they_continue_from_the_position():
    b = Buffers(10**9)
    active(b, P, 0)
    b.add(chunk(P, 0, 3), 2, None)
    b.claim(P, 2)  # rebalance: same partition comes back
    assert b.resume(P, 0, now=1.0) == 3  # kept: seek past what is buffered
    assert b.rows == 3
    b.claim(P, 3)
    assert b.resume(P, 2, now=1.0) == 2  # another position: buffers dropped
    assert b.rows == 0


def test_full_when_bytes_reach_the_limit_and_rewind_forgets():
    b = Buffers(10)
    active(b, P, 0)
    b.add(chunk(P, 0, 100), 99, None)
    assert b.full
    b.rewind(P)
    assert b.nbytes == 0 and not b.partitions[P].active


def test_take_with_ready_stops_each_range_before_its_first_waiting_chunk():
    b = Buffers(10**9)
    active(b, P, 0)
    active(b, Q, 100)
    waiting = chunk(P, 10, 20)
    for c, last in ((chunk(P, 0, 10), 9), (waiting, 19), (chunk(P, 20, 30), 29), (chunk(Q, 100, 105), 104)):
        b.add(c, last, None)
    snap = b.take(1, ready=lambda c: c is not waiting)
    # P stops before the waiting chunk (the ready chunk after it waits too); Q is whole.
    assert snap.ranges == (OffsetRange(P, 0, 10), OffsetRange(Q, 100, 105))
    assert [c.end for c in snap.chunks] == [10, 105]
    assert [c.end for c in b.partitions[P].chunks] == [20, 30] and b.rows == 20
    # Nothing ready at the front: an empty range, so the partition still answers the round.
    again = b.take(1, ready=lambda c: c is not waiting)
    assert again.ranges == (OffsetRange(P, 10, 10), OffsetRange(Q, 105, 105)) and again.chunks == []
    # A failed write gives the snapshot back in front of what waits.
    b.restore(snap)
    assert [c.end for c in b.partitions[P].chunks] == [10, 20, 30] and b.partitions[P].range_start == 0
    later = b.take(1, ready=lambda c: True)
    assert later.ranges == (OffsetRange(P, 0, 30), OffsetRange(Q, 100, 105)) and later.rows == 35


def test_snapshot_tables_cast_each_chunk_before_concatenating():
    b = Buffers(10**9)
    active(b, P, 0)
    t1 = pa.table({"x": pa.array([1], pa.int32())})
    t2 = pa.table({"x": pa.array([2**40]), "y": ["new"]})
    b.add(Chunk(P, 1, {"db.t": t1}, t1.nbytes, 1), 0, None)
    b.add(Chunk(P, 2, {"db.t": t2}, t2.nbytes, 1), 1, None)
    target = pa.schema([("x", pa.int64()), ("y", pa.string())])
    from agents.evolution import conform

    out = b.take(1).tables(lambda name, t: conform(t, target))["db.t"]
    assert out.to_pylist() == [{"x": 1, "y": None}, {"x": 2**40, "y": "new"}]


def test_snapshot_tables_cast_once_per_schema_run_and_hand_over_one_chunk_per_column():
    """A table gets a small chunk from every fetch of a round: casting each chunk (and handing
    Spark hundreds of tiny batches) cost seconds a round with many tables."""
    b = Buffers(10**9)
    active(b, P, 0)
    old = pa.schema([("x", pa.int32())])
    new = pa.schema([("x", pa.int64()), ("y", pa.string())])
    for i in range(100):  # 60 chunks of the old schema, then 40 of the evolved one
        t = pa.table({"x": [i]}, schema=old) if i < 60 else pa.table({"x": [i], "y": [str(i)]}, schema=new)
        b.add(Chunk(P, i + 1, {"db.t": t}, t.nbytes, 1), i, None)
    from agents.evolution import conform

    casts: list[int] = []

    def cast(name: str, t: pa.Table) -> pa.Table:
        casts.append(t.num_rows)
        return conform(t, new)

    out = b.take(1).tables(cast)["db.t"]
    assert casts == [60, 40]
    assert out["x"].to_pylist() == list(range(100))
    assert out["y"].to_pylist() == [None] * 60 + [str(i) for i in range(60, 100)]
    assert all(col.num_chunks == 1 for col in out.columns)


def test_a_fetch_that_follows_on_is_taken_whole_and_clears_a_confirmed_gap():
    b = Buffers(10**9)
    active(b, P, 5)
    st = b.partitions[P]
    st.confirmed_gap = 9
    records = [M(o) for o in range(5, 9)]
    taken, suspect = st.select(records, 20.0)
    assert taken == records and suspect is None and st.confirmed_gap is None


class Fetch:  # agents.kafka.source_consumer.Fetched, as far as Buffers looks
    def __init__(self, nbytes):
        self.nbytes = nbytes


def test_fetched_bytes_count_against_the_bound_until_converted_or_dropped():
    b = Buffers(100)
    active(b, P, 0)
    f = Fetch(60)
    b.hold(f)
    b.add(chunk(P, 0, 5), 4, None)  # 40 bytes of Arrow
    assert b.nbytes == 40 and b.fetched_bytes == 60 and b.full
    b.converted(f)
    assert not b.full
    g = Fetch(70)
    b.hold(g)
    assert b.full
    del g  # dropped unconverted (a rebalance clears Faust's queue): no longer counted
    assert b.fetched_bytes == 0 and not b.full


# Early writes: rows written to files ahead of their round ------------------------------------


def staged_and_landed(b, name="f"):
    stage = b.stage(1)
    w = b.land(stage, {"db.t": (name,)})
    assert w is not None
    return w


def test_an_early_write_is_reported_by_the_next_round_with_the_chunks_after_it():
    b = Buffers(10**9)
    active(b, P, 0)
    active(b, Q, 100)
    b.add(chunk(P, 0, 3), 2, None)
    b.add(chunk(Q, 100, 102), 101, None)
    stage = b.stage(1)
    assert stage.ranges == (OffsetRange(P, 0, 3), OffsetRange(Q, 100, 102))
    assert b.nbytes == 0 and b.rows == 0  # out of the bound once staged
    w = b.land(stage, {"db.t": ("f1",)})
    b.add(chunk(P, 3, 5), 4, None)
    snap = b.take(1)
    # one range per partition from the range start: the files, then the chunks after them
    assert snap.ranges == (OffsetRange(P, 0, 5), OffsetRange(Q, 100, 102))
    assert snap.written == [w] and w.sent and snap.written_files() == {"db.t": ("f1",)}
    assert snap.tables()["db.t"]["x"].to_pylist() == [3, 4] and snap.rows == 7
    assert b.partitions[P].written == [] and b.take(1).ranges == (OffsetRange(P, 5, 5), OffsetRange(Q, 102, 102))


def test_written_files_wait_for_every_partition_they_cover():
    b = Buffers(10**9)
    active(b, P, 0)
    active(b, Q, 100)
    b.add(chunk(P, 0, 3), 2, None)
    b.add(chunk(Q, 100, 102), 101, None)
    w = staged_and_landed(b)
    b.add(chunk(P, 3, 5), 4, None)
    b.claim(Q, 2)  # a rebalance: Q claims again, P is resumed first
    b.claim(P, 2)
    b.resume(P, 0, now=1.0)
    snap = b.take(2)
    # the file holds Q's rows too: P's range stops before it, and the chunks behind it wait
    assert snap.ranges == (OffsetRange(P, 0, 0),) and snap.written == [] and snap.chunks == []
    assert b.resume(Q, 100, now=1.0) == 102  # same position: the file is kept
    snap = b.take(2)
    assert snap.ranges == (OffsetRange(P, 0, 5), OffsetRange(Q, 100, 102)) and snap.written == [w]


def test_releasing_a_partition_voids_its_files_and_the_others_read_them_again():
    b = Buffers(10**9)
    active(b, P, 0)
    active(b, Q, 100)
    b.add(chunk(P, 0, 3), 2, None)
    first = staged_and_landed(b, "f1")
    b.add(chunk(P, 3, 6), 5, None)
    b.add(chunk(Q, 100, 102), 101, None)
    second = staged_and_landed(b, "f2")  # P [3, 6) and Q [100, 102)
    b.add(chunk(P, 6, 8), 7, None)
    b.release(Q)
    voided, reseek = b.take_voided()
    # Q's file is void for P too: P keeps its first file and reads again from 3
    assert voided == [second] and reseek == [P]
    st = b.partitions[P]
    assert st.written == [first] and st.chunks == [] and st.next_offset == 3 and st.reseeking
    assert b.rows == 0
    assert b.take_voided() == ([], [])


def test_an_early_write_is_void_when_a_partition_drops_its_data_meanwhile():
    b = Buffers(10**9)
    active(b, P, 0)
    active(b, Q, 100)
    b.add(chunk(P, 0, 3), 2, None)
    b.add(chunk(Q, 100, 102), 101, None)
    stage = b.stage(1)
    b.add(chunk(P, 3, 4), 3, None)
    b.claim(Q, 2)
    b.resume(Q, 90, now=1.0)  # another position: Q's data is dropped while the write runs
    assert b.land(stage, {"db.t": ("f",)}) is None
    # P gets its staged chunk back in front; nothing is written
    assert [c.end for c in b.partitions[P].chunks] == [3, 4] and b.partitions[P].written == []
    assert b.rows == 4
    b.claim(P, 2)
    b.resume(P, 0, now=1.0)
    # ... and the same with a new state for the partition (released and assigned again)
    stage = b.stage(2)
    b.release(P)
    b.claim(P, 3)
    b.resume(P, 0, now=1.0)
    assert b.land(stage, {"db.t": ("f",)}) is None and b.partitions[P].chunks == []


def test_a_failed_early_write_puts_its_chunks_back_first():
    b = Buffers(10**9)
    active(b, P, 0)
    b.add(chunk(P, 0, 3), 2, None)
    stage = b.stage(1)
    b.add(chunk(P, 3, 4), 3, None)
    b.unstage(stage)
    snap = b.take(1)
    assert snap.ranges == (OffsetRange(P, 0, 4),) and snap.tables()["db.t"]["x"].to_pylist() == [0, 1, 2, 3]


def test_a_round_never_takes_while_an_early_write_is_in_flight():
    b = Buffers(10**9)
    active(b, P, 0)
    b.add(chunk(P, 0, 3), 2, None)
    b.stage(1)
    with pytest.raises(RuntimeError, match="early write"):
        b.take(1)


def test_a_restored_response_never_reports_its_written_files_again():
    b = Buffers(10**9)
    active(b, P, 0)
    active(b, Q, 100)
    b.add(chunk(P, 0, 3), 2, None)
    w = staged_and_landed(b)
    b.add(chunk(P, 3, 5), 4, None)
    b.add(chunk(Q, 100, 101), 100, None)
    snap = b.take(1)
    b.add(chunk(P, 5, 6), 5, None)
    b.restore(snap)  # the send failed: a partial response may name the file
    voided, reseek = b.take_voided()
    assert voided == [] and w.sent  # the coordinator's to delete, not the worker's
    assert reseek == [P]
    st = b.partitions[P]
    assert st.range_start == st.next_offset == 0 and st.chunks == [] and st.written == []
    assert [c.end for c in b.partitions[Q].chunks] == [101]  # no file: restored as before
    assert b.rows == 1


def test_a_file_behind_one_that_must_wait_waits_in_every_partition_it_covers():
    """P holds file A (P and X) then file B (P and Q); X is claiming. B follows A in P, so B
    waits too, also for Q, whose first file it is: reported by Q alone, P's rows in it would
    be committed without P's range, and again with it later."""
    X = TopicPartition("t", 2)
    b = Buffers(10**9)
    for tp, at in ((P, 0), (Q, 100), (X, 200)):
        active(b, tp, at)
    b.add(chunk(P, 0, 2), 1, None)
    b.add(chunk(X, 200, 201), 200, None)
    a = staged_and_landed(b, "a")
    b.add(chunk(P, 2, 4), 3, None)
    b.add(chunk(Q, 100, 103), 102, None)
    files_b = staged_and_landed(b, "b")
    assert b.partitions[X].written == [a] and b.partitions[Q].written == [files_b]
    b.claim(X, 1)  # X claims again (same generation): not active
    snap = b.take(1)
    assert snap.written == [] and snap.ranges == (OffsetRange(P, 0, 0), OffsetRange(Q, 100, 100))
    b.resume(X, 200, now=1.0)
    snap = b.take(1)
    assert snap.written == [a, files_b]
    assert snap.ranges == (OffsetRange(P, 0, 4), OffsetRange(Q, 100, 103), OffsetRange(X, 200, 201))


def test_fan_out_fetches_are_split_per_table_once_per_round_in_buffer_order():
    """A fetch routed to many tables of one schema is buffered whole (FanoutRows), and a round
    splits all such fetches at once: each table's rows in buffer order, around chunks buffered
    per table and across a change of schema."""
    import numpy as np

    from agents.buffer import FanoutRows

    b = Buffers(10**9)
    active(b, P, 0)
    active(b, Q, 0)
    s2 = pa.schema([("x", pa.int64()), ("y", pa.string())])

    def fan(tp, end, xs, owners, names, schema=None):
        t = pa.table({"x": xs}) if schema is None else pa.table({"x": xs, "y": [str(x) for x in xs]}, schema=schema)
        return Chunk(tp, end, {}, t.nbytes, t.num_rows, FanoutRows(t, np.array(owners, np.int32), names))

    b.add(fan(P, 3, [1, 2, 3], [0, 1, 0], ("db.a", "db.b")), 2, None)
    b.add(fan(Q, 2, [10, 11], [0, 0], ("db.b",)), 1, None)
    t = pa.table({"x": [4]})
    b.add(Chunk(P, 4, {"db.a": t}, t.nbytes, 1), 3, None)  # a fetch that went the usual way
    b.add(fan(P, 6, [5, 6], [0, 1], ("db.c", "db.a")), 5, None)
    b.add(fan(Q, 4, [12, 13], [0, 1], ("db.a", "db.b"), s2), 3, None)  # another schema
    assert b.partitions[P].chunks[0].tables == {}  # kept whole until the round
    assert dict(b.partitions[P].chunks[0].by_table().items())["db.a"].column("x").to_pylist() == [1, 3]
    casts: list[tuple[str, int]] = []

    def cast(name: str, t: pa.Table) -> pa.Table:
        casts.append((name, t.num_rows))
        return t.select(["x"])

    out = {n: t.column("x").to_pylist() for n, t in b.take(1).tables(cast).items()}
    assert sorted(out["db.a"]) == [1, 3, 4, 6, 12]
    assert out["db.b"] in ([2, 10, 11, 13], [10, 11, 2, 13])  # partitions' chunks may interleave
    assert out["db.c"] == [5]
    by_partition = {1, 3, 4, 6}  # P's rows of db.a keep their offset order
    assert [x for x in out["db.a"] if x in by_partition] == [1, 3, 4, 6]
    assert ("db.a", 1) in casts and ("db.b", 1) in casts  # the other schema's run is cast on its own


def test_a_held_partition_keeps_its_data_and_its_files_hold_the_others_ranges():
    """``take(hold=...)``: a held partition answers an empty range and keeps its chunks and
    files; a file that also holds its rows waits in every partition it covers, as for one
    claiming. A take that held data counts as a round for the requests' pacing."""
    b = Buffers(10**9)
    active(b, P, 0)
    active(b, Q, 100)
    b.add(chunk(P, 0, 3), 2, None)
    b.add(chunk(Q, 100, 102), 101, None)
    w = staged_and_landed(b)  # P's and Q's rows in one file
    b.add(chunk(P, 3, 5), 4, None)
    b.add(chunk(Q, 102, 104), 103, None)
    takes = b.takes
    snap = b.take(1, hold=lambda st: st.tp == Q)
    assert snap.ranges == (OffsetRange(P, 0, 0), OffsetRange(Q, 100, 100)) and snap.written == [] and not snap.chunks
    assert b.takes == takes + 1 and b.rows == 4 and b.partitions[Q].written == [w]
    active(b, TopicPartition("t", 2), 0)  # an idle third partition, not held
    snap = b.take(1, hold=lambda st: st.tp == P)  # P held: Q's range stops before the shared file
    assert snap.ranges == (OffsetRange(P, 0, 0), OffsetRange(Q, 100, 100), OffsetRange(TopicPartition("t", 2), 0, 0))
    snap = b.take(1)
    assert snap.ranges[:2] == (OffsetRange(P, 0, 5), OffsetRange(Q, 100, 104)) and snap.written == [w]
    assert snap.rows == 9 and b.rows == 0
