"""Conformance of ``icesink connect``'s REST API with Kafka Connect's: the same requests sent to a
real Kafka Connect worker running the Apache Iceberg sink (tests/support/kafka_connect.py, jars
from Maven Central) and to an ``icesink connect`` process, both on one real Kafka broker. Each
answer is compared by status code and JSON keys (and the states where the flow sets them): the
success paths, and the common mistakes (a missing connector, bad JSON, a stopped connector).

The differences icesink means are listed in :data:`INTENDED`, each with its reason; anything
else that differs fails the test. Marked ``reference`` (a Connect JVM): ``./dev test -m reference``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.connect import call as _call

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.reference]

TOPIC, TABLE, NAME = "conform-pizzas", "conform.pizzas", "conform"
RECORDS = 200  # produced before the connectors start: both commit them, and their offsets must agree
PLUGIN = "IcebergSinkConnector"

#: request index -> why icesink answers otherwise (both answers are still checked: see the test)
INTENDED = {
    "unknown key": "icesink refuses a key it does not know (400 naming it) where the reference ignores it",
    "alter offsets while stopped": "icesink moves the positions its coordinator resumes from, but a move back "
                                   "below what the tables hold would land those records twice: refused (400, "
                                   "naming ?allow_duplicates=true), where Connect moves a consumer group the "
                                   "Iceberg sink does not resume from",
    "reset offsets while stopped": "as altering: a reset to the start reads every committed record again",
}


def _shape(body: Any) -> Any:
    """What is compared: a JSON object's keys with their values' shapes (a connector's config is
    free-form: "map"), a list's first element's shape."""
    if isinstance(body, dict):
        return tuple((k, "map" if k == "config" and isinstance(v, dict) else _shape(v)) for k, v in sorted(body.items()))
    if isinstance(body, list):
        return ("list", _shape(body[0]) if body else None)
    return type(body).__name__  # a body that is not JSON: "str"


def _wait(port: int, connector: str, tasks: str | None, timeout_s: float = 240) -> dict[str, Any]:
    """Until the connector is in state ``connector`` with every task in ``tasks`` (None: no task)."""
    deadline = time.monotonic() + timeout_s
    status: Any = None
    while time.monotonic() < deadline:
        code, status = _call(port, "GET", f"/connectors/{NAME}/status")
        if code == 200 and status["connector"]["state"] == connector and (
                (tasks is None and not status["tasks"]) or
                (tasks is not None and status["tasks"] and all(t["state"] == tasks for t in status["tasks"]))):
            return status  # type: ignore[no-any-return]
        time.sleep(0.5)
    raise AssertionError(f"port {port}: connector not {connector}/{tasks} in {timeout_s} s: {status}")


def _wait_offsets(port: int, timeout_s: float = 300) -> None:
    """Until the connector's offsets say every record produced is committed."""
    deadline = time.monotonic() + timeout_s
    body: Any = None
    while time.monotonic() < deadline:
        code, body = _call(port, "GET", f"/connectors/{NAME}/offsets")
        if code == 200 and sum(o["offset"]["kafka_offset"] for o in body["offsets"]) >= RECORDS:
            return
        time.sleep(1)
    raise AssertionError(f"port {port}: offsets not at {RECORDS} records in {timeout_s} s: {body}")


