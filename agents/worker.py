"""A worker replica.

A Faust agent consumes the source partitions this replica is assigned, converts values to
Arrow in bulk and buffers them per partition. On each StartCommit the worker writes its
buffers through Spark, reports the files (DataWritten) and the consumed ranges of every
partition it owns (DataComplete). Source offsets are committed to the consumer group only
after CommitComplete, i.e. never past data that is not in Iceberg. The replica that is the
Faust leader also runs the coordinator: the composition root (icesink/app/cli.py) hands
``coordinator.service.Coordinator`` in as ``leader`` (:class:`LeaderFactory`), and the Spark
file writer as ``files`` (agents/file_writer.py), so agents/ imports neither coordinator/ nor
spark_bridge/.

The replica's concerns are parts, objects in their own modules; :class:`Worker` builds them and
wires them (state several parts read: :class:`agents.parts.Replica`). It builds what the group
join needs first and asks to join; the rest is imported and built while the broker answers
(agents/assembly.py), and claims and the coordinator wait for it (:meth:`Worker.started`):

- ``agents/faust_app.py``: the Faust app, its agent and the patches it runs with (``Worker.faust``);
- ``agents/ownership.py``: rebalances, claims, Resume and Rewind (``Worker.ownership``);
- ``agents/ingest.py``: fetched records to Arrow buffers, backpressure, stalls (``Worker.ingest``);
- ``agents/table_lookup.py``: the tables, loaded, created, reloaded, waited for (``Worker.tables``);
- ``agents/control_loop.py``: the control topic read, each event to the part that answers it,
  consumer offsets after CommitComplete (``Worker.control``);
- ``agents/rounds.py``: answering rounds, early writes (``Worker.rounds``);
- here: the lifecycle (start, status, stop, fail), the coordinator's supervision, housekeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from agents.buffer import Buffers, Chunk, PartitionState
from agents.faust_app import FaustApp
from agents.file_writer import FileWritingFactory
from agents.kafka import Fetched, holds_joins
from agents.missing import MissingTables
from agents.ownership import Ownership
from agents.parts import Replica, default_worker_id
from agents.tasks import TaskOwner, supervise_coordinator
from icesink.shared import gc_tuning
from icesink.shared.config import Settings
from icesink.shared.control import ControlProducer, ControlReader, ensure_control_topic
from icesink.shared.errors import FencedError
from icesink.shared.metrics import Metrics
from icesink.shared.offload import Offload
from icesink.shared.signing import Keyring

if TYPE_CHECKING:  # imported once the group join is asked for (Worker._build_parts, agents/assembly.py)
    from pyiceberg.catalog import Catalog

    from agents.control_loop import ControlLoop
    from agents.deadletter import DeadLetters
    from agents.file_writer import FileWriter, RewriteFiles
    from agents.ingest import Ingest
    from agents.registry_client import RegistryClient
    from agents.rounds import Rounds
    from agents.table_lookup import GroupHistory, TableLookup
    from agents.tables import Target
    from icesink.shared.group_secret import SecretLoader

log = logging.getLogger(__name__)

class Leader(Protocol):
    """What the group's leading replica runs beside its worker (the coordinator)."""

    status: dict[str, Any]

    async def run(self) -> None: ...

    async def drain(self, timeout_s: float) -> None:
        """Before :meth:`run` is cancelled: start no more work, let what is in flight finish
        within ``timeout_s``."""


class LeaderFactory(Protocol):
    """Makes a :class:`Leader` from the replica's shared parts; ``rewrite`` writes compacted
    files with this replica's Spark session. ``coordinator.service.Coordinator`` is one."""

    def __call__(self, settings: Settings, bootstrap: str, producer: ControlProducer, catalog: Catalog,
                 offload: Offload, metrics: Metrics, rewrite: Any = None, launched_at: float | None = None) -> Leader: ...


