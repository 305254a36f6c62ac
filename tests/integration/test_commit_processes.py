"""Table commits in processes of their own (iceberg.control.commit.processes) with a real
worker process, broker, Spark and catalog: a commit process killed with SIGKILL between rounds
is replaced, compaction and expiry run beside them, and every table holds each record exactly
once, read back by DuckDB."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.test_routing import events, ids_of

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)
def test_commits_in_processes_survive_a_killed_commit_process(broker, catalog_props, tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import assert_exact, http_json, metric, total_rows, wait_rows, write_config

    topic = "proc-events"
    regexes = {"pc.clicks": "click", "pc.orders": "order", "pc.refunds": "refund"}
    asyncio.run(ensure_topic(broker.bootstrap, topic, 3))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=",".join(regexes), bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group="proc-sink",
        **{"iceberg.tables.route-field": "type", "iceberg.control.commit.processes": 2,
           "iceberg.control.commit.interval-ms": 1000,
           # Maintenance beside them: the processes judge what is due, the replica compacts and expires.
           "maintenance.compaction.min-input-files": 4, "maintenance.snapshots.max-age-ms": 2000,
           "maintenance.snapshots.retain-last": 2},
        **{f"iceberg.table.{t}.route-regex": rx for t, rx in regexes.items()},
    )
    values = events(9_000, seed=11)
    first, second = values[:4_500], values[4_500:]
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r = replicas.start("solo")
        asyncio.run(produce(broker.bootstrap, topic, first, partitions=3))
        wait_rows(catalog, replicas, tuple(regexes), {t: len(ids_of(first, rx)) for t, rx in regexes.items()})
        pids: list[int] = []
        deadline = time.monotonic() + 60
        while not pids:  # /status names them once a round has committed in them
            assert time.monotonic() < deadline, "no commit processes in /status"
            pids = (http_json(r.metrics_port)["coordinator"] or {}).get("commit_processes") or []
            time.sleep(0.5)
        assert r.proc.pid not in pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for i in range(0, len(second), 600):  # a round at a time: files to compact, snapshots to expire
            asyncio.run(produce(broker.bootstrap, topic, second[i:i + 600], partitions=3))
            sent = first + second[:i + 600]  # committed before the next: one more file per table however slow
            wait_rows(catalog, replicas, tuple(regexes), {t: len(ids_of(sent, rx)) for t, rx in regexes.items()})
        expected = {t: ids_of(values, rx) for t, rx in regexes.items()}
        wait_rows(catalog, replicas, tuple(regexes), {t: len(ids) for t, ids in expected.items()})
        time.sleep(5)  # a late duplicate would show up here
        assert {t: total_rows(catalog, t) for t in regexes} == {t: len(ids) for t, ids in expected.items()}
        replicas.check_alive()  # the replica itself lived on
        now = (http_json(r.metrics_port)["coordinator"] or {}).get("commit_processes") or []
        assert now and not set(now) & set(pids)
        assert metric(r.metrics_port, "icesink_commit_failures_total") >= 1  # the attempts that found one gone
        log = r.log_path.read_text(errors="replace")
        assert "stopped before answering" in log
        deadline = time.monotonic() + 60
        while not (metric(r.metrics_port, "icesink_maintenance_files_rewritten_total") > 0
                   and metric(r.metrics_port, "icesink_maintenance_snapshots_expired_total") > 0):
            assert time.monotonic() < deadline, "no compaction or expiry beside the commit processes"
            time.sleep(1)
        report = http_json(r.metrics_port)["coordinator"]["maintenance"]
        assert all(entry.get("error") is None for entry in report.values()), report
        assert {t: total_rows(catalog, t) for t in regexes} == {t: len(ids) for t, ids in expected.items()}
    finally:
        replicas.stop_all()
    for t, ids in expected.items():
        assert_exact(catalog, t, ids, key="id")
