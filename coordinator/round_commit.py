"""Committing a round: every accepted response of the round to each of its tables (one snapshot
each, the first table alone, then the others at once), a CommitToTable per table, then the
CommitComplete (the checkpoint) and the coordinator group's offset. Failures are retried with
capped backoff; a table that keeps failing is parked (coordinator/parking.py). See docs/commits.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException

from coordinator.commit_processes import CommitProcesses
from coordinator.committer import Held, RoundCommit, TableCache, TableCommit, commit_table, round_tables
from coordinator.maintenance import MaintenanceSettings, TableLocks
from coordinator.mirror import MirrorIndexes, delete_keys_files
from coordinator.parking import ParkedTables
from coordinator.session import Session
from coordinator.state import Accepted, Checkpoint, checkpoint_event
from icesink.shared.config import Settings
from icesink.shared.errors import ControlLogError, FencedError, IcesinkError, is_retriable
from icesink.shared.faults import crash_point, hold_point, hold_point_blocking
from icesink.shared.metrics import Metrics
from icesink.shared.offload import Offload
from icesink.shared.protocol import CommitToTable, Event
from icesink.shared.retry import Backoff

log = logging.getLogger("coordinator.service")  # the name operators' log filters and bench/ingest_bench.py know

T = TypeVar("T")

RETRY_BASE_S = 0.5  # a failed commit is retried after 2 * RETRY_BASE_S, doubling up to RETRY_CAP_S
RETRY_CAP_S = 30.0


def retry_backoff() -> Backoff:
    """The backoff of a round's commit, a table's commit, and a schema update."""
    return Backoff(2 * RETRY_BASE_S, RETRY_CAP_S)


class Abandoned(IcesinkError):
    """A round's commit given up because the replica stops (:meth:`Coordinator.drain`): its
    accepted responses stay pending; the next coordinator rolls them forward."""

    retriable = True


class Sender(Protocol):
    """The control producer, as far as a round's commit needs it."""

    async def send(self, event: Event) -> int: ...


class Checkpointer(Protocol):
    """The coordinator's control reader, as far as a round's commit needs it: the group offset
    the CommitComplete is committed to, and the log's end (:meth:`RoundCommits.announce_held`)."""

    async def commit(self, offset: int) -> None: ...

    async def end_offset(self) -> int: ...


class Maintenance(Protocol):
    """What a round's commit tells the maintainer (coordinator/maintainer.py)."""

    def due(self, tables: Sequence[str], clear: Sequence[str] = ()) -> None: ...


