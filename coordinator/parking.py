"""Parked tables: one table's failure is that table's (docs/commits.md, "Parked tables").

A table whose commit keeps failing for ``iceberg.control.commit.park-after-ms`` (a dropped
table, a catalog that refuses it) is parked instead of holding up the round: the round
commits every other table and ends. What the parked table still needs stays pending in the
coordinator (each accepted response cut down to its files for the parked tables), and the
round's ``CommitComplete`` carries the checkpoint of the last round that every table holds
(:attr:`ParkedTables.held`), not the round's own: its positions (the consumer group's hint)
and its replay start never pass the parked table's data, so a new coordinator replays the
held responses and accepts them again, and every other table skips them by its watermark.
A parked table is tried again once a round, with capped backoff; when a commit goes through
(the table is back, e.g. recreated with the same schema and spec), all its held rounds go into
that one snapshot, and once no table is parked the checkpoint moves on again. An error that
says no retry mends it is not parked: it stops the coordinator, as before.

Memory: the held responses keep only the parked tables' files. While a table is parked the
replay of a new coordinator grows with the log since the held checkpoint; recovery cuts each
replayed response down to the tables that lack it (by their watermarks) as it reads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from coordinator.state import Accepted, Checkpoint
from icesink.shared.metrics import Metrics
from icesink.shared.retry import Backoff

log = logging.getLogger(__name__)

RETRY_BASE_S = 2.0  # a parked table's next attempt: after 2 s, doubling
RETRY_CAP_S = 60.0  # to at most a minute


@dataclass
class Parked:
    since: float  # wall clock, when it was parked
    error: str  # the last failure
    backoff: Backoff  # its attempts since it was parked, and when it is tried again (monotonic)


class ParkedTables:
    def __init__(self, metrics: Metrics, status: dict[str, Any]) -> None:
        self._metrics = metrics
        self._status = status
        self._tables: dict[str, Parked] = {}
        # The checkpoint of the last round every table holds, while any table is parked.
        self.held: Checkpoint | None = None

    def __contains__(self, table: object) -> bool:
        return table in self._tables

    def __bool__(self) -> bool:
        return bool(self._tables)

    def names(self) -> set[str]:
        return set(self._tables)

    def due(self, table: str, now: float) -> bool:
        """Whether ``table`` is tried in this round (not parked, or its backoff is over)."""
        p = self._tables.get(table)
        return p is None or p.backoff.retry_at <= now

    def park(self, table: str, error: str, failing_s: float) -> None:
        """Park ``table`` (or count one more failed attempt of a parked one)."""
        p = self._tables.get(table)
        if p is None:
            p = self._tables[table] = Parked(time.time(), error, Backoff(RETRY_BASE_S, RETRY_CAP_S))
            log.error(
                "table %s parked: its commits failed for %.1fs (%s). Its accepted data and the checkpoint are "
                "held for it; every other table keeps committing. It is tried again every round (backoff to "
                "%.0fs) and resumes by itself once it can commit (docs/commits.md, \"Parked tables\")",
                table, failing_s, error, RETRY_CAP_S)
        p.error = error
        p.backoff.next()
        self._metrics.table_parked.labels(table=table).set(1)
        self._metrics.commit_retrying.labels(table=table).set(1)

    def resume(self, table: str) -> None:
        p = self._tables.pop(table, None)
        if p is not None:
            log.warning("table %s resumed after %.0fs parked (%d attempts): its held rounds are committed",
                        table, time.time() - p.since, p.backoff.attempts)
        self._metrics.table_parked.labels(table=table).set(0)

    def stopped(self) -> None:
        """The coordinator stops (leadership moved, the replica stops): its parked tables'
        gauges go back to 0, or the old leader's ``icesink_table_parked`` stays 1 for ever; the
        next coordinator parks them again if their commits still fail."""
        for table in self._tables:
            self._metrics.table_parked.labels(table=table).set(0)
            self._metrics.commit_retrying.labels(table=table).set(0)

    def checkpoint(self, fresh: Checkpoint, last: Checkpoint) -> Checkpoint:
        """What this round's CommitComplete carries: ``fresh`` (the round's own) when no table
        is parked after it; else the checkpoint of the last round every table held (``last``,
        kept from the moment the first table was parked until none is)."""
        if not self._tables:
            self.held = None
            return fresh
        if self.held is None:
            self.held = last
        return self.held

    def show(self, pending: list[Accepted]) -> None:
        """/status ``parked``: per parked table since when, the last error, the attempts, the
        rounds' responses and files it holds, and the seconds until its next attempt."""
        out = {}
        for table, p in sorted(self._tables.items()):
            held = [a for a in pending if a.files.get(table) or a.deleted_keys.get(table)]
            out[table] = {
                "since": p.since, "error": p.error, "attempts": p.backoff.attempts,
                "held_responses": len(held), "held_files": sum(len(a.files.get(table, ())) for a in held),
                "next_try_s": round(p.backoff.wait_s(), 1),
            }
        self._status["parked"] = out
        self._status["checkpoint_held"] = self.held.through if self.held is not None and out else None
