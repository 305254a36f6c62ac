"""``icesink connect`` without processes: the cluster state read from the config topic, the
shared assignment, the settings, and the REST API's Kafka Connect shapes on a fake backend."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from icesink.app.connect import connect_settings, load_connect_settings
from icesink.app.connect_state import (
    PLUGIN_VERSION, FAILED, PAUSED, RUNNING, UNASSIGNED, ClusterState, Placement, assign, connector_key, status_key,
    status_of,
)
from icesink.shared.errors import ConfigError
from tests.unit.test_connect_api import Backend


def _record(value: Any) -> bytes:
    return json.dumps(value).encode()


def test_connectors_are_put_changed_and_deleted_with_their_statuses():
    s = ClusterState()
    s.apply(5, connector_key("c"), _record({"config": {"tasks.max": "2", "topics": "t"}, "generation": 7}))
    assert s.connectors["c"].tasks == 2 and s.connectors["c"].target == RUNNING and s.position == 6
    s.apply(6, status_key("c", 0), _record({"state": RUNNING, "worker_id": "a:1", "generation": 7}))
    s.apply(7, connector_key("c"), _record({"config": {"tasks.max": "2"}, "target": PAUSED, "generation": 7}))
    assert s.connectors["c"].target == PAUSED and ("c", 0) in s.statuses
    s.apply(8, connector_key("c"), None)
    assert not s.connectors and not s.statuses


@pytest.mark.parametrize("key, value", [
    (None, _record({})), (b"connector/x", b"not json"), (b"connector/x", _record([1])),
    (b"connector/x", _record({"config": {"tasks.max": 2}})),  # values are strings, as Connect's
    (b"connector/x", _record({"config": {"tasks.max": "0"}})),
    (b"connector/x", _record({"config": {}, "target": "SLEEPING"})),
    (b"status/x/zero", _record({"state": RUNNING})), (b"status/x/0", _record({"state": "HAPPY"})),
    (b"something/else", _record({})),
])
def test_unreadable_config_records_are_skipped_and_counted(key, value, caplog):
    s = ClusterState()
    s.apply(41, key, value)
    assert s.skipped == 1 and s.position == 42 and not s.connectors and not s.statuses
    assert "config topic offset 41" in caplog.text


def test_an_older_versions_heartbeats_are_ignored_not_skipped():
    """Membership is the consumer group's now; a config topic written by an older version
    still holds ``worker/<id>`` heartbeats and tombstones."""
    s = ClusterState()
    s.apply(0, b"worker/a:1", _record({"url": "http://a:1"}))
    s.apply(1, b"worker/a:1", None)
    assert s.skipped == 0 and s.position == 2 and not s.connectors


def test_tasks_spread_over_processes_the_same_way_everywhere():
    alive = ["a:1", "b:1", "c:1"]
    owners = assign("pizzas", 6, alive)
    assert sorted(owners) == sorted(alive * 2)  # type: ignore[type-var]
    assert assign("pizzas", 6, list(alive)) == owners
    assert len(set(assign("pizzas", 2, alive))) == 2
    assert assign("pizzas", 2, []) == [None, None]


def test_status_is_connects_json_and_stale_reports_are_unassigned():
    s = ClusterState()
    s.apply(3, connector_key("c"), _record({"config": {"tasks.max": "2"}, "generation": 4}))
    placement = Placement.compute({"a:1": "http://a:1", "b:1": "http://b:1"}, s.layout(), "token")
    owners = assign("c", 2, ["a:1", "b:1"])
    assert placement.tasks["c"] == owners and placement.connectors["c"] == owners[0]
    s.apply(4, status_key("c", 0), _record({"state": RUNNING, "worker_id": owners[0], "generation": 4}))
    s.apply(5, status_key("c", 1), _record({"state": FAILED, "worker_id": owners[1], "generation": 4,
                                             "trace": "boom"}))
    st = status_of(s, "c", placement)
    assert st["type"] == "sink" and st["connector"]["state"] == RUNNING
    assert st["tasks"] == [{"id": 0, "state": RUNNING, "worker_id": owners[0], "version": PLUGIN_VERSION},
                           {"id": 1, "state": FAILED, "worker_id": owners[1], "trace": "boom", "version": PLUGIN_VERSION}]
    s.apply(6, connector_key("c"), _record({"config": {"tasks.max": "2"}, "generation": 5}))  # restarted
    assert [t["state"] for t in status_of(s, "c", placement)["tasks"]] == [UNASSIGNED, UNASSIGNED]
    nobody = Placement.compute({}, s.layout(), "token")
    assert status_of(s, "c", nobody)["connector"]["state"] == UNASSIGNED
    assert status_of(s, "c", Placement())["tasks"][1] == {"id": 1, "state": UNASSIGNED, "worker_id": "",
                                                           "version": PLUGIN_VERSION}  # not placed yet


def test_connect_settings_defaults_and_task_defaults(tmp_path):
    s = connect_settings({"bootstrap.servers": "k:9092", "state.dir": str(tmp_path), "security.protocol": "PLAINTEXT",
                          "spark.master": "local[1]"})
    # the API listens on loopback unless told otherwise
    assert (s.listen_host, s.listen_port, s.group_id, s.config_topic) == ("127.0.0.1", 8083, "icesink-connect",
                                                                         "icesink-connect-configs")
    assert s.task_defaults == {"spark.master": "local[1]"} and s.process_keys == {"security.protocol": "PLAINTEXT"}
    assert s.worker_id == "127.0.0.1:8083" and s.bootstrap_servers == "k:9092"
    sink = s.sink_settings({"topics": "t", "iceberg.tables": "db.t", "tasks.max": "3", "connector.class": "x"})
    assert sink.topics == ("t",) and sink.bootstrap_servers == "k:9092" and sink.spark_master == "local[1]"
    assert sink.state_dir == tmp_path and sink.group_id == "connect-connector"
    # the tasks' metrics listen where the process's do (Prometheus scrapes them: GET /metrics/targets);
    # the process reads their /status on loopback, or on the one interface they listen on
    assert (sink.metrics_host, s.metrics_local_host) == ("0.0.0.0", "127.0.0.1")
    for host, local in (("10.0.0.7", "10.0.0.7"), ("::", "::1"), ("127.0.0.1", "127.0.0.1")):
        moved = connect_settings({"metrics.host": host, "state.dir": str(tmp_path)})
        assert (moved.sink_settings({"topics": "t", "iceberg.tables": "db.t"}).metrics_host,
                moved.metrics_local_host) == (host, local)
    # the reference's iceberg.connect.group-id names the source group instead of connect-<name>
    named = s.sink_settings({"topics": "t", "iceberg.tables": "db.t", "iceberg.connect.group-id": "connect-old"})
    assert named.group_id == "connect-old"


def test_the_scrape_targets_are_prometheus_http_service_discovery_json():
    from icesink.app.connect_state import scrape_targets

    def at(host: str, port: int) -> dict[str, str]:
        return {"target": f"{host}:{port}", "instance": f"{host}:9400"}

    s = ClusterState()
    s.apply(1, connector_key("refunds"), _record({"config": {"tasks.max": "2"}, "generation": 2}))
    s.apply(2, connector_key("orders"), _record({"config": {"tasks.max": "1"}, "generation": 1}))
    placement = Placement.compute({"a:8083": "http://a:8083", "b:8083": "http://b:8083"}, s.layout(), "token")
    assert scrape_targets(s, placement) == []  # 200 with [] while nothing runs
    r0, r1 = placement.owners("refunds", 2)
    (o0,) = placement.owners("orders", 1)
    host = {"a:8083": "a", "b:8083": "b"}
    s.apply(3, status_key("refunds", 0), _record({"state": RUNNING, "worker_id": r0, "generation": 2,
                                                   "metrics": at(host[r0], 41001)}))
    s.apply(4, status_key("refunds", 1), _record({"state": PAUSED, "worker_id": r1, "generation": 2}))
    s.apply(5, status_key("orders", 0), _record({"state": RUNNING, "worker_id": o0, "generation": 1,
                                                  "metrics": at(host[o0], 41002)}))
    groups = scrape_targets(s, placement)
    assert groups == [  # every process's tasks, whichever process answers
        {"targets": [f"{host[o0]}:41002"], "labels": {"instance": f"{host[o0]}:9400", "connector": "orders", "task": "0"}},
        {"targets": [f"{host[r0]}:41001"], "labels": {"instance": f"{host[r0]}:9400", "connector": "refunds", "task": "0"}},
    ]
    assert json.loads(json.dumps(groups)) == groups  # label values are strings, as Prometheus requires
    # a stale report (an older generation, or a process that left the group) lists nothing
    s.apply(6, connector_key("orders"), _record({"config": {"tasks.max": "1"}, "generation": 2}))
    gone = Placement.compute({r0: f"http://{r0}"}, s.layout(), "token")
    assert scrape_targets(s, placement) == groups[1:]
    assert [g["labels"]["connector"] for g in scrape_targets(s, gone)] == ["refunds"]
    s.apply(7, status_key("refunds", 0), _record({"state": FAILED, "worker_id": r0, "generation": 2, "trace": "x"}))
    assert scrape_targets(s, gone) == []
    # a process's own address for them: its advertised host, bracketed when IPv6
    six = connect_settings({"rest.advertised.host.name": "fd00::7", "metrics.port": 9400})
    assert (six.metrics_target(41001), six.metrics_instance) == ("[fd00::7]:41001", "[fd00::7]:9400")


@pytest.mark.parametrize("raw, key", [
    ({"listeners": "https://0.0.0.0:8443"}, "ssl.keystore.location"),
    ({"listeners": "localhost"}, "listeners"),
    ({"listeners": "ftp://h:1"}, "listeners"),
    ({"listeners": "http://127.0.0.1:9400"}, "metrics.port"),
    ({"heartbeat.interval-ms": "often"}, "heartbeat.interval-ms"),
    ({"heartbeat.interval-ms": 5000, "session.timeout-ms": 6000}, "session.timeout-ms"),
    ({"security.protocol": "CARRIER_PIGEON"}, "security.protocol"),
    ({"connect.spark.shared": "maybe"}, "connect.spark.shared"),
    # the shared Spark is a local server: a remote default for the tasks contradicts it
    ({"connect.spark.shared": "true", "spark.remote": "sc://spark:15002"}, "connect.spark.shared"),
    ({"connect.spark.shared": "true", "spark.master": "spark://m:7077"}, "connect.spark.shared"),
])
def test_bad_connect_settings_name_the_key(raw, key):
    with pytest.raises(ConfigError) as info:
        connect_settings(raw)
    assert key in str(info.value)


def test_connect_settings_from_file_environment_and_flags(tmp_path):
    path = tmp_path / "connect.json"
    path.write_text(json.dumps({"listeners": "http://127.0.0.1:1", "group.id": "file"}))
    env = {"ICESINK_LISTENERS": "http://127.0.0.1:2", "ICESINK_CONFIG_STORAGE_TOPIC": "cfg",
           "ICESINK_SPARK_MASTER": "local[2]", "OTHER": "x"}
    s = load_connect_settings(path, env, {"group.id": "flag"})
    assert (s.listen_port, s.config_topic, s.group_id) == (2, "cfg", "flag")
    assert s.task_defaults["spark.master"] == "local[2]"


class FakeBackend(Backend):
    """tests/unit/test_connect_api.py's backend, counting syncs and connector restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.restarts: list[str] = []
        self.synced = 0

    async def sync(self) -> None:
        self.synced += 1

    async def restart(self, name: str, tasks: tuple[int, ...]) -> None:
        self.restarts.append(name)


