"""Owners for a worker's background tasks and its coordinator, and the epoch gate of its
control loop. No task dies unnoticed: one that fails with an unexpected exception is logged
with its traceback and stops the replica (``on_failure``: Worker.fail, exit code 1); the
owner cancels and awaits the rest on stop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from faust.types import TP

from icesink.shared.protocol import CommitComplete, CommitToTable, Event, Resume, Rewind, StartCommit
from icesink.shared.metrics import Metrics
from icesink.shared.retry import Backoff

log = logging.getLogger(__name__)

# A coordinator that fails is restarted after a backoff (2 s doubling to 30 s); after this many
# failures in a row (each within COORDINATOR_STABLE_S of its start, about 3.5 min in all) the
# replica stops with exit code 1 instead of crash-looping for ever.
COORDINATOR_FAILURES = 10
COORDINATOR_STABLE_S = 60.0
COORDINATOR_BACKOFF_S = (2.0, 30.0)  # first, cap


class TaskOwner:
    def __init__(self, on_failure: Callable[[Exception], None]) -> None:
        self._on_failure = on_failure
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if self._closing:
            log.warning("background task %s failed while stopping: %r", task.get_name(), exc)
            return
        log.error("background task %s failed; stopping the replica", task.get_name(), exc_info=exc)
        self._on_failure(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))

    async def close(self, timeout_s: float | None = None) -> None:
        """Cancel every task and wait for them, at most ``timeout_s`` (the replica's shutdown
        deadline; failures now are logged, not escalated). Tasks still running then (a step
        that does not yield to its cancellation) are named in the log and left to the process
        exit that follows."""
        self._closing = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        if pending:
            log.error("background tasks still running %.1fs after they were cancelled: %s", timeout_s or 0.0,
                      ", ".join(sorted(t.get_name() for t in pending)))

    def __len__(self) -> int:
        return len(self._tasks)


async def supervise_coordinator(
    run: Callable[[], Awaitable[None]], metrics: Metrics, *, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Run a coordinator (``run`` makes a new one each time), restarting it with a backoff
    after an unexpected error. Raises the last error after COORDINATOR_FAILURES quick failures
    in a row: its task owner then stops the replica (a crash loop is never silent). Once
    ``stopping()`` (the replica stops) an error is logged and no new coordinator starts."""
    backoff = Backoff(*COORDINATOR_BACKOFF_S)  # counts the failures in a row
    while True:
        started = time.monotonic()
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            if time.monotonic() - started >= COORDINATOR_STABLE_S:
                backoff.reset()  # it ran a while: a new count of failures in a row
            delay = backoff.next()
            failures = backoff.attempts
            if stopping():  # logged, not escalated: the stop is under way already
                log.error("coordinator failed while the replica stops; not restarted (what it had not committed "
                          "is committed after the next start)", exc_info=True)
                return
            if failures >= COORDINATOR_FAILURES:
                log.error("coordinator failed %d times in a row; giving up", failures)
                raise
            metrics.coordinator_restarts.inc()
            log.exception("coordinator failed (%d in a row); restarting it in %.0fs", failures, delay)
            await sleep(delay)


async def unless_moved(step: Awaitable[None], owned: Callable[[], bool], what: str) -> bool:
    """Await a step on a partition (a seek); False if it failed after the partition moved away
    meanwhile (a rebalance: the consumer refuses seeks of partitions it lost), which is
    expected, not an error. A failure while the partition is still owned is raised."""
    try:
        await step
        return True
    except Exception as exc:
        if owned():
            raise
        log.info("%s skipped, the partition moved meanwhile (%s)", what, exc)
        return False


def highwater(consumer: Any, topic: str, partition: int) -> int | None:
    """A partition's high watermark; None if unknown, or if a rebalance in the consumer's
    thread took the partition before this loop heard of it (aiokafka asserts it is assigned)."""
    try:
        hw: int | None = consumer.highwater(TP(topic, partition))
        return hw
    except AssertionError:
        return None


def unread_since_ms(partitions: Mapping[Any, Any], consumer: Any) -> int | None:
    """The oldest last-record time (ms; 0 if unknown) of an active partition whose buffer ends
    before its high watermark (records left to read), or None when every active partition is
    read to its end (a partition without a fetch yet counts as read)."""
    out: int | None = None
    for tp, st in partitions.items():
        if st.active:
            hw = highwater(consumer, tp.topic, tp.partition)
            if hw is not None and st.next_offset < hw:
                out = min(out, st.last_record_ms or 0) if out is not None else st.last_record_ms or 0
    return out


class BacklogHold:
    """Which partitions a round leaves their data to a later one (``iceberg.control.commit.catch-up``,
    agents/rounds.py): one reading a backlog (records left before its high watermark, the newest
    read over ``behind_ms`` old) whose oldest data not in a round was buffered less than one
    commit interval ago. Its rows then go with the round the backlog's end asks for, in fewer
    and larger files, and never wait over one interval more than without the hold. ``held``:
    the partitions it held that had data."""

    def __init__(self, consumer: Any, now_s: float, interval_s: float, behind_ms: int) -> None:
        self._consumer = consumer
        self._now_s = now_s
        self._interval_s = interval_s
        self._behind_ms = behind_ms
        self.held: list[Any] = []

    def __call__(self, st: Any) -> bool:
        hw = highwater(self._consumer, st.tp.topic, st.tp.partition)
        if hw is None or st.next_offset >= hw or self._now_s * 1000 - (st.last_record_ms or 0) <= self._behind_ms:
            return False  # read to its end, or a steady stream's records in flight
        oldest = min([c.at for c in st.chunks] + [w.at for w in st.written], default=None)
        if oldest is None or self._now_s - oldest >= self._interval_s:
            return False
        self.held.append(st.tp)
        return True


class EpochGate:
    """The newest coordinator epoch a worker has seen (from StartCommit, Resume, Rewind,
    CommitToTable, CommitComplete). Resume, StartCommit and Rewind from an older epoch come
    from a coordinator that was replaced: ignored, logged and counted."""

    OBEYED = (Resume, StartCommit, Rewind)

    def __init__(self, metrics: Metrics) -> None:
        self.newest = 0
        self._metrics = metrics

    def admit(self, offset: int, event: Event) -> bool:
        if not isinstance(event, (Resume, StartCommit, Rewind, CommitToTable, CommitComplete)):
            return True
        if event.epoch >= self.newest:
            self.newest = event.epoch
            return True
        if not isinstance(event, self.OBEYED):
            return True
        self._metrics.control_events_stale.labels(type=event.TYPE).inc()
        log.info("control offset %d: %s of coordinator epoch %d ignored: epoch %d seen already",
                 offset, event.TYPE, event.epoch, self.newest)
        return False
