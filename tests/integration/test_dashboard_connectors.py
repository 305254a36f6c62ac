"""Every dashboard panel and alert rule against a real Prometheus, with 1, 2 and 5 connectors on
one `icesink connect` process and with plain worker replicas, side by side.

A connect process's tasks' series share one job and instance (the process's), each labelled with
its connector and task (the labels of its HTTP service discovery, GET /metrics/targets:
icesink/app/connect_state.py, ``scrape_targets``; tests/integration/test_connect_metrics_sd.py
scrapes real ones); plain replicas have one instance
each and neither label. The series here have those shapes (every metric the dashboard and the
rules name, two tasks or replicas per sink group, task 0 the coordinator), ten healthy minutes
of them (no failures, no lag, no dead letters) backfilled into a TSDB with ``promtool tsdb
create-blocks-from openmetrics``; a real Prometheus then answers every panel's query and every
rule's expression at the end of that window. The replicas
themselves are exercised by tests/integration/test_observability.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
STEP_S, POINTS = 10, 61  # ten minutes, a point every 10 s
BUCKETS = ("0.1", "1", "10", "+Inf")
#: Scenario -> the replicas (label sets) of its sink groups: connect processes with N connectors
#: of two tasks each, and two plain replicas of one group.
SCENARIOS: dict[str, list[dict[str, str]]] = {
    **{f"connect-{n}": [{"job": f"connect-{n}", "instance": f"connect{n}:8083", "connector": f"c{k}", "task": str(t),
                         "group": f"connect-{n}-c{k}"} for k in range(n) for t in range(2)] for n in (1, 2, 5)},
    "plain": [{"job": "plain", "instance": f"w{t}:9401", "group": "plain", "task": str(t)} for t in range(2)],
}


def _used_metrics() -> set[str]:
    text = (DEPLOY / "grafana" / "icesink.json").read_text() + (DEPLOY / "prometheus" / "alerts.yml").read_text()
    return set(re.findall(r"\b(?:icesink|process)_[a-z_]+\b", text))


def _labels(replica: dict[str, str], extra: dict[str, str]) -> str:
    labels = {k: v for k, v in replica.items() if k != "group" and (k != "task" or "connector" in replica)}
    labels.update(extra)
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _openmetrics(start: int) -> str:
    """Every used metric's series for every replica of every scenario, as OpenMetrics text."""
    lines: list[str] = []
    replicas = [r for rs in SCENARIOS.values() for r in rs]
    for name in sorted(_used_metrics()):
        base = name.removesuffix("_bucket").removesuffix("_total")
        kind = "histogram" if name.endswith("_bucket") else "counter" if name.endswith("_total") else "gauge"
        lines.append(f"# TYPE {base} {kind}")
        for replica in replicas:
            first = replica["task"] == "0"
            extra = {"topic": "t", "table": "db.t", "reason": "r", "outcome": "landed", "partition": "0"}
            if name == "icesink_info":
                extra = {"group": replica["group"], "worker": f"{replica['instance']}-{replica.get('connector', '')}"
                                                             f"-{replica['task']}"}
            for i in range(POINTS):
                ts = start + i * STEP_S
                if kind == "histogram":
                    for j, le in enumerate(BUCKETS):
                        lines.append(f"{base}_bucket{_labels(replica, {**extra, 'le': le})} {i * (j + 1)} {ts}")
                    lines.append(f"{base}_count{_labels(replica, extra)} {i * len(BUCKETS)} {ts}")
                    lines.append(f"{base}_sum{_labels(replica, extra)} {i * 2.5} {ts}")
                    continue
                value: float = {
                    "icesink_info": 1.0,
                    "icesink_coordinator_active": 1.0 if first else 0.0,
                    "icesink_last_round_committed_timestamp_seconds": float(ts),
                    "icesink_valid_through_timestamp_seconds": float(ts),
                    "icesink_commit_interval_seconds": 10.0,
                    "process_start_time_seconds": float(start - 60),
                }.get(name, float(i) if kind == "counter" and not re.search("fail|deadletter", name) else 0.0)
                lines.append(f"{name}{_labels(replica, extra)} {value} {ts}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _query(port: int, expr: str, at: int) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": str(at)})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:  # 422: the expression failed to evaluate
        raise AssertionError(f"{expr}: {exc.read().decode()}") from None
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from icesink.app.replicas import free_port

    promtool, binary = shutil.which("promtool"), shutil.which("prometheus")
    assert promtool and binary, "Prometheus is missing: ./dev test installs Debian's prometheus package"
    tmp = tmp_path_factory.mktemp("prometheus")
    start = (int(time.time()) // 3600 - 2) * 3600  # two hours ago, on an hour
    (tmp / "series.om").write_text(_openmetrics(start))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "series.om"), str(tmp / "tsdb")],
                   check=True, capture_output=True, timeout=120)
    port = free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={DEPLOY / 'prometheus' / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "prometheus did not get ready in 30 s"
                time.sleep(0.3)
        yield port, start + (POINTS - 1) * STEP_S
    finally:
        proc.terminate()
        proc.wait(15)


def _by(result: list[dict[str, Any]], label: str) -> dict[str, str]:
    return {r["metric"].get(label, ""): r["value"][1] for r in result}


def test_every_panel_answers_per_group_and_per_task_with_any_number_of_connectors(prometheus):
    port, at = prometheus
    dashboard = json.loads((DEPLOY / "grafana" / "icesink.json").read_text())
    empty = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            if not _query(port, target["expr"].replace("$__rate_interval", "30s"), at):
                empty.append(f"{panel['title']}: {target['expr']}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    exprs = {t["legendFormat"].split(" ")[0]: t["expr"] for p in dashboard["panels"] for t in p["targets"]
             if "by (group)" in t["expr"]}
    groups = {r["group"] for rs in SCENARIOS.values() for r in rs}
    assert _by(_query(port, exprs["replicas"], at), "group") == dict.fromkeys(groups, "2")
    assert _by(_query(port, exprs["coordinators"], at), "group") == dict.fromkeys(groups, "1")
    assert _by(_query(port, exprs["{{group}}"], at), "group") == dict.fromkeys(groups, "0")  # time since last round
    buffered = next(t["expr"] for p in dashboard["panels"] for t in p["targets"] if "buffered_bytes" in t["expr"])
    assert len(_query(port, buffered, at)) == sum(len(rs) for rs in SCENARIOS.values()), "one series per task"


def test_every_alert_rule_evaluates_and_stays_silent_on_healthy_sinks(prometheus):
    port, at = prometheus
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"][0]["rules"]
    firing = {r["alert"]: _query(port, r["expr"], at) for r in rules}
    assert {name: result for name, result in firing.items() if result} == {}