def _api(calls: list[tuple[str, str, Any]], users: dict[str, str] | None = None
         ) -> tuple[list[tuple[int, Any]], FakeBackend]:
    """Each call on the API over a fake backend; a body ``{"headers": AUTHORIZATION}`` is that
    Authorization header instead."""
    from aiohttp.test_utils import TestClient, TestServer

    from icesink.app.connect_api import app

    backend = FakeBackend()

    async def go() -> list[tuple[int, Any]]:
        out = []
        async with TestClient(TestServer(app(backend, users))) as client:
            for method, path, body in calls:
                if isinstance(body, dict) and set(body) == {"headers"}:
                    kwargs: dict[str, Any] = {"headers": {"Authorization": body["headers"]}}
                else:
                    kwargs = {} if body is None else {"data": body if isinstance(body, str) else json.dumps(body)}
                resp = await client.request(method, path, **kwargs)
                text = await resp.text()
                out.append((resp.status, json.loads(text) if text else None))
        return out

    return asyncio.run(go()), backend


def test_the_api_answers_with_kafka_connects_paths_codes_and_json():
    config = {"connector.class": "org.apache.iceberg.connect.IcebergSinkConnector", "topics": "t", "tasks.max": "2",
              "iceberg.tables": "db.t", "iceberg.control.commit.interval-ms": 1000}
    out, backend = _api([
        ("GET", "/", None),
        ("POST", "/connectors", {"name": "c", "config": config}),
        ("POST", "/connectors", {"name": "c", "config": config}),
        ("GET", "/connectors", None),
        ("GET", "/connectors/c", None),
        ("GET", "/connectors/c/config", None),
        ("GET", "/connectors/c/tasks", None),
        ("PUT", "/connectors/c/config", {**config, "tasks.max": "1"}),
        ("PUT", "/connectors/d/config", {"topics": "u", "connector.class": "IcebergSinkConnector"}),
        ("GET", "/connectors?expand=status&expand=info", None),
        ("PUT", "/connectors/c/pause", None),
        ("PUT", "/connectors/c/resume", None),
        ("POST", "/connectors/c/restart", None),
        ("DELETE", "/connectors/c", None),
        ("GET", "/connectors/c/status", None),
    ])
    codes = [code for code, _ in out]
    assert codes == [200, 201, 409, 200, 200, 200, 200, 200, 201, 200, 202, 202, 204, 204, 404]
    assert "version" in out[0][1]
    assert out[1][1] == {"name": "c", "type": "sink", "config": {**{k: str(v) for k, v in config.items()}, "name": "c"},
                         "tasks": [{"connector": "c", "task": 0}, {"connector": "c", "task": 1}]}
    assert out[2][1] == {"error_code": 409, "message": "Connector c already exists"}
    assert out[3][1] == ["c"]
    assert out[6][1][1] == {"id": {"connector": "c", "task": 1}, "config": out[5][1]}
    assert set(out[9][1]) == {"c", "d"} and set(out[9][1]["c"]) == {"status", "info"}
    assert backend.targets == {"c": RUNNING} and backend.restarts == ["c"]
    assert out[14][1] == {"error_code": 404, "message": "Connector c not found"}
    assert backend.synced == len(out)  # every request caught up with the config topic first


