"""``icesink connect`` with one Spark for all its tasks (``connect.spark.shared=true``).

A real connect process on the embedded broker runs a 3-task connector: exactly one Spark JVM
runs under it (the shared Spark Connect server; no task starts its own), the table is exact, and
the server's token is in no log. Then the server is killed with SIGKILL mid-run: the process
starts it again, the tasks' failed writes are retried, and the table still ends exact.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.test_connect import TABLE, _call, _start_connect, _wait_rows, _wait_status
from tests.unit.test_config import TUTORIAL

pytestmark = pytest.mark.integration
#: Its own topic and connect group: the session's broker holds test_connect's and test_connect_offsets'.
TOPIC = "shared-spark-pizzas"


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _java_under(pid: int) -> dict[int, str]:
    """The JVMs under ``pid``: their pids and command lines."""
    out = {}
    for p in _descendants(pid):
        try:
            exe = os.readlink(f"/proc/{p}/exe")
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if os.path.basename(exe) == "java":
            out[p] = cmdline
    return out


def test_the_tasks_of_a_connect_process_share_one_spark_which_is_restarted_when_it_dies(
        broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import assert_exact, metric

    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 3))
    values = pizza_values(3000, seed=42)
    asyncio.run(produce(broker.bootstrap, TOPIC, values[:2000], partitions=3))
    proc, api, metrics_port = _start_connect(tmp_path, "c1", broker.bootstrap, tmp_path / "state", shared_spark=True,
                                             group="connect-shared")
    catalog = load_catalog("it", **catalog_props)
    connector = {**TUTORIAL, "tasks.max": "3", "topics": TOPIC, "iceberg.tables": TABLE, "iceberg.catalog": "it",
                 **{f"iceberg.catalog.{k}": v for k, v in catalog_props.items()},
                 "iceberg.control.topic": "connect-shared-control", "iceberg.control.commit.interval-ms": 2000}
    for key in [k for k in connector if k.startswith("iceberg.catalog.") and k.split(".", 2)[2] not in catalog_props]:
        del connector[key]
    try:
        code, body = _call(api, "PUT", "/connectors/pizzas/config", connector)
        assert code == 201, body
        _wait_status(api, "RUNNING")
        _wait_rows(catalog, 2000, [proc])
        assert_exact(catalog, TABLE, {json.loads(v)["order_id"] for v in values[:2000]})

        # three tasks, one JVM: the shared server, a child of the connect process
        jvms = _java_under(proc.pid)
        assert len(jvms) == 1, jvms
        (server, cmdline), = jvms.items()
        assert "SparkConnectServer" in cmdline
        assert metric(metrics_port, "icesink_connect_spark_up") == 1
        # its token is in the tasks' config files only: no log holds it, nor the server's command line
        task_files = list((tmp_path / "state").rglob("tasks/*.json"))
        assert len(task_files) == 3
        remote = json.loads(task_files[0].read_text())["spark.remote"]
        token = remote.split(";token=", 1)[1]
        assert token and token not in cmdline
        for log_file in [tmp_path / "c1.log", *(tmp_path / "state").rglob("*.log")]:
            assert token not in log_file.read_text(errors="replace"), log_file

        # kill -9 the server mid-run: started again, the tasks' writes retried, still exact
        os.kill(server, signal.SIGKILL)
        asyncio.run(produce(broker.bootstrap, TOPIC, values[2000:], partitions=3))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (set(_java_under(proc.pid)) - {server}):
            time.sleep(1)
        restarted = _java_under(proc.pid)
        assert len(restarted) == 1 and server not in restarted, restarted
        _wait_rows(catalog, 3000, [proc], timeout_s=600)
        assert_exact(catalog, TABLE, {json.loads(v)["order_id"] for v in values})
        assert metric(metrics_port, "icesink_connect_spark_restarts_total") >= 1
        assert "the shared Spark Connect server exited" in (tmp_path / "c1.log").read_text()
        assert len(_java_under(proc.pid)) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except Exception:  # noqa: BLE001 - the test's own cleanup
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
