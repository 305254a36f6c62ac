"""A worker whose buffers are full: pause, ask for an early round, stop growing, resume where
each buffer ends (agents/ingest.py Ingest: apply, release and check backpressure).

:func:`make_parts` builds the parts of a replica these tests (and test_missing_tables.py,
test_stalls.py) need, each through its constructor, with fakes for the consumer, the control
topic and the catalog; :class:`Hooks` stands in for the Worker that wires them."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
from faust.types import TP

from agents import ingest as ingest_module
from agents.buffer import Buffers
from agents.control_loop import ControlLoop
from agents.deadletter import DeadLetters
from agents.decode import BatchDecoder
from agents.formats import RecordFormat
from agents.ingest import Ingest
from agents.kafka.source_consumer import Fetched
from agents.missing import MissingTables
from agents.ownership import Ownership
from agents.parts import Replica
from agents.rounds import Rounds
from agents.routing import Router
from agents.table_lookup import TableLookup
from agents.tables import Target
from agents.tasks import TaskOwner
from icesink.shared.config import Settings, build
from icesink.shared.metrics import Metrics
from icesink.shared.protocol import CommitRequest, TopicPartition

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


class History:
    """The group's past (agents/table_lookup.py GroupHistory), as a test sets it."""

    def __init__(self, has_run: bool = False, committed: set[str] | None = None) -> None:
        self.ran, self.committed = has_run, committed
        self.lookups = self.scans = 0

    async def has_run(self) -> bool:
        self.lookups += 1
        return self.ran

    async def has_committed(self) -> bool:  # a group that ran, here, committed rows
        return await self.has_run()

    async def committed_tables(self) -> set[str] | None:
        self.scans += 1
        return self.committed


class InlineOffload:
    """Runs the offloaded call on the loop (the catalog is a fake)."""

    async def run(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)


class Hooks:
    """The rest of the replica as its parts see it (agents/worker.py Worker wires the real one):
    passes each ask on to the part that answers it; ``failures`` holds what stopped it."""

    async def started(self) -> bool:
        return True

    def __init__(self) -> None:
        self.failures: list[Exception] = []
        self.parts: Any = None

    def settle_voided(self) -> None:
        self.parts.rounds.settle_voided()

    def answer_open_round(self) -> None:
        self.parts.control.answer_open_round()

    async def supervise_coordinator(self) -> None:
        pass

    def update_paused(self) -> None:
        self.parts.ingest.update_paused()

    def update_gauges(self) -> None:
        self.parts.ingest.update_gauges()

    async def evolution_ready(self):
        return await self.parts.tables.evolution_ready(self.parts.buffers)

    async def release_backpressure(self) -> None:
        await self.parts.ingest.release_backpressure()

    async def reseek_and_resume(self, st) -> None:
        await self.parts.ingest.reseek_and_resume(st)

    def fail(self, exc: Exception, exit_code: int = 2) -> None:
        self.failures.append(exc)


