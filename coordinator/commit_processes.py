"""Table commits in processes of their own (``iceberg.control.commit.processes``).

A table commit is CPU work in Python (manifests, metadata JSON, the catalog call), so the
coordinator's commit threads share one interpreter lock with each other and with the
replica's ingest: at 200 tables most of a round's commit time was the commit threads' own
CPU (see bench/README.md, commit_bench). With this setting each commit runs instead in one of N
worker processes, each with its own catalog and table cache, which the operating system
runs on other cores.

- **The commit is the same function** (:func:`coordinator.committer.commit_table`) on the same
  arguments, so every exactly-once rule holds as with threads: the watermark check, the epoch
  fence and the catalog's optimistic commit decide in the child as they would in the parent.
  The caller (a commit thread holding the table's lock) waits for the answer; retries, backoff,
  metrics and the CommitToTable stay in the parent.
- **A table always goes to the same process** (a stable hash of its name), so the metadata
  that process loaded and committed last is current for the next round: no load per commit.
  A stale entry (another writer committed meanwhile) is refused by the catalog and reloaded,
  as in the parent's cache.
- **Only the table's part of the round is sent**: each response with its files for that table.
- **A process that dies** (killed, out of memory) breaks its pool: the commit raises
  :class:`CommitProcessError`, which is retriable, and the retry starts a new process. The
  outcome of the lost commit is decided by the table: the retry's watermark check skips it when
  it went through.
- **Maintenance's look** at each committed table happens there too, on the table the process
  just committed (:func:`maintenance_due`): the replica's own view of the table is gone, and
  loading every table of every round to find nothing due would put that CPU back on its lock.
- **Mirror tables** keep their key indexes in the coordinator (coordinator/mirror.py), so a sink
  that makes them commits on threads; :meth:`CommitProcesses.enabled` says so.

The processes come from a fork server (a fresh interpreter, not a fork of a replica that runs a
JVM and many threads), log to the replica's stderr naming themselves, and exit when the replica
is gone (killed with SIGKILL, it cannot close them): none commits for a dead replica.
An error that would not unpickle in the replica crosses as :class:`CommitProcessFailure`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import Any

from pyiceberg.catalog import Catalog

from coordinator.committer import RoundCommit, TableCache, TableCommit, commit_table
from coordinator.maintenance import MaintenanceSettings, expiry_due, plan_compaction
from coordinator.state import Accepted
from icesink.shared.config import Settings
from icesink.shared.errors import IcesinkError, is_retriable
from icesink.shared.faults import crash_point

log = logging.getLogger(__name__)


class CommitProcessError(IcesinkError):
    """The process that commits a table stopped before answering (killed, out of memory). The
    commit's outcome is unknown to the coordinator; the retry, in a new process, checks the
    table's watermark and skips the round if it went through."""

    retriable = True


class CommitProcessFailure(IcesinkError):
    """An error raised in a commit process that cannot cross back as itself (it does not
    unpickle): its type and message, and whether a retry may mend it."""

    def __init__(self, message: str, retriable: bool) -> None:
        super().__init__(message, retriable)
        self.retriable = retriable

    def __str__(self) -> str:
        return str(self.args[0])


