"""The coordinator's decisions are a function of the control log: acceptance, rejection,
checkpoints and replay."""

from coordinator.state import CoordinatorState, checkpoint_event
from icesink.shared.protocol import (
    Claim, CommitRequest, DataComplete, DataWritten, FileInfo, OffsetRange, Position, Resume,
    StartCommit, TopicPartition,
)

A = TopicPartition("t", 0)
B = TopicPartition("t", 1)


def f(name: str, rows: int = 5) -> FileInfo:
    return FileInfo(path=f"file:///x/{name}.parquet", record_count=rows, size_bytes=100, spec_id=0)


def response(rid, worker, gen, ranges, files=("f1",), commit="r1", table="db.t"):
    written = [DataWritten(commit, rid, worker, table, tuple(f(n) for n in files))] if files else []
    return written + [DataComplete(commit, rid, worker, gen, tuple(ranges), len(written), 1000)]


def log_with_owners():
    return [
        Claim("w1", 1, (A, B)),
        Resume(1, "w1", 1, (Position(A, 0), Position(B, 10))),
        StartCommit(1, "r1"),
    ]


def run(events, state=None):
    st = state or CoordinatorState()
    for off, ev in enumerate(events):
        st.apply(off, ev)
    return st


def test_response_from_owner_starting_at_accepted_position_is_accepted():
    st = run(log_with_owners() + response("x", "w1", 1, [OffsetRange(A, 0, 5), OffsetRange(B, 10, 10)]))
    assert st.accepted == {A: 5, B: 10}
    assert len(st.pending) == 1 and st.pending[0].files["db.t"][0].path.endswith("f1.parquet")
    assert st.round_answered()
    assert st.take_rejected() == []


def test_gap_or_overlap_is_rejected_naming_expected_and_found():
    st = run(log_with_owners() + response("x", "w1", 1, [OffsetRange(A, 2, 5)]))
    [rej] = st.take_rejected()
    assert "expected 0, found 2" in rej.reason and rej.files and not st.pending
    assert st.accepted[A] == 0


def test_former_owner_and_older_generation_are_rejected():
    events = log_with_owners() + [Claim("w2", 2, (A,)), Resume(1, "w2", 2, (Position(A, 0),))]
    events += response("x", "w1", 1, [OffsetRange(A, 0, 5)])
    st = run(events)
    [rej] = st.take_rejected()
    assert rej.worker == "w1" and "owner" in rej.reason
    assert st.accepted[A] == 0 and not st.pending


def test_stale_claim_of_an_older_generation_does_not_take_ownership():
    st = run([Claim("w2", 5, (A,)), Claim("w1", 4, (A,))])
    assert st.owners[A] == ("w2", 5)


def test_incomplete_response_is_ignored():
    events = log_with_owners() + [
        DataWritten("r1", "x", "w1", "db.t", (f("a"),)),
        DataComplete("r1", "x", "w1", 1, (OffsetRange(A, 0, 5),), 2, None),
    ]
    st = run(events)
    [rej] = st.take_rejected()
    assert "incomplete" in rej.reason and not st.pending and st.accepted[A] == 0


def test_late_response_from_an_earlier_round_joins_the_next():
    events = log_with_owners() + [StartCommit(1, "r2")]
    events += response("x", "w1", 1, [OffsetRange(A, 0, 5)], commit="r1")
    st = run(events)
    assert len(st.pending) == 1 and st.accepted[A] == 5
    assert not st.round_answered()  # the late one does not answer r2


def test_first_resume_fixes_an_unknown_position_and_later_ones_do_not_move_it():
    st = run([Claim("w1", 1, (A,)), Resume(1, "w1", 1, (Position(A, 7),)), Resume(1, "w1", 1, (Position(A, 3),))])
    assert st.accepted[A] == 7


def test_resume_from_a_stale_epoch_is_ignored():
    st = run([StartCommit(3, "r1"), Claim("w1", 1, (A,)), Resume(2, "w1", 1, (Position(A, 9),))])
    assert A not in st.accepted


def test_commit_request_is_recorded_until_the_next_round():
    st = run([CommitRequest("w1", 10)])
    assert st.commit_requested
    st.apply(1, StartCommit(1, "r"))
    assert not st.commit_requested


def test_replay_from_checkpoint_reaches_the_same_state():
    """A response whose DataWritten precedes the checkpoint and whose DataComplete follows it
    must still be complete after recovery from that checkpoint."""
    events = log_with_owners() + response("x", "w1", 1, [OffsetRange(A, 0, 5), OffsetRange(B, 10, 12)])
    events += [DataWritten("r2", "y", "w1", "db.t", (f("late"),))]  # its DataComplete comes later
    live = run(events)
    batch, cp = live.plan_commit()
    live.committed(batch)
    assert len(batch) == 1
    done = checkpoint_event(1, "r1", cp, None)
    assert done.replay_from == len(events) - 1  # the open response's first event
    tail = [DataComplete("r2", "y", "w1", 1, (OffsetRange(A, 5, 9), OffsetRange(B, 12, 12)), 1, None)]
    for off, ev in enumerate(tail, start=len(events)):
        live.apply(off, ev)
    all_events = events + tail
    recovered = CoordinatorState.from_checkpoint(done)
    for off in range(done.replay_from, len(all_events)):
        recovered.apply(off, all_events[off], checkpoint_through=done.through)
    assert recovered.accepted == live.accepted == {A: 9, B: 12}
    assert [p.offset for p in recovered.pending] == [p.offset for p in live.pending]
    assert recovered.owners == live.owners


