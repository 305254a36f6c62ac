"""Partition ownership of a worker replica: what a rebalance assigns is claimed from the
coordinator (Claim), consumed only after its Resume (seeking to the accepted position), and
given back on Rewind. A partition moved away keeps no buffers here (docs/commits.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import faust
from faust.types import TP

from agents.buffer import Buffers, PartitionState
from agents.kafka import group_member_id
from agents.missing import MissingTables
from agents.parts import Replica
from agents.tasks import TaskOwner, unless_moved
from icesink.shared.protocol import Claim, Resume, Rewind, TopicPartition

log = logging.getLogger(__name__)

CLAIM_RETRY_S = 15.0  # a claim with no Resume for this long is sent again (reclaim_stale)


def _tp(t: Any) -> TopicPartition:
    return TopicPartition(t.topic, t.partition)


class OwnershipHooks(Protocol):
    """What ownership asks of the rest of the replica (:class:`agents.worker.Worker` wires it)."""

    async def started(self) -> bool:
        """Wait until the replica can claim (its parts built, the group's key loaded: the join is
        asked for before, agents/assembly.py); False: its start-up failed, it is stopping. Not
        awaited in a rebalance signal: aiokafka sends no heartbeat while one runs."""
        ...

    def settle_voided(self) -> None:
        """The buffers dropped data: delete the files no round will report (agents/rounds.py)."""

    def answer_open_round(self) -> None:
        """Partitions became active: answer the round in flight, if any, for them too."""

    async def supervise_coordinator(self) -> None:
        """The group's leader may have moved: start or stop the coordinator."""

    def update_paused(self) -> None:
        """The set of paused partitions may have changed (a gauge)."""


