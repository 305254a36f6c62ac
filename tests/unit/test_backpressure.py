"""A worker whose buffers are full: pause, ask for an early round, stop growing, resume where
each buffer ends (Worker._apply_backpressure, _release_backpressure, _check_backpressure)."""

import asyncio
import time
from types import SimpleNamespace

import pyarrow as pa
from faust.types import TP

from agents import ingest as ingest_module
from agents.buffer import Buffers
from agents.deadletter import DeadLetters
from agents.formats import RecordFormat
from agents.missing import MissingTables
from agents.routing import Router
from agents.kafka.source_consumer import Fetched
from agents.tables import Target
from agents.tasks import TaskOwner
from agents.decode import BatchDecoder
from agents.ownership import Ownership
from agents.parts import Replica
from agents.rounds import Rounds
from agents.worker import Worker
from icesink.shared.config import build
from icesink.shared.protocol import CommitRequest, TopicPartition
from icesink.shared.metrics import Metrics
from icesink.shared.offload import Offload

P = TopicPartition("t", 0)
FP = TP("t", 0)
TABLE = "db.t"


class Consumer:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.fail_seek = False

    def pause_partitions(self, tps):
        self.calls.append(("pause", sorted(tps)))

    def resume_partitions(self, tps):
        self.calls.append(("resume", sorted(tps)))

    async def seek_wait(self, offsets):
        if self.fail_seek:
            raise RuntimeError("not assigned")
        self.calls.append(("seek", dict(offsets)))

    def highwater(self, tp):
        return None


class Producer:
    def __init__(self) -> None:
        self.sent: list = []

    async def send(self, ev):
        self.sent.append(ev)
        return len(self.sent)


def make_worker(max_bytes: int) -> Worker:
    w = Worker.__new__(Worker)
    w.worker_id = "w1"
    w.settings = build({"topics": P.topic, "iceberg.tables": TABLE}, warn_unknown=False)
    w.evolver = None
    w.metrics = Metrics()
    w.router = Router(w.settings)
    w.format = RecordFormat(w.settings)
    w.debezium = None
    w.deadletters = DeadLetters(w.settings, w.metrics, "w1")
    w.buffers = Buffers(max_bytes)
    w.targets = {TABLE: Target(TABLE, None, pa.schema([("id", pa.int64())]))}
    w.app = SimpleNamespace(consumer=Consumer())
    w.producer = Producer()
    w._last_request = 0.0
    w.decoder = BatchDecoder(w.settings, w.format, w.router, w.debezium, w.evolver, w.targets, w._propose)
    w._missing = MissingTables()
    w.replica = Replica(w.worker_id, {})
    w.ownership = Ownership([P.topic], w.replica, w.buffers, w._missing, w.app, w.producer.send,
                            TaskOwner(lambda exc: None), hooks=w)
    w.rounds = Rounds(w.settings, w.metrics, w.replica, w.buffers, w.targets, None, SimpleNamespace(), Offload(),
                      w.deadletters, w._missing, w.app, w.producer, TaskOwner(lambda exc: None), w.ownership, hooks=w)
    w.buffers.claim(P, 1)
    w.buffers.resume(P, 0, now=0.0)
    return w


def batch(start: int, end: int) -> Fetched:
    return Fetched({P: [SimpleNamespace(
        topic=P.topic, partition=P.partition, offset=o, value=b'{"id": %d}' % o, timestamp=None, key=None, headers=(),
    ) for o in range(start, end)]}, time.monotonic())


def requests(w: Worker) -> list:
    return [ev for ev in w.producer.sent if isinstance(ev, CommitRequest)]


def test_full_buffers_pause_ask_once_and_stop_growing():
    w = make_worker(max_bytes=100)  # 8 bytes a row: full after 13 rows

    async def run():
        await w.on_fetch(batch(0, 20))
        assert w.replica.backpressure and w.buffers.full and w.buffers.rows == 20
        assert ("pause", [FP]) in w.app.consumer.calls
        assert len(requests(w)) == 1 and requests(w)[0].buffered_bytes == w.buffers.nbytes
        # Records still in flight after the pause are not taken: the buffers stay as they are.
        await w.on_fetch(batch(20, 40))
        assert w.buffers.rows == 20 and w.buffers.partitions[P].next_offset == 20
        assert len(requests(w)) == 1  # a repeat only after REQUEST_EVERY_S

    asyncio.run(run())
    assert w.metrics.early_commit_requests._value.get() == 1
    assert w.metrics.paused_partitions._value.get() == 1


