"""A local session's quiet stop (a warm-up cut short, spark_bridge/session.py): the aborted
job's tasks must not write on after the stop returns, and the next session of the process works.

A module of its own: the stop may end the process's Spark JVM, which other modules' sessions share.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from spark_bridge.session import SparkSessionOwner, SparkSettings

pytestmark = pytest.mark.integration


def _jvm_process() -> Any:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    assert gateway is not None
    return gateway.proc


def test_a_quiet_stop_ends_the_jvm_only_when_a_task_outlives_it_and_a_new_session_starts() -> None:
    """A task that ignores the kill (a JVM sleep; under load a warm-up task writing into many
    files went on for over 5 s) ends with the JVM: the stop returns only once that process
    exited. With no task running, the JVM stays for the next session."""
    owner = SparkSessionOwner(SparkSettings(master="local[1]", app_name="icesink-stop-test"))
    owner.start()
    first = _jvm_process()
    owner.stop(quiet=True)
    assert first.poll() is None, "nothing ran: the JVM stays"

    owner.start()
    assert _jvm_process() is first
    failed: list[BaseException] = []

    def sleeping_job() -> None:
        try:
            owner.spark.range(1).selectExpr("java_method('java.lang.Thread', 'sleep', 60000L)").collect()
        except BaseException as e:  # noqa: BLE001 - the stop aborts it
            failed.append(e)

    job = threading.Thread(target=sleeping_job, daemon=True)
    job.start()
    tracker = owner.spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 60
    while not tracker.getActiveStageIds():
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    time.sleep(0.5)  # its task runs
    began = time.monotonic()
    owner.stop(quiet=True)
    assert first.poll() is not None, "the task still ran: the JVM should have ended"
    assert time.monotonic() - began < 30
    job.join(30)
    assert failed, "the sleeping job should have been aborted"

    again = SparkSessionOwner(SparkSettings(master="local[1]", app_name="icesink-stop-test"))
    again.start()
    try:
        assert _jvm_process() is not first
        assert again.spark.range(3).count() == 3
    finally:
        again.stop()