def make_parts(max_bytes: int, settings: Settings | None = None, targets: dict[str, Target] | None = None,
               history: History | None = None, missing: MissingTables | None = None, files: Any = None,
               offload: Any = None) -> SimpleNamespace:
    """A replica's ingest, ownership, table lookup and rounds, partition ``P`` active from 0."""
    settings = settings or build({"topics": P.topic, "iceberg.tables": TABLE})
    metrics = Metrics()
    replica = Replica("w1", {})
    buffers = Buffers(max_bytes)
    missing = missing or MissingTables()
    targets = {TABLE: Target(TABLE, None, pa.schema([("id", pa.int64())]))} if targets is None else targets
    app = SimpleNamespace(consumer=Consumer())
    producer = Producer()
    hooks = Hooks()
    tasks = TaskOwner(hooks.failures.append)
    offload = offload or InlineOffload()
    record_format = RecordFormat(settings)
    deadletters = DeadLetters(settings, metrics, "w1")
    tables = TableLookup(settings, metrics, targets, missing, history or History(), offload, record_format, None, None,
                         producer.send, hooks.fail)
    decoder = BatchDecoder(settings, record_format, Router(settings), None, None, targets, tables.propose)
    ownership = Ownership(settings.topics, replica, buffers, missing, app, producer.send, tasks, hooks=hooks)
    rounds = Rounds(settings, metrics, replica, buffers, targets, None, files or SimpleNamespace(), offload,
                    deadletters, app, producer, tasks, ownership, hooks=hooks)
    control = ControlLoop(metrics, replica, buffers, app, missing, tasks, ownership, rounds)
    ingest = Ingest(settings, metrics, replica, buffers, missing, decoder, deadletters, tables, app, ownership, tasks,
                    producer.send, rounds.maybe_write_early)
    w = SimpleNamespace(settings=settings, metrics=metrics, replica=replica, buffers=buffers, missing=missing,
                        targets=targets, app=app, producer=producer, hooks=hooks, failures=hooks.failures, tasks=tasks,
                        tables=tables, decoder=decoder, ownership=ownership, rounds=rounds, control=control,
                        ingest=ingest)
    hooks.parts = w
    buffers.claim(P, 1)
    buffers.resume(P, 0, now=0.0)
    return w


def batch(start: int, end: int) -> Fetched:
    return Fetched({P: [SimpleNamespace(
        topic=P.topic, partition=P.partition, offset=o, value=b'{"id": %d}' % o, timestamp=None, key=None, headers=(),
    ) for o in range(start, end)]}, time.monotonic())


def requests(w) -> list:
    return [ev for ev in w.producer.sent if isinstance(ev, CommitRequest)]


def test_full_buffers_pause_ask_once_and_stop_growing():
    w = make_parts(max_bytes=100)  # 8 bytes a row: full after 13 rows

    async def run():
        await w.ingest.on_fetch(batch(0, 20))
        assert w.replica.backpressure and w.buffers.full and w.buffers.rows == 20
        assert ("pause", [FP]) in w.app.consumer.calls
        assert len(requests(w)) == 1 and requests(w)[0].buffered_bytes == w.buffers.nbytes
        # Records still in flight after the pause are not taken: the buffers stay as they are.
        await w.ingest.on_fetch(batch(20, 40))
        assert w.buffers.rows == 20 and w.buffers.partitions[P].next_offset == 20
        assert len(requests(w)) == 1  # a repeat only after REQUEST_EVERY_S

    asyncio.run(run())
    assert w.metrics.early_commit_requests.labels(reason="full")._value.get() == 1
    assert w.metrics.paused_partitions._value.get() == 1


def test_a_round_resumes_where_the_buffer_ends_and_the_next_fill_asks_at_once():
    w = make_parts(max_bytes=100)

    async def run():
        await w.ingest.on_fetch(batch(0, 20))
        await w.ingest.on_fetch(batch(20, 40))  # skipped while paused
        w.buffers.take(1)  # a round takes the buffers (Rounds.respond) ...
        await w.ingest.release_backpressure()  # ... and releases them
        calls = w.app.consumer.calls
        # Seek back to the end of the buffer (records 20..39 were skipped, and Faust drops
        # the rest of a fetch for a partition paused mid-way) before resuming.
        assert calls[-2:] == [("seek", {FP: 20}), ("resume", [FP])]
        assert not w.replica.backpressure
        await w.ingest.on_fetch(batch(20, 40))
        assert w.buffers.rows == 20 and w.buffers.partitions[P].next_offset == 40
        # Full again within REQUEST_EVERY_S of the first request: asked at once. (It used to
        # be rate-limited; with partitions paused no batch came to ask again: stalled until
        # the commit interval.)
        assert w.replica.backpressure and len(requests(w)) == 2

    asyncio.run(run())