def test_bad_requests_are_400s_naming_what_is_wrong():
    out, backend = _api([
        ("PUT", "/connectors/c/config", {"iceberg.tables": "db.t", "connector.class": "IcebergSinkConnector"}),
        ("PUT", "/connectors/c/config", {"topics": "t", "name": "other"}),
        ("PUT", "/connectors/c/config", "{not json"),
        ("PUT", "/connectors/c/config", [1, 2]),
        ("POST", "/connectors", {"config": {"topics": "t"}}),
        ("PUT", "/connectors/nope/pause", None),
        ("DELETE", "/connectors/nope", None),
    ])
    assert [code for code, _ in out] == [400, 400, 500, 400, 400, 404, 404]  # bad JSON: 500, as Connect
    assert all(body["error_code"] == code for code, body in out)
    assert "topics" in out[0][1]["message"] and "other" in out[1][1]["message"]
    assert "JSON" in out[2][1]["message"] and "name" in out[4][1]["message"]
    assert not backend.connectors


def test_unknown_keys_a_connector_was_let_start_with_are_in_its_status():
    """config.unknown-keys=warn starts a connector with keys icesink does not have: its status
    says so (issue 37: in the connector's status as well as each task's log)."""
    s = ClusterState()
    s.apply(3, connector_key("c"), _record({"config": {"tasks.max": "1"}, "generation": 4}))
    placement = Placement.compute({"a:1": "http://a:1"}, s.layout(), "token")
    note = "unknown settings ignored (config.unknown-keys=warn): x.y"
    assert status_of(s, "c", placement, notes=[note])["connector"]["trace"] == note
    assert "trace" not in status_of(s, "c", placement)["connector"]


