"""Table maintenance by the coordinator, the single writer of its tables: snapshot expiry,
compaction of small files, and orphan files on a schedule (docs/maintenance.md).

Each step is a blocking function run on the coordinator's commit threads, between and beside
rounds, never inside one:

- :func:`expire` (after every round; metadata only when nothing is due) removes the snapshots
  that are neither among the newest ``retain-last`` nor younger than ``max-age`` nor a
  branch or tag head, then deletes the files only they referenced (manifest lists, manifests,
  data and delete files). The sink's exactly-once state lives in a table property written with
  every round's commit (docs/commits.md), so expiry never touches it.
- :func:`plan_compaction` picks, in the current partition spec, a partition with at least
  ``min-input-files`` data files smaller than three quarters of the target size (at most
  ``max-bytes`` of them per step, so one step's time is bounded); :func:`read_files` reads them
  with pyiceberg (schema evolution applied) and the coordinator's Spark writer writes files of
  the target size; :func:`commit_rewrite` commits them as ONE replace snapshot that removes the
  inputs. The rows never change. The commit holds the table's lock, which the rounds' commits
  take too, so a round waits at most for one maintenance metadata commit, never for a rewrite.
  If an input is no longer live (another writer replaced it) the rewrite is dropped and its new
  files deleted: never half-applied. Partitions holding delete files (mirror tables) are left to
  a later step that folds them (not done yet: docs/maintenance.md).
- Orphan files: ``icesink gc``'s rules (:mod:`coordinator.gc`) on their schedule.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.typedef import EMPTY_DICT
from pyiceberg.table.update.snapshot import _OverwriteFiles

from coordinator.gc import normalize
from icesink.config import Settings

log = logging.getLogger(__name__)

#: The snapshot-summary key of maintenance snapshots (the rounds' carry the sink's keys).
MAINTENANCE_KEY = "icesink.maintenance"
_COMMIT_ATTEMPTS = 4

#: Writes an Arrow table (the table's schema) as data files of the table under a fresh prefix.
Writer = Callable[[Table, pa.Table, str], list[DataFile]]


@dataclass(frozen=True)
class MaintenanceSettings:
    enabled: bool = True
    min_input_files: int = 16
    target_file_size_bytes: int = 128 * 1024 * 1024
    max_rewrite_bytes: int = 512 * 1024 * 1024
    snapshot_max_age_ms: int = 24 * 3600 * 1000
    retain_last: int = 10
    orphans_older_than_ms: int = 3 * 24 * 3600 * 1000
    orphans_every_s: float = 24 * 3600.0

    @classmethod
    def of(cls, s: Settings) -> "MaintenanceSettings":
        return cls(
            enabled=s.maintenance_enabled, min_input_files=s.maintenance_min_input_files,
            target_file_size_bytes=s.target_file_size_bytes, max_rewrite_bytes=s.maintenance_max_rewrite_bytes,
            snapshot_max_age_ms=s.maintenance_snapshot_max_age_ms, retain_last=s.maintenance_retain_last,
            orphans_older_than_ms=s.maintenance_orphans_older_than_ms,
            orphans_every_s=s.maintenance_orphans_every_ms / 1000,
        )


@dataclass
class TableLocks:
    """One lock per table, held by every commit of the coordinator to that table."""

    _locks: dict[str, threading.Lock] = field(default_factory=lambda: defaultdict(threading.Lock))
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def of(self, table: str) -> threading.Lock:
        with self._guard:
            return self._locks[table]


# Expiry -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expired:
    snapshots: int
    files_deleted: int


def due_snapshots(table: Table, max_age_ms: int, retain_last: int, now_ms: int) -> list[int]:
    """The snapshot ids expiry removes: not among the newest ``retain_last`` (and at least the
    current one), not younger than ``max_age_ms``, not a branch or tag head."""
    meta = table.metadata
    newest = sorted(meta.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0), reverse=True)
    keep = {s.snapshot_id for s in newest[:max(1, retain_last)]}
    keep |= {ref.snapshot_id for ref in meta.refs.values()}
    if meta.current_snapshot_id is not None:
        keep.add(meta.current_snapshot_id)
    return [s.snapshot_id for s in newest if s.snapshot_id not in keep and now_ms - s.timestamp_ms >= max_age_ms]


def _reachable(table: Table, snapshot_ids: Sequence[int], cache: dict[str, frozenset[str]]) -> set[str]:
    """Manifest lists, manifests, and the data and delete files the given snapshots read."""
    io, out, seen = table.io, set(), set()
    for sid in snapshot_ids:
        snap = table.metadata.snapshot_by_id(sid)
        if snap is None:
            continue
        out.add(normalize(snap.manifest_list))
        for manifest in snap.manifests(io):
            out.add(normalize(manifest.manifest_path))
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            listed = cache.get(manifest.manifest_path)
            if listed is None:
                # live entries only: a DELETED entry names a file its snapshot no longer reads
                listed = frozenset(normalize(e.data_file.file_path)
                                   for e in manifest.fetch_manifest_entry(io, discard_deleted=True))
                cache[manifest.manifest_path] = listed
            out |= listed
    return out


def expire(catalog: Catalog, name: str, s: MaintenanceSettings, lock: threading.Lock,
           cache: dict[str, frozenset[str]], now_ms: int | None = None) -> Expired:
    """Expire what is due and delete the files only expired snapshots referenced."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    table = catalog.load_table(name)
    due = due_snapshots(table, s.snapshot_max_age_ms, s.retain_last, now_ms)
    if not due:
        return Expired(0, 0)  # the common case: metadata only, no manifest read
    before = {sn.snapshot_id for sn in table.metadata.snapshots}
    # Read the manifests outside the lock (the rounds' commits wait on it); under it, only the
    # snapshots committed meanwhile are read, and what they reference is kept.
    gone = _reachable(table, due, cache) - _reachable(table, sorted(before - set(due)), cache)
    with lock:
        table = catalog.load_table(name)
        now_ids = {sn.snapshot_id for sn in table.metadata.snapshots}
        due = [d for d in due_snapshots(table, s.snapshot_max_age_ms, s.retain_last, now_ms) if d in before]
        if not due:
            return Expired(0, 0)
        gone -= _reachable(table, sorted(now_ids - before), cache)
        gone -= _reachable(table, sorted((before - set(due)) & now_ids), cache)  # cached: cheap
        table.maintenance.expire_snapshots().by_ids(due).commit()
    deleted = 0
    for path in sorted(gone):  # after the commit: a failure above deleted nothing
        try:
            table.io.delete(path)
            deleted += 1
        except FileNotFoundError:
            pass
        except OSError as exc:  # left for the orphan sweep; never fatal
            log.warning("%s: could not delete %s after expiry: %s", name, path, exc)
    for manifest in [m for m in cache if normalize(m) in gone]:
        cache.pop(manifest, None)
    log.info("%s: expired %d snapshots, deleted %d files only they referenced", name, len(due), deleted)
    return Expired(len(due), deleted)


