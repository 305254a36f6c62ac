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
  ``max-bytes`` of them per step, so one step's time is bounded); delete files (a mirror
  table's) count toward ``min-input-files``, and a partition holding them is rewritten whole with
  the deletes applied, the delete files going with it; the hosting replica's Spark session
  reads them (by field id, so schema evolution applies; the deletes anti-joined) and writes
  files of the target size (spark_bridge/rewrite.py); :func:`commit_rewrite` commits them as ONE replace snapshot that removes the
  inputs. The rows never change. The commit holds the table's lock, which the rounds' commits
  take too, so a round waits at most for one maintenance metadata commit, never for a rewrite.
  If an input is no longer live (another writer replaced it), or the partition gained delete
  files meanwhile, the rewrite is dropped and its new files deleted: never half-applied. A
  mirror table's key index moves to the new files in place, under the lock (the same keys at
  new positions), so the next round does not rebuild it.
- Orphan files: ``icesink gc``'s rules (:mod:`coordinator.gc`) on their schedule.

The scheduler that runs these steps for the coordinator is :mod:`coordinator.maintainer`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.update.snapshot import ExpireSnapshots

from coordinator.gc import normalize, prune_write_dirs
from coordinator.iceberg_ext import MemoTransaction, Replace, check_before_retry
from coordinator.key_index import read_keys
from coordinator.mirror import MirrorIndexes
from icesink.shared.catalogs import manifests_of
from icesink.shared.config import MAIN_BRANCH, CommitBranches, Settings
from icesink.shared.errors import FencedError
from icesink.shared.iceberg import branch_head, latest_sink_summary
from icesink.shared.protocol.fences import coordinator_prefix

log = logging.getLogger(__name__)

#: The snapshot-summary key of maintenance snapshots (the rounds' carry the sink's keys).
MAINTENANCE_KEY = "icesink.maintenance"
_COMMIT_ATTEMPTS = 4

#: Rewrites the live rows of data files (position delete files applied) as new data files of the
#: table under a fresh prefix (spark_bridge/rewrite.py: the hosting replica's Spark session).
Rewriter = Callable[[Table, Sequence[DataFile], Sequence[DataFile], str], list[DataFile]]


