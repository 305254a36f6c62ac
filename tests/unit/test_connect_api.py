"""The REST API of ``icesink connect`` against Kafka Connect's resources (apache/kafka
connect/runtime/.../rest/resources/*.java): paths (with or without a trailing slash), status
codes and JSON keys, on a fake backend; the cluster state's STOPPED target, per-task restarts
and the tasks.max cap, without processes."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from icesink.app.connect_state import (
    PLUGIN_VERSION, FAILED, RUNNING, STOPPED, UNASSIGNED, ClusterState, Placement, connector_key, status_key, status_of,
)
from icesink.shared.errors import ConfigError

ICEBERG = "org.apache.iceberg.connect.IcebergSinkConnector"
TABULAR = "io.tabular.iceberg.connect.IcebergSinkConnector"


class Backend:
    worker_id = "here:8083"
    kafka_cluster_id = "Zx9-clusterID"
    failure: BaseException | None = None

    def __init__(self) -> None:
        self.connectors: dict[str, dict[str, str]] = {}
        self.targets: dict[str, str] = {}
        self.task_states: dict[str, list[str]] = {}
        self.restarted: list[tuple[str, tuple[int, ...]]] = []
        self.changed: list[Any] = []

    async def sync(self) -> None:
        pass

    def names(self) -> list[str]:
        return list(self.connectors)

    def config(self, name: str) -> dict[str, str] | None:
        return self.connectors.get(name)

    def tasks(self, name: str) -> int:
        return 0 if self.targets.get(name) == STOPPED else int(self.connectors[name].get("tasks.max", "1"))

    def status(self, name: str) -> dict[str, Any]:
        states = self.task_states.get(name, [RUNNING] * self.tasks(name))
        return {"name": name, "connector": {"state": self.targets.get(name, RUNNING), "worker_id": self.worker_id},
                "tasks": [{"id": i, "state": s, "worker_id": self.worker_id} for i, s in enumerate(states)],
                "type": "sink"}

    def check(self, name: str, config: dict[str, str]) -> dict[str, str]:
        if "topics" not in config:
            raise ConfigError("topics", None, "a value (the setting is required)")
        if config.get("iceberg.tables.upsert-mode-enabled") not in (None, "true", "false"):
            raise ConfigError("iceberg.tables.upsert-mode-enabled", config["iceberg.tables.upsert-mode-enabled"],
                              "true or false")
        return config

    async def put(self, name: str, config: dict[str, str]) -> bool:
        created = name not in self.connectors
        self.connectors[name] = config
        return created

    async def set_target(self, name: str, target: str) -> None:
        self.targets[name] = target

    async def restart(self, name: str, tasks: tuple[int, ...]) -> None:
        self.restarted.append((name, tasks))

    async def delete(self, name: str) -> None:
        del self.connectors[name]

    async def offsets(self, name: str) -> list[dict[str, Any]]:
        return [{"partition": {"kafka_topic": "t", "kafka_partition": 0}, "offset": {"kafka_offset": 42}}]

    async def change_offsets(self, name: str, offsets: Any, allow_duplicates: bool) -> None:
        """As icesink connect's: partitions t/0 and t/1 (offsets 0 to 100), the tables at t/0@42."""
        from icesink.app.connect_offsets import plan_offsets
        from icesink.shared.protocol import TopicPartition

        tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
        wanted = dict.fromkeys(tps) if offsets is None else offsets
        self.changed.append(plan_offsets(name, wanted, {tps[0]: 42}, dict.fromkeys(tps, 0), dict.fromkeys(tps, 100),
                                         allow_duplicates))


