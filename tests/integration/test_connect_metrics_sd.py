"""``icesink connect``'s tasks scraped by a real Prometheus through HTTP service discovery.

Two real connect processes (one cluster, basic auth on its API) run two connectors, one task
each, every task a worker replica with its own metrics port. Either process's
``GET /metrics/targets`` lists all three. Prometheus (Debian's package) scrapes the processes'
own ``/metrics`` directly and finds the tasks through ``http_sd_configs`` on one process's
``GET /metrics/targets`` (with the API's basic auth), as deploy/prometheus/*.yml do: each task's
series come labelled with its connector and task and its process's instance, the dashboard's
replica count and the alert rules' joins on ``(job, instance, connector, task)`` answer per task,
and the processes' own ``/metrics`` hold only their ``icesink_connect_*`` series.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest

from tests.integration.test_observability import _query, _start_prometheus
from tests.support.connect import call, process_config, start_connect, wait_status, wait_targets
from tests.unit.test_config import TUTORIAL

pytestmark = pytest.mark.integration

BASIC_AUTH = "org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension"
LOGIN_MODULE = "org.apache.kafka.connect.rest.basic.auth.extension.PropertyFileLoginModule"
USER = ("prometheus", "scrape-pw-7")
SECRET = "sd-control-secret-4e1b"  # the connectors' control secret: in no answer below
CONNECTORS = {"orders": 2, "refunds": 1}  # name -> tasks (and partitions of its topic sd-<name>)
TASKS = [(name, str(t)) for name in sorted(CONNECTORS) for t in range(CONNECTORS[name])]


def _wait(what: str, check: Any, timeout_s: float = 180) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(1)
    raise AssertionError(f"{what} not seen in {timeout_s} s (last: {last})")


def test_prometheus_scrapes_each_task_through_the_connect_process_service_discovery(broker, catalog_props, tmp_path):
    from icesink.app.pizzas import pizza_values, produce
    from icesink.shared.kafka_admin import ensure_topic

    for name, tasks in CONNECTORS.items():
        asyncio.run(ensure_topic(broker.bootstrap, f"sd-{name}", tasks))
        asyncio.run(produce(broker.bootstrap, f"sd-{name}", pizza_values(50, seed=5), partitions=tasks))
    credentials = tmp_path / "credentials.properties"
    credentials.write_text(f"{USER[0]}: {USER[1]}\n")
    jaas = tmp_path / "jaas.conf"
    jaas.write_text(f'KafkaConnect {{\n  {LOGIN_MODULE} required\n  file="{credentials}";\n}};\n')
    processes = []
    prometheus = None
    try:
        for name in ("c1", "c2"):  # one cluster of two processes
            config = process_config(tmp_path, broker.bootstrap, "sd-connect", **{
                "rest.extension.classes": BASIC_AUTH, "java.security.auth.login.config": str(jaas),
                "metrics.host": "127.0.0.1",  # the tasks' too: this test's machine only
                "connector.config.override.allow": "iceberg.catalog.uri,iceberg.catalog.warehouse"})
            processes.append(start_connect(tmp_path, name, config,
                                           ready=lambda p: call(p.api, "GET", "/", auth=USER)[0] == 200))
        process = processes[0]
        instance = {f"127.0.0.1:{p.api}": f"127.0.0.1:{p.metrics}" for p in processes}  # worker id -> instance
        for name, tasks in CONNECTORS.items():
            connector = {**TUTORIAL, "tasks.max": str(tasks), "topics": f"sd-{name}", "iceberg.tables": f"sd.{name}",
                         "iceberg.catalog": "it", **{f"iceberg.catalog.{k}": v for k, v in catalog_props.items()},
                         "iceberg.control.topic": f"sd-{name}-control", "iceberg.control.commit.interval-ms": 2000,
                         "iceberg.control.topic.replication-factor": "1", "iceberg.control.secret": SECRET}
            for key in [k for k in connector if k.startswith("iceberg.catalog.") and k.split(".", 2)[2] not in catalog_props]:
                del connector[key]
            code, body = call(process.api, "PUT", f"/connectors/{name}/config", connector, auth=USER)
            assert code == 201, body
        # once the group has both processes: orders' two tasks on one each
        wait_status(process.api, "orders", lambda s: len({t["worker_id"] for t in s["tasks"]}) == 2, auth=USER)
        owner = {}
        for name, tasks in CONNECTORS.items():
            status = wait_status(process.api, name, lambda s, n=tasks: len(s["tasks"]) == n and all(
                t["state"] == "RUNNING" for t in s["tasks"]), auth=USER)
            owner.update({(name, str(t["id"])): t["worker_id"] for t in status["tasks"]})
        assert len(set(owner.values())) == 2, owner
        expected = [{"instance": instance[owner[key]], "connector": key[0], "task": key[1]} for key in TASKS]

        # the discovery endpoint: behind the API's authentication, one target group per task of the
        # cluster, whichever process answers
        assert call(process.api, "GET", "/metrics/targets")[0] == 401
        for p in processes:
            groups = wait_targets(p.api, len(TASKS), timeout_s=180, auth=USER)
            assert [g["labels"] for g in groups] == expected, groups
            assert all(len(g["targets"]) == 1 and g["targets"][0].startswith("127.0.0.1:") for g in groups)
        # what the discovery points at (a task's /metrics and /status, beyond loopback unless metrics.host
        # says otherwise) holds no secret, nor does the discovery answer
        bodies = [json.dumps(groups)] + [urllib.request.urlopen(f"http://{g['targets'][0]}{path}", timeout=10).read().decode()
                                         for g in groups for path in ("/metrics", "/status")]
        assert not [b for b in bodies if SECRET in b or USER[1] in b]

        prometheus, port = _start_prometheus(tmp_path, [], scrape_configs=[
            {"job_name": "icesink-connect",
             "static_configs": [{"targets": [f"127.0.0.1:{p.metrics}" for p in processes]}]},
            {"job_name": "icesink-connect-tasks",
             "http_sd_configs": [{"url": f"http://127.0.0.1:{process.api}/metrics/targets", "refresh_interval": "1s",
                                  "basic_auth": {"username": USER[0], "password": USER[1]}}]},
        ])

        def info() -> list[dict[str, Any]]:
            found = _query(port, "/api/v1/query", query="icesink_info")["result"]
            return found if len(found) == len(TASKS) else []

        series = _wait("both tasks' icesink_info", info)
        assert sorted((s["metric"]["job"], s["metric"]["instance"], s["metric"]["connector"], s["metric"]["task"])
                      for s in series) == sorted(("icesink-connect-tasks", instance[owner[key]], *key) for key in TASKS)
        def up_series() -> list[dict[str, Any]]:  # the static job's targets are scraped on their own schedule
            found = _query(port, "/api/v1/query", query="up")["result"]
            return found if len(found) == 2 + len(TASKS) else []

        up = _wait("every target's up", up_series)
        assert sorted((u["metric"]["job"], u["metric"].get("connector", ""), u["metric"].get("task", ""),
                       u["value"][1]) for u in up) == [
            ("icesink-connect", "", "", "1"), ("icesink-connect", "", "", "1"),
            *(("icesink-connect-tasks", *key, "1") for key in TASKS)]
        # the process's own series are its own: no task's series among them
        own = _query(port, "/api/v1/query", query='{job="icesink-connect"}')["result"]
        names = {s["metric"]["__name__"] for s in own}
        assert "icesink_connect_tasks" in names and "icesink_info" not in names, names

        # per task: the dashboard's replica count and the alert rules' joins (a duplicate series
        # is an error: the rule's health says so)
        replicas = _query(port, "/api/v1/query", query="count by (connector) (icesink_info)")["result"]
        assert sorted((r["metric"]["connector"], r["value"][1]) for r in replicas) == [
            (n, str(k)) for n, k in sorted(CONNECTORS.items())]
        no_coordinator = ("sum by (group) (icesink_coordinator_active * on (job, instance, connector, task) "
                          "group_left (group) max by (job, instance, connector, task, group) (icesink_info))")

        seen: list[Any] = []

        def coordinators() -> dict[str, str]:
            seen[:] = _query(port, "/api/v1/query", query=no_coordinator)["result"]
            found = {r["metric"].get("group", ""): r["value"][1] for r in seen}
            return found if found == {f"connect-{n}": "1" for n in CONNECTORS} else {}

        try:
            _wait("a coordinator in each sink group", coordinators, timeout_s=120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; Prometheus' last answer: {seen}") from None

        def evaluated() -> list[dict[str, Any]]:
            rules = [r for g in _query(port, "/api/v1/rules")["groups"] for r in g["rules"]]
            return rules if rules and all(r["health"] != "unknown" for r in rules) else []

        rules = _wait("every alert rule evaluated", evaluated)
        assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
        firing = [r["name"] for r in rules if r["state"] == "firing"]
        assert "IcesinkNoCoordinator" not in firing and "IcesinkReplicaFlapping" not in firing, firing
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(15)
        for p in processes:
            p.stop()
