"""A coordinator's start: its state rebuilt from the last checkpoint and the control log after
it, or from the tables' sink state (the rules: coordinator/recovery.py, which is pure; this part
reads the checkpoint, the log and the tables), and where a partition the log does not know
starts (its Resume). See docs/commits.md, "Recovery"."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition as KafkaTP
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError

from coordinator.committer import Held, held_commit
from coordinator.recovery import Base, adopt_states, check_log_identity, from_tables, table_positions
from coordinator.session import Session
from coordinator.state import Checkpoint, CoordinatorState, TableFile, next_epoch
from icesink.shared.config import Settings
from icesink.shared.iceberg import latest_sink_summary, refuse_pending_rewind
from icesink.shared.kafka_admin import end_offsets, partition_counts, topic_id
from icesink.shared.metrics import Metrics
from icesink.shared.offload import Offload
from icesink.shared.protocol import CommitComplete, Event, Position, SinkState, TopicPartition

log = logging.getLogger("coordinator.service")  # the name operators' log filters know


class Replayer(Protocol):
    """What recovery needs of the control loop (coordinator/service.py) and a round's commit
    (coordinator/round_commit.py): each event replayed as the loop applies it, files no round can
    commit deleted, a table's unannounced commit announced."""

    async def apply(self, offset: int, event: Event, checkpoint_through: int = -1) -> bool: ...

    async def delete_files(self, files: Sequence[TableFile]) -> None: ...

    async def announce_held(self, table: str, held: Held | None) -> None: ...


class LogReader(Protocol):
    """The coordinator's control reader, as far as recovery needs it."""

    async def seek_to_beginning(self) -> int: ...

    async def seek(self, offset: int) -> None: ...

    async def position(self) -> int: ...

    async def end_offset(self) -> int: ...

    async def committed(self) -> int | None: ...

    async def read(self, timeout_s: float) -> list[tuple[int, Event]]: ...

    async def read_one(self, offset: int, timeout_s: float = 10.0) -> Event | None: ...