# Compaction ---------------------------------------------------------------------------------


def live_files(table: Table) -> list[DataFile]:
    snap = table.current_snapshot()
    if snap is None:
        return []
    return [e.data_file for m in snap.manifests(table.io) for e in m.fetch_manifest_entry(table.io, discard_deleted=True)]


def plan_compaction(table: Table, s: MaintenanceSettings) -> list[DataFile]:
    """The small data files of one partition of the current spec to rewrite (empty: nothing
    is due). The partition with the most small files goes first."""
    small_below = s.target_file_size_bytes * 3 // 4
    spec_id = table.metadata.default_spec_id
    groups: dict[tuple[Any, ...], list[DataFile]] = defaultdict(list)
    has_deletes: set[tuple[Any, ...]] = set()
    for f in live_files(table):
        key = (f.spec_id, tuple(f.partition) if f.partition is not None else ())
        if f.content != DataFileContent.DATA:
            has_deletes.add(key)
        elif f.spec_id == spec_id and f.file_size_in_bytes < small_below:
            groups[key].append(f)
    due = [(len(fs), k) for k, fs in groups.items() if len(fs) >= s.min_input_files and k not in has_deletes]
    if not due:
        return []
    _, key = max(due)
    chosen, total = [], 0
    for f in sorted(groups[key], key=lambda f: f.file_size_in_bytes):
        if chosen and total + f.file_size_in_bytes > s.max_rewrite_bytes:
            break
        chosen.append(f)
        total += f.file_size_in_bytes
    return chosen if len(chosen) >= 2 else []


def read_files(table: Table, files: Sequence[DataFile]) -> pa.Table:
    """The rows of ``files`` in the table's current schema (pyiceberg applies evolution)."""
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    data = scan.to_table([FileScanTask(f) for f in files])
    return data.cast(schema_to_pyarrow(table.schema()))


