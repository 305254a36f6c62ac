"""A worker's response (agents/respond.py, Rounds.respond): an oversized DataWritten is split
into events that fit the control topic and the coordinator accepts the response; a failed
DataWritten or DataComplete send keeps the buffers, and the next round carries the data."""

import asyncio
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from agents.buffer import Buffers, Chunk
from agents.respond import MAX_EVENT_BYTES, send_response, split_written
from agents.tables import Target
from agents.parts import Replica
from agents.rounds import Rounds
from agents.tasks import TaskOwner
from coordinator.state import CoordinatorState
from icesink.shared import protocol
from icesink.shared.config import build
from icesink.shared.control import MAX_REQUEST_BYTES
from icesink.shared.errors import ProtocolError, ResponseSendError
from icesink.shared.protocol import (
    Claim, DataComplete, DataWritten, FileInfo, OffsetRange, Position, Resume, StartCommit, TopicPartition,
)
from icesink.shared.metrics import Metrics

P = TopicPartition("t", 0)
TABLE = "db.t"


def stats_file(i: int, columns: int = 60) -> FileInfo:
    """A file with statistics for ``columns`` columns, as Spark-written files carry them."""
    ids = range(1, columns + 1)
    return FileInfo(
        path=f"file:///w/db/t/data/r1-w1-1/part-{i:05d}-0123456789abcdef.parquet", record_count=1000 + i,
        size_bytes=123456, spec_id=0, partition=(i % 7, f"store-{i % 3}"),
        column_sizes=tuple((c, 1000 + c) for c in ids), value_counts=tuple((c, 1000) for c in ids),
        null_value_counts=tuple((c, 0) for c in ids), nan_value_counts=(),
        lower_bounds=tuple((c, b"lower-bound-%04d" % c) for c in ids),
        upper_bounds=tuple((c, b"upper-bound-%04d" % c) for c in ids), split_offsets=(4,),
    )


def test_an_oversized_data_written_is_split_into_events_that_fit():
    ev = DataWritten("r1", "x", "w1", TABLE, tuple(stats_file(i) for i in range(400)))
    assert len(protocol.encode(ev)) > 2 * MAX_EVENT_BYTES  # too large for one broker record
    parts = split_written(ev)
    assert len(parts) >= 3 and MAX_EVENT_BYTES < MAX_REQUEST_BYTES
    for p in parts:
        assert len(protocol.encode(p)) <= MAX_EVENT_BYTES
        assert protocol.decode(protocol.encode(p)) == p
        assert (p.commit_id, p.response_id, p.worker, p.table) == ("r1", "x", "w1", TABLE)
    assert tuple(f for p in parts for f in p.files) == ev.files  # every file once, in order
    small = DataWritten("r1", "x", "w1", TABLE, ev.files[:2])
    assert split_written(small) == [small]
    assert split_written(DataWritten("r1", "x", "w1", TABLE, ())) == [DataWritten("r1", "x", "w1", TABLE, ())]


def test_a_split_mirror_response_names_its_keys_files_once():
    """A mirror table's keys files ride with the first part only: each part naming them would
    make the coordinator read them twice."""
    keys = FileInfo(path="file:///w/db/t/data/r1-w1-1-keys-0.parquet", record_count=5, size_bytes=300, spec_id=0)
    ev = DataWritten("r1", "x", "w1", TABLE, tuple(stats_file(i) for i in range(400)), (keys,))
    parts = split_written(ev)
    assert len(parts) >= 3
    assert [p.deleted_keys for p in parts] == [(keys,)] + [()] * (len(parts) - 1)
    assert all(len(protocol.encode(p)) <= MAX_EVENT_BYTES for p in parts)
    assert tuple(f for p in parts for f in p.files) == ev.files


def test_a_file_too_large_for_any_event_is_refused_with_what_to_do():
    ev = DataWritten("r1", "x", "w1", TABLE, (stats_file(0, columns=600),))
    with pytest.raises(ProtocolError, match="expected a DataWritten of at most .* write.metadata.metrics"):
        split_written(ev, max_bytes=50_000)


