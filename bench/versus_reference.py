"""icesink side by side with the reference sink it is a drop-in for: the Apache Iceberg Kafka
Connect sink in a Kafka Connect worker.

    .venv/bin/python bench/versus_reference.py [--records 1000000] [--partitions 6] [--tables 200]
        [--interval-ms 10000] [--modes one,many] [--reference-tasks 1,2] [--skip-reference]
        [--skip-icesink] [--set KEY=VALUE] [--profile] [--timeout-s S] [--keep]

A benchmark command, not a test: it prints figures and asserts nothing about time (its exit
code is 1 if a table does not hold exactly the records produced). One real Apache Kafka broker
(tests/support/kafka_broker.py, full JIT) and one PostgreSQL server (tests/support/postgres.py)
serve every run. ``N`` pizza events (icesink/app/pizzas.py), each with a field ``tbl`` naming one
of ``--tables`` tables round robin (``bench.t000``...), are produced ONCE to one topic of
``--partitions`` partitions before any sink starts. Then, one at a time, each sink reads the
whole topic from the beginning with its own consumer group, control topic and catalog name:

- the reference, ``--reference-tasks`` 1 and 2: a standalone Kafka Connect worker
  (tests/support/kafka_connect.py: Connect 4.3 with Iceberg 1.12's sink, Kafka's
  ``connect-standalone.sh`` JVM options: 2 GB heap, G1) with ``tasks.max`` 1 or 2, schemaless
  JSON, auto-created tables, Iceberg's JDBC catalog;
- icesink: one replica (``python -m icesink worker``, ``local[2]`` Spark with 4g of driver
  memory, a 1 GiB buffer, as bench/ingest_bench.py runs it), pyiceberg's SQL catalog.

Both catalogs are the same PostgreSQL database (tables ``iceberg_tables`` and
``iceberg_namespace_properties``, created by pyiceberg first: its v1 layout, which the JDBC
catalog finds and uses), told apart by the catalog name; both commit every ``--interval-ms``
(``iceberg.control.commit.interval-ms``, default 10 s). Mode ``one`` writes every record to
``bench.pizzas``; mode ``many`` routes each to the table its ``tbl`` names
(``iceberg.tables.dynamic-enabled``, ``iceberg.tables.route-field=tbl``): ``--tables`` tables.

For each run it prints: records/s from the sink's launch to the last row committed, and from
the first record consumed (icesink: its ``icesink_records_consumed_total`` first above 0, polled
every 0.2 s; the reference: its consumer's first ``Resetting offset`` log line, which precedes
its first fetch) to the last row; the time to the first commit; CPU seconds of the sink's
processes (the JVM; icesink's Python and Spark JVM) per record; their peak summed RSS (sampled
every 0.2 s); data files and snapshots of its tables; and an exact check of every table (the
row count and the set of ``order_id`` read back with pyiceberg, per table, against what was
produced). The broker's and PostgreSQL's CPU, and other processes' on the machine, are printed
beside each run. Everything lives in a temporary directory removed at the end (``--keep`` keeps
it: the Connect and worker logs).
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
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol

ROOT: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.benchlib import (  # noqa: E402
    MIB, SAMPLE_EVERY_S, Interference, ensure_class_archive, Profiler, RssSampler, _cpu_seconds, descendants, metric_total,
    process_cpu_s, system_cpu_s,
)
from bench.ingest_bench import NAMESPACE, ROUTE_FIELD, SEED, SPREAD_DAYS, routed  # noqa: E402

TOPIC: Final = "versus-pizzas"
ONE_TABLE: Final = f"{NAMESPACE}.pizzas"
MODES: Final = ("one", "many")
TABLE_POLL_S: Final = 0.5
PROGRESS_EVERY_S: Final = 30.0
_CONNECT_STAMP: Final = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


# ----------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="pizza events produced once (default 1M)")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the topic (default 6)")
    parser.add_argument("--tables", type=int, default=200, help="tables of mode 'many' (default 200)")
    parser.add_argument("--interval-ms", type=int, default=10_000,
                        help="iceberg.control.commit.interval-ms of both sinks (default 10000)")
    parser.add_argument("--modes", default="one,many", help="'one' table, 'many' tables, or both (default one,many)")
    parser.add_argument("--reference-tasks", default="1,2", help="the reference's tasks.max, one run each (default 1,2)")
    parser.add_argument("--skip-reference", action="store_true", help="run icesink only")
    parser.add_argument("--skip-icesink", action="store_true", help="run the reference only")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra icesink worker setting, e.g. spark.driver.memory=1g (repeatable)")
    parser.add_argument("--profile", action="store_true",
                        help="sample icesink's Python process with py-spy and print where its time goes")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="give up on a run after this (default 1800)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and print its path")
    args = parser.parse_args(argv)
    args.modes = _choices(parser, "--modes", args.modes, MODES)
    try:
        args.reference_tasks = [int(t) for t in args.reference_tasks.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--reference-tasks: expected comma-separated integers, found {args.reference_tasks!r}")
    if not args.reference_tasks or min(args.reference_tasks) < 1:
        parser.error(f"--reference-tasks: expected integers >= 1, found {args.reference_tasks}")
    for name in ("records", "partitions", "tables", "interval_ms"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected >= 1, found {getattr(args, name)}")
    if "many" in args.modes and args.tables < 2:
        parser.error(f"--tables: mode 'many' needs at least 2 tables, found {args.tables}")
    if args.skip_reference and args.skip_icesink:
        parser.error("--skip-reference and --skip-icesink: nothing would run")
    if bad := [item for item in args.set if "=" not in item]:
        parser.error(f"--set: expected KEY=VALUE, found {bad[0]!r}")
    args.extra = dict(item.split("=", 1) for item in args.set)
    return args


def _choices(parser: argparse.ArgumentParser, flag: str, text: str, allowed: tuple[str, ...]) -> list[str]:
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    if not chosen or any(m not in allowed for m in chosen):
        parser.error(f"{flag}: expected some of {', '.join(allowed)}, found {text!r}")
    return chosen


# ----------------------------------------------------------------------------- results


@dataclass
class RunResult:
    label: str
    mode: str  # "one" or "many"
    records: int
    total_s: float  # launch to the last row committed
    consumed_s: float | None  # launch to the first record consumed
    first_commit_s: float | None  # launch to the first rows committed
    cpu_by_name: dict[str, float]
    peak_rss_bytes: int
    peak_procs: int
    tables: int
    files: int
    snapshots: int
    problem: str | None  # None: every table exact
    broker_cpu_s: float = 0.0
    catalog_cpu_s: float = 0.0
    interference: Interference | None = None
    profile: list[tuple[str, int]] = field(default_factory=list)
    log_path: Path | None = None
    load: tuple[float, float] = (0.0, 0.0)  # the 1-minute load average at launch and at the last row

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu_by_name.values())

    @property
    def rate_total(self) -> float:
        return self.records / self.total_s

    @property
    def rate_ingest(self) -> float | None:
        if self.consumed_s is None or self.total_s <= self.consumed_s:
            return None
        return self.records / (self.total_s - self.consumed_s)


def _num(value: float | None, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def result_table(results: list[RunResult]) -> str:
    """One column per run, one row per figure (a Markdown table: bench/README.md takes it as is)."""
    rows: list[tuple[str, list[str]]] = [
        ("records/s, launch to last row committed", [_num(r.rate_total) for r in results]),
        ("records/s, first record consumed to last row", [_num(r.rate_ingest) for r in results]),
        ("launch to first record consumed (s)", [_num(r.consumed_s, ".1f") for r in results]),
        ("launch to first commit (s)", [_num(r.first_commit_s, ".1f") for r in results]),
        ("launch to last row committed (s)", [_num(r.total_s, ".1f") for r in results]),
        ("CPU of the sink's processes (s)", [_num(r.cpu_s, ".1f") for r in results]),
        ("CPU per record (us)", [_num(r.cpu_s / r.records * 1e6, ".1f") for r in results]),
        ("peak RSS, all its processes (MiB)", [_num(r.peak_rss_bytes / MIB) for r in results]),
        ("tables / data files / snapshots", [f"{r.tables} / {r.files:,} / {r.snapshots:,}" for r in results]),
        ("every table exact (count and order_id set)", ["yes" if r.problem is None else "NO" for r in results]),
        ("load average (1 min) at launch / at last row", [f"{r.load[0]:.1f} / {r.load[1]:.1f}" for r in results]),
    ]
    header = ["", *(r.label for r in results)]
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * len(results)]
    lines += ["| " + " | ".join([name, *cells]) + " |" for name, cells in rows]
    return "\n".join(lines)


def ratio_lines(results: list[RunResult]) -> list[str]:
    """icesink's records/s over each reference run's, on both measures."""
    out = []
    for ice in (r for r in results if r.label.startswith("icesink")):
        for ref in (r for r in results if r.label.startswith("reference")):
            ingest = (f"{ice.rate_ingest / ref.rate_ingest:.2f}x" if ice.rate_ingest and ref.rate_ingest else "-")
            out.append(f"{ice.label} / {ref.label}: {ice.rate_total / ref.rate_total:.2f}x launch to last row, "
                       f"{ingest} first consumed to last row; peak RSS {ice.peak_rss_bytes / ref.peak_rss_bytes:.2f}x")
    return out


def print_results(mode: str, n: int, tables: int, results: list[RunResult]) -> None:
    what = f"1 table ({ONE_TABLE})" if mode == "one" else f"{tables} tables by dynamic routing"
    print(f"\n## {n:,} records, {what}\n")
    print(result_table(results))
    print()
    for line in ratio_lines(results):
        print(line)
    for r in results:
        print(f"{r.label}: CPU " + ", ".join(f"{name} {s:.1f} s" for name, s in sorted(r.cpu_by_name.items(),
                                                                                        key=lambda x: -x[1]) if s >= 0.05)
              + f"; beside it the broker {r.broker_cpu_s:.1f} CPU-s, PostgreSQL {r.catalog_cpu_s:.1f} CPU-s")
        if r.interference is not None:
            print(f"  {r.interference.describe()}")
        if r.problem is not None:
            print(f"  CHECK FAILED: {r.problem}")
        if r.profile:
            total = sum(c for _, c in r.profile)
            print(f"  profile of icesink's Python process (py-spy, busy samples of all threads, {total:,}):")
            for stage, count in r.profile:
                print(f"    {count / total:6.1%}  {stage}")


# ----------------------------------------------------------------------------- the catalog


def postgres_cpu_s(data_dir: Path) -> float:
    """CPU seconds of the PostgreSQL server: the postmaster, its live processes and the children
    it has reaped (cutime + cstime), from /proc."""
    try:
        postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
        with open(f"/proc/{postmaster}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return 0.0
    reaped = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    return reaped + sum(process_cpu_s(pid) for pid in descendants(postmaster))


class CommittedRows:
    """Rows committed to one catalog's ``bench`` tables, polled while a sink runs: one query of
    the catalog's pointers, then the metadata file of each table whose pointer moved, read as
    plain JSON (no pyiceberg, to keep the poll off the measured cores). Hadoop writes
    ``file:/path``, pyiceberg ``file:///path``: both are read."""

    def __init__(self, dsn: str, catalog: str) -> None:
        import psycopg2

        self._conn = psycopg2.connect(dsn)
        self._conn.autocommit = True
        self._catalog = catalog
        self._rows: dict[str, int] = {}
        self.current: dict[str, str] = {}  # table -> metadata location

    def __call__(self) -> int:
        with self._conn.cursor() as cur:
            cur.execute("SELECT table_name, metadata_location FROM iceberg_tables "
                        "WHERE catalog_name = %s AND table_namespace = %s", (self._catalog, NAMESPACE))
            pointers = cur.fetchall()
        for name, location in pointers:
            if location and location not in self._rows:
                self._rows[location] = _total_records(location)
            if location:
                self.current[name] = location
        return sum(self._rows[location] for location in self.current.values())

    def close(self) -> None:
        self._conn.close()