@dataclass(frozen=True)
class Rewritten:
    files_in: int
    files_out: int
    bytes_in: int
    snapshot_id: int | None  # None: dropped (an input was no longer live)


def compact(catalog: Catalog, name: str, s: MaintenanceSettings, lock: threading.Lock, write: Writer) -> Rewritten | None:
    """One compaction step of table ``name`` (None: nothing due)."""
    table = catalog.load_table(name)
    files = plan_compaction(table, s)
    if not files:
        return None
    data = read_files(table, files)
    prefix = f"compacted-{int(time.time() * 1000)}-{threading.get_ident() % 100000}"
    new = write(table, data, prefix)
    if sum(f.record_count for f in new) != sum(f.record_count for f in files):
        _delete_all(table, new)
        raise RuntimeError(f"{name}: compaction wrote {sum(f.record_count for f in new)} rows for "
                           f"{sum(f.record_count for f in files)}; dropped")
    snapshot_id = commit_rewrite(catalog, name, files, new, lock)
    return Rewritten(len(files), len(new), sum(f.file_size_in_bytes for f in files), snapshot_id)


def commit_rewrite(catalog: Catalog, name: str, old: Sequence[DataFile], new: Sequence[DataFile],
                   lock: threading.Lock) -> int | None:
    """Replace ``old`` by ``new`` in one REPLACE snapshot; retried on a conflict, dropped (the
    new files deleted) when an input is no longer live. Never half-applied."""
    wanted = {normalize(f.file_path) for f in old}
    for attempt in range(1, _COMMIT_ATTEMPTS + 1):
        with lock:
            table = catalog.load_table(name)
            live = {normalize(f.file_path) for f in live_files(table) if f.content == DataFileContent.DATA}
            if not wanted <= live:
                log.warning("%s: compaction dropped, %d of its inputs are no longer live", name, len(wanted - live))
                _delete_all(table, new)
                return None
            try:
                with table.transaction() as tx:
                    update = tx.update_snapshot(snapshot_properties={MAINTENANCE_KEY: "compaction"})
                    rewrite = _Replace(operation=Operation.OVERWRITE, transaction=tx, io=update._io,
                                       branch=update._branch, snapshot_properties=update._snapshot_properties)
                    with rewrite:
                        for f in old:
                            rewrite.delete_data_file(f)
                        for f in new:
                            rewrite.append_data_file(f)
            except CommitFailedException as exc:
                log.info("%s: compaction commit conflicted (attempt %d): %s", name, attempt, exc)
                continue
            snap = table.current_snapshot()
            return snap.snapshot_id if snap else None
    _delete_all(catalog.load_table(name), new)
    raise CommitFailedException(f"{name}: compaction commit conflicted {_COMMIT_ATTEMPTS} times; dropped")


class _Replace(_OverwriteFiles):
    """pyiceberg's overwrite, recorded as what it is: a ``replace`` (same rows, other files).
    pyiceberg 0.12 computes summary totals for overwrites only, so the totals are computed as
    one and the operation then named ``replace``."""

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        summary = super()._summary(snapshot_properties)
        return Summary(Operation.REPLACE, **summary.additional_properties)


def _delete_all(table: Table, files: Sequence[DataFile]) -> None:
    for f in files:
        try:
            table.io.delete(f.file_path)
        except OSError:
            pass