@dataclass(frozen=True)
class MaintenanceSettings:
    enabled: bool = True
    min_input_files: int = 16
    min_delete_files: int = 1
    target_file_size_bytes: int = 128 * 1024 * 1024
    max_rewrite_bytes: int = 512 * 1024 * 1024
    snapshot_max_age_ms: int = 10 * 60 * 1000
    retain_last: int = 10
    orphans_older_than_ms: int = 3 * 24 * 3600 * 1000
    orphans_every_s: float = 24 * 3600.0
    control_log_every_s: float = 600.0  # 0: the control log is never truncated
    # The branch of each table compaction rewrites: the one its rounds commit to (docs/commits.md "Branches").
    branches: CommitBranches = field(default_factory=CommitBranches)

    @classmethod
    def of(cls, s: Settings) -> MaintenanceSettings:
        return cls(
            enabled=s.maintenance_enabled, min_input_files=s.maintenance_min_input_files,
            min_delete_files=s.maintenance_min_delete_files,
            target_file_size_bytes=s.target_file_size_bytes, max_rewrite_bytes=s.maintenance_max_rewrite_bytes,
            snapshot_max_age_ms=s.maintenance_snapshot_max_age_ms, retain_last=s.maintenance_retain_last,
            orphans_older_than_ms=s.maintenance_orphans_older_than_ms,
            orphans_every_s=s.maintenance_orphans_every_ms / 1000,
            control_log_every_s=s.maintenance_control_log_every_ms / 1000,
            branches=s.commit_branches,
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


def expiry_due(table: Table, s: MaintenanceSettings, now_ms: int) -> list[int]:
    """The snapshots an expiry pass removes now: :func:`due_snapshots`, once they are at least
    a tenth as many as the snapshots kept (and at least one). A table whose oldest snapshot ages
    out every round is so expired once every tenth of its history, in one metadata commit, not
    in a commit per round (each rewrites the whole metadata file): it holds between the
    snapshots its settings keep and a tenth more."""
    due = due_snapshots(table, s.snapshot_max_age_ms, s.retain_last, now_ms)
    kept = len(table.metadata.snapshots) - len(due)
    return due if due and len(due) >= max(1, kept // 10) else []


#: Manifest list path -> its manifests; a manifest list never changes once written.
ManifestLists = dict[str, tuple[ManifestFile, ...]]


def _reachable(table: Table, snapshot_ids: Sequence[int], cache: dict[str, frozenset[str]],
               lists: ManifestLists) -> set[str]:
    """Manifest lists, manifests, and the data and delete files the given snapshots read.
    ``cache`` (manifest -> its live files) and ``lists`` are kept by the caller: a walk over the
    retained snapshots reads only what it has not read before."""
    io, out, seen = table.io, set(), set()
    by_id = {sn.snapshot_id: sn for sn in table.metadata.snapshots}
    for sid in snapshot_ids:
        snap = by_id.get(sid)
        if snap is None:
            continue
        out.add(normalize(snap.manifest_list))
        # Not through manifests_of: expiry walks every retained snapshot, which would push the
        # current lists of the other tables out of its cache (the rounds' hot path).
        manifests = lists.get(snap.manifest_list)
        if manifests is None:
            manifests = lists[snap.manifest_list] = tuple(snap.manifests(io))
        for manifest in manifests:
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
           cache: dict[str, frozenset[str]], now_ms: int | None = None, *, seen: Table | None = None,
           lists: ManifestLists | None = None, keep: Callable[[Table], Any] | None = None) -> Expired:
    """Expire what is due (:func:`expiry_due`) and delete the files only expired snapshots
    referenced. The table's lock is held for the commit alone (load, re-check, commit): a
    round's commit never waits behind a walk of the history. The manifests are read outside
    it: before the commit, what the due snapshots read; after it, what every snapshot left
    reads. A snapshot committed later than that view reads files its parent reads (this
    view's current snapshot, or a later one) and files written for it, never one only an
    expired snapshot read. ``seen``: the table as the rounds' last commit left it
    (:class:`TableCache`); when nothing is due there, the catalog is not asked (a stale view
    only delays an expiry to a later pass), and when something is, the manifests are read in
    that view (the commit's view under the lock is loaded). ``lists``: manifest lists already
    read, kept by the caller (see :func:`_reachable`). ``keep(table)``: called under the lock
    with the table as the expiry's commit left it (the rounds' cache keeps it: a history of
    hundreds of snapshots is not parsed again by the next round)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    lists = {} if lists is None else lists
    table = seen if seen is not None else catalog.load_table(name)
    due = expiry_due(table, s, now_ms)
    if not due:
        return Expired(0, 0)  # the common case: no manifest read (with ``seen``, no catalog read either)
    read = _reachable(table, due, cache, lists)
    with lock:  # the commit alone
        table = catalog.load_table(name)
        still = set(due_snapshots(table, s.snapshot_max_age_ms, s.retain_last, now_ms))
        due = [d for d in due if d in still]
        if not due:
            return Expired(0, 0)
        # A transaction that stages its metadata once: pyiceberg's deep-copies it at every
        # read, twice per expired snapshot (seconds under the lock at thousands of snapshots).
        ExpireSnapshots(MemoTransaction(table, autocommit=True)).by_ids(due).commit()
        if keep is not None:
            keep(table)  # pyiceberg updated it with the committed metadata
    gone = read - _reachable(table, [sn.snapshot_id for sn in table.metadata.snapshots], cache, lists)
    deleted = 0
    for path in sorted(gone):  # after the commit: a failure above deleted nothing
        try:
            table.io.delete(path)
            deleted += 1
        except FileNotFoundError:
            pass
        except OSError as exc:  # left for the orphan sweep; never fatal
            log.warning("%s: could not delete %s after expiry: %s", name, path, exc)
    prune_write_dirs(table.location(), gone)  # each round's write directories, emptied
    for manifest in [m for m in cache if normalize(m) in gone]:
        cache.pop(manifest, None)
    for listed in [m for m in lists if normalize(m) in gone]:
        lists.pop(listed, None)
    log.info("%s: expired %d snapshots, deleted %d files only they referenced", name, len(due), deleted)
    return Expired(len(due), deleted)


# Compaction ---------------------------------------------------------------------------------


def live_files(table: Table, cache: dict[str, tuple[DataFile, ...]] | None = None,
               manifests: Sequence[ManifestFile] | None = None, branch: str = MAIN_BRANCH) -> list[DataFile]:
    """The data and delete files of the head of ``branch``. ``cache`` (manifest path -> its live
    files, for one table) saves reading manifests again: they never change once written; it
    is pruned to that snapshot's manifests."""
    snap = branch_head(table, branch)
    if snap is None:
        return []
    manifests = manifests_of(snap, table.io) if manifests is None else manifests
    out: list[DataFile] = []
    fresh: dict[str, tuple[DataFile, ...]] = {}
    for m in manifests:
        entries = cache.get(m.manifest_path) if cache is not None else None
        if entries is None:
            entries = tuple(e.data_file for e in m.fetch_manifest_entry(table.io, discard_deleted=True))
        fresh[m.manifest_path] = entries
        out.extend(entries)
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return out


@dataclass(frozen=True)
class Plan:
    """One compaction step: data files to rewrite, and the position delete files folded into
    the rewrite (all of the partition's; they reference only its data files)."""

    data: list[DataFile]
    deletes: list[DataFile]
    partition: tuple[Any, ...]


def _partition_key(f: DataFile) -> tuple[Any, ...]:
    part = f.partition
    return (f.spec_id, tuple(part[i] for i in range(len(part))) if part is not None else ())


_TOLD: set[tuple[str, tuple[Any, ...]]] = set()  # partitions too big to fold, logged once
_AVRO_TOLD: set[str] = set()  # tables whose Avro data files are left alone, logged once


def compactable(name: str, files: Iterable[DataFile]) -> list[DataFile]:
    """``files`` but Avro data files, which compaction leaves alone (logged once per table):
    pyiceberg, which reads what Spark cannot rewrite by field id, scans no Avro data files."""
    files = list(files)
    out = [f for f in files if f.file_format != FileFormat.AVRO]
    if len(out) < len(files) and name not in _AVRO_TOLD:
        _AVRO_TOLD.add(name)
        log.info("%s: compaction leaves its Avro data files alone (write.format.default=avro): pyiceberg, which "
                 "compaction reads Spark-written Avro files with, scans no Avro data files", name)
    return out


def plan_compaction(table: Table, s: MaintenanceSettings,
                    cache: dict[str, tuple[DataFile, ...]] | None = None, branch: str = MAIN_BRANCH) -> Plan | None:
    """One partition of the current spec to compact (None: nothing is due). A partition is due
    once it holds ``min-input-files`` small data files, or ``min-delete-files`` delete files
    (default 1: any). With delete files, ALL its data files are rewritten with the deletes
    applied and the delete files go (skipped, logged once, when its data exceeds ``max-bytes``:
    the step would not be bounded); without, its smallest small files up to ``max-bytes``. The
    partition with the most small and delete files goes first. ``cache``: :func:`live_files`'s,
    for this table. ``branch``: the branch the sink commits the table to (its head is compacted)."""
    snap = branch_head(table, branch)
    if snap is None:
        return None
    manifests = manifests_of(snap, table.io)
    if _too_few(manifests, s):
        return None  # the manifest list says no partition can be due: no manifest read
    small_below = s.target_file_size_bytes * 3 // 4
    spec_id = table.metadata.default_spec_id
    data: dict[tuple[Any, ...], list[DataFile]] = defaultdict(list)
    deletes: dict[tuple[Any, ...], list[DataFile]] = defaultdict(list)
    for f in compactable(".".join(table.name()), live_files(table, cache, manifests, branch)):
        if f.spec_id == spec_id:
            (data if f.content == DataFileContent.DATA else deletes)[_partition_key(f)].append(f)
    due = []
    for key in set(data) | set(deletes):
        small = [f for f in data.get(key, ()) if f.file_size_in_bytes < small_below]
        count = len(small) + len(deletes.get(key, ()))
        if len(small) < s.min_input_files and len(deletes.get(key, ())) < s.min_delete_files:
            continue
        if deletes.get(key):
            size = sum(f.file_size_in_bytes for f in data.get(key, ()))
            if size > s.max_rewrite_bytes:
                name = ".".join(table.name())
                if (name, key) not in _TOLD:
                    _TOLD.add((name, key))
                    log.warning("%s: partition %s holds %d delete files but %d bytes of data, over maintenance."
                                "compaction.max-bytes: not folded", name, key[1], len(deletes[key]), size)
                continue
            due.append((count, key, Plan(list(data.get(key, [])), list(deletes[key]), key)))
            continue
        chosen: list[DataFile] = []
        total = 0
        for f in sorted(small, key=lambda f: f.file_size_in_bytes):
            if chosen and total + f.file_size_in_bytes > s.max_rewrite_bytes:
                break
            chosen.append(f)
            total += f.file_size_in_bytes
        if len(chosen) >= 2:
            due.append((count, key, Plan(chosen, [], key)))
    if not due:
        return None
    return max(due, key=lambda d: (d[0], d[1]))[2]


def _too_few(manifests: Sequence[ManifestFile], s: MaintenanceSettings) -> bool:
    """Whether the manifest list's counts rule out a due partition: fewer live data files than
    ``min-input-files`` and fewer live delete files than ``min-delete-files`` in the whole table
    (False when a manifest has no counts)."""
    live = {ManifestContent.DATA: 0, ManifestContent.DELETES: 0}
    for m in manifests:
        if m.added_files_count is None or m.existing_files_count is None:
            return False
        live[m.content] += m.added_files_count + m.existing_files_count
    return live[ManifestContent.DATA] < s.min_input_files and live[ManifestContent.DELETES] < s.min_delete_files


@dataclass(frozen=True)
class Rewritten:
    files_in: int
    files_out: int
    bytes_in: int
    snapshot_id: int | None  # None: dropped (an input was no longer live)
    deletes_folded: int = 0


def compact(catalog: Catalog, name: str, s: MaintenanceSettings, lock: threading.Lock, rewrite: Rewriter,
            cache: dict[str, tuple[DataFile, ...]] | None = None, mirrors: MirrorIndexes | None = None,
            *, seen: Table | None = None, fence: tuple[str, int] | None = None,
            keep: Callable[[Table], Any] | None = None) -> Rewritten | None:
    """One compaction step of table ``name`` (None: nothing due). ``cache``: the table's
    manifest entries (:func:`live_files`), kept by the caller between steps. ``mirrors``: the
    coordinator's key indexes; a mirror table's index moves to the new files in place.
    ``seen``: as for :func:`expire`: nothing due there, no catalog read. ``fence``: the
    coordinator's group and epoch, named in the new files' prefix (icesink/shared/protocol/fences.py)
    and checked under the lock before the commit: a coordinator fenced meanwhile commits nothing.
    ``keep``: as for :func:`expire`, with the table the compaction's commit left."""
    branch = s.branches.of(name)
    if seen is not None and plan_compaction(seen, s, cache, branch) is None:
        return None
    table = catalog.load_table(name)  # its own: a round may commit to the cached one meanwhile
    plan = plan_compaction(table, s, cache, branch)
    if plan is None:
        return None
    prefix = f"compacted-{int(time.time() * 1000)}-{threading.get_ident() % 100000}"
    if fence is not None:
        prefix = coordinator_prefix(fence[0], fence[1], prefix)
    new = rewrite(table, plan.data, plan.deletes, prefix)
    written, inputs = sum(f.record_count for f in new), sum(f.record_count for f in plan.data)
    if written > inputs or (not plan.deletes and written != inputs):  # the rewriter counts exactly; a guard
        _delete_all(table, new)
        raise RuntimeError(f"{name}: compaction wrote {written} rows for {inputs} input rows; dropped")
    moved = None
    if mirrors is not None and plan.data and (keys := mirrors.keys(name, table)):
        moved = _keys_of(table, name, new, keys, (plan.data[0].spec_id, plan.data[0].partition))
    snapshot_id = commit_rewrite(
        catalog, name, plan, new, lock,
        None if mirrors is None else lambda parent, snap: mirrors.rewritten(name, parent, snap, moved), fence=fence,
        cache=cache, branch=branch, keep=keep)
    return Rewritten(len(plan.data), len(new), sum(f.file_size_in_bytes for f in plan.data), snapshot_id,
                     len(plan.deletes))


def _keys_of(table: Table, name: str, files: Sequence[DataFile], keys: Sequence[str],
             where: tuple[int, Any]) -> list[Any] | None:
    """Each new file's path, key columns, and ``where``: the spec id and partition of the inputs
    (a step rewrites one partition). None: unreadable; the index is rebuilt."""
    try:
        return [(f.file_path, read_keys(table, f.file_path, keys), where) for f in files]
    except Exception as exc:  # noqa: BLE001 - the next round rebuilds the index instead
        log.warning("%s: could not read the key columns %s of the compacted files (%s: %s); the key index is "
                    "rebuilt at the next round", name, list(keys), type(exc).__name__, exc)
        return None


def commit_rewrite(catalog: Catalog, name: str, plan: Plan, new: Sequence[DataFile], lock: threading.Lock,
                   committed: Callable[[int | None, int | None], Any] | None = None,
                   fence: tuple[str, int] | None = None,
                   cache: dict[str, tuple[DataFile, ...]] | None = None, branch: str = MAIN_BRANCH,
                   keep: Callable[[Table], Any] | None = None) -> int | None:
    """Replace the plan's data and delete files by ``new`` in one REPLACE snapshot; retried on
    a conflict, dropped (the new files deleted) when an input is no longer live or the
    partition gained delete files meanwhile (they name rows of the inputs). Never half-applied.
    ``committed(parent, snapshot)`` runs under the lock once the snapshot is in (``parent``:
    the snapshot the inputs were checked against; None if the commit landed on another).
    ``fence``: (group, epoch) of this coordinator: if the table holds a later epoch of the group,
    FencedError (a sweep may have deleted ``new`` already; the commit would reference them).
    ``cache``: :func:`live_files`'s for this table. Under the lock only the current snapshot's
    manifests not read before are read, and those holding inputs (to be rewritten). A conflict
    is retried here, every check again, never by pyiceberg alone (it would re-apply the
    replace on a snapshot that may have gained delete files of the partition). ``branch``: the
    branch whose head is rewritten (the one the sink commits the table to). ``keep(table)``: called
    under the lock with the table the commit left (as :func:`expire`'s)."""
    wanted = {normalize(f.file_path) for f in plan.data}
    folded = {normalize(f.file_path) for f in plan.deletes}
    for attempt in range(1, _COMMIT_ATTEMPTS + 1):
        with lock:
            table = catalog.load_table(name)
            if fence is not None and (state := latest_sink_summary(table, fence[0], branch)) is not None \
                    and state.epoch > fence[1]:
                _delete_all(table, new)
                raise FencedError(f"{name}: compaction of coordinator epoch {fence[1]} dropped: the table holds "
                                  f"epoch {state.epoch} of group {fence[0]}")
            base = branch_head(table, branch)
            live = live_files(table, cache, branch=branch)
            data = {normalize(f.file_path) for f in live if f.content == DataFileContent.DATA}
            deletes = {normalize(f.file_path) for f in live
                       if f.content != DataFileContent.DATA and _partition_key(f) == plan.partition}
            if not wanted <= data or deletes != folded:
                log.warning("%s: compaction dropped: %d inputs no longer live, %d delete files added meanwhile",
                            name, len(wanted - data), len(deletes - folded))
                _delete_all(table, new)
                return None
            try:
                with MemoTransaction(table) as tx:  # stages its metadata once (coordinator/iceberg_ext/)
                    check_before_retry(tx, _no_blind_retry)
                    rewrite = Replace.of(tx, {MAINTENANCE_KEY: "compaction"}, cache, branch=branch)
                    with rewrite:
                        for f in (*plan.data, *plan.deletes):
                            rewrite.delete_data_file(f)
                        for f in new:
                            rewrite.append_data_file(f)
            except CommitFailedException as exc:
                log.info("%s: compaction commit conflicted (attempt %d): %s", name, attempt, exc)
                continue
            snap = branch_head(table, branch)
            if keep is not None:
                keep(table)
            if committed is not None:
                parent = base.snapshot_id if base is not None and snap is not None and \
                    snap.parent_snapshot_id == base.snapshot_id else None
                committed(parent, snap.snapshot_id if snap else None)
            return snap.snapshot_id if snap else None
    _delete_all(catalog.load_table(name), new)
    raise CommitFailedException(f"{name}: compaction commit conflicted {_COMMIT_ATTEMPTS} times; dropped")


def _no_blind_retry(refreshed: Table) -> None:
    """In place of pyiceberg's rebuild of a conflicting commit on the refreshed table: fail, so
    :func:`commit_rewrite` retries with every check (inputs live, no new delete files, fence)."""
    raise CommitFailedException("another commit landed during the compaction's; re-checked by the next attempt")


def _delete_all(table: Table, files: Sequence[DataFile]) -> None:
    for f in files:
        try:
            table.io.delete(f.file_path)
        except OSError:
            pass
    prune_write_dirs(table.location(), [f.file_path for f in files])


# The schedule ----------------------------------------------------------------------------------
