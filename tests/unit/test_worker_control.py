"""A worker's control loop and background tasks (agents/tasks.py): Resume, StartCommit and
Rewind from an older coordinator epoch are ignored; a background task that fails stops the
replica (exit code 1) instead of dying unnoticed; a coordinator that keeps failing is not
restarted for ever."""

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from types import SimpleNamespace

from agents import tasks
from agents.buffer import Buffers
from agents.control_loop import ControlLoop
from agents.missing import MissingTables
from agents.parts import Replica
from agents.tasks import TaskOwner, supervise_coordinator, unless_moved
from agents.worker import Worker
from icesink.app.files import spark_files
from icesink.shared.config import build
from icesink.shared.protocol import CommitComplete, CommitToTable, Position, Resume, Rewind, StartCommit, TopicPartition
from icesink.shared.metrics import Metrics

A = TopicPartition("t", 0)


class Reader:
    """Hands out the given batches, then waits for ever (as a quiet control topic does)."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.drained = asyncio.Event()

    async def read(self, timeout_s):
        if self.batches:
            batch = self.batches.pop(0)
            if isinstance(batch, Exception):
                raise batch
            return batch
        self.drained.set()
        await asyncio.Event().wait()


def make_worker(tmp_path):
    settings = build({"topics": "t", "iceberg.tables": "db.t", "state.dir": str(tmp_path)})
    w = Worker(settings, "127.0.0.1:1", Metrics(CollectorRegistry()), files=spark_files)
    w.build_parts()  # as run() does once it has asked to join the group
    w.stops = []
    w.request_stop = lambda: w.stops.append(True)
    return w


class Calls:
    """Partition ownership and the round responder as the control loop sees them: each call noted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    async def on_resume(self, ev):
        self.calls.append(("resume", ev.epoch))

    async def on_rewind(self, ev):
        self.calls.append(("rewind", ev.epoch))

    async def respond(self, commit_id):
        self.calls.append(("respond", commit_id))


def control_loop(metrics: Metrics) -> tuple[ControlLoop, Calls]:
    """A control loop (agents/control_loop.py) whose ownership and responder note their calls."""
    calls = Calls()
    loop = ControlLoop(metrics, Replica("w1", {}), Buffers(1 << 20), SimpleNamespace(), MissingTables(),
                       TaskOwner(lambda exc: None), calls, calls)
    return loop, calls


async def drive(control, batches):
    """Run a control loop as the worker's run() starts it, until the reader is drained."""
    reader = Reader(batches)
    loop = asyncio.create_task(control.run(reader))
    _done, _ = await asyncio.wait([loop, asyncio.create_task(reader.drained.wait())], return_when=asyncio.FIRST_COMPLETED)
    for _ in range(5):
        await asyncio.sleep(0)  # let spawned handlers run
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)


def stale(metrics, tag):
    return metrics.registry.get_sample_value("icesink_control_events_stale_total", {"type": tag}) or 0


def test_resume_start_commit_and_rewind_of_an_older_epoch_are_ignored(caplog):
    metrics = Metrics(CollectorRegistry())
    control, calls = control_loop(metrics)

    async def go():
        events = [
            StartCommit(5, "r5"),
            Resume(4, "w1", 1, (Position(A, 3),)),   # the replaced coordinator's answers
            StartCommit(4, "r4"),
            Rewind(4, "w1", (A,), "old"),
            CommitToTable(4, "r4", "db.t", 1, 1, 1, 0),  # not obeyed, only tracked
            CommitComplete(4, "r4", 9, ()),              # a hint, handled whatever its epoch
            Resume(5, "w1", 1, (Position(A, 3),)),
            Rewind(6, "w1", (A,), "new"),
            StartCommit(5, "late"),                       # 6 seen meanwhile
        ]
        await drive(control, [list(enumerate(events))])

    with caplog.at_level(logging.INFO, logger="agents.tasks"):
        asyncio.run(go())
    assert sorted(calls.calls) == sorted([("respond", "r5"), ("resume", 5), ("rewind", 6)])
    assert control.replica.status["last_commit_id"] == "r4"  # the CommitComplete of epoch 4, handled
    assert control.open_round == "r5"
    assert (stale(metrics, "resume"), stale(metrics, "start-commit"), stale(metrics, "rewind")) == (1, 2, 1)
    assert "control offset 1: resume of coordinator epoch 4 ignored: epoch 5 seen already" in caplog.text


def test_a_handler_task_that_fails_stops_the_replica_with_exit_code_1(tmp_path):
    async def go():
        w = make_worker(tmp_path)

        async def respond(commit_id):
            raise RuntimeError("control send failed half-way")

        w.rounds.respond = respond  # the worker's control loop answers rounds through it
        await drive(w.control, [[(0, StartCommit(1, "r1"))]])
        return w

    w = asyncio.run(go())
    assert w.stops and w.exit_code == 1
    assert "control send failed half-way" in w.status["error"]


