"""deploy/, checked offline: the alert rules with promtool (``check rules`` and the unit tests in
tests/prometheus/alerts_test.yml), the Prometheus configs, the Kubernetes manifests built by
``kubectl kustomize`` and checked against each other, against icesink's settings and strictly
against Kubernetes' schemas (kubernetes-validate), the compose file's references and the file
against the Compose Specification's schema, and every metric the dashboard and the rules name exists.
(tests/integration/test_observability.py runs the dashboard and rules on a real Prometheus.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from icesink.shared.config import load_settings

from icesink.shared.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: ./dev test installs it from Debian"
    return path


def run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_alert_rules_pass_promtool_and_their_unit_tests():
    out = run(tool("promtool"), "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml"))
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"][0]["rules"]
    assert f"SUCCESS: {len(rules)} rules found" in out and len(rules) >= 11
    tests = yaml.safe_load((ROOT / "tests" / "prometheus" / "alerts_test.yml").read_text())["tests"]
    tested = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t.get("exp_alerts")}
    assert tested == {r["alert"] for r in rules}, "every rule needs a unit test that makes it fire"
    run(tool("promtool"), "test", "rules", str(ROOT / "tests" / "prometheus" / "alerts_test.yml"))


@pytest.mark.parametrize("config", ["prometheus.yml", "compose.yml"])
def test_prometheus_configs_check(config):
    run(tool("promtool"), "check", "config", str(DEPLOY / "prometheus" / config))


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def metric_names() -> set[str]:
    """Every series name icesink's registry can export (labelled series appear only once used)."""
    names = set()
    for family in Metrics().registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names


@pytest.mark.parametrize("source", ["grafana/icesink.json", "prometheus/alerts.yml"])
def test_every_metric_the_dashboard_and_the_rules_name_exists(source):
    text = (DEPLOY / source).read_text()
    used = set(re.findall(r"\b(?:icesink|process)_[a-z_]+\b", text))
    assert used, source
    known = metric_names()
    assert used - known == set(), f"{source} names metrics icesink does not export"


def test_the_metrics_page_has_no_created_series():
    """A ``_created`` timestamp per counter and histogram child is read by no panel or rule, and
    at 200 tables it was a fifth of the page a scrape renders."""
    from prometheus_client import generate_latest

    m = Metrics()
    m.rows_committed.labels(table="db.t").inc(3)
    m.commit_duration.labels(table="db.t").observe(0.2)
    page = generate_latest(m.registry).decode()
    assert "icesink_rows_committed_total" in page
    assert "_created" not in page


def test_the_early_write_outcomes_have_series_before_the_first_early_write():
    """The dashboard's early-write panel must have data on a replica that never wrote early
    (tests/integration/test_observability.py checks every panel against a real Prometheus)."""
    m = Metrics()
    for outcome in ("landed", "void", "dropped"):
        assert m.registry.get_sample_value("icesink_early_writes_total", {"outcome": outcome}) == 0.0


def test_the_dashboard_has_the_panels_users_need():
    dashboard = json.loads((DEPLOY / "grafana" / "icesink.json").read_text())
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for needed in ("records in", "dead letters", "lag", "round duration", "commit", "retries", "buffered",
                   "backpressure", "files per round", "freshness", "replicas", "coordinator", "early writes"):
        assert needed in titles, needed
    assert all(t["expr"] and t["refId"] for p in dashboard["panels"] for t in p["targets"])


def k8s() -> dict[str, dict]:
    out = run(tool("kubectl"), "kustomize", str(DEPLOY / "k8s"))
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(out)}


