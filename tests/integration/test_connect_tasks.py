"""``icesink connect`` keeps managing its connectors whatever one connector's config holds, and
starts every task (issue 40, points 7 and 12): real connect processes, real worker replicas.

- A 240-character name, ``shutdown.timeout-ms: "30000.0"`` and connectors written to the config
  topic with configs PUT would refuse (an invalid value, a key that loads code) stop nothing:
  the valid ones run, pause and resume; the invalid ones are FAILED on their own, with the reason.
- A start-up error a retry can mend (the catalog's directory not there yet) is retried with
  backoff, visible as RESTARTING, until it is mended; one that stays is FAILED after the retries.
- Six tasks starting together on a new embedded SQLite catalog all start.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.support.connect import call, process_config, start_connect, task_states, wait_status

pytestmark = pytest.mark.integration

OVERRIDE = "connector.config.override.allow"
#: What a replica logs once it loaded the catalog and the tables (agents/worker.py _prepare),
#: before its Spark session need be up.
PAST_CATALOG = "parts built, catalog and tables loaded"


def _running(status: dict) -> bool:
    return bool(status["tasks"]) and set(task_states(status)) == {"RUNNING"}


def _failed_with(*words: str):
    def ok(status: dict) -> bool:
        return task_states(status) == ["FAILED"] and all(w in status["tasks"][0].get("trace", "") for w in words)
    return ok


def _cause_first(trace: str, directory: Path) -> None:
    """The trace begins with the replica's one start-failure line: what and where, no log noise."""
    first = trace.splitlines()[0]
    assert first.startswith("cannot reach the catalog") and str(directory) in first, trace[:2000]
    assert "unable to open database file" in first, trace[:2000]


def test_one_connectors_config_does_not_stop_the_process_managing_the_others(broker, tmp_path):
    from tests.support.sinkrun import write_control

    config = process_config(tmp_path, broker.bootstrap, "tasks-isolation")
    process = start_connect(tmp_path, "c", config)
    base = {"connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
            "topics": "tasks-isolation-topic", "iceberg.tables": "iso.t", "iceberg.control.topic": "tasks-isolation-ctl"}
    long_name = "n" * 240
    try:
        assert call(process.api, "PUT", f"/connectors/{long_name}/config",
                    {**base, "shutdown.timeout-ms": "30000.0", "group.id": "iso-long"})[0] == 201
        assert call(process.api, "PUT", "/connectors/good/config", {**base, "group.id": "iso-good"})[0] == 201
        # configs the API refuses, as an older version or another writer may have left them in the topic
        write_control(broker.bootstrap, config["config.storage.topic"], [
            (b"connector/stored-bad", json.dumps({"config": {**base, "shutdown.timeout-ms": "soon"},
                                                  "target": "RUNNING", "generation": 1}).encode()),
            (b"connector/stored-jars", json.dumps({"config": {**base, "spark.jars": "/tmp/evil.jar"},
                                                   "target": "RUNNING", "generation": 1}).encode()),
        ])
        wait_status(process.api, "stored-bad", _failed_with("shutdown.timeout-ms"), timeout_s=60)
        wait_status(process.api, "stored-jars", _failed_with("spark.jars", OVERRIDE), timeout_s=60)
        wait_status(process.api, "good", _running, timeout_s=90)
        wait_status(process.api, long_name, _running, timeout_s=90)
        assert call(process.api, "PUT", "/connectors/good/pause")[0] == 202
        wait_status(process.api, "good", lambda s: task_states(s) == ["PAUSED"], timeout_s=60)
        assert call(process.api, "PUT", "/connectors/good/resume")[0] == 202
        wait_status(process.api, "good", _running, timeout_s=60)
        for name in ("good", long_name, "stored-bad", "stored-jars"):
            assert call(process.api, "DELETE", f"/connectors/{name}")[0] == 204
        assert call(process.api, "GET", "/connectors") == (200, [])
    finally:
        process.stop()


