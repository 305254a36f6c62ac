"""The Faust app of a worker replica and the patches it runs with.

The app subscribes the source topics through its conductor; the records reach the agent
``icesink-ingest`` as whole fetches (:func:`agents.kafka.install_batch_drain`), one
channel event per fetch. Faust owns group membership, rebalances (the worker's
:class:`agents.ownership.Ownership` answers them) and leader election (the leader runs the
coordinator). The patches themselves live behind agents/kafka/ (pinned faust-streaming and
aiokafka internals, checked as Faust starts).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import faust

from agents import kafka
from agents.buffer import Buffers
from agents.kafka import (
    HELD_JOIN_SESSION_TIMEOUT_MS, ConsumerGuard, Fetched, TablelessManager, faust_credentials, inject_faults,
    install_batch_drain, isolation_level,
)
from agents.parts import Replica
from agents.registry_client import RegistryUnavailable
from icesink.shared.config import Settings
from icesink.shared.errors import ConfigError, DataError, UnsupportedTypeError
from icesink.shared.metrics import Metrics

log = logging.getLogger(__name__)

FETCHES_QUEUED = 2  # fetches waiting for the ingest agent
#: The exit code of a replica that stopped because the schema registry gave no answer for as
#: long as its consumer may hold a fetch (1 is a bug, 2 a setting or record no retry mends).
REGISTRY_EXIT_CODE = 3


def faust_settings(s: Settings) -> dict[str, Any]:
    """The consumer's group timing and batch size, as Faust's ``App`` takes them."""
    return {
        "broker_session_timeout": s.session_timeout_ms / 1000,
        "broker_heartbeat_interval": max(0.5, s.session_timeout_ms / 10_000),
        # Shorter than Faust's default (1000 s): the agent never blocks long (Spark writes run
        # beside it); a schema-registry wait gives up before it (agents/registry_source.py).
        # LeaveGroup: see install_leave_group.
        "broker_max_poll_interval": s.consumer_max_poll_interval_ms / 1000,
        "broker_rebalance_timeout": max(20.0, 2 * s.session_timeout_ms / 1000),  # Faust's default: 60 s
        "broker_max_poll_records": s.consumer_max_batch,  # records of one fetch handed to the agent
    }


def ingest_failed(worker: FaustHooks, exc: Exception, records: int) -> None:
    """The ingest agent failed on a fetch of ``records``: stop the replica. A schema registry
    that gave no answer stops it with :data:`REGISTRY_EXIT_CODE` (its partitions' next owner, or
    this replica restarted, reads the fetch again). Anything else is a bug: Faust would restart
    the agent without this batch and the replica would answer empty rounds for ever; stop
    instead (exit code 1), so the failure is seen and the records are read again."""
    if isinstance(exc, RegistryUnavailable):
        worker.fail(exc, exit_code=REGISTRY_EXIT_CODE)
        return
    log.error("ingest failed on a fetch of %d records", records, exc_info=exc)
    worker.fail(exc, exit_code=1)


class FaustHooks(Protocol):
    """What the Faust app asks of the rest of the replica (:class:`agents.worker.Worker` wires it)."""

    async def on_fetch(self, fetched: Fetched) -> None:
        """One fetch of the source topics (agents/ingest.py)."""

    def fail(self, exc: Exception, exit_code: int = 2) -> None:
        """Stop the replica, saying why."""

    def hold_paused_partitions(self) -> None:
        """Before Faust starts: what the replica paused stays paused (agents/ownership.py)."""


class FaustApp:
    """The replica's Faust app (``app``), subscribed to ``settings.topics`` as the member of
    its consumer group; ``buffers`` count each fetch's bytes until it is converted."""

    def __init__(self, settings: Settings, bootstrap: str, replica: Replica, buffers: Buffers, metrics: Metrics,
                 hooks: FaustHooks) -> None:
        self.settings = settings
        self.replica = replica
        self.buffers = buffers
        self.metrics = metrics
        self.hooks = hooks
        self.worker: faust.Worker | None = None  # once started (a stop during its start stops it too)
        self.app = self._make_app(bootstrap)

    def fit_session(self, holds_joins: bool) -> Settings:
        """The settings the consumer joins its group with, called before :meth:`start`:
        ``holds_joins`` (the broker holds each JoinGroup for half the session timeout) and no
        ``consumer.session-timeout-ms`` set give :data:`HELD_JOIN_SESSION_TIMEOUT_MS`, with the
        heartbeat and rebalance timing that follow from it (:func:`faust_settings`)."""
        if not holds_joins or "session_timeout_ms" in self.settings.model_fields_set:
            return self.settings
        self.settings = self.settings.model_copy(update={"session_timeout_ms": HELD_JOIN_SESSION_TIMEOUT_MS})
        for key, value in faust_settings(self.settings).items():
            setattr(self.app.conf, key, value)  # read as Faust makes the consumer, when it starts
        log.info("the broker holds each JoinGroup for half the session timeout (Tansu): consumer.session-timeout-ms "
                 "is %d ms here, not set (10000 on Kafka), so the group joins in %.0f s", HELD_JOIN_SESSION_TIMEOUT_MS,
                 HELD_JOIN_SESSION_TIMEOUT_MS / 2000)
        return self.settings

    def _make_app(self, bootstrap: str) -> faust.App:
        s = self.settings
        datadir = (s.state_dir / "faust" / self.replica.worker_id).resolve()
        datadir.parent.mkdir(parents=True, exist_ok=True)
        app = faust.App(
            s.group_id,
            broker=";".join(f"kafka://{b.strip()}" for b in bootstrap.split(",")),
            broker_credentials=faust_credentials(s),
            value_serializer="raw",
            key_serializer="raw",
            store="memory://",
            web_enabled=False,
            datadir=str(datadir),
            consumer_auto_offset_reset="earliest",
            topic_partitions=1,
            topic_replication_factor=1,
            **faust_settings(s),
            producer_acks=-1,
            logging_config=None,
            TableManager=TablelessManager,  # no Faust tables here: no wait for them at start
        )
        # acks=False: Faust never tracks or commits these offsets; icesink commits them only
        # after CommitComplete. The topic is subscribed through the conductor (start); its records
        # reach the agent as whole fetches (kafka.install_batch_drain), through an
        # in-memory channel of at most FETCHES_QUEUED fetches: a slow agent holds the drain
        # back, so fetched bytes waiting for conversion stay bounded.
        self.source = app.topic(*s.topics, value_serializer="raw", key_serializer="raw", acks=False)
        self.fetches = app.channel(maxsize=FETCHES_QUEUED)
        worker = self.hooks

        @app.agent(self.fetches, name="icesink-ingest")
        async def ingest(stream: faust.StreamT[Fetched]) -> None:
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
                    ingest_failed(worker, exc, len(fetched))
                    return

        return app

    async def start(self) -> None:
        """Start the Faust worker: from here on this replica is a member of the consumer group."""
        kafka.check_versions()  # the internals agents/kafka/ patches are those of the pinned versions
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
        install_batch_drain(self.app, self._deliver)
        kafka.install_leader_check(self.app)  # an assignment without Faust's leader topic is made again
        self.hooks.hold_paused_partitions()  # claimed partitions stay paused until their Resume
        inject_faults(self.settings)  # fault tests only
        # read_committed; a consumer that can no longer consume stops the replica (exit code 1)
        ConsumerGuard(self.app, self.metrics, lambda exc: self.hooks.fail(exc, exit_code=1), self.replica.stop.is_set,
                      self.settings.fetch_min_bytes).install()
        self.worker = faust_worker  # a stop during its start stops it too
        await faust_worker.start()
        install_leave_group(self.app)
        self.replica.status["isolation_level"] = isolation_level(self.app)
        self.replica.status["session_timeout_ms"] = kafka.group_session_timeout_ms(self.app)

    async def stop(self) -> None:
        """Stop the Faust worker, if it was started: the replica leaves the group."""
        if self.worker is not None:
            await self.worker.stop()

    async def _deliver(self, fetched: Fetched) -> None:
        """A fetch to the ingest agent; its raw bytes count against the buffers' bound until
        it is converted (Ingest.on_fetch)."""
        self.buffers.hold(fetched)
        await self.fetches.send(value=fetched)


def install_leave_group(app: faust.App) -> None:
    """LeaveGroup as the replica stops, unless :func:`skip_leave_group` says why not
    (agents/kafka/group.py)."""
    kafka.install_leave_group(app, skip_leave_group)


def skip_leave_group(consumer: Any, leader: bool) -> str | None:
    """Why this replica stops without LeaveGroup (None: it sends it); ``leader``: it is the
    group's leader (it assigned the partitions of the current generation)."""
    if leader and kafka.keeps_departed_leader(consumer):
        return "this replica leads the group, and the broker keeps a departed leader (Tansu)"
    return None