def _flow(port: int, config: dict[str, str]) -> dict[str, tuple[int, Any, Any]]:
    """The requests, in order; each -> (status, shape, body). Waits where Connect's state moves
    in the background (created, stopped, resumed)."""
    out: dict[str, tuple[int, Any, Any]] = {}

    def ask(label: str, method: str, path: str, body: Any = None) -> Any:
        code, answer = _call(port, method, path, body)
        out[label] = (code, _shape(answer), answer)
        return answer

    ask("root", "GET", "/")
    ask("health", "GET", "/health")
    ask("plugins", "GET", "/connector-plugins")
    ask("validate", "PUT", f"/connector-plugins/{PLUGIN}/config/validate", {**config, "name": NAME})
    ask("validate, wrong plugin", "PUT", "/connector-plugins/S3SinkConnector/config/validate", {**config, "name": NAME})
    ask("create (trailing slash)", "POST", "/connectors/", {"name": NAME, "config": config})
    ask("create again", "POST", "/connectors", {"name": NAME, "config": config})
    _wait(port, "RUNNING", "RUNNING")
    _wait_offsets(port)
    ask("list", "GET", "/connectors")
    ask("info", "GET", f"/connectors/{NAME}")
    ask("config", "GET", f"/connectors/{NAME}/config")
    ask("status", "GET", f"/connectors/{NAME}/status")
    ask("tasks", "GET", f"/connectors/{NAME}/tasks")
    ask("task status", "GET", f"/connectors/{NAME}/tasks/0/status")
    ask("topics", "GET", f"/connectors/{NAME}/topics")
    ask("offsets", "GET", f"/connectors/{NAME}/offsets")
    ask("reset offsets while running", "DELETE", f"/connectors/{NAME}/offsets")
    ask("restart", "POST", f"/connectors/{NAME}/restart")
    _wait(port, "RUNNING", "RUNNING")
    ask("restart failed tasks", "POST", f"/connectors/{NAME}/restart?includeTasks=true&onlyFailed=true")
    ask("restart task", "POST", f"/connectors/{NAME}/tasks/0/restart")
    ask("patch config", "PATCH", f"/connectors/{NAME}/config", {"iceberg.control.commit.interval-ms": "5000"})
    ask("pause", "PUT", f"/connectors/{NAME}/pause")
    ask("resume", "PUT", f"/connectors/{NAME}/resume")
    ask("stop", "PUT", f"/connectors/{NAME}/stop")
    _wait(port, "STOPPED", None)
    ask("stopped status", "GET", f"/connectors/{NAME}/status")
    ask("stopped tasks", "GET", f"/connectors/{NAME}/tasks")
    ask("alter offsets while stopped", "PATCH", f"/connectors/{NAME}/offsets", {"offsets": [
        {"partition": {"kafka_topic": TOPIC, "kafka_partition": 0}, "offset": {"kafka_offset": 0}}]})
    ask("reset offsets while stopped", "DELETE", f"/connectors/{NAME}/offsets")
    ask("resume stopped", "PUT", f"/connectors/{NAME}/resume")
    _wait(port, "RUNNING", "RUNNING")
    ask("loggers", "GET", "/admin/loggers")
    ask("set logger", "PUT", "/admin/loggers/conformance.test", {"level": "DEBUG"})
    ask("logger", "GET", "/admin/loggers/conformance.test")
    # the common mistakes
    ask("missing connector", "GET", "/connectors/nope")
    ask("missing connector status", "GET", "/connectors/nope/status")
    ask("missing connector pause", "PUT", "/connectors/nope/pause")
    ask("missing task", "GET", f"/connectors/{NAME}/tasks/9/status")
    ask("bad JSON", "POST", "/connectors", b"{not json")
    ask("unknown key", "PUT", "/connectors/other/config", {**config, "no.such.key": "x"})
    ask("not an Iceberg sink", "PUT", "/connectors/other/config",
        {**config, "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector"})
    ask("delete", "DELETE", f"/connectors/{NAME}")
    ask("deleted", "GET", f"/connectors/{NAME}")
    return out