def _api(calls: list[tuple[str, str, Any]], backend: Backend | None = None) -> tuple[list[tuple[int, Any]], Backend]:
    from aiohttp.test_utils import TestClient, TestServer

    from icesink.app.connect_api import app

    backend = backend or Backend()

    async def go() -> list[tuple[int, Any]]:
        out = []
        async with TestClient(TestServer(app(backend))) as client:
            for method, path, body in calls:
                kwargs = {} if body is None else {"data": body if isinstance(body, str) else json.dumps(body)}
                resp = await client.request(method, path, **kwargs)
                text = await resp.text()
                out.append((resp.status, json.loads(text) if text else None))
        return out

    return asyncio.run(go()), backend


CONFIG = {"connector.class": ICEBERG, "topics": "t", "tasks.max": "2", "iceberg.tables": "db.t"}


def test_a_trailing_slash_is_the_same_path_as_kafka_connects_jersey_takes_it():
    out, backend = _api([
        ("POST", "/connectors/", {"name": "c", "config": CONFIG}),
        ("GET", "/connectors/", None),
        ("GET", "/connectors/c/", None),
        ("GET", "/connectors/c/status/", None),
        ("PUT", "/connectors/c/pause/", None),
        ("GET", "/connector-plugins/", None),
    ])
    assert [code for code, _ in out] == [201, 200, 200, 200, 202, 200], out
    assert out[1][1] == ["c"] and backend.targets == {"c": "PAUSED"}


def test_restart_without_parameters_restarts_only_the_connector_and_answers_204():
    out, backend = _api([("POST", "/connectors", {"name": "c", "config": CONFIG}),
                         ("POST", "/connectors/c/restart", None),
                         ("POST", "/connectors/nope/restart", None)])
    assert [code for code, _ in out] == [201, 204, 404]
    assert backend.restarted == [("c", ())]  # no task restarted


def test_restart_with_include_tasks_and_only_failed_restarts_the_failed_tasks_and_answers_202_with_the_plan():
    backend = Backend()
    backend.task_states["c"] = [RUNNING, FAILED, RUNNING]
    out, _ = _api([("POST", "/connectors", {"name": "c", "config": {**CONFIG, "tasks.max": "3"}}),
                   ("POST", "/connectors/c/restart?includeTasks=true&onlyFailed=true", None),
                   ("POST", "/connectors/c/restart?includeTasks=true", None),
                   ("POST", "/connectors/c/restart?onlyFailed=true", None)], backend)
    assert [code for code, _ in out] == [201, 202, 202, 202]
    assert backend.restarted == [("c", (1,)), ("c", (0, 1, 2)), ("c", ())]
    plan = out[1][1]
    assert set(plan) == {"name", "connector", "tasks", "type"}
    assert plan["connector"]["state"] == RUNNING  # onlyFailed: the connector did not fail, it is not restarted
    assert [t["state"] for t in plan["tasks"]] == [RUNNING, "RESTARTING", RUNNING]
    assert out[2][1]["connector"]["state"] == "RESTARTING"
    assert [t["state"] for t in out[2][1]["tasks"]] == ["RESTARTING"] * 3


def test_one_task_has_its_status_and_its_restart():
    out, backend = _api([("POST", "/connectors", {"name": "c", "config": CONFIG}),
                         ("GET", "/connectors/c/tasks/1/status", None),
                         ("POST", "/connectors/c/tasks/1/restart", None),
                         ("GET", "/connectors/c/tasks/7/status", None),
                         ("POST", "/connectors/c/tasks/7/restart", None),
                         ("GET", "/connectors/c/tasks/x/status", None)])
    assert [code for code, _ in out] == [201, 200, 204, 404, 404, 404]
    assert out[1][1] == {"id": 1, "state": RUNNING, "worker_id": "here:8083"}
    assert backend.restarted == [("c", (1,))]


def test_stop_keeps_the_config_runs_no_task_and_resume_brings_them_back():
    out, backend = _api([("POST", "/connectors", {"name": "c", "config": CONFIG}),
                         ("PUT", "/connectors/c/stop", None),
                         ("GET", "/connectors/c", None),
                         ("GET", "/connectors/c/tasks", None),
                         ("GET", "/connectors/c/config", None),
                         ("PUT", "/connectors/c/resume", None),
                         ("GET", "/connectors/c/tasks", None),
                         ("PUT", "/connectors/nope/stop", None)])
    assert [code for code, _ in out] == [201, 204, 200, 200, 200, 202, 200, 404]
    assert out[2][1]["tasks"] == [] and out[3][1] == [] and out[4][1]["topics"] == "t"
    assert len(out[6][1]) == 2 and backend.targets == {"c": RUNNING}


