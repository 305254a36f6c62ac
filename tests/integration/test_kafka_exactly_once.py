"""The exactly-once core on a real Apache Kafka broker (tests/support/kafka_broker.py), with real
processes: a Faust + Spark worker replica, a SQLite catalog, every table read back by DuckDB and
pyiceberg, exact by key set.

- Transactions: a transactional producer (librdkafka) interleaves committed and aborted
  transactions in one partition; the source consumer's read_committed path
  (agents/kafka/record_batches.py over aiokafka's fetcher) takes every committed record and no aborted
  one, the transaction markers being offset gaps. (Tansu has no transactions for this producer.)
- A replica stopped with SIGTERM sends LeaveGroup: its partitions are claimed by the other
  replica at once, long before its session would have expired (chaos). On Tansu the group's
  leader stops without it (agents/faust_app.py; test_sink.py's restart test runs it there).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _catalog(catalog_props: dict[str, str], table: str) -> Any:
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import PIZZA_SCHEMA

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace_if_not_exists(table.split(".")[0])
    catalog.create_table(table, schema=PIZZA_SCHEMA)
    return catalog


def _config(tmp_path: Path, bootstrap: str, catalog_props: dict[str, str], topic: str, table: str, group: str,
            **extra: Any) -> Path:
    from tests.support.sinkrun import write_config

    return write_config(tmp_path / f"{group}.json", topics=topic, tables=table, bootstrap=bootstrap,
                        catalog_props=catalog_props, state_dir=tmp_path / f"{group}-state", group=group,
                        **{"iceberg.tables.auto-create-enabled": "false",
                           "iceberg.control.topic.replication-factor": 1, **extra})  # one Kafka broker


def _exact(catalog: Any, table: str, keys: set[str]) -> None:
    """DuckDB and pyiceberg agree: every key once, nothing else."""
    from tests.support.sinkrun import assert_exact

    assert_exact(catalog, table, keys)
    got = catalog.load_table(table).scan(selected_fields=("order_id",)).to_arrow()["order_id"].to_pylist()
    assert len(got) == len(keys) and set(got) == keys, f"{table}: pyiceberg read {len(got)} rows for {len(keys)} keys"


def _control_records(bootstrap: str, topic: str, group: str) -> list[tuple[int, int, Any]]:
    """(offset, timestamp in ms, event) of every event of ``group`` on its control topic."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from icesink.shared.control import decode_record
    from icesink.shared.kafka_admin import end_offsets

    async def go() -> list[tuple[int, int, Any]]:
        end = (await end_offsets(bootstrap, topic))[0]
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        await consumer.start()
        out: list[tuple[int, int, Any]] = []
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            while await consumer.position(tp) < end:
                for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    event = decode_record(record.key, record.value, record.offset, group)
                    if event is not None:
                        out.append((record.offset, record.timestamp, event))
        finally:
            await consumer.stop()
        return out

    return asyncio.run(go())


# -------------------------------------------------------------------------------------- Transactions


