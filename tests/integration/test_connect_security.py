"""``icesink connect`` as an API reachable from the network (issue 40, point 1): real connect
processes on the embedded broker.

- The REST API answers on ``listeners`` only; the metrics port serves ``/metrics`` only, also on
  a non-loopback interface of the machine.
- Basic auth from a JAAS PropertyFileLoginModule credentials file and an https listener that
  requires client certificates (a PKCS12 keystore, a PEM truststore), as Kafka Connect's keys
  configure them; a JKS keystore is refused at start, naming the key.
- Connector configs cannot set keys that load code or touch the host unless the process allows
  them (``connector.config.override.allow``); secrets never appear in a response; config
  providers keep secrets out of configs and are resolved where the task runs; a secret process
  default is refused at start rather than handed to every connector.

Most connectors here are refused, so few worker replicas start; the one accepted connector runs
until its task has created its control topic (no data, no commits).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import time

import pytest

from tests.support.connect import (
    call, client_context, make_certs, non_loopback_addresses, process_config, start_connect, wait_exit, wait_status,
)

pytestmark = pytest.mark.integration

OVERRIDE = "connector.config.override.allow"
BASIC_AUTH = "org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension"
LOGIN_MODULE = "org.apache.kafka.connect.rest.basic.auth.extension.PropertyFileLoginModule"
FILE_PROVIDER = "org.apache.kafka.common.config.provider.FileConfigProvider"
ENV_PROVIDER = "org.apache.kafka.common.config.provider.EnvVarConfigProvider"


def _refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.2", port), timeout=5):
            return False
    except ConnectionRefusedError:
        return True


def test_the_api_answers_on_its_listener_only_and_the_metrics_port_serves_metrics_only(broker, tmp_path):
    process = start_connect(tmp_path, "c", process_config(tmp_path, broker.bootstrap, "sec-listen"))
    try:
        assert call(process.api, "GET", "/connectors") == (200, [])
        for host in ["127.0.0.1", *non_loopback_addresses()]:
            for method, path, body in (("GET", "/connectors", None), ("GET", "/", None),
                                       ("PUT", "/connectors/x/config", {"topics": "t", "iceberg.tables": "a.b"})):
                code, _ = call(process.metrics, method, path, body, host=host)
                assert code in (404, 405), f"expected no API on the metrics port ({host}), found {method} {path}: {code}"
            code, text = call(process.metrics, "GET", "/metrics", host=host)
            assert code == 200 and "icesink_connect_workers" in text
        assert _refused(process.api), "expected the API bound to 127.0.0.1 only, found it on 127.0.0.2"
        for address in non_loopback_addresses():
            with pytest.raises(OSError):
                socket.create_connection((address, process.api), timeout=5).close()
    finally:
        process.stop()


def test_basic_auth_and_an_https_listener_requiring_client_certificates(broker, tmp_path):
    from icesink.app.embedded import free_port

    certs = make_certs(tmp_path / "certs")
    credentials = tmp_path / "credentials.properties"
    credentials.write_text("# who may call the API\nalice: alice-pw-1\nbob=bob-pw-2\n")
    jaas = tmp_path / "jaas.conf"
    jaas.write_text(f'KafkaConnect {{\n  {LOGIN_MODULE} required\n  file="{credentials}";\n}};\n')
    api = free_port()
    tls = {
        "listeners": f"https://127.0.0.1:{api}",
        "rest.extension.classes": BASIC_AUTH, "java.security.auth.login.config": str(jaas),
        "listeners.https.ssl.keystore.location": str(certs["server.p12"]),
        "listeners.https.ssl.keystore.type": "PKCS12", "listeners.https.ssl.keystore.password": "store-pw",
        "listeners.https.ssl.truststore.location": str(certs["ca.pem"]),
        "listeners.https.ssl.truststore.type": "PEM", "listeners.https.ssl.client.auth": "required",
    }
    config = process_config(tmp_path, broker.bootstrap, "sec-tls", **tls)
    good = client_context(certs)
    process = start_connect(tmp_path, "c", config,
                            ready=lambda p: call(api, "GET", "/", scheme="https", context=good,
                                                 auth=("alice", "alice-pw-1"))[0] == 200)
    try:
        assert call(api, "GET", "/connectors", scheme="https", context=good, auth=("alice", "alice-pw-1")) == (200, [])
        assert call(api, "GET", "/connectors", scheme="https", context=good, auth=("bob", "bob-pw-2")) == (200, [])
        for auth in (None, ("alice", "wrong"), ("mallory", "alice-pw-1")):
            code, body = call(api, "GET", "/connectors", scheme="https", context=good, auth=auth)
            assert code == 401, f"expected 401 for {auth}, found {code}: {body}"
        code, _ = call(api, "PUT", "/connectors/x/config", {"topics": "t", "iceberg.tables": "a.b"},
                       scheme="https", context=good)
        assert code == 401
        with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):  # no client certificate
            call(api, "GET", "/connectors", scheme="https", context=client_context(certs, with_cert=False),
                 auth=("alice", "alice-pw-1"))
        with pytest.raises((OSError, http.client.HTTPException)):  # plain http on the https listener
            call(api, "GET", "/connectors", auth=("alice", "alice-pw-1"))
        assert call(process.metrics, "GET", "/connectors")[0] == 404  # the metrics port: metrics only
        assert call(process.metrics, "GET", "/metrics")[0] == 200
    finally:
        process.stop()

    # What Python cannot load is refused at start, naming the key: a JKS keystore.
    jks = process_config(tmp_path, broker.bootstrap, "sec-tls-jks", **{
        **tls, "listeners": f"https://127.0.0.1:{free_port()}",
        "listeners.https.ssl.keystore.location": str(certs["server.jks"]),
        "listeners.https.ssl.keystore.type": "JKS"})
    refused = start_connect(tmp_path, "jks", jks, wait=False)
    assert wait_exit(refused) == 2
    assert "listeners.https.ssl.keystore.type" in refused.log and "PKCS12" in refused.log


SECRET_LITERALS = {"iceberg.control.secret": "ctl-secret-x1", "iceberg.catalog.s3.secret-access-key": "s3-secret-x2",
                   "iceberg.catalog.s3.access-key-id": "s3-access-x3"}
FILE_SECRET, ENV_TOPIC = "token-from-file-x4", "sec-providers-control"


def test_connector_configs_cannot_load_code_or_touch_the_host_and_show_no_secret(broker, tmp_path):
    from icesink.shared.kafka_admin import topic_exists

    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "creds.properties").write_text(f"token={FILE_SECRET}\n")
    (tmp_path / "elsewhere.properties").write_text("token=not-allowed\n")
    config = process_config(
        tmp_path, broker.bootstrap, "sec-keys", **{
            OVERRIDE: "spark.executor.extraJavaOptions",
            "config.providers": "file,env",
            "config.providers.file.class": FILE_PROVIDER,
            "config.providers.file.param.allowed.paths": str(secrets),
            "config.providers.env.class": ENV_PROVIDER,
            "config.providers.env.param.allowlist.pattern": "IT_.*",
        })
    process = start_connect(tmp_path, "c", config, env={"IT_CONTROL_TOPIC": ENV_TOPIC, "OTHER_SECRET": "other-x5"})
    base = {"connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
            "topics": "sec-keys-topic", "iceberg.tables": "sec.t"}
    try:
        for key, value in {
            "spark.jars": "/tmp/evil.jar", "spark.jars.packages": "evil:evil:1.0", "spark.plugins": "com.evil.Plugin",
            "spark.driver.extraJavaOptions": "-javaagent:/tmp/evil.jar", "spark.driver.extraClassPath": "/tmp/evil",
            "spark.executor.extraLibraryPath": "/tmp/evil", "spark.pyspark.python": "/tmp/evil.sh",
            "spark.master": "spark://evil:7077", "state.dir": "/etc", "worker.id": "../../etc", "metrics.host": "0.0.0.0",
            "fault.crash-at": "worker.during-write", "bootstrap.servers": "evil:9092",
            "iceberg.catalog.py-io-impl": "evil.Io", "config.providers": "file",
            # relative paths, made absolute against the process's directory when used
            "iceberg.catalog.warehouse": "../../victim-warehouse",
            "iceberg.tables.auto-create-props.write.data.path": "../victim-data",
        }.items():
            code, body = call(process.api, "PUT", "/connectors/evil/config", {**base, key: value})
            allows = "cannot set it" if key == "worker.id" else OVERRIDE  # the process names each task's replica
            assert code == 400 and key in body["message"] and allows in body["message"], (key, code, body)
        assert call(process.api, "GET", "/connectors") == (200, [])

        # references to what the providers may not read, and a reference's value in an error: 400s that show no value
        for key, value, why in (
            ("iceberg.catalog.token", f"${{file:{tmp_path / 'elsewhere.properties'}:token}}", "allowed.paths"),
            ("iceberg.catalog.token", "${env:OTHER_SECRET}", "allowlist.pattern"),
            ("iceberg.catalog.token", f"${{vault:{secrets}:token}}", "config.providers"),
            ("iceberg.control.commit.interval-ms", f"${{file:{secrets / 'creds.properties'}:token}}", "integer"),
        ):
            code, body = call(process.api, "PUT", "/connectors/evil/config", {**base, key: value})
            assert code == 400 and key in body["message"] and why in body["message"], (key, value, body)
            assert not [v for v in (FILE_SECRET, "other-x5", "not-allowed") if v in json.dumps(body)], body

        connector = {**base, **SECRET_LITERALS, "iceberg.control.topic": "${env:IT_CONTROL_TOPIC}",
                     "iceberg.catalog.token": f"${{file:{secrets / 'creds.properties'}:token}}",
                     "spark.executor.extraJavaOptions": "-Dallowed.by.the.process=1"}
        code, body = call(process.api, "PUT", "/connectors/ok/config", connector)
        assert code == 201, body
        shown = [call(process.api, "GET", path)[1] for path in (
            "/connectors/ok/config", "/connectors/ok", "/connectors/ok/tasks", "/connectors?expand=info&expand=status")]
        # validate answers every key's value, as Connect does: secrets hidden there too
        shown.append(call(process.api, "PUT", f"/connector-plugins/{connector['connector.class']}/config/validate",
                          {**connector, "name": "ok"})[1])
        text = json.dumps([body, *shown])
        leaked = [v for v in [*SECRET_LITERALS.values(), FILE_SECRET, ENV_TOPIC] if v in text]
        assert not leaked, f"expected no secret in the API's answers, found {leaked}"
        got = shown[0]
        assert got["iceberg.control.secret"] == "**********" and got["iceberg.control.topic"] == "${env:IT_CONTROL_TOPIC}"
        assert got["iceberg.catalog.token"] == connector["iceberg.catalog.token"]  # references are shown as given

        # resolved where the task runs: the replica creates the control topic the variable names
        deadline = time.monotonic() + 120
        while not asyncio.run(topic_exists(broker.bootstrap, ENV_TOPIC)) and time.monotonic() < deadline:
            time.sleep(1)
        assert asyncio.run(topic_exists(broker.bootstrap, ENV_TOPIC)), process.log[-3000:]
        task_files = list((tmp_path / "state").rglob("tasks/ok-*.json"))
        assert len(task_files) == 1 and task_files[0].stat().st_mode & 0o077 == 0
        task_config = task_files[0].read_text()
        assert FILE_SECRET not in task_config and ENV_TOPIC not in task_config and "${env:IT_CONTROL_TOPIC}" in task_config

        # the config as GET shows it (secrets masked) PUT back with a change keeps the secrets
        # (with a key icesink has not, let in by config.unknown-keys=warn: the connector's status names it)
        code, _ = call(process.api, "PUT", "/connectors/ok/config", {**got, "iceberg.control.commit.interval-ms": "5000",
                                                                     "config.unknown-keys": "warn", "iceberg.tabels.typo": "1"})
        assert code == 200
        deadline, stored = time.monotonic() + 60, {}
        while stored.get("iceberg.control.commit.interval-ms") != "5000" and time.monotonic() < deadline:
            time.sleep(0.5)
            stored = json.loads(task_files[0].read_text())  # the task restarted with the changed config
        assert stored["iceberg.control.secret"] == "ctl-secret-x1" and stored["iceberg.control.commit.interval-ms"] == "5000"
        status = wait_status(process.api, "ok", lambda s: s["tasks"] and s["tasks"][0]["state"] == "RUNNING")
        assert "ctl-secret-x1" not in json.dumps(status)
        assert status["connector"]["trace"] == "unknown settings ignored (config.unknown-keys=warn): iceberg.tabels.typo"
        assert call(process.api, "DELETE", "/connectors/ok")[0] == 204
    finally:
        process.stop()


@pytest.mark.parametrize("key, env", [
    ("iceberg.control.secret", {}),
    ("iceberg.catalog.s3.secret-access-key", {"ICESINK_ICEBERG_CATALOG_S3_SECRET_ACCESS_KEY": "s3-secret-default-x6"}),
])
def test_a_secret_process_default_is_refused_rather_than_handed_to_every_connector(broker, tmp_path, key, env):
    config = process_config(tmp_path, broker.bootstrap, "sec-defaults")
    if not env:
        config[key] = "group-secret-default-x7"
    process = start_connect(tmp_path, "c", config, env=env, wait=False)
    assert wait_exit(process) == 2, process.log[-3000:]
    assert key in process.log and "config provider" in process.log
    assert "group-secret-default-x7" not in process.log and "s3-secret-default-x6" not in process.log
