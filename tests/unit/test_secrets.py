"""Secrets never leave the process: masked in the start-up settings, removed from log records
and /status bodies, hidden in config errors; and /metrics, /status bind to metrics.host."""

import json
import logging
import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from icesink.shared.config import load_settings
from icesink.shared.errors import ConfigError
from icesink.shared.secrets import MASK, Redactor, RedactingFilter, install_log_redaction, mask_url
from icesink.app.status import serve

SECRETS = {
    "iceberg.catalog.uri": ("postgresql+psycopg2://icesink:pg-Pass%40word@db:5432/cat", "pg-Pass%40word"),
    "iceberg.catalog.header.X-Iceberg-Access-Delegation": ("delegation-value-1", "delegation-value-1"),
    "iceberg.catalog.header.Authorization": ("Bearer hdr-token-2", "Bearer hdr-token-2"),
    "iceberg.catalog.s3.secret-access-key": ("s3-secret-3", "s3-secret-3"),
    "iceberg.catalog.s3.access-key-id": ("AKIA-key-4", "AKIA-key-4"),
    "iceberg.catalog.token": ("cat-token-5", "cat-token-5"),
    "iceberg.catalog.credential": ("client:cred-6", "client:cred-6"),
    "iceberg.catalog.client.secret": ("client-secret-7", "client-secret-7"),
    "spark.hadoop.fs.s3a.secret.key": ("s3a-secret-8", "s3a-secret-8"),
    "spark.hadoop.fs.s3a.access.key": ("s3a-access-9", "s3a-access-9"),
    "spark.ssl.keyPassword": ("ssl-keypw-10", "ssl-keypw-10"),
    "spark.hadoop.fs.azure.sas.token": ("sas-token-11", "sas-token-11"),
    "spark.remote": ("sc://spark:15002/;token=connect-token-12", "connect-token-12"),
    "sasl.password": ("sasl-pw-13", "sasl-pw-13"),
}


def settings_with_secrets(tmp_path):
    cfg = {
        "topics": "a", "iceberg.tables": "db.t", "iceberg.catalog.type": "sql",
        "iceberg.catalog.warehouse": "file:///w", "spark.driver.memory": "1g",
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "user-u",
        **{k: v for k, (v, _) in SECRETS.items()},
    }
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cfg))
    return load_settings(p, {})


def secret_values():
    return [s for _, s in SECRETS.values()] + ["pg-Pass@word"]  # also the decoded URL password


def test_masked_settings_show_no_secret_of_any_kind(tmp_path):
    s = settings_with_secrets(tmp_path)
    shown = json.dumps(s.masked(), default=str)
    leaked = [v for v in secret_values() if v in shown]
    assert not leaked, f"expected no secret in the masked settings, found {leaked} in {shown}"
    masked = s.masked()
    assert masked["iceberg.catalog.*"]["uri"] == f"postgresql+psycopg2://icesink:{MASK}@db:5432/cat"
    assert masked["spark.remote"] == f"sc://spark:15002/;token={MASK}"
    # what is not secret is still shown, for debugging
    assert masked["iceberg.catalog.*"]["warehouse"] == "file:///w"
    assert masked["spark.*"]["spark.driver.memory"] == "1g" and masked["sasl.username"] == "user-u"
    # the real values still reach the clients
    assert s.catalog_props["uri"].endswith("pg-Pass%40word@db:5432/cat")
    assert s.spark_conf["spark.hadoop.fs.s3a.secret.key"] == "s3a-secret-8"


def test_secret_values_cover_every_kind(tmp_path):
    values = settings_with_secrets(tmp_path).secret_values()
    assert set(secret_values()) <= values
    assert "1g" not in values and "file:///w" not in values and "user-u" not in values


def test_log_records_are_redacted_also_in_errors_and_tracebacks(tmp_path):
    s = settings_with_secrets(tmp_path)
    logger = logging.getLogger("test-secrets")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(self.format(record))

    handler = Keep()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    install_log_redaction(s.redactor(), logger)
    install_log_redaction(s.redactor(), logger)  # idempotent: one filter per handler
    assert sum(isinstance(f, RedactingFilter) for f in handler.filters) == 1
    try:
        logger.warning("could not connect to %s", s.catalog_props["uri"])
        logger.info("conf %s", dict(s.spark_conf))
        logger.info("bad arguments %d", s.catalog_props["token"])  # a %d for a str: must not raise
        try:
            raise RuntimeError(f"auth failed with header {s.catalog_props['header.Authorization']}")
        except RuntimeError:
            logger.exception("catalog error")
    finally:
        logger.removeHandler(handler)
    text = "\n".join(records)
    assert "could not connect" in text and "auth failed with header" in text and "RuntimeError" in text
    assert "bad arguments" in text
    leaked = [v for v in secret_values() if v in text]
    assert not leaked, f"expected no secret in the log, found {leaked} in {text}"


