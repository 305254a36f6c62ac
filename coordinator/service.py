"""The coordinator: owns every Iceberg commit of a sink group. Runs on the Faust leader only.

Loop: read control events in log order into :class:`CoordinatorState`; answer claims; start a
round every commit interval (or early on request); close it when every owned partition has
answered or on the commit timeout; commit each touched table once; send CommitToTable per
table and CommitComplete (the checkpoint). See docs/commits.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition as KafkaTP
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError

from coordinator.commit_processes import CommitProcesses
from coordinator.committer import Held, RoundCommit, TableCache, TableCommit, commit_table, held_commit, round_tables
from coordinator.evolution import apply_proposals, describe_changes
from coordinator.files import TableRoots, delete_uncommitted
from coordinator.gc import in_flight_files, normalize
from coordinator.log_floor import GuardedTruncation
from coordinator.maintainer import Maintainer
from coordinator.maintenance import MaintenanceSettings, Rewriter, TableLocks
from coordinator.mirror import MirrorIndexes, delete_keys_files
from coordinator.parking import ParkedTables
from coordinator.recovery import Base, adopt_states, check_log_identity, from_tables, table_positions
from coordinator.state import Accepted, Checkpoint, CoordinatorState, TableFile, checkpoint_event, next_epoch
from icesink.shared.config import Settings
from icesink.shared.control import ControlLogTruncator, ControlProducer, ControlReader
from icesink.shared.errors import ControlLogError, FencedError, IcesinkError, is_retriable
from icesink.shared.protocol import (
    Claim,
    CommitComplete,
    CommitToTable,
    DataWritten,
    Event,
    Position,
    Resume,
    Rewind,
    StartCommit,
    TopicPartition,
)
from icesink.shared.faults import crash_point, hold_point, hold_point_blocking
from icesink.shared.iceberg import latest_sink_summary
from icesink.shared.protocol import SinkState
from icesink.shared.kafka_admin import end_offsets, partition_counts, topic_id
from icesink.shared.metrics import Metrics
from icesink.shared.offload import Offload
from icesink.shared.retry import Backoff

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_BASE_S = 0.5  # a failed commit is retried after 2 * RETRY_BASE_S, doubling up to RETRY_CAP_S
RETRY_CAP_S = 30.0
SCHEMA_ATTEMPTS = 3  # per round; then the proposals wait for the next round


def retry_backoff() -> Backoff:
    """The backoff of a round's commit, a table's commit, and a schema update."""
    return Backoff(2 * RETRY_BASE_S, RETRY_CAP_S)


class Abandoned(IcesinkError):
    """A round's commit given up because the replica stops (:meth:`Coordinator.drain`): its
    accepted responses stay pending; the next coordinator rolls them forward."""

    retriable = True


class Coordinator:
    def __init__(
        self,
        settings: Settings,
        bootstrap: str,
        producer: ControlProducer,
        catalog: Catalog,
        offload: Offload,
        metrics: Metrics,
        rewrite: Rewriter | None = None,
    ) -> None:
        """``rewrite``: writes data files with the hosting replica's Spark session, for
        compaction (None: no compaction; expiry and orphan sweeps still run)."""
        self.settings = settings
        self.bootstrap = bootstrap
        self.producer = producer
        self.catalog = catalog
        self.offload = offload
        self.metrics = metrics
        self.group = settings.group_id
        self.epoch = 0
        self.state = CoordinatorState()
        self.status: dict[str, Any] = {"role": "coordinator", "phase": "starting"}
        self._reader = ControlReader(
            bootstrap, settings.control_topic, self.group, settings.kafka_client_kwargs(),
            commit_group=f"{self.group}-coordinator", metrics=metrics, reader="coordinator",
            secret=producer.keyring,  # the replica's (agents/worker.py): the same key signs and checks
        )
        self._commit_task: asyncio.Task[None] | None = None
        self._commits = Offload(settings.table_commit_threads)  # a round's table commits run at once
        self._roots = TableRoots(catalog)
        self._mirrors = MirrorIndexes(settings) if settings.mirror else None  # docs/mirror-tables.md
        self._round_started_at: float | None = None  # the round's StartCommit, for icesink_round_duration_seconds
        self._manifests: dict[str, frozenset[str]] = {}  # manifest path -> its files (immutable)
        self._round_deadline: float | None = None
        self._round_sent: str | None = None
        self._next_round_at = 0.0
        self.log_id: str | None = None  # the control topic's id (None: the broker has none)
        self._table_positions: dict[TopicPartition, int] = {}
        self._adopted = False  # iceberg.control.adopt-log-id names this log and a table's state another
        self._locks = TableLocks()  # every commit to a table holds its lock: rounds and maintenance
        self._tables = TableCache()  # each table as this coordinator's last commit left it
        self._parked = ParkedTables(metrics, self.status)  # tables whose commits keep failing (coordinator/parking.py)
        truncator = ControlLogTruncator(bootstrap, settings.control_topic, self.group, settings.kafka_client_kwargs(),
                                        producer.keyring)  # the group's own checkpoint: signed
        self._maintainer = Maintainer(settings, catalog, metrics, self.status, self._locks, rewrite,
                                      lambda at: in_flight_files(settings, bootstrap, at, producer.keyring), tables=self._tables,
                                      mirrors=self._mirrors, truncate=GuardedTruncation(  # coordinator/log_floor.py
                                          truncator, offload, self._table_states, self._parked.names))
        self._processes = commit_processes(settings, compaction=rewrite is not None)  # None: on the threads
        # The checkpoint of the last round every table holds (the recovery base at first; a whole-log replay).
        self._last_cp = Checkpoint(through=-1, positions={}, owners={}, replay_from=0)
        self._draining = asyncio.Event()  # the replica stops: finish the round in flight, start none
        self._applied_next = 0  # the control offset after the last event the loop applied
        self._loop_running = False

    # Lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            if self._processes is not None:
                await self._commits.run(self._processes.start)
            await self._reader.start()
        except BaseException:  # e.g. the broker unreachable: the supervisor makes a new coordinator
            if self._processes is not None:
                self._processes.close()
            raise
        try:
            self.metrics.coordinator_active.set(1)
            self.metrics.last_round_committed.set(time.time())  # "no round since": counted from its start
            try:
                await self._recover()
            except ControlLogError as exc:
                await self._refuse(exc)
            await self._loop()
        finally:
            self.metrics.coordinator_active.set(0)
            self._parked.stopped()  # another replica's coordinator reports them now
            if self._commit_task is not None:
                self._commit_task.cancel()
                await asyncio.gather(self._commit_task, return_exceptions=True)
            await self._maintainer.stop()
            self._commits.close()
            if self._processes is not None:
                self._processes.close()
            await self._reader.stop()

    async def drain(self, timeout_s: float) -> None:
        """The replica stops: start no round, and give the table commits
        in flight up to ``timeout_s`` to finish and be announced; a retry is not waited for
        (the round is abandoned, its responses stay pending). The caller then cancels
        :meth:`run`. A commit still running then may still go through in its thread: the next
        coordinator finds the table holding the round and announces it (_announce_held)."""
        self._draining.set()
        task = self._commit_task
        if task is None or task.done():
            return
        log.info("stopping: waiting up to %.1fs for the table commits in flight", timeout_s)
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            log.warning("stopping: the round's table commits still run after %.1fs and are abandoned; its accepted "
                        "responses stay pending, and the next coordinator announces any table that holds the round",
                        timeout_s)
        elif not task.cancelled() and isinstance(task.exception(), Abandoned):
            log.warning("stopping: the round's commits were abandoned before their retry; the next coordinator rolls "
                        "them forward")

    async def _recover(self) -> None:
        """Rebuild state from the last checkpoint and the log after it, or from the tables' sink
        state when the checkpoint cannot be used (coordinator/recovery.py); roll forward any
        accepted responses not yet in every table; answer claims left unanswered."""
        states = await self.offload.run(self._table_states)
        self._table_positions = table_positions(states)
        client = self.settings.kafka_client_kwargs()
        topic = self.settings.control_topic
        self.log_id = await topic_id(self.bootstrap, topic, client_kwargs=client)
        self.status["control_log_id"] = self.log_id
        log_end = (await end_offsets(self.bootstrap, topic, client_kwargs=client)).get(0, 0)
        self._adopted = check_log_identity(states, self.log_id, log_end, topic, self.settings.control_adopt_log_id)
        log_start = await self._reader.seek_to_beginning()
        if self._adopted:
            states = adopt_states(states, str(self.log_id), log_start)
            log.warning("adopting control log %s (iceberg.control.adopt-log-id): tables holding state of another "
                        "log start over on it from their positions", self.log_id)
        checkpoint = await self._read_checkpoint()
        replay_from = None if checkpoint is None else (
            checkpoint.replay_from if checkpoint.replay_from is not None else checkpoint.through + 1)
        if checkpoint is not None and replay_from is not None and replay_from >= log_start:
            base = Base(checkpoint, replay_from, f"checkpoint at control offset {checkpoint.through}")
        else:
            if checkpoint is not None:
                log.warning("control log starts at %d, past the checkpoint's replay start %s: recovering from the tables",
                            log_start, checkpoint.replay_from)
            base = from_tables(states, log_start, topic)
            if base.checkpoint is not None:
                self.metrics.recovered_from_tables.inc()
        checkpoint_through = -1
        start = base.start
        if base.checkpoint is not None:
            self.state = CoordinatorState.from_checkpoint(base.checkpoint)
            checkpoint_through = base.checkpoint.through
            self._last_cp = Checkpoint(checkpoint_through, dict(self.state.accepted), dict(self.state.owners),
                                       start, dict(self.state.members))
        else:
            self._last_cp = Checkpoint(start - 1, {}, {}, start)
        watermarks = {t: st.watermark for t, st in states.items() if not self._adopted}
        await self._reader.seek(start)
        end = await self._reader.end_offset()
        replayed = 0
        while True:
            batch = await self._reader.read(0.5)
            for offset, event in batch:
                await self._apply(offset, event, checkpoint_through)
                replayed += 1
            self.state.lacking(watermarks)  # what every table already holds is not kept (a parked table's rounds)
            if not batch and await self._reader.position() >= end:
                break
        epochs = [self.state.log_epoch] + [st.epoch for st in states.values()]
        self.epoch = next_epoch(epochs)
        self._maintainer.epoch = self.epoch  # the fence of the files its compactions write
        self.metrics.coordinator_epoch.set(self.epoch)
        # Rewinds were sent by the previous coordinator; the files may not be deleted yet.
        decided = [f for r in self.state.take_rejected() for f in r.files]
        await self._delete_files(decided + self.state.take_orphans())
        log.info(
            "coordinator epoch %d recovered from control offset %d (%s; control log %s; %d events, "
            "%d accepted responses to roll forward)",
            self.epoch, start, base.reason, self.log_id, replayed, len(self.state.pending),
        )
        self.status.update(recovered_from=base.reason, control_log_id=self.log_id)
        for name, st in sorted(states.items()):  # committed after the checkpoint, never announced
            if not self._adopted and st.watermark > max(checkpoint_through, self.state.announced_through(name)):
                await self._announce_held(name, await self.offload.run(self._held_commit, name))
        if self.state.pending:  # the loop's commit task: claims are answered meanwhile, a parked table waits
            self._commit_task = asyncio.create_task(self._commit(f"recovery-{uuid.uuid4()}", partial=False),
                                                    name="commit")
        for claim in list(self.state.unanswered.values()):
            await self._answer(claim)
        self._next_round_at = time.monotonic() + self.settings.commit_interval_ms / 1000
        self.status["phase"] = "running"

    async def _read_checkpoint(self) -> CommitComplete | None:
        """The CommitComplete the coordinator group's committed offset points to, or None (no
        offset: a first start or expired group offsets; not readable: deleted, timed out, or
        refused, as a forged one is): recovery then takes the tables' state, never an older
        CommitComplete (after a secret change only unsigned ones pass: stale or an outsider's)."""
        committed = await self._reader.committed()
        if committed is None:
            log.warning("no committed offset for %s-coordinator: no checkpoint", self.group)
            return None
        ev = await self._reader.read_one(committed)
        if isinstance(ev, CommitComplete):
            return ev
        log.warning("coordinator checkpoint at control offset %s is not readable (found %s)", committed,
                    type(ev).__name__ if ev is not None else "nothing")
        return None

    def _table_states(self, more: Iterable[str] = ()) -> dict[str, SinkState]:
        """Every table's sink state for this group: the configured tables (and ``more``), and the
        tables the newest rounds name (dynamic tables)."""
        out: dict[str, SinkState] = {}
        todo = [*self.settings.tables, *more]
        while todo:
            name = todo.pop()
            if name in out:
                continue
            st = self._summary(name)
            if st is not None:
                out[name] = st
                todo += [t for t in st.round_tables if t not in out]
        return out

    async def _refuse(self, exc: ControlLogError) -> None:
        """Refuse to commit: say so (log, /status, metric) and wait to be stopped."""
        log.error("coordinator refuses to commit: %s", exc)
        self.status.update(phase="refused", error=str(exc))
        self.metrics.control_log_refused.set(1)
        await asyncio.Event().wait()

    def _held_commit(self, name: str) -> Held | None:
        try:
            return held_commit(self.catalog.load_table(name), self.group)
        except NoSuchTableError:
            return None

    def _summary(self, name: str) -> SinkState | None:
        try:
            return latest_sink_summary(self.catalog.load_table(name), self.group)
        except NoSuchTableError:
            return None

    async def _loop(self) -> None:
        last_status = 0.0
        self._applied_next = await self._reader.position()
        self._loop_running = True
        while True:
            now = time.monotonic()
            if now - last_status >= 30:
                last_status = now
                log.info(
                    "coordinator epoch %d: %d partitions owned, %d responses pending, round %s, committing %s",
                    self.epoch, len(self.state.owners), len(self.state.pending), self._round_sent,
                    self._commit_task is not None,
                )
            self._reap_commit_task()
            wait = max(0.05, min(self._next_round_at - now, 0.5))
            batch = await self._reader.read(wait)
            for offset, event in batch:
                if not await self._apply(offset, event):
                    continue
                if isinstance(event, Claim):
                    await self._answer(event)
            # Every record before the position is applied, or not ours (another group's, invalid)
            self._applied_next = await self._reader.position()
            for rej in self.state.take_rejected():
                await self._reject(rej)
            await self._delete_files(self.state.take_orphans())
            await self._maybe_close_round()
            await self._maybe_start_round()
            self._maintainer.poll()

    # Claims and rejections -----------------------------------------------------------------

    async def _answer(self, claim: Claim) -> None:
        if self.state.owners and any(
            self.state.owners.get(tp) != (claim.worker, claim.generation) for tp in claim.partitions
        ):
            # Superseded by a newer claim for some partition: answer only what it still owns.
            parts = tuple(
                tp for tp in claim.partitions
                if self.state.owners.get(tp) == (claim.worker, claim.generation)
            )
            claim = Claim(claim.worker, claim.generation, parts)
        known, unknown = self.state.resume_positions(claim)
        if unknown:
            known += await self._initial_positions(unknown)
        await self.producer.send(Resume(self.epoch, claim.worker, claim.generation, tuple(known)))

    async def _initial_positions(self, tps: list[TopicPartition]) -> list[Position]:
        """Where a partition the log does not know starts: its position in the tables' sink
        state (the truth, when the log lost its Resume); for a partition no table has seen,
        the source group's committed offset (a hint from an earlier deployment), else the
        earliest offset. Fixed in the Resume event."""
        known = [Position(tp, self._table_positions[tp]) for tp in tps if tp in self._table_positions]
        rest = [tp for tp in tps if tp not in self._table_positions]
        return known + (await self._hint_positions(rest) if rest else [])

    async def _hint_positions(self, tps: list[TopicPartition]) -> list[Position]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False,
            **self.settings.kafka_client_kwargs(),
        )
        await consumer.start()
        try:
            # Fresh metadata of every topic (not the consumer's own: on Kafka it holds none here)
            counts = await partition_counts(self.bootstrap, client_kwargs=self.settings.kafka_client_kwargs())
            tps = self._existing(tps, counts)
            ktps = [KafkaTP(tp.topic, tp.partition) for tp in tps]
            begin = await consumer.beginning_offsets(ktps)
            out = []
            for tp, ktp in zip(tps, ktps):
                committed = await consumer.committed(ktp)
                out.append(Position(tp, committed if committed is not None else int(begin[ktp])))
            return out
        finally:
            await consumer.stop()

    def _existing(self, tps: list[TopicPartition], counts: dict[str, int]) -> list[TopicPartition]:
        """The partitions that exist (``counts``: topic -> partitions); the others (only a buggy or
        forged claim names them: asking for their offsets would time out, and restart this
        coordinator for ever) are refused."""
        gone = [tp for tp in tps if not 0 <= tp.partition < counts.get(tp.topic, 0)]
        if gone:
            self.metrics.control_events_refused.labels(reason="no-such-partition").inc()
            log.error("a claim names partitions that do not exist (%s): answered without them",
                      ", ".join(map(str, gone[:5])))
        return [tp for tp in tps if tp not in gone]

    async def _reject(self, rej: Any) -> None:
        self.metrics.responses_rejected.labels(reason=rej.reason.split(":")[0][:40]).inc()
        log.warning("rejected response from %s: %s", rej.worker, rej.reason)
        await self.producer.send(Rewind(self.epoch, rej.worker, rej.partitions, rej.reason))
        await self._delete_files(rej.files)

    async def _apply(self, offset: int, event: Event, checkpoint_through: int = -1) -> bool:
        """Apply one control event to the state if it is admitted; False if refused."""
        if not await self._admit(offset, event):
            return False
        resets = self.state.group_resets
        self.state.apply(offset, event, checkpoint_through=checkpoint_through)
        if self.state.group_resets != resets and isinstance(event, Claim):
            self.metrics.group_resets.inc()
            log.warning("control offset %d: worker %s claims as a new group member with generation %d, below the "
                        "group's newest: the consumer group was reset, every older ownership is void",
                        offset, event.worker, event.generation)
        return True

    async def _admit(self, offset: int, event: Event) -> bool:
        """A DataWritten may name only files under its table's location (coordinator/files.py):
        one that names any other is refused here, before the state sees it, in the live loop
        and in replay alike; its response then counts as incomplete and is rejected. A table
        that does not exist (dropped: parked) cannot be judged here; its commit checks its files
        against the location it has then (coordinator/committer.py), and never deletes them."""
        if not isinstance(event, DataWritten):
            return True
        paths = [f.path for f in (*event.files, *event.deleted_keys)]
        if self._roots.known(event.table):
            outside = self._roots.outside(event.table, paths)
        else:
            outside = await self.offload.run(self._roots.outside, event.table, paths)
        if not outside:
            return True
        if not self._roots.known(event.table):  # no such table (dropped): judged when it commits (committer)
            log.warning("control offset %d: data-written of worker %s for table %s, which does not exist: kept for "
                        "it (its files are checked against its location when it commits)", offset, event.worker,
                        event.table)
            return True
        self.metrics.control_events_refused.labels(reason="file-outside-table").inc()
        log.error(
            "control offset %d: data-written of worker %s for table %s names %d files outside the table's "
            "location (e.g. %s) or a table that does not exist: refused, neither committed nor deleted",
            offset, event.worker, event.table, len(outside), outside[0],
        )
        return False

    async def _delete_files(self, files: Sequence[TableFile]) -> None:
        """Delete files that can never be committed (rejected or abandoned responses), never one
        outside its table, referenced by a snapshot or named by an accepted response."""
        if not files:
            return
        accepted = {normalize(f.path) for a in self.state.pending
                    for fs in (*a.files.values(), *a.deleted_keys.values()) for f in fs}
        done = await self.offload.run(delete_uncommitted, self.catalog, files, accepted, self._manifests)
        self.metrics.orphans_deleted.inc(done.pop("deleted", 0))
        for reason, n in done.items():
            self.metrics.files_kept.labels(reason=reason).inc(n)

    # Rounds ----------------------------------------------------------------------------------

    async def _maybe_start_round(self) -> None:
        if self._round_sent is not None or self._commit_task is not None or self._draining.is_set():
            return
        now = time.monotonic()
        if now < self._next_round_at and not self.state.commit_requested:
            return
        commit_id = str(uuid.uuid4())
        self._round_sent = commit_id
        self._round_deadline = now + self.settings.commit_timeout_ms / 1000
        self._next_round_at = now + self.settings.commit_interval_ms / 1000
        self.metrics.rounds_started.inc()
        self._round_started_at = time.monotonic()
        await self._evolve_schemas()  # before StartCommit: workers reload tables at it
        await self.producer.send(StartCommit(self.epoch, commit_id))

    async def _evolve_schemas(self) -> None:
        """One schema update per table with pending proposals (agents/evolution.py)."""
        for table, proposals in self.state.take_proposals().items():
            backoff = retry_backoff()
            for attempt in range(1, SCHEMA_ATTEMPTS + 1):
                try:
                    done = await self.offload.run(
                        apply_proposals, self.catalog, table, proposals,
                        case_insensitive=self.settings.schema_case_insensitive, group=self.group, epoch=self.epoch,
                    )
                except FencedError:
                    self.status["phase"] = "fenced"
                    raise
                except Exception as exc:  # conflict, catalog down: retried, then next round
                    self.metrics.schema_change_failures.labels(table=table).inc()
                    log.warning("schema update of %s failed (attempt %d/%d, %s: %s)",
                                table, attempt, SCHEMA_ATTEMPTS, type(exc).__name__, exc)
                    if attempt == SCHEMA_ATTEMPTS or not is_retriable(exc):  # the next round tries again
                        self.state.return_proposals(table, proposals)
                        break
                    await asyncio.sleep(backoff.next())
                    continue
                if done:
                    self.metrics.schema_changes.labels(table=table).inc()
                    log.info("schema of %s evolved (%d proposals): %s", table, len(proposals), describe_changes(done))
                break

    async def _maybe_close_round(self) -> None:
        if self._round_sent is None or self._commit_task is not None or self._draining.is_set():
            return
        if self.state.round_id != self._round_sent:
            return  # our StartCommit is not read back yet
        answered = self.state.round_answered()
        timed_out = self._round_deadline is not None and time.monotonic() >= self._round_deadline
        if not (answered or timed_out):
            return
        commit_id = self._round_sent
        self._round_sent = None
        self._round_deadline = None
        self._commit_task = asyncio.create_task(self._commit(commit_id, partial=not answered), name="commit")

    def _reap_commit_task(self) -> None:
        """A finished commit task frees the next round; one that failed (fenced, or an error
        no retry mends) stops this coordinator loudly: its exception is raised here."""
        task = self._commit_task
        if task is None or not task.done():
            return
        self._commit_task = None
        if self._draining.is_set() and not task.cancelled() and isinstance(task.exception(), Abandoned):
            return  # stopping: the next coordinator rolls the round forward
        task.result()

    async def _commit(self, commit_id: str, partial: bool) -> None:
        """Commit every accepted response of the round to each of its tables, then announce
        it. The responses stay pending until all of that is done: any failure half-way
        (catalog, a control send, the group offset) is retried with capped backoff, and the
        tables that already hold the round skip it (their watermark), so no table ever
        misses data that a CommitComplete moved positions past. A table that keeps failing is
        parked (coordinator/parking.py): its part stays pending, the rest of the round ends.
        Fencing is not retried; a stop (:meth:`drain`) abandons the retries."""
        batch, cp = self.state.plan_commit()
        if partial:
            self.metrics.rounds_partial.inc()
            log.info("round %s closed on the commit timeout; late responses join the next round", commit_id)
        vts = [a.valid_through_ms for a in batch]
        valid_through = None if (partial or not vts or None in vts) else min(v for v in vts if v is not None)
        backoff = retry_backoff()
        while True:
            try:
                results = await self._commit_round(commit_id, batch, cp, valid_through)
                break
            except (FencedError, Abandoned) as exc:
                if isinstance(exc, FencedError):
                    self.status["phase"] = "fenced"
                raise
            except Exception as exc:  # noqa: BLE001 - retried; never dropped
                delay = backoff.next()
                attempt = backoff.attempts
                self.metrics.round_failures.inc()
                if not is_retriable(exc):  # no retry mends it: stop this coordinator loudly, round pending
                    self.status.update(phase="round-failed", round=commit_id, error=f"{type(exc).__name__}: {exc}",
                                       attempt=attempt, retriable=False)
                    log.error("round %s not finished (%s: %s), which no retry mends: stopping the coordinator; "
                              "its %d accepted responses stay pending", commit_id, type(exc).__name__, exc, len(batch))
                    raise
                self.status.update(phase="round-retrying", round=commit_id, error=f"{type(exc).__name__}: {exc}", attempt=attempt)
                log.error(
                    "round %s not finished (attempt %d, %s: %s); its %d accepted responses stay pending, retrying in %.1fs",
                    commit_id, attempt, type(exc).__name__, exc, len(batch), delay,
                )
                await self._backoff(delay)
        parked = self._parked.names()
        self.state.committed(batch, held=parked)
        self._parked.show(self.state.pending)
        done = [t for t in results if t not in parked]
        self._maintainer.due(sorted(t for t in {t for a in batch for t in (*a.files, *a.deleted_keys)} if t not in parked),
                             clear=[t for t in done if results[t].maintenance_due is False])
        keys_files = {t: [f.path for a in batch for f in a.deleted_keys.get(t, ())]
                      for t in {t for a in batch for t, fs in a.deleted_keys.items() if fs} - parked}
        if keys_files:  # consumed by the round's commit, never part of a snapshot
            await self.offload.run(delete_keys_files, self.catalog, keys_files)
        if backoff.attempts:
            self.status.update(phase="running", error=None)
            log.info("round %s finished after %d failed attempts", commit_id, backoff.attempts)

    async def _backoff(self, delay: float) -> None:
        """Sleep ``delay`` before a retry; a stop (:meth:`drain`) ends it and abandons the round."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._draining.wait(), delay)
        if self._draining.is_set():
            raise Abandoned("the replica is stopping")

    async def _commit_round(
        self, commit_id: str, batch: list[Accepted], cp: Checkpoint, valid_through: int | None,
    ) -> dict[str, TableCommit]:
        """The first table alone, then the others at once (iceberg.control.commit.threads at a
        time; one snapshot each; parked tables last). Each is announced by a CommitToTable once it holds the round;
        the CommitComplete goes out only when all of them do or are parked (a parked table not
        due for a try is left out). Returns each table's commit."""
        tables = sorted({t for a in batch for t in a.files})
        now = time.monotonic()
        due = sorted((t for t in tables if self._parked.due(t, now)), key=lambda t: t in self._parked)  # healthy first
        round = RoundCommit(self.group, self.epoch, commit_id, cp.positions, valid_through_ms=valid_through,
                            checkpoint=cp, log_id=self.log_id, adopted=self._adopted, tables_of_round=round_tables(batch))
        results: dict[str, TableCommit] = {}

        async def commit_and_announce(table: str) -> None:
            result = await self._commit_table_with_retry(table, batch, round)
            if result is None:  # parked
                return
            results[table] = result
            await hold_point(self.settings, "coordinator.after-table-commit")
            await self._announce_held(table, result.held)
            if result.snapshot_id is not None:
                await self.producer.send(CommitToTable(
                    self.epoch, commit_id, table, result.snapshot_id, result.files, result.records,
                    result.watermark,
                ))
                self.state.announced(table, result.watermark)

        if due:
            await commit_and_announce(due[0])
        if due[1:]:
            crash_point(self.settings, "coordinator.between-table-commits")
            await _all_unless_fenced([commit_and_announce(t) for t in due[1:]])
        held = self._parked.checkpoint(cp, self._last_cp)
        if held is cp:
            self._last_cp = cp
        else:
            valid_through = None  # not every table holds what the round's data promises
            log.warning("round %s: table(s) %s parked; its CommitComplete keeps the checkpoint at control offset %d",
                        commit_id, ", ".join(sorted(self._parked.names())), held.through)
        done = checkpoint_event(self.epoch, commit_id, held, valid_through)
        offset = await self.producer.send(done)
        await self._reader.commit(offset)
        self.metrics.rounds_committed.inc()
        self.metrics.last_round_committed.set(time.time())
        if self._round_started_at is not None:
            self.metrics.round_duration.observe(time.monotonic() - self._round_started_at)
        self.status.update(last_commit_id=commit_id, last_commit_at=time.time(), checkpoint=offset)
        if self._processes is not None:
            self.status["commit_processes"] = self._processes.pids()
        return results

    async def _announce_held(self, table: str, held: Held | None) -> None:
        """The CommitToTable of a round ``table`` already held when its commit looked (an
        earlier attempt, or a coordinator that stopped between the commit and its
        announcement), unless the log has it."""
        if held is None or self.state.announced_through(table) >= held.watermark:
            return
        if self._loop_running:  # a send that failed may have landed all the same: read the log up to its end first
            await asyncio.wait_for(self._caught_up(), RETRY_CAP_S)
            if self.state.announced_through(table) >= held.watermark:
                return
        log.warning("table %s holds round %s (snapshot %s) that was never announced (its coordinator stopped or "
                    "failed between the commit and its CommitToTable): announcing it", table, held.commit_id,
                    held.snapshot_id)
        await self.producer.send(CommitToTable(self.epoch, held.commit_id, table, held.snapshot_id, held.files,
                                               held.records, held.watermark))
        self.state.announced(table, held.watermark)
        self.metrics.commits_announced_late.inc()

    async def _caught_up(self) -> None:
        """Until the loop has applied every control event up to the log's end as of now."""
        end = await self._reader.end_offset()
        while self._applied_next < end:
            await asyncio.sleep(0.05)

    async def _commit_table_with_retry(self, table: str, batch: list[Accepted], round: RoundCommit) -> TableCommit | None:
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
                self.status["phase"] = "fenced"
                raise
            except ControlLogError as exc:  # keep the accepted files pending; say so; retry
                backoff.next()  # counted; the wait is the longest at once
                self.metrics.control_log_refused.set(1)
                self.status.update(phase="refused", table=table, error=str(exc), attempt=backoff.attempts)
                log.error("coordinator refuses to commit round %s to %s: %s", commit_id, table, exc)
                await self._backoff(RETRY_CAP_S)
                continue
            except Exception as exc:  # conflict, catalog down: retry, never drop accepted files
                delay = backoff.next()
                attempt = backoff.attempts
                kind = "conflict" if isinstance(exc, CommitFailedException) else type(exc).__name__
                self.metrics.commit_failures.labels(table=table).inc()
                if not is_retriable(exc):  # e.g. a sink state no reader can parse: the round stops (_commit)
                    self.status.update(phase="commit-failed", table=table, error=f"{kind}: {exc}", attempt=attempt,
                                       retriable=False)
                    log.error("commit of round %s to %s failed (%s: %s), which no retry mends", commit_id, table,
                              kind, exc)
                    raise
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if table in self._parked or now - failing_since >= park_after:
                    self._parked.park(table, f"{kind}: {exc}", now - failing_since)
                    if self._draining.is_set():
                        raise Abandoned("the replica is stopping") from exc
                    return None
                delay = min(delay, park_after - (now - failing_since))
                self.metrics.commit_retrying.labels(table=table).set(1)
                self.status.update(phase="commit-retrying", table=table, error=f"{kind}: {exc}", attempt=attempt)
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
            self.status.update(phase="running", error=None)
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
