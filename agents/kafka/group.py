"""The consumer group as Faust's aiokafka consumer runs it: LeaveGroup on stop (except the
leader on a broker that keeps a departed leader), an assignment that gave Faust's leader topic to
no member made again, and the group's offset commits.

Pinned to aiokafka 0.14 internals (GroupCoordinator._perform_assignment, _maybe_leave_group,
AIOKafkaConnection._versions) and faust-streaming 0.15.3's consumer (``_thread``, ``_commit``);
agents/kafka/versions.py checks the pins at start-up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import faust
from faust.types import TP

from agents.kafka.source_consumer import driver

log = logging.getLogger(__name__)

#: OffsetForLeaderEpoch: every Apache Kafka broker since 0.11 declares it in ApiVersions; Tansu
#: (0.6) does not (a Tansu group's leader logs that it stops without LeaveGroup).
OFFSET_FOR_LEADER_EPOCH = 23
#: The group session of a member whose session timeout is not set, on a broker that holds each
#: JoinGroup until half of it has passed (:func:`holds_joins`): a join then takes 3 s instead
#: of 5 (the default, 10 s, stays elsewhere). Kafka's own least (``group.min.session.timeout.ms``).
#: Worker replicas (agents/faust_app.py) and ``icesink connect``'s group (icesink/app/connect_group.py).
HELD_JOIN_SESSION_TIMEOUT_MS = 6000


def _tansu(client_owner: Any) -> bool:
    """Whether the broker of an aiokafka consumer or producer is Tansu: recognised by the
    ApiVersions answer of its connections, which lacks OffsetForLeaderEpoch. False when no
    connection has answered (aiokafka 0.14 internals: AIOKafkaConnection._versions)."""
    conns = getattr(getattr(client_owner, "_client", None), "_conns", {})
    versions = [v for conn in list(conns.values()) if (v := getattr(conn, "_versions", None))]
    return bool(versions) and all(OFFSET_FOR_LEADER_EPOCH not in v for v in versions)


def keeps_departed_leader(consumer: Any) -> bool:
    """Whether the consumer's broker is one whose group coordinator keeps a leader that sent
    LeaveGroup during a rebalance (Tansu; see :func:`install_leave_group`). False when no
    connection has answered."""
    return _tansu(consumer)


def holds_joins(consumer: Any) -> bool:
    """Whether the consumer's broker holds every JoinGroup until half the group's session
    timeout has passed (Tansu, to wait for more members: tansu-io/tansu
    ``coordinator/group/administrator.rs``, a second at a time), so a new group, or a group
    after a member died, joins half a session later than on Kafka. False when no connection
    has answered (any aiokafka consumer that has read from the broker, e.g. the control reader)."""
    return _tansu(consumer)


def install_leave_group(app: faust.App, skip_leave_group: Callable[[Any, bool], str | None]) -> None:
    """A stopping replica sends LeaveGroup (aiokafka does, as its consumer stops), so the
    group hands its partitions to the others at once instead of after
    ``consumer.session-timeout-ms``, unless ``skip_leave_group(consumer, leader)`` gives a
    reason not to (``leader``: this member assigned the current generation's partitions).
    Call after the consumer started.

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
        consumer = driver(app)._thread._consumer
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
        skip = skip_leave_group(consumer, led[0] == coordinator.generation)
        if skip is None:
            await leave()
            return
        log.info("stopping without LeaveGroup: %s; its partitions move when its session expires "
                 "(consumer.session-timeout-ms)", skip)
        coordinator.reset_generation()  # what _maybe_leave_group does after its request

    coordinator._perform_assignment = perform_assignment
    coordinator._maybe_leave_group = maybe_leave_group


async def commit_offsets(app: faust.App, offsets: Mapping[TP, int]) -> None:
    """Commit ``offsets`` for the consumer group now (Faust's own commit path, ``_commit``:
    Faust never tracks icesink's records, acks=False)."""
    await driver(app)._commit(offsets)


def request_rejoin(consumer: Any) -> None:
    """Make an aiokafka consumer's group rebalance soon (its leader assigns again), as Kafka
    Connect's leader does when the connectors change (aiokafka 0.14 internals:
    ``AIOKafkaConsumer._coordinator``, ``GroupCoordinator.request_rejoin``)."""
    consumer._coordinator.request_rejoin()


def stop_without_leave_group(consumer: Any) -> None:
    """Make an aiokafka consumer's ``stop()`` send no LeaveGroup (see
    :func:`install_leave_group` for the broker that needs it): its members see it go when its
    session expires (aiokafka 0.14 internals: ``GroupCoordinator._maybe_leave_group``)."""
    coordinator = consumer._coordinator

    async def maybe_leave_group() -> None:
        coordinator.reset_generation()  # what _maybe_leave_group does after its request

    coordinator._maybe_leave_group = maybe_leave_group


#: How long a group's assigner waits before it looks for Faust's leader topic again, doubling.
LEADER_TOPIC_RETRY_S = (1.0, 10.0)


def install_leader_check(app: faust.App) -> None:
    """Make the group's assigner assign again when its assignment gave Faust's leader topic to
    no member. Faust's leader (the replica that runs the coordinator) is the member holding that
    topic's one partition; an assignment made while the topic was not in the assigner's metadata
    (created a moment before on a fresh Apache Kafka broker) gave it to no one, so no replica
    led: no coordinator, no partition resumed, and aiokafka assigns again only when the metadata
    it refreshes every 5 minutes differs from what it assigned with. The assigner now refreshes
    the metadata until the topic is there (capped backoff, logged) and then asks the group to
    assign again. Call before the app starts (faust-streaming 0.15.3 internals:
    ``App.assignor``, ``LeaderAssignor._leader_topic_name``; aiokafka 0.14: the consumer's
    ``_client`` and ``_coordinator``)."""
    assignor: Any = app.assignor
    assign = assignor.assign
    topic: str = app._leader_assignor._leader_topic_name  # type: ignore[attr-defined]
    leaderless = False  # the assigner's last assignment gave the leader topic to no one
    retry: asyncio.Task[None] | None = None

    def assign_checked(cluster: Any, member_metadata: Any) -> Any:
        nonlocal leaderless, retry
        assignments = assign(cluster, member_metadata)
        leaderless = topic not in {entry[0] for member in assignments.values() for entry in member.assignment}
        if leaderless and (retry is None or retry.done()):
            log.warning("the group's assignment gave Faust's leader topic %s to no member (missing from the "
                        "metadata): no replica leads, so none runs the coordinator; assigning again once the "
                        "topic is there", topic)
            retry = asyncio.get_running_loop().create_task(assign_again())  # aiokafka's loop
        return assignments

    async def assign_again() -> None:
        consumer: Any = driver(app)._thread._consumer
        first, cap = LEADER_TOPIC_RETRY_S
        delay = first
        while leaderless and not consumer._closed:
            await asyncio.sleep(delay)
            delay = min(delay * 2, cap)
            try:
                await consumer._client.force_metadata_update()
            except Exception as exc:  # noqa: BLE001 - the next attempt asks again
                log.warning("metadata update for Faust's leader topic %s failed (%r); trying again in %.0f s",
                            topic, exc, delay)
                continue
            if not consumer._client.cluster.partitions_for_topic(topic):
                log.warning("Faust's leader topic %s is still missing from the metadata; looking again in %.0f s",
                            topic, delay)
            elif leaderless:
                log.info("Faust's leader topic %s is in the metadata: the group assigns again", topic)
                consumer._coordinator.request_rejoin()
                return

    assignor.assign = assign_checked  # Faust (pinned); aiokafka's coordinator calls it
