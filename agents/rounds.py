"""Answering commit rounds: on StartCommit (read by agents/control_loop.py) the buffers are
written through Spark and reported (DataWritten, then DataComplete: agents/respond.py); between
rounds, buffers past ``buffer.write-ahead-bytes`` are written early."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

import faust

from agents.buffer import Buffers, Chunk, PartitionState, Snapshot
from agents.deadletter import DeadLetterSendError, DeadLetters
from agents.evolution import Evolver, conform
from agents.file_writer import FileWriter
from agents.keys_files import write_keys_file
from agents.mirror import collapse
from agents.parts import Replica
from agents.respond import Sender, send_response
from agents.tables import Target
from agents.tasks import BacklogHold, TaskOwner, unless_moved, unread_since_ms
from agents.write_failures import WriteFailures
from icesink.shared.config import Settings
from icesink.shared.errors import ResponseSendError, WritesKeepFailing, is_retriable
from icesink.shared.protocol import (
    DataComplete, DataWritten, FileInfo,
)
from icesink.shared.protocol.fences import worker_files_prefix, worker_prefix
from icesink.shared.faults import crash_point, die, should_crash
from icesink.shared.iceberg import to_file_info
from icesink.shared.metrics import Metrics
from icesink.shared.offload import Offload

log = logging.getLogger(__name__)

# A response whose replica's newest record read is older than this, with more left to read,
# leaves it behind (a backlog, not the records a steady stream has in flight).
BEHIND_MS = 1000


def delete_files(paths: list[tuple[Any, str]]) -> None:
    """Delete data files no response reports (``(table, path)``); one that cannot be deleted
    is left to the orphan sweep (docs/maintenance.md), never an error."""
    for table, path in paths:
        try:
            table.io.delete(path)
        except Exception as exc:
            log.warning("could not delete void file %s (left to the orphan sweep): %s", path, exc)


def missing_files(paths: list[tuple[Any, str]]) -> list[str]:
    """Of data files (``(table, path)``), those that do not exist (deleted by hand, or by a
    sweep that judged them dead: docs/commits.md, "Orphan files and icesink gc"). Only a
    definite "no such file" counts: each is sized (a stat, FileNotFoundError only when there is
    no file), not asked ``exists()``, which fsspec answers False on any error. Any other error
    (permission, network, throttling) is raised: the check did not answer."""
    out = []
    for table, path in paths:
        try:
            len(table.io.new_input(path))
        except FileNotFoundError:
            out.append(path)
    return out


class Owner(Protocol):
    """What the responder needs of partition ownership (agents/ownership.py)."""

    def owns(self, st: PartitionState, generation: int) -> bool: ...


class RoundHooks(Protocol):
    """What the responder asks of the rest of the replica (the ingest, the lifecycle)."""

    async def evolution_ready(self) -> Callable[[Chunk], bool] | None:
        """Chunks whose tables can hold them (None: all), after reloading evolved tables."""

    async def release_backpressure(self) -> None:
        """The buffers shrank: resume reading if they were full."""

    async def reseek_and_resume(self, st: PartitionState) -> None:
        """Read ``st`` again from its next offset."""

    def update_gauges(self) -> None: ...

    def fail(self, exc: Exception, exit_code: int = 2) -> None:
        """Stop the replica, saying why."""


class Rounds:
    """Answers the coordinator's rounds from the buffers (and writes early between them);
    ``app``'s consumer tells how far each partition was read (``valid_through_ms``)."""

    def __init__(self, settings: Settings, metrics: Metrics, replica: Replica, buffers: Buffers,
                 targets: dict[str, Target], evolver: Evolver | None, files: FileWriter, offload: Offload,
                 deadletters: DeadLetters, app: faust.App, sender: Sender,
                 tasks: TaskOwner, ownership: Owner, hooks: RoundHooks) -> None:
        self.settings = settings
        self.metrics = metrics
        self.replica = replica
        self.buffers = buffers
        self.targets = targets  # shared with the ingest, which loads and creates tables
        self.evolver = evolver
        self.files = files  # Spark's (icesink/app/files.py)
        self.offload = offload
        self.deadletters = deadletters
        self.app = app
        self.sender = sender
        self.tasks = tasks
        self.ownership = ownership
        self.hooks = hooks
        self.write_failures = WriteFailures(settings.write_failure_limit)
        self.lock = asyncio.Lock()  # one answer or early write at a time
        self.spark_ready: asyncio.Future[None] | None = None  # the session's start (Worker._start)
        self.writing_early = False  # an early write is in flight
        self.writing_round = False  # a round's rows are taken and being written
        self.seq = 0

    async def _spark_started(self) -> None:
        assert self.spark_ready is not None, "Worker._start sets it before any round"
        await self.spark_ready

    async def warm_up(self) -> None:
        """Once Spark's session started: a backlog read while it started is past the write-ahead
        mark with no fetch left to notice; write it now rather than at its round. That write
        warms the JVM up; without one, a warm-up does."""
        try:
            await self._spark_started()
        except Exception:  # Worker.run raises it
            return
        self.maybe_write_early()
        if not self.writing_early:
            await self.offload.run(self.files.warm_up, self._idle)

    def _idle(self) -> bool:
        """Whether no rows wait for a write and none is being written (asked from the warm-up's
        thread: an int and two flags read). A throw-away write beside a real one slows both on
        the same cores; the real write warms the JVM up as well."""
        return self.buffers.nbytes == 0 and not self.writing_round and not self.writing_early

    async def respond(self, commit_id: str) -> None:
        await self._respond(commit_id)
        # Rows past the write-ahead mark that came while the round held the lock started no
        # early write, and with the backlog read no later fetch would (as after an early write).
        self.maybe_write_early()

    async def _respond(self, commit_id: str) -> None:
        arrived = time.monotonic()
        async with self.lock:
            # Mid-rebalance: answer once the new assignment is settled, never skip a round.
            await self.replica.rebalanced.wait()
            await self._spark_started()
            if (wait_s := self.write_failures.wait_s()) > 0:  # after a failed write: capped backoff
                log.info("round %s not answered, data kept: %d writes failed in a row, retrying in %.0f s",
                         commit_id, self.write_failures.in_a_row, wait_s)
                return
            try:
                ready = await self.hooks.evolution_ready()
            except Exception as exc:  # the catalog is down: the data waits for the next round
                log.error("round %s not answered, data kept: reloading tables failed: %s", commit_id, exc)
                return
            hold = self._backlog_hold()
            snap = self.buffers.take(self.replica.generation, ready, hold)
            if not snap.ranges:
                return
            # At the take, not at the send: records read while the files are written are in no
            # response yet, and a backlog's tail read meanwhile must still ask for its round.
            valid_through = self._valid_through_ms()  # it sets replica.behind too, which a held round needs
            if hold is not None and hold.held:  # older records than the newest read wait in the buffers
                valid_through = None
                self.metrics.rounds_held.inc()
                log.info("round %s: %d partitions reading a backlog keep their rows for the round its end "
                         "asks for (iceberg.control.commit.catch-up)", commit_id, len(hold.held))
            # Behind an early write holding the lock, a rebalance or the Spark session's start.
            waited_s = time.monotonic() - arrived
            try:  # at-least-once: dead letters are acknowledged before their offsets are reported
                await self.deadletters.flush()
            except DeadLetterSendError as exc:
                log.error("round %s not answered, data kept for the next round: %s", commit_id, exc)
                self.buffers.restore(snap)
                self.settle_voided()
                return
            if self.deadletters.delivered:  # fault tests: letters out, their offsets not yet reported
                crash_point(self.settings, "worker.after-dead-letters")
            await self.hooks.release_backpressure()
            response_id = str(uuid.uuid4())
            written: list[DataWritten] = []
            started = time.monotonic()
            if should_crash(self.settings, "worker.during-write"):
                asyncio.get_running_loop().call_later(0.5, die, "worker.during-write")
            self.writing_round = True
            try:
                tables = await self._arrow_tables(snap)
                deleted = self._collapse_mirrors(tables)
                self.seq += 1
                prefix = self._file_prefixes(snap, f"{commit_id[:8]}-{self.replica.worker_id}-{self.seq}")
                files = snap.written_files()  # written early: reported now, with their ranges
                for name, infos in (await self._write_tables(tables, prefix)).items():
                    files[name] = files.get(name, ()) + infos
                for name, infos in files.items():
                    keys_files: tuple[FileInfo, ...] = ()
                    if name in deleted:  # a mirror table: the keys whose committed rows go
                        keys_files = (await self.offload.run(write_keys_file, self.targets[name].table, deleted[name],
                                                             prefix(name)),)
                    written.append(DataWritten(commit_id, response_id, self.replica.worker_id, name, infos, keys_files))
            except Exception as exc:
                self.metrics.write_failures.inc()
                self.buffers.restore(snap)
                self.settle_voided()
                if not is_retriable(exc):  # every round would fail alike: stop loudly; nothing is committed
                    log.error("writing files for round %s failed with an error no retry mends; stopping the "
                              "replica (its partitions' data is read again by their next owner): %s", commit_id, exc)
                    self.hooks.fail(exc)
                    return
                log.error("writing files for round %s failed, data kept for the next round: %s", commit_id, exc)
                self._write_failed(exc)
                return
            finally:
                self.writing_round = False
            self._write_succeeded()
            wrote_s = time.monotonic() - started
            self.metrics.write_duration.observe(wrote_s)
            if not await self._early_files_exist(snap, written):
                return
            self._write_succeeded(check=True)
            sending = time.monotonic()
            try:  # DataWritten split to fit the control topic, then DataComplete
                sent = await send_response(self.sender, written, lambda n: DataComplete(
                    commit_id, response_id, self.replica.worker_id, snap.generation, snap.ranges, n, valid_through,
                ), lambda: crash_point(self.settings, "worker.mid-response"))
            except ResponseSendError as exc:
                log.error("round %s not answered, data kept for the next round: %s", commit_id, exc)
                self.buffers.restore(snap)
                self.settle_voided()
                return
            self.hooks.update_gauges()
            log.info("round %s: answered %d partitions, %d rows in %d files (%d DataWritten; written in %.2f s, "
                     "sent in %.2f s, taken %.2f s after the round reached this replica)", commit_id, len(snap.ranges),
                     snap.rows, sum(len(w.files) for w in written), sent, wrote_s, time.monotonic() - sending, waited_s)

    async def _early_files_exist(self, snap: Snapshot, written: list[DataWritten]) -> bool:
        """Right before a response reports files written early, check they still exist: one
        that does not (deleted by hand, or by a sweep that proved no round could commit it)
        would be committed and break the table. Then nothing is reported: the partitions read
        their rows again from the range start, and this response's own files are deleted. The
        round's own files were listed by the write a moment ago."""
        early = snap.written_files()
        if not early:
            return True
        paths = [(self.targets[name].table, f.path) for name, infos in early.items() if name in self.targets
                 for f in infos]
        early_paths = {f.path for infos in early.values() for f in infos}
        own = {w.table: tuple(f for f in (*w.files, *w.deleted_keys) if f.path not in early_paths) for w in written}
        round_id = written[0].commit_id if written else "?"
        try:
            missing = await self.offload.run(missing_files, paths)
        except Exception as exc:  # storage did not answer: no proof a file is gone; kept, retried
            log.error("round %s not answered, data and files written early kept for the next round: checking "
                      "that those files still exist failed: %s: %s", round_id, type(exc).__name__, exc)
            self.buffers.give_back(snap)
            self._delete_void({name: files for name, files in own.items() if files})
            self.settle_voided()
            self._write_failed(exc, check=True)  # capped backoff; the replica stops at write.failure-limit
            return False
        if not missing:
            return True
        self.metrics.early_writes.labels(outcome="missing").inc(len(missing))
        log.error("round %s not answered: %d files written early are gone (e.g. %s); their partitions read those "
                  "rows again", round_id, len(missing), missing[0])
        self.buffers.restore(snap)
        self._delete_void({name: files for name, files in own.items() if files})
        self.settle_voided()
        return False

    async def _arrow_tables(self, snap: Snapshot) -> dict[str, pa.Table]:
        """A snapshot's rows per table, cast to each table's schema, concatenated off the event
        loop (about 0.4 s per 1M rows, which ingest would otherwise wait for)."""
        if not any(c.rows for c in snap.chunks):
            return {}
        targets = dict(self.targets)
        if self.evolver is not None:
            cast = self.evolver.conformer(targets)
        else:  # rows decoded before another tool changed the table (agents/schema_watch.py): to its schema now
            ci = self.settings.schema_case_insensitive
            cast = lambda name, t: conform(t, targets[name].arrow_schema, case_insensitive=ci)  # noqa: E731
        return await self.offload.run(snap.tables, cast)

    def _file_prefixes(self, snap: Snapshot, name: str) -> Callable[[str], str]:
        """Each table's file prefix for a write of ``snap`` (a response's or an early write's):
        ``name`` fenced by a partition with rows for that table, from where the snapshot's range
        of it starts (icesink/shared/protocol/fences.py). So once those rows, read again by whoever
        owns the partition, are committed to the table, its state there shows the file can never
        be committed, and a sweep may delete it."""
        group = self.settings.group_id
        starts = {r.tp: r.start for r in snap.ranges}
        first: dict[str, str] = {}
        for c in snap.chunks:
            for table in c.names():
                if table not in first:
                    first[table] = worker_prefix(group, c.tp, starts[c.tp], name)
        fallback = worker_files_prefix(group, snap.ranges, name)
        return lambda table: first.get(table, fallback)

    async def _write_tables(self, tables: dict[str, pa.Table],
                            prefix: Callable[[str], str]) -> dict[str, tuple[FileInfo, ...]]:
        """Every table's rows written through Spark at once (alike tables share one Spark job),
        files named after ``prefix(table)``; their descriptions by table."""
        names = [name for name, data in tables.items() if data.num_rows]
        writes = [(self.targets[name].table, tables[name], f"{prefix(name)}-{i}") for i, name in enumerate(names)]
        results = await self.offload.run(
            self.files.write_many, writes, target_file_size_bytes=self.settings.target_file_size_bytes,
        ) if writes else []
        out: dict[str, tuple[FileInfo, ...]] = {name: () for name in tables}  # a mirror's deletes alone: no file
        for name, written in zip(names, results, strict=True):
            infos = tuple(to_file_info(f, f.spec_id) for f in written)  # the spec it was written with
            self.metrics.files_written.labels(table=name).inc(len(infos))
            self.metrics.bytes_written.labels(table=name).inc(sum(f.size_bytes for f in infos))
            out[name] = infos
        return out

    # Early writes ----------------------------------------------------------------------------

    def maybe_write_early(self) -> None:
        """Write buffered rows to data files before their round once they pass
        ``buffer.write-ahead-bytes``: a backlog's Spark writing then overlaps its reading, and
        its round has little left to write. One at a time, never beside a round's answer."""
        limit = self.settings.buffer_write_ahead_bytes
        started = self.spark_ready is not None and self.spark_ready.done()
        if (not limit or self.buffers.nbytes < limit or self.writing_early or self.lock.locked()
                or not self.replica.rebalanced.is_set() or not started or self.write_failures.wait_s()):
            return
        self.writing_early = True
        self.tasks.spawn(self._write_early(), "early write")

    async def _write_early(self) -> None:
        try:
            async with self.lock:
                if self.buffers.nbytes < self.settings.buffer_write_ahead_bytes:
                    return  # a round took them meanwhile
                stage = self.buffers.stage(self.replica.generation, self._early_ready())
                if not stage.ranges:
                    return
                await self.hooks.release_backpressure()
                started = time.monotonic()
                self.seq += 1
                try:
                    name = f"early-{uuid.uuid4().hex[:8]}-{self.replica.worker_id}-{self.seq}"
                    files = await self._write_tables(await self._arrow_tables(stage), self._file_prefixes(stage, name))
                except asyncio.CancelledError:  # stopping: the rows go back, as after a failure
                    self.buffers.unstage(stage)
                    raise
                except Exception as exc:
                    self.metrics.write_failures.inc()
                    self.buffers.unstage(stage)
                    self.settle_voided()
                    if not is_retriable(exc):
                        log.error("an early write failed with an error no retry mends; stopping the replica "
                                  "(its partitions' data is read again by their next owner): %s", exc)
                        self.hooks.fail(exc)
                    else:
                        log.error("an early write failed, its rows stay buffered for their round: %s", exc)
                        self._write_failed(exc)
                    return
                self._write_succeeded()
                landed = self.buffers.land(stage, files)
                if landed is not None:  # fault tests: files written, named by no event yet
                    crash_point(self.settings, "worker.after-early-write")
                self.metrics.early_writes.labels(outcome="landed" if landed else "void").inc()
                if landed is None:
                    self._delete_void(files)
                self.settle_voided()
                self.hooks.update_gauges()
                log.info("early write: %d rows of %d partitions in %d files, %.2f s%s", stage.rows, len(stage.ranges),
                         sum(len(f) for f in files.values()), time.monotonic() - started,
                         "" if landed else " (void: a partition moved meanwhile; files deleted)")
        finally:
            self.writing_early = False
        self.maybe_write_early()  # what came in meanwhile may be past the mark already

    def _write_failed(self, exc: Exception, *, check: bool = False) -> None:
        """Count a failed write, or (``check``) existence check of early files
        (agents/write_failures.py): in the log, /status and a metric; at ``write.failure-limit``
        in a row the replica stops with exit code 2."""
        give_up = self.write_failures.failed(exc, check=check)
        self.metrics.write_failures_in_a_row.set(self.write_failures.in_a_row)
        self.replica.status["write_failures"] = self.write_failures.status()
        if give_up:
            self.hooks.fail(WritesKeepFailing(f"{self.write_failures.reason()}; stopping the replica (its partitions' "
                                        f"data is read again by their next owner)"))

    def _write_succeeded(self, *, check: bool = False) -> None:
        failed = self.write_failures.in_a_row
        if failed:
            self.write_failures.succeeded(check=check)
            if self.write_failures.in_a_row:
                return  # a write does not clear a failing existence check
            log.info("writing files succeeded again after %d failed writes", failed)
            self.metrics.write_failures_in_a_row.set(0)
            self.replica.status.pop("write_failures", None)

    def _early_ready(self) -> Callable[[Chunk], bool]:
        """Chunks an early write may take: no mirror table (a round collapses its changes by
        key) and, with evolution, tables that already hold their rows."""
        targets = self.targets
        schema_ready = self.evolver.ready(targets) if self.evolver is not None else None

        def ready(c: Chunk) -> bool:
            if any(name not in targets or targets[name].keys is not None for name in c.names()):
                return False
            return schema_ready is None or schema_ready(c)

        return ready

    def settle_voided(self) -> None:
        """After the buffers dropped data: delete written files no round will report, and seek
        the partitions that read them again back to where those files began."""
        voided, reseek = self.buffers.take_voided()
        if voided:
            self.metrics.early_writes.labels(outcome="dropped").inc(len(voided))
        files: dict[str, tuple[FileInfo, ...]] = {}
        for w in voided:
            if not w.sent:  # a sent one may be named by a partial response: the coordinator's
                for name, infos in w.files.items():
                    files[name] = files.get(name, ()) + infos
        if files:
            self._delete_void(files)
        for tp in reseek:
            st = self.buffers.partitions.get(tp)
            if st is not None and st.active:
                log.info("%s: written files voided, reading again from offset %d", tp, st.next_offset)
                owned = lambda st=st, g=self.replica.generation: self.ownership.owns(st, g)  # noqa: E731
                self.tasks.spawn(unless_moved(self.hooks.reseek_and_resume(st), owned, f"seek of {tp}"), "reseek")

    def _delete_void(self, files: dict[str, tuple[FileInfo, ...]]) -> None:
        tables = {name: self.targets[name].table for name in files if name in self.targets}
        paths = [(tables[name], f.path) for name, infos in files.items() if name in tables for f in infos]
        self.tasks.spawn(self.offload.run(delete_files, paths), "delete void files")

    def _collapse_mirrors(self, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        """Mirror tables' changes collapsed by key (agents/mirror.py), in place: each key's
        last row; returns the keys whose committed rows go, by table."""
        deleted: dict[str, pa.Table] = {}
        for name, data in tables.items():
            keys = self.targets[name].keys
            if keys is None:
                continue
            out = collapse(data, keys, self.settings.cdc_field, upsert=self.settings.upsert_mode)
            tables[name] = out.rows
            if out.deleted_keys.num_rows:
                deleted[name] = out.deleted_keys
        return deleted

    def _backlog_hold(self) -> BacklogHold | None:
        """With commit.catch-up, a round leaves a backlog's rows to the round its end asks for
        (:class:`agents.tasks.BacklogHold`): not under backpressure, nor with a size trigger or
        an idle interval set (their rounds are asked for the data they count)."""
        s = self.settings
        if (not s.commit_catch_up or self.replica.backpressure or s.commit_idle_interval_ms is not None
                or s.commit_max_records is not None or s.commit_max_bytes is not None):
            return None
        return BacklogHold(self.app.consumer, time.time(), s.commit_interval_ms / 1000, BEHIND_MS)

    def _valid_through_ms(self) -> int | None:
        """All records older than this are in the response or earlier ones (asked at the take):
        now, if every owned partition is caught up, else the oldest last-record time of a
        lagging one."""
        if not all(st.active for st in self.buffers.partitions.values()):
            return None
        now_ms = int(time.time() * 1000)
        unread = unread_since_ms(self.buffers.partitions, self.app.consumer)
        # A backlog (the last record read is over BEHIND_MS old, more to read): once read to the
        # ends, the replica asks for a round (iceberg.control.commit.catch-up, agents/ingest.py).
        self.replica.behind = unread is not None and now_ms - unread > BEHIND_MS
        return now_ms if unread is None else min(now_ms, unread)
