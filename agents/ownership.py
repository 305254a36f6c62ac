"""Partition ownership of a worker replica: what a rebalance assigns is claimed from the
coordinator (Claim), consumed only after its Resume (seeking to the accepted position), and
given back on Rewind. A partition moved away keeps no buffers here (docs/commits.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from faust.types import TP

from agents.buffer import PartitionState
from agents.kafka import group_member_id
from agents.tasks import unless_moved
from agents.worker_state import WorkerState
from icesink.protocol import Claim, Resume, Rewind, TopicPartition

log = logging.getLogger(__name__)



def _tp(t: Any) -> TopicPartition:
    return TopicPartition(t.topic, t.partition)


class Ownership(WorkerState):
    """Mixed into :class:`agents.worker.Worker`, whose state it shares."""

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
                self._missing.release(tp)
                self._claimed_at.pop(tp, None)
        for tp in mine:
            self.buffers.claim(tp, self.generation)
        self._settle_voided()  # files written early with a partition gone: void
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

    def _hold_paused_partitions(self) -> None:
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
        return st is not None and (not st.active or self._backpressure or self._missing.is_held(_tp(tp)))

    async def _on_rebalance_complete(self, sender: Any, **_: Any) -> None:
        # Pause what is not resumed yet; Faust's resume that follows leaves it paused
        # (_hold_paused_partitions). Its seek to the group's committed offsets may still land
        # after a Resume's seek: a committed offset is never past the accepted position, so
        # that only makes records be read twice (select drops the repeats).
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
            self._settle_voided()
            owned = lambda st=st, g=ev.generation: self._owns(st, g)  # noqa: E731
            if not await unless_moved(self._seek(st, seek_to), owned, f"seek of {pos.tp}"):
                continue
            self._claimed_at.pop(pos.tp, None)
            self._missing.release(pos.tp)  # read on from here: a fetch for a missing table holds it again
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
        self._settle_voided()
        if mine:
            self.app.consumer.pause_partitions([TP(t.topic, t.partition) for t in mine])
            await self._send_claim(mine)
