"""End-to-end ingest: one icesink worker against a plain read-parse-write-commit baseline.

    .venv/bin/python bench/ingest_bench.py [--records 1000000] [--partitions 6] [--skip-baseline]

A benchmark command, not a test: it prints figures and asserts nothing about time. Both paths
read the same ``N`` pizza events from one topic of an embedded Tansu broker and commit them to a
fresh Iceberg table in a SQLite SQL catalog:

(a) baseline, in a fresh child process (so its peak RSS does not include the generated events):
    a plain ``AIOKafkaConsumer`` reads every partition from the beginning (``getmany``, raw
    bytes, counting records: Tansu's end offsets are too low), ``pyarrow.json.read_json`` parses
    all values in one call, ``pyarrow.parquet`` writes ONE file, and pyiceberg commits it once
    (``create_table`` + ``add_files``: one snapshot). Each phase is timed.
(b) one icesink worker (``python -m icesink worker``, Faust + a local Spark session + the
    coordinator) started with :class:`icesink.replicas.ReplicaSet`, timed from process start
    until the table's current snapshot holds ``N`` rows. "Startup" is process start until the
    worker's ``icesink_records_consumed_total`` is first > 0 (its /metrics, polled every 0.2 s);
    "ingest" is the rest. Peak RSS is sampled every 0.2 s over the worker and all its
    descendants (the Spark JVM); VmHWM is the Python worker process's own high-water mark.

Ratios are (b)/(a) on records/s; the baseline's records/s is always on its whole time
(read + parse + write + commit), while (b) is given on its ingest time and on its total time.
The table is then checked for exactly ``N`` rows and ``N`` distinct ``order_id`` values.
Everything lives in a temporary directory removed at the end (``--keep`` keeps it, with the
worker's log).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from icesink.embedded import EmbeddedBroker, sqlite_catalog_properties  # noqa: E402

TOPIC: Final = "bench-pizzas"
TABLE: Final = "bench.pizzas"
SEED: Final = 11
SPREAD_DAYS: Final = 3
SAMPLE_EVERY_S: Final = 0.2
TABLE_POLL_S: Final = 0.5
PROGRESS_EVERY_S: Final = 30.0  # a progress line on stderr
MIB: Final = 1024 * 1024
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")
_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")

_ROUND_ANSWERED = re.compile(
    r"round (?P<round>\S+): answered (?P<parts>\d+) partitions, (?P<rows>\d+) rows in (?P<files>\d+) files"
)
_ROUND_COMMITTED = re.compile(
    r"round (?P<round>\S+) committed to (?P<table>\S+): snapshot (?P<snap>\d+), "
    r"(?P<files>\d+) files, (?P<rows>\d+) rows"
)
_MILESTONES: Final = (
    ("metrics on http", "metrics server up"),
    ("spark session started", "spark session started"),
    ("coordinator started", "coordinator started"),
    ("running (group", "worker running"),
    ("created table", "table auto-created"),
    ("buffers full", "buffers full: partitions paused"),
)


# ----------------------------------------------------------------------------- helpers


def per_partition_counts(n: int, partitions: int) -> dict[int, int]:
    """:func:`icesink.pizzas.produce` sends record ``i`` to partition ``i % partitions``."""
    return {p: n // partitions + (1 if p < n % partitions else 0) for p in range(partitions)}


def local_path(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def read_status_kib(pid: int, key: str) -> int | None:
    """A ``/proc/<pid>/status`` field in KiB (``VmRSS``, ``VmHWM``), or None if gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def system_cpu_s() -> float:
    """CPU seconds every core of this machine spent busy since boot (``/proc/stat``)."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait are busy.
    return (sum(fields[:8]) - fields[3] - fields[4]) / _CLOCK_TICKS


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of one process so far (0 if it is gone)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


@dataclass
class Interference:
    """CPU used by processes outside the measured path while it ran (other users' work)."""

    wall_s: float
    system_busy_s: float
    ours_s: float

    @property
    def others_s(self) -> float:
        return max(0.0, self.system_busy_s - self.ours_s)

    def describe(self) -> str:
        capacity = self.wall_s * (os.cpu_count() or 1)
        return (f"machine busy {self.system_busy_s:.0f} of {capacity:.0f} CPU-s; other processes "
                f"{self.others_s:.0f} CPU-s ({self.others_s / capacity:.0%} of the machine)")


def descendants(root: int) -> list[int]:
    """``root`` and every live descendant, from the parent ids in ``/proc/*/stat``."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # Field 2 (comm) is in parentheses and may hold spaces; ppid is the 2nd field after it.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_rss_bytes(root: int, cpu: dict[int, tuple[str, float]] | None = None) -> tuple[int, int]:
    """(sum of RSS of ``root`` and its descendants in bytes, number of processes).

    With ``cpu``, also records each process's name and user + system CPU seconds so far."""
    total = 0
    pids = descendants(root)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as handle:
                total += int(handle.read().split()[1]) * _PAGE_SIZE
            if cpu is not None:
                with open(f"/proc/{pid}/stat", "rb") as handle:
                    stat = handle.read()
                name = stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")
                fields = stat[stat.rfind(b")") + 2 :].split()
                cpu[pid] = (name, (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS)
        except (OSError, ValueError, IndexError):
            continue  # exited between the walk and the read
    return total, len(pids)


class RssSampler:
    """Samples the RSS of a process tree every ``SAMPLE_EVERY_S`` in a daemon thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_tree_bytes = 0
        self.peak_tree_procs = 0
        self.hwm_kib = 0  # VmHWM of ``pid`` itself (only grows; last readable value wins)
        self.cpu: dict[int, tuple[str, float]] = {}  # pid -> (name, CPU seconds at last sample)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_EVERY_S)

    def sample(self) -> None:
        total, procs = tree_rss_bytes(self.pid, self.cpu)
        if total > self.peak_tree_bytes:
            self.peak_tree_bytes, self.peak_tree_procs = total, procs
        hwm = read_status_kib(self.pid, "VmHWM")
        if hwm is not None:
            self.hwm_kib = max(self.hwm_kib, hwm)


def metric_total(port: int, name: str) -> float | None:
    """Sum of a metric's samples over all label sets, or None if /metrics does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ----------------------------------------------------------------------------- (a) baseline


@dataclass
class BaselineResult:
    records: int
    read_s: float
    parse_s: float
    write_s: float
    commit_s: float
    total_s: float
    file_bytes: int
    files: int
    snapshots: int
    table_rows: int
    distinct_order_ids: int
    hwm_kib: int
    arrow_bytes: int
    cpu_s: float
    interference: Interference


async def _read_topic(bootstrap: str, topic: str, counts: dict[int, int]) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(counts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen = dict.fromkeys(tps, 0)
        values: list[bytes] = []
        pending = {tp for tp in tps if counts[tp.partition] > 0}
        while pending:
            batch = await consumer.getmany(*pending, timeout_ms=1000)
            for tp, records in batch.items():
                values.extend([r.value for r in records])
                seen[tp] += len(records)
                if seen[tp] >= counts[tp.partition]:
                    pending.discard(tp)
        extra = {tp.partition: seen[tp] - counts[tp.partition] for tp in tps if seen[tp] != counts[tp.partition]}
        if extra:
            raise RuntimeError(f"baseline read: expected exactly {counts} records per partition, "
                               f"found these differences {extra}")
        return values
    finally:
        await consumer.stop()


def run_baseline(
    bootstrap: str, topic: str, counts: dict[int, int], directory: str, broker_pid: int | None
) -> BaselineResult:
    """Runs in a fresh child process; every phase is timed, table checks are not."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj
    import pyarrow.parquet as pq
    from pyiceberg.catalog import load_catalog

    props = sqlite_catalog_properties(directory)
    catalog = load_catalog("bench", **props)

    cpu_began = _cpu_seconds()
    system_began, broker_began = system_cpu_s(), process_cpu_s(broker_pid)
    began = time.perf_counter()
    values = asyncio.run(_read_topic(bootstrap, topic, counts))
    read_done = time.perf_counter()

    table = pj.read_json(io.BytesIO(b"\n".join(values)))
    # Iceberg timestamps are microseconds; the JSON reader infers seconds.
    schema = pa.schema([
        f.with_type(pa.timestamp("us")) if pa.types.is_timestamp(f.type) else f for f in table.schema
    ])
    table = table.cast(schema)
    del values
    parse_done = time.perf_counter()

    # Any path works for add_files; the table does not exist yet (its creation is timed as commit).
    path = local_path(props["warehouse"]) / "baseline-files" / "baseline-00000.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    write_done = time.perf_counter()

    catalog.create_namespace("bench")
    iceberg_table = catalog.create_table(TABLE, schema=table.schema)
    iceberg_table.add_files([f"file://{path}"])
    commit_done = time.perf_counter()
    cpu_s = _cpu_seconds() - cpu_began
    interference = Interference(
        commit_done - began, system_cpu_s() - system_began,
        cpu_s + process_cpu_s(broker_pid) - broker_began,
    )

    iceberg_table = catalog.load_table(TABLE)
    snapshot = iceberg_table.current_snapshot()
    ids = iceberg_table.scan(selected_fields=("order_id",)).to_arrow()["order_id"]
    return BaselineResult(
        records=table.num_rows,
        read_s=read_done - began,
        parse_s=parse_done - read_done,
        write_s=write_done - parse_done,
        commit_s=commit_done - write_done,
        total_s=commit_done - began,
        file_bytes=path.stat().st_size,
        files=iceberg_table.inspect.files().num_rows,
        snapshots=len(iceberg_table.snapshots()),
        table_rows=int(snapshot.summary["total-records"]) if snapshot else 0,
        distinct_order_ids=pc.count_distinct(ids).as_py(),
        hwm_kib=read_status_kib(os.getpid(), "VmHWM") or 0,
        arrow_bytes=table.nbytes,
        cpu_s=cpu_s,
        interference=interference,
    )


def _cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def baseline_in_child(
    bootstrap: str, topic: str, counts: dict[int, int], directory: Path, broker_pid: int | None
) -> BaselineResult:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(run_baseline, (bootstrap, topic, counts, str(directory), broker_pid))


# ----------------------------------------------------------------------------- (b) icesink


@dataclass
class WorkerResult:
    total_s: float
    startup_s: float
    ingest_s: float
    rows_at_end: int
    peak_tree_bytes: int
    peak_tree_procs: int
    hwm_kib: int
    files: int
    snapshots: int
    table_rows: int
    distinct_order_ids: int
    metrics: dict[str, float]
    cpu_by_name: dict[str, float]
    interference: Interference
    log_path: Path
    started_wall: float
    timeline: list[str] = field(default_factory=list)
    # (seconds since process start, value) each time the value changed.
    consumed_curve: list[tuple[float, float]] = field(default_factory=list)
    committed_curve: list[tuple[float, float]] = field(default_factory=list)


def committed_rows(catalog: Any) -> int:
    if not catalog.table_exists(TABLE):
        return 0
    snapshot = catalog.load_table(TABLE).current_snapshot()
    return int(snapshot.summary["total-records"]) if snapshot else 0


def run_worker(
    bootstrap: str, topic: str, n: int, directory: Path, timeout_s: float, broker_pid: int | None
) -> WorkerResult:
    import pyarrow.compute as pc
    from pyiceberg.catalog import load_catalog

    from icesink.replicas import ReplicaSet

    props = sqlite_catalog_properties(directory / "catalog")
    catalog = load_catalog("b2", **props)
    config = {
        "topics": topic,
        "iceberg.tables": TABLE,
        "iceberg.catalog": "b2",
        **{f"iceberg.catalog.{k}": v for k, v in props.items()},
        "iceberg.tables.auto-create-enabled": "true",
        "iceberg.control.topic": "bench-control",
        "iceberg.control.commit.interval-ms": 5000,
        "group.id": "bench",
        "bootstrap.servers": bootstrap,
        "state.dir": str(directory / "state"),
        "spark.master": "local[2]",
        "spark.driver.memory": "4g",
        "buffer.max-bytes": 1073741824,
    }
    config_path = directory / "worker.json"
    config_path.write_text(json.dumps(config, indent=2))
    # The worker imports icesink, agents... from the repository, wherever this is run from.
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    replicas = ReplicaSet(config_path, directory / "logs", env={"PYTHONPATH": pythonpath})
    sampler: RssSampler | None = None
    try:
        started_wall = time.time()
        system_began, broker_began, self_began = system_cpu_s(), process_cpu_s(broker_pid), _cpu_seconds()
        began = time.monotonic()
        replica = replicas.start("bench")
        sampler = RssSampler(replica.proc.pid).start()
        startup_s: float | None = None
        next_table_poll = began
        next_progress = began + PROGRESS_EVERY_S
        rows = 0
        consumed_curve: list[tuple[float, float]] = []
        committed_curve: list[tuple[float, float]] = []
        while True:
            replicas.check_alive()
            now = time.monotonic()
            if now - began > timeout_s:
                tail = replica.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"expected {n} committed rows within {timeout_s:.0f} s, "
                                   f"found {rows}. Worker log tail:\n{tail}")
            consumed = metric_total(replica.metrics_port, "icesink_records_consumed_total")
            if consumed and (not consumed_curve or consumed != consumed_curve[-1][1]):
                at = time.monotonic() - began
                consumed_curve.append((at, consumed))
                if startup_s is None:
                    startup_s = at
            if now >= next_progress:
                next_progress = now + PROGRESS_EVERY_S
                print(f"[{now - began:6.0f} s] worker: consumed {consumed or 0:,.0f}, committed {rows:,} of {n:,}",
                      file=sys.stderr, flush=True)
            if now >= next_table_poll:
                next_table_poll = now + TABLE_POLL_S
                rows = committed_rows(catalog)
                if rows and (not committed_curve or rows != committed_curve[-1][1]):
                    committed_curve.append((time.monotonic() - began, rows))
                if rows >= n:
                    total_s = time.monotonic() - began
                    system_busy_s = system_cpu_s() - system_began
                    # The broker and this process's polling are part of the measured path.
                    harness_s = process_cpu_s(broker_pid) - broker_began + _cpu_seconds() - self_began
                    break
            time.sleep(SAMPLE_EVERY_S)
        sampler.sample()
        metrics = {
            name: metric_total(replica.metrics_port, name) or 0.0
            for name in (
                "icesink_records_consumed_total",
                "icesink_rounds_committed_total",
                "icesink_files_written_total",
                "icesink_write_duration_seconds_sum",
                "icesink_write_duration_seconds_count",
                "icesink_commit_duration_seconds_sum",
                "icesink_commit_duration_seconds_count",
            )
        }
        sampler.stop()
        cpu_by_name: dict[str, float] = {}
        for name, seconds in sampler.cpu.values():
            cpu_by_name[name] = cpu_by_name.get(name, 0.0) + seconds
        interference = Interference(total_s, system_busy_s, sum(cpu_by_name.values()) + harness_s)
        replicas.stop_all()
    finally:
        if sampler is not None:
            sampler.stop()
        replicas.stop_all()
    if startup_s is None:  # all rows committed between two metric polls
        startup_s = total_s

    table = catalog.load_table(TABLE)
    snapshot = table.current_snapshot()
    ids = table.scan(selected_fields=("order_id",)).to_arrow()["order_id"]
    return WorkerResult(
        total_s=total_s,
        startup_s=startup_s,
        ingest_s=total_s - startup_s,
        rows_at_end=rows,
        peak_tree_bytes=sampler.peak_tree_bytes,
        peak_tree_procs=sampler.peak_tree_procs,
        hwm_kib=sampler.hwm_kib,
        files=table.inspect.files().num_rows,
        snapshots=len(table.snapshots()),
        table_rows=int(snapshot.summary["total-records"]) if snapshot else 0,
        distinct_order_ids=pc.count_distinct(ids).as_py(),
        metrics=metrics,
        cpu_by_name=cpu_by_name,
        interference=interference,
        log_path=replica.log_path,
        started_wall=started_wall,
        timeline=worker_timeline(replica.log_path, started_wall),
        consumed_curve=consumed_curve,
        committed_curve=committed_curve,
    )


def first_reaching(curve: list[tuple[float, float]], level: float) -> str:
    """Seconds at which ``curve`` first reached ``level``, or "-"."""
    return next((f"{at:.1f}" for at, value in curve if value >= level), "-")


def worker_timeline(log_path: Path, started_wall: float, shown_rounds: int = 4) -> list[str]:
    """Milestones and commit rounds from the worker's log, in seconds since process start.

    The first ``shown_rounds`` answered rounds and the last two are listed; the ones between
    are summarised (count, rows per round, seconds between answers)."""
    milestones: list[tuple[float, str]] = []
    rounds: list[tuple[float, str]] = []  # answered rounds
    answered: list[tuple[float, int]] = []
    commits = 0
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        at = stamp - started_wall
        if (m := _ROUND_ANSWERED.search(line)) is not None:
            gap = f" (+{at - answered[-1][0]:5.1f} s)" if answered else ""
            answered.append((at, int(m["rows"])))
            rounds.append((at, f"answered round {m['round'][:8]}: {int(m['rows']):>9,} rows "
                               f"in {m['files']} files{gap}"))
        elif (m := _ROUND_COMMITTED.search(line)) is not None:
            commits += 1
            rounds.append((at, f"committed round {m['round'][:8]}: {int(m['rows']):>8,} rows, "
                               f"{m['files']} files"))
        else:
            for needle, label in _MILESTONES:
                if needle in line:
                    milestones.append((at, label))
                    break
    # Every round line before the first answer that is summarised or listed at the end.
    cutoff = answered[shown_rounds][0] if len(answered) > shown_rounds else float("inf")
    early = [r for r in rounds if r[0] < cutoff]
    out = [f"{at:7.1f} s  {text}" for at, text in sorted(milestones + early)]
    answered_lines = [r for r in rounds if r[1].startswith("answered")]
    middle = answered[shown_rounds:-2]
    if middle:
        rows = sorted(r for _, r in middle)
        gaps = sorted(b[0] - a[0] for a, b in zip(answered[shown_rounds - 1 : -2], middle))
        out.append(f"     ...   {len(middle)} more rounds from {middle[0][0]:.1f} s to {middle[-1][0]:.1f} s: "
                   f"rows per round min {rows[0]:,} / median {rows[len(rows) // 2]:,} / max {rows[-1]:,}, "
                   f"seconds between answers median {gaps[len(gaps) // 2]:.1f}, "
                   f"{sum(rows) / (middle[-1][0] - answered[shown_rounds - 1][0]):,.0f} rows/s")
    if len(answered) > shown_rounds:
        out += [f"{at:7.1f} s  {text}" for at, text in answered_lines[max(shown_rounds, len(answered) - 2) :]]
    out.append(f"            {len(answered)} rounds answered, {commits} round commits logged")
    return out


# ----------------------------------------------------------------------------- report


def ratio(b: float, a: float | None) -> str:
    return f"{b / a:.3f}" if a else "-"


def print_report(n: int, produce_s: float, a: BaselineResult | None, b: WorkerResult) -> bool:
    """Prints the comparison; returns False if a table does not hold exactly N distinct rows."""
    a_rate = n / a.total_s if a else None
    b_rate_ingest = n / b.ingest_s if b.ingest_s > 0 else float("inf")
    b_rate_total = n / b.total_s
    rows: list[tuple[str, str, str, str]] = [
        ("", "(a) baseline", "(b) icesink", "(b)/(a)"),
        ("records/s, on ingest time *", fmt_int(a_rate) if a_rate else "-", fmt_int(b_rate_ingest),
         ratio(b_rate_ingest, a_rate)),
        ("records/s, on total wall time", fmt_int(a_rate) if a_rate else "-", fmt_int(b_rate_total),
         ratio(b_rate_total, a_rate)),
        ("wall time, total (s)", f"{a.total_s:.1f}" if a else "-", f"{b.total_s:.1f}",
         ratio(b.total_s, a.total_s if a else None)),
        ("  startup (s)", "-", f"{b.startup_s:.1f}", ""),
        ("  ingest after startup (s)", f"{a.total_s:.1f}" if a else "-", f"{b.ingest_s:.1f}",
         ratio(b.ingest_s, a.total_s if a else None)),
        ("peak RSS (MiB)", f"{a.hwm_kib / 1024:.0f}" if a else "-",
         f"{b.peak_tree_bytes / MIB:.0f}", ratio(b.peak_tree_bytes / MIB, a.hwm_kib / 1024 if a else None)),
        ("  of the Python process, VmHWM (MiB)", f"{a.hwm_kib / 1024:.0f}" if a else "-",
         f"{b.hwm_kib / 1024:.0f}", ""),
        ("CPU seconds (user + system)", f"{a.cpu_s:.1f}" if a else "-",
         f"{sum(b.cpu_by_name.values()):.1f}", ratio(sum(b.cpu_by_name.values()), a.cpu_s if a else None)),
        ("data files", str(a.files) if a else "-", str(b.files), ""),
        ("snapshots", str(a.snapshots) if a else "-", str(b.snapshots), ""),
        ("rows in table / distinct order_id", f"{a.table_rows:,} / {a.distinct_order_ids:,}" if a else "-",
         f"{b.table_rows:,} / {b.distinct_order_ids:,}", ""),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print(f"produced {n:,} records in {produce_s:.1f} s ({fmt_int(n / produce_s)} records/s)")
    print()
    for r in rows:
        print(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}")
    print()
    print("* (a) has no startup: its records/s is always N / (read + parse + write + commit).")
    print("  (b) ingest time = total - startup; startup = worker process start until its")
    print("  icesink_records_consumed_total is first > 0.")
    print("  Peak RSS: (a) VmHWM of the baseline process; (b) peak of the summed RSS of the worker")
    print(f"  and its descendants ({b.peak_tree_procs} processes at the peak, the Spark JVM included),")
    print(f"  sampled every {SAMPLE_EVERY_S} s.")
    print("  CPU: (a) the timed phases; (b) the worker's process tree from start to N rows: " + ", ".join(
        f"{name} {seconds:.1f} s" for name, seconds in sorted(b.cpu_by_name.items(), key=lambda x: -x[1])
        if seconds >= 0.05))
    print("  Interference (CPU used outside the measured path, from /proc/stat, while it ran):")
    if a is not None:
        print(f"    (a) {a.interference.describe()}")
    print(f"    (b) {b.interference.describe()}")
    if a is not None:
        print()
        print(f"(a) phases: read {a.read_s:.2f} s ({fmt_int(n / a.read_s)}/s), "
              f"parse {a.parse_s:.2f} s ({fmt_int(n / a.parse_s)}/s), "
              f"write {a.write_s:.2f} s ({fmt_int(n / a.write_s)}/s), "
              f"commit {a.commit_s:.2f} s (create_table + add_files)")
        print(f"    Arrow {a.arrow_bytes / MIB:.0f} MiB, Parquet file {a.file_bytes / MIB:.1f} MiB")
    m = b.metrics
    print()
    print(f"(b) worker metrics at N rows: consumed {m['icesink_records_consumed_total']:,.0f}, "
          f"rounds committed {m['icesink_rounds_committed_total']:.0f}, "
          f"files written {m['icesink_files_written_total']:.0f}")
    print(f"    Spark writes {m['icesink_write_duration_seconds_count']:.0f}, "
          f"{m['icesink_write_duration_seconds_sum']:.1f} s in all; "
          f"table commits {m['icesink_commit_duration_seconds_count']:.0f}, "
          f"{m['icesink_commit_duration_seconds_sum']:.1f} s in all")
    levels = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
    print("    progress, seconds since process start (consumed: icesink_records_consumed_total,")
    print("    polled every 0.2 s; committed: the table's total-records, polled every 0.5 s):")
    print(f"      {'':<9}" + "".join(f"{f'{level:.0%} of N':>10}" for level in levels))
    for label, curve in (("consumed", b.consumed_curve), ("committed", b.committed_curve)):
        print(f"      {label:<9}" + "".join(f"{first_reaching(curve, level * n):>10}" for level in levels))
    print(f"    timeline from the worker log ({b.log_path.name}), seconds since process start:")
    for line in b.timeline:
        print(f"    {line}")
    print(f"    {b.total_s:7.1f} s  {b.rows_at_end:,} rows seen committed by this benchmark")

    ok = True
    for label, result in (("(a)", a), ("(b)", b)):
        if result is None:
            continue
        if (result.table_rows, result.distinct_order_ids) != (n, n):
            ok = False
            print(f"\nCHECK FAILED {label}: expected {n:,} rows and {n:,} distinct order_id, "
                  f"found {result.table_rows:,} rows and {result.distinct_order_ids:,} distinct")
    if ok:
        print(f"\ncheck: each table holds exactly {n:,} rows with {n:,} distinct order_id")
    return ok


# ----------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--timeout-s", type=float, default=1800.0,
                        help="give up waiting for the worker's rows after this (default 1800)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (worker log, tables) and print its path")
    args = parser.parse_args()
    n: int = args.records
    if n < 1 or args.partitions < 1:
        parser.error(f"--records and --partitions: expected >= 1, found {n} and {args.partitions}")

    # SIGTERM unwinds like Ctrl-C, so the worker, the broker and the temp dir are cleaned up.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    print("command:", shlex.join([os.path.relpath(sys.executable), *sys.argv]))
    print(f"N = {n:,} pizza events, {args.partitions} partitions, {os.cpu_count()} CPUs")
    sys.stdout.flush()

    from icesink.kafka_admin import ensure_topic
    from icesink.pizzas import pizza_values, produce

    tmp = Path(tempfile.mkdtemp(prefix="icesink-bench-"))
    broker = EmbeddedBroker(tmp / "broker")
    try:
        broker.start()
        asyncio.run(ensure_topic(broker.bootstrap, TOPIC, args.partitions))
        values = pizza_values(n, seed=SEED, spread_days=SPREAD_DAYS)
        began = time.monotonic()
        asyncio.run(produce(broker.bootstrap, TOPIC, values, partitions=args.partitions))
        produce_s = time.monotonic() - began
        del values
        counts = per_partition_counts(n, args.partitions)

        baseline = None
        if not args.skip_baseline:
            baseline = baseline_in_child(broker.bootstrap, TOPIC, counts, tmp / "baseline", broker.pid)
        worker = run_worker(broker.bootstrap, TOPIC, n, tmp / "worker", args.timeout_s, broker.pid)
        ok = print_report(n, produce_s, baseline, worker)
    finally:
        broker.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


def _exit_on_signal(signum: int, _frame: Any) -> None:
    print(f"{signal.Signals(signum).name}: stopping the worker and the broker, removing the "
          "temporary directory", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
