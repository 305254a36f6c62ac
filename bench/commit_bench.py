"""The coordinator's table commits of one round to many tables, alone: ``commit_table`` for each
of ``--tables`` tables (one new data file each, with column statistics, as a round of a worker
writing many dynamic tables gives), run on ``--threads`` commit threads as the coordinator runs
them, against a SQLite SQL catalog and local files (the ingest benchmark's set-up). No data file
is read by a fast append, so the files are only described.

It runs the rounds on pyiceberg's SQL catalog, then on icesink's (coordinator.iceberg_ext.catalogs.SqlCatalog,
which the sink uses for SQL catalogs), each on a fresh catalog. Prints, per round, the wall time,
the process CPU per table commit and how much of it was the kernel's; ``--profile`` runs the
rounds on one thread under cProfile and prints the functions with the most cumulative and own
time. ``--processes N`` runs each commit in one of N commit processes
(``iceberg.control.commit.processes``, coordinator/commit_processes.py), from the same threads,
and prints the processes' CPU beside this one's. ``--busy`` adds a thread that holds the GIL
4 ms out of every 10 (as a worker's event loop decoding records does while the coordinator
commits in the same process): every call a commit makes that releases the GIL (a file, a SQL
statement, a hand-off to another thread) then waits to get it back. Use it to see what a table
commit costs before and after a change:

    .venv/bin/python bench/commit_bench.py --tables 200 --rounds 5 [--busy]
    .venv/bin/python bench/commit_bench.py --tables 50 --rounds 3 --profile
    .venv/bin/python bench/commit_bench.py --tables 200 --rounds 2 --threads 4 --processes 2
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow.parquet as pq
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

from bench.benchlib import file_create_us, process_cpu_s
from coordinator import iceberg_ext
from coordinator.commit_processes import CommitProcesses
from coordinator.committer import RoundCommit, TableCache, commit_table, round_tables
from coordinator.iceberg_ext.catalogs import SqlCatalog
from coordinator.state import Accepted
from icesink.shared.catalogs import sqlite_catalog_properties
from icesink.shared.config import load_settings
from icesink.shared.protocol import FileInfo, TopicPartition

SCHEMA = Schema(*(
    NestedField(i + 1, name, kind, required=False) for i, (name, kind) in enumerate([
        ("order_id", StringType()), ("shop", StringType()), ("pizza", StringType()), ("size", StringType()),
        ("qty", LongType()), ("price", DoubleType()), ("customer", StringType()), ("city", StringType()),
        ("status", StringType()), ("ordered_at", TimestamptzType()),
    ])
))


ARROW_SCHEMA = schema_to_pyarrow(SCHEMA)


def described_file(table_location: str, rows: int) -> FileInfo:
    """A data file as a worker describes it: sizes, counts and bounds for every column. The file
    itself is an empty Parquet file with the schema's field ids: a table's first commit reads
    each file's footer (coordinator/requirements.py AssertFieldIds)."""
    ids = range(1, len(SCHEMA.fields) + 1)
    path = f"{table_location}/data/{uuid.uuid4().hex}.parquet"
    local = path.removeprefix("file://")
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(ARROW_SCHEMA.empty_table(), local)
    return FileInfo(
        path=path, record_count=rows, size_bytes=rows * 60 + 4096,
        spec_id=0, column_sizes=tuple((i, rows * 6) for i in ids), value_counts=tuple((i, rows) for i in ids),
        null_value_counts=tuple((i, 0) for i in ids), nan_value_counts=(),
        lower_bounds=tuple((i, b"a" * 8) for i in ids), upper_bounds=tuple((i, b"z" * 8) for i in ids),
        split_offsets=(4,),
    )


def main() -> None:
    iceberg_ext.install()  # as a replica does (coordinator/iceberg_ext/): the committer requires it
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2 * (os.cpu_count() or 1))
    ap.add_argument("--rows", type=int, default=300, help="rows per file (described, not written)")
    ap.add_argument("--profile", action="store_true", help="one thread under cProfile; print the top functions")
    ap.add_argument("--busy", action="store_true", help="a thread holding the GIL 4 ms of every 10 meanwhile")
    ap.add_argument("--processes", type=int, default=0, help="commit in this many commit processes (0: threads)")
    args = ap.parse_args()
    if args.processes and args.profile:
        raise SystemExit("--profile profiles this process: not with --processes")

    stop = threading.Event()
    if args.busy:
        threading.Thread(target=hold_the_gil, args=(stop,), daemon=True).start()
    try:
        for kind in ("icesink",) if args.processes else ("pyiceberg", "icesink"):
            run(kind, args)
    finally:
        stop.set()


