"""The exactly-once core on a real Apache Kafka broker (tests/support/kafka_broker.py), with real
processes: a Faust + Spark worker replica, a SQLite catalog, every table read back by DuckDB and
pyiceberg, exact by key set.

- Transactions: a transactional producer (librdkafka) interleaves committed and aborted
  transactions in one partition; the source consumer's read_committed path
  (agents/record_batches.py over aiokafka's fetcher) takes every committed record and no aborted
  one, the transaction markers being offset gaps. (Tansu has no transactions for this producer.)
"""

from __future__ import annotations

import asyncio
import json
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
    from icesink.kafka_admin import ensure_topic
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
