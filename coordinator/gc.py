"""Orphan data files: files under a table's ``data/`` directory that no snapshot references.

The coordinator deletes the files of rejected and abandoned responses itself (state.py,
``_expire_partials``). What it cannot know about is left to the scheduled sweep
(coordinator/maintenance.py) and ``icesink gc``: files of a worker killed while Spark was
writing or after an early write (never announced), files whose deletion failed, files of
snapshots expired by another tool. A file is deleted only if all of these hold:
- no snapshot of the table references it (every manifest of every snapshot, deleted entries
  included, is read);
- no DataWritten event of the group's control log after its checkpoint names it;
- it is older than the grace period;
- its name's fence says no round can commit it any more (icesink/shared/protocol/fences.py): its
  group's position in the table passed where its response began, or a later coordinator
  epoch of its group committed to the table. This holds for every group whose state the table
  holds, whatever its control log. A file without a fence (another tool's, or written before
  fences) is judged by the first three rules alone.
Each deletion is logged; a file kept because its group may still commit it is reported
(docs/commits.md, "Orphan files and icesink gc").

Each write of each table has a directory of its own under ``data/`` (a fenced name): on a
filesystem with directories (a local warehouse; object stores have none) whatever deletes a
written file removes the directories it leaves empty, up to its write directory
(:func:`prune_write_dirs`), and the sweep removes empty write directories older than the grace
period (left by a version before, or by another tool's deletions).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlparse

from pyarrow import fs as pafs
from pyiceberg.table import Table

from icesink.shared.config import MAIN_BRANCH, Settings
from icesink.shared.control import ControlReader
from icesink.shared.errors import ConfigError
from icesink.shared.iceberg import latest_sink_summary
from icesink.shared.protocol import GROUP, CommitComplete, DataWritten, SinkState
from icesink.shared.protocol.fences import fence_of, judge
from icesink.shared.signing import Keyring

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_STATE_KEY = re.compile(r"^icesink\.(.+)\.state$")


@dataclass(frozen=True)
class Orphan:
    path: str
    size_bytes: int
    age_s: float
    reason: str = "no fence: older than the grace period"


@dataclass(frozen=True)
class Sweep:
    """What a sweep of one table found: ``orphans`` to delete, and ``held``, unreferenced
    files kept because their group may still commit them (with why)."""

    orphans: list[Orphan]
    held: list[Orphan]
    empty_dirs: list[str] = field(default_factory=list)  # empty write directories older than the grace period


@dataclass(frozen=True)
class InFlight:
    """Files the group's control log names after its checkpoint: written, maybe accepted, not
    yet committed. ``start``: the control offset read from, ``source``: why there."""

    paths: frozenset[str]
    start: int
    source: str


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``6h``, ``3d`` -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ConfigError("--older-than", text, "a duration such as 90s, 30m, 6h or 3d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def normalize(path: str) -> str:
    """One spelling per file: ``file:///w/x`` and ``/w/x`` match, ``s3://b/k`` and ``b/k`` match."""
    u = urlparse(path)
    if u.scheme in ("", "file"):
        return u.path
    return u.netloc + u.path


def referenced_files(table: Table, cache: dict[str, frozenset[str]] | None = None) -> set[str]:
    """Every data and delete file any snapshot of the table references. Manifests never
    change once written, so ``cache`` (manifest path -> its files) may be kept across calls."""
    io = table.io
    cache = {} if cache is None else cache
    out: set[str] = set()
    seen_manifests: set[str] = set()
    for snap in table.metadata.snapshots:
        for manifest in snap.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            listed = cache.get(manifest.manifest_path)
            if listed is None:
                listed = frozenset(
                    normalize(entry.data_file.file_path)
                    for entry in manifest.fetch_manifest_entry(io, discard_deleted=False)
                )
                cache[manifest.manifest_path] = listed
            out |= listed
    return out


def sink_states(table: Table, branch: str = MAIN_BRANCH) -> dict[str, SinkState]:
    """The sink state of every group that has committed to the table: the groups of its
    ``icesink.<group>.state`` properties, and of its snapshots' summaries (older versions; read
    along ``branch``, the one the caller's group commits the table to)."""
    groups = {m.group(1) for k in table.metadata.properties if (m := _STATE_KEY.match(k))}
    groups |= {g for s in table.metadata.snapshots if s.summary is not None and (g := s.summary[GROUP])}
    out = {}
    for g in sorted(groups):
        st = latest_sink_summary(table, g, branch)
        if st is not None:
            out[g] = st
    return out


def find_orphans(table: Table, older_than_s: float, protected: Iterable[str], now: float | None = None,
                 retired: Collection[str] = ()) -> Sweep:
    """The files under the table's data directory that no snapshot references, sorted into
    orphans and held files by the rules of the module doc. ``protected``: files the control
    log names in flight; ``retired``: groups that run nowhere any more."""
    now = time.time() if now is None else now
    referenced = referenced_files(table) | {normalize(p) for p in protected}
    states = sink_states(table)
    filesystem, root = pafs.FileSystem.from_uri(table.location().rstrip("/") + "/data")
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return Sweep([], [])
    scheme = urlparse(table.location()).scheme
    orphans: list[Orphan] = []
    held: list[Orphan] = []
    parents = {info.path.rsplit("/", 1)[0] for info in infos} if scheme in ("", "file") else set()
    empty_dirs = [info.path for info in infos  # object stores: no directories
                  if info.type == pafs.FileType.Directory and parents and info.path not in parents
                  and fence_of(info.path[len(root):].lstrip("/")) is not None  # in (or is) a write directory
                  and (info.mtime is None or now - info.mtime.timestamp() >= older_than_s)]
    for info in infos:
        if info.type != pafs.FileType.File or normalize(info.path) in referenced:
            continue
        age = now - info.mtime.timestamp() if info.mtime is not None else 0.0
        if age < older_than_s:
            continue
        path = info.path if scheme in ("", "file") else f"{scheme}://{info.path}"
        fence = fence_of(info.path[len(root):].lstrip("/"))
        if fence is None:
            orphans.append(Orphan(path, info.size or 0, age))
            continue
        verdict = judge(fence, states, retired)
        (orphans if verdict.dead else held).append(Orphan(path, info.size or 0, age, verdict.reason))
    return Sweep(sorted(orphans, key=lambda o: o.path), sorted(held, key=lambda o: o.path), sorted(empty_dirs))