def hold_the_gil(stop: threading.Event) -> None:
    """Pure-Python work 4 ms of every 10 until ``stop`` (--busy)."""
    while not stop.is_set():
        began = time.perf_counter()
        while time.perf_counter() - began < 0.004:
            sum(i * i for i in range(200))
        time.sleep(0.006)


def commit_processes(tmp: Path, n: int) -> CommitProcesses:
    """``n`` started commit processes opening the catalog :func:`run` made in ``tmp``."""
    props = sqlite_catalog_properties(tmp)
    settings = load_settings(None, None, {
        "topics": "src", "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "table",
        "iceberg.catalog": "bench", "iceberg.catalog.type": "sql", "iceberg.catalog.uri": props["uri"],
        "iceberg.catalog.warehouse": props["warehouse"], "state.dir": str(tmp / "state"),
        "iceberg.control.commit.processes": str(n)})
    processes = CommitProcesses(settings, n)
    processes.start(wait=True)  # the first round's time is the commits', not the processes' imports
    return processes


def children_cpu(processes: CommitProcesses | None) -> float:
    """User and system CPU seconds of the running commit processes (0 without them)."""
    return 0.0 if processes is None else sum(process_cpu_s(pid) for pid in processes.pids())


def run(kind: str, args: argparse.Namespace) -> None:
    """The rounds on ``kind``'s SQL catalog class: pyiceberg's own, or icesink.shared.catalogs'."""
    with tempfile.TemporaryDirectory(prefix="commit-bench-") as tmp:
        props = sqlite_catalog_properties(Path(tmp))
        catalog = load_catalog("bench", **props) if kind == "pyiceberg" else SqlCatalog("bench", **props)
        catalog.create_namespace("bench")
        names = [f"bench.t{i:03d}" for i in range(args.tables)]
        locations = {n: catalog.create_table(n, schema=SCHEMA).location() for n in names}
        cache = TableCache()
        processes = commit_processes(Path(tmp), args.processes) if args.processes else None
        threads = 1 if args.profile else args.threads
        profile = cProfile.Profile() if args.profile else None
        print(f"{kind}: {type(catalog).__module__}.{type(catalog).__name__}, {args.tables} tables, "
              f"{args.rounds} rounds, {threads} commit threads; creating a file in {Path(tmp).parent}: "
              f"{file_create_us(tmp):.0f} us (three per commit; TMPDIR moves it)")
        per_commit = []
        with ThreadPoolExecutor(threads) as pool:
            for r in range(args.rounds):
                offset = 100 + r
                batch = [Accepted(offset, f"round-{r}", "w1", (), {n: (described_file(locations[n], args.rows),)
                                                                    for n in names}, None)]

                of_round = round_tables(batch)  # once a round, as the coordinator does

                def one(name: str, batch: list[Accepted] = batch, r: int = r,
                        tables_of_round: dict[str, int] = of_round) -> None:
                    round = RoundCommit(
                        group="bench", epoch=1, commit_id=f"round-{r}", positions={TopicPartition("t", 0): 1000 * (r + 1)},
                        valid_through_ms=None, tables_of_round=tables_of_round)
                    out = (processes.commit(name, batch, round) if processes is not None
                           else commit_table(catalog, name, batch, round, tables=cache))
                    assert out.snapshot_id is not None

                children = children_cpu(processes)
                started, cpu, sys0 = time.monotonic(), time.process_time(), os.times().system
                if profile is not None:
                    profile.enable()
                if profile is not None:  # cProfile sees only its own thread: commit here, one by one
                    for name in names:
                        one(name)
                else:
                    list(pool.map(one, names))
                if profile is not None:
                    profile.disable()
                wall, cpu, system = time.monotonic() - started, time.process_time() - cpu, os.times().system - sys0
                children = children_cpu(processes) - children
                per_commit.append(1000 * (cpu + children) / args.tables)
                split = (f" ({1000 * cpu / args.tables:.2f} here, {1000 * children / args.tables:.2f} in the commit "
                         "processes)" if processes is not None else "")
                print(f"  round {r + 1}: {wall:.2f} s wall, {per_commit[-1]:.2f} ms CPU per table commit{split}, "
                      f"of this process's {1000 * system / args.tables:.2f} ms in the kernel"
                      f"{' (tables loaded from the catalog)' if r == 0 else ''}")
        if processes is not None:
            processes.close()
        later = per_commit[1:] or per_commit
        print(f"  {kind}: {sum(later) / len(later):.2f} ms CPU per table commit (rounds 2-{args.rounds})")
        if profile is not None:
            stats = pstats.Stats(profile)
            stats.sort_stats("cumulative").print_stats(40)
            stats.sort_stats("tottime").print_stats(25)

if __name__ == "__main__":
    main()
