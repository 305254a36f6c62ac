"""Compressed records from a real librdkafka producer (confluent-kafka), with real processes
(Tansu, then a real Kafka broker; a Faust + Spark worker, SQLite catalog, DuckDB): one topic fed
with each codec Kafka has in turn (none, gzip, snappy, lz4, zstd); every record lands exactly once, read with
isolation.level=read_committed, through a consumer whose group session is the broker's (6 s on Tansu,
10 s on Kafka). The same with Kafka's own Java producer (kafka-console-producer)
on the real broker, one topic per codec. And a replica whose consumer can no longer decode a batch
stops with a clear log line instead of running on without consuming."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

pytestmark = pytest.mark.integration

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def produce_compressed(bootstrap: str, topic: str, values: list[bytes], codec: str, partitions: int) -> None:
    """Send with librdkafka, batched (linger) so that each batch is compressed with ``codec``.
    No idempotence: Tansu has no InitProducerId."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer({
        "bootstrap.servers": bootstrap, "compression.type": codec, "enable.idempotence": False,
        "acks": "all", "linger.ms": 20, "batch.num.messages": 200,
    })
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    for i, v in enumerate(values):
        producer.produce(topic, v, partition=i % partitions, on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(60)
    if left or failed:
        raise KafkaException(f"{codec}: expected every record acknowledged, found {left} unsent and "
                             f"{len(failed)} failed (e.g. {failed[:3]})")


@pytest.mark.timeout(300)
def test_every_codec_of_a_librdkafka_producer_lands_exactly_once(each_broker, catalog_props, tmp_path):
    """On Tansu and on a real Kafka broker (``each_broker``)."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.embedded import EmbeddedBroker
    from icesink.app.pizzas import PIZZA_SCHEMA, pizza_event
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, http_json, wait_rows, write_config

    topic, table = "cx-pizzas", "cx.pizzas"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("cx")
    catalog.create_table(table, schema=PIZZA_SCHEMA)
    asyncio.run(ensure_topic(each_broker.bootstrap, topic, 2))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=each_broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="cx-sink",
                       **{"iceberg.tables.auto-create-enabled": "false",
                          "iceberg.control.topic.replication-factor": 1})  # one Kafka broker
    config = json.loads(cfg.read_text())
    del config["consumer.session-timeout-ms"]  # not set: the replica takes its broker's (checked below)
    cfg.write_text(json.dumps(config))
    rng = random.Random(11)
    keys: set[str] = set()
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        worker = replicas.start("w1")
        for codec in CODECS:
            events = [pizza_event(rng) for _ in range(400)]
            keys |= {e["order_id"] for e in events}
            produce_compressed(each_broker.bootstrap, topic, [json.dumps(e).encode() for e in events], codec, 2)
        wait_rows(catalog, replicas, (table,), len(keys), timeout_s=120)
        assert_exact(catalog, table, keys)
        replicas.check_alive()
        # Read from the running consumer's fetcher: both brokers serve read_committed fetches.
        status = http_json(worker.metrics_port)
        assert status["isolation_level"] == "read_committed"
        # The session it joined with: none set, so 6 s on Tansu, which holds each JoinGroup for
        # half of it (agents/kafka/group.py HELD_JOIN_SESSION_TIMEOUT_MS), and 10 s on Kafka.
        assert status["session_timeout_ms"] == (6000 if isinstance(each_broker, EmbeddedBroker) else 10000)
        # ... through agents/kafka/record_batches.py, which decompressed every codec's batches.
        assert "fetched records are taken a record batch at a time" in worker.log_path.read_text(errors="replace")
    finally:
        replicas.stop_all()


@pytest.mark.timeout(300)
def test_a_batch_the_consumer_cannot_decode_stops_the_replica_loudly(broker, catalog_props, tmp_path):
    """lz4 made unavailable in the first replica only (``fault.crash-at=worker.lz4-unavailable``,
    fired once per state dir): it exits with code 1 and a log line naming where the consumer
    failed. Its replacement, with lz4, lands every record exactly once."""
    import time

    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import PIZZA_SCHEMA, pizza_event
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, wait_rows, write_config

    topic, table = "cxd-pizzas", "cxd.pizzas"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("cxd")
    catalog.create_table(table, schema=PIZZA_SCHEMA)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    rng = random.Random(5)
    plain, squeezed = [pizza_event(rng) for _ in range(100)], [pizza_event(rng) for _ in range(100)]
    produce_compressed(broker.bootstrap, topic, [json.dumps(e).encode() for e in plain], "none", 1)
    produce_compressed(broker.bootstrap, topic, [json.dumps(e).encode() for e in squeezed], "lz4", 1)
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=state, group="cxd-sink",
                       **{"iceberg.tables.auto-create-enabled": "false", "fault.crash-at": "worker.lz4-unavailable"})
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        first = replicas.start("w1")
        deadline = time.monotonic() + 90
        while first.alive:
            assert time.monotonic() < deadline, "the replica did not stop when its consumer failed:\n" + (
                first.log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.5)
        log = first.log_path.read_text(errors="replace")
        assert first.proc.returncode == 1, log[-3000:]
        line = next((x for x in log.splitlines() if "stopping:" in x and "source consumer failed" in x), None)
        assert line is not None, log[-3000:]
        assert "UnsupportedCodecError" in line and "lz4" in line, line
        assert f"topic={topic}, partition=0, offset={len(plain)}" in line, line
        replicas.replicas.pop("w1").log_handle.close()

        replicas.start("w2")
        keys = {e["order_id"] for e in plain + squeezed}
        wait_rows(catalog, replicas, (table,), len(keys), timeout_s=120)
        assert_exact(catalog, table, keys)
    finally:
        replicas.stop_all()


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_every_codec_of_the_java_producer_lands_exactly_once(kafka, catalog_props, tmp_path):
    """Kafka's own Java producer (``kafka-console-producer``: org.apache.kafka.tools.ConsoleProducer
    on the broker's class path) sends JSON lines with known ids into one topic per codec, each
    with ``compression.type`` gzip, snappy, lz4 or zstd, and the broker keeps its batches so
    (read from its log segments). One worker sinks the four topics into one table: each id exactly
    once, read with DuckDB and with a pyiceberg scan."""
    import subprocess
    from collections import Counter

    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import end_offsets, ensure_topic
    from icesink.app.pizzas import PIZZA_SCHEMA, pizza_event
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, wait_rows, write_config

    codecs, table, per_codec = CODECS[1:], "jp.pizzas", 300
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("jp")
    catalog.create_table(table, schema=PIZZA_SCHEMA)
    rng = random.Random(17)
    keys: set[str] = set()
    producers = []
    for codec in codecs:
        topic = f"jp-{codec}"
        asyncio.run(ensure_topic(kafka.bootstrap, topic, 1))
        events = [pizza_event(rng) for _ in range(per_codec)]
        keys |= {e["order_id"] for e in events}
        lines = tmp_path / f"{codec}.jsonl"
        lines.write_text("".join(json.dumps(e) + "\n" for e in events))
        cmd = kafka.tool_command("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", kafka.bootstrap,
                                 "--topic", topic, "--compression-codec", codec,
                                 "--producer-property", "acks=all", "--producer-property", "linger.ms=50")
        with lines.open("rb") as stdin, (tmp_path / f"{codec}.log").open("wb") as out:
            producers.append((codec, subprocess.Popen(cmd, stdin=stdin, stdout=out, stderr=subprocess.STDOUT)))
    for codec, proc in producers:  # the four JVMs start side by side
        code = proc.wait(120)
        assert code == 0, f"{codec}: ConsoleProducer exit code {code}:\n{(tmp_path / f'{codec}.log').read_text()[-3000:]}"
    for codec in codecs:
        # every line sent (a failed send is only logged; the exit code stays 0) ...
        assert asyncio.run(end_offsets(kafka.bootstrap, f"jp-{codec}")) == {0: per_codec}, (
            (tmp_path / f"{codec}.log").read_text()[-3000:])
        # ... in batches of several records each, compressed with the codec asked for
        batches = kafka.batch_codecs(f"jp-{codec}")
        assert set(batches) == {codec} and 1 <= len(batches) < per_codec, (codec, batches)

    cfg = write_config(tmp_path / "sink.json", topics=",".join(f"jp-{c}" for c in codecs), tables=table,
                       bootstrap=kafka.bootstrap, catalog_props=catalog_props, state_dir=tmp_path / "state",
                       group="jp-sink", **{"iceberg.tables.auto-create-enabled": "false",
                                           "iceberg.control.topic.replication-factor": 1})
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, (table,), len(keys), timeout_s=120)
        replicas.check_alive()
    finally:
        replicas.stop_all()
    assert_exact(catalog, table, keys)  # DuckDB
    scanned = Counter(catalog.load_table(table).scan(selected_fields=("order_id",)).to_arrow()["order_id"].to_pylist())
    assert scanned == Counter(dict.fromkeys(keys, 1))  # pyiceberg
