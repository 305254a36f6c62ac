"""Early writes with real processes: a real broker, real Spark, a real catalog, read back by
DuckDB. Buffered rows past ``buffer.write-ahead-bytes`` are written to data files before their
round and reported by it (agents/rounds.py, agents/buffer.py); a partition that moves away
voids the files it shares, and the partitions that stay read those rows again."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.sinkrun import assert_exact, metric, total_rows, wait_rows, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

# maintenance off: compaction would leave replaced files on disk, which the file check counts
EARLY = {"buffer.write-ahead-bytes": 1 << 20, "consumer.max-batch": 2000, "maintenance.enabled": "false"}


def early_writes(port: int, outcome: str) -> float:
    return metric(port, f'icesink_early_writes_total{{outcome="{outcome}"}}')


def data_files_on_disk(table) -> set[str]:
    """Parquet files under the table's data directory, relative to it."""
    root = Path(table.location().removeprefix("file://")) / "data"
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet")}


def data_files_referenced(table) -> set[str]:
    root = table.location().removeprefix("file://") + "/data/"
    return {task.file.file_path.removeprefix("file://").removeprefix(root) for task in table.scan().plan_files()}


def new_topic(broker, topic: str, partitions: int) -> None:
    from icesink.shared.kafka_admin import ensure_topic

    asyncio.run(ensure_topic(broker.bootstrap, topic, partitions))


def backlog(broker, topic: str, partitions: int, n: int, seed: int) -> list[bytes]:
    """``n`` pizza events produced to ``topic`` of ``partitions`` partitions."""
    from icesink.app.pizzas import pizza_values, produce

    values = pizza_values(n, seed=seed)
    asyncio.run(produce(broker.bootstrap, topic, values, partitions=partitions))
    return values


def wait_warm(replicas, replica, timeout_s: float = 120) -> None:
    """Until the replica's Spark session is warm: records produced after that are read while
    earlier ones are written (read before it, a whole backlog is one write)."""
    deadline = time.monotonic() + timeout_s
    while "spark warmed up" not in replica.log_path.read_text(errors="replace"):
        replicas.check_alive()
        assert time.monotonic() < deadline, f"replica {replica.name}: spark not warm within {timeout_s} s"
        time.sleep(0.5)


