"""``icesink connect``: two real connect processes on the embedded broker form one cluster.

The tutorial's connector JSON (addresses changed) is PUT to one process; both serve it; its two
tasks run as worker replicas on both processes; the table is exact. Then: a bad config is a 400
naming the key, pause makes no new snapshots, resume continues exactly once, a connect process
killed -9 has its task moved to the other (still exact), the offsets shown are the table's, stop
shuts the replicas down and resume brings them back, and Spark (the session fixture
``spark_reader``) reads the table through the same catalog as DuckDB and pyiceberg do; DELETE
stops the replicas (404).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_config import TUTORIAL

pytestmark = pytest.mark.integration

TOPIC, TABLE = "connect-pizzas", "connect.pizzas"


def _call(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _start_connect(tmp_path: Path, name: str, bootstrap: str, state: Path,
                   shared_spark: bool = False, group: str = "connect-it") -> tuple[subprocess.Popen[bytes], int, int]:
    from icesink.app.embedded import _die_with_parent_hook, free_port

    api, metrics = free_port(), free_port()
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps({
        "bootstrap.servers": bootstrap, "listeners": f"http://127.0.0.1:{api}",
        "rest.advertised.host.name": "127.0.0.1", "metrics.port": metrics, "group.id": group,
        "config.storage.topic": f"{group}-configs", "state.dir": str(state),
        "heartbeat.interval-ms": 500, "session.timeout-ms": 6000,
        # defaults for every task: a small Spark, short sessions and shutdowns
        "spark.master": "local[1]", "spark.driver.memory": "1g", "consumer.session-timeout-ms": 6000,
        "shutdown.timeout-ms": 15000, "connect.spark.shared": str(shared_spark).lower(),
        # the connectors name this test's SQLite catalog: a file of this host, which only the process allows
        "connector.config.override.allow": "iceberg.catalog.uri,iceberg.catalog.warehouse",
    }))
    log = (tmp_path / f"{name}.log").open("ab")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESINK_")}
    proc = subprocess.Popen([sys.executable, "-m", "icesink", "connect", "--config", str(config)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=_die_with_parent_hook())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
        try:
            if _call(api, "GET", "/")[0] == 200:
                return proc, api, metrics
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{name} did not serve its API in 60 s")


def _wait_status(port: int, want: str, workers: int | None = None, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    status: Any = None
    while time.monotonic() < deadline:
        code, status = _call(port, "GET", "/connectors/pizzas/status")
        if code == 200 and status["connector"]["state"] == want and status["tasks"] and all(
                t["state"] == want for t in status["tasks"]) and (
                workers is None or len({t["worker_id"] for t in status["tasks"]}) == workers):
            return status  # type: ignore[no-any-return]
        time.sleep(0.5)
    raise AssertionError(f"connector not {want} in {timeout_s} s: {status}")


def _wait_rows(catalog: Any, n: int, procs: list[subprocess.Popen[bytes]], timeout_s: float = 180) -> None:
    from icesink.shared.iceberg import total_rows

    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a connect process exited"
        seen = total_rows(catalog, TABLE)
        if seen >= n:
            return
        time.sleep(1)
    raise AssertionError(f"expected {n} rows, found {seen}")


def _snapshots(catalog: Any) -> int:
    return len(catalog.load_table(TABLE).metadata.snapshots)


# Both brokers, about two minutes each: the real Kafka run is in `./dev chaos` (CI runs both), so
# that the default suite keeps its time; the conformance test (-m reference) runs connect on Kafka.
@pytest.mark.parametrize("each_broker", ["tansu", pytest.param("kafka", marks=[pytest.mark.kafka, pytest.mark.chaos])],
                         indirect=True)
def test_two_connect_processes_run_the_tutorial_connector_exactly_once(each_broker, catalog_props, tmp_path, spark_reader):
    """On Tansu and on a real Kafka broker (``each_broker``): the same flow, groups and all."""
    broker = each_broker
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from tests.support.connect import wait_targets
    from tests.support.sinkrun import assert_exact, metric
    from tests.support.spark_reader import assert_engines_agree, engine_counts, engine_rows

    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 4))
    values = pizza_values(3000, seed=21)
    keys = {json.loads(v)["order_id"] for v in values}
    asyncio.run(produce(broker.bootstrap, TOPIC, values[:2000], partitions=4))
    state = tmp_path / "state"
    first = _start_connect(tmp_path, "c1", broker.bootstrap, state)
    second = _start_connect(tmp_path, "c2", broker.bootstrap, state)
    procs = [first[0], second[0]]
    catalog = load_catalog("it", **catalog_props)
    connector = {**TUTORIAL, "tasks.max": "2", "topics": TOPIC, "iceberg.tables": TABLE, "iceberg.catalog": "it",
                 **{f"iceberg.catalog.{k}": v for k, v in catalog_props.items()},
                 "iceberg.control.topic": "connect-it-control", "iceberg.control.commit.interval-ms": 2000,
                 "iceberg.control.topic.replication-factor": "1"}  # one Kafka broker
    for key in [k for k in connector if k.startswith("iceberg.catalog.") and k.split(".", 2)[2] not in catalog_props]:
        del connector[key]  # the tutorial's REST and S3 addresses: this test's catalog instead
    try:
        code, body = _call(first[1], "PUT", "/connectors/pizzas/config", connector)
        assert code == 201 and body["name"] == "pizzas" and len(body["tasks"]) == 2, body
        assert _call(second[1], "GET", "/connectors") == (200, ["pizzas"])
        assert _call(second[1], "GET", "/connectors/pizzas/config")[1]["topics"] == TOPIC
        status = _wait_status(second[1], "RUNNING", workers=2)
        assert {t["worker_id"] for t in status["tasks"]} == {f"127.0.0.1:{first[1]}", f"127.0.0.1:{second[1]}"}
        _wait_rows(catalog, 2000, procs)
        assert_exact(catalog, TABLE, {json.loads(v)["order_id"] for v in values[:2000]})
        for _, api, metrics_port in (first, second):  # either process lists both tasks for Prometheus to scrape
            groups = wait_targets(api, 2)
            assert [(g["labels"]["connector"], g["labels"]["task"]) for g in groups] == [
                ("pizzas", "0"), ("pizzas", "1")], groups
            assert {g["labels"]["instance"] for g in groups} == {f"127.0.0.1:{first[2]}", f"127.0.0.1:{second[2]}"}
            assert all(metric(int(g["targets"][0].rsplit(":", 1)[1]), "icesink_info") == 1 for g in groups)
            assert metric(metrics_port, "icesink_connect_tasks") == 1 and metric(metrics_port, "icesink_info") == 0

        # a bad config is refused with the key named; unknown connectors are 404s shaped as Connect's
        code, body = _call(first[1], "PUT", "/connectors/other/config",
                           {**connector, "iceberg.control.commit.interval-ms": "soon"})
        assert code == 400 and body["error_code"] == 400 and "iceberg.control.commit.interval-ms" in body["message"]
        assert _call(first[1], "GET", "/connectors/other/status")[0] == 404

        # a task that cannot start is FAILED with its trace (mirror settings on a table without keys)
        from pyiceberg.schema import Schema
        from pyiceberg.types import LongType, NestedField, StringType

        catalog.create_table("connect.nokey", Schema(NestedField(1, "id", LongType()), NestedField(2, "op", StringType())))
        broken = {**connector, "tasks.max": "1", "iceberg.tables": "connect.nokey", "iceberg.tables.cdc-field": "op",
                  "iceberg.control.topic": "connect-it-broken"}
        assert _call(second[1], "POST", "/connectors", {"name": "broken", "config": broken})[0] == 201
        assert _call(second[1], "POST", "/connectors", {"name": "broken", "config": broken})[0] == 409
        deadline, task = time.monotonic() + 120, {}
        while task.get("state") != "FAILED" and time.monotonic() < deadline:
            time.sleep(1)
            task = _call(first[1], "GET", "/connectors/broken/status")[1]["tasks"][0]
        assert task["state"] == "FAILED" and "iceberg.tables.default-id-columns" in task["trace"], task
        assert _call(first[1], "DELETE", "/connectors/broken")[0] == 204

        # pause: no new snapshots while paused, even with new records waiting
        assert _call(first[1], "PUT", "/connectors/pizzas/pause")[0] == 202
        _wait_status(first[1], "PAUSED")
        time.sleep(1)
        before = _snapshots(catalog)
        asyncio.run(produce(broker.bootstrap, TOPIC, values[2000:2500], partitions=4))
        time.sleep(10)  # five commit intervals
        assert _snapshots(catalog) == before
        assert _call(second[1], "PUT", "/connectors/pizzas/resume")[0] == 202
        _wait_status(second[1], "RUNNING", workers=2)
        _wait_rows(catalog, 2500, procs)
        assert_exact(catalog, TABLE, {json.loads(v)["order_id"] for v in values[:2500]})

        # PUT of a changed config restarts both tasks (a new generation), which carry on exactly once
        def starts() -> int:
            return sum(1 for n in ("c1", "c2") for line in (tmp_path / f"{n}.log").read_text().splitlines()
                       if "connector pizzas task" in line and "started as replica" in line)

        started = starts()
        changed = {**connector, "iceberg.control.commit.interval-ms": 2500}
        assert _call(second[1], "PUT", "/connectors/pizzas/config", changed)[0] == 200
        deadline = time.monotonic() + 90
        while starts() < started + 2 and time.monotonic() < deadline:
            time.sleep(1)
        assert starts() >= started + 2, "the tasks did not restart on the changed config"
        assert _call(first[1], "GET", "/connectors/pizzas/config")[1]["iceberg.control.commit.interval-ms"] == "2500"
        _wait_status(first[1], "RUNNING", workers=2)

        # a connect process killed -9: its task (and its replica with it) moves to the other process
        os.kill(first[0].pid, signal.SIGKILL)
        first[0].wait()
        procs = [second[0]]
        status = _wait_status(second[1], "RUNNING", workers=1)
        assert {t["worker_id"] for t in status["tasks"]} == {f"127.0.0.1:{second[1]}"}
        asyncio.run(produce(broker.bootstrap, TOPIC, values[2500:], partitions=4))
        _wait_rows(catalog, 3000, procs)
        assert_exact(catalog, TABLE, keys)

        # the offsets Connect's API shows are the ones committed in the table: every record's
        code, body = _call(second[1], "GET", "/connectors/pizzas/offsets")
        assert code == 200 and sorted(o["partition"]["kafka_partition"] for o in body["offsets"]) == [0, 1, 2, 3], body
        assert {o["partition"]["kafka_topic"] for o in body["offsets"]} == {TOPIC}
        assert sum(o["offset"]["kafka_offset"] for o in body["offsets"]) == 3000, body

        # stop: the tasks' replicas shut down, no task left, the config kept; resume starts them again
        assert _call(second[1], "PUT", "/connectors/pizzas/stop")[0] == 204
        deadline, stopped = time.monotonic() + 90, {}
        while time.monotonic() < deadline and not (stopped.get("connector", {}).get("state") == "STOPPED"
                                                    and stopped["tasks"] == []):
            time.sleep(1)
            stopped = _call(second[1], "GET", "/connectors/pizzas/status")[1]
        assert stopped["connector"]["state"] == "STOPPED" and stopped["tasks"] == [], stopped
        assert _call(second[1], "GET", "/connectors/pizzas/tasks") == (200, [])
        assert _call(second[1], "GET", "/connectors/pizzas/config")[1]["topics"] == TOPIC
        deadline, found = time.monotonic() + 60, ["?"]
        while found and time.monotonic() < deadline:
            time.sleep(1)
            found = subprocess.run(["pgrep", "-f", f"{re.escape(str(state))}/.*/tasks/pizzas-"], capture_output=True,
                                   text=True).stdout.split()
        assert not found, f"task replicas still running while STOPPED: {found}"
        assert _call(second[1], "PUT", "/connectors/pizzas/resume")[0] == 202
        _wait_status(second[1], "RUNNING", workers=1)

        # Spark reads the tutorial's table through the same catalog: orders per store (the
        # tutorial's query) and every row, as DuckDB and pyiceberg do
        began = time.monotonic()
        spark = spark_reader.catalog("it", catalog_props)
        assert_engines_agree(engine_counts(spark, catalog, TABLE, "store_id"), f"{TABLE}: orders per store")
        assert_engines_agree(engine_rows(spark, catalog, TABLE), f"{TABLE}: rows")
        print(f"Spark's reads took {time.monotonic() - began:.1f} s")

        # DELETE stops the replicas
        assert _call(second[1], "DELETE", "/connectors/pizzas")[0] == 204
        assert _call(second[1], "GET", "/connectors/pizzas")[0] == 404
        assert _call(second[1], "GET", "/connectors") == (200, [])
        deadline, found = time.monotonic() + 60, ["?"]
        ours = f"{re.escape(str(state))}/.*/tasks/pizzas-"  # this test's replicas, not a parallel test's
        while found and time.monotonic() < deadline:  # replicas stop gracefully, within their shutdown bound
            time.sleep(1)
            found = subprocess.run(["pgrep", "-f", ours], capture_output=True, text=True).stdout.split()
        assert not found, f"task replicas still running: {found}"
        assert metric(second[2], 'icesink_connect_tasks{') == 0
        assert metric(second[2], 'icesink_info{connector="pizzas"') == 0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
