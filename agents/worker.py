"""A worker replica.

A Faust agent consumes the source partitions this replica is assigned, converts values to
Arrow in bulk and buffers them per partition. On each StartCommit the worker writes its
buffers through Spark, reports the files (DataWritten) and the consumed ranges of every
partition it owns (DataComplete). Source offsets are committed to the consumer group only
after CommitComplete, i.e. never past data that is not in Iceberg. The replica that is the
Faust leader also runs the coordinator (coordinator/service.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
import uuid
from typing import Any, Callable, Iterable, Sequence

import faust
import numpy as np
import pyarrow as pa
from faust.types import TP

from agents.buffer import Buffers, Chunk, PartitionState
from agents.convert import Converted, Reject
from agents.deadletter import DeadLetters, DeadLetterSendError, screen
from agents.debezium import CDC_COLUMN, DebeziumTransform
from agents.evolution import Evolver, identifier_paths
from agents.formats import RecordFormat
from agents.respond import send_response
from agents.routing import Router, Routes
from agents.source_consumer import (
    ConsumerGuard, Fetched, faust_credentials, group_member_id, inject_faults, install_batch_drain, isolation_level,
)
from agents.tasks import EpochGate, TaskOwner, highwater, supervise_coordinator, unless_moved
from agents.tables import Target, create_target, load_target
from coordinator.service import Coordinator
from icesink.config import Settings
from icesink.control import ControlProducer, ControlReader, ensure_control_topic
from icesink.errors import ConfigError, DataError, FencedError, ResponseSendError, UnsupportedTypeError
from icesink.faults import crash_point, die, should_crash
from icesink.events import (
    Claim,
    CommitComplete,
    DataComplete,
    DataWritten,
    Resume,
    Rewind,
    StartCommit,
    CommitRequest,
    SchemaProposal,
    TopicPartition,
)
from icesink.iceberg import load_catalog, to_file_info
from icesink.metrics import Metrics
from icesink.offload import Offload
from spark_bridge.writer import SparkFileWriter, SparkSettings

log = logging.getLogger(__name__)

CLAIM_RETRY_S = 15.0
REQUEST_EVERY_S = 5.0
FETCHES_QUEUED = 2  # fetches waiting for the ingest agent


def _tp(t: Any) -> TopicPartition:
    return TopicPartition(t.topic, t.partition)


class Worker:
    def __init__(self, settings: Settings, bootstrap: str, metrics: Metrics) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.metrics = metrics
        self.worker_id = settings.worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.offload = Offload()
        self.buffers = Buffers(settings.buffer_max_bytes)
        self.targets: dict[str, Target] = {}
        self.format = RecordFormat(settings)
        self.deadletters = DeadLetters(settings, metrics, self.worker_id)
        pattern = settings.debezium_target_pattern
        self.debezium = None if pattern is None else DebeziumTransform(
            pattern, settings.value_converter_schemas_enable, settings.schema_case_insensitive)
        self.router = Router(settings, self.debezium)
        self.evolver = Evolver(  # (case folding alone is the record format's and the transform's)
            self.worker_id, evolve=True, case_insensitive=settings.schema_case_insensitive,
        ) if settings.evolve_schema else None
        self.spark = SparkFileWriter(SparkSettings(
            master=settings.spark_master,
            remote=settings.spark_remote,
            conf=dict(settings.spark_conf),
            app_name=f"icesink-{self.worker_id}",
            stage=settings.write_staging,
            staging_dir=str(settings.state_dir / "staging" / self.worker_id),
        ))
        self.generation = -1
        self.member_id: str | None = None
        self.status: dict[str, Any] = {"worker": self.worker_id, "phase": "starting"}
        self.exit_code = 0  # of the process, once run() returns
        self._stop = asyncio.Event()
        self._rebalanced = asyncio.Event()
        self._owner = TaskOwner(lambda exc: self.fail(exc, exit_code=1))  # every background task, the coordinator too
        self._epochs = EpochGate(metrics)
        self._respond_lock = asyncio.Lock()
        self._coordinator: Coordinator | None = None
        self._coordinator_task: asyncio.Task[None] | None = None
        self._open_round: str | None = None  # latest StartCommit without its CommitComplete
        self._claimed_at: dict[TopicPartition, float] = {}
        self._backpressure = False
        self._last_request = 0.0
        self._seq = 0
        self.app = self._make_app()

    # Faust app -------------------------------------------------------------------------------

    def _make_app(self) -> faust.App:
        s = self.settings
        datadir = (s.state_dir / "faust" / self.worker_id).resolve()
        datadir.parent.mkdir(parents=True, exist_ok=True)
        app = faust.App(
            s.group_id,
            broker=";".join(f"kafka://{b.strip()}" for b in self.bootstrap.split(",")),
            broker_credentials=faust_credentials(s),
            value_serializer="raw",
            key_serializer="raw",
            store="memory://",
            web_enabled=False,
            datadir=str(datadir),
            consumer_auto_offset_reset="earliest",
            topic_partitions=1,
            topic_replication_factor=1,
            broker_session_timeout=s.session_timeout_ms / 1000,
            broker_heartbeat_interval=max(0.5, s.session_timeout_ms / 10_000),
            # Shorter than Faust's defaults (1000 s poll interval, 60 s rebalance): the agent
            # never blocks long (Spark writes run beside it). Whole-group restarts on Tansu:
            # see _install_no_leave_group.
            broker_max_poll_interval=60.0,
            broker_rebalance_timeout=max(20.0, 2 * s.session_timeout_ms / 1000),
            broker_max_poll_records=s.consumer_max_batch,  # records of one fetch handed to the agent
            producer_acks=-1,
            logging_config=None,
        )
        # acks=False: Faust never tracks or commits these offsets; icesink commits them only
        # after CommitComplete. The topic is subscribed through the conductor (_start_faust); its records
        # reach the agent as whole fetches (source_consumer.install_batch_drain), through an
        # in-memory channel of at most FETCHES_QUEUED fetches: a slow agent holds the drain
        # back, so fetched bytes waiting for conversion stay bounded.
        self.source = app.topic(*s.topics, value_serializer="raw", key_serializer="raw", acks=False)
        self.fetches = app.channel(maxsize=FETCHES_QUEUED)
        worker = self

        @app.agent(self.fetches, name="icesink-ingest")
        async def ingest(stream: faust.Stream) -> None:
            async for fetched in stream:
                try:
                    await worker.on_fetch(fetched)
                except (ConfigError, DataError, UnsupportedTypeError) as exc:
                    # A setting that cannot apply to the data (say a day() partition of a string
                    # column), or a bad record under errors.tolerance=none: retrying cannot
                    # help, so the replica stops, saying why.
                    worker.fail(exc)
                    return
                except Exception as exc:
                    # A bug. Faust would restart the agent without this batch and the replica
                    # would answer empty rounds for ever: stop instead (exit code 1), so the
                    # failure is seen and the records are read again by the next owner.
                    log.exception("ingest failed on a fetch of %d records", len(fetched))
                    worker.fail(exc, exit_code=1)
                    return

        app.on_partitions_revoked.connect(self._on_revoked)
        app.on_partitions_assigned.connect(self._on_assigned)
        app.on_rebalance_complete.connect(self._on_rebalance_complete)
        return app

    def _install_no_leave_group(self) -> None:
        """Never send LeaveGroup: a stopped replica leaves the group when its session times out.

        Tansu (v0.6.0) drops a member that sends LeaveGroup while the group is rebalancing, but
        if that member was the leader it stays the leader. When a whole group stops, the first
        LeaveGroup starts a rebalance; if the leader's comes later, the group is left with no
        members and a departed leader. New members are then all told to follow that leader,
        and their SyncGroups answer REBALANCE_IN_PROGRESS until Tansu happens to reload the
        group from storage: minutes, or never (bench/group_restart_repro.py). A member whose
        session expires stops being the leader, so the next member to join leads. The cost:
        a stopped replica's partitions move after ``consumer.session-timeout-ms``, not at
        once. Pinned to aiokafka 0.14 internals (GroupCoordinator._maybe_leave_group)."""
        try:
            coordinator = self.app.consumer._thread._consumer._coordinator
        except AttributeError:
            coordinator = None
        if not hasattr(coordinator, "_maybe_leave_group"):
            log.warning("no aiokafka group coordinator found: this replica will send LeaveGroup")
            return

        async def stop_without_leaving() -> None:
            coordinator.reset_generation()  # what _maybe_leave_group does after its request

        coordinator._maybe_leave_group = stop_without_leaving

    # Lifecycle -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Start everything, run until SIGTERM/SIGINT (or :meth:`request_stop`), stop within
        ``shutdown.timeout-ms``."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        client = self.settings.kafka_client_kwargs()
        await ensure_control_topic(self.bootstrap, self.settings.control_topic, client,
                                   replication_factor=self.settings.control_replication_factor)
        secret = self.settings.control_signing_key()
        self.producer = ControlProducer(self.bootstrap, self.settings.control_topic, self.settings.group_id, client, secret)
        self.reader = ControlReader(self.bootstrap, self.settings.control_topic, self.settings.group_id, client,
                                    metrics=self.metrics, reader="worker", secret=secret)
        await self.producer.start()
        await self.reader.start()
        await self.reader.seek_to_end()
        await self.deadletters.start(self.bootstrap)
        spark_started = self._spark_ready = asyncio.ensure_future(self.offload.run(self.spark.start))
        self.catalog = await self.offload.run(load_catalog, self.settings)
        for name in self.settings.tables:
            target = await self.offload.run(load_target, self.catalog, name)
            if target is not None:
                self.targets[name] = target
        self._owner.spawn(self._control_loop(), "control")
        self._owner.spawn(self._housekeeping(), "housekeeping")
        faust_worker = await self._start_faust()
        await spark_started
        self.status["phase"] = "running"
        log.info("worker %s running (group %s, topics %s, tables %s)", self.worker_id,
                 self.settings.group_id, ",".join(self.settings.topics), ",".join(self.settings.tables))
        await self._stop.wait()
        await self._shutdown(faust_worker)

    async def _start_faust(self) -> faust.Worker:
        """Start the Faust worker: from here on this replica is a member of the consumer group."""
        loop = asyncio.get_running_loop()
        faust_worker = faust.Worker(
            self.app, loop=loop, override_logging=False, quiet=True, redirect_stdouts=False, daemon=False,
        )
        # Ours only request a stop; Faust's would stop Faust alone (and a SIGTERM during
        # its start-up was lost, the replica running on without consuming).
        faust_worker.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        # Subscribed here, on the running loop: the conductor binds its events to the loop
        # that first touches it (touched in __init__, it waited on another loop for ever).
        self.app.topics.add(self.source)
        install_batch_drain(self.app, lambda fetched: self.fetches.send(value=fetched))
        inject_faults(self.settings)  # fault tests only
        # read_committed; a consumer that can no longer consume stops the replica (exit code 1)
        ConsumerGuard(self.app, self.metrics, lambda exc: self.fail(exc, exit_code=1), self._stop.is_set).install()
        await faust_worker.start()
        self._install_no_leave_group()
        self.status["isolation_level"] = isolation_level(self.app)
        return faust_worker

    def status_report(self) -> dict[str, Any]:
        """For /status (read from the HTTP thread: copies only)."""
        out = dict(self.status)
        out["partitions"] = {
            str(tp): {"active": st.active, "next_offset": st.next_offset}
            for tp, st in list(self.buffers.partitions.items())
        }
        out["buffered"] = {"rows": self.buffers.rows, "bytes": self.buffers.nbytes, "backpressure": self._backpressure}
        coordinator = self._coordinator if self._coordinator_task is not None else None
        out["coordinator"] = dict(coordinator.status) if coordinator is not None else None
        return out

    def fail(self, exc: Exception, exit_code: int = 2) -> None:
        """Stop with exit code 2 after an error no retry can mend (logged once, in /status), or
        another code for an unexpected one."""
        log.error("stopping: %s", exc)
        self.status["error"] = f"{type(exc).__name__}: {exc}" if exit_code != 2 else str(exc)
        self.exit_code = exit_code
        self.request_stop()

    def request_stop(self) -> None:
        if self._stop.is_set():
            return
        log.info("stop requested")
        self._stop.set()
        # The shutdown bound holds in every phase (also mid start-up, or if a client hangs):
        # past it the process exits hard, which the protocol treats like kill -9.
        limit = self.settings.shutdown_timeout_ms / 1000 + 2.0
        timer = threading.Timer(limit, _exit_hard, args=(limit,))
        timer.daemon = True
        timer.start()

    async def _shutdown(self, faust_worker: faust.Worker) -> None:
        """Stop within one deadline; the group moves this replica's partitions once its session
        expires (no LeaveGroup, see _install_no_leave_group). Buffered data that is not
        committed is not lost: the next owner re-reads it from the accepted position."""
        self.status["phase"] = "stopping"
        deadline = self.settings.shutdown_timeout_ms / 1000
        started = time.monotonic()

        def left() -> float:
            return max(0.1, deadline - (time.monotonic() - started))

        await self._stop_coordinator()
        await self._owner.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(faust_worker.stop(), left())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.reader.stop(), left())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.producer.stop(), left())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.deadletters.stop(), left())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.offload.run(self.spark.stop), left())
        self.offload.close()
        log.info("worker %s stopped in %.1fs", self.worker_id, time.monotonic() - started)

    # Rebalances and ownership ------------------------------------------------------------

    def _source(self, tps: Iterable[Any]) -> set[TopicPartition]:
        topics = set(self.settings.topics)
        return {_tp(t) for t in tps if t.topic in topics}

    async def _on_revoked(self, sender: Any, revoked: set[Any], **_: Any) -> None:
        self._rebalanced.clear()
        for tp in self._source(revoked):
            st = self.buffers.partitions.get(tp)
            if st is not None:
                st.active = False  # keep chunks: the same partition may come back to us

    async def _on_assigned(self, sender: Any, assigned: set[Any], **_: Any) -> None:
        self._rebalanced.clear()
        self.generation = int(self.app.consumer_generation_id or 0)
        self.member_id = group_member_id(self.app)
        mine = self._source(assigned)
        for tp in list(self.buffers.partitions):
            if tp not in mine:
                self.buffers.release(tp)
                self._claimed_at.pop(tp, None)
        for tp in mine:
            self.buffers.claim(tp, self.generation)
        if mine:
            self._owner.spawn(self._send_claim(sorted(mine)), "claim")

    async def _send_claim(self, tps: Sequence[TopicPartition]) -> None:
        now = time.monotonic()
        for tp in tps:
            self._claimed_at[tp] = now
        try:
            await self.producer.send(Claim(self.worker_id, self.generation, tuple(tps), self.member_id))
        except Exception as exc:
            log.warning("claim for %s not sent (%s); retried", ",".join(map(str, tps)), exc)

    async def _on_rebalance_complete(self, sender: Any, **_: Any) -> None:
        # Faust resumed and seeked every assigned partition; keep unclaimed ones paused.
        claiming = [TP(tp.topic, tp.partition) for tp, st in self.buffers.partitions.items() if not st.active]
        if claiming:
            self.app.consumer.pause_partitions(claiming)
        self._rebalanced.set()
        await self._supervise_coordinator()

    async def _on_resume(self, ev: Resume) -> None:
        if ev.worker != self.worker_id or ev.generation != self.generation:
            return
        await self._rebalanced.wait()
        if ev.generation != self.generation:
            return
        for pos in ev.positions:
            st = self.buffers.partitions.get(pos.tp)
            if st is None or st.active:
                continue
            # Active from here, but no gap is taken until the seek is done (activated_at).
            seek_to = self.buffers.resume(pos.tp, pos.offset, now=float("inf"))
            if not await unless_moved(self._seek(st, seek_to), lambda: self._owns(st, ev.generation), f"seek of {pos.tp}"):
                continue
            self._claimed_at.pop(pos.tp, None)
            if not self._backpressure:
                self.app.consumer.resume_partitions([TP(pos.tp.topic, pos.tp.partition)])
            log.info("resumed %s at offset %d (generation %d)", pos.tp, seek_to, ev.generation)
        self._update_paused()
        if self._open_round is not None:
            # Partitions that became active during a round answer it too, so the round
            # does not wait for its timeout after a rebalance.
            self._owner.spawn(self._respond(self._open_round), "respond")

    def _owns(self, st: PartitionState, generation: int) -> bool:
        return generation == self.generation and st.active and self.buffers.partitions.get(st.tp) is st

    async def _seek(self, st: PartitionState, offset: int) -> None:
        await self._seek_all([(st, offset)])

    async def _seek_all(self, targets: list[tuple[PartitionState, int]]) -> None:
        """Seek in the consumer's own thread (seek_wait) and only then stamp the activation:
        records fetched before this instant can no longer pass as a gap."""
        for st, _ in targets:
            st.activated_at = float("inf")
        try:
            await self.app.consumer.seek_wait({TP(st.tp.topic, st.tp.partition): off for st, off in targets})
        finally:
            now = time.monotonic()
            for st, _ in targets:
                st.seeks += 1
                st.activated_at = now
                st.reseeking = False

    async def _on_rewind(self, ev: Rewind) -> None:
        if ev.worker != self.worker_id:
            return
        log.warning("response rejected, rewinding %s: %s", ",".join(map(str, ev.partitions)), ev.reason)
        mine = [tp for tp in ev.partitions if tp in self.buffers.partitions]
        for tp in mine:
            self.buffers.rewind(tp)
        if mine:
            self.app.consumer.pause_partitions([TP(t.topic, t.partition) for t in mine])
            await self._send_claim(mine)

    # Consuming -------------------------------------------------------------------------------

    async def on_fetch(self, fetched: Fetched) -> None:
        """Take the records of active partitions in offset order, convert them in bulk."""
        if should_crash(self.settings, "worker.ingest-bug"):
            raise RuntimeError("fault injection: an unexpected error while converting a batch")
        for tp, records in fetched.records.items():
            self.metrics.records_consumed.labels(topic=tp.topic).inc(len(records))
            st = self.buffers.partitions.get(tp)
            if st is None or not st.active:
                continue
            if self._backpressure:
                # Paused because the buffers are full: records still in flight would grow
                # them past the bound. They are read again: the release seeks back.
                continue
            taken, suspect = st.select(records, fetched.fetched_at)
            if taken:
                await self._buffer(st, taken)
            if suspect is not None and not st.reseeking:
                st.suspect_gap(suspect)
                log.info("%s: fresh record at %d while expecting %d; seeking again", tp, suspect, st.next_offset)
                st.reseeking = True
                owned = lambda st=st, g=self.generation: self._owns(st, g)  # noqa: E731
                self._owner.spawn(unless_moved(self._seek(st, st.next_offset), owned, f"seek of {tp}"), "reseek")
        self._update_gauges()
        if self.buffers.full:
            await self._apply_backpressure()

    async def _buffer(self, st: PartitionState, messages: list[Any]) -> None:
        # Tombstones and too-large values never reach conversion; their offsets still count.
        screened = screen(messages, self.settings.max_record_bytes)
        values = screened.values
        self.deadletters.tombstones(st.tp.topic, screened.tombstones)
        rejects: list[tuple[Reject, str | None]] = [(r, None) for r in screened.rejects]
        tables: dict[str, pa.Table] = {}
        nbytes = 0
        rows = 0
        landed = np.zeros(len(values), dtype=bool)
        self.metrics.bytes_consumed.labels(topic=st.tp.topic).inc(screened.nbytes)
        routes = self.router.route(values) if values else Routes({}, ())
        if routes.unrouted:
            no_route = sum(1 for r in routes.unrouted if r.reason.startswith("no route"))
            self.metrics.records_unrouted.labels(topic=st.tp.topic).inc(no_route)
            rejects += [(r, None) for r in screened.at_messages(routes.unrouted)]
        for name, idx in routes.by_table.items():
            whole = len(idx) == len(values)
            subset = values if whole else [values[i] for i in idx]
            target = self.targets.get(name) or await self._target(name, subset)
            sub_messages = [messages[screened.positions[i]] for i in idx]
            converted = await self._decode(name, target, subset, sub_messages)
            if converted.rejects:
                in_values = converted.rejects if whole else [
                    dataclasses.replace(r, index=int(idx[r.index])) for r in converted.rejects]
                rejects += [(r, name) for r in screened.at_messages(in_values)]
            if target is not None and converted.table.num_rows:  # None: no record could create it
                tables[name] = converted.table
                nbytes += converted.table.nbytes
                rows += converted.table.num_rows
                landed[idx[converted.indices.to_numpy(zero_copy_only=False)]] = True
        if rejects:  # errors.tolerance=none raises here: nothing of this batch is buffered
            await self.deadletters.reject(messages, rejects)
        self.metrics.records_converted.labels(topic=st.tp.topic).inc(int(landed.sum()))
        last = messages[-1]
        ts = last.timestamp if last.timestamp is not None and last.timestamp >= 0 else None
        self.buffers.add(Chunk(st.tp, last.offset + 1, tables, nbytes, rows), last.offset, ts)

    async def _decode(self, name: str, target: Target | None, values: list[bytes], messages: list[Any]) -> Converted:
        """Decode against the table's schema (through the Debezium transform or the record
        format; key and metadata columns around either), or with evolution against what the
        data needs (agents/evolution.py): the records' Connect schemas say it (envelopes,
        Debezium with schemas), else their values do; schema changes are proposed to the
        coordinator."""
        unit = self.settings.timestamp_unit_of(name)
        if target is None:
            return self.format.convert(messages, values, None, epoch_unit=unit)
        schema, dbz = target.arrow_schema, self.debezium
        rows = None if dbz is None else (
            lambda s, grow: dbz.apply(values, [m.offset for m in messages], s, grow=grow))
        if self.evolver is None:
            return self.format.convert(messages, values, schema, epoch_unit=unit, decode_values=rows)
        keep = identifier_paths(target.table)
        frozen = frozenset(self.format.extras.names() | ({CDC_COLUMN} if dbz is not None else set()))
        if self.format.envelope:  # each record states its schema
            growth = self.evolver.growth(name, schema, keep, frozen)
            out = growth.done(self.format.convert(
                messages, values, growth.schema, epoch_unit=unit, grow=growth, decode_values=rows))
        elif self.format.plain and dbz is None:
            out = self.evolver.decode(name, schema, values, keep)
        else:
            out = self.evolver.decode(
                name, schema, values, keep, frozen=frozen, infer=None if dbz is None else lambda: dbz.row_schema(values),
                decode=lambda probe: self.format.convert(messages, values, probe, epoch_unit=unit, decode_values=rows))
        if out.proposal is not None:
            await self._propose(out.proposal)
        return out.converted

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
            target = await self.offload.run(load_target, self.catalog, name)
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
        target = await self.offload.run(load_target, self.catalog, name)
        if target is None:
            if self.debezium is not None:
                inferred = self.format.with_extras(self.debezium.infer_schema(values))
            else:
                inferred = self.format.table_schema(values, timestamp_fields=self.settings.timestamp_fields_of(name))
            if inferred is None:
                return None
            target = await self.offload.run(create_target, self.catalog, self.settings, name, inferred)
        self.targets[name] = target
        return target

    async def _apply_backpressure(self) -> None:
        if not self._backpressure:
            self._backpressure = True
            active = [TP(tp.topic, tp.partition) for tp, st in self.buffers.partitions.items() if st.active]
            self.app.consumer.pause_partitions(active)
            log.info("buffers full (%d bytes): pausing %d partitions until the next round", self.buffers.nbytes, len(active))
            self._update_paused()
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
        if not self._backpressure or self.buffers.full:
            return
        try:
            await self._seek_all([(st, st.next_offset) for st in self.buffers.partitions.values() if st.active])
        except Exception as exc:  # stay paused: _housekeeping tries again
            log.warning("seek before resuming failed (%s); partitions stay paused", exc)
            return
        if not self._backpressure or self.buffers.full:
            return
        self._backpressure = False
        self._last_request = 0.0  # the next fill is a new request, not a repeat
        active = [TP(tp.topic, tp.partition) for tp, st in self.buffers.partitions.items() if st.active]
        self.app.consumer.resume_partitions(active)
        self._update_paused()

    # Commit rounds ---------------------------------------------------------------------------

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
                for name, data in snap.tables(cast).items():
                    self._seq += 1
                    prefix = f"{commit_id[:8]}-{self.worker_id}-{self._seq}"
                    files = await self.offload.run(
                        self.spark.write, self.targets[name].table, data, file_prefix=prefix,
                        target_file_size_bytes=self.settings.target_file_size_bytes,
                    )
                    infos = tuple(to_file_info(f, f.spec_id) for f in files)  # the spec it was written with
                    self.metrics.files_written.labels(table=name).inc(len(infos))
                    self.metrics.bytes_written.labels(table=name).inc(sum(f.size_bytes for f in infos))
                    written.append(DataWritten(commit_id, response_id, self.worker_id, name, infos))
            except Exception as exc:
                self.metrics.write_failures.inc()
                log.error("writing files for round %s failed, data kept for the next round: %s", commit_id, exc)
                self.buffers.restore(snap)
                return
            self.metrics.write_duration.observe(time.monotonic() - started)
            try:  # DataWritten split to fit the control topic, then DataComplete
                sent = await send_response(self.producer, written, lambda n: DataComplete(
                    commit_id, response_id, self.worker_id, snap.generation, snap.ranges, n, self._valid_through_ms(),
                ), lambda: crash_point(self.settings, "worker.mid-response"))
            except ResponseSendError as exc:
                log.error("round %s not answered, data kept for the next round: %s", commit_id, exc)
                self.buffers.restore(snap)
                return
            self._update_gauges()
            log.info("round %s: answered %d partitions, %d rows in %d files (%d DataWritten)", commit_id,
                     len(snap.ranges), snap.rows, sum(len(w.files) for w in written), sent)

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
                await self.app.consumer._commit(offsets)
            except Exception as exc:  # a hint only; the truth is in the snapshot summaries
                log.warning("consumer group offset commit failed: %s", exc)
        self.status.update(last_commit_id=ev.commit_id, valid_through_ms=ev.valid_through_ms)

    # Coordinator supervision, housekeeping ------------------------------------------------

    async def _supervise_coordinator(self) -> None:
        leader = self.app.is_leader()
        if leader and self._coordinator_task is None:
            self._coordinator_task = self._owner.spawn(supervise_coordinator(self._run_coordinator, self.metrics), "coordinator")
            log.info("this replica is the leader: coordinator started")
        elif not leader and self._coordinator_task is not None:
            log.info("leadership moved: coordinator stopped")
            await self._stop_coordinator()

    async def _run_coordinator(self) -> None:
        """One coordinator run (agents/tasks.py restarts it after an unexpected error)."""
        self._coordinator = Coordinator(self.settings, self.bootstrap, self.producer, self.catalog, self.offload, self.metrics)
        try:
            await self._coordinator.run()
        except FencedError as exc:
            log.error("coordinator fenced, stopping it: %s", exc)

    async def _stop_coordinator(self) -> None:
        task, self._coordinator_task = self._coordinator_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(2.0)
            now = time.monotonic()
            stale = [tp for tp, at in self._claimed_at.items() if now - at > CLAIM_RETRY_S
                     and tp in self.buffers.partitions and not self.buffers.partitions[tp].active]
            if stale and self._rebalanced.is_set():
                log.info("no Resume for %s yet; claiming again", ",".join(map(str, stale)))
                await self._send_claim(stale)
            if self._backpressure:
                await self._check_backpressure()
            self._update_gauges()

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

    def _update_gauges(self) -> None:
        self.metrics.buffered_rows.set(self.buffers.rows)
        self.metrics.buffered_bytes.set(self.buffers.nbytes)
        consumer = self.app.consumer
        for tp, st in self.buffers.partitions.items():
            if st.active:
                hw = highwater(consumer, tp.topic, tp.partition)
                if hw is not None:
                    self.metrics.consumer_lag.labels(topic=tp.topic, partition=str(tp.partition)).set(max(0, hw - st.next_offset))

    def _update_paused(self) -> None:
        paused = sum(1 for st in self.buffers.partitions.values() if not st.active)
        if self._backpressure:
            paused = len(self.buffers.partitions)
        self.metrics.paused_partitions.set(paused)


def _exit_hard(limit: float) -> None:
    log.error("shutdown did not finish within %.1fs; exiting now (uncommitted work is re-read by the next owner)", limit)
    for h in logging.getLogger().handlers:
        h.flush()
    os._exit(70)
