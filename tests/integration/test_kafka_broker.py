"""The real Apache Kafka broker of the tests (tests/support/kafka_broker.py): jars from Maven
Central, a formatted KRaft log directory, one JVM serving topics, groups and transactions; and
where the producers' view of it differs from the embedded Tansu broker's."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def _transactions(bootstrap: str, topic: str) -> list[bytes]:
    """One committed and one aborted transaction of librdkafka's producer, then everything a
    read_committed consumer reads from the topic."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, b"committed-%d" % i, partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, b"aborted-%d" % i, partition=0)
    # Written before the abort, so read_committed has aborted records to skip; unflushed, the
    # abort's EndTxn can reach the coordinator before AddPartitionsToTxn and fail with
    # INVALID_TXN_STATE (confluentinc/librdkafka#4849; seen once under CI load).
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"last", partition=0)
    producer.commit_transaction(30)

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # no group to join
    seen: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while b"last" not in seen and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen.append(msg.value())
    finally:
        consumer.close()
    return seen


@pytest.mark.kafka
def test_kafka_serves_topics_and_groups(kafka: Any) -> None:
    """Topics with replication factor 1 on the one broker, records, and a consumer group's
    committed offsets."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from icesink.shared.kafka_admin import end_offsets, ensure_topic
    from icesink.app.pizzas import produce

    async def topics_and_groups() -> tuple[dict[int, int], int | None]:
        await ensure_topic(kafka.bootstrap, "kb-plain", 3)
        await produce(kafka.bootstrap, "kb-plain", [b"x"] * 300, partitions=3)
        ends = await end_offsets(kafka.bootstrap, "kb-plain")
        consumer = AIOKafkaConsumer("kb-plain", bootstrap_servers=kafka.bootstrap, group_id="kb-group",
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            got = 0
            while got < 300:
                got += sum(len(r) for r in (await consumer.getmany(timeout_ms=1000)).values())
            await consumer.commit()
            committed = await consumer.committed(TopicPartition("kb-plain", 0))
        finally:
            await consumer.stop()
        return ends, committed

    ends, committed = asyncio.run(topics_and_groups())
    assert ends == {0: 100, 1: 100, 2: 100}
    assert committed == 100


def test_librdkafka_transactions_on_each_broker(each_broker: Any) -> None:
    """librdkafka's (confluent-kafka's) transactional producer runs on both brokers. On Kafka a
    read_committed reader reads the committed transactions and not the aborted one; Tansu 0.6
    gives it the aborted records too, which is why the sink's tests of aborted transactions run
    on Kafka (test_kafka_exactly_once.py). If the Tansu case starts failing, Tansu has learnt to
    keep aborted records from read_committed readers."""
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.kafka_broker import KafkaBroker

    asyncio.run(ensure_topic(each_broker.bootstrap, "kb-tx", 1))
    seen = _transactions(each_broker.bootstrap, "kb-tx")
    committed, aborted = [b"committed-%d" % i for i in range(10)], [b"aborted-%d" % i for i in range(5)]
    if isinstance(each_broker, KafkaBroker):
        assert seen == committed + [b"last"], seen
    else:
        assert seen == committed + aborted + [b"last"], seen


def test_aiokafka_idempotent_producer_on_each_broker(each_broker: Any) -> None:
    """aiokafka's InitProducerId (idempotent or transactional producers) works on Kafka, while
    Tansu 0.6 answers it with error -1 (UnknownError): the difference that makes the sink's
    producers run with ``enable_idempotence=False`` (design/exactly-once.md). If the Tansu case
    starts failing, Tansu has learnt aiokafka's InitProducerId."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import UnknownError

    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.kafka_broker import KafkaBroker

    async def send() -> int:
        await ensure_topic(each_broker.bootstrap, "kb-idem", 1)
        producer = AIOKafkaProducer(bootstrap_servers=each_broker.bootstrap, enable_idempotence=True)
        try:
            await asyncio.wait_for(producer.start(), 30)
            return (await producer.send_and_wait("kb-idem", b"once")).offset  # type: ignore[no-any-return]
        finally:
            await producer.stop()

    if isinstance(each_broker, KafkaBroker):
        assert asyncio.run(send()) >= 0
    else:
        with pytest.raises(UnknownError):
            asyncio.run(send())


