"""Broker restart mid-stream: the broker is stopped for 10 s and started again on the same port
with its data while 2 worker processes ingest: Tansu on durable storage (S3 on a local
SeaweedFS), and a real Kafka broker of the test's own (its log directory; the session's broker
is shared, so never restarted). The workers must reconnect by themselves; the table must hold
every record exactly once (DuckDB)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

pytestmark = pytest.mark.integration

TOPIC = "br-pizzas"
TABLE = "br.pizzas"


@pytest.fixture(params=["tansu", pytest.param("kafka", marks=pytest.mark.kafka)])
def durable_broker(request, tmp_path):
    from icesink.app.embedded import EmbeddedBroker
    from tests.support.kafka_broker import KafkaBroker
    from tests.support.seaweed import SeaweedS3

    if request.param == "kafka":
        with KafkaBroker(tmp_path / "kafka") as kafka:
            yield kafka
        return
    s3 = SeaweedS3(tmp_path / "seaweed", "tansu")
    s3.start()
    broker = EmbeddedBroker(tmp_path / "broker", storage_engine="s3://tansu/", env=s3.tansu_env())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
        s3.stop()


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_broker_restart_on_durable_storage_loses_and_duplicates_nothing(durable_broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, total_rows, wait_rows, write_config

    broker = durable_broker
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 6))
    cfg = write_config(tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="br-sink",
                       **{"iceberg.control.topic.replication-factor": 1})  # one Kafka broker
    values = pizza_values(30_000, seed=9)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("b1")
        replicas.start("b2")
        asyncio.run(produce(broker.bootstrap, TOPIC, values[:10_000], partitions=6))
        wait_rows(catalog, replicas, (TABLE,), 10_000)
        sender = threading.Thread(target=lambda: asyncio.run(
            produce(broker.bootstrap, TOPIC, values[10_000:20_000], partitions=6, rate_per_s=1500)))
        sender.start()
        sender.join()
        broker.stop()
        time.sleep(10)
        broker.start()
        replicas.check_alive()
        asyncio.run(produce(broker.bootstrap, TOPIC, values[20_000:], partitions=6))
        wait_rows(catalog, replicas, (TABLE,), 30_000, timeout_s=420)
        time.sleep(6)
        assert total_rows(catalog, TABLE) == 30_000
    finally:
        replicas.stop_all()
    assert_exact(catalog, TABLE, keys)
