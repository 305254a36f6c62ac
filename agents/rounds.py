"""Answering commit rounds: the control loop of a worker replica. On StartCommit the
buffers are written through Spark and reported (DataWritten, then DataComplete: agents/respond.py);
on CommitComplete the consumer group's offsets follow what Iceberg holds."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import pyarrow as pa
from faust.types import TP

from agents.deadletter import DeadLetterSendError
from agents.keys_files import write_keys_file
from agents.mirror import collapse
from agents.respond import send_response
from agents.source_consumer import driver
from agents.tasks import highwater
from agents.worker_state import WorkerState
from icesink.errors import ResponseSendError, is_retriable
from icesink.protocol import CommitComplete, DataComplete, DataWritten, FileInfo, Resume, Rewind, StartCommit
from icesink.faults import crash_point, die, should_crash
from icesink.iceberg import to_file_info

log = logging.getLogger(__name__)



class Rounds(WorkerState):
    """Mixed into :class:`agents.worker.Worker`, whose state it shares."""

    async def _control_loop(self) -> None:
        while True:
            for offset, ev in await self.reader.read(1.0):
                await self._on_control(offset, ev)

    async def _on_control(self, offset: int, ev: Any) -> None:
        if not self._epochs.admit(offset, ev):  # from a coordinator that was replaced
            return
        match ev:
            case Resume():
                self._owner.spawn(self._on_resume(ev), "resume")
            case StartCommit():
                self._open_round = ev.commit_id
                self._owner.spawn(self._respond(ev.commit_id), "respond")
            case CommitComplete():
                if self._open_round == ev.commit_id:
                    self._open_round = None
                await self._on_commit_complete(ev)
            case Rewind():
                await self._on_rewind(ev)
            case _:
                pass

    async def _respond(self, commit_id: str) -> None:
        async with self._respond_lock:
            # Mid-rebalance: answer once the new assignment is settled, never skip a round.
            await self._rebalanced.wait()
            await self._spark_ready
            try:
                ready = await self._evolution_ready()
            except Exception as exc:  # the catalog is down: the data waits for the next round
                log.error("round %s not answered, data kept: reloading tables failed: %s", commit_id, exc)
                return
            snap = self.buffers.take(self.generation, ready)
            if not snap.ranges:
                return
            try:  # at-least-once: dead letters are acknowledged before their offsets are reported
                await self.deadletters.flush()
            except DeadLetterSendError as exc:
                log.error("round %s not answered, data kept for the next round: %s", commit_id, exc)
                self.buffers.restore(snap)
                return
            if self.deadletters.delivered:  # fault tests: letters out, their offsets not yet reported
                crash_point(self.settings, "worker.after-dead-letters")
            await self._release_backpressure()
            response_id = str(uuid.uuid4())
            written: list[DataWritten] = []
            started = time.monotonic()
            if should_crash(self.settings, "worker.during-write"):
                asyncio.get_running_loop().call_later(0.5, die, "worker.during-write")
            try:
                cast = self.evolver.conformer(self.targets) if self.evolver is not None else None
                tables = snap.tables(cast)
                deleted = self._collapse_mirrors(tables)
                writes = []
                for name, data in tables.items():
                    self._seq += 1
                    writes.append((self.targets[name].table, data, f"{commit_id[:8]}-{self.worker_id}-{self._seq}"))
                # every table of the round at once: alike tables share one Spark job
                results = await self.offload.run(
                    self.spark.write_many, writes, target_file_size_bytes=self.settings.target_file_size_bytes,
                ) if writes else []
                for name, files in zip(tables, results, strict=True):
                    infos = tuple(to_file_info(f, f.spec_id) for f in files)  # the spec it was written with
                    self.metrics.files_written.labels(table=name).inc(len(infos))
                    self.metrics.bytes_written.labels(table=name).inc(sum(f.size_bytes for f in infos))
                    keys_files: tuple[FileInfo, ...] = ()
                    if name in deleted:  # a mirror table: the keys whose committed rows go
                        keys_files = (await self.offload.run(
                            write_keys_file, self.targets[name].table, deleted[name],
                            f"{commit_id[:8]}-{self.worker_id}-{self._seq}"),)
                    written.append(DataWritten(commit_id, response_id, self.worker_id, name, infos, keys_files))
            except Exception as exc:
                self.metrics.write_failures.inc()
                self.buffers.restore(snap)
                if not is_retriable(exc):  # every round would fail alike: stop loudly; nothing is committed
                    log.error("writing files for round %s failed with an error no retry mends; stopping the "
                              "replica (its partitions' data is read again by their next owner): %s", commit_id, exc)
                    self.fail(exc)
                    return
                log.error("writing files for round %s failed, data kept for the next round: %s", commit_id, exc)
                return
            wrote_s = time.monotonic() - started
            self.metrics.write_duration.observe(wrote_s)
            sending = time.monotonic()
            try:  # DataWritten split to fit the control topic, then DataComplete
                sent = await send_response(self.producer, written, lambda n: DataComplete(
                    commit_id, response_id, self.worker_id, snap.generation, snap.ranges, n, self._valid_through_ms(),
                ), lambda: crash_point(self.settings, "worker.mid-response"))
            except ResponseSendError as exc:
                log.error("round %s not answered, data kept for the next round: %s", commit_id, exc)
                self.buffers.restore(snap)
                return
            self._update_gauges()
            log.info("round %s: answered %d partitions, %d rows in %d files (%d DataWritten; written in %.2f s, "
                     "sent in %.2f s)", commit_id, len(snap.ranges), snap.rows, sum(len(w.files) for w in written),
                     sent, wrote_s, time.monotonic() - sending)

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

    def _valid_through_ms(self) -> int | None:
        """All records older than this are in the response or earlier ones: now, if every
        owned partition is caught up, else the oldest last-record time of a lagging one."""
        now_ms = int(time.time() * 1000)
        out = now_ms
        for tp, st in self.buffers.partitions.items():
            if not st.active:
                return None
            hw = highwater(self.app.consumer, tp.topic, tp.partition)
            if hw is not None and st.next_offset < hw:
                out = min(out, st.last_record_ms or 0)
        return out

    async def _on_commit_complete(self, ev: CommitComplete) -> None:
        """Data up to these positions is in Iceberg: the consumer group may now say so."""
        offsets = {}
        for p in ev.positions:
            st = self.buffers.partitions.get(p.tp)
            if st is not None and st.active:
                offsets[TP(p.tp.topic, p.tp.partition)] = p.offset
        if offsets:
            try:
                await driver(self.app)._commit(offsets)
            except Exception as exc:  # a hint only; the truth is in the snapshot summaries
                log.warning("consumer group offset commit failed: %s", exc)
        self.status.update(last_commit_id=ev.commit_id, valid_through_ms=ev.valid_through_ms)
