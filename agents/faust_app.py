"""The Faust app of a worker replica and the patches it runs with.

The app subscribes the source topics through its conductor; the records reach the agent
``icesink-ingest`` as whole fetches (:func:`agents.source_consumer.install_batch_drain`), one
channel event per fetch. Faust owns group membership, rebalances (the worker's
:class:`agents.ownership.Ownership` answers them) and leader election (the leader runs the
coordinator). Pinned to faust-streaming 0.15.3 and aiokafka 0.14 internals (pyproject.toml).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust

from agents.source_consumer import (
    ConsumerGuard, Fetched, driver, faust_credentials, inject_faults, install_batch_drain, isolation_level,
)
from agents.worker_state import WorkerState
from icesink.errors import ConfigError, DataError, UnsupportedTypeError

log = logging.getLogger(__name__)

FETCHES_QUEUED = 2  # fetches waiting for the ingest agent
#: OffsetForLeaderEpoch: every Apache Kafka broker since 0.11 declares it in ApiVersions; Tansu
#: (0.6) does not (a Tansu group's leader logs that it stops without LeaveGroup).
OFFSET_FOR_LEADER_EPOCH = 23


def keeps_departed_leader(consumer: Any) -> bool:
    """Whether the consumer's broker is one whose group coordinator keeps a leader that sent
    LeaveGroup during a rebalance (Tansu; see FaustApp._install_leave_group): recognised by the
    ApiVersions answer of its connections, which lacks OffsetForLeaderEpoch. False when no
    connection has answered (aiokafka 0.14 internals: AIOKafkaConnection._versions)."""
    conns = getattr(getattr(consumer, "_client", None), "_conns", {})
    versions = [v for conn in list(conns.values()) if (v := getattr(conn, "_versions", None))]
    return bool(versions) and all(OFFSET_FOR_LEADER_EPOCH not in v for v in versions)


class FaustApp(WorkerState):
    """Mixed into :class:`agents.worker.Worker`, whose state it shares."""

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
            # never blocks long (Spark writes run beside it). LeaveGroup: see _install_leave_group.
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
                    # A bug. Faust would restart the agent without this batch and the replica
                    # would answer empty rounds for ever: stop instead (exit code 1), so the
                    # failure is seen and the records are read again by the next owner.
                    log.exception("ingest failed on a fetch of %d records", len(fetched))
                    worker.fail(exc, exit_code=1)
                    return

        # mode types every receiver as (sender, *args, signal=, **kwargs): ours take just the
        # arguments their signal sends (the revoked or assigned partitions, or none).
        app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]
        app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]
        app.on_rebalance_complete.connect(self._on_rebalance_complete)  # type: ignore[arg-type]
        return app

    def _install_leave_group(self) -> None:
        """A stopping replica sends LeaveGroup (aiokafka does, as its consumer stops), so the
        group hands its partitions to the others at once instead of after
        ``consumer.session-timeout-ms``. Except the group's leader on a broker that keeps a
        departed leader (:func:`keeps_departed_leader`: Tansu), which stops without it.

        Tansu (0.6, and its main branch as of 2026-11) drops a member that sends LeaveGroup while
        the group is rebalancing, but if that member was the leader it stays the leader (its
        ``Forming`` state's leave does not clear the leader; the ``Formed`` state's does). New
        members are then all told to follow the departed leader, and their SyncGroups answer
        REBALANCE_IN_PROGRESS until Tansu happens to reload the group from storage: minutes, or
        never (bench/group_restart_repro.py, ``--leave-group always``). A follower's LeaveGroup
        leaves the leader in place, and a leader whose session expires stops being the leader,
        so the next member to join leads. So on Tansu a follower's partitions move at once, the
        leader's after its session timeout. Pinned to aiokafka 0.14 internals
        (GroupCoordinator._perform_assignment, _maybe_leave_group)."""
        try:
            consumer = driver(self.app)._thread._consumer
        except AttributeError:
            consumer = None
        coordinator: Any = getattr(consumer, "_coordinator", None)  # None: no consumer yet
        if not (hasattr(coordinator, "_maybe_leave_group") and hasattr(coordinator, "_perform_assignment")):
            log.warning("no aiokafka group coordinator found: this replica will send LeaveGroup as it stops")
            return
        assign, leave = coordinator._perform_assignment, coordinator._maybe_leave_group
        # The generation this member last assigned partitions in, as the group's leader (the
        # leader alone holds a group subscription once it assigned; a join started drops it).
        led = [coordinator.generation if getattr(coordinator, "_group_subscription", None) is not None else -1]

        async def perform_assignment(response: Any) -> Any:
            led[0] = int(response.generation_id)
            return await assign(response)

        async def maybe_leave_group() -> None:
            skip = self._skip_leave_group(consumer, led[0] == coordinator.generation)
            if skip is None:
                await leave()
                return
            log.info("stopping without LeaveGroup: %s; its partitions move when its session expires "
                     "(consumer.session-timeout-ms)", skip)
            coordinator.reset_generation()  # what _maybe_leave_group does after its request

        coordinator._perform_assignment = perform_assignment
        coordinator._maybe_leave_group = maybe_leave_group

    def _skip_leave_group(self, consumer: Any, leader: bool) -> str | None:
        """Why this replica stops without LeaveGroup (None: it sends it); ``leader``: it is the
        group's leader (it assigned the partitions of the current generation)."""
        if leader and keeps_departed_leader(consumer):
            return "this replica leads the group, and the broker keeps a departed leader (Tansu)"
        return None

    async def _start_faust(self) -> None:
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
        install_batch_drain(self.app, self._deliver)
        self._hold_paused_partitions()  # claimed partitions stay paused until their Resume
        inject_faults(self.settings)  # fault tests only
        # read_committed; a consumer that can no longer consume stops the replica (exit code 1)
        ConsumerGuard(self.app, self.metrics, lambda exc: self.fail(exc, exit_code=1), self._stop.is_set,
                      self.settings.fetch_min_bytes).install()
        self._faust_worker = faust_worker  # a stop during its start stops it too
        await faust_worker.start()
        self._install_leave_group()
        self.status["isolation_level"] = isolation_level(self.app)

    async def _deliver(self, fetched: Fetched) -> None:
        """A fetch to the ingest agent; its raw bytes count against the buffers' bound until
        it is converted (Ingest.on_fetch)."""
        self.buffers.hold(fetched)
        await self.fetches.send(value=fetched)