def test_open_response_abandoned_by_a_later_completed_one_is_expired_with_its_files():
    """A worker answers one round at a time: its later completed response proves the earlier
    open one (sender failed after some DataWritten) can never complete."""
    events = log_with_owners() + [DataWritten("r1", "x", "w1", "db.t", (f("lost"),))]
    events += response("y", "w1", 1, [OffsetRange(A, 0, 5), OffsetRange(B, 10, 10)], files=("kept",))
    st = run(events)
    assert [o.path for o in st.take_orphans()] == ["file:///x/lost.parquet"]
    assert not st.partial and len(st.pending) == 1
    batch, cp = st.plan_commit()
    st.committed(batch)
    assert cp.replay_from == len(events)  # nothing open pins the replay any more


def test_open_response_of_a_worker_that_lost_every_partition_is_expired():
    events = log_with_owners() + [DataWritten("r1", "x", "w1", "db.t", (f("dead"),))]
    st = run(events + [Claim("w2", 2, (A,))])
    assert st.take_orphans() == [] and "x" in st.partial  # w1 still owns B
    st.apply(len(events) + 1, Claim("w2", 2, (B,)))
    assert [o.path for o in st.take_orphans()] == ["file:///x/dead.parquet"]
    # If it completes after all, it is rejected as incomplete and offers no files.
    st.apply(len(events) + 2, DataComplete("r1", "x", "w1", 1, (OffsetRange(A, 0, 5),), 1, None))
    [rej] = st.take_rejected()
    assert "incomplete" in rej.reason and rej.files == () and not st.pending


def test_open_response_of_an_owner_is_kept():
    events = log_with_owners() + [DataWritten("r1", "x", "w1", "db.t", (f("a"),)), Claim("w2", 2, (TopicPartition("u", 0),))]
    st = run(events)
    assert "x" in st.partial and st.take_orphans() == []


def test_replay_never_reopens_a_response_accepted_at_or_below_the_checkpoint():
    """replay_from < through: a dead worker's response stays open across the checkpoint while
    another worker's response is accepted and committed inside [replay_from, through]. Replay
    must know the accepted one as decided, never as an open partial whose files are later
    expired (they are in the table)."""
    C = TopicPartition("t", 2)
    events = [
        Claim("w1", 1, (A, B)), Resume(1, "w1", 1, (Position(A, 0), Position(B, 0))),
        Claim("w2", 1, (C,)), Resume(1, "w2", 1, (Position(C, 0),)),
        StartCommit(1, "r1"),
        DataWritten("r1", "x", "w1", "db.t", (f("dead"),)),  # w1 dies mid-response
    ]
    events += response("y", "w2", 1, [OffsetRange(C, 0, 5)], files=("committed",))
    live = run(events)
    batch, cp = live.plan_commit()
    live.committed(batch)
    assert [a.worker for a in batch] == ["w2"]
    done = checkpoint_event(1, "r1", cp, None)
    assert done.replay_from < done.through  # the open response pins the replay start
    # Afterwards: a new round, w2 answers again, then w1's partitions move to w2.
    tail = [StartCommit(1, "r2")]
    tail += response("z", "w2", 1, [OffsetRange(C, 5, 9)], files=("next",), commit="r2")
    tail += [Claim("w2", 2, (A, B, C)), Resume(2, "w2", 2, (Position(A, 0), Position(B, 0), Position(C, 9)))]
    all_events = events + tail
    recovered = CoordinatorState.from_checkpoint(done)
    for off in range(done.replay_from, len(all_events)):
        recovered.apply(off, all_events[off], checkpoint_through=done.through)
    orphans = {o.path.rsplit("/", 1)[-1] for o in recovered.take_orphans()}
    assert "committed.parquet" not in orphans
    assert orphans == {"dead.parquet"}
    assert [p.offset for p in recovered.pending] == [len(events) + 2]  # z only, y is not rolled forward
    assert recovered.accepted[C] == 9 and not recovered.partial