def prune_write_dirs(table_location: str, paths: Iterable[str]) -> int:
    """After the files ``paths`` were deleted: remove each one's directories that are now
    empty, deepest first, up to and including its write directory (the nearest fenced segment
    above it), never the table's location or anything above it. Local paths only: object stores
    have no directories. A directory that is not empty (or already gone) is left quietly.
    Returns how many were removed."""
    root = urlparse(table_location)
    if root.scheme not in ("", "file"):
        return 0
    base = root.path.rstrip("/") + "/"
    todo: set[str] = set()
    for path in paths:
        u = urlparse(path)
        if u.scheme not in ("", "file") or not u.path.startswith(base) or ".." in u.path.split("/"):
            continue
        chain = []
        d = u.path.rsplit("/", 1)[0]
        while d.startswith(base):
            chain.append(d)
            if fence_of(d.rsplit("/", 1)[1]) is not None:
                todo.update(chain)  # up to the write directory; none above it
                break
            d = d.rsplit("/", 1)[0]
    removed = 0
    for d in sorted(todo, key=lambda x: x.count("/"), reverse=True):  # children before their parents
        try:
            os.rmdir(d)
            removed += 1
        except OSError:  # not empty (another file of the write lives), or gone
            pass
    return removed


def remove_empty_dirs(table: Table, dirs: Iterable[str]) -> int:
    """Remove the sweep's empty write directories (:attr:`Sweep.empty_dirs`), and their
    write directories above them once empty; logged in one line. Returns how many."""
    removed, first = 0, None
    for d in dirs:
        try:
            os.rmdir(d)
        except OSError:  # something was written into it since, or it is gone
            continue
        removed += 1 + prune_write_dirs(table.location(), [d])
        first = first or d
    if removed:
        log.info("%s: removed %d empty write directories (e.g. %s)", ".".join(table.name()), removed, first)
    return removed


async def in_flight_files(settings: Settings, bootstrap: str, table_start: int | None = None,
                          keyring: Keyring | None = None) -> InFlight:
    """Paths named by the group's DataWritten events from its replay start to the end of the
    control log: written, maybe accepted, not yet committed. The replay start is the
    coordinator's checkpoint's; without a readable checkpoint, ``table_start`` (the lowest
    ``replay_from`` of the group's state in the tables swept: every event naming a file one of
    them lacks is at or after it); without either, the log's start (the group never committed).
    ``keyring``: the group's (icesink/shared/group_secret.py), as its replicas check: an event not
    signed with it, a checkpoint too, names nothing and moves nothing."""
    group = settings.group_id
    reader = ControlReader(
        bootstrap, settings.control_topic, group, settings.control_client_kwargs(),
        commit_group=settings.coordinator_group, secret=keyring,
    )
    await reader.start()
    try:
        log_start = await reader.seek_to_beginning()
        start: int | None = None
        source = ""
        committed = await reader.committed()
        if committed is not None:
            cp = await reader.read_one(committed)
            if isinstance(cp, CommitComplete):
                start = cp.replay_from if cp.replay_from is not None else cp.through + 1
                source = f"the replay start of the checkpoint at control offset {committed}"
        if start is None and table_start is not None:
            start, source = table_start, "the replay start in the tables' sink state (no readable checkpoint)"
        if start is None:
            start, source = log_start, "the log's start (no checkpoint, no sink state in the tables)"
        if start < log_start:
            start, source = log_start, f"the log's start ({source} lies below it)"
        end = await reader.end_offset()
        await reader.seek(start)
        out: set[str] = set()
        while True:
            batch = await reader.read(1.0)
            out.update(f.path for _, ev in batch if isinstance(ev, DataWritten) for f in (*ev.files, *ev.deleted_keys))
            if not batch and await reader.position() >= end:
                break
        log.info("control log of group %s read from offset %d (%s) to %d: %d files in flight",
                 group, start, source, end, len(out))
        return InFlight(frozenset(out), start, source)
    finally:
        await reader.stop()


def delete_orphans(table: Table, orphans: list[Orphan]) -> int:
    """Delete the given orphans, re-checking the references first (a commit may have landed
    since they were listed). Each deletion is logged. Returns how many were deleted."""
    table.refresh()
    still = referenced_files(table)
    name = ".".join(table.name())
    deleted = 0
    gone: list[str] = []
    for o in orphans:
        if normalize(o.path) in still:
            log.warning("%s: %s was committed meanwhile; kept", name, o.path)
            continue
        try:
            table.io.delete(o.path)
        except FileNotFoundError:
            continue
        log.info("%s: deleted orphan file %s (%d bytes, %.1f h old; %s)", name, o.path, o.size_bytes,
                 o.age_s / 3600, o.reason)
        deleted += 1
        gone.append(o.path)
    prune_write_dirs(table.location(), gone)
    return deleted
