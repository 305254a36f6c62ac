"""Shared by the benchmarks under bench/: process CPU and RSS sampling from /proc, the
worker's /metrics, and the plain read-parse-write-commit baseline that icesink is measured
against (run in a fresh child process so its peak RSS does not include generated events)."""

from __future__ import annotations

import asyncio
import io
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from icesink.shared.catalogs import sqlite_catalog_properties  # noqa: E402

TABLE: Final = "bench.pizzas"
SAMPLE_EVERY_S: Final = 0.2
THREADS_EVERY: Final = 3  # a JVM's threads are read every this many samples (about 100 files each)
MIB: Final = 1024 * 1024
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")
_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- helpers


def ensure_class_archive(config_path: Path) -> str:
    """Make sure the class-data archive of the worker's local Spark JVM exists, as ``./dev`` and
    the image build make it (``icesink spark-archive``): without it the JVM starts in about twice
    the time and spends as much CPU again in its first writes, so a run would measure the missing
    archive (it is pruned to the newest few, so other checkouts' builds evict it). Returns what
    was done, for the benchmark's header."""
    command = [sys.executable, "-m", "icesink", "spark-archive", "--config", str(config_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    if subprocess.run([*command, "--check"], capture_output=True, env=env).returncode == 0:
        return "class-data archive: present"
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return f"class-data archive: could not be built (exit {done.returncode}): the JVM starts without it"
    return f"class-data archive: built in {time.monotonic() - began:.0f} s before the run ({done.stdout.strip()})"


def per_partition_counts(n: int, partitions: int) -> dict[int, int]:
    """:func:`icesink.app.pizzas.produce` sends record ``i`` to partition ``i % partitions``."""
    return {p: n // partitions + (1 if p < n % partitions else 0) for p in range(partitions)}


def local_path(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def best_seconds(paths: dict[str, Callable[[], object]], repeat: int,
                 clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds of each path by ``clock``, best of ``repeat`` rounds; rounds interleave the paths
    so a machine whose load changes during the run skews them all alike."""
    best = dict.fromkeys(paths, float("inf"))
    for _ in range(repeat):
        for name, fn in paths.items():
            began = clock()
            fn()
            best[name] = min(best[name], clock() - began)
    return best


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


def file_create_us(directory: str | os.PathLike[str], files: int = 300) -> float:
    """Median microseconds to create (and close) one empty file in a fresh subdirectory of
    ``directory``. A round to many tables creates hundreds of files (data files, manifests,
    metadata files), so a slow file system there shows in every many-table figure: on one VM
    its long-used /tmp took about 500 us a file against 15-20 us elsewhere on the same disk."""
    root = Path(tempfile.mkdtemp(prefix="file-create-", dir=directory))
    times = []
    try:
        for i in range(files):
            started = time.perf_counter()
            os.close(os.open(root / f"f{i}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644))
            times.append(time.perf_counter() - started)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 1e6 * statistics.median(times)


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


# A HotSpot JVM's threads by their name's start (Linux keeps 15 characters of it), in the parts
# a Spark write's CPU is told by: its tasks, the JIT compilers, the VM thread (the serial
# collector's pauses and other safepoint work run on it), the collectors' own threads, py4j's
# (one unnamed ``Thread-N`` per connection from Python: the calls that read a write's Arrow
# data into the heap and plan its job) and the main thread (the JVM's start, SparkSubmit).
JVM_THREAD_PARTS: Final = (
    ("Executor task", "write tasks"),
    ("C2 Compiler", "C2 compiler"),
    ("C1 Compiler", "C1 compiler"),
    ("VM Thread", "VM thread (serial collector)"),
    ("GC Thread", "collector threads"),
    ("G1 ", "collector threads"),
    ("Thread-", "py4j calls"),
)


def jvm_thread_part(name: str) -> str:
    """The part of a JVM's CPU a thread of that name belongs to (:data:`JVM_THREAD_PARTS`)."""
    if name == "java":
        return "main thread"
    return next((part for prefix, part in JVM_THREAD_PARTS if name.startswith(prefix)), "other threads")


def thread_cpu(pid: int, into: dict[tuple[int, int], tuple[str, float]]) -> None:
    """Each live thread of ``pid``: (its name, user + system CPU seconds so far), by (pid, tid).
    A thread that exits keeps the value of its last sample."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        name = stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")
        fields = stat[stat.rfind(b")") + 2 :].split()
        into[(pid, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS)


class RssSampler:
    """Samples the RSS of a process tree every ``SAMPLE_EVERY_S`` in a daemon thread; also each
    process's CPU, and each JVM thread's (a JVM's is read every ``threads_every`` samples)."""

    def __init__(self, pid: int, threads_every: int = THREADS_EVERY) -> None:
        self.pid = pid
        self.peak_tree_bytes = 0
        self.peak_tree_procs = 0
        self.hwm_kib = 0  # VmHWM of ``pid`` itself (only grows; last readable value wins)
        self.cpu: dict[int, tuple[str, float]] = {}  # pid -> (name, CPU seconds at last sample)
        self.jvm_threads: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, tid) -> (name, CPU seconds)
        self._threads_every = threads_every
        self._samples = 0
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

    def jvm_parts(self) -> dict[str, float]:
        """The JVMs' CPU seconds by :func:`jvm_thread_part`, largest first."""
        parts: dict[str, float] = {}
        for name, seconds in self.jvm_threads.values():
            part = jvm_thread_part(name)
            parts[part] = parts.get(part, 0.0) + seconds
        return dict(sorted(parts.items(), key=lambda item: -item[1]))

    def sample(self, threads: bool = False) -> None:
        """One sample; ``threads``: read the JVMs' threads whatever the count (the last one)."""
        total, procs = tree_rss_bytes(self.pid, self.cpu)
        if threads or self._samples % self._threads_every == 0:
            for pid, (name, _seconds) in list(self.cpu.items()):
                if name == "java":
                    thread_cpu(pid, self.jvm_threads)
        self._samples += 1
        if total > self.peak_tree_bytes:
            self.peak_tree_bytes, self.peak_tree_procs = total, procs
        hwm = read_status_kib(self.pid, "VmHWM")
        if hwm is not None:
            self.hwm_kib = max(self.hwm_kib, hwm)


def metric_total(port: int, name: str) -> float | None:
    """Sum of a metric's samples over all label sets, or None if /metrics does not answer.
    Asks for that sample alone (``name[]``): the whole page of a worker writing 200 tables is
    5,000 lines, about 40 ms of its Python each time this benchmark polls."""
    try:
        query = urllib.parse.urlencode({"name[]": name})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?{query}", timeout=2) as resp:
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
        table_rows=int(snapshot.summary["total-records"] or 0) if snapshot and snapshot.summary else 0,
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




# ----------------------------------------------------------------------------- profile

#: Stages of a record's time in the worker's Python process, by the frames of a py-spy sample
#: (first match wins, innermost frames first is not needed: a stage's frames are distinctive).
STAGES: Final = (
    ("idle: event loops waiting in select", ("selectors.py",)),
    ("/metrics and /status server (polled by this benchmark)", ("socketserver.py", "http/server.py")),
    ("start-up (imports, Spark session start and warm-up)", ("_find_and_load", "_warm_up", "launch_gateway")),
    ("commit (pyiceberg, coordinator)", ("coordinator/", "pyiceberg/table", "pyiceberg/catalog")),
    ("Parquet footers of written files", ("_data_files", "read_metadata", "parquet/core.py")),
    ("Spark write (py4j, Arrow to Spark)", ("spark_bridge/", "py4j/", "pyspark/")),
    ("decode (JSON to Arrow, routing, screening)", ("agents/convert/", "agents/formats.py", "agents/routing.py",
                                                    "agents/deadletter.py", "agents/debezium.py", "agents/evolution.py")),
    ("buffer (chunks, rounds bookkeeping)", ("agents/buffer.py", "agents/rounds.py", "agents/respond.py")),
    ("fetch (aiokafka record parsing, Faust drain)", ("aiokafka/", "agents/kafka/source_consumer.py", "faust/", "mode/")),
    ("ingest glue", ("agents/ingest.py",)),
)


class Profiler:
    """``py-spy record`` of one process (busy samples only, all threads) into collapsed
    stacks; :meth:`breakdown` classifies the samples by :data:`STAGES`."""

    def __init__(self, pid: int, out: Path, rate: int = 50) -> None:
        import shutil
        import subprocess

        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(exe).exists():
            raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
        self.out = out
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--output", str(out),
             "--nonblocking", "--threads"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> None:
        import signal as _signal

        if self.proc.poll() is None:
            self.proc.send_signal(_signal.SIGINT)
        try:
            self.proc.wait(30)
        except Exception:  # noqa: BLE001 - a profile is optional
            self.proc.kill()

    def breakdown(self) -> list[tuple[str, int]]:
        """(stage, samples) for every stage with samples, most first; 'other' is followed by
        its three most sampled innermost frames."""
        counts: dict[str, int] = {}
        leaves: dict[str, int] = {}
        if not self.out.exists():
            return []
        for line in self.out.read_text(errors="replace").splitlines():
            stack, _, n = line.rpartition(" ")
            if not n.isdigit():
                continue
            stage = next((name for name, needles in STAGES if any(k in stack for k in needles)), "other")
            counts[stage] = counts.get(stage, 0) + int(n)
            if stage == "other":
                leaf = stack.rsplit(";", 1)[-1].strip()
                leaves[leaf] = leaves.get(leaf, 0) + int(n)
        out = sorted(counts.items(), key=lambda x: -x[1])
        top = sorted(leaves.items(), key=lambda x: -x[1])[:3]
        return out + [(f"  other, innermost frame: {leaf}", n) for leaf, n in top]