def test_patch_config_merges_and_null_removes_a_key():
    out, backend = _api([("POST", "/connectors", {"name": "c", "config": {**CONFIG, "iceberg.tables.cdc-field": "op"}}),
                         ("PATCH", "/connectors/c/config", {"tasks.max": "1", "iceberg.tables.cdc-field": None}),
                         ("PATCH", "/connectors/nope/config", {"tasks.max": "1"}),
                         ("PATCH", "/connectors/c/config", {"topics": None})])
    assert [code for code, _ in out] == [201, 200, 404, 400]
    assert set(out[1][1]) == {"name", "config", "tasks", "type"}
    assert backend.connectors["c"] == {**CONFIG, "tasks.max": "1", "name": "c"}
    assert "topics" in out[3][1]["message"]


def test_topics_offsets_and_their_changes():
    out, _ = _api([("POST", "/connectors", {"name": "c", "config": {**CONFIG, "topics": "a,b"}}),
                         ("GET", "/connectors/c/topics", None),
                         ("PUT", "/connectors/c/topics/reset", None),
                         ("GET", "/connectors/c/offsets", None),
                         ("DELETE", "/connectors/c/offsets", None),
                         ("PATCH", "/connectors/c/offsets", {"offsets": []}),
                         ("PATCH", "/connectors/c/offsets", {"offsets": [
                             {"partition": {"kafka_topic": "t", "kafka_partition": 0}, "offset": {"kafka_offset": 50}}]}),
                         ("GET", "/connectors/nope/offsets", None)])
    assert [code for code, _ in out] == [201, 200, 202, 200, 400, 400, 400, 404]
    assert out[1][1] == {"c": {"topics": ["a", "b"]}}
    assert out[3][1] == {"offsets": [{"partition": {"kafka_topic": "t", "kafka_partition": 0},
                                      "offset": {"kafka_offset": 42}}]}
    for _, body in out[4:7:2]:  # DELETE and PATCH while running: Connect's exact message
        assert body["message"] == ("Connectors must be in the STOPPED state before their offsets can be modified. "
                                   "This can be done for the specified connector by issuing a 'PUT' request to the "
                                   "'/connectors/c/stop' endpoint")


def _offsets(*items: tuple[Any, Any]) -> dict[str, Any]:
    return {"offsets": [{"partition": p, "offset": o} for p, o in items]}


T0, T1 = {"kafka_topic": "t", "kafka_partition": 0}, {"kafka_topic": "t", "kafka_partition": "1"}


def test_offsets_of_a_stopped_connector_are_altered_and_reset_as_in_kafka_connect():
    from icesink.shared.protocol import TopicPartition

    out, backend = _api([("POST", "/connectors", {"name": "c", "config": CONFIG}),
                         ("PUT", "/connectors/c/stop", None),
                         ("PATCH", "/connectors/c/offsets", _offsets((T0, {"kafka_offset": "60"}), (T1, {"kafka_offset": 7}))),
                         ("PATCH", "/connectors/c/offsets", _offsets((T1, None))),
                         ("PATCH", "/connectors/c/offsets", _offsets((T0, {"kafka_offset": 10}))),
                         ("PATCH", "/connectors/c/offsets?allow_duplicates=true", _offsets((T0, {"kafka_offset": 10}))),
                         ("DELETE", "/connectors/c/offsets", None),
                         ("DELETE", "/connectors/c/offsets?allow_duplicates=true", None),
                         ("PATCH", "/connectors/nope/offsets", _offsets((T0, {"kafka_offset": 1}))),
                         ("DELETE", "/connectors/nope/offsets", None)])
    assert [code for code, _ in out] == [201, 204, 200, 200, 400, 200, 400, 200, 404, 404]
    ok = {"message": "The offsets for this connector have been altered successfully"}
    assert out[2][1] == out[3][1] == out[5][1] == ok
    assert out[7][1] == {"message": "The offsets for this connector have been reset successfully"}
    t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
    assert backend.changed == [{t0: 60, t1: 7}, {t1: 0}, {t0: 10}, {t0: 0, t1: 0}]
    for _, body in (out[4], out[6]):  # back below the tables' position: duplicates, refused without the flag
        assert "t[0] (to " in body["message"] and "allow_duplicates=true" in body["message"]


