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


def test_the_local_jvm_logs_through_icesinks_log4j_config_labelled_and_quiet_37() -> None:
    """Spark's console lines ("Using Spark's default log4j profile", "Setting default log level",
    its hostname warning) mixed into the worker's log unlabelled: the local JVM now logs WARN and up
    in the worker's line format, each line labelled ``spark.<logger>``."""
    from pathlib import Path

    found = [o for o in _options() if o.startswith("-Dlog4j2.configurationFile=")]
    assert len(found) == 1
    config = Path(found[0].split("=", 1)[1])
    text = config.read_text()
    assert "rootLogger.level = warn" in text and "spark.%c{1}: %m" in text
    assert "SYSTEM_ERR" in text


def test_a_spark_connect_server_on_this_host_stages_remote_locations_as_a_local_session_does() -> None:
    """icesink connect's shared server runs on loopback: it writes a table on S3 into the
    task's staging directory, which the task uploads with the table's FileIO (no hadoop-aws)."""
    for remote in ("sc://localhost:15002/;token=x", "sc://127.0.0.1:15002"):
        s = SparkSettings(remote=remote, staging_dir="/tmp/stage")
        assert s.stages("s3://bucket/t") and not s.stages("file:///tmp/t")
    # a server elsewhere has its own disks: it writes the location itself
    assert not SparkSettings(remote="sc://spark.example:15002", staging_dir="/tmp/stage").stages("s3://bucket/t")
    assert SparkSettings(staging_dir="/tmp/stage").stages("s3://bucket/t")


def test_start_soon_starts_the_session_in_its_own_thread_and_start_waits_for_it(monkeypatch) -> None:
    """The worker's entry point begins the session's start before its imports
    (icesink/app/cli.py): the start runs once, ``before`` first, in a thread of its own, and the
    worker's own start() later waits for that one instead of starting a second session."""
    owner = SparkSessionOwner(SparkSettings(master="local[2]"))
    release = threading.Event()
    calls: list[str] = []

    def fake_start() -> None:
        calls.append(f"start in {threading.current_thread().name}")
        assert release.wait(10)

    monkeypatch.setattr(owner, "_start", fake_start)
    owner.start_soon(lambda: calls.append(f"before in {threading.current_thread().name}"))
    waiter = threading.Thread(target=owner.start)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive(), "start() returned before start_soon's start ended"
    release.set()
    waiter.join(10)
    assert not waiter.is_alive()
    assert calls == ["before in spark-start", "start in spark-start"]
    owner.start()  # a later start (after a stop, say) is a start of its own again
    assert calls[-1] == f"start in {threading.current_thread().name}"


def test_a_failed_start_soon_is_raised_by_start(monkeypatch) -> None:
    """Never swallowed: the worker's start() raises what the early start raised."""
    owner = SparkSessionOwner(SparkSettings(master="local[2]"))

    def broken() -> None:
        raise RuntimeError("JAVA_HOME is not set")

    monkeypatch.setattr(owner, "_start", broken)
    owner.start_soon()
    with pytest.raises(RuntimeError, match="JAVA_HOME"):
        owner.start()


def test_on_two_cpus_the_local_jvm_collects_with_the_serial_collector(monkeypatch) -> None:
    """On two CPUs G1's concurrent threads take the core the worker reads on: the serial
    collector cost the JVM about a tenth less CPU behind a 2M backlog and the worker's run ended
    sooner in 5 of 6 alternating pairs (bench/README.md, "The serial collector on two CPUs")."""
    import spark_bridge.session as session

    monkeypatch.setattr(session, "available_cpus", lambda: 2)
    assert "-XX:+UseSerialGC" in _options()
    # a user's collector is theirs: two collectors named would stop the JVM from starting
    for choice in ("-XX:+UseG1GC", "-XX:+UseParallelGC", "-XX:+UseZGC", "-XX:-UseSerialGC"):
        options = _options({JAVA: f"-Xss4m {choice}"})
        assert "-XX:+UseSerialGC" not in options and options[-1] == choice
    monkeypatch.setattr(session, "available_cpus", lambda: 4)
    assert not [o for o in _options() if o.endswith("GC") and o.startswith("-XX:")]


def test_available_cpus_honours_the_affinity_and_a_cgroup_quota(tmp_path) -> None:
    from spark_bridge.session import available_cpus

    quota = tmp_path / "cpu.max"
    quota.write_text("max 100000\n")
    assert available_cpus(affinity=8, cpu_max=quota) == 8
    quota.write_text("150000 100000\n")  # a limit of 1.5 CPUs: the JVM counts 2
    assert available_cpus(affinity=8, cpu_max=quota) == 2
    quota.write_text("400000 100000\n")
    assert available_cpus(affinity=2, cpu_max=quota) == 2
    assert available_cpus(affinity=3, cpu_max=tmp_path / "absent") == 3
