"""The Grafana dashboard and the alert rules against a real Prometheus scraping real replicas.

Prometheus (Debian's package, started here with a one-second scrape interval and the rules of
deploy/prometheus/alerts.yml) scrapes two worker replicas while they ingest pizzas and
dead-letter a few malformed records. Every query of every panel of deploy/grafana/icesink.json
must then return data through Prometheus' HTTP API (Grafana's ``$__rate_interval`` given as
30 s), and every alert rule must evaluate without error.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOPIC, TABLE, DLQ = "obs-pizzas", "obs.pizzas", "obs-dlq"


def _query(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def _start_prometheus(tmp_path: Path, targets: list[int],
                      scrape_configs: list[dict[str, Any]] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """Prometheus with the alert rules, scraping ``targets`` (ports on loopback) as job icesink,
    or with ``scrape_configs`` as given."""
    from icesink.app.replicas import free_port

    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: ./dev test installs Debian's prometheus package"
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
        "scrape_configs": scrape_configs or [{"job_name": "icesink",
                                              "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in targets]}]}],
    }))
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                return proc, port
        except OSError:
            time.sleep(0.3)
    raise AssertionError("prometheus did not get ready in 30 s")


def test_every_dashboard_panel_returns_data_and_every_alert_rule_evaluates(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import wait_rows, write_config

    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 3))
    values = pizza_values(3000, seed=3) + [b"not json %d" % i for i in range(6)]
    asyncio.run(produce(broker.bootstrap, TOPIC, values, partitions=3))
    cfg = write_config(tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="obs-sink",
                       **{"errors.deadletterqueue.topic.name": DLQ,
                          "errors.deadletterqueue.topic.replication.factor": 1})
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    prometheus = None
    try:
        for _ in range(2):
            replicas.start()
        prometheus, port = _start_prometheus(tmp_path, [r.metrics_port for r in replicas.replicas.values()])
        wait_rows(catalog, replicas, (TABLE,), 3000, timeout_s=180)
        time.sleep(12)  # rounds keep going: several scrapes inside every rate window
        replicas.check_alive()
        dashboard = json.loads((ROOT / "deploy" / "grafana" / "icesink.json").read_text())
        empty = []
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "30s")
                if not _query(port, "/api/v1/query", query=expr)["result"]:
                    empty.append(f"{panel['title']}: {target['expr']}")
        assert not empty, "panels without data:\n" + "\n".join(empty)
        replicas_by_group = _query(port, "/api/v1/query", query="count by (group) (icesink_info)")["result"]
        assert [(r["metric"]["group"], r["value"][1]) for r in replicas_by_group] == [("obs-sink", "2")]
        coordinators = _query(port, "/api/v1/query", query="sum(icesink_coordinator_active)")["result"]
        assert coordinators[0]["value"][1] == "1"
        groups = _query(port, "/api/v1/rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        written = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text().count("- alert:")
        assert len(rules) == written and all(r["health"] == "ok" for r in rules), rules
        firing = [r["name"] for r in rules if r["state"] == "firing"]
        assert "IcesinkNoCoordinator" not in firing and "IcesinkNoCommit" not in firing, firing
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(15)
        replicas.stop_all()