class Producer:
    """Records sent events; ``fail_at``: the n-th send (1-based) raises."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.sent: list = []
        self.calls = 0
        self.fail_at = fail_at

    async def send(self, ev):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ConnectionError("broker gone")
        self.sent.append(ev)
        return len(self.sent)


def test_the_coordinator_accepts_a_split_response_counting_every_data_written():
    ev = DataWritten("r1", "x", "w1", TABLE, tuple(stats_file(i) for i in range(400)))
    other = DataWritten("r1", "x", "w1", "db.u", (stats_file(9),))
    producer = Producer()
    complete = lambda n: DataComplete("r1", "x", "w1", 1, (OffsetRange(P, 0, 50),), n, None)  # noqa: E731
    n = asyncio.run(send_response(producer, [ev, other], complete))
    assert n == len(producer.sent) - 1 > 2 and producer.sent[-1].events_sent == n
    st = CoordinatorState()
    log = [Claim("w1", 1, (P,)), Resume(1, "w1", 1, (Position(P, 0),)), StartCommit(1, "r1"), *producer.sent]
    for off, e in enumerate(log):
        st.apply(off, protocol.decode(protocol.encode(e)))  # as read back from the control topic
    assert st.take_rejected() == []
    [accepted] = st.pending
    assert accepted.files[TABLE] == ev.files and accepted.files["db.u"] == other.files
    assert st.accepted[P] == 50


def test_a_response_with_a_file_that_fits_no_event_is_not_sent():
    producer = Producer()
    written = [DataWritten("r1", "x", "w1", TABLE, (stats_file(0, columns=600),))]
    with pytest.raises(ResponseSendError, match="response not sent: table db.t: expected a DataWritten"):
        asyncio.run(send_response(producer, written, lambda n: DataComplete("r1", "x", "w1", 1, (), n, None),
                                  max_bytes=50_000))
    assert producer.sent == []


@pytest.mark.parametrize("fail_at", [1, 2, 3])  # first DataWritten, second one, the DataComplete
def test_send_response_raises_on_a_failed_send(fail_at):
    written = [DataWritten("r1", "x", "w1", t, (stats_file(0),)) for t in ("db.t", "db.u")]
    with pytest.raises(ResponseSendError, match="broker gone"):
        asyncio.run(send_response(Producer(fail_at), written,
                                  lambda n: DataComplete("r1", "x", "w1", 1, (), n, None)))


# Rounds.respond with a fake Spark writer and producer ---------------------------------------


def data_file(i: int) -> DataFile:
    df = DataFile.from_args(
        content=DataFileContent.DATA, file_path=f"file:///w/db/t/data/part-{i}.parquet",
        file_format=FileFormat.PARQUET, partition=Record(), record_count=3, file_size_in_bytes=100,
        sort_order_id=None, equality_ids=None, key_metadata=None,
    )
    df.spec_id = 0
    return df


class Offload:
    async def run(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)


class Hooks:
    """What the responder asks of the rest of the replica (agents/rounds.py, RoundHooks)."""

    def __init__(self) -> None:
        self.failures: list[Exception] = []

    async def evolution_ready(self):
        return None

    async def release_backpressure(self) -> None:
        return None

    async def reseek_and_resume(self, st) -> None:
        raise AssertionError("nothing is read again here")

    def update_gauges(self) -> None:
        return None

    def fail(self, exc: Exception, exit_code: int = 2) -> None:
        self.failures.append(exc)


def make_rounds(producer: Producer) -> Rounds:
    """The responder with a fake Spark writer and producer."""
    settings = build({"topics": P.topic, "iceberg.tables": TABLE})
    writes: list[int] = []

    def write_many(batch, **kw):
        writes.extend(data.num_rows for _, data, _ in batch)
        return [[data_file(len(writes))] for _ in batch]

    table = SimpleNamespace(spec=lambda: SimpleNamespace(spec_id=0))
    buffers = Buffers(1 << 20)
    buffers.claim(P, 1)
    buffers.resume(P, 0, now=0.0)
    app = SimpleNamespace(consumer=SimpleNamespace(highwater=lambda tp: None))
    r = Rounds(settings, Metrics(), Replica("w1", {}, generation=1), buffers,
               {TABLE: Target(TABLE, table, pa.schema([("id", pa.int64())]))}, None,
               SimpleNamespace(write_many=write_many), Offload(), SimpleNamespace(flush=_nothing, delivered=False),
               app, producer, TaskOwner(lambda exc: None), ownership=None, hooks=Hooks())
    r.writes = writes
    return r


async def _nothing():
    return None


def buffer_rows(w: Rounds, start: int, end: int) -> None:
    rows = pa.table({"id": list(range(start, end))})
    w.buffers.add(Chunk(P, end, {TABLE: rows}, rows.nbytes, end - start), end - 1, None)


def test_the_warm_up_is_skipped_while_rows_wait_and_ends_while_a_round_writes():
    """The warm-up's throw-away writes (Rounds.warm_up) ask whether the replica is idle before
    each write: not while rows are buffered, and not while a round's rows, taken from the
    buffers, are being written (a throw-away write beside the round's first one slowed it:
    bench/README.md, "The warm-up beside a round's first write")."""
    w = make_rounds(Producer())
    seen: dict[str, bool] = {}
    idle_of: list = []

    def warm_up(idle) -> None:
        idle_of.append(idle)
        seen["at start"] = idle()

    def write_many(batch, **kw):
        seen["during the round's write"] = idle_of[0]()
        return [[data_file(1)] for _ in batch]

    w.files = SimpleNamespace(warm_up=warm_up, write_many=write_many)

    async def run():
        w.replica.rebalanced.set()
        w.spark_ready = asyncio.get_running_loop().create_future()
        buffer_rows(w, 0, 3)  # read while the session started
        w.spark_ready.set_result(None)
        await w.warm_up()
        await w.respond("r1")

    asyncio.run(run())
    assert seen == {"at start": False, "during the round's write": False}
    assert idle_of[0]()  # written and answered: idle again
    buffer_rows(w, 3, 5)
    assert not idle_of[0]()


@pytest.mark.parametrize("fail_at", [1, 2])  # the DataWritten, the DataComplete
def test_a_failed_send_keeps_the_buffers_and_the_next_round_carries_the_data(fail_at):
    producer = Producer(fail_at)
    w = make_rounds(producer)

    async def run():
        w.replica.rebalanced.set()
        w.spark_ready = asyncio.get_running_loop().create_future()
        w.spark_ready.set_result(None)
        buffer_rows(w, 0, 3)
        await w.respond("r1")  # the send fails: nothing complete went out
        assert not [e for e in producer.sent if isinstance(e, DataComplete)]
        assert w.buffers.rows == 3 and w.buffers.partitions[P].range_start == 0  # kept
        buffer_rows(w, 3, 5)
        await w.respond("r2")

    asyncio.run(run())
    [complete] = [e for e in producer.sent if isinstance(e, DataComplete)]
    assert complete.commit_id == "r2" and complete.ranges == (OffsetRange(P, 0, 5),)
    r2 = [e for e in producer.sent if isinstance(e, DataWritten) and e.response_id == complete.response_id]
    assert complete.events_sent == len(r2) == 1
    assert w.writes == [3, 5]  # the kept rows were written again with the new ones
    assert w.buffers.rows == 0


def test_the_data_written_of_a_response_are_sent_at_once_and_the_data_complete_after_them():
    """One send awaited after another cost a broker round trip per table (200 a round for 200
    tables): the DataWritten go out together, and the DataComplete only when the broker has
    every one of them."""

    class SlowBroker(Producer):
        def __init__(self) -> None:
            super().__init__()
            self.in_flight = self.most_in_flight = 0

        async def send(self, ev):
            assert not isinstance(ev, DataComplete) or self.in_flight == 0, "DataComplete before its DataWritten"
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            await asyncio.sleep(0.01)  # the broker's round trip
            self.in_flight -= 1
            return await super().send(ev)

    written = [DataWritten("r1", "x", "w1", f"db.t{i}", (stats_file(i),)) for i in range(20)]
    producer = SlowBroker()
    n = asyncio.run(send_response(producer, written, lambda n: DataComplete("r1", "x", "w1", 1, (), n, None)))
    assert n == 20 and producer.most_in_flight == 20
    assert isinstance(producer.sent[-1], DataComplete) and producer.sent[-1].events_sent == 20
    assert sorted(e.table for e in producer.sent[:-1]) == sorted(w.table for w in written)
