"""Fences in file names: what lets an orphan sweep prove that no round can still commit a file
(docs/commits.md, "Orphan files and icesink gc"). Leaf module: names and a verdict, no I/O.

Every data file a sink writes lies under a directory (or has a name) that says who may still
commit it and what ends that:

- a worker's files (written early or in a round, and a mirror table's keys files) start with
  ``iskw-<group>-<topic>-<partition>-<offset>-``: the group, and one source partition with the
  offset its response's range for that partition starts at (or below). A response naming the
  file covers that partition from that offset or earlier, and the coordinator accepts it only
  if its range starts exactly at the partition's accepted position. Once the group's position
  of that partition in the table has passed the offset, every response that could name the
  file was either committed with it (the table holds it) or can never be accepted.
- a coordinator's files (a compaction's output, a mirror table's position deletes) start with
  ``iskc-<group>-<epoch>-``: once a commit of a later coordinator epoch of the group is in the
  table, the coordinator that wrote them is fenced (its commit conflicts and finds the newer
  epoch), so they can never be committed.

Group and topic appear as the first 12 hex digits of their SHA-256 (names may hold any
character; a path must not), matched against the groups whose sink state the table holds.
A file whose group has no state in the table, or no position for the partition, is kept.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from icesink.shared.protocol.events import OffsetRange, TopicPartition
from icesink.shared.protocol.summary import SinkState

WORKER, COORDINATOR = "iskw", "iskc"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_WORKER_RE = re.compile(rf"^{WORKER}-([0-9a-f]{{12}})-([0-9a-f]{{12}})-(\d+)-(\d+)-{_NAME}$")
_COORDINATOR_RE = re.compile(rf"^{COORDINATOR}-([0-9a-f]{{12}})-(\d+)-{_NAME}$")


def tag(text: str) -> str:
    """A group or topic name as it appears in a file name."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def worker_prefix(group: str, tp: TopicPartition, start: int, name: str) -> str:
    return f"{WORKER}-{tag(group)}-{tag(tp.topic)}-{tp.partition}-{start}-{name}"


def worker_files_prefix(group: str, ranges: Sequence[OffsetRange], name: str) -> str:
    """The prefix of the files a worker writes for ``ranges`` (a response's or an early
    write's): fenced by the first partition with data. ``name`` alone when none has data (then
    no data file is written)."""
    r = next((r for r in ranges if r.end > r.start), None)
    return name if r is None else worker_prefix(group, r.tp, r.start, name)


def coordinator_prefix(group: str, epoch: int, name: str) -> str:
    return f"{COORDINATOR}-{tag(group)}-{epoch}-{name}"


@dataclass(frozen=True)
class Fence:
    """What a file's name says: written by a worker of group ``group`` (tags) for a response
    covering ``partition`` of ``topic`` from ``start`` or below, or by the group's coordinator
    of ``epoch``."""

    group: str
    topic: str | None = None
    partition: int | None = None
    start: int | None = None
    epoch: int | None = None


def fence_of(relative: str) -> Fence | None:
    """The fence of a file from its path relative to the table's data directory (the first
    segment that is a fenced name), None for a file without one (another tool's, or written by
    a version before fences)."""
    for segment in relative.split("/"):
        if m := _WORKER_RE.match(segment):
            return Fence(m.group(1), topic=m.group(2), partition=int(m.group(3)), start=int(m.group(4)))
        if m := _COORDINATOR_RE.match(segment):
            return Fence(m.group(1), epoch=int(m.group(2)))
    return None


@dataclass(frozen=True)
class Verdict:
    dead: bool  # no round of its group can commit it any more
    reason: str


def judge(fence: Fence, states: Mapping[str, SinkState], retired: Collection[str] = ()) -> Verdict:
    """Whether a file (not referenced by any snapshot) can never be committed, from the sink
    states of the groups the table holds (``group -> state``). ``retired``: groups the operator
    says run nowhere any more (their files are dead)."""
    if any(tag(g) == fence.group for g in retired):
        return Verdict(True, "its group is retired (--retired-group)")
    group = next((g for g in states if tag(g) == fence.group), None)
    if group is None:
        return Verdict(False, f"written by group {fence.group} (tag), which has no state in this table yet")
    st = states[group]
    if fence.epoch is not None:
        if st.epoch > fence.epoch:
            return Verdict(True, f"written by coordinator epoch {fence.epoch} of group {group}; "
                                 f"the table holds epoch {st.epoch}")
        return Verdict(False, f"written by coordinator epoch {fence.epoch} of group {group}, not yet fenced")
    tp = next((tp for tp in st.positions if tp.partition == fence.partition and tag(tp.topic) == fence.topic), None)
    assert fence.start is not None
    if tp is None:
        return Verdict(False, f"group {group} has no position of its partition in this table yet")
    position = st.positions[tp]
    if position > fence.start:
        return Verdict(True, f"group {group}'s position of {tp.topic}[{tp.partition}] in the table is {position}, "
                             f"past {fence.start} where its response began")
    return Verdict(False, f"group {group}'s position of {tp.topic}[{tp.partition}] is {position}, not past "
                          f"{fence.start}: a round may still commit it")