def test_the_kubernetes_manifests_build_offline_and_fit_together(tmp_path):
    from icesink.app.connect import load_connect_settings

    docs = k8s()
    assert set(docs) == {"ConfigMap/icesink-config", "Secret/icesink-credentials", "Secret/icesink-api-users",
                         "StatefulSet/icesink", "Service/icesink-connect", "Service/icesink",
                         "PodDisruptionBudget/icesink", "ConfigMap/icesink-prometheus"}
    data = docs["ConfigMap/icesink-config"]["data"]
    # the API's basic auth: jaas.conf (ConfigMap) names the users' file (Secret), both mounted; here in tmp_path
    users = docs["Secret/icesink-api-users"]["stringData"]["credentials.properties"]
    (tmp_path / "credentials.properties").write_text(users)
    assert 'file="/etc/icesink-users/credentials.properties"' in data["jaas.conf"]
    (tmp_path / "jaas.conf").write_text(data["jaas.conf"].replace("/etc/icesink-users", str(tmp_path)))
    connect_json = json.loads(data["connect.json"])
    assert connect_json["java.security.auth.login.config"] == "/etc/icesink/jaas.conf"
    connect_json["java.security.auth.login.config"] = str(tmp_path / "jaas.conf")
    (tmp_path / "connect.json").write_text(json.dumps(connect_json))
    pod = docs["StatefulSet/icesink"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["args"] == ["icesink", "connect", "--config", "/etc/icesink/connect.json"]
    env = {e["name"]: "10.0.0.7" for e in container["env"]}
    secrets = {k: f"value-of-{k}" for k in docs["Secret/icesink-credentials"]["stringData"]}
    settings = load_connect_settings(tmp_path / "connect.json", {**env, **secrets}, {})  # valid connect settings
    assert settings.worker_id == f"10.0.0.7:{settings.listen_port}" and settings.security.authenticated
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"api": settings.listen_port, "metrics": settings.metrics_port}
    assert settings.metrics_port == int(pod["metadata"]["annotations"]["prometheus.io/port"])
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    api = docs["Service/icesink-connect"]
    assert {p["targetPort"] for p in api["spec"]["ports"]} == {"api", "metrics"}
    # one scrape per pod: the pods carry the scrape annotations, the Services none (a
    # kubernetes-service-endpoints job would scrape every pod a second time)
    for service in (api, docs["Service/icesink"]):
        assert not any(k.startswith("prometheus.io/") for k in service["metadata"].get("annotations", {}))
    # probes: liveness on the metrics port's /health (no auth, answers at once), with a timeout that a
    # busy process meets
    live = container["livenessProbe"]
    assert live["httpGet"] == {"path": "/health", "port": "metrics"} and live["timeoutSeconds"] >= 5
    assert live["failureThreshold"] * live["periodSeconds"] >= 60
    # not root, no privilege escalation, no capabilities; the image's user owns the state volume
    security, context = pod["spec"]["securityContext"], container["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == security["fsGroup"] == 10001
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
    assert "useradd --create-home --uid 10001 icesink" in (DEPLOY / "Dockerfile").read_text()
    # the tasks: any pod's service discovery through the API's Service, with a user of the API's basic auth
    job = yaml.safe_load(docs["ConfigMap/icesink-prometheus"]["data"]["icesink-scrape.yml"])["scrape_configs"]
    assert _task_discovery(job) == [f"http://icesink-connect:{settings.listen_port}/metrics/targets"]
    assert {p["port"] for p in api["spec"]["ports"] if p["targetPort"] == "api"} == {settings.listen_port}
    auth = job[0]["http_sd_configs"][0]["basic_auth"]
    assert f"{auth['username']}:" in users.replace(" ", "") and settings.metrics_host == "0.0.0.0"
    secret_file = tmp_path / "prometheus-password"
    secret_file.write_text("x")
    auth["password_file"] = str(secret_file)
    (tmp_path / "scrape.yml").write_text(yaml.safe_dump({"scrape_configs": job}))
    run(tool("promtool"), "check", "config", str(tmp_path / "scrape.yml"))
    budget = docs["PodDisruptionBudget/icesink"]["spec"]
    assert budget["maxUnavailable"] == 1 and budget["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert docs["StatefulSet/icesink"]["spec"]["serviceName"] == "icesink"
    for service in (api, docs["Service/icesink"]):
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert docs["StatefulSet/icesink"]["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert container["envFrom"][0]["secretRef"]["name"] == docs["Secret/icesink-credentials"]["metadata"]["name"]
    mounted = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounted["config"]["configMap"]["name"] == "icesink-config"
    assert mounted["api-users"]["secret"]["secretName"] == "icesink-api-users"
    paths = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert (paths["config"], paths["api-users"]) == ("/etc/icesink", "/etc/icesink-users")
    # the example connector, with the cluster's defaults, is a valid sink config; its credentials are
    # references to the Secret's variables, every one of which it uses (none is there for nothing)
    connector = json.loads(data["pizzas-connector.json"])
    sink = settings.sink_settings(connector)
    assert sink.topics == ("completed-pizzas",) and sink.catalog_props["type"] == "rest"
    assert sink.catalog_props["s3.access-key-id"] == "value-of-S3_ACCESS_KEY_ID"
    assert sink.catalog_props["s3.secret-access-key"] == "value-of-S3_SECRET_ACCESS_KEY"
    assert sink.control_secret is not None and sink.control_secret.get_secret_value() == "value-of-ICEBERG_CONTROL_SECRET"
    assert {f"${{env:{k}}}" for k in secrets} == {v for v in connector.values() if str(v).startswith("${env:")}


def _task_discovery(scrape_configs: list[dict]) -> list[str]:
    """The URLs of the jobs that find `icesink connect`'s tasks (HTTP service discovery)."""
    return [sd["url"] for c in scrape_configs for sd in c.get("http_sd_configs", [])]


def test_the_plain_prometheus_config_scrapes_connect_processes_and_their_tasks():
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]
    assert {c["job_name"] for c in scrape} == {"icesink", "icesink-connect", "icesink-connect-tasks"}
    assert [u.split(":", 2)[2] for u in _task_discovery(scrape)] == ["8083/metrics/targets"]


def test_the_compose_file_refers_to_files_that_exist(tmp_path):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), f"service {name}: {source} does not exist"
    build = compose["services"]["icesink"]["build"]
    dockerfile = (DEPLOY / build["context"] / build["dockerfile"]).resolve()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
    load_settings(DEPLOY / "compose-sink.json", None, {})
    from icesink.app.connect import load_connect_settings

    connect = compose["services"]["connect"]
    assert connect["command"][1:3] == ["connect", "--config"] and "127.0.0.1:8083:8083" in connect["ports"]
    load_connect_settings(DEPLOY / "compose-connect.json", {}, {})
    # A named volume mounted where the image has no directory is created root-owned, and the
    # image's user (uid 10001) cannot write the catalog: the image makes each such path its user's.
    made = next(line for line in dockerfile.read_text().splitlines() if "useradd" in line)
    for name in ("icesink", "connect"):
        service = compose["services"][name]
        for volume in service["volumes"]:
            source, target = volume.split(":")[:2]
            if not source.startswith("./"):
                assert f"mkdir -p {target}" in made and "chown -R icesink /var/lib/icesink" in made, (name, target)
        # starts once the broker answers, and comes back after a crash or a host restart
        assert service["depends_on"] == {"kafka": {"condition": "service_healthy"}}, name
        assert service["restart"] == "unless-stopped", name
    assert "kafka-broker-api-versions.sh" in " ".join(compose["services"]["kafka"]["healthcheck"]["test"])
    # Prometheus scrapes the connect service's metrics port as well as the workers', and the connect
    # service's tasks through its service discovery (they listen on every interface of the container,
    # on the service's advertised name)
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "compose.yml").read_text())["scrape_configs"]
    targets = {(c["job_name"], sd["names"][0], sd["port"]) for c in scrape for sd in c.get("dns_sd_configs", [])}
    assert targets == {("icesink", "icesink", 9400), ("icesink-connect", "connect", 9400)}
    settings = load_connect_settings(DEPLOY / "compose-connect.json", connect["environment"], {})
    assert settings.metrics_port == 9400 and settings.metrics_host == "0.0.0.0"
    assert settings.metrics_target(41001) == "connect:41001"
    assert _task_discovery(scrape) == [f"http://connect:{settings.listen_port}/metrics/targets"]