def _local(uri: str) -> str:
    return re.sub(r"^file:(//)?", "", uri)


def _total_records(metadata_location: str) -> int:
    with open(_local(metadata_location)) as f:
        metadata = json.load(f)
    current = metadata.get("current-snapshot-id")
    for snapshot in metadata.get("snapshots", ()):
        if snapshot["snapshot-id"] == current:
            return int(snapshot["summary"].get("total-records", 0))
    return 0


def check_tables(uri: str, catalog_name: str, expected: dict[str, Any]) -> tuple[int, int, int, str | None]:
    """(tables, data files, snapshots, the first problem or None): every expected table holds
    exactly its ``order_id`` set (``expected``: table -> sorted pyarrow array), and no other
    table exists. Read with pyiceberg's SQL catalog, whichever sink wrote it."""
    import pyarrow.compute as pc
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(catalog_name, type="sql", uri=uri)
    names = {".".join(t) for t in catalog.list_tables(NAMESPACE)}
    files = snapshots = 0
    problem = None
    if names != set(expected):
        missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
        problem = f"tables: {len(missing)} missing (first {missing[:3]}), {len(extra)} not expected (first {extra[:3]})"
    for name in sorted(names & set(expected)):
        table = catalog.load_table(name)
        files += table.inspect.files().num_rows
        snapshots += len(table.snapshots())
        ids = table.scan(selected_fields=("order_id",)).to_arrow()["order_id"].combine_chunks()
        want = expected[name]
        if problem is None and (len(ids) != len(want) or not _sorted(ids).equals(want)):
            distinct = pc.count_distinct(ids).as_py()
            problem = (f"{name}: {len(ids):,} rows, {distinct:,} distinct order_id; expected exactly the "
                       f"{len(want):,} produced")
    return len(names), files, snapshots, problem