def test_shared_spark_replaces_the_spark_defaults_of_tasks_that_chose_none(tmp_path):
    from icesink.app.connect_spark import SharedSpark

    s = connect_settings({"state.dir": str(tmp_path), "spark.master": "local[2]", "spark.driver.memory": "3g",
                          "connect.spark.shared": "true"})
    assert s.spark_shared
    assert not connect_settings({"spark.master": "local[2]"}).spark_shared  # the default: a JVM per task
    assert not connect_settings({"connect.spark.shared": "false", "spark.remote": "sc://s:1"}).spark_shared
    shared = SharedSpark(s.task_defaults, tmp_path)
    # the server starts as a local session would, from the process's spark.* defaults, on loopback
    assert shared.conf["spark.master"] == "local[2]" and shared.conf["spark.driver.memory"] == "3g"
    assert shared.conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert "-XX:+ExitOnOutOfMemoryError" in shared.conf["spark.driver.extraJavaOptions"]
    shared.port = 15002
    own = {"topics": "t", "spark.sql.shuffle.partitions": "2"}
    task = shared.task_config(s.task_config("c", own, "k:9092"), own)
    assert task["spark.remote"].startswith("sc://localhost:15002/;token=") and len(task["spark.remote"]) > 60
    assert "spark.master" not in task and "spark.driver.memory" not in task  # the server's, not the task's
    assert task["spark.sql.shuffle.partitions"] == "2"  # the connector's own runtime conf stays
    # its token is a secret of the task's settings: the redactor masks it
    token = task["spark.remote"].split("token=")[1]
    from icesink.shared.config import build_resolved

    settings = build_resolved({**task, "iceberg.tables": "db.t"}, {})
    assert token in settings.secret_values() and token not in settings.redactor()(task["spark.remote"])
    # a connector that names its own Spark keeps it
    alone = {"topics": "t", "spark.master": "local[1]"}
    assert shared.task_config(s.task_config("c", alone, "k:9092"), alone) == s.task_config("c", alone, "k:9092")
