"""The long-lived Spark session of a replica: its settings, its start-up conf, start and stop.

:class:`SparkSettings` says how to reach Spark (a local session, a standalone master or a Spark
Connect server) and how the writer stages and warms up; :class:`SparkSessionOwner` starts the
session once (a local one maps the JVM's class-data archive and gets icesink's file system for
``file:``, spark_bridge/class_archive.py and spark_bridge/localfs.py) and stops it.
spark_bridge/writer.py writes files with it, spark_bridge/rewrite.py compacts with it.

The session is blocking: run these calls off the event loop, in one executor.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from icesink.shared.errors import ConfigError
from spark_bridge import class_archive, staging
from spark_bridge.uris import is_local
from spark_bridge.localfs import session_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SparkSessionOwner", "SparkSettings", "silence_jvm_logs"]

logger = logging.getLogger(__name__)

# The local sessions this process started and has not stopped, and whether their JVMs' logging
# was turned off (silence_jvm_logs): one started after that is silenced as it starts.
_live: list[SparkSession] = []
_silenced = False

# SQL confs every session gets; all are runtime confs, so they also apply to Spark Connect.
_RUNTIME_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.fieldId.write.enabled": "true",
    # Compaction's reads (spark_bridge/rewrite.py) match columns by Iceberg field id.
    "spark.sql.parquet.fieldId.read.enabled": "true",
    "spark.sql.caseSensitive": "true",
    "spark.sql.shuffle.partitions": "8",
}
# Confs that only a locally started session can take (static or core confs).
_LOCAL_CONF: dict[str, str] = {
    # Local mode runs tasks in the driver JVM, which also holds the Arrow batches of a write.
    "spark.driver.memory": "2g",
    "spark.ui.enabled": "false",
    # Iceberg time columns: Spark 4.1+ writes TIME as Parquet TIME(MICROS) once enabled. Not
    # forced on Spark Connect servers, which may be older (a time column then fails to write).
    "spark.sql.timeType.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # createDataFrame(arrow) below this size (48 MB by default) becomes a LocalRelation: the
    # driver turns every row into an UnsafeRow and each analyzer and optimizer rule walks all of
    # them. 0 sends the Arrow batches to the write task as they are: a warm write is much faster
    # (see bench/README.md, spark_write_bench). Not for Spark Connect, whose servers cache relations.
    "spark.sql.execution.arrow.localRelationThreshold": "0",
}
# The local driver JVM's options; a user's spark.driver.extraJavaOptions follow them (HotSpot
# takes a flag's last value, so the user's win) instead of replacing them.
_LOCAL_JAVA_OPTIONS = (
    # An OutOfMemoryError can kill Spark's scheduler thread and leave the job waiting forever:
    # exit instead, so the write fails (SparkWriteError) and the owner restarts the process.
    "-XX:+ExitOnOutOfMemoryError",
    # C2 compiles a method once it is 10 times as hot as by default: at start the JVM loads
    # classes, spins lambdas and parses confs hot enough for C2 by default, which then took
    # about 9 CPU-s of a 1M-record run; the write path's methods still reach C2 within its
    # first rounds (bench/README.md, ingest_bench "JIT thresholds").
    "-XX:Tier4InvocationThreshold=50000",
    "-XX:Tier4MinInvocationThreshold=6000",
    "-XX:Tier4CompileThreshold=150000",
    "-XX:Tier4BackEdgeThreshold=400000",
    # Spark's log: WARN and up, in the worker's line format, labelled spark.<logger> (the file says why).
    f"-Dlog4j2.configurationFile={class_archive.option_value(Path(__file__).with_name('log4j2.properties'))}",
)
# On two CPUs or fewer: G1's concurrent refinement and marking threads take the core the worker
# reads on, and its write barriers slow the write tasks. The serial collector cost the JVM about a
# tenth less CPU behind a 2M-record backlog (bench/README.md, "The serial collector on two CPUs").
# Its pauses there stayed under 0.13 s (a heap of at most spark.driver.memory). More CPUs: the
# JVM's own choice.
_FEW_CPUS_COLLECTOR = "-XX:+UseSerialGC"
_COLLECTOR = re.compile(r"-XX:[+-]Use\w*GC$")  # a collector named by the user's options
_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def available_cpus(affinity: int | None = None, cpu_max: Path = _CGROUP_CPU_MAX) -> int:
    """The CPUs this process may use, as the JVM counts them: its affinity, capped by a cgroup
    v2 quota ("200000 100000": 2 CPUs, rounded up)."""
    cpus = affinity if affinity is not None else len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, ValueError):
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    return cpus


def _collector_options(user_options: str) -> tuple[str, ...]:
    """The collector for the local JVM: none when the user's options name one (two collectors
    stop the JVM from starting)."""
    if available_cpus() > 2 or any(_COLLECTOR.match(o) for o in user_options.split()):
        return ()
    return (_FEW_CPUS_COLLECTOR,)


@dataclass(frozen=True)
class SparkSettings:
    """How to reach Spark. Frozen; built once at start-up."""

    master: str = "local[*]"  # ignored when remote is set
    remote: str | None = None  # Spark Connect URL "sc://host:port"
    conf: Mapping[str, str] = field(default_factory=dict)  # extra spark conf
    # iceberg.tables.write-props.*: writer properties over every table's own (files.writer_properties).
    write_props: Mapping[str, str] = field(default_factory=dict)
    app_name: str = "icesink"
    # Upper bound on the write tasks of one call (each task writes whole partitions).
    max_write_tasks: int = 64
    # Arrow bytes per write task: smaller batches are written by one task without a shuffle.
    bytes_per_write_task: int = 128 * 1024 * 1024
    # Staging: a local Spark writes into staging_dir, then the files are uploaded to the table
    # location with the table's FileIO. "auto" stages when the location is not a local path
    # (s3://, gs://, ...: Spark would need the user's hadoop-aws jars) and Spark runs locally
    # (in this process, or a Spark Connect server on loopback).
    stage: Literal["auto", "always", "never"] = "auto"
    staging_dir: str | None = None  # this writer's scratch directories (spark_bridge/staging.py)
    # Rows of a throw-away write run twice at start() by a local session (0: none): the JVM
    # loads and compiles the Arrow-to-Parquet path then instead of during the first round.
    warm_up_rows: int = 20_000
    # Partition directories the warm-up's rows are written into once more (0: not): a
    # partitioned table's and a many-table round's per-file path (SparkFileWriter._warm_up).
    warm_up_files: int = 100
    # A local session's JVM maps the class-data archive built for its JVM and class path, when
    # there is one (spark_bridge/class_archive.py: it starts in about half the time).
    class_archive: bool = True

    def validate(self) -> None:
        if self.remote is not None and not self.remote.startswith("sc://"):
            raise ConfigError("spark.remote", self.remote, "a Spark Connect URL like sc://host:15002")
        if self.max_write_tasks < 1:
            raise ConfigError("SparkSettings.max_write_tasks", self.max_write_tasks, "a positive integer")
        if self.bytes_per_write_task < 1:
            raise ConfigError("SparkSettings.bytes_per_write_task", self.bytes_per_write_task, "a positive integer")
        if self.stage not in ("auto", "always", "never"):
            raise ConfigError("write.staging", self.stage, "one of auto, always, never")
        if self.stage == "always" and self.staging_dir is None:
            raise ConfigError("write.staging", self.stage, "auto or never when no staging directory is given")
        if self.warm_up_rows < 0:
            raise ConfigError("write.warm-up-rows", self.warm_up_rows, "0 or a positive number of rows")
        if self.warm_up_files < 0:
            raise ConfigError("write.warm-up-files", self.warm_up_files, "0 or a positive number of files")

    def stages(self, location: str) -> bool:
        """Whether files for ``location`` are written locally first and then uploaded."""
        if self.staging_dir is None or self.stage == "never":
            return False
        if self.stage == "always":
            return True
        # A Spark Connect server on loopback (icesink connect's shared one) shares this host's disks.
        local_spark = (self.master.startswith("local") if self.remote is None
                       else urlsplit(self.remote.split(";", 1)[0]).hostname in ("localhost", "127.0.0.1", "::1"))
        return local_spark and not is_local(location)


class SparkSessionOwner:
    """Owns one long-lived Spark session: :meth:`start` creates it, :meth:`stop` ends it."""

    def __init__(self, settings: SparkSettings) -> None:
        settings.validate()
        self.settings = settings
        self._spark: SparkSession | None = None
        self._starting: Future[None] | None = None  # start_soon's, until start() took it
        # Rows per Arrow batch of createDataFrame(arrow) in a classic session, which makes a
        # partition of each batch (None on Spark Connect: the server decides).
        self.batch_rows: int | None = None

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            raise RuntimeError("SparkFileWriter is not started: call start() first")
        if self.settings.remote is not None and getattr(self._spark, "is_stopped", False):
            # A Spark Connect server that restarted (icesink connect's shared Spark, after it
            # died) no longer knows this session: the client closed it at the first call that
            # said so, which failed, and that write is retried (agents/write_failures.py).
            # The retry gets a new session on the server that runs now.
            logger.warning("the Spark Connect session was closed (its server restarted?): starting a new one")
            self._spark = self._remote_session(self.settings.remote)
        return self._spark

    @property
    def started(self) -> bool:
        """Whether the session runs (False again once :meth:`stop` was called)."""
        return self._spark is not None

    @property
    def local(self) -> bool:
        """Whether Spark runs in this process (local mode), not on a cluster or a Connect server."""
        return self.settings.remote is None and self.settings.master.startswith("local")

    def start_soon(self, before: Callable[[], None] | None = None) -> None:
        """Begin :meth:`start` now, in a daemon thread of its own (``before`` runs first in it),
        so that a local JVM starts beside what the caller does meanwhile; the next :meth:`start`
        waits for it and raises what it raised. A process that ends first leaves the thread.
        PySpark is imported here first (0.15 s): in the thread it would share the interpreter
        lock with the caller's own imports, and the JVM would be asked for later."""
        import pyspark.sql  # noqa: F401 - see above

        starting: Future[None] = Future()

        def run() -> None:
            try:
                if before is not None:
                    before()
                self._start()
            except BaseException as exc:  # noqa: BLE001 - raised again by start()
                starting.set_exception(exc)
            else:
                starting.set_result(None)

        self._starting = starting
        threading.Thread(target=run, name="spark-start", daemon=True).start()

    def start(self) -> None:
        """Create the session (blocking: a local session takes seconds), or wait for the one
        :meth:`start_soon` began."""
        starting, self._starting = self._starting, None
        if starting is not None:
            starting.result()
        else:
            self._start()

    def _start(self) -> None:
        if self._spark is not None:
            return
        from pyspark.sql import SparkSession

        s = self.settings
        if s.staging_dir is not None:
            staging.claim(s.staging_dir)  # a crash's leftovers go, if icesink made the directory
        if s.remote is not None:
            spark = self._remote_session(s.remote)
        else:
            builder = SparkSession.builder.master(s.master).appName(s.app_name)
            conf = self.startup_conf()
            if s.class_archive and s.master.startswith("local"):
                conf = class_archive.with_archive(conf)
            for key, value in conf.items():
                builder = builder.config(key, value)
            spark = builder.getOrCreate()
            spark.sparkContext.setLogLevel("WARN")
            _quiet_task_size_warnings(spark)
            _live.append(spark)
            if _silenced:
                _jvm_logs_off(spark)
            self.batch_rows = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000") or 10000)
        self._spark = spark
        logger.info("spark session started (%s)", "Spark Connect" if s.remote else s.master)  # a URL may hold a token

    def _remote_session(self, remote: str) -> SparkSession:
        """A new Spark Connect session with our runtime confs, then the user's."""
        from pyspark.sql import SparkSession

        # create(), not getOrCreate(): a new session, never the closed one of a server that went
        spark = SparkSession.builder.remote(remote).appName(self.settings.app_name).create()
        for key, value in {**_RUNTIME_CONF, **self.settings.conf}.items():
            try:
                spark.conf.set(key, value)
            except Exception as e:
                spark.stop()
                raise ConfigError(
                    f"spark.conf.{key}", value, f"a runtime conf the Spark Connect server accepts ({e})"
                ) from e
        return spark

    def startup_conf(self) -> dict[str, str]:
        """The conf a classic (not Spark Connect) session starts with: ours, then the user's."""
        s = self.settings
        # A local session talks only to itself: keep its driver on loopback.
        loopback = (
            {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
            if s.master.startswith("local") else {}
        )
        # A local session's driver runs the tasks: its file: scheme can skip chmod processes.
        # Elsewhere executors lack the classes: Hadoop's own, also over a conf an earlier local
        # session of this process left in the JVM's system properties.
        fast_fs = (session_conf(s.conf) if s.master.startswith("local")
                   else {} if "spark.hadoop.fs.file.impl" in s.conf
                   else {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem"})
        user_java = s.conf.get(class_archive.JAVA_OPTIONS, "")
        java = " ".join([*_LOCAL_JAVA_OPTIONS, *_collector_options(user_java), user_java]).strip()
        return {**_LOCAL_CONF, **loopback, **_RUNTIME_CONF, **s.conf, **fast_fs, class_archive.JAVA_OPTIONS: java}

    def stop(self, *, quiet: bool = False) -> None:
        """Stop the session; ``quiet``: turn the JVM's logging off first, for a stop that aborts
        a job on purpose (the warm-up's), which Spark would log as errors."""
        spark, self._spark = self._spark, None
        if spark is not None:
            if spark in _live:
                _live.remove(spark)
            # quiet: a local session's warm-up (a Spark Connect session has no JVM here to ask)
            jvm = spark.sparkContext._jvm if quiet and self.local else None
            if quiet:
                _jvm_logs_off(spark)
            spark.stop()
            # The aborted job's tasks write on until they see the kill, after its clean-up: under
            # load a task writing into many files went on for over 5 s. Past a short wait, the
            # JVM ends; the next session of this process starts a new one.
            if jvm is not None and not _await_task_threads(jvm):
                _end_jvm()


def silence_jvm_logs() -> None:
    """The process ends on a failed start after its one last line (icesink/app/cli.py): the
    local Spark JVMs it started, or is starting, log nothing more. A warm-up write the exit cuts
    short otherwise logs "Error in TaskCompletionListener" after that line; a JVM whose session
    is still being made (its SparkContext under construction as the process ends) logs "Error
    initializing SparkContext": PySpark keeps that JVM's gateway on SparkContext from its launch."""
    global _silenced
    _silenced = True
    for spark in list(_live):
        _jvm_logs_off(spark)
    if "pyspark" in sys.modules and not _live:  # else no JVM was launched, or its session is up
        from pyspark import SparkContext

        # Its logging cannot be turned off for good: Spark configures log4j anew as its
        # SparkContext begins to log. The process is ending: the JVM ends now, saying nothing.
        proc = getattr(SparkContext._gateway, "proc", None)
        if proc is not None:
            proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(_JVM_EXIT_WAIT_S)


_TASK_THREAD = "Executor task launch worker"  # a local executor's task threads (Spark's Executor)
_TASK_THREADS_WAIT_S = 2.0
_JVM_EXIT_WAIT_S = 10.0


def _await_task_threads(jvm: Any) -> bool:
    """Whether no task thread of the local executor is alive within a short wait: a stopped
    session's executor lets its running tasks end on their own."""
    deadline = time.monotonic() + _TASK_THREADS_WAIT_S
    try:
        while time.monotonic() < deadline:
            threads = jvm.java.lang.Thread.getAllStackTraces().keySet()
            if not any(str(t.getName()).startswith(_TASK_THREAD) and t.isAlive() for t in threads):
                return True
            time.sleep(0.05)
    except Exception:  # the JVM is gone: so are its tasks
        logger.debug("could not list the JVM's threads", exc_info=True)
        return True
    return False


def _end_jvm() -> None:
    """End this process's Spark JVM and wait for its exit (then no thread of it writes on),
    and let the next session launch a new one. PySpark keeps the gateway on SparkContext."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:  # none, or one this process did not launch
        return
    SparkContext._gateway = SparkContext._jvm = None
    logger.info("ending the Spark JVM: a stopped write's tasks still ran")
    proc.terminate()
    try:
        proc.wait(_JVM_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with contextlib.suppress(Exception):
        gateway.shutdown()


def _jvm_logs_off(spark: SparkSession) -> None:
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        jvm.org.apache.logging.log4j.core.config.Configurator.setAllLevels("", jvm.org.apache.logging.log4j.Level.OFF)
    except Exception:  # logging only; the process is ending anyway
        logger.debug("could not turn the JVM's logging off", exc_info=True)


def _quiet_task_size_warnings(spark: SparkSession) -> None:
    """createDataFrame ships the Arrow batches inside the tasks: Spark warns on every write."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.scheduler.TaskSetManager", jvm.org.apache.logging.log4j.Level.ERROR
        )
    except Exception:  # logging only; never fail start-up for it
        logger.debug("could not lower TaskSetManager log level", exc_info=True)

