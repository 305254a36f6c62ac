"""The ingest pipeline of a worker replica: each fetch's records of active partitions, in
offset order, screened (tombstones, oversized values), routed to their tables, converted to
Arrow in bulk (agents/convert, agents/formats, the Debezium transform, schema evolution) and
buffered (agents/buffer.py); bad records go to the dead letters. Full buffers pause the
partitions and ask for an early round (backpressure); data past iceberg.control.commit.max-records
or max-bytes, or the first rows after an idle round, ask for one without pausing
(docs/commits.md). A fetch with records for a table that does not exist and may not be created
holds its partition back until the table is back (agents/missing.py; the tables themselves:
agents/table_lookup.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Protocol

import faust
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from faust.types import TP

from agents.buffer import Buffers, Chunk, PartitionState
from agents.convert import Reject
from agents.deadletter import DeadLetters, screen
from agents.decode import BatchDecoder
from agents.kafka import Fetched
from agents.missing import MissingTables
from agents.parts import Replica
from agents.routing import Routes
from agents.tables import Target
from agents.transforms import Chain
from agents.tasks import TaskOwner, highwater, unless_moved, unread_since_ms
from icesink.shared.config import Settings
from icesink.shared.deadletter_table import letter_rows
from icesink.shared.faults import hold_point, should_crash
from icesink.shared.metrics import Metrics
from icesink.shared.protocol import CommitRequest, TopicPartition

log = logging.getLogger(__name__)

# An early round is asked once per round that took data, and again this often while none comes.
REQUEST_EVERY_S = 5.0
# An active partition behind its high watermark that took no record for this long is sought
# again at its next offset (a fetch dropped in a rebalance or a broker restart would otherwise
# hold it until a newer record shows the gap, for ever on a partition that went quiet).
# Offsets below the high watermark need not be records: transaction markers take offsets too.
STALL_S = 15.0


@dataclasses.dataclass(frozen=True)
class StallProbe:
    """What a partition's stall probe saw (Ingest.check_stalls): its next offset and high
    watermark, since when, and whether it was sought again (probed) at that offset."""

    next_offset: int
    highwater: int | None
    since: float
    probed: bool


class TableSource(Protocol):
    """What the ingest needs of the replica's tables (agents/table_lookup.py TableLookup)."""

    targets: dict[str, Target]

    async def targets_of(self, wanted: Mapping[str, list[bytes]]) -> dict[str, Target | None]:
        """Each table of ``wanted`` (name -> its records) loaded, or created from its records
        (None: none tells its schema); the created ones together."""

    async def held_back(self, tp: TopicPartition, names: Iterable[str]) -> list[str]:
        """Of ``names``, the tables ``tp`` waits for (then it is held: agents/missing.py)."""

    async def refresh(self, by_table: Mapping[str, npt.NDArray[np.int64]], values: Sequence[bytes]) -> bool:
        """Reload tables whose records carry fields their cached schema lacks (changed by
        another tool); whether one changed."""

    async def look_for_missing(self) -> list[TopicPartition]:
        """The partitions that missing tables, back now, freed."""


class Seeker(Protocol):
    """What the ingest needs of partition ownership (agents/ownership.py)."""

    def owns(self, st: PartitionState, generation: int) -> bool: ...

    async def seek(self, st: PartitionState, offset: int) -> None: ...

    async def seek_all(self, targets: list[tuple[PartitionState, int]]) -> None: ...