@pytest.mark.kafka
def test_a_restarted_kafka_keeps_its_address_and_its_data(tmp_path: Any) -> None:
    """A broker of its own (not the session's): stopped with SIGTERM and started again on the
    same port from the same log directory (not formatted again), its records and committed group
    offsets are still there."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from icesink.shared.kafka_admin import end_offsets, ensure_topic
    from icesink.app.pizzas import produce
    from tests.support.kafka_broker import KafkaBroker

    broker = KafkaBroker(tmp_path / "kafka")

    async def commit(offset: int) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="kr-group", enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition("kr", 0)])
            await consumer.commit({TopicPartition("kr", 0): offset})
        finally:
            await consumer.stop()

    async def committed() -> int | None:
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="kr-group", enable_auto_commit=False)
        await consumer.start()
        try:
            return await consumer.committed(TopicPartition("kr", 0))  # type: ignore[no-any-return]
        finally:
            await consumer.stop()

    with broker:
        asyncio.run(ensure_topic(broker.bootstrap, "kr", 1))
        asyncio.run(produce(broker.bootstrap, "kr", [b"r"] * 50, partitions=1))
        asyncio.run(commit(42))
        address, meta = broker.bootstrap, (broker.data_dir / "meta.properties").read_text()
    assert not broker.running
    with broker:
        assert broker.bootstrap == address
        assert (broker.data_dir / "meta.properties").read_text() == meta  # not formatted again
        assert asyncio.run(end_offsets(broker.bootstrap, "kr")) == {0: 50}
        assert asyncio.run(committed()) == 42


@pytest.mark.kafka
def test_a_replication_factor_above_the_brokers_is_refused_naming_the_setting(kafka: Any, tmp_path: Any) -> None:
    """Kafka refuses a topic with more replicas than brokers (Tansu takes any factor): the
    worker's error names the setting to lower, for the control topic and the dead-letter topic."""
    from prometheus_client import CollectorRegistry

    from agents.deadletter import DeadLetters
    from icesink.shared.config import build
    from icesink.shared.control import ensure_control_topic
    from icesink.shared.kafka_admin import TopicError
    from icesink.shared.metrics import Metrics

    with pytest.raises(TopicError, match=r"iceberg\.control\.topic\.replication-factor"):
        asyncio.run(ensure_control_topic(kafka.bootstrap, "kb-ctl-rf3", {}, replication_factor=3))

    settings = build({"topics": "kb-plain", "iceberg.tables": "db.a", "state.dir": str(tmp_path),
                               "errors.tolerance": "all", "errors.deadletterqueue.topic.name": "kb-dlq-rf3"})
    letters = DeadLetters(settings, Metrics(CollectorRegistry()), "w1")
    with pytest.raises(TopicError, match=r"errors\.deadletterqueue\.topic\.replication\.factor"):
        asyncio.run(letters.start(kafka.bootstrap))


def test_partition_counts_name_every_topic_without_a_consumer_asking_for_it(each_broker: Any) -> None:
    """The coordinator checks a claim's partitions against these counts. It used a fresh
    consumer's own metadata, which held every topic on Tansu and none on Kafka: every claim on
    Kafka was answered without its partitions, and no record was ever read (CI, test_codecs[kafka])."""
    from icesink.shared.kafka_admin import ensure_topic, partition_counts

    async def counts() -> dict[str, int]:
        await ensure_topic(each_broker.bootstrap, "pc-four", 4)
        return await partition_counts(each_broker.bootstrap)

    found = asyncio.run(counts())
    assert found["pc-four"] == 4
    assert "pc-absent" not in found
