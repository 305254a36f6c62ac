"""The control loop of a worker replica: the control topic read in order, each event from the
coordinator's current epoch handed to the part that answers it (Resume and Rewind to partition
ownership, StartCommit to the round responder, agents/rounds.py); on CommitComplete the consumer
group's offsets follow what Iceberg holds."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import faust
from faust.types import TP

from agents.buffer import Buffers
from agents.kafka import commit_offsets
from agents.missing import MissingTables
from agents.parts import Replica
from agents.tasks import EpochGate, TaskOwner
from icesink.shared.control import ControlReader
from icesink.shared.metrics import Metrics
from icesink.shared.protocol import CommitComplete, CommitToTable, Resume, Rewind, StartCommit

log = logging.getLogger(__name__)


class Claims(Protocol):
    """What the control loop hands partition ownership (agents/ownership.py)."""

    async def on_resume(self, ev: Resume) -> None: ...

    async def on_rewind(self, ev: Rewind) -> None: ...


class Responder(Protocol):
    """What answers a round (agents/rounds.py Rounds)."""

    async def respond(self, commit_id: str) -> None: ...


class ControlLoop:
    """Reads the control topic for this replica; events of a coordinator that was replaced are
    ignored (``EpochGate``). ``app``'s consumer group commits the offsets of CommitComplete."""

    def __init__(self, metrics: Metrics, replica: Replica, buffers: Buffers, app: faust.App, missing: MissingTables,
                 tasks: TaskOwner, ownership: Claims, responder: Responder) -> None:
        self.replica = replica
        self.buffers = buffers
        self.app = app
        self.missing = missing
        self.tasks = tasks
        self.ownership = ownership
        self.responder = responder
        self.epochs = EpochGate(metrics)
        self.open_round: str | None = None  # latest StartCommit without its CommitComplete
        self.last_complete: CommitComplete | None = None  # the CommitComplete before (an idle round?)

    async def run(self, reader: ControlReader) -> None:
        while True:
            for offset, ev in await reader.read(1.0):
                await self._on_control(offset, ev)

    def answer_open_round(self) -> None:
        """Partitions became active during a round: answer it for them too."""
        if self.open_round is not None:
            self.tasks.spawn(self.responder.respond(self.open_round), "respond")

    async def _on_control(self, offset: int, ev: Any) -> None:
        if not self.epochs.admit(offset, ev):  # from a coordinator that was replaced
            return
        match ev:
            case Resume():
                self.tasks.spawn(self.ownership.on_resume(ev), "resume")
            case StartCommit():
                self.open_round = ev.commit_id
                self.tasks.spawn(self.responder.respond(ev.commit_id), "respond")
            case CommitComplete():
                if self.open_round == ev.commit_id:
                    self.open_round = None
                self.buffers.committed()  # what rounds took before it is in Iceberg (the age metric)
                # Unknown (the first seen) counts as idle: at worst one early round, never an idle wait with data.
                self.replica.idle = self.last_complete is None or ev.idle_after(self.last_complete)
                self.last_complete = ev
                await self._on_commit_complete(ev)
            case Rewind():
                await self.ownership.on_rewind(ev)
            case CommitToTable():
                self.missing.committed_to(ev.table)  # a table dropped later is waited for (agents/missing.py)
            case _:
                pass

    async def _on_commit_complete(self, ev: CommitComplete) -> None:
        """Data up to these positions is in Iceberg: the consumer group may now say so."""
        offsets = {}
        for p in ev.positions:
            st = self.buffers.partitions.get(p.tp)
            if st is not None and st.active:
                offsets[TP(p.tp.topic, p.tp.partition)] = p.offset
        if offsets:
            try:
                await commit_offsets(self.app, offsets)
            except Exception as exc:  # a hint only; the truth is in the snapshot summaries
                log.warning("consumer group offset commit failed: %s", exc)
        self.replica.status.update(last_commit_id=ev.commit_id, valid_through_ms=ev.valid_through_ms)