class Ingest:
    """Takes the Faust app's fetches into ``buffers``: decoded by ``decoder`` for the tables
    of ``tables``, bad records to ``deadletters``; pauses (``app``'s consumer) and asks for an
    early round (``send``) when the buffers are full; ``write_early`` is called after each
    fetch (agents/rounds.py writes past ``buffer.write-ahead-bytes``)."""

    def __init__(self, settings: Settings, metrics: Metrics, replica: Replica, buffers: Buffers,
                 missing: MissingTables, decoder: BatchDecoder, deadletters: DeadLetters, tables: TableSource,
                 app: faust.App, ownership: Seeker, tasks: TaskOwner,
                 send: Callable[[CommitRequest], Awaitable[object]], write_early: Callable[[], None]) -> None:
        self.settings = settings
        self.metrics = metrics
        self.replica = replica
        self.buffers = buffers
        self.missing = missing
        self.decoder = decoder
        self.deadletters = deadletters
        self.tables = tables
        self.targets = tables.targets  # shared with the decoder and the rounds
        self.app = app
        self.ownership = ownership
        self.tasks = tasks
        self.send = send
        self.write_early = write_early
        self.progress: dict[TopicPartition, StallProbe] = {}  # stall probes (check_stalls)
        self.last_request = 0.0  # when an early round was last asked for (request_commit)
        self.requested_at_take = -1  # buffers.takes then: a round that took data since allows a new ask
        self.chain = Chain(settings.transform_chain)

    async def on_fetch(self, fetched: Fetched) -> None:
        """Take the records of active partitions in offset order, convert them in bulk."""
        if should_crash(self.settings, "worker.ingest-bug"):
            raise RuntimeError("fault injection: an unexpected error while converting a batch")
        for tp, records in fetched.records.items():
            self.metrics.records_consumed.labels(topic=tp.topic).inc(len(records))
            st = self.buffers.partitions.get(tp)
            if st is None or not st.active:
                continue
            if self.replica.backpressure or self.missing.is_held(tp):
                # Paused because the buffers are full (records still in flight would grow them
                # past the bound) or a table is missing. They are read again: the release seeks back.
                continue
            taken, suspect = st.select(records, fetched.fetched_at)
            if taken:
                await self.buffer(st, taken)
                # After a round's write at many tables, a fetch's decoding can hold the loop for
                # a tenth of a second or more: let the rest of the loop in between partitions
                # (the leader's coordinator reads the round's answers on this loop too).
                await asyncio.sleep(0)
            if suspect is not None and not st.reseeking:
                st.suspect_gap(suspect)
                log.info("%s: fresh record at %d while expecting %d; seeking again", tp, suspect, st.next_offset)
                st.reseeking = True
                self._spawn_seek(st, self.ownership.seek(st, st.next_offset))
        self.buffers.converted(fetched)
        self.update_gauges()
        if self.settings.fault_hold_at:  # fault tests: reading stops after a fetch, until released
            await hold_point(self.settings, "worker.after-fetch")
        if self.buffers.full:
            await self._apply_backpressure()
        else:
            await self.maybe_request()
        self.write_early()

    def _spawn_seek(self, st: PartitionState, seek: Coroutine[Any, Any, None]) -> None:
        """``seek`` of ``st`` in the background; a failure after ``st`` moved away is no error."""
        owned = lambda st=st, g=self.replica.generation: self.ownership.owns(st, g)  # noqa: E731
        self.tasks.spawn(unless_moved(seek, owned, f"seek of {st.tp}"), "reseek")

    async def housekeep(self, now: float) -> None:
        """Every few seconds (the worker's housekeeping): full buffers ask again or resume,
        stalled partitions are probed, missing tables looked up again, gauges updated."""
        if self.replica.backpressure:
            await self.check_backpressure()
        else:
            try:
                await self.maybe_request()
            except Exception as exc:
                log.warning("commit request not sent (%s); retried", exc)
        self.check_stalls(now)
        self.read_on(await self.tables.look_for_missing())
        self.update_gauges()

    def read_on(self, freed: Iterable[TopicPartition]) -> None:
        """Partitions a table that is back freed read on from where they stopped."""
        for tp in freed:
            st = self.buffers.partitions.get(tp)
            if st is None or not st.active:
                continue  # its Resume seeks and resumes it
            st.reseeking = True
            self._spawn_seek(st, self.reseek_and_resume(st))
        self.update_paused()

    def check_stalls(self, now: float) -> None:
        """Probe any active partition that is behind its high watermark and has taken no
        record for STALL_S: seek it again at its next offset (called every few seconds by the
        worker's housekeeping). Records taken after a probe mean the partition was stalled
        (warned, counted). If none come, what lies below the high watermark is no record at
        all (transaction markers, a compacted tail): that partition is not probed again until
        its high watermark moves."""
        if self.replica.backpressure:
            self.progress.clear()
            return
        consumer = self.app.consumer
        for tp, st in list(self.buffers.partitions.items()):
            probe = st.active and not st.reseeking and not self.missing.is_held(tp)
            hw = highwater(consumer, tp.topic, tp.partition) if probe else None
            seen = self.progress.get(tp)
            if seen is not None and seen.probed and st.next_offset > seen.next_offset:
                self.metrics.partition_stalls.labels(topic=tp.topic, partition=str(tp.partition)).inc()
                log.warning("%s was stalled: records from offset %d were taken only after seeking again",
                            tp, seen.next_offset)
            if hw is None or hw <= st.next_offset or seen is None or seen.next_offset != st.next_offset:
                self.progress[tp] = StallProbe(st.next_offset, hw, now, probed=False)
                continue
            if (seen.probed and seen.highwater == hw) or now - seen.since < STALL_S:
                continue
            self.progress[tp] = StallProbe(st.next_offset, hw, now, probed=True)
            log.info("%s: %d offsets behind its high watermark %d and no record taken for %.0f s; seeking to %d again",
                     tp, hw - st.next_offset, hw, now - seen.since, st.next_offset)
            st.reseeking = True
            self._spawn_seek(st, self.reseek_and_resume(st))
        for tp in set(self.progress) - set(self.buffers.partitions):
            del self.progress[tp]

    async def reseek_and_resume(self, st: PartitionState) -> None:
        """Read ``st`` again from its next offset."""
        await self.ownership.seek(st, st.next_offset)
        if not self.replica.backpressure and st.active and not self.missing.is_held(st.tp):
            self.app.consumer.resume_partitions([TP(st.tp.topic, st.tp.partition)])

    async def buffer(self, st: PartitionState, messages: Sequence[Any]) -> None:
        """``messages`` of ``st``, in offset order: screened, routed, decoded and buffered."""
        reader = (self.replica.generation, st.next_offset)  # whose records these are (_finish)
        # Tombstones and too-large values never reach conversion; their offsets still count.
        # The transforms' batch steps (agents/transforms/): records a Filter drops, each record's topic.
        applied = self.chain.apply(st.tp.topic, messages) if self.chain else None
        screened = screen(messages, self.settings.max_record_bytes, None if applied is None else applied.dropped)
        values = screened.values
        kept = screened.messages_of(messages)
        # registry values and keys: their schemas (waits through an outage); Apicurio's headers mode: framed
        values = await self.decoder.prepare(values, kept)
        fanout = self.decoder.decode_fanout(values, kept)
        topics = None  # each value's topic, for routing by topic (agents/routing.py)
        if self.decoder.router.by_topic:
            topics = (applied.topics.take(pa.array(screened.positions, pa.int64())) if applied is not None
                      else pa.repeat(pa.scalar(st.tp.topic), len(values)))
        routes = (fanout.routes if fanout is not None else self.decoder.router.route(values, topics=topics)
                  if values else Routes({}, ()))
        if any(name not in self.targets for name in routes.by_table) and await self._held_back(st, routes.by_table):
            return  # nothing of this fetch is taken: read again once its tables exist
        if await self.tables.refresh(routes.by_table, values) and fanout is not None:
            fanout = None  # decoded against a schema another tool changed since: the usual way, again
            routes = self.decoder.router.route(values, topics=topics)
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
            await self._finish(st, reader, messages, rejects, n, Chunk(st.tp, messages[-1].offset + 1, {},
                                                                       rows_of.table.nbytes, n, rows_of if n else None))
            return
        # Tables decoded together are counted once, as the rows they share: an nbytes walk per
        # table and fetch was a quarter of a fetch's handling at 200 tables (py-spy).
        # New tables first (looked up side by side, the missing ones created together), so that
        # they are decoded together with the others.
        wanted = {name: _subset(values, idx) for name, idx in routes.by_table.items() if name not in self.targets}
        if wanted:
            await self.tables.targets_of(wanted)
        shared = await self.decoder.decode_together(routes.by_table, values, messages, screened.positions)
        subsets = {name: wanted[name] if name in wanted else _subset(values, idx)
                   for name, idx in routes.by_table.items() if name not in shared.converted}
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
                subset = subsets[name]
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
        await self._finish(st, reader, messages, rejects, int(landed.sum()),
                           Chunk(st.tp, messages[-1].offset + 1, tables, nbytes, rows))

    async def _finish(self, st: PartitionState, reader: tuple[int, int], messages: Sequence[Any],
                      rejects: list[tuple[Reject, str | None]], converted: int, chunk: Chunk) -> None:
        """Dead letters sent and the chunk buffered, if ``st`` is still read where ``reader``
        (generation, next offset) took ``messages``: a rebalance or a rewind while they were
        converted leaves them to whoever reads the partition from its accepted position."""
        if not self._reads(st, reader):
            return
        if rejects:  # errors.tolerance=none raises here: nothing of this batch is buffered
            letters = await self.deadletters.reject(messages, rejects)
            if not self._reads(st, reader):
                return
            if (dl := self.settings.deadletter_table) is not None and letters:  # committed with this chunk's range
                rows = letter_rows(letters, self.settings.group_id, self.targets[dl].arrow_schema)
                chunk.tables[dl] = rows
                chunk.rows += rows.num_rows
                chunk.nbytes += rows.nbytes
        self.metrics.records_converted.labels(topic=st.tp.topic).inc(converted)
        last = messages[-1]
        ts = last.timestamp if last.timestamp is not None and last.timestamp >= 0 else None
        self.buffers.add(chunk, last.offset, ts)

    def _reads(self, st: PartitionState, reader: tuple[int, int]) -> bool:
        generation, offset = reader
        if self.ownership.owns(st, generation) and st.next_offset == offset:
            return True
        log.info("%s: a fetch converted across a rebalance or rewind is left to be read again from %d", st.tp, offset)
        return False

    async def _held_back(self, st: PartitionState, names: Iterable[str]) -> bool:
        """Whether a fetch of ``st`` with records routed to ``names`` waits for a missing table
        (agents/missing.py): then ``st`` is paused where it is, and True."""
        missing = await self.tables.held_back(st.tp, names)
        if not missing:
            return False
        self.app.consumer.pause_partitions([TP(st.tp.topic, st.tp.partition)])
        self.update_paused()
        log.warning("%s: records from offset %d go to %s, which does not exist: the partition is held there "
                    "until it does (/status missing_tables)", st.tp, st.next_offset, ", ".join(missing))
        return True

    async def _apply_backpressure(self) -> None:
        if not self.replica.backpressure:
            self.replica.backpressure = True
            active = [TP(tp.topic, tp.partition) for tp, st in self.buffers.partitions.items() if st.active]
            self.app.consumer.pause_partitions(active)
            log.info("buffers full (%d bytes): pausing %d partitions until the next round", self.buffers.nbytes, len(active))
            self.update_paused()
        await self._request_commit("full")

    async def maybe_request(self) -> None:
        """Ask for an early round, partitions left reading, when the data no round took yet
        passes iceberg.control.commit.max-records (rows) or max-bytes (Arrow bytes), or when the
        group is idle (the last CommitComplete moved no position, agents/control_loop.py) and
        rows were buffered since the last round's take: with commit.idle-interval-ms the
        coordinator waits longer after an idle round, and those rows would wait for that; or,
        with commit.catch-up, when the last response left a backlog unread and the partitions
        are now read to their ends: the rest of a backlog lands then, not an interval later."""
        s = self.settings
        idle = self.replica.idle and s.commit_idle_interval_ms is not None and self.buffers.fresh_rows > 0
        catch_up = self.replica.behind and s.commit_catch_up
        if s.commit_max_records is None and s.commit_max_bytes is None and not idle and not catch_up:
            return
        rows, nbytes = self.buffers.uncommitted()
        if not rows and not nbytes:
            return
        if s.commit_max_records is not None and rows >= s.commit_max_records:
            await self._request_commit("max-records")
        elif s.commit_max_bytes is not None and nbytes >= s.commit_max_bytes:
            await self._request_commit("max-bytes")
        elif idle and await self._request_commit("idle"):
            self.replica.idle = False
        elif (catch_up and unread_since_ms(self.buffers.partitions, self.app.consumer) is None
              and await self._request_commit("caught-up")):
            self.replica.behind = False
            log.info("a backlog read to the ends of this replica's partitions: round requested "
                     "(iceberg.control.commit.catch-up; %d rows in no round yet)", rows)

    async def _request_commit(self, reason: str) -> bool:
        """Ask for an early round (whether it was sent): at once the first time after a round
        took data (or the buffers were released), then again every REQUEST_EVERY_S while none
        comes (from the housekeeping too: paused partitions bring no more batches to on_events).
        The coordinator keeps one flag for all requests: many before a round make one round."""
        now = time.monotonic()
        if now - self.last_request < REQUEST_EVERY_S and self.buffers.takes == self.requested_at_take:
            return False
        self.last_request = now
        self.requested_at_take = self.buffers.takes
        self.metrics.early_commit_requests.labels(reason=reason).inc()
        await self.send(CommitRequest(self.replica.worker_id, self.buffers.nbytes))
        return True

    async def release_backpressure(self) -> None:
        """Resume reading where each buffer ends. The seek is needed: records that arrived
        while paused were skipped (on_events), and Faust silently drops the rest of a fetch
        for a partition paused while that fetch is handed out (Consumer.getmany checks the
        live set of active partitions), so the consumer's position is past them."""
        if not self.replica.backpressure or self.buffers.full:
            return
        reading = [st for tp, st in self.buffers.partitions.items() if st.active and not self.missing.is_held(tp)]
        try:
            await self.ownership.seek_all([(st, st.next_offset) for st in reading])
        except Exception as exc:  # stay paused: the housekeeping tries again
            log.warning("seek before resuming failed (%s); partitions stay paused", exc)
            return
        if not self.replica.backpressure or self.buffers.full:
            return
        self.replica.backpressure = False
        self.last_request = 0.0  # the next fill is a new request, not a repeat
        held = self.missing.is_held
        active = [TP(tp.topic, tp.partition) for tp, st in self.buffers.partitions.items() if st.active and not held(tp)]
        self.app.consumer.resume_partitions(active)
        self.update_paused()

    async def check_backpressure(self) -> None:
        """Paused for full buffers: ask again while no round has come (the send failed, the
        coordinator failed over and lost the request, the round found no active partition),
        or resume if the buffers shrank without one (partitions released or rewound)."""
        if not self.buffers.full:
            await self.release_backpressure()
            return
        try:
            await self._request_commit("full")
        except Exception as exc:
            log.warning("commit request not sent (%s); retried", exc)


    def update_gauges(self) -> None:
        self.metrics.buffered_rows.set(self.buffers.rows)
        self.metrics.buffered_bytes.set(self.buffers.nbytes)
        self.metrics.written_ahead_rows.set(self.buffers.written_rows)
        oldest = self.buffers.oldest_at()
        self.metrics.uncommitted_age.set(0.0 if oldest is None else max(0.0, time.time() - oldest))
        consumer = self.app.consumer
        for tp, st in self.buffers.partitions.items():
            if st.active:
                hw = highwater(consumer, tp.topic, tp.partition)
                if hw is not None:
                    self.metrics.consumer_lag.labels(topic=tp.topic, partition=str(tp.partition)).set(max(0, hw - st.next_offset))

    def update_paused(self) -> None:
        paused = sum(1 for tp, st in self.buffers.partitions.items() if not st.active or self.missing.is_held(tp))
        if self.replica.backpressure:
            paused = len(self.buffers.partitions)
        self.metrics.paused_partitions.set(paused)


def _subset(values: list[bytes], idx: npt.NDArray[np.int64]) -> list[bytes]:
    """The values at ``idx``: ``values`` itself when it is all of them."""
    return values if len(idx) == len(values) else [values[i] for i in idx]
