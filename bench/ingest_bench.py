"""End-to-end ingest: one icesink worker against a plain read-parse-write-commit baseline.

    .venv/bin/python bench/ingest_bench.py [--records 1000000] [--partitions 6] [--skip-baseline]
        [--tables K] [--rate R --duration S] [--buffer-max-bytes B] [--linger-ms MS] [--set KEY=VALUE] [--profile] [--keep]
        [--format json|avro|protobuf|json-schema] [--burst [--burst-idle-s S]] [--broker tansu|kafka [--broker-set KEY=VALUE]]

A benchmark command, not a test: it prints figures and asserts nothing about time. Both paths
read the same ``N`` pizza events from one topic of an embedded Tansu broker (``--broker kafka``: Apache
Kafka) and commit them to a
fresh Iceberg table in a SQLite SQL catalog:

(a) baseline, in a fresh child process (so its peak RSS does not include the generated events):
    a plain ``AIOKafkaConsumer`` reads every partition from the beginning (``getmany``, raw
    bytes, counting records: Tansu's end offsets are too low), ``pyarrow.json.read_json`` parses
    all values in one call, ``pyarrow.parquet`` writes ONE file, and pyiceberg commits it once
    (``create_table`` + ``add_files``: one snapshot). Each phase is timed.
(b) one icesink worker (``python -m icesink worker``, Faust + a local Spark session + the
    coordinator) started with :class:`icesink.app.replicas.ReplicaSet`, timed from process start
    until the table's current snapshot holds ``N`` rows: until the commit that brought it there,
    as the table records it (the metadata file's write; the catalog is polled every 0.5 s, and
    the poll that saw it is printed too). "Startup" is process start until the
    worker's ``icesink_records_consumed_total`` is first > 0 (its /metrics, polled every 0.2 s
    until then, every 5 s after);
    "ingest" is the rest. Peak RSS is sampled every 0.2 s over the worker and all its
    descendants (the Spark JVM); VmHWM is the Python worker process's own high-water mark.

Options: ``--tables K`` routes the records round robin to K dynamic tables (a route field
added to each event); ``--rate R --duration S`` starts the worker on an empty topic and produces
R records/s for S seconds while it runs, from a librdkafka producer in a process of its own
(bench/rate_producer.py; ``--linger-ms``, default 50, its linger: at 5 ms the embedded broker's
CPU grew to a core over a run), then prints the rate it delivered and produce-to-committed
freshness (each row's Kafka timestamp against the commit time of the snapshot that added it; no
baseline);
``--buffer-max-bytes`` sets the worker's bound (a burst: a large --records backlog with a small
bound shows the peak RSS against it); ``--set KEY=VALUE`` adds a worker setting (JVM flags through
``spark.driver.extraJavaOptions``); ``--profile`` samples the worker's Python process with
py-spy and prints the share of busy samples per stage (bench/benchlib.py STAGES); ``--format``
produces the same events framed for a schema registry (Avro, Protobuf or JSON Schema:
bench/pizza_formats.py) and starts a real one (tests/support/schema_registry.py) that the worker
reads them through (no baseline: it reads JSON). ``--burst``: the worker starts on an empty
topic and idles ``--burst-idle-s`` (default 10) once running, then the ``--records`` arrive at once
(the librdkafka producer, no rate limit); it prints the same freshness, the rounds, and the oldest
buffered record's age (``icesink_uncommitted_age_seconds``, polled every second) over the run:
with and without ``--set iceberg.control.commit.max-bytes=...`` (or ``max-records``) it shows
what the size trigger changes (peak RSS, rounds, freshness). No baseline.

Ratios are (b)/(a) on records/s; the baseline's records/s is always on its whole time
(read + parse + write + commit), while (b) is given on its ingest time and on its total time.
The floors: the CPU the worker's process tree and the broker used to the last row, over the
machine's CPUs, is the earliest any schedule of that work could end; the same after the first
record consumed bounds (b)'s records/s on that measure; with a baseline, 0.8 of its rate from
process start (issue 42's target 2) puts the last row at ``N / (0.8 * rate)``.
The table is then checked for exactly ``N`` rows and ``N`` distinct ``order_id`` values.
Everything lives in a temporary directory removed at the end (``--keep`` keeps it, with the
worker's log).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.benchlib import (  # noqa: E402
    MIB, SAMPLE_EVERY_S, TABLE, THREADS_EVERY, BaselineResult, Interference, RssSampler, _cpu_seconds, baseline_in_child,
    ensure_class_archive, file_create_us,
    Profiler, fmt_int, metric_total, per_partition_counts, process_cpu_s, system_cpu_s,
)
from bench.rate_producer import produce_at_rate  # noqa: E402
from icesink.shared.catalogs import sqlite_catalog_properties  # noqa: E402
from icesink.app.embedded import EmbeddedBroker  # noqa: E402
from spark_bridge.session import available_cpus  # noqa: E402

TOPIC: Final = "bench-pizzas"
NAMESPACE: Final = "bench"
ROUTE_FIELD: Final = "tbl"
SEED: Final = 11
SPREAD_DAYS: Final = 3
TABLE_POLL_S: Final = 0.5
PROGRESS_EVERY_S: Final = 30.0  # a progress line on stderr
METRICS_POLL_S: Final = 5.0  # the worker's /metrics once it consumes (SAMPLE_EVERY_S before)

_ROUND_ANSWERED = re.compile(
    r"round (?P<round>\S+): answered (?P<parts>\d+) partitions, (?P<rows>\d+) rows in (?P<files>\d+) files"
    r"(?: \(\d+ DataWritten; written in (?P<write_s>[\d.]+) s(?:, sent in (?P<send_s>[\d.]+) s)?"
    r"(?:, taken (?P<wait_s>[\d.]+) s after [^)]*)?\))?"
)
_ROUND_COMMITTED = re.compile(
    r"round (?P<round>\S+) committed to (?P<table>\S+): snapshot (?P<snap>\d+), "
    r"(?P<files>\d+) files, (?P<rows>\d+) rows"
)
_EARLY_WRITE = re.compile(
    r"early write: (?P<rows>\d+) rows of (?P<parts>\d+) partitions in (?P<files>\d+) files, (?P<s>[\d.]+) s(?P<void> \(void)?"
)
_MILESTONES: Final = (
    ("settings given", "settings read (the Spark session's start begins)"),
    ("metrics on http", "the group join's imports done, metrics server up"),
    ("asking to join group", "group join asked for (the rest is imported and built beside it)"),
    ("parts built, catalog", "the rest imported and built, catalog and tables loaded"),
    ("spark session started", "spark session started"),
    ("spark warmed up", "spark warmed up"),
    ("spark warm-up skipped", "spark warm-up skipped (rows waited: their write warms the JVM up)"),
    ("spark warm-up ended after", "spark warm-up ended between its writes (rows wait for a write)"),
    ("spark warm-up write cancelled", "spark warm-up write cancelled (a real write began)"),
    ("coordinator started", "coordinator started"),
    ("running (group", "worker running"),
    ("buffers full", "buffers full: partitions paused"),
    ("a backlog read to the ends", "backlog read to the partitions' ends: round requested (commit.catch-up)"),
    (" resumed ", "first partition resumed (group joined, partitions assigned and claimed)"),
)
#: Milestones listed once, at their first line.
_FIRST_ONLY: Final = frozenset({"first partition resumed (group joined, partitions assigned and claimed)"})
_TABLE_CREATED: Final = "created table"
#: More tables created, or committed in one round, than this are one line of the timeline.
_LISTED_TABLES: Final = 3


# ----------------------------------------------------------------------------- (b) icesink


@dataclass
class WorkerResult:
    total_s: float  # process start to the last row's commit, as the tables record it (CommittedRows)
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
    seen_s: float = 0.0  # process start to the poll that saw the last row committed
    timeline: list[str] = field(default_factory=list)
    # (seconds since process start, value) each time the value changed.
    consumed_curve: list[tuple[float, float]] = field(default_factory=list)
    committed_curve: list[tuple[float, float]] = field(default_factory=list)
    tables: int = 1
    buffer_max_bytes: int = 0
    driver_memory: str = ""
    freshness_ms: list[float] = field(default_factory=list)  # produce-to-committed, one per record
    produced_ms: list[float] = field(default_factory=list)  # each of those records' Kafka timestamp
    profile: list[tuple[str, int]] = field(default_factory=list)
    produced_until_wall: float | None = None  # --rate: when the producer finished (time.time())
    delivered: Any = None  # --rate: bench.rate_producer.Delivered
    age_curve: list[tuple[float, float]] = field(default_factory=list)  # --burst: (s, uncommitted age s)
    broker_cpu_s: float = 0.0  # the embedded broker's CPU from the worker's start to N rows
    harness_cpu_s: float = 0.0  # this process's (producer, polling, sampling) over the same time
    jvm_parts: dict[str, float] = field(default_factory=dict)  # the JVM's CPU by its threads (benchlib.jvm_thread_part)
    # the worker's and the broker's CPU at startup_s (the sampler's last sample then); None: no poll saw it
    startup_cpu_s: float | None = None


def bench_tables(catalog: Any) -> list[Any]:
    """The tables the worker wrote (one, or one per routed name with --tables)."""
    try:
        names = catalog.list_tables(NAMESPACE)
    except Exception:  # noqa: BLE001 - the namespace is auto-created with the first table
        return []
    return [catalog.load_table(n) for n in names]


def committed_rows(catalog: Any) -> int:
    total = 0
    for table in bench_tables(catalog):
        snapshot = table.current_snapshot()
        total += int(snapshot.summary["total-records"]) if snapshot else 0
    return total


class CommittedRows:
    """The rows committed to the benchmark's tables, polled while the worker runs: one read of
    the SQLite catalog's pointers (WAL mode: the worker's commits never wait for it), then the
    metadata file of each table whose pointer moved, read as plain JSON. :func:`committed_rows`
    loads every table through pyiceberg instead: at 200 tables of a dozen snapshots that takes
    a large share of a core, polled every 0.5 s, on the worker's two cores.

    :attr:`reached_wall` is when the tables' rows reached what the last call counted, as the
    tables themselves record it, not when a poll saw it (up to ``TABLE_POLL_S`` later): the
    latest, over the tables, of the commit that brought each to its current total-records."""

    def __init__(self, database: Path) -> None:
        self._database = database
        # metadata location -> the table's total-records, and when the table reached them
        self._rows: dict[str, tuple[int, float]] = {}
        self._current: dict[str, str] = {}  # table -> its metadata location
        self.reached_wall = 0.0

    def __call__(self) -> int:
        try:
            conn = sqlite3.connect(f"file:{self._database}?mode=ro", uri=True, timeout=5)
            try:
                pointers = conn.execute(
                    "SELECT table_name, metadata_location FROM iceberg_tables WHERE table_namespace = ?",
                    (NAMESPACE,)).fetchall()
            finally:
                conn.close()
        except sqlite3.OperationalError:  # no catalog table yet: nothing committed
            return 0
        for name, location in pointers:
            if location not in self._rows:
                self._rows[location] = _total_records(location)
            self._current[name] = location
        counted = [self._rows[location] for location in self._current.values()]
        self.reached_wall = max((at for _, at in counted), default=0.0)
        return sum(rows for rows, _ in counted)


def _total_records(metadata_location: str) -> tuple[int, float]:
    """A table's total-records at this metadata file, and when it reached them: the commit of
    the first snapshot that held that many rows (a later one, say a compaction's, replaced files
    without adding rows), timed by the write of the metadata file that added it, just before the
    catalog's pointer moved to it (that file's last-updated-ms is the snapshot's timestamp; this
    file or one its metadata log lists), else by the snapshot's own timestamp."""
    path = metadata_location.removeprefix("file://")
    with open(path) as f:
        metadata = json.load(f)
    snapshots = metadata.get("snapshots", ())
    current = next((s for s in snapshots if s["snapshot-id"] == metadata.get("current-snapshot-id")), None)
    if current is None:  # nothing committed: no time of its own among the tables'
        return 0, 0.0
    rows = int(current["summary"].get("total-records", 0))
    stamp = min(int(s["timestamp-ms"]) for s in snapshots if int(s["summary"].get("total-records", 0)) == rows)
    files = [(metadata_location, metadata.get("last-updated-ms"))]
    files += [(e["metadata-file"], e["timestamp-ms"]) for e in metadata.get("metadata-log", ())]
    for location, updated_ms in files:
        if updated_ms == stamp:
            try:
                return rows, os.stat(location.removeprefix("file://")).st_mtime
            except OSError:  # deleted since (write.metadata.delete-after-commit.enabled)
                break
    return rows, stamp / 1000