def wait_metric(replicas, port: int, name: str, at_least: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        replicas.check_alive()
        try:
            if metric(port, name) >= at_least:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{name} not >= {at_least} within {timeout_s} s"
        time.sleep(0.5)


def test_a_backlog_is_written_ahead_of_its_round_and_committed_exactly_once(broker, catalog_props, tmp_path):
    """150k records, a 1 MiB write-ahead and 20 s rounds: the backlog is written to files while
    it is read (one write at a time, the next one with what came in meanwhile), and the first
    round reports them all."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet

    n = 150_000
    new_topic(broker, "early-pizzas", 3)
    cfg = write_config(tmp_path / "early.json", topics="early-pizzas", tables="early.pizzas",
                       bootstrap=broker.bootstrap, catalog_props=catalog_props, state_dir=tmp_path / "state",
                       group="early-sink", **EARLY, **{"iceberg.control.commit.interval-ms": 20000})
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r = replicas.start("solo")
        wait_warm(replicas, r)
        values = backlog(broker, "early-pizzas", 3, n, seed=21)
        wait_rows(catalog, replicas, ("early.pizzas",), n, timeout_s=240)
        landed = early_writes(r.metrics_port, "landed")
    finally:
        replicas.stop_all()
    assert landed >= 2, f"{landed} early writes for {n:,} records at a 1 MiB write-ahead"
    table = catalog.load_table("early.pizzas")
    assert_exact(catalog, "early.pizzas", {json.loads(v)["order_id"] for v in values})
    assert data_files_on_disk(table) == data_files_referenced(table)


def test_a_partition_moving_away_voids_the_files_it_shares_and_loses_nothing(broker, catalog_props, tmp_path):
    """One replica reads a 240k backlog of 6 partitions into files written early (60 s rounds,
    so none is reported yet: the first round is timed from the coordinator's start, and on a
    loaded machine the replica's start-up, the backlog and the second replica's join took
    more than 30 s); a second replica joins and takes half the partitions. The first
    one's files cover partitions it lost: they are deleted, the partitions it keeps read those
    rows again, the new owner reads its own from the accepted position. Every key exactly once,
    no data file left that no snapshot references."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet

    n = 240_000
    new_topic(broker, "void-pizzas", 6)
    cfg = write_config(tmp_path / "void.json", topics="void-pizzas", tables="void.pizzas",
                       bootstrap=broker.bootstrap, catalog_props=catalog_props, state_dir=tmp_path / "state",
                       group="void-sink", **EARLY, **{"iceberg.control.commit.interval-ms": 60000,
                                                       "iceberg.control.commit.timeout-ms": 30000})
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        first = replicas.start("first")
        wait_warm(replicas, first)
        values = backlog(broker, "void-pizzas", 6, n, seed=22)
        wait_metric(replicas, first.metrics_port, 'icesink_early_writes_total{outcome="landed"}', 2, 180)
        assert metric(first.metrics_port, "icesink_rounds_committed_total") == 0  # nothing reported yet
        replicas.start("second")
        wait_rows(catalog, replicas, ("void.pizzas",), n, timeout_s=300)
        dropped = early_writes(first.metrics_port, "dropped")
    finally:
        replicas.stop_all()
    assert dropped >= 1, "the first replica's early files were not voided when its partitions moved"
    assert_exact(catalog, "void.pizzas", {json.loads(v)["order_id"] for v in values})
    table = catalog.load_table("void.pizzas")
    assert data_files_on_disk(table) == data_files_referenced(table)


def test_a_worker_killed_after_an_early_write_loses_nothing(broker, catalog_props, tmp_path):
    """kill -9 right after an early write landed (``fault.crash-at=worker.after-early-write``):
    its files are named by no event, so nothing commits them; the restarted replica reads the
    partitions again from the accepted position. Every key exactly once. The backlog is there
    before the replica starts: what is read before its Spark session is up is written as soon
    as it is (Rounds.warm_up), not left for the round."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet

    n = 120_000
    new_topic(broker, "killed-pizzas", 3)
    values = backlog(broker, "killed-pizzas", 3, n, seed=23)  # read before Spark is up: written once it is
    state = tmp_path / "state"

    def config(name: str, interval_ms: int) -> Path:
        return write_config(tmp_path / name, topics="killed-pizzas", tables="killed.pizzas",
                            bootstrap=broker.bootstrap, catalog_props=catalog_props, state_dir=state,
                            group="killed-sink", **EARLY, **{"iceberg.control.commit.interval-ms": interval_ms,
                                                              "fault.crash-at": "worker.after-early-write"})

    # The doomed replica's first round a minute away: on loaded cores its Spark can start after a
    # 10 s round came, which then took the whole backlog and no early write came (a CI run).
    cfg = config("killed.json", 60_000)
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    again = ReplicaSet(config("again.json", 10_000), tmp_path / "logs-again")  # the fault fired: not again
    try:
        doomed = replicas.start("doomed")
        deadline = time.monotonic() + 180
        while doomed.alive:
            assert time.monotonic() < deadline, "the replica did not crash after an early write"
            time.sleep(0.5)
        assert (state / "fault-worker.after-early-write.fired").exists()
        replicas.kill("doomed")
        again.start("again")
        wait_rows(catalog, again, ("killed.pizzas",), n, timeout_s=240)
    finally:
        replicas.stop_all()
        again.stop_all()
    assert_exact(catalog, "killed.pizzas", {json.loads(v)["order_id"] for v in values})
    table = catalog.load_table("killed.pizzas")
    unreferenced = data_files_on_disk(table) - data_files_referenced(table)
    # the dead replica's early files: left for the orphan sweep (icesink gc, maintenance), which
    # may delete them now that their rows are committed again
    assert unreferenced and all(path.startswith("iskw-") and "-early-" in path for path in unreferenced), unreferenced
    gc = subprocess.run([sys.executable, "-m", "icesink", "gc", "--config", str(cfg), "--delete", "--older-than", "0s"],
                        capture_output=True, text=True, timeout=180)
    assert gc.returncode == 0 and "deleted orphan file" in gc.stderr, gc.stderr[-3000:]
    table = catalog.load_table("killed.pizzas")
    assert data_files_on_disk(table) == data_files_referenced(table), gc.stderr[-3000:]
    assert_exact(catalog, "killed.pizzas", {json.loads(v)["order_id"] for v in values})


def request_round(bootstrap: str, topic: str, group: str, catalog: Any) -> None:
    """A CommitRequest on the group's control log, as a worker with a full buffer sends (signed
    with the group's key, as the group's replicas sign): the coordinator starts a round now."""
    from icesink.shared.control import ControlProducer
    from icesink.shared.protocol import CommitRequest
    from tests.support.sinkrun import group_key

    async def send() -> None:
        producer = ControlProducer(bootstrap, topic, group, {}, group_key(catalog, group))
        await producer.start()
        try:
            await producer.send(CommitRequest("test", 0))
        finally:
            await producer.stop()

    asyncio.run(send())


def test_early_files_of_a_frozen_group_survive_gc_and_another_groups_sweep(broker, catalog_props, tmp_path):
    """Group A's only replica writes a backlog to files early (hour-long rounds: none reported
    yet) and is frozen with SIGSTOP (a connector paused over a weekend); its files are aged past
    every grace period. ``icesink gc --delete --older-than 1s`` of group A, then the scheduled
    sweep of group B, which writes the same table, keep them: group A may still commit them.
    Each deletes (and logs; the sweep counts) an old stray file nobody can commit. A wakes and is asked
    for a round (a CommitRequest): it commits the files; the table is exact and readable by
    DuckDB."""
    import os
    import signal

    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import http_json

    n, table_name = 120_000, "frozen.pizzas"
    new_topic(broker, "frozen-pizzas", 3)
    new_topic(broker, "sweeper-pizzas", 1)
    cfg_a = write_config(tmp_path / "a.json", topics="frozen-pizzas", tables=table_name,
                         bootstrap=broker.bootstrap, catalog_props=catalog_props, state_dir=tmp_path / "state-a",
                         group="frozen-sink", **EARLY, **{"iceberg.control.commit.interval-ms": 3_600_000,
                                                          "iceberg.control.commit.timeout-ms": 30000})
    cfg_b = write_config(tmp_path / "b.json", topics="sweeper-pizzas", tables=table_name,
                         bootstrap=broker.bootstrap, catalog_props=catalog_props, state_dir=tmp_path / "state-b",
                         group="sweeper-sink", **{"maintenance.orphans.interval-ms": 1000,
                                                  "maintenance.orphans.older-than-ms": 60000})
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg_a, tmp_path / "logs")
    frozen = False
    try:
        a = replicas.start("a")
        wait_warm(replicas, a, timeout_s=300)
        values = backlog(broker, "frozen-pizzas", 3, n, seed=24)
        wait_metric(replicas, a.metrics_port, 'icesink_early_writes_total{outcome="landed"}', 2, 180)
        assert metric(a.metrics_port, "icesink_rounds_committed_total") == 0  # nothing reported yet
        os.killpg(a.proc.pid, signal.SIGSTOP)
        frozen = True
        table = catalog.load_table(table_name)
        root = Path(table.location().removeprefix("file://")) / "data"
        early = sorted(root / p for p in data_files_on_disk(table))
        assert early, "no early-written file on disk"
        old = time.time() - 7200
        for p in early:
            os.utime(p, (old, old))

        def stray(name: str) -> Path:  # an old file no round can commit (unfenced: judged by age)
            path = root / "stray" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"not committed by anyone")
            os.utime(path, (old, old))
            return path

        for_gc = stray("left-by-a-crash.parquet")
        gc = subprocess.run([sys.executable, "-m", "icesink", "gc", "--config", str(cfg_a), "--delete",
                             "--older-than", "1s"], capture_output=True, text=True, timeout=180)
        assert gc.returncode == 0, gc.stderr[-3000:]
        assert all(p.exists() for p in early), f"icesink gc deleted early files of a live group:\n{gc.stderr[-3000:]}"
        assert not for_gc.exists() and "deleted orphan file" in gc.stderr and for_gc.name in gc.stderr, gc.stderr
        for_sweep = stray("left-by-another-crash.parquet")

        b = replicas.start("b", config=cfg_b)
        b_values = backlog(broker, "sweeper-pizzas", 1, 1000, seed=25)
        deadline = time.monotonic() + 240
        while True:  # B committed to the table, and swept it after deleting the stray file
            assert time.monotonic() < deadline, "group B did not sweep the table"
            try:
                if metric(b.metrics_port, "icesink_maintenance_orphans_deleted_total") >= 1:
                    swept = http_json(b.metrics_port)["coordinator"]["maintenance"][table_name]["at"]
                    break
            except (OSError, KeyError, TypeError):
                pass
            time.sleep(1)
        while http_json(b.metrics_port)["coordinator"]["maintenance"][table_name]["at"] <= swept + 2:
            assert time.monotonic() < deadline, "group B did not sweep the table again"
            time.sleep(1)
        assert all(p.exists() for p in early), "group B's sweep deleted early files group A may still commit"
        assert not for_sweep.exists()
        assert "stray/left-by-another-crash.parquet" in b.log_path.read_text(errors="replace")  # logged

        os.killpg(a.proc.pid, signal.SIGCONT)
        frozen = False
        deadline = time.monotonic() + 300
        while total_rows(catalog, table_name) < n + 1000:  # a round now, again if it closed before A answered
            replicas.check_alive()
            assert time.monotonic() < deadline, f"{total_rows(catalog, table_name)} rows, expected {n + 1000}"
            request_round(broker.bootstrap, "frozen-sink-control", "frozen-sink", catalog)
            time.sleep(15)
    finally:
        if frozen:
            os.killpg(a.proc.pid, signal.SIGCONT)
        replicas.stop_all()
    assert_exact(catalog, table_name, {json.loads(v)["order_id"] for v in values + b_values})


def test_a_worker_does_not_report_an_early_file_that_is_gone(broker, catalog_props, tmp_path):
    """A file written early is deleted by someone else before its round (by hand here; a
    sweep never deletes one a round may commit). The worker checks its early files exist before
    it reports them: it answers nothing, reads those rows again, and the next round commits them
    in new files. Every key exactly once, the table readable by DuckDB (a reported missing file
    would be committed and break every read: "No such file")."""
    import os

    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet

    n, table_name = 60_000, "gone.pizzas"
    new_topic(broker, "gone-pizzas", 3)
    cfg = write_config(tmp_path / "gone.json", topics="gone-pizzas", tables=table_name, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="gone-sink", **EARLY,
                       **{"iceberg.control.commit.interval-ms": 3_600_000, "iceberg.control.commit.timeout-ms": 30000})
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r = replicas.start("solo")
        wait_warm(replicas, r, timeout_s=300)
        values = backlog(broker, "gone-pizzas", 3, n, seed=26)
        wait_metric(replicas, r.metrics_port, 'icesink_early_writes_total{outcome="landed"}', 1, 180)
        time.sleep(5)  # the backlog read: no early write under way
        table = catalog.load_table(table_name)
        root = Path(table.location().removeprefix("file://")) / "data"
        early = sorted(data_files_on_disk(table))
        assert early, "no early-written file on disk"
        os.remove(root / early[0])
        deadline = time.monotonic() + 300
        while total_rows(catalog, table_name) < n:
            replicas.check_alive()
            assert time.monotonic() < deadline, f"{total_rows(catalog, table_name)} rows, expected {n}"
            request_round(broker.bootstrap, "gone-sink-control", "gone-sink", catalog)
            time.sleep(15)
        missing = early_writes(r.metrics_port, "missing")
    finally:
        replicas.stop_all()
    assert missing >= 1, "the worker reported an early file that was gone"
    assert_exact(catalog, table_name, {json.loads(v)["order_id"] for v in values})


def test_a_rounds_write_cancels_the_warm_ups_write_and_the_jvm_logs_no_error(broker, catalog_props, tmp_path):
    """The warm-up's throw-away writes (here two million rows each, seconds of two cores) are
    under way when records come; the round's write that follows cancels the warm-up's write in flight
    (spark_bridge/warm_up.py) instead of sharing the cores with it. The cancelled job logs no
    error (its log context is filtered out, spark_bridge/log4j2.properties), nothing is lost,
    and the warm-up leaves no file in staging. The records come once the warm-up began its first
    write, cold and of two million rows on one core (many seconds), and their round follows as
    soon as they are read (commit.catch-up): that write is still in flight then."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet

    n = 5_000
    new_topic(broker, "cw-pizzas", 2)
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "cw.json", topics="cw-pizzas", tables="cw.pizzas", bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=state, group="cw-sink",
                       **{"write.warm-up-rows": 2_000_000, "write.warm-up-files": 400,
                          "iceberg.control.commit.interval-ms": 2000})
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r = replicas.start("cw")
        deadline = time.monotonic() + 120
        while "spark warming up" not in r.log_path.read_text(errors="replace"):
            replicas.check_alive()
            assert time.monotonic() < deadline, "no warm-up began"
            time.sleep(0.1)
        values = backlog(broker, "cw-pizzas", 2, n, seed=24)
        wait_rows(catalog, replicas, ("cw.pizzas",), n, timeout_s=180)
        log = r.log_path.read_text(errors="replace")
        deadline = time.monotonic() + 10
        while left := [p for p in (state / "staging").rglob("*") if p.is_file() and p.name != ".icesink-staging"]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        replicas.stop_all()
    assert "spark warm-up write cancelled after" in log and "spark warmed up" not in log, log[-3000:]
    assert not [line for line in log.splitlines() if " ERROR " in line], log[-3000:]
    assert left == [], left[:5]
    assert_exact(catalog, "cw.pizzas", {json.loads(v)["order_id"] for v in values})
