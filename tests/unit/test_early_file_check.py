"""Before a response reports files written early, the worker checks they still exist
(agents/rounds.py): only a definite "no such file" counts as gone (the partitions then read
those rows again); a storage error (permission, network, throttling) is no answer: the data
and its files are kept for the next round, and the failure counts as a failed write (capped
backoff, /status, a metric, the replica stops at the limit)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pyarrow as pa
import pytest

from agents.buffer import Chunk
from agents.rounds import missing_files
from icesink.shared.protocol import DataWritten, FileInfo
from tests.unit.test_backpressure import P, TABLE, make_parts


class Input:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def exists(self) -> bool:  # as fsspec's lexists: any error is "does not exist"
        return self.error is None

    def __len__(self) -> int:
        if self.error is not None:
            raise self.error
        return 10


def io(errors: dict[str, BaseException]) -> SimpleNamespace:
    return SimpleNamespace(io=SimpleNamespace(new_input=lambda path: Input(errors.get(path))))


def test_only_a_definite_not_found_counts_as_missing():
    table = io({"gone": FileNotFoundError("gone"), "denied": PermissionError("access denied")})
    assert missing_files([(table, "here"), (table, "gone")]) == ["gone"]
    with pytest.raises(PermissionError):
        missing_files([(table, "here"), (table, "denied")])


def info(path: str) -> FileInfo:
    return FileInfo(path, 10, 1, None)


def test_a_storage_error_while_checking_keeps_the_data_and_its_early_files_for_the_next_round():
    deleted = []

    async def run(fn, *args):
        if fn is missing_files:
            raise PermissionError("s3: 403 Forbidden")
        deleted.extend(path for _, path in args[0])  # delete_files: the response's own files

    w = make_parts(max_bytes=1 << 30, targets={TABLE: SimpleNamespace(table=None)}, offload=SimpleNamespace(run=run))
    w.replica.generation = 1
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    w.buffers.add(Chunk(P, 2, {TABLE: rows}, rows.nbytes, 2), 1, None)
    stage = w.buffers.stage(1)
    early = w.buffers.land(stage, {TABLE: (info("early.parquet"),)})
    w.buffers.add(Chunk(P, 4, {TABLE: rows}, rows.nbytes, 2), 3, None)
    snap = w.buffers.take(1)
    written = [DataWritten("c1", "r1", "w1", TABLE, (info("early.parquet"), info("own.parquet")))]

    async def check() -> bool:
        found = await w.rounds._early_files_exist(snap, written)
        await asyncio.sleep(0.01)  # the spawned deletion
        return found

    assert asyncio.run(check()) is False
    st = w.buffers.partitions[P]
    assert st.written == [early] and not early.sent, "expected the early files kept for the next round"
    assert st.range_start == 0 and st.next_offset == 4 and [c.end for c in st.chunks] == [4]
    assert w.buffers.take_voided() == ([], [])  # nothing voided, nothing read again
    assert w.rounds.write_failures.in_a_row == 1 and w.failures == [] and deleted == ["own.parquet"]
    again = w.buffers.take(1)
    assert again.written == [early] and [(r.start, r.end) for r in again.ranges] == [(0, 4)]


def test_existence_checks_failing_round_after_round_stop_the_replica_although_writes_succeed():
    """A storage that takes writes but refuses the existence check (an S3 policy allowing PUT,
    not HEAD): each round writes its files (a successful write), then the check fails. The
    writes' successes used to reset the count, so the replica retried for ever; only a check
    that passes clears a failing check, and at write.failure-limit the replica stops."""
    w = make_parts(max_bytes=1 << 30)
    r = w.rounds
    for _ in range(r.write_failures.limit):
        r._write_succeeded()  # the round's (or an early) write
        r._write_failed(PermissionError("s3: 403 Forbidden"), check=True)
    assert w.failures and "5 times in a row" in str(w.failures[0]), r.write_failures.in_a_row
    r._write_succeeded(check=True)  # a check that passes
    assert r.write_failures.in_a_row == 0
