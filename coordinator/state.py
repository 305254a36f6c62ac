"""The coordinator's state machine over the control log. Pure: no I/O, no clocks.

Every decision that matters for exactly-once (who owns a partition, which response is
accepted, where each partition's accepted data ends) is a function of the control-topic
events in log order, so a new coordinator that replays the log from the last checkpoint
reaches the same decisions as the one that crashed (docs/commits.md).
"""

from __future__ import annotations

import logging
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import assert_never

from icesink.shared.errors import PreconditionFailed
from icesink.shared.protocol.codec import MAX_EPOCH
from icesink.shared.protocol import (
    AlterPositions,
    Claim,
    CommitComplete,
    CommitRequest,
    CommitToTable,
    DataComplete,
    DataWritten,
    Event,
    FileInfo,
    OffsetRange,
    Owner,
    Position,
    Resume,
    Rewind,
    SchemaProposal,
    StartCommit,
    TopicPartition,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Accepted:
    """A complete, accepted worker response: bound to be committed."""

    offset: int  # control offset of its DataComplete: the per-table watermark unit
    commit_id: str
    worker: str
    ranges: tuple[OffsetRange, ...]
    files: dict[str, tuple[FileInfo, ...]]  # table -> files
    valid_through_ms: int | None
    # mirror tables: table -> keys files (DataWritten.deleted_keys), never part of a snapshot
    deleted_keys: dict[str, tuple[FileInfo, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class TableFile:
    """A data file announced for ``table``: what the coordinator may delete is judged per table."""

    table: str
    file: FileInfo

    @property
    def path(self) -> str:
        return self.file.path


@dataclass(frozen=True)
class Rejected:
    worker: str
    partitions: tuple[TopicPartition, ...]
    reason: str
    files: tuple[TableFile, ...]  # written but never to be committed: orphans to delete


@dataclass
class _Partial:
    first_offset: int
    worker: str
    written: list[DataWritten] = field(default_factory=list)


@dataclass(frozen=True)
class Checkpoint:
    """What a CommitComplete records: state as of control offset ``through``."""

    through: int
    positions: dict[TopicPartition, int]
    owners: dict[TopicPartition, tuple[str, int]]
    replay_from: int
    members: dict[TopicPartition, str] = field(default_factory=dict)  # owner's group member id


def check_range(
    r: OffsetRange,
    worker: str,
    generation: int,
    owners: dict[TopicPartition, tuple[str, int]],
    accepted: dict[TopicPartition, int],
) -> None:
    """Commit precondition for one range: sender owns the partition, and the range starts
    exactly where the accepted data ends (no gap, no overlap)."""
    if not 0 <= r.start <= r.end:  # refused when decoded; checked again so apply never raises
        raise PreconditionFailed(f"range of {r.tp}", "0 <= start <= end", f"[{r.start}, {r.end})")
    owner = owners.get(r.tp)
    if owner != (worker, generation):
        raise PreconditionFailed(f"owner of {r.tp}", owner, (worker, generation))
    if r.tp not in accepted:
        raise PreconditionFailed(f"accepted position of {r.tp}", "a resumed partition", None)
    if r.start != accepted[r.tp]:
        raise PreconditionFailed(f"range start of {r.tp}", accepted[r.tp], r.start)


@dataclass
class CoordinatorState:
    owners: dict[TopicPartition, tuple[str, int]] = field(default_factory=dict)
    accepted: dict[TopicPartition, int] = field(default_factory=dict)
    pending: list[Accepted] = field(default_factory=list)
    partial: dict[str, _Partial] = field(default_factory=dict)
    unanswered: dict[tuple[str, int], Claim] = field(default_factory=dict)
    log_epoch: int = 0  # highest coordinator epoch seen in the log so far
    last_offset: int = -1
    # Round bookkeeping (for closing rounds; not needed for correctness).
    round_id: str | None = None
    round_covered: set[TopicPartition] = field(default_factory=set)
    commit_requested: bool = False
    # Responses that must be rejected, collected for the service to act on.
    rejected: list[Rejected] = field(default_factory=list)
    # Files of responses that can never complete: safe to delete (see _expire_partials).
    orphans: list[TableFile] = field(default_factory=list)
    # Schema evolution: the newest proposal of each worker, per table, until applied.
    proposals: dict[str, dict[str, SchemaProposal]] = field(default_factory=dict)
    # Consumer-group resets (the group deleted and created again: generations restart).
    members: dict[TopicPartition, str] = field(default_factory=dict)  # owner's member id
    seen_members: set[str] = field(default_factory=set)
    max_generation: int = -1
    group_resets: int = 0
    # Per table, the highest watermark a CommitToTable on the log announced (coordinator/round_commit.py
    # announces a table that holds a round without one).
    announced_to: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_checkpoint(cls, cp: CommitComplete) -> CoordinatorState:
        return cls(
            owners={o.tp: (o.worker, o.generation) for o in cp.owners},
            members={o.tp: o.member for o in cp.owners if o.member},
            seen_members={o.member for o in cp.owners if o.member},
            max_generation=max((o.generation for o in cp.owners), default=-1),
            accepted={p.tp: p.offset for p in cp.positions},
            log_epoch=cp.epoch,
            last_offset=cp.through,
        )

    # Applying events ---------------------------------------------------------------------

    def apply(self, offset: int, event: Event, *, checkpoint_through: int = -1) -> None:
        """Apply one control event read at ``offset``. Events at or below
        ``checkpoint_through`` are already reflected in the state: their DataWritten are
        collected, so responses spanning the checkpoint stay complete, and their DataComplete
        closes its response as decided (accepted and committed, or rejected), never left open
        to be expired later: its files may be in a table."""
        if offset <= checkpoint_through:
            if isinstance(event, DataWritten):
                self._collect(offset, event)
            elif isinstance(event, DataComplete):
                self.partial.pop(event.response_id, None)
            return
        self.last_offset = offset
        match event:
            case Claim():
                self._detect_group_reset(event)
                # The newest claim wins; a claim of an older generation is stale.
                for tp in event.partitions:
                    cur = self.owners.get(tp)
                    if cur is None or cur[1] <= event.generation:
                        self.owners[tp] = (event.worker, event.generation)
                        if event.member:
                            self.members[tp] = event.member
                        else:
                            self.members.pop(tp, None)
                self.unanswered[(event.worker, event.generation)] = event
                self._expire_partials()
            case Resume():
                if event.epoch < self.log_epoch:
                    return  # a stale coordinator's answer
                self.log_epoch = event.epoch
                self.unanswered.pop((event.worker, event.generation), None)
                for p in event.positions:
                    # First resolution of a partition's start fixes it; later resumes repeat it.
                    self.accepted.setdefault(p.tp, p.offset)
            case StartCommit():
                if event.epoch < self.log_epoch:
                    return
                self.log_epoch = event.epoch
                self.round_id = event.commit_id
                self.round_covered = set()
                self.commit_requested = False
            case DataWritten():
                self._collect(offset, event)
            case DataComplete():
                self._complete(offset, event)
            case CommitToTable() | CommitComplete() | Rewind():
                if event.epoch > self.log_epoch:
                    self.log_epoch = event.epoch
                if isinstance(event, CommitToTable):
                    self.announced(event.table, event.watermark)
            case CommitRequest():
                self.commit_requested = True
            case SchemaProposal():
                self.proposals.setdefault(event.table, {})[event.worker] = event
            case AlterPositions():
                self._alter(event)
            case _:
                assert_never(event)

    def _alter(self, event: AlterPositions) -> None:
        """An operator's new positions: each partition is read from its new offset once claimed
        again. Its owner is void (a response of the owner before, whose range started at the old
        position, is rejected, and its open partials expire); responses accepted before stay
        pending and bound to be committed: the new position only says where reading goes on."""
        for p in event.positions:
            self.accepted[p.tp] = p.offset
            self.owners.pop(p.tp, None)
            self.members.pop(p.tp, None)
            self.round_covered.discard(p.tp)
        log.warning("positions altered (%s): %s", event.reason, ", ".join(f"{p.tp}@{p.offset}" for p in event.positions))
        self._expire_partials()

    def _detect_group_reset(self, claim: Claim) -> None:
        """Generations only grow within one consumer group, and a member that joins gets a
        generation above every earlier one. So a member id never seen before with a generation
        below the newest seen means the group was deleted and created again: every ownership of
        the old group is void (generation -1), so the new group's claims take their partitions.
        A stale claim of a known member (a zombie) is not a reset and stays ignored."""
        if claim.member and claim.member not in self.seen_members and claim.generation < self.max_generation:
            self.owners = {tp: (w, -1) for tp, (w, _) in self.owners.items()}
            self.max_generation = -1
            self.group_resets += 1
        if claim.member:
            self.seen_members.add(claim.member)
        self.max_generation = max(self.max_generation, claim.generation)

    def _collect(self, offset: int, event: DataWritten) -> None:
        part = self.partial.setdefault(event.response_id, _Partial(offset, event.worker))
        part.written.append(event)

    def _complete(self, offset: int, event: DataComplete) -> None:
        part = self.partial.pop(event.response_id, None)
        self._expire_partials(completed_by=event.worker, before=offset)
        written = part.written if part else []
        files = tuple(TableFile(w.table, f) for w in written for f in (*w.files, *w.deleted_keys))
        if len(written) != event.events_sent:
            self.rejected.append(Rejected(
                event.worker, tuple(r.tp for r in event.ranges),
                f"incomplete response: expected {event.events_sent} DataWritten, found {len(written)}",
                files))
            return
        try:
            for r in event.ranges:
                check_range(r, event.worker, event.generation, self.owners, self.accepted)
        except PreconditionFailed as exc:
            self.rejected.append(Rejected(
                event.worker, tuple(r.tp for r in event.ranges), str(exc), files))
            return
        for r in event.ranges:
            self.accepted[r.tp] = r.end
            if event.commit_id == self.round_id:
                self.round_covered.add(r.tp)
        by_table: dict[str, tuple[FileInfo, ...]] = {}
        keys: dict[str, tuple[FileInfo, ...]] = {}
        for w in written:
            by_table[w.table] = by_table.get(w.table, ()) + w.files
            if w.deleted_keys:
                keys[w.table] = keys.get(w.table, ()) + w.deleted_keys
        self.pending.append(Accepted(
            offset, event.commit_id, event.worker, event.ranges, by_table, event.valid_through_ms, keys))

    def _expire_partials(self, completed_by: str | None = None, before: int = -1) -> None:
        """Drop responses that can never be accepted, and hand their files to deletion:
        - a later response of the same worker completed (a worker answers one round at a
          time, so an earlier response still open was abandoned: its sender failed mid-way);
        - its worker owns no partition any more (a completion now would fail the owner check).
        A dropped response that completes after all is rejected as incomplete (no files).
        Both facts only grow with the log, so replay reaches the same decisions."""
        owning = {w for w, _ in self.owners.values()}
        for rid, part in list(self.partial.items()):
            later = part.worker == completed_by and part.first_offset < before
            if later or (self.owners and part.worker not in owning):
                del self.partial[rid]
                self.orphans.extend(TableFile(w.table, f) for w in part.written for f in (*w.files, *w.deleted_keys))

    def take_orphans(self) -> list[TableFile]:
        out, self.orphans = self.orphans, []
        return out

    # Queries -----------------------------------------------------------------------------

    def round_answered(self) -> bool:
        """Every owned partition has answered the current round."""
        return bool(self.owners) and set(self.owners) <= self.round_covered

    def committed(self, batch: list[Accepted], held: AbstractSet[str] = frozenset()) -> None:
        """Every table holds ``batch`` and its CommitComplete is sent: no longer pending,
        except what the ``held`` (parked) tables lack: each response naming one of them stays,
        cut down to their files (coordinator/parking.py)."""
        done = {id(a) for a in batch}
        out: list[Accepted] = []
        for a in self.pending:
            if id(a) not in done:
                out.append(a)
            elif cut := _only(a, held):
                out.append(cut)
        self.pending = out

    def lacking(self, watermarks: dict[str, int]) -> None:
        """Cut each pending response down to the tables that lack it: a table whose watermark
        is at or past its offset holds it (recovery, while it replays a parked table's rounds)."""
        out: list[Accepted] = []
        for a in self.pending:
            # (a mirror table's keys files stay: the round that rolls forward deletes them)
            cut = _only(a, {t for t in a.files if watermarks.get(t, -1) < a.offset} | set(a.deleted_keys))
            if cut is not None or not any((*a.files.values(), *a.deleted_keys.values())):
                out.append(cut or a)
        self.pending = out

    def announced(self, table: str, watermark: int) -> None:
        """A CommitToTable for ``table`` up to ``watermark`` is on the log (or being sent)."""
        self.announced_to[table] = max(self.announced_to.get(table, -1), watermark)

    def announced_through(self, table: str) -> int:
        return self.announced_to.get(table, -1)

    def plan_commit(self) -> tuple[list[Accepted], Checkpoint]:
        """Every accepted response, with the checkpoint a commit of them establishes. They stay
        pending until :meth:`committed`: a failure half-way (catalog, control send) must not
        drop them, or a later checkpoint would move positions past data a table lacks."""
        batch = list(self.pending)
        replay_from = min(
            [p.first_offset for p in self.partial.values()] + [self.last_offset + 1]
        )
        return batch, Checkpoint(
            through=self.last_offset,
            positions=dict(self.accepted),
            owners=dict(self.owners),
            replay_from=replay_from,
            members=dict(self.members),
        )

    def resume_positions(self, claim: Claim) -> tuple[list[Position], list[TopicPartition]]:
        """Known positions for a claim, and the partitions whose start must be resolved."""
        known = [Position(tp, self.accepted[tp]) for tp in claim.partitions if tp in self.accepted]
        unknown = [tp for tp in claim.partitions if tp not in self.accepted]
        return known, unknown

    def take_proposals(self) -> dict[str, list[SchemaProposal]]:
        """Pending schema proposals per table, in log order of their workers' newest."""
        out = {table: list(by_worker.values()) for table, by_worker in self.proposals.items()}
        self.proposals = {}
        return out

    def return_proposals(self, table: str, proposals: list[SchemaProposal]) -> None:
        """Proposals not applied (the update failed): pending again, before newer ones (log order);
        a worker's newer proposal replaces its returned one."""
        newer = self.proposals.get(table, {})
        self.proposals[table] = {p.worker: p for p in proposals if p.worker not in newer} | newer

    def take_rejected(self) -> list[Rejected]:
        out, self.rejected = self.rejected, []
        return out


def _only(a: Accepted, keep: AbstractSet[str]) -> Accepted | None:
    """``a`` with the files of the tables in ``keep`` (``a`` itself if that is all of them);
    None if none is left."""
    files = {t: fs for t, fs in a.files.items() if t in keep}
    keys = {t: fs for t, fs in a.deleted_keys.items() if t in keep}
    if not any(files.values()) and not any(keys.values()):
        return None
    if len(files) == len(a.files) and len(keys) == len(a.deleted_keys):
        return a
    return replace(a, files=files, deleted_keys=keys)


def next_epoch(epochs: list[int]) -> int:
    """A recovering coordinator's epoch: one above every epoch seen (the log's, the tables'), so
    it fences the coordinators before it, but never above MAX_EPOCH, the highest any reader
    accepts: an epoch at it (only a forged or buggy event can get there) would otherwise leave
    the next coordinator's events unreadable and stop the group for good. At the cap the next
    coordinator shares the epoch, and fencing by epoch is lost: said once, loudly."""
    top = max(epochs)
    if top >= MAX_EPOCH:
        log.error("coordinator epoch %d reached its maximum %d (a buggy or forged control event, or a table's "
                  "sink state, holds it): the epoch stays there and the group goes on, but coordinators no longer "
                  "fence each other by epoch", top, MAX_EPOCH)
        return MAX_EPOCH
    return top + 1


def checkpoint_event(
    epoch: int, commit_id: str, cp: Checkpoint, valid_through_ms: int | None
) -> CommitComplete:
    return CommitComplete(
        epoch=epoch,
        commit_id=commit_id,
        through=cp.through,
        positions=tuple(Position(tp, off) for tp, off in sorted(cp.positions.items())),
        owners=tuple(Owner(tp, w, g, cp.members.get(tp)) for tp, (w, g) in sorted(cp.owners.items())),
        valid_through_ms=valid_through_ms,
        replay_from=cp.replay_from,
    )
