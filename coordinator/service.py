"""The coordinator: owns every Iceberg commit of a sink group. Runs on the Faust leader only.

Loop: read control events in log order into :class:`CoordinatorState`; answer claims; start a
round every commit interval (or early on request); close it when every owned partition has
answered or on the commit timeout; commit each touched table once (coordinator/round_commit.py);
send CommitToTable per table and CommitComplete (the checkpoint). Recovery at start:
coordinator/startup.py. See docs/commits.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from pyiceberg.catalog import Catalog

from coordinator.committer import Held, TableCache
from coordinator.evolution import apply_proposals, describe_changes
from coordinator.files import TableRoots, delete_uncommitted
from coordinator.gc import in_flight_files, normalize
from coordinator.log_floor import GuardedTruncation
from coordinator.maintainer import Maintainer
from coordinator.maintenance import Rewriter, TableLocks
from coordinator.mirror import MirrorIndexes
from coordinator.parking import ParkedTables
from coordinator.round_commit import Abandoned, RoundCommits, commit_processes, retry_backoff
from coordinator.session import Session, first_round_at
from coordinator.startup import Recovery
from coordinator.state import TableFile
from icesink.shared.config import Settings
from icesink.shared.control import ControlLogTruncator, ControlProducer, ControlReader
from icesink.shared.errors import ControlLogError, FencedError, is_retriable
from icesink.shared.protocol import Claim, DataWritten, Event, Resume, Rewind, StartCommit
from icesink.shared.metrics import Metrics
from icesink.shared.offload import Offload

log = logging.getLogger(__name__)

SCHEMA_ATTEMPTS = 3  # per round; then the proposals wait for the next round

__all__ = ["Abandoned", "Coordinator", "SCHEMA_ATTEMPTS"]


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
        launched_at: float | None = None,
    ) -> None:
        """``rewrite``: writes data files with the hosting replica's Spark session, for
        compaction (None: no compaction; expiry and orphan sweeps still run). ``launched_at``:
        the monotonic clock when the hosting process began (None: now; see first_round_at)."""
        self.settings = settings
        self._launched_at = time.monotonic() if launched_at is None else launched_at
        self.bootstrap = bootstrap
        self.producer = producer
        self.catalog = catalog
        self.offload = offload
        self.metrics = metrics
        self.group = settings.group_id
        self.session = Session()
        self.status = self.session.status  # /status (agents/worker.py)
        self._reader = ControlReader(
            bootstrap, settings.control_topic, self.group, settings.control_client_kwargs(),
            commit_group=settings.coordinator_group, metrics=metrics, reader="coordinator",
            secret=producer.keyring,  # the replica's (agents/worker.py): the same key signs and checks
        )
        self._commit_task: asyncio.Task[None] | None = None
        mirrors = MirrorIndexes(settings) if settings.mirror else None  # docs/mirror-tables.md
        self._manifests: dict[str, frozenset[str]] = {}  # manifest path -> its files (immutable)
        self._round_deadline: float | None = None
        self._round_sent: str | None = None
        self._next_round_at = 0.0
        self._idle_until: float | None = None  # after an idle round: the next waits until then (_after_round)
        locks = TableLocks()  # every commit to a table holds its lock: rounds and maintenance
        tables = TableCache()  # each table as this coordinator's last commit left it
        processes = commit_processes(settings, compaction=rewrite is not None)  # None: on the threads
        # A new table's first load serves its first commit, if this process commits: commit
        # processes never refresh this cache, which maintenance reads as the table's state.
        self._roots = TableRoots(catalog, loaded=tables.offer if processes is None else None)
        parked = ParkedTables(metrics, self.status)  # tables whose commits keep failing (coordinator/parking.py)
        self._parked = parked
        self._recovery = Recovery(settings, bootstrap, self.session, self._reader, catalog, offload, metrics)
        truncator = ControlLogTruncator(bootstrap, settings.control_topic, self.group, settings.control_client_kwargs(),
                                        producer.keyring,  # the group's own checkpoint: signed
                                        coordinator_group=settings.coordinator_group)
        self._maintainer = Maintainer(settings, catalog, metrics, self.status, locks, rewrite,
                                      lambda at: in_flight_files(settings, bootstrap, at, producer.keyring), tables=tables,
                                      mirrors=mirrors, truncate=GuardedTruncation(  # coordinator/log_floor.py
                                          truncator, offload, self._recovery.table_states, parked.names))
        self._rounds = RoundCommits(
            settings, self.session, producer, self._reader, catalog, offload, metrics, self._maintainer, parked,
            locks, tables, mirrors, processes)

    # Lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._rounds.start()
            await self._reader.start()
        except BaseException:  # e.g. the broker unreachable: the supervisor makes a new coordinator
            self._rounds.close()
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
            self._rounds.close()
            await self._reader.stop()

    async def drain(self, timeout_s: float) -> None:
        """The replica stops: start no round, and give the table commits
        in flight up to ``timeout_s`` to finish and be announced; a retry is not waited for
        (the round is abandoned, its responses stay pending). The caller then cancels
        :meth:`run`. A commit still running then may still go through in its thread: the next
        coordinator finds the table holding the round and announces it (RoundCommits.announce_held)."""
        self.session.draining.set()
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
        """Rebuild state (coordinator/startup.py); roll forward any accepted responses not yet in
        every table; answer claims left unanswered."""
        await self._recovery.recover(self)
        self._maintainer.epoch = self.session.epoch  # the fence of the files its compactions write
        if self.session.state.pending:  # the loop's commit task: claims are answered meanwhile, a parked table waits
            self._commit_task = asyncio.create_task(self._rounds.commit(f"recovery-{uuid.uuid4()}", partial=False),
                                                    name="commit")
        for claim in list(self.session.state.unanswered.values()):
            await self._answer(claim)
        # A takeover keeps the group's cadence: its first round at once if the newest snapshot is an interval old
        since = self._recovery.since_commit_s(self._recovery.recovered_tables, int(time.time() * 1000))
        self._next_round_at = first_round_at(time.monotonic(), self.settings.commit_interval_ms / 1000, since,
                                             self._launched_at)
        self.session.status["phase"] = "running"

    async def announce_held(self, table: str, held: Held | None) -> None:
        """A table's commit its CommitToTable never announced (coordinator/round_commit.py)."""
        await self._rounds.announce_held(table, held)

    async def _refuse(self, exc: ControlLogError) -> None:
        """Refuse to commit: say so (log, /status, metric) and wait to be stopped."""
        log.error("coordinator refuses to commit: %s", exc)
        self.session.status.update(phase="refused", error=str(exc))
        self.metrics.control_log_refused.set(1)
        await asyncio.Event().wait()

    async def _loop(self) -> None:
        last_status = 0.0
        self.session.applied_next = await self._reader.position()
        self.session.loop_running = True
        while True:
            now = time.monotonic()
            if now - last_status >= 30:
                last_status = now
                log.info(
                    "coordinator epoch %d: %d partitions owned, %d responses pending, round %s, committing %s",
                    self.session.epoch, len(self.session.state.owners), len(self.session.state.pending), self._round_sent,
                    self._commit_task is not None,
                )
            self._reap_commit_task()
            wait = max(0.05, min(self._next_round_at - now, 0.5))
            batch = await self._reader.read(wait)
            await self._load_roots(batch)
            for offset, event in batch:
                if not await self.apply(offset, event):
                    continue
                self._check_epoch(offset)
                if isinstance(event, Claim):
                    await self._answer(event)
            # Every record before the position is applied, or not ours (another group's, invalid)
            self.session.applied_next = await self._reader.position()
            for rej in self.session.state.take_rejected():
                await self._reject(rej)
            await self.delete_files(self.session.state.take_orphans())
            await self._maybe_close_round()
            await self._maybe_start_round()
            self._maintainer.poll()

    def _check_epoch(self, offset: int) -> None:
        """Stop once the log holds a newer coordinator epoch than this one's: another replica led
        the group meanwhile and started a coordinator, whose rounds the workers follow; every
        event of this one is stale to them. The replica starts a new one if it still leads
        (agents/worker.py)."""
        if self.session.state.log_epoch > self.session.epoch:
            self.session.status["phase"] = "fenced"
            raise FencedError(f"coordinator epoch {self.session.epoch}: control offset {offset} is of coordinator "
                              f"epoch {self.session.state.log_epoch}, started by another replica meanwhile")

    # Claims and rejections -----------------------------------------------------------------

    async def _answer(self, claim: Claim) -> None:
        if self.session.state.owners and any(
            self.session.state.owners.get(tp) != (claim.worker, claim.generation) for tp in claim.partitions
        ):
            # Superseded by a newer claim for some partition: answer only what it still owns.
            parts = tuple(
                tp for tp in claim.partitions
                if self.session.state.owners.get(tp) == (claim.worker, claim.generation)
            )
            claim = Claim(claim.worker, claim.generation, parts)
        known, unknown = self.session.state.resume_positions(claim)
        if unknown:
            known += await self._recovery.initial_positions(unknown)
        await self.producer.send(Resume(self.session.epoch, claim.worker, claim.generation, tuple(known)))

    async def _reject(self, rej: Any) -> None:
        self.metrics.responses_rejected.labels(reason=rej.reason.split(":")[0][:40]).inc()
        log.warning("rejected response from %s: %s", rej.worker, rej.reason)
        await self.producer.send(Rewind(self.session.epoch, rej.worker, rej.partitions, rej.reason))
        await self.delete_files(rej.files)

    async def apply(self, offset: int, event: Event, checkpoint_through: int = -1) -> bool:
        """Apply one control event to the state if it is admitted; False if refused."""
        if not await self._admit(offset, event):
            return False
        resets = self.session.state.group_resets
        self.session.state.apply(offset, event, checkpoint_through=checkpoint_through)
        if self.session.state.group_resets != resets and isinstance(event, Claim):
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

    async def _load_roots(self, batch: Sequence[tuple[int, Event]]) -> None:
        """Load the tables the batch's DataWritten events name that this coordinator does not
        know yet together (a first round of many new tables): in one call where the catalog
        can, else side by side, so that a catalog's round trips overlap instead of queueing one
        table after another in :meth:`_admit`."""
        names = sorted({ev.table for _, ev in batch if isinstance(ev, DataWritten) and not self._roots.known(ev.table)})
        if len(names) > 1:
            await self.offload.run(self._roots.load, names)
            await asyncio.gather(*(self.offload.run(self._roots.outside, name, ()) for name in names
                                   if not self._roots.known(name)))

    async def delete_files(self, files: Sequence[TableFile]) -> None:
        """Delete files that can never be committed (rejected or abandoned responses), never one
        outside its table, referenced by a snapshot or named by an accepted response."""
        if not files:
            return
        accepted = {normalize(f.path) for a in self.session.state.pending
                    for fs in (*a.files.values(), *a.deleted_keys.values()) for f in fs}
        done = await self.offload.run(delete_uncommitted, self.catalog, files, accepted, self._manifests)
        self.metrics.orphans_deleted.inc(done.pop("deleted", 0))
        for reason, n in done.items():
            self.metrics.files_kept.labels(reason=reason).inc(n)

    # Rounds ----------------------------------------------------------------------------------

    async def _maybe_start_round(self) -> None:
        if self._round_sent is not None or self._commit_task is not None or self.session.draining.is_set():
            return
        now = time.monotonic()
        if not self.session.state.commit_requested and (now < self._next_round_at or self._idle_wait(now)):
            return
        self._idle_until = None
        commit_id = str(uuid.uuid4())
        self._round_sent = commit_id
        self._round_deadline = now + self.settings.commit_timeout_ms / 1000
        self._next_round_at = now + self.settings.commit_interval_ms / 1000
        self.metrics.rounds_started.inc()
        self.session.round_started_at = time.monotonic()
        await self._evolve_schemas()  # before StartCommit: workers reload tables at it
        await self.producer.send(StartCommit(self.session.epoch, commit_id))

    async def _evolve_schemas(self) -> None:
        """One schema update per table with pending proposals (agents/evolution.py)."""
        for table, proposals in self.session.state.take_proposals().items():
            backoff = retry_backoff()
            for attempt in range(1, SCHEMA_ATTEMPTS + 1):
                try:
                    done = await self.offload.run(
                        apply_proposals, self.catalog, table, proposals,
                        case_insensitive=self.settings.schema_case_insensitive, group=self.group, epoch=self.session.epoch,
                    )
                except FencedError:
                    self.session.status["phase"] = "fenced"
                    raise
                except Exception as exc:  # conflict, catalog down: retried, then next round
                    self.metrics.schema_change_failures.labels(table=table).inc()
                    log.warning("schema update of %s failed (attempt %d/%d, %s: %s)",
                                table, attempt, SCHEMA_ATTEMPTS, type(exc).__name__, exc)
                    if attempt == SCHEMA_ATTEMPTS or not is_retriable(exc):  # the next round tries again
                        self.session.state.return_proposals(table, proposals)
                        break
                    await asyncio.sleep(backoff.next())
                    continue
                if done:
                    self.metrics.schema_changes.labels(table=table).inc()
                    log.info("schema of %s evolved (%d proposals): %s", table, len(proposals), describe_changes(done))
                break

    async def _maybe_close_round(self) -> None:
        if self._round_sent is None or self._commit_task is not None or self.session.draining.is_set():
            return
        if self.session.state.round_id != self._round_sent:
            return  # our StartCommit is not read back yet
        answered = self.session.state.round_answered()
        timed_out = self._round_deadline is not None and time.monotonic() >= self._round_deadline
        if not (answered or timed_out):
            return
        commit_id = self._round_sent
        self._round_sent = None
        self._round_deadline = None
        self._commit_task = asyncio.create_task(self._rounds.commit(commit_id, partial=not answered), name="commit")

    def _reap_commit_task(self) -> None:
        """A finished commit task frees the next round; one that failed (fenced, or an error
        no retry mends) stops this coordinator loudly: its exception is raised here."""
        task = self._commit_task
        if task is None or not task.done():
            return
        self._commit_task = None
        if self.session.draining.is_set() and not task.cancelled() and isinstance(task.exception(), Abandoned):
            return  # stopping: the next coordinator rolls the round forward
        task.result()
        self._after_round()

    def _after_round(self) -> None:
        """After an idle round (its CommitComplete moved no position: nothing arrived to commit),
        the next starts iceberg.control.commit.idle-interval-ms after it rather than
        commit.interval-ms. Rows arriving meanwhile do not wait for it: their replica asks for
        a round (a CommitRequest, agents/ingest.py), which starts one at once."""
        idle_ms = self.settings.commit_idle_interval_ms
        started = self.session.round_started_at
        self._idle_until = None
        if idle_ms is not None and self.session.idle and started is not None:
            self._idle_until = started + idle_ms / 1000

    def _idle_wait(self, now: float) -> bool:
        """Whether the next round waits for the idle interval: only while no response waits
        for a round (accepted, or partly read: a late answer to a round closed on its timeout,
        which made that round look idle). A worker's CommitRequest starts a round regardless
        (:meth:`_maybe_start_round`)."""
        st = self.session.state
        return self._idle_until is not None and now < self._idle_until and not st.pending and not st.partial
