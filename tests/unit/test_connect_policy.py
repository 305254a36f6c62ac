"""What a connector's config may hold in ``icesink connect``, how configs are shown, and who may
call the API (basic auth from a JAAS file, https keystores): without processes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from icesink.app.connect_policy import (
    OVERRIDE_ALLOW, check_connector, check_name, process_level, replica_name, secret_default, shown, unmasked,
)
from icesink.app.connect_security import (
    BASIC_AUTH_EXTENSION, LOGIN_MODULE, check_basic, https_settings, parse_listeners, rest_security,
)
from icesink.app.connect_settings import connect_settings
from icesink.shared.errors import ConfigError
from icesink.shared.secrets import MASK


@pytest.mark.parametrize("key, value", [
    ("spark.jars", "/x.jar"), ("spark.jars.packages", "a:b:1"), ("spark.plugins", "x.P"),
    ("spark.driver.extraJavaOptions", "-javaagent:x"), ("spark.executor.extraJavaOptions", "-Dx"),
    ("spark.driver.extraClassPath", "/x"), ("spark.executor.extraLibraryPath", "/x"), ("spark.extraListeners", "x.L"),
    ("spark.sql.extensions", "x.E"), ("spark.pyspark.python", "/bin/sh"), ("spark.executorEnv.LD_PRELOAD", "/x.so"),
    ("spark.driver.resource.gpu.discoveryScript", "/x.sh"), ("spark.hadoop.fs.file.impl", "x.Fs"),
    ("spark.sql.catalog.c", "x.Catalog"), ("spark.master", "spark://evil:7077"), ("spark.remote", "sc://evil:15002"),
    ("state.dir", "/etc"), ("metrics.host", "0.0.0.0"), ("fault.crash-at", "worker.during-write"),
    ("fault.hold-at", "worker.spark-start"), ("bootstrap.servers", "evil:9092"), ("ssl.cafile", "/etc/shadow"),
    ("sasl.password", "x"), ("config.providers", "file"), ("config.providers.file.class", "x"),
    ("iceberg.catalog.py-io-impl", "x.Io"), ("iceberg.catalog.py-catalog-impl", "x.C"),
    ("iceberg.catalog.uri", "sqlite:////etc/cron.d/x"), ("iceberg.catalog.warehouse", "file:///root"),
    ("iceberg.catalog.warehouse", "/root"), ("iceberg.catalog.ssl.client.key", "/etc/ssl/private/k.pem"),
    ("iceberg.tables.auto-create-props.write.py-location-provider.impl", "x.L"),
    ("iceberg.tables.auto-create-props.write.data.path", "file:///etc"),
    ("iceberg.hadoop.fs.file.impl", "x.Fs"), ("iceberg.hadoop-conf-dir", "/etc/hadoop"),
])
def test_keys_that_load_code_or_touch_the_host_are_the_processs(key, value):
    assert process_level(key, value) is not None
    with pytest.raises(ConfigError) as info:
        check_connector({"topics": "t", key: value}, ())
    assert info.value.key == key and OVERRIDE_ALLOW in str(info.value)
    check_connector({"topics": "t", key: value}, (key,))  # unless the process allows it
    check_connector({"topics": "t", key: value}, (key.split(".")[0] + ".*",))  # by pattern too


@pytest.mark.parametrize("key, value", [
    ("spark.driver.memory", "2g"), ("spark.master", "local[2]"), ("spark.master", "local[*]"),
    ("spark.sql.shuffle.partitions", "4"), ("spark.hadoop.fs.s3a.secret.key", "x"),
    ("iceberg.catalog.uri", "http://rest:8181"), ("iceberg.catalog.uri", "postgresql://u:p@db/x"),
    ("iceberg.catalog.warehouse", "s3://bucket/"), ("iceberg.catalog.s3.secret-access-key", "x"),
    ("iceberg.control.secret", "x"), ("group.id", "g"), ("shutdown.timeout-ms", "30000.0"),
    ("iceberg.tables.auto-create-props.write.data.path", "s3://bucket/data"),
    ("iceberg.hadoop.fs.s3a.endpoint", "http://minio:9000"), ("iceberg.tables.write-props.write.parquet.compression-codec",
                                                             "gzip"), ("iceberg.kafka.client.id", "c"),
])
def test_sink_keys_are_the_connectors(key, value):
    assert process_level(key, value) is None
    check_connector({"topics": "t", key: value}, ())


def test_references_in_path_keys_and_assigned_keys_are_refused():
    with pytest.raises(ConfigError, match="once resolved"):
        check_connector({"iceberg.catalog.warehouse": "${env:WH}"}, ())
    check_connector({"iceberg.catalog.warehouse": "${env:WH}"}, ("iceberg.catalog.warehouse",))
    for key in ("worker.id", "metrics.port"):
        with pytest.raises(ConfigError, match="cannot set it"):
            check_connector({key: "x"}, ("*",))  # whatever the process allows


@pytest.mark.parametrize("name", ["", "a/b", "tab\there", "new\nline", "n" * 256])
def test_connector_names_that_are_refused(name):
    with pytest.raises(ConfigError):
        check_name(name)


def test_long_and_odd_names_make_bounded_replica_names():
    for connector in ("n" * 240, "..", ".hidden", "ü名前 with spaces", "pizzas"):
        check_name(connector)
        name = replica_name(connector, 5, "host.example:8083")
        assert len(name) <= 64 and name[0].isalnum() and set(name) <= set(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"), name
    assert replica_name("pizzas", 0, "h:1").startswith("pizzas-0-h_1-")
    assert replica_name("n" * 240, 0, "h:1") != replica_name("n" * 239 + "m", 0, "h:1")


def test_configs_are_shown_with_secrets_masked_and_a_masked_put_keeps_them():
    stored = {"topics": "t", "iceberg.control.secret": "ctl", "iceberg.catalog.s3.secret-access-key": "s3",
              "iceberg.catalog.uri": "postgresql://u:pw@db/x", "sasl.password": "k",
              "spark.hadoop.fs.s3a.secret.key": "sk", "iceberg.catalog.token": "${file:/s/c.properties:token}"}
    out = shown(stored)
    assert out == {"topics": "t", "iceberg.control.secret": MASK, "iceberg.catalog.s3.secret-access-key": MASK,
                   "iceberg.catalog.uri": f"postgresql://u:{MASK}@db/x", "sasl.password": MASK,
                   "spark.hadoop.fs.s3a.secret.key": MASK, "iceberg.catalog.token": "${file:/s/c.properties:token}"}
    assert unmasked({**out, "topics": "u"}, stored) == {**stored, "topics": "u"}
    with pytest.raises(ConfigError) as info:
        unmasked({"iceberg.control.secret": MASK}, None)
    assert info.value.key == "iceberg.control.secret"
    with pytest.raises(ConfigError):
        unmasked({"iceberg.catalog.uri": f"postgresql://u:{MASK}@other/x"}, stored)


def test_secret_process_defaults_are_found_and_the_kafka_connection_is_not_one():
    assert secret_default({"iceberg.control.secret": "x"}) == "iceberg.control.secret"
    assert secret_default({"iceberg.catalog.client.api-key": "x"}) == "iceberg.catalog.client.api-key"
    assert secret_default({"iceberg.catalog.uri": "postgresql://u:pw@db/x"}) == "iceberg.catalog.uri"
    assert secret_default({"spark.hadoop.fs.s3a.secret.key": "${env:X}"}) == "spark.hadoop.fs.s3a.secret.key"
    assert secret_default({"sasl.password": "x", "ssl.password": "y", "spark.master": "local[1]",
                           "iceberg.catalog.uri": "http://rest:8181"}) is None
    with pytest.raises(ConfigError) as info:
        connect_settings({"iceberg.catalog.s3.secret-access-key": "s3-x"})
    assert info.value.key == "iceberg.catalog.s3.secret-access-key" and "s3-x" not in str(info.value)


def test_unknown_process_keys_and_connector_keys_are_refused(tmp_path):
    with pytest.raises(ConfigError) as info:
        connect_settings({"state.dir": str(tmp_path), "access.control.allow.origin": "*"})
    assert info.value.key == "access.control.allow.origin"
    s = connect_settings({"state.dir": str(tmp_path)})
    with pytest.raises(ConfigError) as info:
        s.check("c", {"topics": "t", "iceberg.tables": "a.b", "topics.regex": "x.*"})
    assert info.value.key == "topics.regex"
    with pytest.raises(ConfigError) as info:
        s.check("c", {"topics": "t", "iceberg.tables": "a.b", "spark.jars": "/x"})
    assert info.value.key == "spark.jars"
    settings = s.check("c", {"topics": "t", "iceberg.tables": "a.b", "shutdown.timeout-ms": "30000.0"})
    assert settings.shutdown_timeout_ms == 30000


def test_listeners_and_the_all_or_nothing_https_prefix():
    assert [(x.scheme, x.host, x.port) for x in parse_listeners("http://:8083, HTTPS://127.0.0.1:8443")] == [
        ("http", "", 8083), ("https", "127.0.0.1", 8443)]
    raw = {"ssl.keystore.location": "/a", "listeners.https.ssl.keystore.location": "/b"}
    assert https_settings(raw) == ({"ssl.keystore.location": "/b"}, "listeners.https.")
    assert https_settings({"ssl.keystore.location": "/a"}) == ({"ssl.keystore.location": "/a"}, "")
    for bad in ("http://h", "tcp://h:1", "http://h:1/path", ""):
        with pytest.raises(ConfigError):
            parse_listeners(bad)


def _jaas(tmp_path: Path, body: str, users: str = "alice: pw-1\nbob=pw 2\n") -> dict[str, str]:
    (tmp_path / "users.properties").write_text(users)
    (tmp_path / "jaas.conf").write_text(body.replace("FILE", str(tmp_path / "users.properties")))
    return {"rest.extension.classes": BASIC_AUTH_EXTENSION, "java.security.auth.login.config": str(tmp_path / "jaas.conf")}


def test_basic_auth_users_come_from_the_jaas_files_credentials(tmp_path):
    raw = _jaas(tmp_path, f'// users\nKafkaConnect {{\n  {LOGIN_MODULE} required\n    file="FILE";\n}};\n'
                f'Other {{ x.Y required; }};')
    security, secret_values = rest_security(raw, parse_listeners("http://127.0.0.1:1"))
    assert security.users == {"alice": "pw-1", "bob": "pw 2"} and security.authenticated
    assert secret_values == {"pw-1", "pw 2"}

    def header(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert check_basic(security.users, header("alice", "pw-1")) and check_basic(security.users, header("bob", "pw 2"))
    for bad in (None, "", "Basic", "Bearer x", "Basic !!!", header("alice", "pw-2"), header("carol", "pw-1"),
                "Basic " + base64.b64encode(b"alice").decode()):
        assert not check_basic(security.users, bad), bad


@pytest.mark.parametrize("body, users, key", [
    ('KafkaConnect {{ {m} required file="FILE"; }};', "", "java.security.auth.login.config"),  # empty: refused
    ('Other {{ {m} required file="FILE"; }};', "a: b", "java.security.auth.login.config"),
    ('KafkaConnect {{ x.Other required file="FILE"; }};', "a: b", "java.security.auth.login.config"),
    ('KafkaConnect {{ {m} sufficient file="FILE"; }};', "a: b", "java.security.auth.login.config"),
    ('KafkaConnect {{ {m} required; }};', "a: b", "java.security.auth.login.config"),
])
def test_bad_jaas_files_are_refused_naming_the_key(tmp_path, body, users, key):
    raw = _jaas(tmp_path, body.format(m=LOGIN_MODULE), users)
    with pytest.raises(ConfigError) as info:
        rest_security(raw, parse_listeners("http://127.0.0.1:1"))
    assert info.value.key == key


@pytest.mark.parametrize("raw, key", [
    ({"rest.extension.classes": "com.acme.Auth"}, "rest.extension.classes"),
    ({"rest.extension.classes": BASIC_AUTH_EXTENSION}, "java.security.auth.login.config"),
    ({"java.security.auth.login.config": "/x"}, "java.security.auth.login.config"),
    ({"ssl.keystore.location": "/x"}, "ssl.keystore.location"),  # no https listener to act on
    ({"ssl.client.authentication": "required"}, "ssl.client.authentication"),
])
def test_security_settings_that_would_not_act_are_refused(raw, key):
    with pytest.raises(ConfigError) as info:
        rest_security(raw, parse_listeners("http://127.0.0.1:1"))
    assert info.value.key == key


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    from tests.support.connect import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"))


def test_https_keystores_python_can_load_and_refusals_naming_the_key(certs, tmp_path):
    https = parse_listeners("https://127.0.0.1:1")
    pem = (tmp_path / "server-all.pem")
    pem.write_bytes(certs["server.key"].read_bytes() + certs["server.pem"].read_bytes())
    inline = {"listeners.https.ssl.keystore.type": "PEM", "listeners.https.ssl.keystore.key": certs["server.key"].read_text(),
              "listeners.https.ssl.keystore.certificate.chain": certs["server.pem"].read_text(),
              "listeners.https.ssl.truststore.certificates": certs["ca.pem"].read_text(),
              "listeners.https.ssl.client.auth": "requested"}
    for raw in (
        {"ssl.keystore.location": str(certs["server.p12"]), "ssl.keystore.password": "store-pw",
         "ssl.truststore.location": str(certs["ca.pem"]), "ssl.client.auth": "required"},
        {"listeners.https.ssl.keystore.location": str(pem), "listeners.https.ssl.enabled.protocols": "TLSv1.3"},
        inline,
    ):
        security, secret_values = rest_security(raw, https)
        assert security.tls is not None
        assert {v for k, v in raw.items() if k.endswith(("password", "keystore.key"))} <= secret_values
    assert rest_security(inline, https)[0].client_auth == "requested"
    for raw, key in (
        ({"ssl.keystore.location": str(certs["server.jks"]), "ssl.keystore.password": "store-pw"}, "ssl.keystore.type"),
        ({"ssl.keystore.location": str(certs["server.p12"]), "ssl.keystore.type": "JKS"}, "ssl.keystore.type"),
        ({"ssl.keystore.location": str(certs["server.p12"]), "ssl.keystore.password": "wrong"}, "ssl.keystore.location"),
        ({"ssl.keystore.location": str(pem), "ssl.client.auth": "required"}, "ssl.truststore.location"),
        ({"ssl.keystore.location": str(pem), "ssl.cipher.suites": "TLS_AES_128_GCM_SHA256"}, "ssl.cipher.suites"),
        ({"ssl.keystore.location": str(pem), "ssl.enabled.protocols": "TLSv1"}, "ssl.enabled.protocols"),
        ({"ssl.keystore.location": str(tmp_path / "none.p12")}, "ssl.keystore.location"),
        ({"listeners.https.ssl.keystore.location": str(pem), "listeners.https.ssl.bogus": "1"}, "listeners.https.ssl.bogus"),
    ):
        with pytest.raises(ConfigError) as info:
            rest_security(raw, https)
        assert info.value.key.removeprefix("listeners.https.") == key.removeprefix("listeners.https."), (raw, info.value)
        assert "store-pw" not in str(info.value) and "wrong" not in str(info.value)


def test_the_api_masks_secrets_keeps_them_on_a_masked_put_and_asks_for_basic_auth():
    from tests.unit.test_connect import _api

    config = {"connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
              "topics": "t", "iceberg.tables": "db.t", "iceberg.control.secret": "ctl-secret",
              "iceberg.catalog.uri": "postgresql://u:db-pw@db/x"}
    out, backend = _api([
        ("PUT", "/connectors/c/config", config),
        ("GET", "/connectors/c/config", None),
        ("GET", "/connectors/c", None),
        ("GET", "/connectors/c/tasks", None),
        ("GET", "/connectors?expand=info", None),
    ])
    assert [code for code, _ in out] == [201, 200, 200, 200, 200]
    text = json.dumps(out)
    assert "ctl-secret" not in text and "db-pw" not in text
    assert out[1][1]["iceberg.control.secret"] == MASK and backend.connectors["c"]["iceberg.control.secret"] == "ctl-secret"

    users = {"alice": "pw-1"}
    auth = "Basic " + base64.b64encode(b"alice:pw-1").decode()
    out, _ = _api([("GET", "/connectors", None), ("GET", "/", None), ("GET", "/connectors", {"headers": auth})],
                  users=users)
    assert [code for code, _ in out] == [401, 401, 200]
    assert out[0][1] == {"error_code": 401, "message": "User cannot access the resource."}


@pytest.mark.parametrize("key, value, defaults", [
    ("iceberg.catalog.warehouse", "../../tmp/victim", {}),
    ("iceberg.catalog.warehouse", "victim", {}),
    ("iceberg.catalog.warehouse", "./wh", {"iceberg.catalog.type": "sql"}),
    ("iceberg.catalog.uri", "sqlite:///../../tmp/victim.db", {}),
    ("iceberg.tables.auto-create-props.write.data.path", "../../tmp/victim", {}),
    ("iceberg.tables.auto-create-props.write.metadata.path", "data", {}),
    ("iceberg.tables.auto-create-props.location", "../elsewhere", {}),
])
def test_relative_paths_are_judged_as_the_paths_they_become(key, value, defaults):
    """A relative path is made absolute against the process's directory when it is used: it
    names a path of the host as an absolute one does, so it is refused unless allowed."""
    with pytest.raises(ConfigError) as info:
        check_connector({"topics": "t", key: value}, (), defaults)
    assert info.value.key == key and OVERRIDE_ALLOW in str(info.value)
    check_connector({"topics": "t", key: value}, (key,), defaults)


def test_a_rest_catalogs_warehouse_is_a_name_not_a_path():
    check_connector({"iceberg.catalog.warehouse": "analytics"}, (), {"iceberg.catalog.uri": "http://rest:8181"})
    check_connector({"iceberg.catalog.warehouse": "analytics", "iceberg.catalog.type": "rest"}, ())
