"""``icesink connect``'s membership: the connect processes are one Kafka consumer group.

As in Kafka Connect, the processes of a cluster are the members of the consumer group
``group.id`` (aiokafka's group coordinator: JoinGroup, SyncGroup, heartbeats every
``heartbeat.interval-ms``, a member whose heartbeats stop for ``session.timeout-ms`` is removed,
LeaveGroup on a graceful stop). Each member's metadata carries its id, REST URL and a token
of this run of the process (:class:`Member`); the group's leader runs :class:`ConnectAssignor`,
which computes the :class:`~icesink.app.connect_state.Placement` of every connector and task
from the members and the connectors it has read from the config topic, and hands the whole
placement to every member in its assignment's user data (no partition is assigned: the group
subscribes to the config topic only to have a subscription; every process reads that topic by
itself). When the connectors change which tasks exist, the leader asks for a rejoin
(:meth:`Membership.follow`), so the group places them, as Connect's leader does; until then
every member places the new tasks by the leader's rule over the placement's members (Tansu
answers a rejoin that changes no member with the previous assignment, so there that rule
is what places them).

Where aiokafka has no public call (a rejoin on request, a stop without LeaveGroup) this module
goes through the door to its internals, :mod:`agents.kafka`.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from icesink.app.connect_state import Placement

log = logging.getLogger(__name__)

#: The assignment strategy's name: every member of a connect group must speak it.
PROTOCOL = "icesink-connect-v1"


@dataclass(frozen=True)
class Member:
    """What a member tells the group's leader: its worker id, REST URL, and a token new at
    every start (a process restarted with the same id is another member)."""

    worker_id: str
    url: str
    token: str

    def encode(self) -> bytes:
        return json.dumps({"version": 1, "id": self.worker_id, "url": self.url, "token": self.token}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Member:
        """Raises ValueError for anything but an encoded member."""
        try:
            d = json.loads(data)
            return cls(str(d["id"]), str(d["url"]), str(d["token"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a connect group member: {exc}") from exc


def place(members: Mapping[str, bytes], layout: Mapping[str, int], leader: str) -> dict[str, bytes]:
    """The leader's assignment: member id -> the encoded placement of everything (the same for
    every member). A member whose metadata cannot be read is placed nothing (and logged)."""
    workers: dict[str, str] = {}
    for member_id, data in sorted(members.items()):
        try:
            m = Member.decode(data)
        except ValueError as exc:
            log.warning("connect group member %s: %s; it runs no task", member_id, exc)
            continue
        workers[m.worker_id] = m.url
    body = Placement.compute(workers, layout, leader).encode()
    return {member_id: body for member_id in members}


class ConnectAssignor(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka has no type information
    """aiokafka's assignment strategy for a connect group (an instance per process, as Faust's
    assignor is: its metadata is this process's, its leader reads this process's state)."""

    name = PROTOCOL

    def __init__(self, me: Member, layout: Callable[[], dict[str, int]],
                 placed: Callable[[Placement], None]) -> None:
        self.me = me
        self.layout = layout
        self.placed = placed

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(0, sorted(topics), self.me.encode())

    def assign(self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
               ) -> dict[str, ConsumerProtocolMemberAssignment]:
        layout = self.layout()
        out = place({mid: bytes(m.user_data or b"") for mid, m in members.items()}, layout, self.me.token)
        log.info("connect group leader %s: placed %d tasks of %d connectors on %d members", self.me.worker_id,
                 sum(layout.values()), len(layout), len(members))
        return {mid: ConsumerProtocolMemberAssignment(0, [], body) for mid, body in out.items()}

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        try:
            placement = Placement.decode(bytes(assignment.user_data or b""))
        except ValueError as exc:
            log.warning("connect group: an assignment without a placement (%s): keeping the last one", exc)
            return
        self.placed(placement)


class Membership:
    """This process's membership of the connect group: the latest placement, the leader's
    rejoin when the connectors change, LeaveGroup on stop."""

    def __init__(self, worker_id: str, url: str, group_id: str, topic: str, session_s: float,
                 heartbeat_s: float) -> None:
        self.me = Member(worker_id, url, secrets.token_hex(8))
        self.group_id, self.topic = group_id, topic
        self.session_s, self.heartbeat_s = session_s, heartbeat_s
        self.placement = Placement()  # nothing placed until the group's first assignment
        self._consumer: Any = None
        self._asked: dict[str, int] | None = None  # the layout a rejoin was last asked for

    @property
    def leader(self) -> bool:
        return self.placement.leader == self.me.token

    def _placed(self, placement: Placement) -> None:
        self.placement = placement
        log.info("connect worker %s: placement from the group's leader: %d members, %d connectors%s",
                 self.me.worker_id, len(placement.workers), len(placement.layout), " (leader)" if self.leader else "")

    def fit_session(self, holds_joins: bool, session_set: bool) -> None:
        """Before :meth:`start`: on a broker that holds each JoinGroup for half the session
        (Tansu: agents/kafka/group.py ``holds_joins``), a session not set is
        ``HELD_JOIN_SESSION_TIMEOUT_MS`` (6 s), so the process joins in 3 s instead of 5, unless
        its heartbeats would then come less than three times a session."""
        from agents.kafka import HELD_JOIN_SESSION_TIMEOUT_MS

        shorter = HELD_JOIN_SESSION_TIMEOUT_MS / 1000
        if not holds_joins or session_set or shorter < 3 * self.heartbeat_s:
            return
        self.session_s = shorter
        log.info("the broker holds each JoinGroup for half the session timeout (Tansu): session.timeout-ms is %d ms "
                 "here, not set (10000 on Kafka), so the group joins in %.0f s", HELD_JOIN_SESSION_TIMEOUT_MS,
                 shorter / 2)

    async def start(self, bootstrap: str, layout: Callable[[], dict[str, int]], client_kwargs: dict[str, Any]) -> None:
        from aiokafka import AIOKafkaConsumer

        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=self.group_id, enable_auto_commit=False,
            session_timeout_ms=int(self.session_s * 1000), heartbeat_interval_ms=int(self.heartbeat_s * 1000),
            partition_assignment_strategy=[ConnectAssignor(self.me, layout, self._placed)], **client_kwargs)
        await self._consumer.start()
        self._consumer.subscribe([self.topic])

    async def poll(self) -> None:
        """Keep the membership: aiokafka leaves the group of a consumer that does not poll
        (max.poll.interval.ms); the group's errors are raised here."""
        await self._consumer.getmany(timeout_ms=1000)

    def follow(self, layout: dict[str, int]) -> None:
        """As the group's leader, ask for a rejoin when the connectors' tasks are no longer
        those placed, so that the group places them (once for each layout)."""
        if self.leader and layout != self.placement.layout and layout != self._asked:
            from agents import kafka

            log.info("connect group leader %s: the connectors changed; rebalancing", self.me.worker_id)
            self._asked = layout
            kafka.request_rejoin(self._consumer)

    async def stop(self) -> None:
        """Leave the group (LeaveGroup: the others take this process's tasks at once), except
        as the leader on a broker that keeps a departed leader (Tansu: agents/kafka/group.py),
        whose tasks move when its session expires."""
        if self._consumer is None:
            return
        from agents import kafka

        if self.leader and kafka.keeps_departed_leader(self._consumer):
            log.info("connect worker %s leads the group on a broker that keeps a departed leader (Tansu): stopping "
                     "without LeaveGroup; its tasks move when its session expires (session.timeout-ms)",
                     self.me.worker_id)
            kafka.stop_without_leave_group(self._consumer)
        await self._consumer.stop()