class Recovery:
    """Rebuilds a coordinator's :class:`Session` at its start, and answers where a partition
    the log does not know starts."""

    def __init__(self, settings: Settings, bootstrap: str, session: Session, reader: LogReader,
                 catalog: Catalog, offload: Offload, metrics: Metrics) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.session = session
        self._reader = reader
        self.catalog = catalog
        self.offload = offload
        self.metrics = metrics
        self.group = settings.group_id
        self.table_positions: dict[TopicPartition, int] = {}  # each partition's position in the tables' sink state
        self._snapshot_ms: dict[str, int] = {}  # each table's newest snapshot on its commit branch, as summary() read it
        self.recovered_tables: list[str] = []  # the tables recover() found the group's state in

    async def recover(self, loop: Replayer) -> None:
        """Rebuild state from the last checkpoint and the log after it, or from the tables' sink
        state when the checkpoint cannot be used (coordinator/recovery.py); delete the files of
        rejected responses; announce what a table holds and the log does not."""
        states = await self.offload.run(self.table_states)
        self.recovered_tables = list(states)
        # An interrupted rewind (its alter-positions not on the log yet): answer no claim, commit nothing
        await self.offload.run(refuse_pending_rewind, self.catalog, self.settings, states)
        self.table_positions = table_positions(states)
        client = self.settings.control_client_kwargs()  # the control topic (iceberg.kafka.*)
        topic = self.settings.control_topic
        self.session.log_id = await topic_id(self.bootstrap, topic, client_kwargs=client)
        self.session.status["control_log_id"] = self.session.log_id
        log_end = (await end_offsets(self.bootstrap, topic, client_kwargs=client)).get(0, 0)
        self.session.adopted = check_log_identity(states, self.session.log_id, log_end, topic, self.settings.control_adopt_log_id)
        log_start = await self._reader.seek_to_beginning()
        if self.session.adopted:
            states = adopt_states(states, str(self.session.log_id), log_start)
            log.warning("adopting control log %s (iceberg.control.adopt-log-id): tables holding state of another "
                        "log start over on it from their positions", self.session.log_id)
        checkpoint = await self.read_checkpoint()
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
            self.session.state = CoordinatorState.from_checkpoint(base.checkpoint)
            checkpoint_through = base.checkpoint.through
            state = self.session.state
            self.session.last_cp = Checkpoint(checkpoint_through, dict(state.accepted), dict(state.owners), start,
                                              dict(state.members))
        else:
            self.session.last_cp = Checkpoint(start - 1, {}, {}, start)
        watermarks = {t: st.watermark for t, st in states.items() if not self.session.adopted}
        await self._reader.seek(start)
        replayed = await self.replay(loop, checkpoint_through, watermarks)
        epochs = [self.session.state.log_epoch] + [st.epoch for st in states.values()]
        self.session.epoch = next_epoch(epochs)
        self.metrics.coordinator_epoch.set(self.session.epoch)
        # Rewinds were sent by the previous coordinator; the files may not be deleted yet.
        decided = [f for r in self.session.state.take_rejected() for f in r.files]
        await loop.delete_files(decided + self.session.state.take_orphans())
        log.info(
            "coordinator epoch %d recovered from control offset %d (%s; control log %s; %d events, "
            "%d accepted responses to roll forward)",
            self.session.epoch, start, base.reason, self.session.log_id, replayed, len(self.session.state.pending),
        )
        self.session.status.update(recovered_from=base.reason, control_log_id=self.session.log_id)
        for name, st in sorted(states.items()):  # committed after the checkpoint, never announced
            if not self.session.adopted and st.watermark > max(checkpoint_through, self.session.state.announced_through(name)):
                await loop.announce_held(name, await self.offload.run(self.held_commit, name))

    async def replay(self, loop: Replayer, checkpoint_through: int, watermarks: dict[str, int]) -> int:
        """Apply the log's events from the reader's position to the log's end as it is now;
        how many. A read with no event to return waits 0.5 s for one, so none is made once the
        reader stands at that end: on a first start, or from a checkpoint at the end of the log,
        the first claims were answered 0.5 s late."""
        end = await self._reader.end_offset()
        replayed = 0
        while True:
            batch = await self._reader.read(0.5) if await self._reader.position() < end else []
            for offset, event in batch:
                await loop.apply(offset, event, checkpoint_through)
                replayed += 1
            self.session.state.lacking(watermarks)  # what every table already holds is not kept (a parked table's rounds)
            if not batch and await self._reader.position() >= end:
                return replayed


    async def read_checkpoint(self) -> CommitComplete | None:
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

    def table_states(self, more: Iterable[str] = ()) -> dict[str, SinkState]:
        """Every table's sink state for this group: the configured tables (and ``more``), and the
        tables the newest rounds name (dynamic tables)."""
        out: dict[str, SinkState] = {}
        todo = [*self.settings.tables, *more]
        while todo:
            name = todo.pop()
            if name in out:
                continue
            st = self.summary(name)
            if st is not None:
                out[name] = st
                todo += [t for t in st.round_tables if t not in out]
        return out

    def held_commit(self, name: str) -> Held | None:
        try:
            return held_commit(self.catalog.load_table(name), self.group, self.settings.commit_branch(name))
        except NoSuchTableError:
            return None

    def summary(self, name: str) -> SinkState | None:
        try:
            table = self.catalog.load_table(name)
        except NoSuchTableError:
            return None
        branch = self.settings.commit_branch(name)
        head = table.snapshot_by_name(branch)
        if head is not None:  # when the table last committed (since_commit_s)
            self._snapshot_ms[name] = head.timestamp_ms
        return latest_sink_summary(table, self.group, branch)

    def since_commit_s(self, tables: Iterable[str], now_ms: int) -> float | None:
        """Seconds since the newest snapshot of ``tables``' commit branches that
        :meth:`summary` read (None: none), by this host's clock: when a coordinator that
        recovered starts its first round (coordinator/session.py first_round_at). Another
        writer's snapshot (compaction) only makes it later: at worst the round waits the
        whole interval, as a first start does."""
        stamps = [self._snapshot_ms[t] for t in tables if t in self._snapshot_ms]
        return (now_ms - max(stamps)) / 1000 if stamps else None

    async def initial_positions(self, tps: list[TopicPartition]) -> list[Position]:
        """Where a partition the log does not know starts: its position in the tables' sink
        state (the truth, when the log lost its Resume); for a partition no table has seen,
        the source group's committed offset (a hint from an earlier deployment), else the
        earliest offset. Fixed in the Resume event."""
        known = [Position(tp, self.table_positions[tp]) for tp in tps if tp in self.table_positions]
        rest = [tp for tp in tps if tp not in self.table_positions]
        return known + (await self.hint_positions(rest) if rest else [])

    async def hint_positions(self, tps: list[TopicPartition]) -> list[Position]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False,
            **self.settings.kafka_client_kwargs(),
        )
        await consumer.start()
        try:
            # Fresh metadata of every topic (not the consumer's own: on Kafka it holds none here)
            counts = await partition_counts(self.bootstrap, client_kwargs=self.settings.kafka_client_kwargs())
            tps = self.existing(tps, counts)
            ktps = [KafkaTP(tp.topic, tp.partition) for tp in tps]
            begin = await consumer.beginning_offsets(ktps)
            out = []
            for tp, ktp in zip(tps, ktps):
                committed = await consumer.committed(ktp)
                out.append(Position(tp, committed if committed is not None else int(begin[ktp])))
            return out
        finally:
            await consumer.stop()

    def existing(self, tps: list[TopicPartition], counts: dict[str, int]) -> list[TopicPartition]:
        """The partitions that exist (``counts``: topic -> partitions); the others (only a buggy or
        forged claim names them: asking for their offsets would time out, and restart this
        coordinator for ever) are refused."""
        gone = [tp for tp in tps if not 0 <= tp.partition < counts.get(tp.topic, 0)]
        if gone:
            self.metrics.control_events_refused.labels(reason="no-such-partition").inc()
            log.error("a claim names partitions that do not exist (%s): answered without them",
                      ", ".join(map(str, gone[:5])))
        return [tp for tp in tps if tp not in gone]