@pytest.mark.parametrize(("body", "message"), [
    ({"offsets": []}, "Partitions / offsets need to be provided for an alter offsets request"),
    ({}, "Partitions / offsets need to be provided for an alter offsets request"),
    (_offsets((None, {"kafka_offset": 1})), "The partition for a sink connector offset cannot be null or missing"),
    (_offsets(({"kafka_topic": "t"}, {"kafka_offset": 1})),
     "The partition for a sink connector offset must contain the keys 'kafka_topic' and 'kafka_partition'"),
    (_offsets(({"kafka_topic": None, "kafka_partition": 0}, {"kafka_offset": 1})),
     "Kafka topic names must be valid strings and may not be null"),
    (_offsets(({"kafka_topic": "t", "kafka_partition": None}, {"kafka_offset": 1})),
     "Kafka partitions must be valid numbers and may not be null"),
    (_offsets(({"kafka_topic": "t", "kafka_partition": "x"}, {"kafka_offset": 1})),
     "Failed to parse the following Kafka partition value in the provided offsets: 'x'. Partition values for sink "
     "connectors need to be integers."),
    (_offsets((T0, {})), "The offset for a sink connector should either be null or contain the key 'kafka_offset'"),
    (_offsets((T0, {"kafka_offset": "not a number"})),
     "Failed to parse the following Kafka offset value in the provided offsets: 'not a number'"),
    (_offsets((T0, {"kafka_offset": -1})), "Failed to parse the following Kafka offset value in the provided offsets: '-1'"),
    (_offsets(({"kafka_topic": "t", "kafka_partition": 5}, {"kafka_offset": 1})), "t[5] do not exist"),
    (_offsets((T0, {"kafka_offset": 101})), "past the partition's end: t[0] (offset 101, end 100)"),
])
def test_bad_offsets_are_refused_with_kafka_connects_messages(body, message):
    out, backend = _api([("POST", "/connectors", {"name": "c", "config": CONFIG}),
                         ("PUT", "/connectors/c/stop", None),
                         ("PATCH", "/connectors/c/offsets", body)])
    assert out[2][0] == 400 and message in out[2][1]["message"] and not backend.changed


@pytest.mark.parametrize("klass", [ICEBERG, TABULAR])
def test_connector_class_must_be_an_iceberg_sink(klass):
    s3 = "io.confluent.connect.s3.S3SinkConnector"
    out, backend = _api([("POST", "/connectors", {"name": "c", "config": {**CONFIG, "connector.class": s3}}),
                         ("PUT", "/connectors/d/config", {k: v for k, v in CONFIG.items() if k != "connector.class"}),
                         ("PUT", "/connectors/e/config", {**CONFIG, "connector.class": klass}),
                         ("PUT", "/connectors/f/config", {**CONFIG, "connector.class": "IcebergSinkConnector"})])
    assert [code for code, _ in out] == [400, 400, 201, 201]
    assert "connector.class" in out[0][1]["message"] and s3 in out[0][1]["message"]
    assert "connector.class" in out[1][1]["message"]
    assert set(backend.connectors) == {"e", "f"}