class RoundCommits:
    """Commits the rounds the control loop (coordinator/service.py) closes, one at a time."""

    def __init__(
        self,
        settings: Settings,
        session: Session,
        producer: Sender,
        reader: Checkpointer,
        catalog: Catalog,
        offload: Offload,
        metrics: Metrics,
        maintainer: Maintenance,
        parked: ParkedTables,
        locks: TableLocks,
        tables: TableCache,
        mirrors: MirrorIndexes | None = None,
        processes: CommitProcesses | None = None,
    ) -> None:
        """``locks``, ``tables`` and ``mirrors`` are shared with the maintainer; ``processes``:
        the tables' commit processes (None: commits run on this process's threads)."""
        self.settings = settings
        self.session = session
        self.producer = producer
        self._reader = reader
        self.catalog = catalog
        self.offload = offload
        self.metrics = metrics
        self.group = settings.group_id
        self._maintainer = maintainer
        self._parked = parked
        self._locks = locks
        self._tables = tables
        self._mirrors = mirrors
        self._processes = processes
        self._commits = Offload(settings.table_commit_threads)  # a round's table commits run at once

    async def start(self) -> None:
        """Start the commit processes, if any."""
        if self._processes is not None:
            await self._commits.run(self._processes.start)

    def close(self) -> None:
        self._commits.close()
        if self._processes is not None:
            self._processes.close()


    async def commit(self, commit_id: str, partial: bool) -> None:
        """Commit every accepted response of the round to each of its tables, then announce
        it. The responses stay pending until all of that is done: any failure half-way
        (catalog, a control send, the group offset) is retried with capped backoff, and the
        tables that already hold the round skip it (their watermark), so no table ever
        misses data that a CommitComplete moved positions past. A table that keeps failing is
        parked (coordinator/parking.py): its part stays pending, the rest of the round ends.
        Fencing is not retried; a stop (:meth:`Coordinator.drain`) abandons the retries."""
        batch, cp = self.session.state.plan_commit()
        self.session.idle = False  # until this round's CommitComplete says otherwise
        if partial:
            self.metrics.rounds_partial.inc()
            log.info("round %s closed on the commit timeout; late responses join the next round", commit_id)
        vts = [a.valid_through_ms for a in batch]
        valid_through = None if (partial or not vts or None in vts) else min(v for v in vts if v is not None)
        backoff = retry_backoff()
        while True:
            try:
                results = await self.commit_round(commit_id, batch, cp, valid_through)
                break
            except (FencedError, Abandoned) as exc:
                if isinstance(exc, FencedError):
                    self.session.status["phase"] = "fenced"
                raise
            except Exception as exc:  # noqa: BLE001 - retried; never dropped
                delay = backoff.next()
                attempt = backoff.attempts
                self.metrics.round_failures.inc()
                if not is_retriable(exc):  # no retry mends it: stop this coordinator loudly, round pending
                    self.session.status.update(phase="round-failed", round=commit_id, error=f"{type(exc).__name__}: {exc}",
                                       attempt=attempt, retriable=False)
                    log.error("round %s not finished (%s: %s), which no retry mends: stopping the coordinator; "
                              "its %d accepted responses stay pending", commit_id, type(exc).__name__, exc, len(batch))
                    raise
                self.session.status.update(phase="round-retrying", round=commit_id, error=f"{type(exc).__name__}: {exc}",
                                           attempt=attempt)
                log.error(
                    "round %s not finished (attempt %d, %s: %s); its %d accepted responses stay pending, retrying in %.1fs",
                    commit_id, attempt, type(exc).__name__, exc, len(batch), delay,
                )
                await self._backoff(delay)
        parked = self._parked.names()
        self.session.state.committed(batch, held=parked)
        self._parked.show(self.session.state.pending)
        done = [t for t in results if t not in parked]
        self._maintainer.due(sorted(t for t in {t for a in batch for t in (*a.files, *a.deleted_keys)} if t not in parked),
                             clear=[t for t in done if results[t].maintenance_due is False])
        keys_files = {t: [f.path for a in batch for f in a.deleted_keys.get(t, ())]
                      for t in {t for a in batch for t, fs in a.deleted_keys.items() if fs} - parked}
        if keys_files:  # consumed by the round's commit, never part of a snapshot
            await self.offload.run(delete_keys_files, self.catalog, keys_files)
        if backoff.attempts:
            self.session.status.update(phase="running", error=None)
            log.info("round %s finished after %d failed attempts", commit_id, backoff.attempts)

    async def _backoff(self, delay: float) -> None:
        """Sleep ``delay`` before a retry; a stop (:meth:`Coordinator.drain`) ends it and abandons the round."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.session.draining.wait(), delay)
        if self.session.draining.is_set():
            raise Abandoned("the replica is stopping")

    async def commit_round(
        self, commit_id: str, batch: list[Accepted], cp: Checkpoint, valid_through: int | None,
    ) -> dict[str, TableCommit]:
        """The first table alone, then the others at once (iceberg.control.commit.threads at a
        time; one snapshot each; parked tables last). Each is announced by a CommitToTable once it holds the round;
        the CommitComplete goes out only when all of them do or are parked (a parked table not
        due for a try is left out). Returns each table's commit."""
        tables = sorted({t for a in batch for t in a.files})
        now = time.monotonic()
        due = sorted((t for t in tables if self._parked.due(t, now)), key=lambda t: t in self._parked)  # healthy first
        round = RoundCommit(self.group, self.session.epoch, commit_id, cp.positions, valid_through_ms=valid_through,
                            checkpoint=cp, log_id=self.session.log_id, adopted=self.session.adopted,
                            tables_of_round=round_tables(batch), branches=self.settings.commit_branches)
        results: dict[str, TableCommit] = {}

        async def commit_and_announce(table: str) -> None:
            result = await self.commit_table_with_retry(table, batch, round)
            if result is None:  # parked
                return
            results[table] = result
            await hold_point(self.settings, "coordinator.after-table-commit")
            await self.announce_held(table, result.held)
            if result.snapshot_id is not None:
                await self.producer.send(CommitToTable(
                    self.session.epoch, commit_id, table, result.snapshot_id, result.files, result.records,
                    result.watermark,
                ))
                self.session.state.announced(table, result.watermark)

        if due:
            crash_point(self.settings, "coordinator.before-table-commit")  # accepted, no table holds it
            await commit_and_announce(due[0])
        if due[1:]:
            crash_point(self.settings, "coordinator.between-table-commits")
            await _all_unless_fenced([commit_and_announce(t) for t in due[1:]])
        held = self._parked.checkpoint(cp, self.session.last_cp)
        if held is cp:
            self.session.last_cp = cp
        else:
            valid_through = None  # not every table holds what the round's data promises
            log.warning("round %s: table(s) %s parked; its CommitComplete keeps the checkpoint at control offset %d",
                        commit_id, ", ".join(sorted(self._parked.names())), held.through)
        done = checkpoint_event(self.session.epoch, commit_id, held, valid_through)
        offset = await self.producer.send(done)
        self.session.idle, self.session.last_complete = done.idle_after(self.session.last_complete), done
        await self._reader.commit(offset)
        self.metrics.rounds_committed.inc()
        self.metrics.last_round_committed.set(time.time())
        if self.session.round_started_at is not None:
            self.metrics.round_duration.observe(time.monotonic() - self.session.round_started_at)
        self.session.status.update(last_commit_id=commit_id, last_commit_at=time.time(), checkpoint=offset)
        if self._processes is not None:
            self.session.status["commit_processes"] = self._processes.pids()
        return results

    async def announce_held(self, table: str, held: Held | None) -> None:
        """The CommitToTable of a round ``table`` already held when its commit looked (an
        earlier attempt, or a coordinator that stopped between the commit and its
        announcement), unless the log has it."""
        if held is None or self.session.state.announced_through(table) >= held.watermark:
            return
        if self.session.loop_running:  # a send that failed may have landed all the same: read the log up to its end first
            await asyncio.wait_for(self._caught_up(), RETRY_CAP_S)
            if self.session.state.announced_through(table) >= held.watermark:
                return
        log.warning("table %s holds round %s (snapshot %s) that was never announced (its coordinator stopped or "
                    "failed between the commit and its CommitToTable): announcing it", table, held.commit_id,
                    held.snapshot_id)
        await self.producer.send(CommitToTable(self.session.epoch, held.commit_id, table, held.snapshot_id, held.files,
                                               held.records, held.watermark))
        self.session.state.announced(table, held.watermark)
        self.metrics.commits_announced_late.inc()

    async def _caught_up(self) -> None:
        """Until the loop has applied every control event up to the log's end as of now."""
        end = await self._reader.end_offset()
        while self.session.applied_next < end:
            await asyncio.sleep(0.05)

    async def commit_table_with_retry(self, table: str, batch: list[Accepted], round: RoundCommit) -> TableCommit | None:
        """The table's commit, retried with capped backoff; None once it is parked: it failed
        for ``iceberg.control.commit.park-after-ms`` (a parked table gets one attempt)."""
        backoff = retry_backoff()
        began: list[float] = []  # when each attempt began on a commit thread
        failing_since: float | None = None
        park_after = self.settings.commit_park_after_ms / 1000
        commit_id, valid_through = round.commit_id, round.valid_through_ms
        commit, head, here = (  # on this replica's threads, or in the table's commit process
            (commit_table, (self.catalog, table, batch), {"mirrors": self._mirrors, "tables": self._tables})
            if self._processes is None else (self._processes.commit, (table, batch), {}))
        if IN_TABLE_COMMIT in self.settings.fault_hold_at:  # fault tests: held once the commit went through
            commit = _holding_after(commit, self.settings)
        while True:
            try:
                result: TableCommit
                result, ended = await self._commits.run(
                    _committing, self._locks.of(table), began, commit, *head, round, **here)
            except FencedError:
                self.session.status["phase"] = "fenced"
                raise
            except ControlLogError as exc:  # keep the accepted files pending; say so; retry
                backoff.next()  # counted; the wait is the longest at once
                self.metrics.control_log_refused.set(1)
                self.session.status.update(phase="refused", table=table, error=str(exc), attempt=backoff.attempts)
                log.error("coordinator refuses to commit round %s to %s: %s", commit_id, table, exc)
                await self._backoff(RETRY_CAP_S)
                continue
            except Exception as exc:  # conflict, catalog down: retry, never drop accepted files
                delay = backoff.next()
                attempt = backoff.attempts
                kind = "conflict" if isinstance(exc, CommitFailedException) else type(exc).__name__
                self.metrics.commit_failures.labels(table=table).inc()
                if not is_retriable(exc):  # e.g. a sink state no reader can parse: the round stops (_commit)
                    self.session.status.update(phase="commit-failed", table=table, error=f"{kind}: {exc}", attempt=attempt,
                                       retriable=False)
                    log.error("commit of round %s to %s failed (%s: %s), which no retry mends", commit_id, table,
                              kind, exc)
                    raise
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if table in self._parked or now - failing_since >= park_after:
                    self._parked.park(table, f"{kind}: {exc}", now - failing_since)
                    if self.session.draining.is_set():
                        raise Abandoned("the replica is stopping") from exc
                    return None
                delay = min(delay, park_after - (now - failing_since))
                self.metrics.commit_retrying.labels(table=table).set(1)
                self.session.status.update(phase="commit-retrying", table=table, error=f"{kind}: {exc}", attempt=attempt)
                log.warning(
                    "commit of round %s to %s failed (attempt %d, %s: %s); retrying in %.1fs",
                    commit_id, table, attempt, kind, exc, delay,
                )
                await self._backoff(delay)
                continue
            self.metrics.commit_retrying.labels(table=table).set(0)
            self.metrics.commit_failures.labels(table=table)  # the series exists (at 0) once the table commits
            self.metrics.table_parked.labels(table=table).set(0)
            self.metrics.control_log_refused.set(0)
            self.session.status.update(phase="running", error=None)
            if table in self._parked:
                self._parked.resume(table)
            # From the first attempt, retries included; not the round's wait for a commit thread,
            # nor, timed by its commit process, the wait behind that process's other commits.
            took = result.duration_s if backoff.attempts == 0 and result.duration_s is not None else ended - began[0]
            self.metrics.commit_duration.labels(table=table).observe(took)
            if result.snapshot_id is not None:
                self.metrics.snapshots_committed.labels(table=table).inc()
                self.metrics.rows_committed.labels(table=table).inc(result.records)
                if valid_through is not None:
                    self.metrics.valid_through.labels(table=table).set(valid_through / 1000)
                log.info(
                    "round %s committed to %s: snapshot %s, %d files, %d rows",
                    commit_id, table, result.snapshot_id, result.files, result.records,
                )
            return result