def _sorted(array: Any) -> Any:
    import pyarrow.compute as pc

    return pc.take(array, pc.array_sort_indices(array))


def expected_ids(values: list[bytes], mode: str) -> dict[str, Any]:
    """Table -> the sorted ``order_id`` array it must hold, from the produced events."""
    import io

    import pyarrow.compute as pc
    import pyarrow.json as pj

    events = pj.read_json(io.BytesIO(b"\n".join(values)))
    ids = events["order_id"].combine_chunks()
    if mode == "one":
        return {ONE_TABLE: _sorted(ids)}
    routes = events[ROUTE_FIELD].combine_chunks()
    return {str(name): _sorted(pc.filter(ids, pc.equal(routes, name)))
            for name in pc.unique(routes).to_pylist()}


# ----------------------------------------------------------------------------- the sinks


class Sink(Protocol):
    label: str

    def launch(self) -> int: ...  # starts it; the root pid of its processes
    def check(self) -> None: ...  # raises if it died or failed
    def consumed(self) -> bool: ...  # has it consumed a record yet
    def stop(self) -> None: ...
    @property
    def log_path(self) -> Path: ...


class ReferenceSink:
    def __init__(self, directory: Path, bootstrap: str, pg: Any, catalog: str, mode: str, tasks: int,
                 interval_ms: int) -> None:
        from tests.support.kafka_connect import KafkaConnect, iceberg_sink_config, jdbc_catalog

        self.label = f"reference, tasks.max={tasks}"
        warehouse = directory / "warehouse"
        routing: dict[str, Any] = {"tables": ONE_TABLE} if mode == "one" else {"route_field": ROUTE_FIELD}
        config = iceberg_sink_config(
            catalog, TOPIC, jdbc_catalog(catalog, "127.0.0.1", pg.port, "icesink", warehouse), tasks=tasks,
            interval_ms=interval_ms, control_topic=f"{catalog}-control", **routing)
        # Iceberg's own integration tests run the worker so: a sink task sees the control topic
        # (the coordinator's StartCommit) only when the worker's poll returns, and with no records
        # left that poll waits until the next offset flush (60 s by default).
        self._connect = KafkaConnect(directory, bootstrap, config, worker={"offset.flush.interval.ms": "500"})
        self._seen = 0
        self._consumed = False

    @property
    def log_path(self) -> Path:
        return self._connect.log_path

    def launch(self) -> int:
        self._launched_wall = time.time()
        self._connect.spawn()
        assert self._connect.pid is not None
        return self._connect.pid

    def check(self) -> None:
        if not self._connect.running:
            raise RuntimeError(f"Kafka Connect exited. Log {self.log_path}:\n{self._connect.log_tail()}")
        status = self._connect.status()
        if status and "FAILED" in [status["connector"]["state"], *(t["state"] for t in status.get("tasks", []))]:
            raise RuntimeError(f"the reference failed: {json.dumps(status)[:3000]}")

    def consumed(self) -> bool:
        """Its sink consumer positioned on a partition of the topic: the first fetch follows."""
        if not self._consumed and self.log_path.exists():
            with self.log_path.open("rb") as f:
                f.seek(self._seen)
                data = f.read()
            # a line cut at the end is read again next time
            self._seen += data.rfind(b"\n") + 1
            self._consumed = f"Resetting offset for partition {TOPIC}-".encode() in data
        return self._consumed

    def consumed_at(self) -> float | None:
        """Seconds from launch to that log line, from the log's own time stamp."""
        for line in self.log_path.read_text(errors="replace").splitlines():
            if f"Resetting offset for partition {TOPIC}-" in line and (m := _CONNECT_STAMP.match(line)):
                return datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() - self._launched_wall
        return None

    def stop(self) -> None:
        self._connect.stop()