def test_connector_plugins_and_validate_answer_per_key():
    out, _ = _api([
        ("GET", "/connector-plugins", None),
        ("PUT", f"/connector-plugins/{ICEBERG}/config/validate", {**CONFIG, "name": "c"}),
        ("PUT", "/connector-plugins/IcebergSinkConnector/config/validate",
         {"connector.class": ICEBERG, "name": "c", "iceberg.tables.upsert-mode-enabled": "maybe"}),
        ("PUT", "/connector-plugins/S3SinkConnector/config/validate", {**CONFIG, "name": "c"}),
        ("PUT", f"/connector-plugins/{ICEBERG}/config/validate", "{bad"),
    ])
    assert [code for code, _ in out] == [200, 200, 200, 400, 500]  # bad JSON: 500, as Kafka Connect answers
    assert {p["class"] for p in out[0][1]} == {ICEBERG, TABULAR}
    assert all(set(p) == {"class", "type", "version"} and p["type"] == "sink" for p in out[0][1])
    good = out[1][1]
    assert set(good) == {"name", "error_count", "groups", "configs"} and good["error_count"] == 0
    assert good["name"] == ICEBERG
    entry = next(c for c in good["configs"] if c["value"]["name"] == "topics")
    assert set(entry) == {"definition", "value"}
    assert set(entry["value"]) == {"name", "value", "recommended_values", "errors", "visible"}
    assert {"name", "type", "required", "default_value", "importance", "documentation", "group", "order_in_group",
            "width", "display_name", "dependents"} <= set(entry["definition"])
    bad = out[2][1]
    errors = {c["value"]["name"]: c["value"]["errors"] for c in bad["configs"] if c["value"]["errors"]}
    assert bad["error_count"] == 2 and set(errors) == {"topics", "iceberg.tables.upsert-mode-enabled"}, errors
    assert "does not match" in out[3][1]["message"]


def test_loggers_are_read_and_set_as_connects_admin_loggers():
    name = "icesink.test_connect_api.levels"
    logging.getLogger(name).setLevel(logging.INFO)
    try:
        out, _ = _api([("GET", "/admin/loggers", None),
                       ("GET", f"/admin/loggers/{name}", None),
                       ("PUT", f"/admin/loggers/{name}", {"level": "DEBUG"}),
                       ("GET", f"/admin/loggers/{name}/", None),
                       ("PUT", f"/admin/loggers/{name}", {"level": "LOUD"}),
                       ("PUT", f"/admin/loggers/{name}", {}),
                       ("GET", "/admin/loggers/no.such.logger.anywhere", None)])
        assert [code for code, _ in out] == [200, 200, 200, 200, 404, 400, 404]
        assert out[0][1]["root"]["level"] in ("INFO", "WARN", "DEBUG", "ERROR") and name in out[0][1]
        assert out[1][1] == {"level": "INFO", "last_modified": None}
        assert name in out[2][1] and out[3][1]["level"] == "DEBUG" and isinstance(out[3][1]["last_modified"], int)
        assert logging.getLogger(name).level == logging.DEBUG
    finally:
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_root_names_the_kafka_cluster_and_health_answers_as_connect_39():
    backend = Backend()
    out, _ = _api([("GET", "/", None), ("GET", "/health", None)], backend)
    assert out[0] == (200, {"version": out[0][1]["version"], "commit": out[0][1]["commit"],
                            "kafka_cluster_id": "Zx9-clusterID"})
    assert out[1] == (200, {"status": "healthy",
                            "message": "Worker has completed startup and is ready to handle requests."})
    backend.failure = RuntimeError("reading the config topic")
    out, _ = _api([("GET", "/health", None)], backend)
    assert out[0][0] == 500 and out[0][1]["status"] == "unhealthy"


# --- the cluster state ------------------------------------------------------------------------


def _record(value: Any) -> bytes:
    return json.dumps(value).encode()


def _cluster(connector: dict[str, Any]) -> ClusterState:
    s = ClusterState()
    s.apply(0, connector_key("c"), _record(connector))
    return s