def commit_processes(settings: Settings, compaction: bool = False) -> CommitProcesses | None:
    """The commit processes of ``iceberg.control.commit.processes`` (None: 0, or a sink that
    makes mirror tables, whose key indexes live in this process: coordinator/commit_processes.py)."""
    if not settings.commit_processes:
        return None
    if settings.mirror:
        log.warning("iceberg.control.commit.processes=%d ignored: mirror tables keep their key indexes in the "
                    "coordinator, so their commits run on its threads", settings.commit_processes)
        return None
    return CommitProcesses(settings, settings.commit_processes, MaintenanceSettings.of(settings), compaction)


IN_TABLE_COMMIT = "coordinator.in-table-commit"


def _holding_after(commit: Callable[..., T], settings: Settings) -> Callable[..., T]:
    """``commit``, then ``fault.hold-at=coordinator.in-table-commit`` in the commit thread: the
    table holds the round, the coordinator has not heard of it yet."""
    def held(*args: Any, **kwargs: Any) -> T:
        out = commit(*args, **kwargs)
        hold_point_blocking(settings, IN_TABLE_COMMIT)
        return out
    return held


def _committing(lock: threading.Lock, began: list[float], fn: Callable[..., T], *args: Any,
                **kwargs: Any) -> tuple[T, float]:
    """``fn`` (a table commit) under the table's lock: notes in ``began`` when it began and
    returns with its result when it ended, both on this thread's clock (:data:`_now`), so a
    table's commit duration leaves out the wait for a commit thread: the last of a round's 200
    tables on four threads waited for 199 others."""
    with lock:
        began.append(_now())
        out = fn(*args, **kwargs)
        return out, _now()


#: The clock of commit durations (a test replaces it).
_now: Callable[[], float] = time.monotonic


async def _all_unless_fenced(coros: list[Coroutine[Any, Any, None]]) -> None:
    """Run ``coros`` at once and wait for every one of them (a commit that went through is
    announced even when another failed), then raise the first failure. Fencing stops the
    others at once: a newer coordinator owns the group."""
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        pending: set[asyncio.Task[None]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                exc = None if task.cancelled() else task.exception()
                if isinstance(exc, FencedError):
                    raise exc
        for task in tasks:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