def test_a_control_loop_that_fails_stops_the_replica(tmp_path):
    async def go():
        w = make_worker(tmp_path)
        w.reader = Reader([UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")])
        w._owner.spawn(w.control.run(w.reader), "control")  # as run() starts it
        for _ in range(5):
            await asyncio.sleep(0)
        await w._owner.close()
        return w

    w = asyncio.run(go())
    assert w.stops and w.exit_code == 1 and "invalid start byte" in w.status["error"]


def test_tasks_cancelled_on_stop_are_not_failures():
    failures = []

    async def go():
        owner = TaskOwner(failures.append)

        async def forever():
            await asyncio.Event().wait()

        async def fails_when_cancelled():
            try:
                await asyncio.Event().wait()
            finally:
                raise RuntimeError("cleanup failed")

        owner.spawn(forever(), "a")
        owner.spawn(fails_when_cancelled(), "b")
        await asyncio.sleep(0)
        await owner.close()
        return len(owner)

    assert asyncio.run(go()) == 0 and failures == []


def test_closing_the_owner_is_bounded_by_the_shutdown_deadline(caplog):
    """A task that does not yield to its cancellation (a blocking step finishing first) cannot
    hold the replica's stop past its deadline: the owner names it and returns."""
    async def go():
        owner = TaskOwner(lambda exc: None)
        release = asyncio.Event()

        async def stubborn():
            while not release.is_set():
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    continue  # swallows the cancellation
            return None

        owner.spawn(stubborn(), "stubborn-step")
        await asyncio.sleep(0)
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(owner.close(timeout_s=0.2), 5)
        took = asyncio.get_running_loop().time() - started
        release.set()
        return took

    assert asyncio.run(go()) < 2
    assert "stubborn-step" in caplog.text


def test_a_coordinator_that_keeps_failing_is_restarted_with_a_backoff_then_raised():
    metrics = Metrics(CollectorRegistry())
    delays = []
    runs = []

    async def run():
        runs.append(1)
        raise RuntimeError("deterministic bug")

    async def sleep(s):
        delays.append(s)

    with pytest.raises(RuntimeError, match="deterministic bug"):
        asyncio.run(supervise_coordinator(run, metrics, sleep=sleep))
    assert len(runs) == tasks.COORDINATOR_FAILURES
    assert delays == [2, 4, 8, 16, 30, 30, 30, 30, 30]
    assert metrics.registry.get_sample_value("icesink_coordinator_restarts_total") == tasks.COORDINATOR_FAILURES - 1


def test_a_coordinator_that_recovers_is_not_given_up(monkeypatch):
    metrics = Metrics(CollectorRegistry())
    clock = [0.0]
    monkeypatch.setattr(tasks.time, "monotonic", lambda: clock[0])
    outcomes = iter([RuntimeError("catalog down")] * 9 + ["ran long"] + [RuntimeError("again")] * 3 + [None])

    async def run():
        out = next(outcomes)
        if out == "ran long":
            clock[0] += tasks.COORDINATOR_STABLE_S
            raise RuntimeError("broker gone after a long run")
        if out is not None:
            raise out

    async def sleep(s):
        pass

    asyncio.run(supervise_coordinator(run, metrics, sleep=sleep))  # returns: fenced or stopped
    assert metrics.registry.get_sample_value("icesink_coordinator_restarts_total") == 13


def test_a_seek_that_fails_after_the_partition_moved_is_not_an_error():
    async def fails():
        raise RuntimeError("IllegalStateError: no current assignment")

    assert asyncio.run(unless_moved(fails(), lambda: False, "seek of t[0]")) is False
    with pytest.raises(RuntimeError):
        asyncio.run(unless_moved(fails(), lambda: True, "seek of t[0]"))


def test_the_high_watermark_of_a_partition_a_rebalance_just_took_is_unknown_not_an_error():
    from agents.tasks import highwater

    class Consumer:
        def highwater(self, tp):
            assert tp.partition == 0, "Partition is not assigned"  # as aiokafka does
            return 42

    assert highwater(Consumer(), "t", 0) == 42
    assert highwater(Consumer(), "t", 1) is None


def test_a_round_met_by_a_catalog_outage_is_not_answered_and_the_replica_goes_on(tmp_path):
    async def go():
        w = make_worker(tmp_path)
        w.replica.rebalanced.set()
        w.rounds.spark_ready = asyncio.get_running_loop().create_future()
        w.rounds.spark_ready.set_result(None)

        async def evolution_ready():
            raise ConnectionError("catalog unreachable")

        w.evolution_ready = evolution_ready  # the round responder's hook
        await w.rounds.respond("r1")
        return w

    w = asyncio.run(go())
    assert not w.stops and w.exit_code == 0


def _worker_with_a_buffered_round(tmp_path, error):
    """A worker holding one buffered chunk whose Spark write raises ``error``."""
    import pyarrow as pa

    from agents.buffer import Chunk
    from icesink.shared.protocol import TopicPartition

    w = make_worker(tmp_path)
    tp = TopicPartition("t", 0)
    w.replica.generation = 1
    w.buffers.claim(tp, 1)
    w.buffers.resume(tp, 0, now=0.0)
    rows = pa.table({"id": [1, 2]})
    w.buffers.add(Chunk(tp, 2, {"db.t": rows}, rows.nbytes, 2), 0, None)
    w.rounds.targets = w.targets = {"db.t": type("Target", (), {"table": object(), "keys": None, "arrow_schema": rows.schema})()}
    w.replica.rebalanced.set()

    class Spark:
        def write_many(self, *a, **k):
            raise error

    w.rounds.files = Spark()
    # The app's consumer is not started here: its high watermarks, asked at the take, are unknown.
    w.rounds.app = SimpleNamespace(consumer=SimpleNamespace(highwater=lambda tp: None))
    return w


def test_a_write_error_no_retry_mends_stops_the_replica_loudly_with_the_data_kept(tmp_path):
    """Retry loops branch on ``retriable``: a Spark failure is retried with the next round; a
    column no writer can write would fail every round, so the replica stops (exit code 2)
    instead of holding its partitions for ever. Nothing was reported: the data stays."""
    from icesink.shared.errors import SparkWriteError, UnsupportedTypeError

    async def go(error):
        w = _worker_with_a_buffered_round(tmp_path, error)
        w.rounds.spark_ready = asyncio.get_running_loop().create_future()
        w.rounds.spark_ready.set_result(None)
        await w.rounds.respond("r1")
        return w

    w = asyncio.run(go(SparkWriteError("executor lost")))
    assert not w.stops and w.exit_code == 0 and w.buffers.rows == 2
    w = asyncio.run(go(UnsupportedTypeError("v", "interval", "Spark cannot write", "the Iceberg types", "drop it")))
    assert w.stops and w.exit_code == 2 and w.buffers.rows == 2
    assert "field 'v'" in w.status["error"]


def test_a_stopping_replica_never_starts_a_second_coordinator(tmp_path):
    """A graceful stop drains the coordinator (half of shutdown.timeout-ms); the housekeeping
    and the rebalance handler that supervise it meanwhile must not start a new one, and a
    coordinator run that fails during the stop is not restarted."""
    w = make_worker(tmp_path)
    made, draining, release = [], asyncio.Event(), asyncio.Event()

    class Leader:
        def __init__(self, *a, **k):
            self.status = {}
            made.append(self)

        async def run(self):
            await asyncio.Event().wait()

        async def drain(self, timeout_s):
            draining.set()
            await release.wait()

    w._leader = Leader
    w.app.is_leader = lambda: True
    w.producer = w.catalog = None

    async def go():
        await w.supervise_coordinator()
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(made) == 1
        w._stop.set()  # request_stop, as SIGTERM does
        stopping = asyncio.create_task(w._stop_coordinator(drain=True))
        await draining.wait()
        await w.supervise_coordinator()  # the housekeeping's tick during the drain
        for _ in range(5):
            await asyncio.sleep(0)
        release.set()
        await stopping
        await w._owner.close(1.0)

    asyncio.run(go())
    assert len(made) == 1, f"{len(made)} coordinators started by a stopping replica"

    runs = []

    async def failing():
        runs.append(1)
        raise RuntimeError("broker gone while the replica stops")

    async def sleep(s):
        pass

    asyncio.run(supervise_coordinator(failing, Metrics(CollectorRegistry()), sleep=sleep, stopping=lambda: True))
    assert runs == [1], "a coordinator restarted while the replica stops"


def test_a_fenced_coordinator_is_replaced_while_the_replica_still_leads_and_not_once_it_does_not(tmp_path):
    """A coordinator stopped by a newer epoch (agents/worker.py _run_coordinator): if the replica
    still leads the group a session timeout later, its coordinator was the stale one and a new one
    starts (recovering with an epoch above every one seen); if the lead moved, none does (and
    the rebalance handler would have stopped it)."""
    assert coordinators_after_a_fence(tmp_path, leads=True) == (2, 1)
    assert coordinators_after_a_fence(tmp_path, leads=False) == (1, 0)


def coordinators_after_a_fence(tmp_path, leads: bool) -> tuple[int, float]:
    """Coordinators made and restarts counted when the first one is fenced."""
    from icesink.shared.errors import FencedError

    w = make_worker(tmp_path)
    w.settings = w.settings.model_copy(update={"session_timeout_ms": 1000})
    made = []

    class Leader:
        def __init__(self, *a, **k):
            self.status = {}
            made.append(self)

        async def run(self):
            if len(made) == 1:
                raise FencedError("coordinator epoch 1: control offset 51 is of epoch 2")

    w._leader = Leader
    w.app.is_leader = lambda: leads
    w.producer = w.catalog = None
    asyncio.run(asyncio.wait_for(w._run_coordinator(), 10))
    return len(made), w.metrics.registry.get_sample_value("icesink_coordinator_restarts_total")
