"""The coordinator at scale, simulated: one commit round of many workers, partitions and tables
driven through the pure state machine (coordinator/state.py), no broker, no catalog.

    .venv/bin/python bench/coordinator_sim.py [--workers 100] [--partitions 1000] [--tables 200]
        [--files-per-table 1] [--repeat 3] [--no-grid]

A benchmark command, not a test: it prints figures. Partitions are spread evenly over the
workers and every worker writes every table (the worst case: dynamic routing spreads each
partition over all tables). The round is built as the protocol builds it: a Claim and a
Resume per worker (set-up, not timed), then StartCommit, one DataWritten per worker and table
(its files with column statistics for 7 columns, as a pizza table has) and one DataComplete
per worker listing the ranges of its partitions. It prints the events and the bytes they take
on the control topic (``icesink.shared.protocol.encode``, the value of each control record; keys and
signatures add a few dozen bytes each), the largest event, the time to apply them all
(``CoordinatorState.apply``) and to decide (``round_answered`` + ``plan_commit``), and a grid
showing what the events grow with.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordinator.state import CoordinatorState
from icesink.shared.protocol import (
    Claim, DataComplete, DataWritten, Event, FileInfo, OffsetRange, Position, Resume, StartCommit, TopicPartition,
    decode, encode,
)

TOPIC: Final = "events"
COLUMNS: Final = 7  # column statistics per file, as for the pizza table
RECORDS_PER_PARTITION: Final = 5_000  # offsets each partition advanced in the round


@dataclass(frozen=True)
class RoundFigures:
    workers: int
    partitions: int
    tables: int
    events: Counter[str]
    control_bytes: int
    largest_event: tuple[str, int]
    decode_s: float
    apply_s: float
    plan_s: float
    planned_tables: int
    planned_files: int


def file_info(worker: int, table: int, n: int) -> FileInfo:
    stats = tuple(range(1, COLUMNS + 1))
    return FileInfo(
        path=f"s3://lake/warehouse/db/t{table:03d}/data/00000-{worker:03d}-{n}-0d3c5f8e-4b1a-4c2e-9f70-1a2b3c4d5e6f.parquet",
        record_count=1_000, size_bytes=48_000, spec_id=0,
        column_sizes=tuple((i, 6_000) for i in stats), value_counts=tuple((i, 1_000) for i in stats),
        null_value_counts=tuple((i, 0) for i in stats), nan_value_counts=(),
        lower_bounds=tuple((i, b"a0000000") for i in stats), upper_bounds=tuple((i, b"z9999999") for i in stats),
        split_offsets=(4,),
    )


def build_round(workers: int, partitions: int, tables: int, files_per_table: int = 1) -> tuple[list[Event], list[Event]]:
    """(set-up events, round events): Claim and Resume per worker; then the round."""
    owned = {w: [TopicPartition(TOPIC, p) for p in range(partitions) if p % workers == w] for w in range(workers)}
    setup: list[Event] = []
    for w, tps in owned.items():
        setup.append(Claim(f"w{w:03d}", 1, tuple(tps), f"member-{w:03d}"))
        setup.append(Resume(1, f"w{w:03d}", 1, tuple(Position(tp, 0) for tp in tps)))
    round_events: list[Event] = [StartCommit(1, "round-1")]
    for w, tps in owned.items():
        worker, response = f"w{w:03d}", f"resp-{w:03d}"
        for t in range(tables):
            files = tuple(file_info(w, t, n) for n in range(files_per_table))
            round_events.append(DataWritten("round-1", response, worker, f"db.t{t:03d}", files))
        ranges = tuple(OffsetRange(tp, 0, RECORDS_PER_PARTITION) for tp in tps)
        round_events.append(DataComplete("round-1", response, worker, 1, ranges, tables, None))
    return setup, round_events


def run_round(workers: int, partitions: int, tables: int, files_per_table: int = 1) -> RoundFigures:
    setup, events = build_round(workers, partitions, tables, files_per_table)
    state = CoordinatorState()
    offset = 0
    for ev in setup:
        state.apply(offset, ev)
        offset += 1
    encoded = [encode(ev) for ev in events]
    sizes = [(type(ev).__name__, len(raw)) for ev, raw in zip(events, encoded)]
    decoding = time.perf_counter()
    for i, raw in enumerate(encoded):
        decode(raw, i)  # what the coordinator's reader does with each record (and validates)
    decode_s = time.perf_counter() - decoding
    began = time.perf_counter()
    for ev in events:
        state.apply(offset, ev)
        offset += 1
    applied = time.perf_counter()
    answered = state.round_answered()
    batch, _checkpoint = state.plan_commit()
    planned = time.perf_counter()
    if not answered:
        raise RuntimeError("the simulated round is not answered: the events do not match the protocol")
    planned_tables = {t for a in batch for t, files in a.files.items() if files}
    return RoundFigures(
        workers, partitions, tables, Counter(name for name, _ in sizes), sum(n for _, n in sizes),
        max(sizes, key=lambda x: x[1]), decode_s, applied - began, planned - applied, len(planned_tables),
        sum(len(files) for a in batch for files in a.files.values()),
    )


def median_round(workers: int, partitions: int, tables: int, files_per_table: int, repeat: int) -> RoundFigures:
    runs = [run_round(workers, partitions, tables, files_per_table) for _ in range(max(1, repeat))]
    decode_s = statistics.median(r.decode_s for r in runs)
    apply_s = statistics.median(r.apply_s for r in runs)
    plan_s = statistics.median(r.plan_s for r in runs)
    first = runs[0]
    return RoundFigures(first.workers, first.partitions, first.tables, first.events, first.control_bytes,
                        first.largest_event, decode_s, apply_s, plan_s, first.planned_tables, first.planned_files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--files-per-table", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="rounds timed; the median is shown (default 3)")
    parser.add_argument("--no-grid", action="store_true", help="skip the growth grid")
    args = parser.parse_args()
    if min(args.workers, args.partitions, args.tables, args.files_per_table) < 1 or args.partitions < args.workers:
        parser.error("expected workers, tables, files-per-table >= 1 and partitions >= workers")

    f = median_round(args.workers, args.partitions, args.tables, args.files_per_table, args.repeat)
    print(f"one round: {f.workers} workers, {f.partitions} partitions, {f.tables} tables, "
          f"{args.files_per_table} file(s) per worker and table")
    print(f"  control events: {sum(f.events.values()):,} ("
          + ", ".join(f"{n:,} {name}" for name, n in sorted(f.events.items())) + ")")
    print(f"  bytes on the control topic: {f.control_bytes / 1e6:.1f} MB "
          f"({f.control_bytes / sum(f.events.values()):,.0f} bytes per event on average); "
          f"largest event: {f.largest_event[0]} of {f.largest_event[1]:,} bytes")
    print(f"  decode and validate every event (the coordinator's reader): {f.decode_s * 1e3:.0f} ms "
          f"({f.decode_s / sum(f.events.values()) * 1e6:.0f} us per event)")
    print(f"  apply every event: {f.apply_s * 1e3:.0f} ms ({f.apply_s / sum(f.events.values()) * 1e6:.0f} us per event); "
          f"decide (round_answered + plan_commit): {f.plan_s * 1e3:.1f} ms; median of {args.repeat}")
    print(f"  the plan: {f.planned_tables} tables, {f.planned_files:,} files to commit")
    if args.no_grid:
        return 0
    print()
    print("what the events of a round grow with (1 file per worker and table, median of 3):")
    print(f"  {'workers':>7} {'partitions':>10} {'tables':>6} {'events':>8} {'MB':>7} {'decode ms':>9} {'apply ms':>9}"
          f" {'plan ms':>8}")
    for workers in (10, 50, 100):
        for partitions in (100, 1000):
            for tables in (20, 200):
                g = median_round(workers, partitions, tables, 1, 3)
                print(f"  {workers:>7} {partitions:>10} {tables:>6} {sum(g.events.values()):>8,} "
                      f"{g.control_bytes / 1e6:>7.1f} {g.decode_s * 1e3:>9.0f} {g.apply_s * 1e3:>9.0f} {g.plan_s * 1e3:>8.1f}")
    print("  events = 1 StartCommit + workers x tables DataWritten + workers DataComplete: partitions")
    print("  appear only inside a worker's DataComplete (one range each), never per table.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
