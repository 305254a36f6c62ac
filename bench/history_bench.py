"""A table's history over many rounds with the coordinator's maintenance at its settings: does
a round's commit, the table's metadata and expiry's hold on the table lock stay flat as rounds
go by? Each round appends one small Parquet file with the coordinator's ``commit_table`` (the
sink state in the summary and the table property, as a round writes it), then runs the
maintenance pass the coordinator runs after a round (expiry, a compaction step with pyiceberg
reading and writing instead of Spark), on a SQLite catalog and local files. Time is simulated:
round ``k`` happens ``k * --interval-ms`` after the start (snapshot timestamps and expiry's
clock), so a day of 5 s rounds takes minutes, not a day. ``--set`` changes a maintenance
setting (e.g. ``--set snapshot_max_age_ms=86400000``, the old default of one day). Prints, every
``--every`` rounds: snapshots, the current metadata file's size, manifests in the current
snapshot, the round's commit (ms: the last, the median of the last rounds, and the median CPU
of its thread, steadier than wall time on a busy machine), the longest times expiry and
compaction held the table lock so far, and the longest maintenance pass of the last rounds::

    .venv/bin/python bench/history_bench.py --rounds 3000 --interval-ms 1000
    .venv/bin/python bench/history_bench.py --rounds 3000 --interval-ms 1000 --set snapshot_max_age_ms=86400000
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa
import pyiceberg.table.snapshots as _snapshots
from pyiceberg.io.pyarrow import _dataframe_to_data_files

from coordinator import iceberg_ext
from coordinator.committer import RoundCommit, TableCache, commit_table
from coordinator.maintenance import MaintenanceSettings, compact, expire
from coordinator.state import Accepted
from coordinator.iceberg_ext.catalogs import SqlCatalog
from icesink.shared import gc_tuning
from icesink.shared.catalogs import sqlite_catalog_properties
from icesink.shared.iceberg import CREATED_TABLE_PROPERTIES, to_file_info
from icesink.shared.protocol import TopicPartition
from spark_bridge.rewrite import read_files

PARTITIONS = 6  # source partitions: each round's positions name them all


class FakeClock:
    """``time.time`` for pyiceberg's snapshot timestamps: the simulated round's time."""

    def __init__(self, start: float) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:  # the rest of the time module as is
        return getattr(time, name)


class TimedLock:
    """A lock that records how long each holder kept it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since = 0.0
        self.holds: list[float] = []

    def __enter__(self) -> TimedLock:
        self._lock.acquire()
        self._since = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.holds.append(time.perf_counter() - self._since)
        self._lock.release()


def main() -> None:
    iceberg_ext.install()  # as a replica does (coordinator/iceberg_ext/): the committer requires it
    # The collector as a replica's (icesink/app/cli.py): at Python's default young threshold
    # (700) a commit's allocations set off collections, and the older generations' walk a heap
    # that holds every table's history (--tables 200: 140,000 snapshots and their summaries).
    gc_tuning.tune()
    gc_tuning.freeze_start_up()  # and on, as a replica's is once it reads
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--interval-ms", type=int, default=1000, help="simulated time between rounds")
    ap.add_argument("--rows", type=int, default=200, help="rows per round's file")
    ap.add_argument("--every", type=int, default=250, help="print a line every this many rounds")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a MaintenanceSettings field, e.g. snapshot_max_age_ms=86400000")
    ap.add_argument("--table-prop", action="append", default=[], metavar="KEY=VALUE",
                    help="a property of the tables made, over those icesink gives the tables it creates "
                         "(icesink.shared.iceberg.CREATED_TABLE_PROPERTIES), e.g. "
                         "write.metadata.delete-after-commit.enabled=false")
    ap.add_argument("--no-compaction", action="store_true")
    ap.add_argument("--young-every", type=int, default=10,
                    help="the young table (the same-time baseline) is created again every this many rounds")
    ap.add_argument("--tables", type=int, default=1,
                    help="tables in the catalog: bench.t0 is measured and committed every round")
    ap.add_argument("--others-per-round", type=int, default=None,
                    help="how many of the other tables a round commits, in turn (default: all)")
    args = ap.parse_args()
    s = MaintenanceSettings()
    for item in args.set:
        key, _, value = item.partition("=")
        s = dataclasses.replace(s, **{key: int(value)})
    print(f"{args.rounds} rounds every {args.interval_ms} ms (simulated), {args.rows} rows each; "
          f"retain-last {s.retain_last}, max-age {s.snapshot_max_age_ms} ms, "
          f"compaction {'off' if args.no_compaction else f'after {s.min_input_files} files'}")
    clock = FakeClock(time.time())
    real = _snapshots.time
    _snapshots.time = clock  # type: ignore[assignment]
    try:
        run(args, s, clock)
    finally:
        _snapshots.time = real


YOUNG_WINDOW = 100  # rounds of the young table's commits a curve point compares with
CURVE = (10, 100, 1_000, 10_000)  # the rounds issue 42 target 6 compares: each to the tenth
WINDOW = 10  # a point of the curve is the median of the WINDOW rounds ending at it


