"""The maintenance scheduler: runs coordinator/maintenance.py's steps for the coordinator, one
pass at a time, beside its rounds (docs/maintenance.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile

from coordinator.committer import TableCache
from coordinator.gc import InFlight
from coordinator.maintenance import ManifestLists, MaintenanceSettings, Rewriter, TableLocks, compact, expire
from coordinator.mirror import MirrorIndexes
from icesink.shared.config import Settings
from icesink.shared.errors import is_retriable
from icesink.shared.retry import Backoff

log = logging.getLogger(__name__)


class Maintainer:
    """Runs maintenance for the coordinator, one pass at a time, beside its rounds.

    After every round the coordinator marks the round's tables due (:meth:`due`); :meth:`poll`
    (called from the coordinator's loop) starts a pass over the due tables when none runs:
    expiry, then at most one compaction step each (a table whose step rewrote files is due
    again, so a backlog is worked off a step per pass). Orphans are swept per table every
    ``orphans.interval-ms``. A failed step is logged, counted in
    ``icesink_maintenance_failures_total``, shown in ``/status`` and retried after a capped
    backoff; it never stops the coordinator. The owner cancels and awaits the pass (:meth:`stop`).
    """

    RETRY_FIRST_S, RETRY_CAP_S = 2.0, 300.0  # a failed step's backoff: 2 s, doubling to 5 min

    def __init__(self, settings: Settings, catalog: Catalog, metrics: Any, status: dict[str, Any],
                 locks: TableLocks, rewrite: Rewriter | None, in_flight: Callable[[int | None], Awaitable[InFlight]],
                 tables: TableCache | None = None, mirrors: MirrorIndexes | None = None,
                 truncate: Callable[[], Awaitable[dict[str, Any]]] | None = None) -> None:
        from icesink.shared.offload import Offload

        self.s = MaintenanceSettings.of(settings)
        self.catalog, self.metrics, self.locks, self.rewrite = catalog, metrics, locks, rewrite
        # async (the group's replay start in the table, if known) -> the files the control log names
        # after the group's checkpoint: written, maybe accepted, not yet committed (coordinator/gc.py)
        self.in_flight = in_flight
        self.group = settings.group_id
        self.epoch = 0  # the coordinator's, set once it has recovered: the fence of the files it writes
        self.tables = tables  # the rounds' TableCache: a step that commits leaves the table it committed there
        self.mirrors = mirrors  # the rounds' key indexes: moved to a mirror table's compacted files
        self.report: dict[str, dict[str, Any]] = status.setdefault("maintenance", {})
        self.status = status
        # async () -> what it did: deletes the control log's records no group needs (icesink/shared/control.py)
        self.truncate = truncate
        self._truncate_at = time.monotonic() + self.s.control_log_every_s
        self._due: set[str] = set()
        self._retry: dict[str, Backoff] = {}  # table -> its failed attempts in a row, and when it is tried again
        self._orphans_at: dict[str, float] = {}
        self._manifests: dict[str, frozenset[str]] = {}
        self._lists: ManifestLists = {}  # manifest list -> its manifests, for expiry's walks
        self._live: dict[str, dict[str, tuple[DataFile, ...]]] = {}  # per table: manifest -> its live files
        self._task: Any = None
        self._offload = Offload(1)  # one step at a time, beside the rounds' threads

    def due(self, tables: Sequence[str], clear: Sequence[str] = ()) -> None:
        """``tables`` were just committed to. ``clear``: those of them already judged to have
        nothing due, on the table their commit left (coordinator/commit_processes.py): their
        pass is recorded as done without a catalog read; their orphan sweeps are kept."""
        if not self.s.enabled:
            return
        skip = set(clear) - set(self._retry)  # a failed step is retried as planned
        self._due.update(t for t in tables if t not in skip)
        now = time.monotonic()
        for t in tables:
            self._orphans_at.setdefault(t, now + self.s.orphans_every_s)
        for t in skip & set(tables):
            self._passed(t, {"expired_snapshots": 0, "deleted_files": 0})  # as a pass that found nothing due

    def poll(self) -> None:
        import asyncio

        if self._task is not None:
            if not self._task.done():
                return
            task, self._task = self._task, None
            task.result()  # failures are handled per step; anything raised here is a bug: loud
        now = time.monotonic()
        tables = sorted(t for t in self._due if t not in self._retry or self._retry[t].retry_at <= now)
        sweeps = sorted(t for t, at in self._orphans_at.items() if at <= now)
        truncate = (self.s.enabled and self.truncate is not None and self.s.control_log_every_s > 0
                    and now >= self._truncate_at)
        if tables or sweeps or truncate:
            self._task = asyncio.create_task(self._pass(tables, sweeps, truncate), name="maintenance")

    async def stop(self) -> None:
        import asyncio

        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._offload.close()

    async def _pass(self, tables: list[str], sweeps: list[str], truncate: bool = False) -> None:
        for t in tables:
            self._due.discard(t)
            await self._step(t, "maintain", self._maintain)
        for t in sweeps:
            self._orphans_at[t] = time.monotonic() + self.s.orphans_every_s
            await self._step(t, "orphans", self._sweep)
        if truncate and self.truncate is not None:
            self._truncate_at = time.monotonic() + self.s.control_log_every_s
            try:
                self.status["control_log"] = {**await self.truncate(), "at": time.time()}
            except Exception as exc:  # noqa: BLE001 - tried again at the next interval, never fatal
                self.metrics.maintenance_failures.labels(table="", step="control-log").inc()
                self.status["control_log"] = {"error": f"{type(exc).__name__}: {exc}", "at": time.time()}
                log.warning("truncating the control log failed (%s: %s); tried again in %.0f s", type(exc).__name__,
                            exc, self.s.control_log_every_s)

    async def _step(self, table: str, step: str, fn: Callable[[str], Any]) -> None:
        started = time.monotonic()
        try:
            report = await fn(table)
        except Exception as exc:  # noqa: BLE001 - retried with backoff, surfaced, never fatal
            backoff = self._retry.setdefault(table, Backoff(self.RETRY_FIRST_S, self.RETRY_CAP_S))
            # An error no retry mends (a hand-edited sink state, a type no writer has) waits the
            # longest backoff at once: maintenance never stops the coordinator; an operator may.
            delay = backoff.next(longest=not is_retriable(exc))
            attempts = backoff.attempts
            self._due.add(table)
            self.metrics.maintenance_failures.labels(table=table, step=step).inc()
            self.report[table] = {**self.report.get(table, {}), "error": f"{type(exc).__name__}: {exc}",
                                  "attempt": attempts, "retriable": is_retriable(exc)}
            log.warning("maintenance of %s (%s) failed (attempt %d, %s: %s); retrying in %.0fs", table, step,
                        attempts, type(exc).__name__, exc, delay)
            return
        self._retry.pop(table, None)
        self.metrics.maintenance_duration.labels(table=table).observe(time.monotonic() - started)
        self._passed(table, report)

    def _passed(self, table: str, report: dict[str, Any]) -> None:
        """A pass over ``table`` that succeeded: its gauge and its /status entry."""
        self.metrics.maintenance_last.labels(table=table).set(time.time())
        last = {k: v for k, v in self.report.get(table, {}).items() if k not in ("attempt", "retriable")}
        self.report[table] = {**last, **report, "at": time.time(), "error": None}

    async def _maintain(self, table: str) -> dict[str, Any]:
        run = self._offload.run
        # The rounds just committed to this table: most passes find nothing due in that view and
        # read no catalog (a round of 200 tables would otherwise load each table twice).
        seen = self.tables.get(table) if self.tables is not None else None
        # The table its commits leave goes back to that cache, when the rounds keep it there (with
        # commit processes each process keeps its own, and an entry here would only go stale).
        keep = partial(self.tables.put, table) if self.tables is not None and seen is not None else None
        expired = await run(partial(expire, seen=seen, lists=self._lists, keep=keep), self.catalog, table, self.s,
                            self.locks.of(table), self._manifests)
        self.metrics.maintenance_snapshots_expired.labels(table=table).inc(expired.snapshots)
        self.metrics.maintenance_files_deleted.labels(table=table).inc(expired.files_deleted)
        out: dict[str, Any] = {"expired_snapshots": expired.snapshots, "deleted_files": expired.files_deleted}
        if self.rewrite is not None:
            seen = self.tables.get(table) if self.tables is not None else None  # as the expiry left it
            rewritten = await run(partial(compact, seen=seen, fence=(self.group, self.epoch), keep=keep), self.catalog,
                                  table, self.s, self.locks.of(table), self.rewrite, self._live.setdefault(table, {}),
                                  self.mirrors)
            if rewritten is not None and rewritten.snapshot_id is not None:
                self.metrics.maintenance_files_rewritten.labels(table=table).inc(rewritten.files_in)
                self.metrics.maintenance_files_written.labels(table=table).inc(rewritten.files_out)
                self.metrics.maintenance_bytes_rewritten.labels(table=table).inc(rewritten.bytes_in)
                self._due.add(table)  # maybe more small files: the next pass takes another step
                out["compaction"] = {"files_in": rewritten.files_in, "files_out": rewritten.files_out,
                                     "bytes_in": rewritten.bytes_in, "deletes_folded": rewritten.deletes_folded,
                                     "snapshot_id": rewritten.snapshot_id}
                log.info("%s: compacted %d files (%d bytes) into %d, snapshot %s", table, rewritten.files_in,
                         rewritten.bytes_in, rewritten.files_out, rewritten.snapshot_id)
        return out

    async def _sweep(self, table: str) -> dict[str, Any]:
        from coordinator.gc import delete_orphans, find_orphans, remove_empty_dirs, sink_states

        run = self._offload.run
        loaded = await run(self.catalog.load_table, table)
        own = (await run(sink_states, loaded, self.s.branches.of(table))).get(self.group)
        protected = await self.in_flight(own.replay_from if own is not None else None)
        found = await run(find_orphans, loaded, self.s.orphans_older_than_ms / 1000, protected.paths)
        deleted = await run(delete_orphans, loaded, found.orphans) if found.orphans else 0
        if found.empty_dirs:
            await run(remove_empty_dirs, loaded, found.empty_dirs)
        self.metrics.maintenance_orphans_deleted.labels(table=table).inc(deleted)
        self.metrics.maintenance_orphans_held.labels(table=table).set(len(found.held))
        if found.held:
            log.info("%s: kept %d unreferenced files that a round may still commit (e.g. %s: %s)", table,
                     len(found.held), found.held[0].path, found.held[0].reason)
        return {"orphans_deleted": deleted, "orphans_held": len(found.held)}