# The schedule ----------------------------------------------------------------------------------


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

    RETRY_BASE_S, RETRY_CAP_S = 1.0, 300.0

    def __init__(self, settings: Settings, catalog: Catalog, metrics: Any, status: dict[str, Any],
                 locks: TableLocks, write: Writer | None, in_flight: Callable[[], Any]) -> None:
        from icesink.offload import Offload

        self.s = MaintenanceSettings.of(settings)
        self.catalog, self.metrics, self.locks, self.write = catalog, metrics, locks, write
        self.in_flight = in_flight  # async () -> set of paths the control log names, not yet committed
        self.report: dict[str, dict[str, Any]] = status.setdefault("maintenance", {})
        self._due: set[str] = set()
        self._retry: dict[str, tuple[int, float]] = {}  # table -> (failed attempts, not before)
        self._orphans_at: dict[str, float] = {}
        self._manifests: dict[str, frozenset[str]] = {}
        self._task: Any = None
        self._offload = Offload(1)  # one step at a time, beside the rounds' threads

    def due(self, tables: Sequence[str]) -> None:
        if not self.s.enabled:
            return
        self._due.update(tables)
        now = time.monotonic()
        for t in tables:
            self._orphans_at.setdefault(t, now + self.s.orphans_every_s)

    def poll(self) -> None:
        import asyncio

        if self._task is not None:
            if not self._task.done():
                return
            task, self._task = self._task, None
            task.result()  # failures are handled per step; anything raised here is a bug: loud
        now = time.monotonic()
        tables = sorted(t for t in self._due if self._retry.get(t, (0, 0.0))[1] <= now)
        sweeps = sorted(t for t, at in self._orphans_at.items() if at <= now)
        if tables or sweeps:
            self._task = asyncio.create_task(self._pass(tables, sweeps), name="maintenance")

    async def stop(self) -> None:
        import asyncio

        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._offload.close()

    async def _pass(self, tables: list[str], sweeps: list[str]) -> None:
        for t in tables:
            self._due.discard(t)
            await self._step(t, "maintain", self._maintain)
        for t in sweeps:
            self._orphans_at[t] = time.monotonic() + self.s.orphans_every_s
            await self._step(t, "orphans", self._sweep)

    async def _step(self, table: str, step: str, fn: Callable[[str], Any]) -> None:
        started = time.monotonic()
        try:
            report = await fn(table)
        except Exception as exc:  # noqa: BLE001 - retried with backoff, surfaced, never fatal
            attempts = self._retry.get(table, (0, 0.0))[0] + 1
            delay = min(self.RETRY_CAP_S, self.RETRY_BASE_S * 2 ** min(attempts, 12))
            self._retry[table] = (attempts, time.monotonic() + delay)
            self._due.add(table)
            self.metrics.maintenance_failures.labels(table=table, step=step).inc()
            self.report[table] = {**self.report.get(table, {}), "error": f"{type(exc).__name__}: {exc}",
                                  "attempt": attempts}
            log.warning("maintenance of %s (%s) failed (attempt %d, %s: %s); retrying in %.0fs", table, step,
                        attempts, type(exc).__name__, exc, delay)
            return
        self._retry.pop(table, None)
        self.metrics.maintenance_duration.labels(table=table).observe(time.monotonic() - started)
        self.metrics.maintenance_last.labels(table=table).set(time.time())
        self.report[table] = {**self.report.get(table, {}), **report, "at": time.time(), "error": None}

    async def _maintain(self, table: str) -> dict[str, Any]:
        run = self._offload.run
        expired = await run(expire, self.catalog, table, self.s, self.locks.of(table), self._manifests)
        self.metrics.maintenance_snapshots_expired.labels(table=table).inc(expired.snapshots)
        self.metrics.maintenance_files_deleted.labels(table=table).inc(expired.files_deleted)
        out: dict[str, Any] = {"expired_snapshots": expired.snapshots, "deleted_files": expired.files_deleted}
        if self.write is not None:
            rewritten = await run(compact, self.catalog, table, self.s, self.locks.of(table), self.write)
            if rewritten is not None and rewritten.snapshot_id is not None:
                self.metrics.maintenance_files_rewritten.labels(table=table).inc(rewritten.files_in)
                self.metrics.maintenance_files_written.labels(table=table).inc(rewritten.files_out)
                self.metrics.maintenance_bytes_rewritten.labels(table=table).inc(rewritten.bytes_in)
                self._due.add(table)  # maybe more small files: the next pass takes another step
                out["compaction"] = {"files_in": rewritten.files_in, "files_out": rewritten.files_out,
                                     "bytes_in": rewritten.bytes_in, "snapshot_id": rewritten.snapshot_id}
                log.info("%s: compacted %d files (%d bytes) into %d, snapshot %s", table, rewritten.files_in,
                         rewritten.bytes_in, rewritten.files_out, rewritten.snapshot_id)
        return out

    async def _sweep(self, table: str) -> dict[str, Any]:
        from coordinator.gc import delete_orphans, find_orphans

        protected = await self.in_flight()
        loaded = await self._offload.run(self.catalog.load_table, table)
        orphans = await self._offload.run(find_orphans, loaded, self.s.orphans_older_than_ms / 1000, protected)
        deleted = await self._offload.run(delete_orphans, loaded, orphans) if orphans else 0
        self.metrics.maintenance_orphans_deleted.labels(table=table).inc(deleted)
        return {"orphans_deleted": deleted}