def _transactions(bootstrap: str, topic: str, values: list[bytes], per_tx: int) -> set[str]:
    """``values`` in transactions of ``per_tx`` records to partition 0 of ``topic`` by librdkafka's
    transactional producer, every third aborted, the last committed; the order_ids committed."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx", "linger.ms": 5})
    producer.init_transactions(30)
    committed: set[str] = set()
    chunks = [values[i:i + per_tx] for i in range(0, len(values), per_tx)]
    for n, chunk in enumerate(chunks):
        producer.begin_transaction()
        for value in chunk:
            producer.produce(topic, value, partition=0)
        # Written before the abort, which would drop unsent records (and, unflushed, may fail
        # with INVALID_TXN_STATE: confluentinc/librdkafka#4849).
        producer.flush(30)
        if n % 3 == 1 and n != len(chunks) - 1:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed |= {json.loads(v)["order_id"] for v in chunk}
    return committed


@pytest.mark.timeout(300)
def test_aborted_transactions_never_land_and_committed_ones_all_do(kafka: Any, catalog_props: dict[str, str],
                                                                  tmp_path: Path) -> None:
    """Committed and aborted transactions of a transactional producer interleaved in one
    partition, read by one replica: the table holds every record of a committed transaction
    once and none of an aborted one. The last transaction is committed and follows the last
    aborted one, so once its records landed an aborted record read would have landed too."""
    from icesink.app.pizzas import pizza_values
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import read_topic, wait_rows

    topic, table, group = "tx-src", "tx.pizzas", "tx-sink"
    catalog = _catalog(catalog_props, table)
    asyncio.run(ensure_topic(kafka.bootstrap, topic, 1))
    values = pizza_values(3000, seed=35)
    keys = _transactions(kafka.bootstrap, topic, values, per_tx=100)
    assert 0 < len(keys) < len(values)  # both kinds, interleaved
    # The aborted records are in the partition: a read_uncommitted reader gets every record.
    assert len(read_topic(kafka.bootstrap, topic, len(values), timeout_s=60)) == len(values)
    replicas = ReplicaSet(_config(tmp_path, kafka.bootstrap, catalog_props, topic, table, group), tmp_path / "logs")
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, (table,), len(keys), timeout_s=240)
        replicas.check_alive()
    finally:
        replicas.stop_all()
    _exact(catalog, table, keys)


# ---------------------------------------------------------------------------------------- LeaveGroup


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_a_replica_stopped_with_sigterm_hands_its_partitions_over_at_once(kafka: Any, catalog_props: dict[str, str],
                                                                         tmp_path: Path) -> None:
    """Two replicas with a 30 s session timeout; the coordinator's replica gets SIGTERM. It sends
    LeaveGroup as it stops (the broker logs the explicit leave of its member), so the other
    replica claims all four partitions within a few seconds, long before the stopped replica's
    session would have expired; every record lands once. Without LeaveGroup the claim came only
    after the session timeout."""
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.shared.protocol import Claim
    from tests.support.sinkrun import coordinator_status, wait_rows

    topic, table, group, session_ms = "kl-src", "kl.pizzas", "kl-sink", 30_000
    catalog = _catalog(catalog_props, table)
    asyncio.run(ensure_topic(kafka.bootstrap, topic, 4))
    cfg = _config(tmp_path, kafka.bootstrap, catalog_props, topic, table, group,
                  **{"consumer.session-timeout-ms": session_ms})
    first, second = pizza_values(2000, seed=81), pizza_values(2000, seed=82)
    keys = {json.loads(v)["order_id"] for v in first + second}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("w1")
        replicas.start("w2")
        asyncio.run(produce(kafka.bootstrap, topic, first, partitions=4))
        wait_rows(catalog, replicas, (table,), len(first), timeout_s=240)
        found = coordinator_status(replicas)
        assert found is not None
        stopped = found[0].name
        other = next(n for n in replicas.replicas if n != stopped)
        broker_log_offset = kafka.log_path.stat().st_size
        signalled_ms = time.time() * 1000
        assert replicas.stop(stopped) == 0
        # what the broker logged while only the stopped replica left (read before stop_all: the
        # other replica's own LeaveGroup at the end must not count)
        broker_log = kafka.log_path.read_bytes()[broker_log_offset:].decode(errors="replace")
        asyncio.run(produce(kafka.bootstrap, topic, second, partitions=4))
        wait_rows(catalog, replicas, (table,), len(keys), timeout_s=240)
        time.sleep(5)  # two more rounds: nothing may land twice
        replicas.check_alive()
    finally:
        replicas.stop_all()
    _exact(catalog, table, keys)

    claims = [(ts, ev) for _, ts, ev in _control_records(kafka.bootstrap, f"{group}-control", group)
              if isinstance(ev, Claim) and ev.worker == other and ts >= signalled_ms]
    everything = next((ts for ts, ev in claims if len({tp.partition for tp in ev.partitions}) == 4), None)
    assert everything is not None, f"{other} never claimed all four partitions after {stopped} stopped: {claims}"
    handover_s = (everything - signalled_ms) / 1000
    print(f"hand-over after SIGTERM: {handover_s:.1f} s (session timeout {session_ms / 1000:.0f} s)")
    left = [line for line in broker_log.splitlines() if group in line and "LeaveGroup" in line]
    assert left, f"the broker logged no LeaveGroup of group {group}:\n{broker_log[-3000:]}"
    # Only a LeaveGroup moves the partitions before the stopped member's session expires.
    assert handover_s < session_ms / 1000, f"claimed {handover_s:.1f} s after SIGTERM: after the session expired"