def test_claims_after_a_consumer_group_reset_take_ownership():
    """The group was deleted and created again: generations restart at 1. New members (ids
    never seen) with a lower generation take their partitions; no partition is left unowned."""
    events = [Claim("w1", 7, (A,), member="m1"), Claim("w2", 7, (B,), member="m2"),
              Resume(1, "w1", 7, (Position(A, 0),)), Resume(1, "w2", 7, (Position(B, 0),))]
    st = run(events)
    st.apply(10, Claim("w3", 1, (A, B), member="m3"))  # after the reset
    assert st.owners == {A: ("w3", 1), B: ("w3", 1)}
    assert st.group_resets == 1
    # The new generation goes on normally: a later rebalance at generation 2 moves B.
    st.apply(11, Claim("w4", 2, (B,), member="m4"))
    st.apply(12, Claim("w3", 2, (A,), member="m3"))
    assert st.owners == {A: ("w3", 2), B: ("w4", 2)} and st.group_resets == 1


def test_a_reset_is_remembered_across_a_checkpoint():
    st = run([Claim("w1", 7, (A,), member="m1"), Resume(1, "w1", 7, (Position(A, 0),))])
    batch, cp = st.plan_commit()
    st.committed(batch)
    recovered = CoordinatorState.from_checkpoint(checkpoint_event(1, "r", cp, None))
    assert recovered.owners == {A: ("w1", 7)}
    recovered.apply(5, Claim("w1", 6, (A,), member="m1"))  # a stale claim of a known member
    assert recovered.owners == {A: ("w1", 7)} and recovered.group_resets == 0
    recovered.apply(6, Claim("w9", 1, (A,), member="m9"))
    assert recovered.owners == {A: ("w9", 1)} and recovered.group_resets == 1


def test_a_stale_claim_of_a_known_member_never_takes_ownership():
    st = run([Claim("w1", 3, (A,), member="m1"), Claim("w2", 4, (A,), member="m2")])
    st.apply(2, Claim("w1", 3, (A,), member="m1"))  # a zombie's late re-claim
    assert st.owners[A] == ("w2", 4) and st.group_resets == 0


def test_a_range_with_start_past_end_is_rejected_not_raised():
    """Decoding refuses it (icesink/shared/protocol/codec.py); an event built in code must not crash apply either."""
    st = run(log_with_owners() + response("x", "w1", 1, [OffsetRange(A, 5, 2)]))
    [rej] = st.take_rejected()
    assert "range of t[0]: expected 0 <= start <= end, found [5, 2)" in rej.reason and not st.pending


def test_a_checkpoint_taken_right_after_a_group_reset_is_readable():
    """A reset leaves the partitions the new group has not claimed yet at generation -1; the
    checkpoint holding them must decode, or every reader would skip it (issue 40)."""
    from icesink.shared.protocol import decode, encode

    st = run([Claim("w1", 7, (A, B), member="m1"), Resume(1, "w1", 7, (Position(A, 0), Position(B, 0)))])
    st.apply(10, Claim("w3", 1, (A,), member="m3"))  # the reset; B not claimed yet
    assert st.owners[B] == ("w1", -1)
    _batch, cp = st.plan_commit()
    done = checkpoint_event(2, "r", cp, None)
    assert decode(encode(done)) == done


def test_the_next_epoch_is_one_above_every_epoch_seen_up_to_what_readers_accept():
    """Issue 40: one above a forged epoch at the top would be unreadable for every reader, and
    no coordinator could ever be heard again; at the top the epoch stays there."""
    from coordinator.state import next_epoch
    from icesink.shared.protocol import StartCommit, decode, encode
    from icesink.shared.protocol.codec import MAX_EPOCH

    assert next_epoch([0]) == 1
    assert next_epoch([3, 9, 4]) == 10
    assert next_epoch([MAX_EPOCH - 1]) == MAX_EPOCH
    assert next_epoch([MAX_EPOCH, 2]) == MAX_EPOCH
    assert next_epoch([2**60]) == MAX_EPOCH  # a table's state from before the bound
    assert decode(encode(StartCommit(next_epoch([MAX_EPOCH]), "r"))).epoch == MAX_EPOCH


def test_altered_positions_are_where_a_partition_is_read_from_once_claimed_again():
    from icesink.shared.protocol import AlterPositions

    events = log_with_owners() + response("x", "w1", 1, [OffsetRange(A, 0, 5), OffsetRange(B, 10, 10)])
    events += [AlterPositions((Position(A, 2),), "PATCH")]
    # the owner before the change answers from the old position: rejected (its owner is void)
    events += response("y", "w1", 1, [OffsetRange(A, 5, 8)], commit="r2")
    st = run(events)
    [rej] = st.take_rejected()
    assert rej.worker == "w1" and "owner" in rej.reason
    assert st.accepted == {A: 2, B: 10} and A not in st.owners and st.owners[B] == ("w1", 1)
    assert len(st.pending) == 1  # accepted before the change: still bound to be committed
    claim = Claim("w2", 2, (A,))
    st = run([claim], st)
    assert st.resume_positions(claim) == ([Position(A, 2)], [])
    n = st.last_offset + 1
    for off, ev in enumerate([Resume(1, "w2", 2, (Position(A, 2),)), *response("z", "w2", 2, [OffsetRange(A, 2, 9)])]):
        st.apply(n + off, ev)
    assert st.accepted[A] == 9 and not st.take_rejected()
