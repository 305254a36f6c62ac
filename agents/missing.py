"""Tables a worker's records go to that do not exist and may not be created (no I/O).

Another writer can drop a table while the group runs. The coordinator parks its commits
(coordinator/parking.py); a worker that starts (restarts, takes partitions over) afterwards
cannot load it. Without ``iceberg.tables.auto-create-enabled`` it cannot create it either, and
it knows neither its schema, nor its spec, nor its location: it cannot write its files. The rule
(docs/commits.md, "A table missing when a worker loads it"):

- on a group's first start (it never committed rows: no CommitToTable in its control log, no
  table holding its sink state; rounds that completed before its first record do not count) a
  missing table is refused as before: a typo in ``iceberg.tables`` stops the replica, exit code 2;
- a table of a dynamic route (not in ``iceberg.tables``) that the group never committed to (no
  CommitToTable for it in the control log, nor seen since) is new, not dropped: refused the same
  way, as the first start refuses it, rather than held for ever;
- once the group has committed, a configured table, or a routed one the group committed to, is
  *missing*: the worker waits for it. A partition whose
  fetch holds a record routed to it is held back (paused, that fetch not taken, so its range
  never passes the record and no round reports rows the table lacks); every other partition
  goes on. The table is looked up again with capped backoff (:data:`RETRY_FIRST_S` doubling to
  :data:`RETRY_MAX_S`); when it is back its partitions read on from where they stopped.

:class:`MissingTables` keeps the waiting tables and the partitions held for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from icesink.shared.protocol import TopicPartition

RETRY_FIRST_S = 2.0
RETRY_MAX_S = 30.0
WARN_EVERY_S = 600.0  # a table still missing is logged again this often


@dataclass
class Missing:
    since: float  # wall-clock seconds
    next_at: float  # monotonic: the next look-up
    attempts: int = 0
    warned_at: float = 0.0  # monotonic
    error: str | None = None  # the last look-up's error, if it failed otherwise than "no such table"
    held: set[TopicPartition] = field(default_factory=set)


class MissingTables:
    """The tables a worker waits for, and the partitions each holds back."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.wall = wall
        self.tables: dict[str, Missing] = {}
        self.group_has_run = False  # once seen, for good: the rule above
        self.group_has_committed = False  # ...and committed rows to a table (an empty round is no commit)
        self.committed: set[str] | None = None  # tables of the control log's CommitToTable events, once read
        self.log_complete = False  # ...from its first event (not truncated), in time: the set is the truth
        self.seen_committed: set[str] = set()  # and those read since by the control loop

    def committed_to(self, name: str) -> None:
        """The group committed to ``name`` (a CommitToTable event read by the control loop)."""
        self.seen_committed.add(name)

    def add(self, name: str) -> bool:
        """Wait for ``name``; True if it was not waited for yet."""
        if name in self.tables:
            return False
        now = self.clock()
        self.tables[name] = Missing(self.wall(), now + RETRY_FIRST_S, warned_at=now)
        return True

    def hold(self, tp: TopicPartition, names: Iterable[str]) -> None:
        """``tp`` stops before a record routed to ``names`` (each already :meth:`add`-ed)."""
        for name in names:
            self.tables[name].held.add(tp)

    def is_held(self, tp: TopicPartition) -> bool:
        return any(tp in m.held for m in self.tables.values())

    def release(self, tp: TopicPartition) -> None:
        """``tp`` moved away, or is read again from its Resume: its next fetch decides anew."""
        for m in self.tables.values():
            m.held.discard(tp)

    def due(self) -> list[str]:
        now = self.clock()
        return [name for name, m in self.tables.items() if m.next_at <= now]

    def still_missing(self, name: str, error: str | None = None) -> bool:
        """A look-up found no table (or failed with ``error``): the next one after a capped
        backoff. True when it is time to log it again."""
        m = self.tables[name]
        m.attempts += 1
        m.error = error
        now = self.clock()
        m.next_at = now + min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** m.attempts)
        if now - m.warned_at >= WARN_EVERY_S:
            m.warned_at = now
            return True
        return False

    def found(self, name: str) -> list[TopicPartition]:
        """``name`` exists again: the partitions it held that wait for no other table."""
        m = self.tables.pop(name, None)
        if m is None:
            return []
        return sorted(tp for tp in m.held if not self.is_held(tp))

    def status(self) -> dict[str, Any]:
        """For /status: per table since when, the look-ups, the held partitions, the seconds to
        the next look-up (copies only: read from the HTTP thread)."""
        now = self.clock()
        out: dict[str, Any] = {}
        for name, m in list(self.tables.items()):
            out[name] = {
                "since": m.since, "attempts": m.attempts, "held_partitions": sorted(str(tp) for tp in list(m.held)),
                "next_attempt_in_s": round(max(0.0, m.next_at - now), 1), "error": m.error,
            }
        return out