def test_redactor_masks_url_passwords_it_was_not_told_about():
    assert mask_url("x postgresql://u:p%40ss@h:1/d y") == f"x postgresql://u:{MASK}@h:1/d y"
    assert mask_url("kafka://127.0.0.1:9092 and sc://h:1/;user_id=a;token=t") == (
        f"kafka://127.0.0.1:9092 and sc://h:1/;user_id=a;token={MASK}")
    assert Redactor(["ab", "longer-secret"])("ab longer-secret") == f"ab {MASK}"  # too short: kept
    assert Redactor(["256", "true"])("256 bits: true") == "256 bits: true"  # numbers, booleans: kept
    assert Redactor([])("at postgresql://u:pw@h/d") == f"at postgresql://u:{MASK}@h/d"
    assert not Redactor([])


@pytest.mark.parametrize("key, value", [
    ("sasl.password", 123456789),
    ("sasl.password", ["list-secret-value"]),
    ("ssl.password", 98765.4321),
])
def test_a_secret_of_a_wrong_type_is_not_echoed_in_the_config_error(tmp_path, key, value):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"topics": "a", "iceberg.tables": "db.t", key: value}))
    with pytest.raises(ConfigError) as err:
        load_settings(p, {})
    message = str(err.value)
    assert key in message and type(value).__name__ in message
    for shown in ("123456789", "list-secret-value", "98765"):
        assert shown not in message, message


def test_a_bad_url_setting_is_quoted_with_its_password_masked(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"topics": "a", "iceberg.tables": "db.t", "spark.remote": "http://u:remote-pw@x"}))
    with pytest.raises(ConfigError) as err:
        load_settings(p, {})
    assert "spark.remote" in str(err.value) and "remote-pw" not in str(err.value)


def test_metrics_host_setting(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"topics": "a", "iceberg.tables": "db.t"}))
    assert load_settings(p, {}).metrics_host == "0.0.0.0"
    assert load_settings(p, {"ICESINK_METRICS_HOST": "127.0.0.1"}).metrics_host == "127.0.0.1"


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except ConnectionRefusedError:
        return False


def test_http_endpoint_binds_metrics_host_only_and_redacts_status():
    status = {"error": "conflict: postgresql://u:status-pw@db/x and token status-token-1"}
    server = serve("127.0.0.1", 0, CollectorRegistry(), lambda: status, Redactor(["status-token-1"]))
    try:
        port = server.server_address[1]
        assert server.server_address[0] == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5).read().decode()
        assert "conflict" in body and "status-pw" not in body and "status-token-1" not in body
        # 127.0.0.2 is the loopback interface too: a server bound to every interface answers there
        assert not _connects("127.0.0.2", port)
    finally:
        server.shutdown()
        server.server_close()


def test_http_endpoint_default_binds_every_interface():
    server = serve("0.0.0.0", 0, CollectorRegistry(), dict)
    try:
        assert _connects("127.0.0.2", server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_keep_only_the_samples_a_scraper_names():
    """``/metrics?name[]=...`` answers with those samples alone, as prometheus_client's own
    handler does: the benchmarks poll one counter of a worker whose full page, at 200 tables,
    is 5,000 lines (bench/benchlib.py ``metric_total``)."""
    from prometheus_client import Counter

    registry = CollectorRegistry()
    Counter("icesink_records_consumed", "records", registry=registry).inc(7)
    Counter("icesink_files_written", "files", ["table"], registry=registry).labels(table="db.t0").inc()
    server = serve("127.0.0.1", 0, registry, dict)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        whole = urllib.request.urlopen(url, timeout=5).read().decode()
        assert "icesink_files_written_total" in whole and "icesink_records_consumed_total 7.0" in whole
        one = urllib.request.urlopen(f"{url}?name%5B%5D=icesink_records_consumed_total", timeout=5).read().decode()
        assert "icesink_records_consumed_total 7.0" in one and "icesink_files_written" not in one
    finally:
        server.shutdown()
        server.server_close()
