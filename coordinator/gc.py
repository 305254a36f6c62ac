"""Orphan data files: files under a table's ``data/`` directory that no snapshot references.

The coordinator deletes the files of rejected and abandoned responses itself (state.py,
``_expire_partials``). What it cannot know about is left to ``icesink gc``: files of a
worker killed while Spark was writing (never announced), files whose deletion failed, files
of snapshots expired by another tool. A file is an orphan only if all of these hold:
- no snapshot of the table references it (every manifest of every snapshot, deleted entries
  included, is read);
- no DataWritten event after the coordinator's checkpoint names it (accepted data waiting
  for a commit, e.g. while the catalog is down, is protected whatever its age);
- it is older than the grace period (a file Spark is writing now, not yet announced, is
  young).
So a committed file is never deleted (tests/integration/test_gc.py).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from urllib.parse import urlparse

from pyarrow import fs as pafs
from pyiceberg.table import Table

from icesink.config import Settings
from icesink.control import ControlReader
from icesink.errors import ConfigError
from icesink.protocol import CommitComplete, DataWritten

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Orphan:
    path: str
    size_bytes: int
    age_s: float


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


def find_orphans(
    table: Table, older_than_s: float, protected: set[str], now: float | None = None
) -> list[Orphan]:
    """Data files under the table's location that are orphans (see module doc)."""
    now = time.time() if now is None else now
    referenced = referenced_files(table) | {normalize(p) for p in protected}
    filesystem, root = pafs.FileSystem.from_uri(table.location().rstrip("/") + "/data")
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    scheme = urlparse(table.location()).scheme
    out = []
    for info in infos:
        if info.type != pafs.FileType.File or normalize(info.path) in referenced:
            continue
        age = now - info.mtime.timestamp() if info.mtime is not None else 0.0
        if age >= older_than_s:
            path = info.path if scheme in ("", "file") else f"{scheme}://{info.path}"
            out.append(Orphan(path, info.size or 0, age))
    return sorted(out, key=lambda o: o.path)


async def in_flight_files(settings: Settings, bootstrap: str) -> set[str]:
    """Paths named by DataWritten events from the coordinator's checkpoint (its replay
    start) to the end of the control log: written, maybe accepted, not yet committed."""
    reader = ControlReader(
        bootstrap, settings.control_topic, settings.group_id, settings.kafka_client_kwargs(),
        commit_group=f"{settings.group_id}-coordinator",
    )
    await reader.start()
    try:
        start = 0
        committed = await reader.committed()
        if committed is not None:
            cp = await reader.read_one(committed)
            if isinstance(cp, CommitComplete) and cp.replay_from is not None:
                start = cp.replay_from
        end = await reader.end_offset()
        await reader.seek(start)
        out: set[str] = set()
        while True:
            batch = await reader.read(1.0)
            out.update(f.path for _, ev in batch if isinstance(ev, DataWritten) for f in (*ev.files, *ev.deleted_keys))
            if not batch and await reader.position() >= end:
                return out
    finally:
        await reader.stop()


def delete_orphans(table: Table, orphans: list[Orphan]) -> int:
    """Delete the given orphans, re-checking the references first (a commit may have landed
    since they were listed). Returns how many were deleted."""
    table.refresh()
    still = referenced_files(table)
    deleted = 0
    for o in orphans:
        if normalize(o.path) in still:
            log.warning("%s was committed meanwhile; kept", o.path)
            continue
        table.io.delete(o.path)
        deleted += 1
    return deleted