class CommitProcesses:
    """``processes`` single-process pools; :meth:`commit` runs a table's commit in its own."""

    def __init__(self, settings: Settings, processes: int, maintenance: MaintenanceSettings | None = None,
                 compaction: bool = False) -> None:
        """``maintenance``: each commit also says whether expiry (and, with ``compaction``,
        a compaction step) has anything to do on its table (None: maintenance is off)."""
        if processes < 1:
            raise ValueError(f"processes: expected >= 1, found {processes}")
        self._settings = settings
        self._maintenance = (maintenance, compaction) if maintenance is not None and maintenance.enabled else None
        self._pools: list[ProcessPoolExecutor | None] = [None] * processes
        self._lock = threading.Lock()  # commit threads start and replace pools
        self._context = multiprocessing.get_context("forkserver")
        self._closed = False

    def start(self, wait: bool = False) -> None:
        """Start every process now rather than at the first round's commits (each imports
        pyiceberg and opens the catalog: seconds, which the first round would wait for);
        ``wait``: until every one has."""
        started = [self._pool(i).submit(_ready) for i in range(len(self._pools))]
        for future in started if wait else ():
            future.result()

    def process_of(self, table: str) -> int:
        """The process a table's commits go to: stable across rounds and restarts."""
        return zlib.crc32(table.encode()) % len(self._pools)

    def commit(self, table: str, batch: list[Accepted], round: RoundCommit) -> TableCommit:
        """:func:`commit_table` of ``table`` in its process (blocks the calling thread)."""
        i = self.process_of(table)
        pool = self._pool(i)
        try:
            return pool.submit(_commit_here, table, table_batch(batch, table), round, self._maintenance).result()
        except BrokenProcessPool as exc:
            self._drop(i, pool)
            raise CommitProcessError(
                f"table {table}: its commit process {i} stopped before answering ({exc}); "
                "a new process takes the retry") from exc

    def pids(self) -> list[int]:
        """The running commit processes (for tests and /status)."""
        with self._lock:
            pools = [p for p in self._pools if p is not None]
        return [pid for p in pools for pid in list(p._processes or {})]  # a copy: the pool's thread changes it

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools, self._pools = self._pools, [None] * len(self._pools)
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def _pool(self, i: int) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("the commit processes are closed")
            pool = self._pools[i]
            if pool is None:
                pool = self._pools[i] = ProcessPoolExecutor(
                    1, mp_context=self._context, initializer=_start,
                    initargs=(self._settings, logging.getLogger().getEffectiveLevel(), os.getpid()))
            return pool

    def _drop(self, i: int, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pools[i] is pool:
                self._pools[i] = None
        pool.shutdown(wait=False, cancel_futures=True)


def table_batch(batch: list[Accepted], table: str) -> list[Accepted]:
    """``batch`` with each response's files for ``table`` only: what its commit reads (every
    response stays, for the round's watermark)."""
    return [replace(a, files={table: a.files[table]} if table in a.files else {},
                    deleted_keys={table: a.deleted_keys[table]} if table in a.deleted_keys else {})
            for a in batch]


# In a commit process ------------------------------------------------------------------------

_catalog: Catalog | None = None
_settings: Settings | None = None
_replica = 0  # the replica's pid: gone, this process exits
_tables = TableCache()
_live: dict[str, dict[str, Any]] = {}  # per table: plan_compaction's manifest cache
WATCH_S = 0.5


def _start(settings: Settings, level: int, replica: int) -> None:
    """A commit process's start: icesink's pyiceberg extensions installed (coordinator/iceberg_ext/),
    the replica's log format, Ctrl-C left to the replica (which
    closes the pool), its own catalog, and a watch on the replica: a replica killed with
    SIGKILL cannot close its pool, and a process left behind would commit late."""
    global _catalog, _settings, _replica
    from coordinator import iceberg_ext
    from icesink.shared.iceberg import load_catalog

    iceberg_ext.install()  # a fresh process (forkserver): this is its composition root

    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)-7s commit process {os.getpid()} %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _settings, _replica = settings, replica
    threading.Thread(target=_watch_replica, name="icesink-replica-watch", daemon=True).start()
    _catalog = load_catalog(settings)


def _replica_alive() -> bool:
    try:
        os.kill(_replica, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a pid reused by another user's process: not ours
        return False
    return True


def _watch_replica() -> None:
    while _replica_alive():
        time.sleep(WATCH_S)
    os._exit(1)


def _ready() -> None:
    pass


def _commit_here(table: str, batch: list[Accepted], round: RoundCommit,
                 maintenance: tuple[MaintenanceSettings, bool] | None) -> TableCommit:
    if _catalog is None or _settings is None:
        raise RuntimeError("a commit process without a catalog (its start failed)")
    if not _replica_alive():  # a call queued before the replica died: never commit for it
        os._exit(1)
    started = time.monotonic()
    try:
        out = commit_table(_catalog, table, batch, round, tables=_tables)
    except BaseException as exc:
        raise _crossable(exc) from None
    out = replace(out, duration_s=time.monotonic() - started)  # the commit alone, not its wait in this process's queue
    log.debug("committed %s in %.3f s", table, out.duration_s)
    crash_point(_settings, "coordinator.commit-process.after-commit")  # committed, not answered
    if maintenance is None:
        return out
    try:
        due = maintenance_due(_tables, table, *maintenance, _live.setdefault(table, {}))
    except Exception as exc:  # noqa: BLE001 - the commit went through; the Maintainer looks itself
        log.warning("table %s: could not judge whether maintenance is due (%s: %s); the maintenance pass will look",
                    table, type(exc).__name__, exc)
        due = None
    return replace(out, maintenance_due=due)


def _crossable(exc: BaseException) -> BaseException:
    """``exc`` if it unpickles as itself in the replica, else a :class:`CommitProcessFailure`
    with its message and retriability (an error that does not unpickle would break the pool,
    and a broken pool reads as a dead process: retried, whatever the error said)."""
    try:
        back = pickle.loads(pickle.dumps(exc))
        if type(back) is type(exc):
            return exc
    except Exception:  # noqa: BLE001 - any failure to cross is the case handled here
        pass
    return CommitProcessFailure(f"{type(exc).__name__}: {exc}", is_retriable(exc))


def maintenance_due(tables: TableCache, name: str, s: MaintenanceSettings, compaction: bool,
                    live: dict[str, Any]) -> bool:
    """Whether the Maintainer's pass has anything to do on ``name``, judged on the table as the
    commit just left it (the checks of :func:`coordinator.maintenance.expire` and
    :func:`~coordinator.maintenance.compact` before they read the catalog). True when that
    table is not at hand."""
    table = tables.get(name)
    if table is None:
        return True
    if expiry_due(table, s, int(time.time() * 1000)):
        return True
    return compaction and plan_compaction(table, s, live, s.branches.of(name)) is not None