@pytest.mark.timeout(900)
def test_icesink_connect_answers_as_kafka_connect_with_the_iceberg_sink(kafka, postgres, catalog_props, tmp_path: Path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.shared.kafka_admin import ensure_topic
    from tests.integration.test_connect import _start_connect
    from tests.support.kafka_connect import CONNECTOR_CLASS, KafkaConnect, iceberg_sink_config, jdbc_catalog

    async def topics() -> None:
        await ensure_topic(kafka.bootstrap, TOPIC, 2)
        for control in ("conform-ref-control", "conform-ice-control", "conform-seed-control"):
            await ensure_topic(kafka.bootstrap, control, 1)
        await produce(kafka.bootstrap, TOPIC, pizza_values(RECORDS, seed=39), partitions=2)

    asyncio.run(topics())
    load_catalog("ref", type="sql", uri=postgres.uri)  # pyiceberg's catalog tables, which Iceberg's JDBC catalog uses
    ref_config = iceberg_sink_config(NAME, TOPIC, jdbc_catalog("ref", "127.0.0.1", postgres.port, "icesink",
                                                               tmp_path / "wh-ref"),
                                     tables=TABLE, control_topic="conform-ref-control")
    ice_config = iceberg_sink_config(NAME, TOPIC, {"catalog": "it", **catalog_props}, tables=TABLE,
                                     control_topic="conform-ice-control",
                                     extra={"iceberg.control.topic.replication-factor": "1"})
    for config in (ref_config, ice_config):
        del config["name"]
    # Standalone Connect starts with one connector: a seed, beside the one the flow creates.
    seed = {**ref_config, "name": "seed", "iceberg.control.topic": "conform-seed-control",
            "iceberg.tables": "seed.pizzas"}  # its own namespace: two sinks creating one race (the reference FAILs)
    reference = KafkaConnect(tmp_path / "connect", kafka.bootstrap, seed)
    with reference:
        ref = _flow(reference.rest_port, ref_config)
    proc, port, _ = _start_connect(tmp_path, "ice", kafka.bootstrap, tmp_path / "state")
    try:
        ice = _flow(port, ice_config)
    finally:
        proc.terminate()
        proc.wait(60)

    table = "\n".join(f"{label:32} ref {ref[label][0]} {str(ref[label][1])[:1500]}\n{'':32} ice {ice[label][0]} "
                      f"{str(ice[label][1])[:1500]}" for label in ref)
    differ = {label for label in ref if label not in INTENDED and ref[label][:2] != ice[label][:2]
              and label not in ("list", "plugins", "loggers", "config", "topics")}
    assert not differ, f"answers differ for {sorted(differ)}:\n{table}\n" + "\n".join(
        f"{label}: ref {ref[label][2]!r:.600} ice {ice[label][2]!r:.600}" for label in sorted(differ))
    # where only the keys of free-form maps differ: the codes and the parts that are Connect's
    for label in ("list", "plugins", "loggers", "config", "topics"):
        assert ref[label][0] == ice[label][0], f"{label}: ref {ref[label][2]} ice {ice[label][2]}\n{table}"
    assert NAME in ref["list"][2] and ice["list"][2] == [NAME]
    # the reference's plugin path holds the Apache sink (not Tabular's, which icesink also lists)
    assert CONNECTOR_CLASS in {p["class"] for p in ref["plugins"][2]} & {p["class"] for p in ice["plugins"][2]}
    assert set(ice["plugins"][2][0]) == set(ref["plugins"][2][0])
    assert "root" in ref["loggers"][2] and "root" in ice["loggers"][2]
    assert ref["topics"][2] == ice["topics"][2] == {NAME: {"topics": [TOPIC]}}, table
    assert ref["config"][2]["topics"] == ice["config"][2]["topics"] == TOPIC
    # the offsets: Connect's from the sink's consumer group, icesink's from its tables; the same
    def offsets(side: dict[str, tuple[int, Any, Any]]) -> list[tuple[str, int, int]]:
        return sorted((o["partition"]["kafka_topic"], o["partition"]["kafka_partition"], o["offset"]["kafka_offset"])
                      for o in side["offsets"][2]["offsets"])

    assert offsets(ref) == offsets(ice) == [(TOPIC, 0, RECORDS // 2), (TOPIC, 1, RECORDS // 2)], table
    # one broker: one cluster id, the broker's
    assert ref["root"][2]["kafka_cluster_id"] == ice["root"][2]["kafka_cluster_id"] != ""
    for side in (ref, ice):
        assert side["stopped status"][2]["connector"]["state"] == "STOPPED" and side["stopped tasks"][2] == []
        assert side["validate"][2]["error_count"] == 0, side["validate"][2]
    # the intended differences, as intended
    assert ref["unknown key"][0] in (200, 201) and ice["unknown key"][0] == 400
    assert "no.such.key" in ice["unknown key"][2]["message"]
    for label in ("alter offsets while stopped", "reset offsets while stopped"):
        assert ref[label][0] == 200 and ice[label][0] == 400 and "allow_duplicates=true" in ice[label][2]["message"]