def test_the_systemd_unit_and_the_examples_start_a_known_command():
    unit = (DEPLOY / "icesink@.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert " worker --config " in exec_start
    unit = (DEPLOY / "icesink-connect.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith(" connect --config /etc/icesink/connect.json")
    load_settings(DEPLOY / "sink.example.json", None, {})


def test_the_image_and_the_unit_build_the_class_archive_with_a_known_command():
    from icesink.app.cli import build_parser, cmd_spark_archive

    dockerfile = (DEPLOY / "Dockerfile").read_text().splitlines()
    run = next(line for line in dockerfile if line.startswith("RUN icesink "))
    assert dockerfile.index(run) > dockerfile.index("USER icesink")  # in the home of the user that runs it
    unit = (DEPLOY / "icesink@.service").read_text().splitlines()
    pre = next(line for line in unit if line.startswith("ExecStartPre=-"))
    for words in (run.split()[2:], pre.split()[1:]):
        args = build_parser().parse_args(words)
        assert args.fn is cmd_spark_archive



def _compose_errors(doc: object) -> list[str]:
    import jsonschema

    schema = json.loads((ROOT / "tests" / "unit" / "schemas" / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_the_compose_file_fits_the_compose_specification():
    """deploy/compose.yaml against the Compose Specification's JSON schema (vendored with its
    source and licence: tests/unit/schemas/README.md); a misspelt key or a wrong type fails."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert _compose_errors(compose) == []
    broken = json.loads(json.dumps(compose))
    broken["services"]["icesink"]["restart_policy"] = "always"  # not a service key (deploy.restart_policy is)
    broken["services"]["connect"]["depends_on"] = {"kafka": {"condition": "healthy"}}
    errors = _compose_errors(broken)
    assert any("restart_policy" in e for e in errors) and any("depends_on" in e for e in errors), errors


def _k8s_errors(doc: dict) -> list[str]:
    import kubernetes_validate
    from kubernetes_validate.utils import ValidationError

    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except ValidationError as e:
        return [f"{doc['kind']}/{doc['metadata']['name']}: {'/'.join(map(str, e.path))}: {e.message}"]
    return []


#: The Kubernetes version whose schemas the manifests are checked against (kubernetes-validate's newest).
K8S_VERSION = "1.37.0"


def test_the_kubernetes_manifests_fit_the_kubernetes_schemas_strictly():
    """Each manifest ``kubectl kustomize`` builds against Kubernetes' own schemas, strict (an
    unknown field is an error, as ``kubectl apply --validate=strict`` makes it), offline: the
    schemas ship in the test dependency kubernetes-validate."""
    docs = k8s()
    assert [e for d in docs.values() for e in _k8s_errors(d)] == []
    broken = json.loads(json.dumps(docs["StatefulSet/icesink"]))
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["livenessProbe"]["timeoutSecond"] = 5  # misspelt: timeoutSeconds
    errors = _k8s_errors(broken)
    assert errors and "timeoutSecond" in errors[0], errors
    pdb = json.loads(json.dumps(docs["PodDisruptionBudget/icesink"]))
    pdb["spec"]["maxUnavailable"] = [1]
    assert _k8s_errors(pdb), pdb
