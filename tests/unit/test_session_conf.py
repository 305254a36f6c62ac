"""The conf a local Spark session starts with (spark_bridge/session.py)."""

from __future__ import annotations

import shlex
import threading

import pytest

from spark_bridge.session import SparkSessionOwner, SparkSettings

JAVA = "spark.driver.extraJavaOptions"


def _options(conf: dict[str, str] | None = None) -> list[str]:
    return shlex.split(SparkSessionOwner(SparkSettings(master="local[2]", conf=conf or {})).startup_conf()[JAVA])


def test_driver_exits_on_out_of_memory_and_compiles_less_at_start() -> None:
    options = _options()
    assert "-XX:+ExitOnOutOfMemoryError" in options
    # bench/README.md, ingest_bench "JIT thresholds": C2 compiled start-up code for 9 CPU-s.
    assert "-XX:Tier4InvocationThreshold=50000" in options
    assert "-XX:Tier4BackEdgeThreshold=400000" in options


def test_a_users_java_options_come_after_ours_and_keep_them() -> None:
    options = _options({JAVA: "-Xss4m -XX:Tier4InvocationThreshold=5000"})
    # The user's flags last: HotSpot takes a flag's last value, so theirs win.
    assert options[-2:] == ["-Xss4m", "-XX:Tier4InvocationThreshold=5000"]
    # Ours stay: without ExitOnOutOfMemoryError an OOM can leave a write waiting for ever.
    assert "-XX:+ExitOnOutOfMemoryError" in options[:-2]


class _SlowStart(SparkSessionOwner):
    """A session whose start blocks until released (no JVM), counting its starts."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__(SparkSettings(master="local[2]"))
        self.release = threading.Event()
        self.entered = threading.Event()
        self.starts = 0
        self.error = error

    def _start(self) -> None:
        self.starts += 1
        self.entered.set()
        assert self.release.wait(10)
        if self.error is not None:
            raise self.error


def test_begin_starts_the_session_in_the_background_and_start_waits_for_it() -> None:
    owner = _SlowStart()
    owner.begin()  # returns while the start blocks
    assert owner.entered.wait(10) and owner.starts == 1
    owner.begin()  # once only
    waiter = threading.Thread(target=owner.start)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive(), "start() waits for the start begin() made"
    owner.release.set()
    waiter.join(10)
    assert not waiter.is_alive() and owner.starts == 1


def test_start_raises_the_error_of_a_start_begun_in_the_background() -> None:
    owner = _SlowStart(RuntimeError("java not found"))
    owner.begin()
    owner.release.set()
    with pytest.raises(RuntimeError, match="java not found"):
        owner.start()
