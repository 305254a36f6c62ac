"""What the coordinator's parts share (coordinator/service.py: the control loop;
coordinator/round_commit.py: a round's commit; coordinator/startup.py: recovery at start): one
small object handed to each, not a base class."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from coordinator.state import Checkpoint, CoordinatorState
from icesink.shared.protocol import CommitComplete


@dataclass
class Session:
    """One coordinator's term: its epoch, its state of the control log, its /status."""

    status: dict[str, Any] = field(default_factory=lambda: {"role": "coordinator", "phase": "starting"})
    state: CoordinatorState = field(default_factory=CoordinatorState)
    epoch: int = 0
    log_id: str | None = None  # the control topic's id (None: the broker has none)
    adopted: bool = False  # iceberg.control.adopt-log-id names this log and a table's state another
    # The checkpoint of the last round every table holds (the recovery base at first; a whole-log replay).
    last_cp: Checkpoint = field(default_factory=lambda: Checkpoint(through=-1, positions={}, owners={}, replay_from=0))
    draining: asyncio.Event = field(default_factory=asyncio.Event)  # the replica stops: finish the round in flight, start none
    applied_next: int = 0  # the control offset after the last event the loop applied
    loop_running: bool = False
    round_started_at: float | None = None  # the round's StartCommit, for icesink_round_duration_seconds
    # The CommitComplete this coordinator sent last, and whether it moved no position from the one
    # before (an idle round: the next waits iceberg.control.commit.idle-interval-ms, coordinator/service.py).
    last_complete: CommitComplete | None = None
    idle: bool = False


def first_round_at(now: float, interval_s: float, since_commit_s: float | None, launched_at: float) -> float:
    """When a coordinator that has just recovered starts its first round (``now``: the monotonic
    clock at the end of its recovery): one interval after the group's newest committed snapshot
    (``since_commit_s`` ago), at once if that is past, so a takeover keeps the group's cadence
    instead of adding a whole interval after its recovery (a kill -9 of the coordinator's
    replica already cost the session timeout). When the group never committed (its first
    start), one interval after its process was launched (``launched_at``), at once if that is
    past: the interval a user set counts from the start they see, not from the end of the
    replica's start-up (seconds: imports, the group's join); and one interval from now when
    the snapshot is stamped ahead of this host's clock. Only when a round starts changes: what
    it commits and how is the same (docs/commits.md)."""
    if since_commit_s is None:
        return max(now, launched_at + interval_s)
    if since_commit_s < 0:
        return now + interval_s
    return now + max(0.0, interval_s - since_commit_s)