class IcesinkSink:
    def __init__(self, directory: Path, bootstrap: str, pg: Any, catalog: str, mode: str, interval_ms: int,
                 extra: dict[str, str]) -> None:
        from icesink.app.replicas import ReplicaSet

        self.label = "icesink, 1 replica"
        config: dict[str, Any] = {
            "topics": TOPIC,
            "iceberg.tables": ONE_TABLE,
            "iceberg.catalog": catalog,
            "iceberg.catalog.type": "sql",
            "iceberg.catalog.uri": pg.uri,
            "iceberg.catalog.warehouse": f"file://{directory / 'warehouse'}",
            "iceberg.tables.auto-create-enabled": "true",
            "iceberg.control.topic": f"{catalog}-control",
            "iceberg.control.topic.replication-factor": 1,
            "iceberg.control.commit.interval-ms": interval_ms,
            "group.id": catalog,
            "bootstrap.servers": bootstrap,
            "state.dir": str(directory / "state"),
            "spark.master": "local[2]",
            "spark.driver.memory": "4g",
            "buffer.max-bytes": 1 << 30,
        }
        if mode == "many":
            config |= {"iceberg.tables": "", "iceberg.tables.dynamic-enabled": "true",
                       "iceberg.tables.route-field": ROUTE_FIELD}
        config.update(extra)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "worker.json"
        path.write_text(json.dumps(config, indent=2))
        print(f"({ensure_class_archive(path)})", flush=True)
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        self._replicas = ReplicaSet(path, directory / "logs", env={"PYTHONPATH": pythonpath})
        self._consumed = False

    @property
    def log_path(self) -> Path:
        return self._replica.log_path

    def launch(self) -> int:
        self._replica = self._replicas.start("versus")
        return self._replica.proc.pid

    def check(self) -> None:
        self._replicas.check_alive()

    def consumed(self) -> bool:
        if not self._consumed:
            self._consumed = bool(metric_total(self._replica.metrics_port, "icesink_records_consumed_total"))
        return self._consumed

    def stop(self) -> None:
        self._replicas.stop_all()