def routed(values: list[bytes], tables: int) -> list[bytes]:
    """Each pizza event with a route field naming one of ``tables`` tables, round robin."""
    return [v[:-1] + b',"%s":"%s.t%03d"}' % (ROUTE_FIELD.encode(), NAMESPACE.encode(), i % tables)
            for i, v in enumerate(values)]


def freshness_ms(tables: list[Any]) -> tuple[list[float], list[float]]:
    """Per committed row: the commit time of the snapshot that added it minus the record's
    Kafka timestamp (set by the producer when it sent the record), and that timestamp. Runs
    that measure it turn compaction off (run_worker): a compacted file is added by the
    compaction's snapshot."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out: list[float] = []
    produced: list[float] = []
    for table in tables:
        committed_at = {s.snapshot_id: s.timestamp_ms for s in table.snapshots()}
        entries = table.inspect.entries().to_pylist()
        for e in entries:
            path = e["data_file"]["file_path"]
            local = path.removeprefix("file://")
            ts = pq.read_table(local, columns=["_kafka_metadata_timestamp"])["_kafka_metadata_timestamp"]
            ms = pc.cast(ts, pa.int64()).to_numpy(zero_copy_only=False) / 1000.0  # us -> ms
            out.extend((committed_at[e["snapshot_id"]] - ms).tolist())
            produced.extend(ms.tolist())
    return out, produced


def run_worker(
    bootstrap: str, topic: str, n: int, directory: Path, timeout_s: float, broker_pid: int | None, *,
    tables: int = 1, buffer_max_bytes: int = 1 << 30, live: Any = None, profile: Path | None = None,
    interval_ms: int = 5000, extra: dict[str, str] | None = None, metrics_every_s: float = METRICS_POLL_S,
) -> WorkerResult:
    """``live``: a callable run in a thread once the worker is running (it produces the records
    while the worker consumes: --rate); ``profile``: py-spy output file of the worker's Python
    process (--profile)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet

    props = sqlite_catalog_properties(directory / "catalog")
    catalog = load_catalog("b2", **props)
    polled_rows = CommittedRows(directory / "catalog" / "catalog.db")
    config: dict[str, Any] = {
        "topics": topic,
        "iceberg.tables": TABLE,
        "iceberg.catalog": "b2",
        **{f"iceberg.catalog.{k}": v for k, v in props.items()},
        "iceberg.tables.auto-create-enabled": "true",
        "iceberg.control.topic": "bench-control",
        "iceberg.control.commit.interval-ms": interval_ms,
        "group.id": "bench",
        "bootstrap.servers": bootstrap,
        "state.dir": str(directory / "state"),
        "spark.master": "local[2]",
        "spark.driver.memory": "4g",
        "buffer.max-bytes": buffer_max_bytes,
    }
    if tables > 1:
        config.update({"iceberg.tables": "", "iceberg.tables.route-field": ROUTE_FIELD,
                       "iceberg.tables.dynamic-enabled": "true"})
    if live is not None:
        config["iceberg.tables.kafka-metadata-enabled"] = "true"
        # Freshness counts a row from the snapshot that added its file: a compacted file's rows
        # would count from the compaction (it does not change when they became visible).
        config["maintenance.compaction.min-input-files"] = 1_000_000
    config.update(extra or {})
    config_path = directory / "worker.json"
    config_path.write_text(json.dumps(config, indent=2))
    print(f"({ensure_class_archive(config_path)})", flush=True)
    # The worker imports icesink, agents... from the repository, wherever this is run from.
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    replicas = ReplicaSet(config_path, directory / "logs", env={"PYTHONPATH": pythonpath})
    sampler: RssSampler | None = None
    produced_until: list[float] = []

    delivered: list[Any] = []

    def produce_then_note() -> None:
        delivered.append(live())
        produced_until.append(time.time())

    try:
        system_began, broker_began, self_began = system_cpu_s(), process_cpu_s(broker_pid), _cpu_seconds()
        began, started_wall = time.monotonic(), time.time()
        replica = replicas.start("bench")
        sampler = RssSampler(replica.proc.pid).start()
        profiler = Profiler(replica.proc.pid, profile) if profile is not None else None
        producer: threading.Thread | None = None
        startup_s: float | None = None
        startup_cpu_s: float | None = None
        next_table_poll = next_metrics_poll = began
        next_progress = began + PROGRESS_EVERY_S
        rows = 0
        last_consumed: float | None = None
        consumed_curve: list[tuple[float, float]] = []
        committed_curve: list[tuple[float, float]] = []
        age_curve: list[tuple[float, float]] = []
        while True:
            replicas.check_alive()
            now = time.monotonic()
            if now - began > timeout_s:
                tail = replica.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"expected {n} committed rows within {timeout_s:.0f} s, "
                                   f"found {rows}. Worker log tail:\n{tail}")
            if live is not None and producer is None and "running (group" in replica.log_path.read_text(errors="replace"):
                producer = threading.Thread(target=produce_then_note, daemon=True)
                producer.start()
            consumed = None
            if now >= next_metrics_poll:
                # Every 0.2 s until the worker consumes (start-up ends there), then every 5 s, as
                # a Prometheus scrapes (15 s by default): a /metrics page of 200 tables costs the
                # worker noticeable CPU (see bench/README.md, ingest_bench --profile: the /metrics
                # stage).
                next_metrics_poll = now + (SAMPLE_EVERY_S if startup_s is None else metrics_every_s)
                consumed = metric_total(replica.metrics_port, "icesink_records_consumed_total")
                if metrics_every_s < METRICS_POLL_S and consumed:  # --burst
                    age = metric_total(replica.metrics_port, "icesink_uncommitted_age_seconds")
                    if age is not None:
                        age_curve.append((time.monotonic() - began, age))
            if consumed and (not consumed_curve or consumed != consumed_curve[-1][1]):
                at = time.monotonic() - began
                consumed_curve.append((at, consumed))
                if startup_s is None:
                    startup_s = at
                    startup_cpu_s = sum(c for _, c in sampler.cpu.values()) + process_cpu_s(broker_pid) - broker_began
            if consumed is not None:
                last_consumed = consumed
            if now >= next_progress:
                next_progress = now + PROGRESS_EVERY_S
                print(f"[{now - began:6.0f} s] worker: consumed {last_consumed or 0:,.0f}, committed {rows:,} of {n:,}",
                      file=sys.stderr, flush=True)
            if now >= next_table_poll:
                next_table_poll = now + TABLE_POLL_S
                rows = polled_rows()
                if rows and (not committed_curve or rows != committed_curve[-1][1]):
                    committed_curve.append((polled_rows.reached_wall - started_wall, rows))
                if rows >= n:
                    # when the tables say the last row was committed; seen_s: when this poll saw it
                    total_s, seen_s = polled_rows.reached_wall - started_wall, time.monotonic() - began
                    system_busy_s = system_cpu_s() - system_began
                    # The broker and this process's polling are part of the measured path.
                    broker_s = process_cpu_s(broker_pid) - broker_began
                    harness_s = broker_s + _cpu_seconds() - self_began
                    break
            time.sleep(SAMPLE_EVERY_S)
        sampler.sample(threads=True)
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
                "icesink_early_commit_requests_total",
            )
        }
        sampler.stop()
        if profiler is not None:
            profiler.stop()
        cpu_by_name: dict[str, float] = {}
        for name, seconds in sampler.cpu.values():
            cpu_by_name[name] = cpu_by_name.get(name, 0.0) + seconds
        interference = Interference(seen_s, system_busy_s, sum(cpu_by_name.values()) + harness_s)
        replicas.stop_all()
    finally:
        if sampler is not None:
            sampler.stop()
        replicas.stop_all()
    if startup_s is None:  # all rows committed between two metric polls
        startup_s = total_s

    written = bench_tables(catalog)
    ids = pa.concat_arrays([c for t in written for c in t.scan(selected_fields=("order_id",)).to_arrow()["order_id"].chunks])
    return WorkerResult(
        total_s=total_s,
        seen_s=seen_s,
        startup_s=startup_s,
        ingest_s=total_s - startup_s,
        rows_at_end=rows,
        peak_tree_bytes=sampler.peak_tree_bytes,
        peak_tree_procs=sampler.peak_tree_procs,
        hwm_kib=sampler.hwm_kib,
        files=sum(t.inspect.files().num_rows for t in written),
        snapshots=sum(len(t.snapshots()) for t in written),
        table_rows=committed_rows(catalog),
        distinct_order_ids=pc.count_distinct(ids).as_py(),
        metrics=metrics,
        cpu_by_name=cpu_by_name,
        jvm_parts=sampler.jvm_parts(),
        startup_cpu_s=startup_cpu_s,
        interference=interference,
        broker_cpu_s=broker_s,
        harness_cpu_s=harness_s - broker_s,
        log_path=replica.log_path,
        started_wall=started_wall,
        timeline=worker_timeline(replica.log_path, started_wall, consumed_at=startup_s),
        consumed_curve=consumed_curve,
        committed_curve=committed_curve,
        tables=len(written),
        buffer_max_bytes=buffer_max_bytes,
        driver_memory=str(config["spark.driver.memory"]),
        **(dict(zip(("freshness_ms", "produced_ms"), freshness_ms(written), strict=True)) if live is not None else {}),
        profile=profiler.breakdown() if profiler is not None else [],
        produced_until_wall=produced_until[0] if produced_until else None,
        delivered=delivered[0] if delivered else None,
        age_curve=age_curve,
    )