class Worker:
    """A replica's lifecycle (start, status, stop, fail) and the coordinator's supervision; it
    builds its parts and wires them: each part takes the few collaborators it uses, and what
    one asks of the rest of the replica goes through a small Protocol this class answers."""

    def __init__(self, settings: Settings, bootstrap: str, metrics: Metrics, *, files: FileWritingFactory,
                 leader: LeaderFactory | None = None, launched_at: float | None = None,
                 worker_id: str | None = None, preload: Callable[[], object] | None = None) -> None:
        """``files``: makes this replica's file writer and compaction's rewrite with it (the
        Spark-backed ones: icesink/app/files.py). ``leader``: what this replica runs while it
        leads the group (the coordinator); None: a worker only, whoever leads. ``launched_at``:
        the monotonic clock when the process began (None: now), a new group's first round's origin.
        ``worker_id``: this replica's id, if the caller made it (else ``worker.id``, else a new one).
        ``preload``: the caller's own heavy imports (the writer, the coordinator), run in the
        thread that imports agents/assembly.py while the group join is held.

        Built here: what the group join needs (the Faust app, ownership, the buffers). The rest
        (agents/assembly.py) is built by :meth:`build_parts`, which :meth:`run` calls once it has
        asked to join; claims and the coordinator wait for it (:meth:`started`)."""
        self.settings = settings
        self.launched_at = time.monotonic() if launched_at is None else launched_at
        self._leader = leader
        self._files = files
        self._preload = preload
        self.bootstrap = bootstrap
        self.metrics = metrics
        self.worker_id = worker_id or settings.worker_id or default_worker_id()
        metrics.info.labels(group=settings.group_id, worker=self.worker_id).set(1)
        metrics.commit_interval.set(settings.commit_interval_ms / 1000)
        self.offload = Offload()
        self.buffers = Buffers(settings.buffer_max_bytes)
        self.targets: dict[str, Target] = {}  # the tables written to, shared by the parts below
        self.missing = MissingTables()  # tables waited for (agents/missing.py)
        self.replica = Replica(self.worker_id, {"worker": self.worker_id, "phase": "starting"})
        self.status = self.replica.status
        self.exit_code = 0  # of the process, once run() returns
        self._stop = self.replica.stop
        self._owner = TaskOwner(lambda exc: self.fail(exc, exit_code=1))  # every background task, the coordinator too
        self._coordinator: Leader | None = None
        self._coordinator_task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None  # the parts built and the catalog loaded (_prepare)
        self.keyring = Keyring()  # the group's key: loaded in _prepare, before anything is sent or read
        self.faust = FaustApp(settings, bootstrap, self.replica, self.buffers, metrics, hooks=self)
        self.app = self.faust.app
        self.ownership = Ownership(settings.topics, self.replica, self.buffers, self.missing, self.app,
                                   self.send, self._owner, hooks=self)
        self.ownership.connect()
        # agents/assembly.py's parts (build_parts)
        self.deadletters: DeadLetters
        self.spark: FileWriter
        self._rewrite_files: RewriteFiles
        self.registry_clients: list[RegistryClient] = []
        self._built = False
        self.secret: SecretLoader
        self.history: GroupHistory
        self.tables: TableLookup
        self.rounds: Rounds
        self.control: ControlLoop
        self.ingest: Ingest

    def build_parts(self) -> None:
        """Build agents/assembly.py's parts (imported, in a thread, by :meth:`_prepare`; here
        on the event loop their constructors may bind to)."""
        from agents import assembly

        parts = assembly.build(self, self._files, self._owner)
        self.deadletters, self.spark, self._rewrite_files = parts.deadletters, parts.spark, parts.rewrite_files
        self.registry_clients, self.secret, self.history = parts.registry_clients, parts.secret, parts.history
        self.tables, self.rounds, self.control, self.ingest = parts.tables, parts.rounds, parts.control, parts.ingest
        self._built = True

    async def run(self, stop_requested: threading.Event | None = None) -> None:
        """Start everything, run until SIGTERM/SIGINT (or :meth:`request_stop`), stop within
        ``shutdown.timeout-ms``. A stop during start-up ends the start-up where it is: what has
        started is stopped, and a Spark session still starting is left to its thread.
        ``stop_requested``: a SIGTERM the caller caught before this installed its handlers."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        if stop_requested is not None and stop_requested.is_set():
            self.request_stop()
        client = self.settings.control_client_kwargs()  # the control topic's clients (iceberg.kafka.*)
        keyring = self.keyring  # loaded (secret.load) before anything is sent or read
        self.producer = ControlProducer(self.bootstrap, self.settings.control_topic, self.settings.group_id, client, keyring)
        self.reader = ControlReader(self.bootstrap, self.settings.control_topic, self.settings.group_id, client,
                                    metrics=self.metrics, reader="worker", secret=keyring)
        starting = asyncio.ensure_future(self._start(client))
        stopping = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not starting.done():
            log.info("stopping during start-up: what has started is stopped, the rest is left")
            starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting  # a start-up that failed raises here
        await self._stop.wait()
        await self._shutdown()

    async def _start(self, client: dict[str, Any]) -> None:
        await ensure_control_topic(self.bootstrap, self.settings.control_topic, client,
                                   replication_factor=self.settings.control_replication_factor)
        await self.producer.start()
        await self.reader.start()
        await self.reader.seek_to_end()
        # Before the group join: where the broker holds it for half the session (Tansu), a
        # session not set is shorter (agents/kafka/group.py HELD_JOIN_SESSION_TIMEOUT_MS).
        self.settings = self.faust.fit_session(holds_joins(self.reader.consumer))
        # The join is asked for now, and the rest of the replica is imported, built and loaded
        # while the broker answers it; claims and the coordinator wait for that (started).
        log.info("asking to join group %s; the rest of the replica is built meanwhile", self.settings.group_id)
        joining = asyncio.ensure_future(self.faust.start())  # first: it begins before _prepare's thread
        self._ready = ready = asyncio.ensure_future(self._prepare())
        try:
            await asyncio.wait((ready, joining), return_when=asyncio.FIRST_EXCEPTION)
            for step in (ready, joining):
                if step.done():
                    step.result()  # a start-up that failed raises here, whichever step failed first
            await ready
            await joining
        except asyncio.CancelledError:  # a stop during start-up: _shutdown stops what has started
            _abandon(ready, joining)
            raise
        except Exception as exc:
            try:
                await self._leave_after_failed_start(ready, joining)
            finally:
                raise exc  # also if a stop came meanwhile: the process ends with what failed
        assert self.rounds.spark_ready is not None  # set by _prepare
        await self.rounds.spark_ready
        gc_tuning.freeze_start_up()  # and the Spark session's: collections skip them
        self.status["phase"] = "running"
        log.info("worker %s running (group %s, topics %s, tables %s)", self.worker_id,
                 self.settings.group_id, ",".join(self.settings.topics), ",".join(self.settings.tables))

    async def _leave_after_failed_start(self, ready: asyncio.Future[None], joining: asyncio.Future[None]) -> None:
        """A step of the start-up failed while Faust was starting beside it (joining the group,
        nothing claimed: :meth:`started` says False): let Faust's start end, then stop it, so the
        process ends with the one line saying what failed (a Faust cancelled mid-start crashes
        its agents, and its consumer's thread keeps the process alive)."""
        _abandon(ready)
        bound = self.settings.shutdown_timeout_ms / 1000
        try:
            await asyncio.wait((joining,), timeout=bound)
        finally:
            _abandon(joining)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.faust.stop(), bound)

    async def _prepare(self) -> None:
        """What :meth:`_start` does while the group join is answered: import (in a thread) and
        build agents/assembly.py's parts, start the Spark session's wait, load the catalog, the
        group's key and the configured tables, and start reading the control topic."""
        began = time.monotonic()
        await self.offload.run(self._import_parts)
        from icesink.shared.iceberg import load_catalog, refuse_pending_rewind

        self.build_parts()
        await self.deadletters.start(self.bootstrap)
        # In a daemon thread: a session slower to start than the shutdown bound holds neither a
        # stop nor the process's exit.
        self.rounds.spark_ready = asyncio.ensure_future(self.offload.run_detached(self._start_spark))
        # Warming the JVM up as soon as it runs (overlapping the catalog and the group's join)
        # holds neither start-up nor a stop; rounds may write meanwhile.
        self._owner.spawn(self.rounds.warm_up(), "spark warm-up")
        self.catalog = await self.offload.run(load_catalog, self.settings)
        self.history.attach(self.catalog)
        self.tables.attach(self.catalog)
        # before any event is sent or read; has_run: where signing began for a group that ran unsigned
        await self.secret.load(self.catalog, self.offload, self.history.has_run)
        # a rewind interrupted after its table commit: the log would read on past the rolled-back records
        await self.offload.run(refuse_pending_rewind, self.catalog, self.settings)
        await self.tables.load_configured()
        self._owner.spawn(self.control.run(self.reader), "control")
        self._owner.spawn(self._housekeeping(), "housekeeping")
        gc_tuning.freeze_start_up()  # the catalogs' and the parts' objects, before the first read
        log.info("parts built, catalog and tables loaded in %.1fs, beside the group join", time.monotonic() - began)

    def _import_parts(self) -> None:
        """In a thread: the parts' modules (pyiceberg, pandas, the converters), and the caller's."""
        import agents.assembly  # noqa: F401
        import icesink.shared.iceberg  # noqa: F401

        if self._preload is not None:
            self._preload()

    async def started(self) -> bool:
        """For ownership's claims and coordinator (agents/ownership.py): wait until
        :meth:`_prepare` has ended; False if it failed or was stopped (the replica is stopping:
        nothing is claimed)."""
        ready = self._ready
        if ready is None:
            return False
        await asyncio.wait((ready,))
        return not ready.cancelled() and ready.exception() is None

    def _start_spark(self) -> None:
        self.spark.start()  # or wait for the start the caller began (icesink/app/cli.py)

    def status_report(self) -> dict[str, Any]:
        """For /status (read from the HTTP thread: copies only)."""
        out = dict(self.status)
        out["partitions"] = {
            str(tp): {"active": st.active, "next_offset": st.next_offset}
            for tp, st in list(self.buffers.partitions.items())
        }
        out["buffered"] = {"rows": self.buffers.rows, "bytes": self.buffers.nbytes,
                           "written_ahead_rows": self.buffers.written_rows,
                           "fetched_bytes": self.buffers.fetched_bytes, "backpressure": self.replica.backpressure}
        out["missing_tables"] = self.missing.status()
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

    async def _shutdown(self) -> None:
        """Stop within one deadline; the group moves this replica's partitions as it leaves
        (LeaveGroup, or its session expiring: see agents/faust_app.py install_leave_group). Buffered data that is not
        committed is not lost: the next owner re-reads it from the accepted position."""
        self.status["phase"] = "stopping"
        deadline = self.settings.shutdown_timeout_ms / 1000
        started = time.monotonic()

        def left() -> float:
            return max(0.1, deadline - (time.monotonic() - started))

        # Every background task (the coordinator too) is cancelled and awaited within the deadline.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_coordinator(drain=True), left())
        await self._owner.close(left())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.faust.stop(), left())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.reader.stop(), left())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.producer.stop(), left())
        if self._built:  # else a stop during start-up came before build_parts
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.deadletters.stop(), left())
            for client in self.registry_clients:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), left())
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.offload.run(self.spark.stop), left())
        self.offload.close()
        log.info("worker %s stopped in %.1fs", self.worker_id, time.monotonic() - started)

    async def supervise_coordinator(self) -> None:
        """Start the coordinator when this replica leads, stop it when it no longer does; a
        stopping replica (its coordinator draining, docs/commits.md) never starts one."""
        leader = self.app.is_leader() and self._leader is not None
        if leader and self._coordinator_task is None and not self._stop.is_set():
            self._coordinator_task = self._owner.spawn(
                supervise_coordinator(self._run_coordinator, self.metrics, stopping=self._stop.is_set), "coordinator")
            log.info("this replica is the leader: coordinator started")
        elif not leader and self._coordinator_task is not None:
            log.info("leadership moved: coordinator stopped")
            await self._stop_coordinator()

    async def _run_coordinator(self) -> None:
        """The coordinator's runs (agents/tasks.py restarts one after an unexpected error). One
        fenced by a newer epoch is replaced if this replica still leads the group a session
        timeout later: a replica that lost the lead has heard of it by then (and the rebalance
        handler stopped this task), so a stale leader's coordinator never fences the new one."""
        assert self._leader is not None  # only started with one (supervise_coordinator)
        while True:
            self._coordinator = self._leader(self.settings, self.bootstrap, self.producer, self.catalog, self.offload,
                                             self.metrics, rewrite=self._rewrite, launched_at=self.launched_at)
            try:
                await self._coordinator.run()
                return
            except FencedError as exc:
                log.error("coordinator fenced, stopping it: %s", exc)
            await asyncio.sleep(self.settings.session_timeout_ms / 1000)
            if not self.app.is_leader() or self._stop.is_set():
                return
            self.metrics.coordinator_restarts.inc()
            log.warning("this replica still leads the group %.0fs after its coordinator was fenced: a new coordinator "
                        "starts, with an epoch above every one seen", self.settings.session_timeout_ms / 1000)

    def _rewrite(self, table: Any, data_files: Any, delete_files: Any, prefix: str) -> Any:
        """Compaction's rewrite: this replica's file writer reads and writes the files
        (coordinator/maintenance.py; spark_bridge/rewrite.py, handed in by icesink/app/files.py)."""
        return self._rewrite_files(table, data_files, delete_files, file_prefix=prefix,
                                   target_file_size_bytes=self.settings.target_file_size_bytes)

    async def _stop_coordinator(self, drain: bool = False) -> None:
        """Stop the coordinator; with ``drain`` (the replica stops) it first gets half the
        shutdown bound to finish the table commits in flight and announce them (docs/commits.md).
        A leadership move cancels it at once (in the rebalance handler): the next coordinator
        fences it and announces what it committed."""
        task, self._coordinator_task = self._coordinator_task, None
        if task is not None:
            if drain and self._coordinator is not None and not task.done():
                try:
                    await self._coordinator.drain(self.settings.shutdown_timeout_ms / 2000)
                except Exception as exc:  # noqa: BLE001 - the cancel below stops it all the same
                    log.warning("coordinator's drain failed: %r", exc)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(2.0)
            now = time.monotonic()
            await self.ownership.reclaim_stale(now)
            await self.secret.maybe_reload(self.catalog, self.offload)
            await self.ingest.housekeep(now)

    async def send(self, event: Any) -> int:
        """An event on the control topic (agents/respond.py Sender)."""
        return await self.producer.send(event)

    # OwnershipHooks (agents/ownership.py), RoundHooks (agents/rounds.py), FaustHooks -----------
    # (agents/faust_app.py): what one part asks of another, passed on

    def settle_voided(self) -> None:
        self.rounds.settle_voided()

    def answer_open_round(self) -> None:
        self.control.answer_open_round()

    async def evolution_ready(self) -> Callable[[Chunk], bool] | None:
        return await self.tables.evolution_ready(self.buffers)

    async def release_backpressure(self) -> None:
        await self.ingest.release_backpressure()

    async def reseek_and_resume(self, st: PartitionState) -> None:
        await self.ingest.reseek_and_resume(st)

    def update_gauges(self) -> None:
        self.ingest.update_gauges()

    def update_paused(self) -> None:
        self.ingest.update_paused()

    async def on_fetch(self, fetched: Fetched) -> None:
        if self._built:  # else the start-up failed before it (nothing was claimed): the replica stops
            await self.ingest.on_fetch(fetched)

    def hold_paused_partitions(self) -> None:
        self.ownership.hold_paused_partitions()


def _abandon(*steps: asyncio.Future[Any]) -> None:
    """Cancel start-up steps no one awaits any more; what they raise is retrieved, not logged as
    never retrieved."""
    for step in steps:
        step.add_done_callback(_retrieve)
        step.cancel()


def _retrieve(step: asyncio.Future[Any]) -> None:
    if not step.cancelled():
        step.exception()


def _exit_hard(limit: float) -> None:
    log.error("shutdown did not finish within %.1fs; exiting now (uncommitted work is re-read by the next owner)", limit)
    for h in logging.getLogger().handlers:
        h.flush()
    os._exit(70)