@dataclasses.dataclass
class Tracked:
    """One table of the run and the maintenance state the coordinator keeps for it."""

    name: str
    table: Any
    manifests: dict[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    live: dict[str, Any] = dataclasses.field(default_factory=dict)
    rounds: int = 0


def run(args: argparse.Namespace, s: MaintenanceSettings, clock: FakeClock) -> None:
    with tempfile.TemporaryDirectory(prefix="history-bench-") as tmp:
        catalog = SqlCatalog("bench", **sqlite_catalog_properties(Path(tmp)))
        catalog.create_namespace("bench")
        schema = pa.schema([("id", pa.int64()), ("shop", pa.string()), ("price", pa.float64())])
        props = {**CREATED_TABLE_PROPERTIES, **dict(item.split("=", 1) for item in args.table_prop)}
        tables = [Tracked(f"bench.t{i}", catalog.create_table(f"bench.t{i}", schema=schema, properties=props))
                  for i in range(args.tables)]
        measured, others = tables[0], tables[1:]
        young = Young(catalog, schema, props, args.young_every)
        per_round = len(others) if args.others_per_round is None else min(args.others_per_round, len(others))
        if others:
            print(f"{args.tables} tables: bench.t0 (measured) every round, {per_round} of the other "
                  f"{len(others)} each round in turn (each every {len(others) / max(per_round, 1):.1f} rounds)")
        cache = TableCache()
        lock = TimedLock()
        commits: list[float] = []
        commit_cpu: list[float] = []  # the commit's CPU on its thread: less noisy than wall time on a busy machine
        other_commits: list[float] = []
        expiry_holds: list[float] = []
        compaction_holds: list[float] = []
        print(f"{'round':>6} {'snapshots':>9} {'metadata KB':>11} {'manifests':>9} {'commit ms':>9} "
              f"{'(median)':>8} {'CPU ms':>6} {'expiry lock ms':>14} {'compaction lock ms':>18} {'pass ms':>8} "
              f"{'x young':>7}")
        passes: list[float] = []
        turn = 0
        for r in range(1, args.rounds + 1):
            clock.now += args.interval_ms / 1000
            wall, cpu, pass_s = one_round(args, s, catalog, cache, lock, measured, r, int(clock.now * 1000),
                                          expiry_holds, compaction_holds)
            commits.append(wall)
            commit_cpu.append(cpu)
            passes.append(pass_s)
            young.commit(args, cache, lock, r)
            for _ in range(per_round):
                other = others[turn % len(others)]
                turn += 1
                wall, _cpu, _pass = one_round(args, s, catalog, cache, lock, other, r, int(clock.now * 1000), [], [])
                other_commits.append(wall)
            if r in CURVE:  # as it is reached: a run stopped early still shows it
                print_curve(commits, commit_cpu, young.cpu, only=r)
            if r % args.every == 0 or r == args.rounds:
                table = catalog.load_table(measured.name)
                snap = table.current_snapshot()
                meta_kb = os.path.getsize(table.metadata_location.removeprefix("file://")) / 1024
                recent = commits[-args.every:]
                print(f"{r:>6} {len(table.metadata.snapshots):>9} {meta_kb:>11.0f} "
                      f"{len(snap.manifests(table.io)) if snap else 0:>9} {1000 * recent[-1]:>9.1f} "
                      f"{1000 * statistics.median(recent):>8.1f} {1000 * statistics.median(commit_cpu[-args.every:]):>6.1f} "
                      f"{1000 * max(expiry_holds, default=0):>14.1f} "
                      f"{1000 * max(compaction_holds, default=0):>18.1f} "
                      f"{1000 * max(passes[-args.every:]):>8.0f} "
                      f"{statistics.median(commit_cpu[-args.every:]) / statistics.median(young.cpu[-args.every:]):>7.2f}",
                      flush=True)
        print_curve(commits, commit_cpu, young.cpu)
        if other_commits:
            print(f"the other tables' commits: median {1000 * statistics.median(other_commits):.1f} ms "
                  f"over {len(other_commits):,}; they hold "
                  f"{min(o.rounds for o in others):,}-{max(o.rounds for o in others):,} rounds each")


def one_round(args: argparse.Namespace, s: MaintenanceSettings, catalog: Any, cache: TableCache, lock: TimedLock,
              t: Tracked, r: int, now_ms: int, expiry_holds: list[float],
              compaction_holds: list[float]) -> tuple[float, float, float]:
    """Round ``r``'s commit of one small file to ``t`` and the maintenance pass after it: the
    commit's wall and thread CPU time, and the pass's wall time (seconds)."""
    name = t.name
    wall, cpu = commit_once(args, catalog, cache, lock, t, r)
    began = time.perf_counter()
    holds = len(lock.holds)
    keep = partial(cache.put, name)  # as the coordinator's Maintainer: the commit's table stays cached
    expire(catalog, name, s, lock, t.manifests, now_ms=now_ms, seen=t.table, keep=keep)
    expiry_holds += lock.holds[holds:]
    if not args.no_compaction:
        holds = len(lock.holds)
        compact(catalog, name, s, lock, _rewrite, t.live, seen=cache.get(name), keep=keep)
        compaction_holds += lock.holds[holds:]
    t.table = cache.get(name) or catalog.load_table(name)
    return wall, cpu, time.perf_counter() - began


def commit_once(args: argparse.Namespace, catalog: Any, cache: TableCache, lock: TimedLock, t: Tracked,
                r: int) -> tuple[float, float]:
    """Round ``r``'s commit of one small file to ``t``: its wall and thread CPU time (seconds)."""
    t.rounds += 1
    name = t.name
    rows = pa.table({"id": pa.array(range(r * args.rows, (r + 1) * args.rows), pa.int64()),
                     "shop": pa.array([f"s{r % 7}"] * args.rows), "price": pa.array([1.5] * args.rows)})
    files = list(_dataframe_to_data_files(t.table.metadata, rows, t.table.io, write_uuid=uuid.uuid4()))
    batch = [Accepted(100 + r, f"round-{r}", "w1", (), {name: tuple(to_file_info(f, 0) for f in files)}, None)]
    tps = [TopicPartition("pizzas", p) for p in range(PARTITIONS)]
    began, cpu = time.perf_counter(), time.thread_time()
    with lock:
        out = commit_table(catalog, name, batch, RoundCommit(group="bench", epoch=1, commit_id=f"round-{r}",
                           positions={tp: r * 1000 for tp in tps}, valid_through_ms=None), tables=cache)
    wall, cpu = time.perf_counter() - began, time.thread_time() - cpu
    assert out.snapshot_id is not None
    t.table = cache.get(name) or catalog.load_table(name)
    return wall, cpu


class Young:
    """A table kept young beside the measured one: created again every ``every`` rounds (so its
    commits are its rounds 1 to ``every``) and committed right after bench.t0 in each round,
    without maintenance. Its commits' median in a window is the tenth round's cost at that
    moment: the ratio to it does not move with the machine's speed, which on this VM moved a
    1,000-round median of the same commit by 1.6x (bench/README.md)."""

    def __init__(self, catalog: Any, schema: pa.Schema, props: dict[str, str], every: int) -> None:
        self.catalog, self.schema, self.props, self.every = catalog, schema, props, every
        self.table = self._create()
        self.cpu: list[float] = []

    def _create(self) -> Tracked:
        return Tracked("bench.young", self.catalog.create_table("bench.young", schema=self.schema,
                                                                 properties=self.props))

    def commit(self, args: argparse.Namespace, cache: TableCache, lock: TimedLock, r: int) -> None:
        if self.table.rounds >= self.every:
            self.catalog.drop_table("bench.young")
            cache.drop("bench.young")
            self.table = self._create()
        self.cpu.append(commit_once(args, self.catalog, cache, lock, self.table, r)[1])


def print_curve(commits: list[float], commit_cpu: list[float], young_cpu: list[float], only: int | None = None) -> None:
    """Target 6's curve: the measured table's commit at rounds 10, 100, 1,000 and 10,000 (the
    median of the WINDOW rounds ending there, wall and thread CPU), its ratio to round 10, and
    the ratio of its CPU to the young table's in the same last YOUNG_WINDOW rounds (medians; the
    young table's is the tenth round's cost measured at the same time: :class:`Young`);
    ``only``: that point's line alone,
    printed as the run reaches it (a run stopped early keeps it)."""
    points = [c for c in CURVE if c <= len(commits)]
    if not points:
        return
    if only is None:
        print(f"commit cost curve (median of the {WINDOW} rounds ending at each point; x young: the "
              f"medians of the last {YOUNG_WINDOW} rounds, bench.t0's over the young table's):")
        print(f"{'round':>7} {'wall ms':>8} {'x10th':>6} {'CPU ms':>7} {'x10th':>6} {'young CPU':>9} {'x young':>7}")
    base_wall = statistics.median(commits[max(0, points[0] - WINDOW):points[0]])
    base_cpu = statistics.median(commit_cpu[max(0, points[0] - WINDOW):points[0]])
    for c in points if only is None else [only]:
        wall = statistics.median(commits[max(0, c - WINDOW):c])
        cpu = statistics.median(commit_cpu[max(0, c - WINDOW):c])
        young = statistics.median(young_cpu[max(0, c - YOUNG_WINDOW):c])
        same_rounds = statistics.median(commit_cpu[max(0, c - YOUNG_WINDOW):c])
        print(f"{'curve ' if only else ''}{c:>7,} {1000 * wall:>8.1f} {wall / base_wall:>6.2f} {1000 * cpu:>7.1f} "
              f"{cpu / base_cpu:>6.2f} {1000 * young:>9.1f} {same_rounds / young:>7.2f}", flush=True)


def _rewrite(table: Any, data_files: Any, delete_files: Any, prefix: str) -> list[Any]:
    """Compaction's rewriter without Spark: pyiceberg reads and writes."""
    return list(_dataframe_to_data_files(table.metadata, read_files(table, data_files, delete_files), table.io,
                                         write_uuid=uuid.uuid4()))


if __name__ == "__main__":
    main()
