"""A local Spark session's throw-away writes, which warm its JVM up before the first round.

A fresh JVM's first write costs several times a warm one (bench/README.md, spark_write_bench):
:class:`WarmUp` moves that cost to start-up, where it overlaps joining the group. It writes
``rows`` synthetic rows (the common column types, zstd) ``times`` into a temporary directory,
then once more into ``files`` partition directories, and deletes them. The partitioned write
runs the per-file path (a Parquet writer's set-up and close for each file, the sort by
partition) that a partitioned table's round and a round routed to many tables take: cold, a
first round of 200 new tables wrote its 200 files in 2.7-3.4 s, against 1.1-1.5 s warm.

A throw-away write beside a real one slows both on the same cores, and the real write warms
the JVM up as well. So ``idle()`` (no rows wait for a write, none is written) is asked before
each write, and a warm-up write in flight when a real write begins (:meth:`WarmUp.real_write`)
is cancelled: its Spark jobs carry the tag :data:`TAG` and are cancelled with their tasks
interrupted. A cancelled warm-up logs no error: its jobs and tasks run with the log context
``mdc.icesink=warm-up``, which spark_bridge/log4j2.properties keeps out of the JVM's log.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as st

from spark_bridge import staging
from spark_bridge.files import WRITE_OPTIONS, parquet_options

if TYPE_CHECKING:
    from spark_bridge.session import SparkSessionOwner

__all__ = ["TAG", "WarmUp"]

logger = logging.getLogger("spark_bridge.writer")  # the writer's lines, as before this module

TAG = "icesink-warm-up"  # the warm-up's Spark jobs (SparkContext.addJobTag)
MDC_KEY, MDC_VALUE = "mdc.icesink", "warm-up"  # their log context (log4j2.properties drops it)
_POLL_S = 0.05  # how often a warm-up write in flight looks for a real write
_TASKS_WAIT_S = 10.0  # for a cancelled write's tasks to end before its files are removed
_INTERRUPT = "spark.job.interruptOnCancel"  # the local property SparkContext.setInterruptOnCancel sets

#: One plain write: (Spark schema, rows, output URI).
PlainWrite = Callable[[st.StructType, pa.Table, str], None]


class WarmUp:
    """The warm-up of one writer's session; ``plain_write`` is the writer's own unpartitioned
    write path."""

    def __init__(self, session: SparkSessionOwner, plain_write: PlainWrite) -> None:
        self.session = session
        self._plain_write = plain_write
        self.warming = False
        self.root: Path | None = None  # the scratch directory while it runs
        self._real_writes = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def real_write(self) -> Iterator[None]:
        """Around a real write: a warm-up write in flight meanwhile is cancelled, and no new one
        begins."""
        with self._lock:
            self._real_writes += 1
        try:
            yield
        finally:
            with self._lock:
                self._real_writes -= 1

    def run(self, rows: int, times: int = 2, files: int = 0, idle: Callable[[], bool] = lambda: True) -> None:
        """The throw-away writes (module docstring). A failure is logged, never raised: the first
        real write then fails or succeeds on its own."""
        started = time.monotonic()
        ids = pa.array(np.arange(rows, dtype=np.int64))
        text = pc.cast(ids, pa.string())
        data = pa.table({
            "id": ids, "name": pc.binary_join_element_wise("name-", text, ""), "amount": pc.divide(ids, 7.0),
            "flag": pc.equal(pc.bit_wise_and(ids, 1), 0),
            "at": pc.cast(pc.multiply(ids, 1_000_000), pa.int64()).cast(pa.timestamp("us")),
        })
        sp_schema = st.StructType([
            st.StructField("id", st.LongType()), st.StructField("name", st.StringType()),
            st.StructField("amount", st.DoubleType()), st.StructField("flag", st.BooleanType()),
            st.StructField("at", st.TimestampNTZType()),
        ])
        root = self.root = staging.scratch(self.session.settings.staging_dir, "icesink-warm-up-")
        what = f"{times} writes of {rows} rows" + (f", then one into {files} files" if files else "")
        logger.info("spark warming up: %s", what)
        self.warming = True
        steps = times + (1 if files else 0)
        settled = True  # no task of a cancelled write may still write under root
        try:
            for i in range(steps):
                if not self.session.started:  # stopped meanwhile
                    logger.info("spark warm-up ended by the session's stop")
                    return
                if self._real_writes or (i and not idle()):
                    logger.info("spark warm-up ended after %d of its %d writes: rows wait for a write", i, steps)
                    return
                if i < times:
                    write = functools.partial(self._plain_write, sp_schema, data, (root / str(i)).as_uri())
                else:
                    write = functools.partial(self._write_files, sp_schema, data, files, (root / "files").as_uri())
                if self._cancellable(write):
                    settled = self._tasks_ended()
                    logger.info("spark warm-up write cancelled after %d of its %d writes: a real write takes the "
                                "cores", i, steps)
                    return
            logger.info("spark warmed up: %s in %.1f s", what, time.monotonic() - started)
        except Exception as e:  # noqa: BLE001 - an optimisation only
            if not self.session.started:  # the session was stopped under it: the stop says so
                logger.info("spark warm-up ended by the session's stop")
            else:
                logger.warning("spark warm-up write failed (the first round pays the JVM's warm-up instead): %s", e)
        finally:
            self.warming = False
            shutil.rmtree(root, ignore_errors=True)
            # else the writer's stop deletes it again once the session stopped (its tasks with it)
            if self.session.started and settled:
                self.root = None

    def _cancellable(self, write: Callable[[], None]) -> bool:
        """Run one throw-away write under :data:`TAG`, cancelling its jobs while a real write
        runs (repeatedly: a cancel before the job is submitted finds none). True if the write
        was cancelled (it raised after a cancel); its own failure is raised, and a write that
        ended on its own is not cancelled."""
        sc = self.session.spark.sparkContext
        done = threading.Event()
        cancelling = threading.Event()

        def watch() -> None:
            while not done.wait(_POLL_S):
                if self._real_writes:
                    cancelling.set()
                    with contextlib.suppress(Exception):  # the session stopping
                        sc.cancelJobsWithTag(TAG)

        assert sc._jvm is not None  # a started session's
        mdc = sc._jvm.org.slf4j.MDC  # this thread's JVM thread (pinned): the driver's lines of its jobs
        watcher = threading.Thread(target=watch, name="icesink-warm-up-watch", daemon=True)
        try:
            sc.addJobTag(TAG)
            sc.setInterruptOnCancel(True)
            sc.setLocalProperty(MDC_KEY, MDC_VALUE)  # its tasks' lines (Spark's Executor puts mdc.* into theirs)
            mdc.put(MDC_KEY, MDC_VALUE)
            watcher.start()
            write()
        except Exception:
            if not cancelling.is_set():
                raise
            return True
        finally:
            done.set()
            if watcher.is_alive():
                watcher.join()
            # Each on its own: this pool thread's later real writes must carry none of them (a
            # later warm-up's cancel would reach them, the log filter would drop their errors).
            for undo in (lambda: sc.removeJobTag(TAG), lambda: sc.setLocalProperty(MDC_KEY, None),  # type: ignore[arg-type]
                         lambda: sc.setLocalProperty(_INTERRUPT, None), lambda: mdc.remove(MDC_KEY)):  # type: ignore[arg-type]
                with contextlib.suppress(Exception):  # the session stopped under it
                    undo()
        return False

    def _tasks_ended(self) -> bool:
        """Whether the tasks of the cancelled warm-up jobs ended within a short wait: a cancel
        fails the job at once, its tasks end when the kill reaches them (and one still running
        may create directories under the scratch directory after it was removed)."""
        sc = self.session.spark.sparkContext
        tracker = sc.statusTracker()
        deadline = time.monotonic() + _TASKS_WAIT_S
        try:
            jobs = list(sc._jsc.sc().statusTracker().getJobIdsForTag(TAG))
            stages = {s for j in jobs if (job := tracker.getJobInfo(j)) is not None for s in job.stageIds}
            while time.monotonic() < deadline:
                infos = [tracker.getStageInfo(s) for s in stages]
                if all(info is None or info.numActiveTasks == 0 for info in infos):
                    return True
                time.sleep(_POLL_S)
        except Exception:  # noqa: BLE001 - the session stopping: its stop cleans up
            logger.debug("could not follow the cancelled warm-up's tasks", exc_info=True)
        return False

    def _write_files(self, sp_schema: st.StructType, data: pa.Table, files: int, out_uri: str) -> None:
        """``data`` into ``files`` partition directories, as the writer's grouped write of a
        round of many tables: an int column Spark partitions on, a task per core, no shuffle."""
        spark = self.session.spark
        column = pa.array(np.arange(data.num_rows, dtype=np.int64) * files // data.num_rows, pa.int32())
        frame = spark.createDataFrame(data.append_column("part", column), schema=st.StructType(
            [*sp_schema.fields, st.StructField("part", st.IntegerType(), False)]))
        frame.coalesce(max(1, min(files, spark.sparkContext.defaultParallelism))).write.partitionBy(
            "part").options(**{**WRITE_OPTIONS, **parquet_options({})}).mode("error").format("parquet").save(out_uri)