def _placed(s: ClusterState) -> Placement:
    return Placement.compute({"a:1": "http://a:1"}, s.layout(), "token")


def test_a_stopped_connector_has_no_tasks_and_its_status_says_stopped():
    s = _cluster({"config": {"tasks.max": "2"}, "target": STOPPED, "generation": 3})
    assert s.connectors["c"].tasks == 0 and s.connectors["c"].max_tasks == 2
    st = status_of(s, "c", _placed(s))
    assert st["connector"] == {"state": STOPPED, "worker_id": "a:1", "version": PLUGIN_VERSION} and st["tasks"] == []


def test_a_task_restart_makes_only_that_tasks_report_stale():
    s = _cluster({"config": {"tasks.max": "2"}, "generation": 3, "restarts": {"1": 1}})
    s.apply(2, status_key("c", 0), _record({"state": RUNNING, "worker_id": "a:1", "generation": 3}))
    s.apply(3, status_key("c", 1), _record({"state": FAILED, "worker_id": "a:1", "generation": 3}))
    assert [t["state"] for t in status_of(s, "c", _placed(s))["tasks"]] == [RUNNING, UNASSIGNED]
    s.apply(4, status_key("c", 1), _record({"state": RUNNING, "worker_id": "a:1", "generation": 3, "restart": 1}))
    assert [t["state"] for t in status_of(s, "c", _placed(s))["tasks"]] == [RUNNING, RUNNING]


def test_tasks_max_above_the_partitions_is_capped_and_the_status_says_so():
    s = _cluster({"config": {"tasks.max": "8"}, "generation": 3, "partitions": 3})
    assert s.connectors["c"].tasks == 3
    st = status_of(s, "c", _placed(s))
    assert len(st["tasks"]) == 3 and "tasks.max=8" in st["connector"]["trace"] and "3 partitions" in \
        st["connector"]["trace"]


def test_validate_never_echoes_a_secret():
    """Validate answers each key's value, as Kafka Connect does, but a secret (a password type
    there: ``[hidden]``) is masked, in the value and in the key's error alike."""
    secret = "s3cr3t-Value-42"
    out, _ = _api([("PUT", f"/connector-plugins/{ICEBERG}/config/validate",
                    {**CONFIG, "name": "c", "iceberg.catalog.s3.secret-access-key": secret,
                     "iceberg.catalog.uri": f"postgresql://u:{secret}@h/db"})])
    assert out[0][0] == 200
    assert secret not in json.dumps(out[0][1])
    entry = next(c for c in out[0][1]["configs"] if c["value"]["name"] == "iceberg.catalog.s3.secret-access-key")
    assert entry["value"]["value"] not in (None, "")


def test_the_metrics_port_answers_health_without_auth_for_kubernetes_probes_37():
    """A liveness probe cannot send the API's basic auth, and /metrics scrapes every task (about
    2 s each): the metrics-only port answers /health at once, without a secret or a detail."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from icesink.app.connect_api import metrics_app

    backend = Backend()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="icesink_info 1\n")

    async def go() -> list[tuple[int, str]]:
        out = []
        async with TestClient(TestServer(metrics_app(backend, metrics))) as client:
            for path in ("/health", "/metrics", "/connectors"):
                resp = await client.get(path)
                out.append((resp.status, await resp.text()))
            backend.failure = RuntimeError("reading the config topic failed: broker secret-host:9092")
            resp = await client.get("/health")
            out.append((resp.status, await resp.text()))
        return out

    healthy, scraped, api, unhealthy = asyncio.run(go())
    assert healthy[0] == 200 and json.loads(healthy[1])["status"] == "healthy"
    assert scraped == (200, "icesink_info 1\n")
    assert api[0] == 404  # nothing of the API here
    assert unhealthy[0] == 500 and json.loads(unhealthy[1])["status"] == "unhealthy"
    assert "secret-host" not in unhealthy[1]  # no detail without authentication