def first_reaching(curve: list[tuple[float, float]], level: float) -> str:
    """Seconds at which ``curve`` first reached ``level``, or "-"."""
    return next((f"{at:.1f}" for at, value in curve if value >= level), "-")


def commit_walls(log_path: Path) -> list[tuple[float, float, int, float, float]]:
    """Per round with rows: its Spark write (s), then the seconds from the worker's answer (the
    write done and the response sent) to the coordinator's last table commit of that round (all
    tables of the round, in parallel), its files, the seconds the response took to send (0 if
    the worker does not log it), and the wall-clock time of the answer."""
    answered: dict[str, tuple[float, float, int, float]] = {}
    last: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if (m := _ROUND_ANSWERED.search(line)) is not None and int(m["rows"]):
            answered[m["round"]] = (stamp, float(m["write_s"] or "nan"), int(m["files"]), float(m["send_s"] or 0))
        elif (m := _ROUND_COMMITTED.search(line)) is not None:
            last[m["round"]] = stamp
    return [(write_s, last[r] - at, files, send_s, at)
            for r, (at, write_s, files, send_s) in answered.items() if r in last]


def warm_rounds_note(walls: list[tuple[float, float, int, float, float]], produced_until: float | None) -> list[str]:
    """With --rate: the median round of the later half of the rounds answered while records were
    still produced. A fresh JVM compiles its write path over its first writes (a 200-file write
    settles only after a dozen or so: bench/README.md, spark_write_bench),
    so a short run's rounds are mostly warm-up; a worker runs for days. Rounds answered after
    the producer stopped share the machine with less and are left out."""
    if produced_until is None:
        return []
    live = [w for w in walls if w[4] <= produced_until]
    warm = live[len(live) // 2:]
    if len(warm) < 2:
        return [f"    median round of the later half while producing: too few rounds ({len(live)} while producing)"]
    return [f"    median round of the later half while producing ({len(warm)} of {len(live)} rounds): "
            f"{statistics.median(w[0] + w[3] + w[1] for w in warm):.2f} s "
            f"(write {statistics.median(w[0] for w in warm):.2f} s, "
            f"commits {statistics.median(w[1] for w in warm):.2f} s)"]


def worker_timeline(log_path: Path, started_wall: float, shown_rounds: int = 4,
                    consumed_at: float | None = None) -> list[str]:
    """Milestones and commit rounds from the worker's log, in seconds since process start
    (``consumed_at``: when its metrics first counted a consumed record, listed among them).

    The first ``shown_rounds`` answered rounds and the last two are listed; the ones between
    are summarised (count, rows per round, seconds between answers). With many tables (--tables)
    their creation is one line, and so are each round's table commits."""
    milestones: list[tuple[float, str]] = []
    rounds: list[tuple[float, str]] = []  # answered rounds
    answered: list[tuple[float, int]] = []
    commits = 0
    early_rows: list[int] = []
    created: list[float] = []
    committed: dict[str, list[tuple[float, int, int]]] = {}  # round -> (at, rows, files) of each table commit
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        at = stamp - started_wall
        if (m := _ROUND_ANSWERED.search(line)) is not None:
            gap = f" (+{at - answered[-1][0]:5.1f} s)" if answered else ""
            waited = f", taken {float(m['wait_s']):.2f} s after it came" if m["wait_s"] and float(m["wait_s"]) >= 0.05 else ""
            answered.append((at, int(m["rows"])))
            rounds.append((at, f"answered round {m['round'][:8]}: {int(m['rows']):>9,} rows "
                               f"in {m['files']} files{gap}{waited}"))
        elif (m := _EARLY_WRITE.search(line)) is not None:
            early_rows.append(int(m["rows"]))
            rounds.append((at, f"early write: {int(m['rows']):>9,} rows in {m['files']} files, "
                               f"{float(m['s']):.2f} s{' (void)' if m['void'] else ''}"))
        elif (m := _ROUND_COMMITTED.search(line)) is not None:
            commits += 1
            committed.setdefault(m["round"], []).append((at, int(m["rows"]), int(m["files"])))
        elif _TABLE_CREATED in line:
            created.append(at)
        else:
            for needle, label in _MILESTONES:
                if needle in line:
                    if label not in _FIRST_ONLY or all(label != m[1] for m in milestones):
                        milestones.append((at, label))
                    break
    if consumed_at is not None:
        milestones.append((consumed_at, "first record consumed (icesink_records_consumed_total > 0)"))
    if len(created) > _LISTED_TABLES:
        milestones.append((created[0], f"{len(created)} tables auto-created, the last at {created[-1]:.1f} s"))
    else:
        milestones += [(at, "table auto-created") for at in created]
    for round_id, tables in committed.items():
        if len(tables) > _LISTED_TABLES:
            rounds.append((tables[0][0], f"committed round {round_id[:8]} to {len(tables)} tables, the last at "
                                         f"{tables[-1][0]:.1f} s: {sum(t[1] for t in tables):>8,} rows, "
                                         f"{sum(t[2] for t in tables)} files"))
        else:
            rounds += [(at, f"committed round {round_id[:8]}: {rows:>8,} rows, {files} files")
                       for at, rows, files in tables]
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
    out.append(f"            {len(answered)} rounds answered, {commits} round commits logged, "
               f"{len(early_rows)} early writes ({sum(early_rows):,} rows)")
    return out


# ----------------------------------------------------------------------------- report


def ratio(b: float, a: float | None) -> str:
    return f"{b / a:.3f}" if a else "-"


def steady_rate(committed: list[tuple[float, float]], n: int) -> tuple[float, float, float] | None:
    """(records/s, from s, to s) from the first committed round to the last row: the rows
    committed after the first round over the time they took."""
    if len(committed) < 2:
        return None
    (t0, r0), (t1, r1) = committed[0], next(((t, r) for t, r in committed if r >= n), committed[-1])
    return ((r1 - r0) / (t1 - t0), t0, t1) if t1 > t0 else None


def steady_note(committed: list[tuple[float, float]], n: int) -> list[str]:
    """The footnote of :func:`steady_rate`'s figure, or why there is none."""
    steady = steady_rate(committed, n)
    if steady:
        return [f"** (b): rows committed after the first committed round ({steady[1]:.1f} s) until the table held",
                f"   N rows ({steady[2]:.1f} s), over that time: the issue's measure of a worker's rate."]
    if committed and committed[0][1] >= n:
        return [f"** (b): no figure: the first committed round ({committed[0][0]:.1f} s) held all N rows, and the",
                "   measure counts the rows committed after it."]
    return []


def cpu_floor(work_cpu_s: float, cpus: int, total_s: float, *, startup: tuple[float, float] | None = None,
              baseline_rate: float | None = None, n: int = 0) -> list[str]:
    """What the cores allow: the earliest the run could have ended with the CPU it used (the
    worker's and the broker's, over the machine's CPUs) against when it ended; with ``startup``
    (seconds to the first record consumed, the CPU used by then) the same for the time from the
    first record to the last row, and so the most records/s that work allows on that measure
    (issue 42's target 3); with a baseline, when 0.8 of the baseline's rate from process start
    (target 2) asks for the last row. No schedule of the same work on these cores beats a floor."""
    floor = work_cpu_s / cpus
    out = [f"  The floor on these {cpus} CPUs: {work_cpu_s:.1f} CPU-s of worker and broker / {cpus} = {floor:.1f} s; "
           f"the last row came at {total_s:.1f} s (the cores {floor / total_s:.0%} busy with them)."]
    if startup is not None and n and total_s > startup[0]:
        at, used = startup
        after = max(0.0, work_cpu_s - used) / cpus
        out.append(f"    after the first record ({at:.1f} s): {work_cpu_s - used:.1f} CPU-s / {cpus} = {after:.1f} s of "
                   f"the {total_s - at:.1f} s it took; at most {fmt_int(n / after) if after else '-'} records/s "
                   "from first record to last row with this work.")
    if baseline_rate and n:
        line = n / (0.8 * baseline_rate)
        out.append(f"  0.8 of the baseline's rate from process start asks for the last row by {line:.1f} s: "
                   + ("the floor alone is later." if floor > line else f"{line - floor:.1f} s above the floor."))
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_report(n: int, produce_s: float, a: BaselineResult | None, b: WorkerResult) -> bool:
    """Prints the comparison; returns False if a table does not hold exactly N distinct rows."""
    a_rate = n / a.total_s if a else None
    b_rate_ingest = n / b.ingest_s if b.ingest_s > 0 else float("inf")
    b_rate_total = n / b.total_s
    steady = steady_rate(b.committed_curve, n)
    rows: list[tuple[str, str, str, str]] = [
        ("", "(a) baseline", "(b) icesink", "(b)/(a)"),
        ("records/s, first committed round to last row **", fmt_int(a_rate) if a_rate else "-",
         fmt_int(steady[0]) if steady else "-", ratio(steady[0], a_rate) if steady else "-"),
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
    if b.delivered is not None and b.delivered.asked_rate >= 1e12:  # --burst: no rate asked
        d = b.delivered
        print(f"burst produced while the worker ran: {d.records:,} records acknowledged in {d.seconds:.1f} s "
              f"({d.rate:,.0f} records/s)" + (f"; {len(d.failed)} delivery errors, e.g. {d.failed[0]}" if d.failed else ""))
    elif b.delivered is not None:  # --rate: what the producer delivered, not what was asked
        print(f"produced while the worker ran: {b.delivered.line()}")
    else:
        print(f"produced {n:,} records in {produce_s:.1f} s ({fmt_int(n / produce_s)} records/s)")
    print()
    for r in rows:
        print(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}")
    print()
    for line in steady_note(b.committed_curve, n):
        print(line)
    print("* (a) has no startup: its records/s is always N / (read + parse + write + commit).")
    print("  (b) ingest time = total - startup; startup = worker process start until its")
    print("  icesink_records_consumed_total is first > 0.")
    print("  Peak RSS: (a) VmHWM of the baseline process; (b) peak of the summed RSS of the worker")
    print(f"  and its descendants ({b.peak_tree_procs} processes at the peak, the Spark JVM included),")
    print(f"  sampled every {SAMPLE_EVERY_S} s.")
    print("  CPU: (a) the timed phases; (b) the worker's process tree from start to N rows: " + ", ".join(
        f"{name} {seconds:.1f} s" for name, seconds in sorted(b.cpu_by_name.items(), key=lambda x: -x[1])
        if seconds >= 0.05))
    if b.jvm_parts:  # a thread's CPU after its last sample is not counted
        print(f"  The JVM's threads (from /proc every {SAMPLE_EVERY_S * THREADS_EVERY:.1f} s): " + ", ".join(
            f"{part} {seconds:.1f} s" for part, seconds in b.jvm_parts.items() if seconds >= 0.05))
    print(f"  Beside it on the same cores: the broker {b.broker_cpu_s:.1f} CPU-s, this process (producer, "
          f"polling) {b.harness_cpu_s:.1f} CPU-s.")
    startup = (b.startup_s, b.startup_cpu_s) if b.startup_cpu_s is not None else None
    for line in cpu_floor(sum(b.cpu_by_name.values()) + b.broker_cpu_s, available_cpus(), b.total_s,
                          startup=startup, baseline_rate=a_rate, n=n):
        print(line)
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
    python_s = sum(v for k, v in b.cpu_by_name.items() if k.startswith("python"))
    java_s = sum(v for k, v in b.cpu_by_name.items() if k.startswith("java"))
    print()
    print(f"(b) CPU per record: Python {python_s / n * 1e6:.1f} us/record, JVM {java_s / n * 1e6:.1f} us/row "
          "(whole run: JVM start and warm-up included)")
    if b.tables > 1:
        print(f"    records routed round robin to {b.tables} dynamic tables (--tables)")
    bound = b.buffer_max_bytes / MIB
    print(f"    memory: peak RSS {b.peak_tree_bytes / MIB:.0f} MiB (Python VmHWM {b.hwm_kib / 1024:.0f} MiB) against "
          f"buffer.max-bytes {bound:.0f} MiB + spark.driver.memory {b.driver_memory}")
    if b.freshness_ms:
        f = b.freshness_ms
        print(f"    freshness, produce to committed (record timestamp to its snapshot's commit), {len(f):,} rows: "
              f"p50 {percentile(f, 0.5) / 1000:.2f} s, p99 {percentile(f, 0.99) / 1000:.2f} s, "
              f"max {max(f) / 1000:.2f} s")
        # The steady state: records produced in the later half of the production, long after
        # the worker's start-up (whose backlog the figures above include).
        first, last = min(b.produced_ms), max(b.produced_ms)
        late = [x for x, at in zip(f, b.produced_ms, strict=True) if at >= (first + last) / 2]
        if late:
            print(f"      of the {len(late):,} rows produced in the later half of the production: "
                  f"p50 {percentile(late, 0.5) / 1000:.2f} s, p99 {percentile(late, 0.99) / 1000:.2f} s, "
                  f"max {max(late) / 1000:.2f} s")
    if b.age_curve:
        peak_at, peak = max(b.age_curve, key=lambda x: x[1])
        print(f"    oldest buffered record's age (icesink_uncommitted_age_seconds, polled every second, "
              f"{len(b.age_curve)} samples): max {peak:.1f} s at {peak_at:.0f} s; every 5th sample (s since "
              f"process start: age s): " + ", ".join(f"{t:.0f}:{a:.1f}" for t, a in b.age_curve[::5]))
    if b.profile:
        total = sum(c for _, c in b.profile)
        print(f"    profile of the worker's Python process (py-spy, busy samples of all threads, {total:,} samples):")
        for stage, count in b.profile:
            print(f"      {count / total:6.1%}  {stage}")
    m = b.metrics
    print()
    print(f"(b) worker metrics at N rows: consumed {m['icesink_records_consumed_total']:,.0f}, "
          f"rounds committed {m['icesink_rounds_committed_total']:.0f}, "
          f"files written {m['icesink_files_written_total']:.0f}, "
          f"early round requests {m['icesink_early_commit_requests_total']:.0f} (full buffers, commit.max-records/-bytes, idle)")
    print(f"    Spark writes {m['icesink_write_duration_seconds_count']:.0f}, "
          f"{m['icesink_write_duration_seconds_sum']:.1f} s in all; "
          f"table commits {m['icesink_commit_duration_seconds_count']:.0f}, "
          f"{m['icesink_commit_duration_seconds_sum']:.1f} s in all")
    walls = commit_walls(b.log_path)
    if walls:
        write_s, commit_s = (sum(w[i] for w in walls) / len(walls) for i in (0, 1))
        print(f"    a round with rows: Spark write {write_s:.2f} s on average, then its table commits "
              f"{commit_s:.2f} s on average (answer to last commit), {write_s + commit_s:.2f} s in all "
              f"({len(walls)} rounds of {', '.join(str(w[2]) for w in walls)} files)")
        print(f"    each round, write + answer + commits (s): "
              f"{', '.join(f'{w[0]:.2f}+{w[3]:.2f}+{w[1]:.2f}' for w in walls)}")
        if len(walls) > 2:  # the first rounds also compile the JVM's write path for what they write
            print(f"    median round after the first: {statistics.median(w[0] + w[3] + w[1] for w in walls[1:]):.2f} s "
                  f"(write {statistics.median(w[0] for w in walls[1:]):.2f} s, "
                  f"answer {statistics.median(w[3] for w in walls[1:]):.2f} s, "
                  f"commits {statistics.median(w[1] for w in walls[1:]):.2f} s; "
                  f"write + commits {statistics.median(w[0] + w[1] for w in walls[1:]):.2f} s)")
        for line in warm_rounds_note(walls, b.produced_until_wall):
            print(line)
    levels = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
    print("    progress, seconds since process start (consumed: icesink_records_consumed_total,")
    print("    polled every 0.2 s until it is > 0, then every 5 s; committed: the table's total-records, "
          "polled every 0.5 s, at the commit times the tables record):")
    print(f"      {'':<9}" + "".join(f"{f'{level:.0%} of N':>10}" for level in levels))
    for label, curve in (("consumed", b.consumed_curve), ("committed", b.committed_curve)):
        print(f"      {label:<9}" + "".join(f"{first_reaching(curve, level * n):>10}" for level in levels))
    print(f"    timeline from the worker log ({b.log_path.name}), seconds since process start:")
    for line in b.timeline:
        print(f"    {line}")
    print(f"    {b.total_s:7.1f} s  {b.rows_at_end:,} rows committed (the tables' last commit; this benchmark's poll "
          f"saw it at {b.seen_s:.1f} s)")

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
    parser.add_argument("--tables", type=int, default=1,
                        help="route the records round robin to this many dynamic tables (default 1)")
    parser.add_argument("--rate", type=float, default=None,
                        help="produce at this many records/s while the worker runs, for --duration s, "
                             "and print produce-to-committed freshness (no baseline)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of --rate (default 60)")
    parser.add_argument("--buffer-max-bytes", type=int, default=1 << 30,
                        help="the worker's buffer.max-bytes (default 1 GiB)")
    parser.add_argument("--interval-ms", type=int, default=5000,
                        help="the worker's commit interval (default 5000); a long one puts a whole small "
                             "backlog in one round, to compare rounds of the same rows (--tables)")
    parser.add_argument("--profile", action="store_true",
                        help="profile the worker's Python process with py-spy and print where its time goes")
    parser.add_argument("--linger-ms", type=int, default=50,
                        help="with --rate: the producer's linger.ms (default 50). The embedded broker's CPU "
                             "grows with the record batches a partition holds: at 5 ms it took up to a core "
                             "of the two by the end of a two-minute run (bench/README.md)")
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu",
                        help="the embedded Tansu broker (default) or Apache Kafka (tests/support/kafka_broker.py, "
                             "fetched once into the cache): Tansu holds a new group's JoinGroup for half the "
                             "session timeout, so start-up figures (issue 42 targets 1-2) differ")
    parser.add_argument("--format", choices=("json", "avro", "protobuf", "json-schema"), default="json",
                        help="the events' format: JSON (default) or framed for a real schema registry the bench "
                             "starts (bench/pizza_formats.py); the baseline reads JSON only, so it is skipped")
    parser.add_argument("--burst", action="store_true",
                        help="start the worker on an empty topic, let it idle --burst-idle-s, then produce the "
                             "--records at once; prints freshness and the oldest buffered record's age (no baseline)")
    parser.add_argument("--burst-idle-s", type=float, default=10.0, help="with --burst: idle seconds before it")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra worker setting, e.g. spark.driver.extraJavaOptions=... (repeatable)")
    parser.add_argument("--broker-set", action="append", default=[], metavar="KEY=VALUE",
                        help="with --broker kafka: a broker setting over the tests' own, e.g. "
                             "group.initial.rebalance.delay.ms=3000, Kafka's default (the tests' broker sets 0) "
                             "(repeatable)")
    args = parser.parse_args()
    for flag, items in (("--set", args.set), ("--broker-set", args.broker_set)):
        if bad := [item for item in items if "=" not in item]:
            parser.error(f"{flag}: expected KEY=VALUE, found {bad[0]!r}")
    if args.broker_set and args.broker != "kafka":
        parser.error("--broker-set: only with --broker kafka (the embedded broker takes no settings)")
    extra = dict(item.split("=", 1) for item in args.set)
    if args.format != "json" and args.tables > 1:
        parser.error("--format: a registry format with --tables > 1 (a JSON route field) is not supported")
    n: int = int(args.rate * args.duration) if args.rate else args.records
    if n < 1 or args.partitions < 1:
        parser.error(f"--records and --partitions: expected >= 1, found {n} and {args.partitions}")

    # SIGTERM unwinds like Ctrl-C, so the worker, the broker and the temp dir are cleaned up.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    print("command:", shlex.join([os.path.relpath(sys.executable), *sys.argv]))
    print(f"N = {n:,} pizza events ({args.format}), {args.partitions} partitions, {available_cpus()} CPUs, "
          f"broker: {'Apache Kafka' if args.broker == 'kafka' else 'embedded Tansu'}")
    sys.stdout.flush()

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce

    tmp = Path(tempfile.mkdtemp(prefix="icesink-bench-"))
    # Tables, catalog and Spark's staging live under it: a slow file system there shows in
    # every many-table figure (benchlib.file_create_us), so say how fast it is.
    print(f"creating a file in {tmp.parent}: {file_create_us(tmp):.0f} us (median of 300; TMPDIR moves it)")
    broker: Any = EmbeddedBroker(tmp / "broker")
    if args.broker == "kafka":
        from tests.support.kafka_broker import KafkaBroker

        broker = KafkaBroker(tmp / "kafka", heap="1g", quick_start=False,  # full JIT, as versus_reference
                             settings=dict(item.split("=", 1) for item in args.broker_set))
        extra = {"iceberg.control.topic.replication-factor": "1", **extra}  # one broker
    registry: Any = None
    try:
        broker.start()
        asyncio.run(ensure_topic(broker.bootstrap, TOPIC, args.partitions))
        values = pizza_values(n, seed=SEED, spread_days=SPREAD_DAYS)
        if args.format != "json":
            from bench.pizza_formats import encode
            from tests.support.schema_registry import SchemaRegistry

            registry = SchemaRegistry(tmp / "registry")
            registry.start()
            values, settings = encode(values, args.format, registry, TOPIC)
            extra = {**settings, **extra}
            args.skip_baseline = True  # the baseline reads JSON
        if args.tables > 1:
            values = routed(values, args.tables)
        live: Any = None
        if args.rate:
            live = lambda: produce_at_rate(  # noqa: E731
                broker.bootstrap, TOPIC, values, partitions=args.partitions, rate=args.rate, linger_ms=args.linger_ms)
            produce_s = args.duration
        elif args.burst:
            def live() -> Any:  # idle, then everything at once (the rate producer with no limit to speak of)
                time.sleep(args.burst_idle_s)
                return produce_at_rate(broker.bootstrap, TOPIC, values, partitions=args.partitions, rate=1e12,
                                       linger_ms=args.linger_ms)
            produce_s = 0.0
        else:
            began = time.monotonic()
            asyncio.run(produce(broker.bootstrap, TOPIC, values, partitions=args.partitions))
            produce_s = time.monotonic() - began
            del values
        counts = per_partition_counts(n, args.partitions)

        baseline = None
        if not (args.skip_baseline or args.rate or args.burst):
            baseline = baseline_in_child(broker.bootstrap, TOPIC, counts, tmp / "baseline", broker.pid)
        worker = run_worker(broker.bootstrap, TOPIC, n, tmp / "worker", args.timeout_s, broker.pid,
                            tables=args.tables, buffer_max_bytes=args.buffer_max_bytes, live=live,
                            interval_ms=args.interval_ms, extra=extra,
                            metrics_every_s=1.0 if args.burst else METRICS_POLL_S,
                            profile=tmp / "profile.txt" if args.profile else None)
        ok = print_report(n, produce_s, baseline, worker)
    finally:
        if registry is not None:
            registry.stop()
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