def test_a_round_resumes_where_the_buffer_ends_and_the_next_fill_asks_at_once():
    w = make_worker(max_bytes=100)

    async def run():
        await w.on_fetch(batch(0, 20))
        await w.on_fetch(batch(20, 40))  # skipped while paused
        w.buffers.take(1)  # a round takes the buffers (Rounds.respond) ...
        await w._release_backpressure()  # ... and releases them
        calls = w.app.consumer.calls
        # Seek back to the end of the buffer (records 20..39 were skipped, and Faust drops
        # the rest of a fetch for a partition paused mid-way) before resuming.
        assert calls[-2:] == [("seek", {FP: 20}), ("resume", [FP])]
        assert not w.replica.backpressure
        await w.on_fetch(batch(20, 40))
        assert w.buffers.rows == 20 and w.buffers.partitions[P].next_offset == 40
        # Full again within REQUEST_EVERY_S of the first request: asked at once. (It used to
        # be rate-limited; with partitions paused no batch came to ask again: stalled until
        # the commit interval.)
        assert w.replica.backpressure and len(requests(w)) == 2

    asyncio.run(run())


def test_housekeeping_asks_again_while_full_and_resumes_when_no_longer_full(monkeypatch):
    w = make_worker(max_bytes=100)

    async def run():
        await w.on_fetch(batch(0, 20))
        await w._check_backpressure()
        assert len(requests(w)) == 1  # too soon for a repeat
        monkeypatch.setattr(ingest_module, "REQUEST_EVERY_S", 0.0)
        await w._check_backpressure()
        assert len(requests(w)) == 2  # no round came: asked again though no batch arrives
        w.buffers.rewind(P)  # the buffers shrink without a round (rejected response)
        w.buffers.resume(P, 0, now=time.monotonic())
        await w._check_backpressure()
        assert not w.replica.backpressure and w.app.consumer.calls[-2:] == [("seek", {FP: 0}), ("resume", [FP])]

    asyncio.run(run())


def test_a_failed_seek_keeps_partitions_paused():
    w = make_worker(max_bytes=100)

    async def run():
        await w.on_fetch(batch(0, 20))
        w.buffers.take(1)
        w.app.consumer.fail_seek = True
        await w._release_backpressure()
        assert w.replica.backpressure and not any(c[0] == "resume" for c in w.app.consumer.calls)
        w.app.consumer.fail_seek = False
        await w._check_backpressure()  # housekeeping tries again
        assert not w.replica.backpressure and w.app.consumer.calls[-1] == ("resume", [FP])

    asyncio.run(run())


def early_writing_worker() -> Worker:
    """A worker that writes early past 1 KiB; its Arrow tables are the buffered ones."""
    w = make_worker(max_bytes=10**9)
    w.settings = build({"topics": P.topic, "iceberg.tables": TABLE, "buffer.write-ahead-bytes": 1024},
                       warn_unknown=False)
    w.rounds.settings = w.settings
    w.replica.generation = 1

    async def arrow(snap):
        return snap.tables()

    w.rounds._arrow_tables = arrow
    return w


def test_an_early_write_cancelled_mid_way_gives_its_rows_back():
    """Stopping cancels an early write in flight: its rows go back to the buffers, so nothing
    is left staged and a round could still take them."""
    w = early_writing_worker()
    started = asyncio.Event()

    async def write_forever(tables, tag):
        started.set()
        await asyncio.sleep(3600)

    w.rounds._write_tables = write_forever

    async def go():
        w.replica.rebalanced = asyncio.Event()  # not set: on_fetch starts no early write itself
        await w.on_fetch(batch(0, 500))
        task = asyncio.ensure_future(w.rounds._write_early())
        await started.wait()
        assert w.buffers.rows == 0  # staged
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    assert w.buffers.rows == 500 and w.buffers._staged is None
    snap = w.buffers.take(1)
    assert snap.rows == 500 and snap.ranges[0].end == 500


def test_a_backlog_read_before_spark_started_is_written_early_once_it_has():
    """Records read while the Spark session starts pass the write-ahead mark with no fetch
    left to start an early write: the session's start does, in place of the warm-up."""
    w = early_writing_worker()
    written: list[int] = []
    warmed: list[bool] = []
    failures: list[Exception] = []

    async def write(tables, tag):
        written.append(sum(t.num_rows for t in tables.values()))
        return {}

    w.rounds._write_tables = write
    w._owner = w.rounds.tasks = TaskOwner(failures.append)
    w.offload = w.rounds.offload = Offload()
    w.rounds.files = SimpleNamespace(warm_up=lambda: warmed.append(True))

    async def go():
        w.replica.rebalanced = asyncio.Event()
        w.replica.rebalanced.set()
        w.rounds.spark_ready = asyncio.get_running_loop().create_future()  # starting
        await w.on_fetch(batch(0, 500))
        assert not written and w.buffers.rows == 500  # no session yet: no early write
        w.rounds.spark_ready.set_result(None)
        await w.rounds.warm_up()
        deadline = time.monotonic() + 5
        while len(w._owner) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    try:
        asyncio.run(go())
    finally:
        w.offload.close()
    assert written == [500] and not warmed and not failures
    assert w.buffers.rows == 0 and w.buffers.written_rows == 500
