"""Secrets never leave the process, with a real worker (Faust + Spark) on a PostgreSQL catalog
whose uri carries a password: its log (start-up settings included), /status, /metrics and the
control topic hold none of the secret values; and its HTTP endpoint listens on metrics.host only."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest

pytestmark = pytest.mark.integration

TOPIC = "secret-pizzas"
TABLE = "sec.pizzas"
GROUP = "secret-sink"
SECRETS = {
    "iceberg.catalog.header.Authorization": "Bearer hdr-secret-a1",
    "iceberg.catalog.s3.secret-access-key": "s3-secret-b2",
    "iceberg.catalog.token": "cat-token-c3",
    "iceberg.catalog.client.api-key": "api-key-d4",
    "spark.hadoop.fs.s3a.secret.key": "s3a-secret-e5",
    "spark.hadoop.fs.s3a.session.token": "s3a-token-f6",
}
PG_PASSWORD = "pg-pass-g7"


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except ConnectionRefusedError:
        return False


@pytest.mark.timeout(300)
def test_worker_log_status_and_control_topic_hold_no_secret(broker, postgres, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import http_json, read_topic, wait_rows, write_config

    # trust auth: PostgreSQL ignores the password, but it is in the uri the worker must use
    uri = postgres.uri.replace("icesink@", f"icesink:{PG_PASSWORD}@")
    props = {"type": "sql", "uri": uri, "warehouse": f"file://{tmp_path / 'warehouse'}"}
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 2))
    cfg = write_config(
        tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap,
        catalog_props=props, state_dir=tmp_path / "state", group=GROUP,
        **SECRETS, **{"metrics.host": "127.0.0.1"},
    )
    catalog = load_catalog("it", **props)
    catalog.create_namespace("sec")
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        w = replicas.start()
        values = list(pizza_values(200, seed=7))
        asyncio.run(produce(broker.bootstrap, TOPIC, values, partitions=2))
        wait_rows(catalog, replicas, (TABLE,), len(values), timeout_s=240)
        port = w.metrics_port
        status = urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5).read().decode()
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert http_json(port)["phase"] == "running"
        listens_elsewhere = _connects("127.0.0.2", port)  # metrics.host=127.0.0.1: loopback only
        replicas.stop(w.name)
        log = w.log_path.read_text(errors="replace")
        control = b"".join(r.value or b"" for r in read_topic(broker.bootstrap, f"{GROUP}-control", 1, 30))
    finally:
        replicas.stop_all()
    assert "settings given" in log and "icesink:**********@127.0.0.1" in log  # the start-up line, masked
    for name, text in (("log", log), ("/status", status), ("/metrics", metrics),
                       ("control topic", control.decode(errors="replace"))):
        leaked = [v for v in [*SECRETS.values(), PG_PASSWORD] if v in text]
        assert not leaked, f"expected no secret in the worker's {name}, found {leaked}"
    assert not listens_elsewhere, "expected /metrics on 127.0.0.1 only, found it answering on 127.0.0.2"