def test_housekeeping_asks_again_while_full_and_resumes_when_no_longer_full(monkeypatch):
    w = make_parts(max_bytes=100)

    async def run():
        await w.ingest.on_fetch(batch(0, 20))
        await w.ingest.check_backpressure()
        assert len(requests(w)) == 1  # too soon for a repeat
        monkeypatch.setattr(ingest_module, "REQUEST_EVERY_S", 0.0)
        await w.ingest.check_backpressure()
        assert len(requests(w)) == 2  # no round came: asked again though no batch arrives
        w.buffers.rewind(P)  # the buffers shrink without a round (rejected response)
        w.buffers.resume(P, 0, now=time.monotonic())
        await w.ingest.check_backpressure()
        assert not w.replica.backpressure and w.app.consumer.calls[-2:] == [("seek", {FP: 0}), ("resume", [FP])]

    asyncio.run(run())


def test_a_failed_seek_keeps_partitions_paused():
    w = make_parts(max_bytes=100)

    async def run():
        await w.ingest.on_fetch(batch(0, 20))
        w.buffers.take(1)
        w.app.consumer.fail_seek = True
        await w.ingest.release_backpressure()
        assert w.replica.backpressure and not any(c[0] == "resume" for c in w.app.consumer.calls)
        w.app.consumer.fail_seek = False
        await w.ingest.check_backpressure()  # housekeeping tries again
        assert not w.replica.backpressure and w.app.consumer.calls[-1] == ("resume", [FP])

    asyncio.run(run())


class AwaitingOffload:
    """Runs the offloaded call on the loop, awaiting what it returns if it is awaitable (the
    fake file writer's writes)."""

    async def run(self, fn, *args, **kwargs):
        out = fn(*args, **kwargs)
        return await out if asyncio.iscoroutine(out) else out


class Files:
    """A file writer (agents/file_writer.py) whose writes ``write`` answers."""

    def __init__(self, write) -> None:
        self.write = write
        self.warmed: list[bool] = []

    async def write_many(self, writes, target_file_size_bytes=None):
        return await self.write([data for _, data, _ in writes])

    def warm_up(self, idle) -> None:
        self.warmed.append(True)
        self.idle = idle


def early_writing_worker(write) -> SimpleNamespace:
    """A worker that writes early past 1 KiB through ``write`` (the Arrow tables of a write)."""
    settings = build({"topics": P.topic, "iceberg.tables": TABLE, "buffer.write-ahead-bytes": 1024})
    w = make_parts(max_bytes=10**9, settings=settings, files=Files(write), offload=AwaitingOffload())
    w.replica.generation = 1
    return w


def first_write_held() -> tuple[asyncio.Event, list[int], SimpleNamespace]:
    """An early-writing worker whose first write waits for the event; the rows of each write."""
    release = asyncio.Event()
    writes: list[int] = []

    async def write(tables):
        writes.append(sum(t.num_rows for t in tables))
        if len(writes) == 1:
            await release.wait()
        return [[] for _ in tables]

    return release, writes, early_writing_worker(write)


async def buffered_then_started(w: SimpleNamespace) -> None:
    """500 rows buffered before the group settled (no early write), then the session started."""
    w.replica.rebalanced = asyncio.Event()  # not set: on_fetch starts no early write itself
    await w.ingest.on_fetch(batch(0, 500))
    w.replica.rebalanced.set()
    w.rounds.spark_ready = asyncio.get_running_loop().create_future()
    w.rounds.spark_ready.set_result(None)


