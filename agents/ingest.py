"""The ingest pipeline of a worker replica: each fetch's records of active partitions, in
offset order, screened (tombstones, oversized values), routed to their tables, converted to
Arrow in bulk (agents/convert, agents/formats, the Debezium transform, schema evolution) and
buffered (agents/buffer.py); bad records go to the dead letters. Full buffers pause the
partitions and ask for an early round (backpressure). A fetch with records for a table that
does not exist and may not be created holds its partition back until the table is back
(agents/missing.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from faust.types import TP

from agents.buffer import Chunk, PartitionState
from agents.convert import Reject
from agents.deadletter import screen
from agents.routing import Routes
from agents.kafka import Fetched
from agents.tables import Target, create_target, holds_group_state, load_target, not_created
from agents.tasks import highwater, unless_moved
from agents.worker_state import WorkerState
from icesink.shared.control import ControlReader
from icesink.shared.errors import ConfigError
from icesink.shared.protocol import CommitRequest, CommitToTable, SchemaProposal
from icesink.shared.faults import should_crash

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

log = logging.getLogger(__name__)

REQUEST_EVERY_S = 5.0  # while the buffers stay full, an early round is asked this often
# An active partition behind its high watermark that took no record for this long is sought
# again at its next offset (a fetch dropped in a rebalance or a broker restart would otherwise
# hold it until a newer record shows the gap, for ever on a partition that went quiet).
# Offsets below the high watermark need not be records: transaction markers take offsets too.
STALL_S = 15.0
COMMITTED_SCAN_S = 60.0  # reading the control log for the tables the group committed to


@dataclasses.dataclass(frozen=True)
class StallProbe:
    """What a partition's stall probe saw (Ingest._check_stalls): its next offset and high
    watermark, since when, and whether it was sought again (probed) at that offset."""

    next_offset: int
    highwater: int | None
    since: float
    probed: bool


class Ingest(WorkerState):
    """Mixed into :class:`agents.worker.Worker`, whose state it shares."""

    async def on_fetch(self, fetched: Fetched) -> None:
        """Take the records of active partitions in offset order, convert them in bulk."""
        if should_crash(self.settings, "worker.ingest-bug"):
            raise RuntimeError("fault injection: an unexpected error while converting a batch")
        for tp, records in fetched.records.items():
            self.metrics.records_consumed.labels(topic=tp.topic).inc(len(records))
            st = self.buffers.partitions.get(tp)
            if st is None or not st.active:
                continue
            if self.replica.backpressure or self._missing.is_held(tp):
                # Paused because the buffers are full (records still in flight would grow them
                # past the bound) or a table is missing. They are read again: the release seeks back.
                continue
            taken, suspect = st.select(records, fetched.fetched_at)
            if taken:
                await self._buffer(st, taken)
                # After a round's write at many tables, a fetch's decoding can hold the loop for
                # a tenth of a second or more: let the rest of the loop in between partitions
                # (the leader's coordinator reads the round's answers on this loop too).
                await asyncio.sleep(0)
            if suspect is not None and not st.reseeking:
                st.suspect_gap(suspect)
                log.info("%s: fresh record at %d while expecting %d; seeking again", tp, suspect, st.next_offset)
                st.reseeking = True
                owned = lambda st=st, g=self.replica.generation: self.ownership.owns(st, g)  # noqa: E731
                self._owner.spawn(unless_moved(self.ownership.seek(st, st.next_offset), owned, f"seek of {tp}"), "reseek")
        self.buffers.converted(fetched)
        self.update_gauges()
        if self.buffers.full:
            await self._apply_backpressure()
        self.rounds.maybe_write_early()

    def _check_stalls(self, now: float) -> None:
        """Probe any active partition that is behind its high watermark and has taken no
        record for STALL_S: seek it again at its next offset (called every few seconds by the
        worker's housekeeping). Records taken after a probe mean the partition was stalled
        (warned, counted). If none come, what lies below the high watermark is no record at
        all (transaction markers, a compacted tail): that partition is not probed again until
        its high watermark moves."""
        if self.replica.backpressure:
            self._progress.clear()
            return
        consumer = self.app.consumer
        for tp, st in list(self.buffers.partitions.items()):
            probe = st.active and not st.reseeking and not self._missing.is_held(tp)
            hw = highwater(consumer, tp.topic, tp.partition) if probe else None
            seen = self._progress.get(tp)
            if seen is not None and seen.probed and st.next_offset > seen.next_offset:
                self.metrics.partition_stalls.labels(topic=tp.topic, partition=str(tp.partition)).inc()
                log.warning("%s was stalled: records from offset %d were taken only after seeking again",
                            tp, seen.next_offset)
            if hw is None or hw <= st.next_offset or seen is None or seen.next_offset != st.next_offset:
                self._progress[tp] = StallProbe(st.next_offset, hw, now, probed=False)
                continue
            if (seen.probed and seen.highwater == hw) or now - seen.since < STALL_S:
                continue
            self._progress[tp] = StallProbe(st.next_offset, hw, now, probed=True)
            log.info("%s: %d offsets behind its high watermark %d and no record taken for %.0f s; seeking to %d again",
                     tp, hw - st.next_offset, hw, now - seen.since, st.next_offset)
            st.reseeking = True
            owned = lambda st=st, g=self.replica.generation: self.ownership.owns(st, g)  # noqa: E731
            self._owner.spawn(unless_moved(self._reseek_and_resume(st), owned, f"seek of {tp}"), "reseek")
        for tp in set(self._progress) - set(self.buffers.partitions):
            del self._progress[tp]

    async def _reseek_and_resume(self, st: PartitionState) -> None:
        await self.ownership.seek(st, st.next_offset)
        if not self.replica.backpressure and st.active and not self._missing.is_held(st.tp):
            self.app.consumer.resume_partitions([TP(st.tp.topic, st.tp.partition)])

    async def _buffer(self, st: PartitionState, messages: Sequence[Any]) -> None:
        # Tombstones and too-large values never reach conversion; their offsets still count.
        screened = screen(messages, self.settings.max_record_bytes)
        values = screened.values
        fanout = self.decoder.decode_fanout(values, screened.messages_of(messages))
        routes = fanout.routes if fanout is not None else self.router.route(values) if values else Routes({}, ())
        if any(name not in self.targets for name in routes.by_table) and await self._held_back(st, routes.by_table):
            return  # nothing of this fetch is taken: read again once its tables exist
        self.deadletters.tombstones(st.tp.topic, screened.tombstones)
        rejects: list[tuple[Reject, str | None]] = [(r, None) for r in screened.rejects]
        self.metrics.bytes_consumed.labels(topic=st.tp.topic).inc(screened.nbytes)
        if routes.unrouted:
            no_route = sum(1 for r in routes.unrouted if r.reason.startswith("no route"))
            self.metrics.records_unrouted.labels(topic=st.tp.topic).inc(no_route)
            rejects += [(r, None) for r in screened.at_messages(routes.unrouted)]
        if fanout is not None:  # one decode for all its tables, kept whole (agents/buffer.py FanoutRows)
            rows_of = fanout.rows
            rejects += list(zip(screened.at_messages(r.reject for r in fanout.rejects), (r.table for r in fanout.rejects),
                                strict=True))
            n = rows_of.table.num_rows
            await self._finish(st, messages, rejects, n, Chunk(st.tp, messages[-1].offset + 1, {},
                                                               rows_of.table.nbytes, n, rows_of if n else None))
            return
        # Tables decoded together are counted once, as the rows they share: an nbytes walk per
        # table and fetch was a quarter of a fetch's handling at 200 tables (py-spy).
        shared = await self.decoder.decode_together(routes.by_table, values, messages, screened.positions)
        nbytes = shared.nbytes
        tables: dict[str, pa.Table] = {}
        rows = 0
        landed = np.zeros(len(values), dtype=bool)
        for name, idx in routes.by_table.items():
            whole = len(idx) == len(values)
            target = self.targets.get(name)
            converted = shared.converted.get(name)
            counted = converted is not None
            if converted is None:
                subset = values if whole else [values[i] for i in idx]
                target = target or await self._target(name, subset)
                sub_messages = screened.messages_of(messages) if whole else [messages[screened.positions[i]] for i in idx]
                converted = await self.decoder.decode(name, target, subset, sub_messages)
            if target is not None and target.keys is not None:  # a mirror table: keys and operations
                converted = self.decoder.screen_changes(name, target.keys, converted)
            if converted.rejects:
                in_values = converted.rejects if whole else [
                    dataclasses.replace(r, index=int(idx[r.index])) for r in converted.rejects]
                rejects += [(r, name) for r in screened.at_messages(in_values)]
            if target is not None and converted.table.num_rows:  # None: no record could create it
                tables[name] = converted.table
                nbytes += 0 if counted else converted.table.nbytes
                rows += converted.table.num_rows
                landed[idx[converted.indices.to_numpy(zero_copy_only=False)]] = True
        await self._finish(st, messages, rejects, int(landed.sum()),
                           Chunk(st.tp, messages[-1].offset + 1, tables, nbytes, rows))

    async def _finish(self, st: PartitionState, messages: Sequence[Any], rejects: list[tuple[Reject, str | None]],
                      converted: int, chunk: Chunk) -> None:
        if rejects:  # errors.tolerance=none raises here: nothing of this batch is buffered
            await self.deadletters.reject(messages, rejects)
        self.metrics.records_converted.labels(topic=st.tp.topic).inc(converted)
        last = messages[-1]
        ts = last.timestamp if last.timestamp is not None and last.timestamp >= 0 else None
        self.buffers.add(chunk, last.offset, ts)

    async def _propose(self, proposal: SchemaProposal) -> None:
        try:
            await self.producer.send(proposal)
            self.metrics.schema_proposals.labels(table=proposal.table).inc()
        except Exception as exc:  # re-sent at the next round while the data waits for it
            log.warning("schema proposal for %s not sent (%s); retried at the next round", proposal.table, exc)

    async def _evolution_ready(self) -> Callable[[Chunk], bool] | None:
        """At a round: reload the tables buffered data was decoded for with an evolved schema
        (the coordinator applied the proposals before this round); a chunk is ready when its
        tables can hold it. Data not ready waits; its proposal is sent again."""
        if self.evolver is None:
            return None
        for name in self.evolver.tables_to_reload(self.buffers, self.targets):
            target = await self.offload.run(load_target, self.catalog, name, self.settings)
            if target is not None:
                self.targets[name] = target
                self.evolver.refreshed(name, target.arrow_schema)
        for name in list(self.evolver.schemas):
            proposal = self.evolver.pending_proposal(name, self.targets[name].arrow_schema)
            if proposal is not None:
                await self._propose(proposal)
        return self.evolver.ready(self.targets)

    async def _target(self, name: str, values: list[bytes]) -> Target | None:
        """The table ``name``: loaded if it exists (a dynamic route to an existing table), else
        auto-created from these records (None: no record tells its schema)."""
        target = await self.offload.run(load_target, self.catalog, name, self.settings)
        if target is None:
            inferred: pa.Schema | Schema | None
            if self.debezium is not None:
                inferred = self.format.with_extras(self.debezium.infer_schema(values))
            else:
                inferred = self.format.table_schema(values, timestamp_fields=self.settings.timestamp_fields_of(name))
            if inferred is None:
                return None
            target = await self.offload.run(create_target, self.catalog, self.settings, name, inferred)
        self.targets[name] = target
        return target

    async def _held_back(self, st: PartitionState, names: Iterable[str]) -> bool:
        """Whether a fetch of ``st`` with records routed to ``names`` waits for a missing table
        (agents/missing.py): then ``st`` is paused where it is, and True. A table not loaded is
        looked up; without auto-create, one that does not exist is refused on the group's first
        start (exit code 2) and waited for after."""
        missing = []
        for name in names:
            if name in self.targets:
                continue
            if name not in self._missing.tables:
                if self.settings.auto_create:
                    continue  # created from its records (_target)
                target = await self.offload.run(load_target, self.catalog, name, self.settings)
                if target is not None:
                    self.targets[name] = target
                    continue
                if not await self._dropped(name):
                    raise not_created(name)
                self._wait_for(name)
            missing.append(name)
        if not missing:
            return False
        self._missing.hold(st.tp, missing)
        self.app.consumer.pause_partitions([TP(st.tp.topic, st.tp.partition)])
        self.update_paused()
        log.warning("%s: records from offset %d go to %s, which does not exist: the partition is held there "
                    "until it does (/status missing_tables)", st.tp, st.next_offset, ", ".join(missing))
        return True

    def _wait_for(self, name: str) -> None:
        if self._missing.add(name):
            self.metrics.table_missing.labels(table=name).set(1)
            log.warning("table %s does not exist (dropped by another writer?) and iceberg.tables.auto-create-enabled "
                        "is false: partitions with records for it wait until it is back (recreated with the same "
                        "schema, partition spec and location); the other partitions go on", name)

    async def _group_has_run(self) -> bool:
        """Whether the group completed a round (the coordinator's group has a committed offset)
        or a table holds its sink state: a table missing now was not a typo of a first start."""
        if not self._missing.group_has_run:
            group = self.settings.group_id
            reader = ControlReader(self.bootstrap, self.settings.control_topic, group,
                                   self.settings.kafka_client_kwargs(), commit_group=f"{group}-coordinator")
            await reader.start()
            try:
                ran = await reader.committed() is not None
            finally:
                await reader.stop()
            if not ran:
                names = sorted(set(self.settings.tables) | set(self.targets))
                ran = await self.offload.run(holds_group_state, self.catalog, names, group)
            self._missing.group_has_run = ran
        return self._missing.group_has_run

    async def _dropped(self, name: str) -> bool:
        """Whether ``name``, which does not exist, existed for the group (agents/missing.py):
        the group has run and the table is configured, or the group committed to it (or its
        control log, truncated, cannot tell)."""
        if not await self._group_has_run():
            return False
        if name in self.settings.tables:
            return True
        committed = await self._committed_tables()
        return committed is None or name in committed

    async def _committed_tables(self) -> set[str] | None:
        """The tables the group committed to, as its control log shows (CommitToTable events,
        read once from the log's start, signed by the group's key) and as read since; None if the
        log cannot tell: truncated (its first events deleted), or not read in time."""
        if self._missing.committed is None:
            reader = ControlReader(self.bootstrap, self.settings.control_topic, self.settings.group_id,
                                   self.settings.kafka_client_kwargs(), secret=self.secret.keyring)
            names: set[str] = set()
            await reader.start()
            try:
                start = await reader.seek_to_beginning()
                end = await reader.end_offset()
                deadline = time.monotonic() + COMMITTED_SCAN_S
                complete = start == 0
                while complete and await reader.position() < end:
                    if time.monotonic() > deadline:
                        log.warning("reading control topic %r to offset %d for the tables the group committed to "
                                    "timed out: a missing table is waited for as if dropped",
                                    self.settings.control_topic, end)
                        complete = False
                        break
                    names.update(ev.table for _, ev in await reader.read(1.0) if isinstance(ev, CommitToTable))
            finally:
                await reader.stop()
            self._missing.committed, self._missing.log_complete = names, complete
        if not self._missing.log_complete:
            return None
        return self._missing.committed | self._missing.seen_committed

    async def _look_for_missing(self) -> None:
        """Look each missing table up again once its backoff is over (from _housekeeping); the
        partitions a table that is back held read on from where they stopped."""
        for name in self._missing.due():
            error = None
            try:
                target = await self.offload.run(load_target, self.catalog, name, self.settings)
            except ConfigError as exc:  # back, but the settings do not fit it (mirror keys, column properties)
                self.fail(exc)
                return
            except Exception as exc:  # noqa: BLE001 - the catalog is away: looked up again after the backoff
                target, error = None, f"{type(exc).__name__}: {exc}"
            if target is None:
                if self._missing.still_missing(name, error):
                    m = self._missing.tables[name]
                    log.warning("table %s still does not exist (%d look-ups%s); held partitions: %s", name,
                                m.attempts, f", the last failed: {error}" if error else "",
                                ", ".join(map(str, sorted(m.held))) or "none")
                continue
            self.targets[name] = target
            freed = self._missing.found(name)
            self.metrics.table_missing.labels(table=name).set(0)
            log.info("table %s exists again: partitions %s read on", name, ", ".join(map(str, freed)) or "none")
            for tp in freed:
                st = self.buffers.partitions.get(tp)
                if st is None or not st.active:
                    continue  # its Resume seeks and resumes it
                st.reseeking = True
                owned = lambda st=st, g=self.replica.generation: self.ownership.owns(st, g)  # noqa: E731
                self._owner.spawn(unless_moved(self._reseek_and_resume(st), owned, f"seek of {tp}"), "reseek")
        self.update_paused()

    async def _apply_backpressure(self) -> None:
        if not self.replica.backpressure:
            self.replica.backpressure = True
            active = [TP(tp.topic, tp.partition) for tp, st in self.buffers.partitions.items() if st.active]
            self.app.consumer.pause_partitions(active)
            log.info("buffers full (%d bytes): pausing %d partitions until the next round", self.buffers.nbytes, len(active))
            self.update_paused()
        await self._request_commit()

    async def _request_commit(self) -> None:
        """Ask for an early round: at once the first time the buffers fill after a release,
        then again every REQUEST_EVERY_S while they stay full (from _housekeeping too: paused
        partitions bring no more batches to on_events)."""
        now = time.monotonic()
        if now - self._last_request >= REQUEST_EVERY_S:
            self._last_request = now
            self.metrics.early_commit_requests.inc()
            await self.producer.send(CommitRequest(self.worker_id, self.buffers.nbytes))

    async def _release_backpressure(self) -> None:
        """Resume reading where each buffer ends. The seek is needed: records that arrived
        while paused were skipped (on_events), and Faust silently drops the rest of a fetch
        for a partition paused while that fetch is handed out (Consumer.getmany checks the
        live set of active partitions), so the consumer's position is past them."""
        if not self.replica.backpressure or self.buffers.full:
            return
        reading = [st for tp, st in self.buffers.partitions.items() if st.active and not self._missing.is_held(tp)]
        try:
            await self.ownership.seek_all([(st, st.next_offset) for st in reading])
        except Exception as exc:  # stay paused: _housekeeping tries again
            log.warning("seek before resuming failed (%s); partitions stay paused", exc)
            return
        if not self.replica.backpressure or self.buffers.full:
            return
        self.replica.backpressure = False
        self._last_request = 0.0  # the next fill is a new request, not a repeat
        held = self._missing.is_held
        active = [TP(tp.topic, tp.partition) for tp, st in self.buffers.partitions.items() if st.active and not held(tp)]
        self.app.consumer.resume_partitions(active)
        self.update_paused()

    async def _check_backpressure(self) -> None:
        """Paused for full buffers: ask again while no round has come (the send failed, the
        coordinator failed over and lost the request, the round found no active partition),
        or resume if the buffers shrank without one (partitions released or rewound)."""
        if not self.buffers.full:
            await self._release_backpressure()
            return
        try:
            await self._request_commit()
        except Exception as exc:
            log.warning("commit request not sent (%s); retried", exc)