def test_a_start_up_error_a_retry_can_mend_is_retried_with_backoff_then_failed(broker, tmp_path):
    config = process_config(tmp_path, broker.bootstrap, "tasks-retry", **{
        OVERRIDE: "iceberg.catalog.uri,iceberg.catalog.warehouse",
        "tasks.start.retries": 2, "tasks.start.retry.backoff-ms": 500})
    process = start_connect(tmp_path, "c", config)

    def connector(directory: Path, group: str) -> dict[str, str]:
        return {"connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
                "topics": "tasks-retry-topic", "iceberg.tables": "retry.t", "group.id": group,
                "iceberg.control.topic": f"{group}-ctl", "iceberg.catalog.type": "sql",
                "iceberg.catalog.uri": f"sqlite:///{directory / 'catalog.db'}",
                "iceberg.catalog.warehouse": f"file://{directory / 'warehouse'}"}

    later, never = tmp_path / "later", tmp_path / "never"
    try:
        assert call(process.api, "PUT", "/connectors/later/config", connector(later, "retry-later"))[0] == 201
        assert call(process.api, "PUT", "/connectors/never/config", connector(never, "retry-never"))[0] == 201
        status = wait_status(process.api, "later", lambda s: task_states(s) == ["RESTARTING"], timeout_s=120)
        assert "unable to open database file" in status["tasks"][0]["trace"]
        _cause_first(status["tasks"][0]["trace"], later)
        later.mkdir()  # mended: the next attempt finds the directory
        wait_status(process.api, "later", _running, timeout_s=120)
        deadline = time.monotonic() + 120
        while not (later / "catalog.db").exists() and time.monotonic() < deadline:
            time.sleep(1)
        assert (later / "catalog.db").exists()
        status = wait_status(process.api, "never", _failed_with("unable to open database file", "3 attempts"),
                             timeout_s=240)
        _cause_first(status["tasks"][0]["trace"], never)
        assert call(process.api, "GET", "/connectors/later/status")[1]["tasks"][0]["state"] == "RUNNING"
        assert "restarting" in process.log
    finally:
        process.stop()


@pytest.mark.timeout(600)
def test_six_tasks_starting_together_on_a_new_embedded_catalog_all_start(broker, tmp_path):
    from icesink.shared.kafka_admin import ensure_topic

    asyncio.run(ensure_topic(broker.bootstrap, "tasks-six", 6))
    config = process_config(tmp_path, broker.bootstrap, "tasks-six", **{"spark.driver.memory": "512m"})
    process = start_connect(tmp_path, "c", config)
    connector = {"connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
                 "tasks.max": "6", "topics": "tasks-six", "iceberg.tables": "rpc.pizzas",
                 "iceberg.tables.auto-create-enabled": "true", "iceberg.control.topic": "tasks-six-ctl",
                 "write.warm-up-rows": "0"}
    try:
        assert call(process.api, "PUT", "/connectors/pizzas/config", connector)[0] == 201
        logs: list[Path] = []
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline:
            status = call(process.api, "GET", "/connectors/pizzas/status")[1]
            assert not {"FAILED", "RESTARTING"} & set(task_states(status)), status
            logs = sorted((tmp_path / "state").rglob("logs/pizzas-*.log"))
            if len(logs) == 6 and all(PAST_CATALOG in p.read_text(errors="replace") for p in logs):
                break
            time.sleep(2)
        texts = {p.name: p.read_text(errors="replace") for p in logs}
        assert len(texts) == 6 and all(PAST_CATALOG in t for t in texts.values()), \
            {n: t[-1500:] for n, t in texts.items() if PAST_CATALOG not in t}  # every replica got the catalog
        assert not [n for n, t in texts.items() if "already exists" in t]
        assert process.log.count("started as replica") == 6  # each task started once, none again
    finally:
        process.stop()