def test_an_early_write_cancelled_mid_way_gives_its_rows_back():
    """Stopping cancels an early write in flight: its rows go back to the buffers, so nothing
    is left staged and a round could still take them."""
    started = asyncio.Event()

    async def write_forever(tables):
        started.set()
        await asyncio.sleep(3600)

    w = early_writing_worker(write_forever)

    async def go():
        w.replica.rebalanced = asyncio.Event()  # not set: on_fetch starts no early write itself
        await w.ingest.on_fetch(batch(0, 500))
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
    written: list[int] = []

    async def write(tables):
        written.append(sum(t.num_rows for t in tables))
        return [[] for _ in tables]

    w = early_writing_worker(write)

    async def go():
        w.replica.rebalanced = asyncio.Event()
        w.replica.rebalanced.set()
        w.rounds.spark_ready = asyncio.get_running_loop().create_future()  # starting
        await w.ingest.on_fetch(batch(0, 500))
        assert not written and w.buffers.rows == 500  # no session yet: no early write
        w.rounds.spark_ready.set_result(None)
        await w.rounds.warm_up()
        deadline = time.monotonic() + 5
        while len(w.tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    asyncio.run(go())
    assert written == [500] and not w.rounds.files.warmed and not w.failures
    assert w.buffers.rows == 0 and w.buffers.written_rows == 500


def test_rows_past_the_mark_read_while_a_round_wrote_are_written_early_after_it():
    """A fetch that passes the write-ahead mark while a round holds the lock starts no early
    write; with the backlog read to its end no later fetch would, and the rows waited for the
    next round. The round's end looks again (as an early write's does)."""
    release, writes, w = first_write_held()

    async def go():
        await buffered_then_started(w)
        answer = asyncio.ensure_future(w.rounds.respond("c1"))
        while not writes:
            await asyncio.sleep(0.01)
        await w.ingest.on_fetch(batch(500, 1000))  # past the mark, but the round holds the lock
        assert not w.rounds.writing_early
        release.set()
        await answer
        deadline = time.monotonic() + 5
        while len(w.tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    asyncio.run(go())
    assert writes == [500, 500] and not w.failures
    assert w.buffers.rows == 0 and w.buffers.written_rows == 500


def test_the_warm_up_goes_on_only_while_no_rows_wait_for_a_write():
    """The JVM's warm-up asks, before each throw-away write after its first, whether rows wait
    for a write (spark_bridge/writer.py): a replica that started behind a backlog writes it
    rather than more throw-away rows."""
    settings = build({"topics": P.topic, "iceberg.tables": TABLE, "buffer.write-ahead-bytes": 10**9})
    w = make_parts(max_bytes=10**9, settings=settings, files=Files(None), offload=AwaitingOffload())
    w.replica.generation = 1

    async def go():
        w.replica.rebalanced = asyncio.Event()
        w.replica.rebalanced.set()
        w.rounds.spark_ready = asyncio.get_running_loop().create_future()
        w.rounds.spark_ready.set_result(None)
        await w.rounds.warm_up()
        assert w.rounds.files.warmed == [True] and w.rounds.files.idle()
        await w.ingest.on_fetch(batch(0, 5))  # below the write-ahead mark: buffered, not written
        assert w.buffers.rows == 5 and not w.rounds.files.idle()

    asyncio.run(go())


def test_a_round_that_waits_behind_an_early_write_says_how_long_in_its_answer(caplog):
    """A round that reaches the replica while an early write holds the lock is answered once
    that write is done: the answer's log line says how long the round waited before its take
    (bench/ingest_bench.py's timeline shows it; issue 42's first round of a backlog)."""
    release, writes, w = first_write_held()

    async def go():
        await buffered_then_started(w)
        early = asyncio.ensure_future(w.rounds._write_early())
        while not writes:
            await asyncio.sleep(0.01)
        await w.ingest.on_fetch(batch(500, 600))  # after the early write's stage: the round's
        answer = asyncio.ensure_future(w.rounds.respond("c1"))
        await asyncio.sleep(0.3)
        assert not answer.done()  # behind the early write
        release.set()
        await asyncio.gather(early, answer)

    caplog.set_level("INFO", logger="agents.rounds")
    asyncio.run(go())
    assert writes == [500, 100] and not w.failures
    answered = [r.getMessage() for r in caplog.records if "answered" in r.getMessage()]
    assert len(answered) == 1 and "600 rows in 0 files" in answered[0], answered
    waited = float(answered[0].rsplit("taken ", 1)[1].split(" s after")[0])
    assert 0.25 <= waited < 5, answered  # it came while the early write held the lock, 0.3 s before its release