def measure(sink: Sink, mode: str, rows: CommittedRows, n: int, tables: int, timeout_s: float, *,
            broker_pid: int | None, pg_data: Path, profile: Path | None = None) -> RunResult:
    """Launch ``sink``, sample its processes until its tables hold ``n`` rows (and, in mode
    'many', all ``tables`` tables exist), stop it."""
    system_began, broker_began, pg_began, self_began = (system_cpu_s(), process_cpu_s(broker_pid),
                                                        postgres_cpu_s(pg_data), _cpu_seconds())
    began = time.monotonic()
    sampler: RssSampler | None = None
    profiler: Profiler | None = None
    try:
        pid = sink.launch()
        sampler = RssSampler(pid).start()
        profiler = Profiler(pid, profile) if profile is not None else None
        consumed_s = first_commit_s = None
        committed, next_poll, next_progress = 0, began, began + PROGRESS_EVERY_S
        while True:
            now = time.monotonic()
            if now - began > timeout_s:
                raise RuntimeError(f"{sink.label}: {committed:,} of {n:,} rows committed after {timeout_s:.0f} s; "
                                   f"log {sink.log_path}")
            if consumed_s is None and sink.consumed():
                consumed_s = now - began
            if now >= next_poll:
                next_poll = now + TABLE_POLL_S
                sink.check()
                committed = rows()
                if committed and first_commit_s is None:
                    first_commit_s = time.monotonic() - began
                if committed >= n and (mode == "one" or len(rows.current) >= tables):
                    total_s = time.monotonic() - began
                    break
            if now >= next_progress:
                next_progress = now + PROGRESS_EVERY_S
                print(f"[{now - began:6.0f} s] {sink.label}: {committed:,} of {n:,} rows committed", file=sys.stderr,
                      flush=True)
            time.sleep(SAMPLE_EVERY_S)
        sampler.sample()
        sampler.stop()
        system_s, broker_s = system_cpu_s() - system_began, process_cpu_s(broker_pid) - broker_began
        pg_s, harness_s = postgres_cpu_s(pg_data) - pg_began, _cpu_seconds() - self_began
    finally:
        if profiler is not None:
            profiler.stop()
        if sampler is not None:
            sampler.stop()
        sink.stop()
    if isinstance(sink, ReferenceSink):  # the log's own time, not the 0.2 s poll
        consumed_s = sink.consumed_at() or consumed_s
    cpu_by_name: dict[str, float] = {}
    for name, seconds in sampler.cpu.values():
        cpu_by_name[name] = cpu_by_name.get(name, 0.0) + seconds
    ours = sum(cpu_by_name.values()) + broker_s + pg_s + harness_s
    return RunResult(
        label=sink.label, mode=mode, records=n, total_s=total_s, consumed_s=consumed_s,
        first_commit_s=first_commit_s, cpu_by_name=cpu_by_name, peak_rss_bytes=sampler.peak_tree_bytes,
        peak_procs=sampler.peak_tree_procs, tables=0, files=0, snapshots=0, problem=None, broker_cpu_s=broker_s,
        catalog_cpu_s=pg_s, interference=Interference(total_s, system_s, ours),
        profile=profiler.breakdown() if profiler is not None else [], log_path=sink.log_path,
    )


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    print("command:", shlex.join([os.path.relpath(sys.executable), *(sys.argv if argv is None else argv)]))
    print(f"N = {args.records:,} pizza events, {args.partitions} partitions, {os.cpu_count()} CPUs, "
          f"commit interval {args.interval_ms} ms for both sinks, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.getloadavg()[1]:.2f} (5 min)")
    sys.stdout.flush()

    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.kafka_broker import KafkaBroker
    from tests.support.kafka_connect import resolve
    from tests.support.postgres import PostgresServer

    if not args.skip_reference:
        resolve()  # fetch the jars before anything is timed
    tmp = Path(tempfile.mkdtemp(prefix="icesink-versus-"))
    broker = KafkaBroker(tmp / "kafka", heap="1g", quick_start=False)
    pg = PostgresServer()
    ok = True
    try:
        pg.start()
        broker.start()
        # pyiceberg creates the catalog's tables (its v1 layout); the JDBC catalog uses them as found.
        load_catalog("versus", type="sql", uri=pg.uri)
        asyncio.run(ensure_topic(broker.bootstrap, TOPIC, args.partitions))
        values = routed(pizza_values(args.records, seed=SEED, spread_days=SPREAD_DAYS), args.tables)
        began = time.monotonic()
        asyncio.run(produce(broker.bootstrap, TOPIC, values, partitions=args.partitions))
        print(f"produced {args.records:,} records in {time.monotonic() - began:.1f} s to {args.partitions} partitions "
              f"of {TOPIC} on Apache Kafka ({broker.bootstrap}), each naming one of {args.tables} tables in "
              f"'{ROUTE_FIELD}'")
        expected = {mode: expected_ids(values, mode) for mode in args.modes}
        del values
        for mode in args.modes:
            results = []
            # icesink first: a reference run that is very slow (200 tables) comes last
            runs: list[tuple[str, int | None]] = [] if args.skip_icesink else [(f"icesink_{mode}", None)]
            if not args.skip_reference:
                runs += [(f"ref{t}_{mode}", t) for t in args.reference_tasks]
            for catalog, tasks in runs:
                asyncio.run(ensure_topic(broker.bootstrap, f"{catalog}-control", 1))
                directory = tmp / catalog
                sink: Sink
                if tasks is None:
                    sink = IcesinkSink(directory, broker.bootstrap, pg, catalog, mode, args.interval_ms, args.extra)
                else:
                    sink = ReferenceSink(directory, broker.bootstrap, pg, catalog, mode, tasks, args.interval_ms)
                print(f"{time.strftime('%H:%M:%S')} {sink.label}, mode {mode}: load average {os.getloadavg()[0]:.2f}",
                      file=sys.stderr, flush=True)
                # Iceberg's JdbcCatalog.createNamespace checks, then inserts: two tasks auto-creating
                # their first table at once race, and the loser's task FAILS on the unique key of
                # iceberg_namespace_properties (seen with tasks.max=2). Every sink finds it made.
                load_catalog(catalog, type="sql", uri=pg.uri).create_namespace(NAMESPACE)
                rows = CommittedRows(pg.uri.replace("postgresql+psycopg2://", "postgresql://"), catalog)
                load_began = os.getloadavg()[0]
                try:
                    result = measure(sink, mode, rows, args.records, args.tables, args.timeout_s,
                                     broker_pid=broker.pid, pg_data=pg.data,
                                     profile=directory / "profile.txt" if args.profile and tasks is None else None)
                except Exception as exc:  # noqa: BLE001 - one failed run must not lose the others' figures
                    print(f"{sink.label}, mode {mode}: FAILED: {exc}", file=sys.stderr, flush=True)
                    ok = False
                    continue
                finally:
                    rows.close()
                result.load = (load_began, os.getloadavg()[0])
                result.tables, result.files, result.snapshots, result.problem = check_tables(
                    pg.uri, catalog, expected[mode])
                ok = ok and result.problem is None
                results.append(result)
            print_results(mode, args.records, args.tables, results)
            sys.stdout.flush()
    finally:
        broker.stop()
        pg.destroy()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


def _exit_on_signal(signum: int, _frame: Any) -> None:
    print(f"{signal.Signals(signum).name}: stopping the sinks, the broker and PostgreSQL", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