class Ownership:
    """Answers the Faust app's rebalance signals and the coordinator's Resume and Rewind for
    the partitions of ``topics``; ``send`` puts a Claim on the control topic."""

    def __init__(self, topics: Sequence[str], replica: Replica, buffers: Buffers, missing: MissingTables,
                 app: faust.App, send: Callable[[Claim], Awaitable[object]], tasks: TaskOwner,
                 hooks: OwnershipHooks) -> None:
        self.topics = frozenset(topics)
        self.replica = replica
        self.buffers = buffers
        self.missing = missing
        self.app = app
        self.send = send
        self.tasks = tasks
        self.hooks = hooks
        self.claimed_at: dict[TopicPartition, float] = {}  # claims without their Resume yet
        self._started = False  # the replica's start-up has ended (hooks.started)

    def connect(self) -> None:
        """Answer the app's rebalance signals. Faust types every receiver as (sender, *args,
        signal=, **kwargs): ours take just the arguments their signal sends."""
        self.app.on_partitions_revoked.connect(self.on_revoked)  # type: ignore[arg-type]
        self.app.on_partitions_assigned.connect(self.on_assigned)  # type: ignore[arg-type]
        self.app.on_rebalance_complete.connect(self.on_rebalance_complete)  # type: ignore[arg-type]

    def _source(self, tps: Iterable[Any]) -> set[TopicPartition]:
        return {_tp(t) for t in tps if t.topic in self.topics}

    async def on_revoked(self, sender: Any, revoked: set[Any], **_: Any) -> None:
        self.replica.rebalanced.clear()
        for tp in self._source(revoked):
            st = self.buffers.partitions.get(tp)
            if st is not None:
                st.active = False  # keep chunks: the same partition may come back to us

    async def on_assigned(self, sender: Any, assigned: set[Any], **_: Any) -> None:
        self.replica.rebalanced.clear()
        generation = self.replica.generation = int(self.app.consumer_generation_id or 0)
        self.replica.member_id = group_member_id(self.app)
        mine = self._source(assigned)
        for tp in list(self.buffers.partitions):
            if tp not in mine:
                self.buffers.release(tp)
                self.missing.release(tp)
                self.claimed_at.pop(tp, None)
        for tp in mine:
            self.buffers.claim(tp, generation)  # held paused (_held) until its Resume
        if self._started:
            self._claim(sorted(mine))
        else:
            # Still starting (agents/assembly.py): the claim waits for the group's key in a task of
            # its own. Waiting here would hold aiokafka's rebalance listener, and with it the
            # member's heartbeats.
            self.tasks.spawn(self._claim_once_started(sorted(mine), generation), "claim")

    def _claim(self, tps: Sequence[TopicPartition]) -> None:
        self.hooks.settle_voided()  # files written early with a partition gone: void
        if tps:
            self.tasks.spawn(self.send_claim(tps), "claim")

    async def _claim_once_started(self, tps: Sequence[TopicPartition], generation: int) -> None:
        if await self._settled_once_started(generation):  # else a newer assignment claims for itself
            self._claim(tps)

    async def _settled_once_started(self, generation: int) -> bool:
        """Whether the replica has started and the assignment of ``generation`` is still the
        settled one (as reclaim_stale asks): a start-up that ends inside a later rebalance neither
        claims nor leads with the assignment that rebalance is replacing."""
        if not await self._wait_started():
            return False
        await self.replica.rebalanced.wait()
        return generation == self.replica.generation

    async def _wait_started(self) -> bool:
        """False: the replica's start-up failed; it is stopping and claims nothing."""
        if not self._started:
            self._started = await self.hooks.started()
        return self._started

    async def send_claim(self, tps: Sequence[TopicPartition]) -> None:
        now = time.monotonic()
        for tp in tps:
            self.claimed_at[tp] = now
        try:
            await self.send(Claim(self.replica.worker_id, self.replica.generation, tuple(tps), self.replica.member_id))
        except Exception as exc:
            log.warning("claim for %s not sent (%s); retried", ",".join(map(str, tps)), exc)

    def hold_paused_partitions(self) -> None:
        """Keep what this worker paused paused through Faust's resume after a rebalance.

        Faust sends on_rebalance_complete, then resumes every assigned partition and seeks
        them to the group's committed offsets (Recovery._resume_streams). That undid the pause
        of partitions still claiming: their records were fetched, parsed and dropped until the
        coordinator's Resume (a large part of a backlog at start-up; see bench/README.md,
        ingest_bench), and
        the pause of full buffers. Faust's consumer now resumes only partitions this worker
        does not hold (:meth:`_held`); the worker's own resumes come after it let go of them
        (Resume activates first; backpressure is lifted first). Call before Faust starts."""
        consumer = self.app.consumer
        resume = consumer.resume_partitions

        def resume_unless_held(tps: Iterable[Any]) -> None:
            resume([tp for tp in tps if not self._held(tp)])

        consumer.resume_partitions = resume_unless_held  # type: ignore[method-assign]  # Faust (pinned)

    def _held(self, tp: Any) -> bool:
        """A source partition this worker keeps paused: claimed and not resumed yet, held for a
        missing table (agents/missing.py), or any while the buffers are full."""
        st = self.buffers.partitions.get(_tp(tp))
        return st is not None and (not st.active or self.replica.backpressure or self.missing.is_held(_tp(tp)))

    async def on_rebalance_complete(self, sender: Any, **_: Any) -> None:
        # Pause what is not resumed yet; Faust's resume that follows leaves it paused
        # (hold_paused_partitions). Its seek to the group's committed offsets may still land
        # after a Resume's seek: a committed offset is never past the accepted position, so
        # that only makes records be read twice (select drops the repeats).
        claiming = [TP(tp.topic, tp.partition) for tp, st in self.buffers.partitions.items() if not st.active]
        if claiming:
            self.app.consumer.pause_partitions(claiming)
        self.replica.rebalanced.set()
        if self._started:
            await self.hooks.supervise_coordinator()
        else:  # the coordinator needs the catalog: started once the replica is (not in the listener)
            self.tasks.spawn(self._supervise_once_started(self.replica.generation), "coordinator supervision")

    async def _supervise_once_started(self, generation: int) -> None:
        if await self._settled_once_started(generation):  # else a newer rebalance supervises for itself
            await self.hooks.supervise_coordinator()

    async def on_resume(self, ev: Resume) -> None:
        if ev.worker != self.replica.worker_id or ev.generation != self.replica.generation:
            return
        await self.replica.rebalanced.wait()
        if ev.generation != self.replica.generation:
            return
        for pos in ev.positions:
            st = self.buffers.partitions.get(pos.tp)
            if st is None or st.active:
                continue
            # Active from here, but no gap is taken until the seek is done (activated_at).
            seek_to = self.buffers.resume(pos.tp, pos.offset, now=float("inf"))
            self.hooks.settle_voided()
            owned = lambda st=st, g=ev.generation: self.owns(st, g)  # noqa: E731
            if not await unless_moved(self.seek(st, seek_to), owned, f"seek of {pos.tp}"):
                continue
            self.claimed_at.pop(pos.tp, None)
            self.missing.release(pos.tp)  # read on from here: a fetch for a missing table holds it again
            if not self.replica.backpressure:
                self.app.consumer.resume_partitions([TP(pos.tp.topic, pos.tp.partition)])
            log.info("resumed %s at offset %d (generation %d)", pos.tp, seek_to, ev.generation)
        self.hooks.update_paused()
        # Partitions that became active during a round answer it too, so the round does not
        # wait for its timeout after a rebalance.
        self.hooks.answer_open_round()

    def owns(self, st: PartitionState, generation: int) -> bool:
        return generation == self.replica.generation and st.active and self.buffers.partitions.get(st.tp) is st

    async def seek(self, st: PartitionState, offset: int) -> None:
        await self.seek_all([(st, offset)])

    async def seek_all(self, targets: list[tuple[PartitionState, int]]) -> None:
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

    async def on_rewind(self, ev: Rewind) -> None:
        if ev.worker != self.replica.worker_id:
            return
        log.warning("response rejected, rewinding %s: %s", ",".join(map(str, ev.partitions)), ev.reason)
        mine = [tp for tp in ev.partitions if tp in self.buffers.partitions]
        for tp in mine:
            self.buffers.rewind(tp)
        self.hooks.settle_voided()
        if mine:
            self.app.consumer.pause_partitions([TP(t.topic, t.partition) for t in mine])
            await self.send_claim(mine)

    async def reclaim_stale(self, now: float) -> None:
        """Claim again the partitions whose claim got no Resume for CLAIM_RETRY_S (the claim or
        its Resume was lost: a coordinator's failover), once the assignment is settled."""
        stale = [tp for tp, at in self.claimed_at.items() if now - at > CLAIM_RETRY_S
                 and tp in self.buffers.partitions and not self.buffers.partitions[tp].active]
        if stale and self.replica.rebalanced.is_set():
            log.info("no Resume for %s yet; claiming again", ",".join(map(str, stale)))
            await self.send_claim(stale)
