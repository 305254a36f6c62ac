"""bench/rate_producer.py (ingest_bench --rate) delivers every record, in order per partition,
and reports what it delivered (the report used to print the rate asked for)."""

from __future__ import annotations

import asyncio

import pytest

from bench.rate_producer import due, produce_at_rate
from icesink.app.embedded import EmbeddedBroker
from icesink.shared.kafka_admin import ensure_topic

pytestmark = pytest.mark.integration


def test_records_due_follow_the_rate_and_stop_at_the_total() -> None:
    assert due(1000, 0.0, 50) == 1
    assert due(1000, 0.0105, 50) == 11
    assert due(1000, 2.0, 50) == 50
    assert due(1000, -1.0, 50) == 0


def test_every_record_is_delivered_and_reported(broker: EmbeddedBroker) -> None:
    from aiokafka import AIOKafkaConsumer

    topic, n = "rate-producer", 600
    values = [f"v{i}".encode() for i in range(n)]
    asyncio.run(ensure_topic(broker.bootstrap, topic, 3))
    delivered = produce_at_rate(broker.bootstrap, topic, values, partitions=3, rate=2000, linger_ms=5)
    assert (delivered.records, delivered.failed) == (n, ())
    assert delivered.seconds > 0 and delivered.asked_rate == 2000
    assert "600 records acknowledged" in delivered.line()

    async def read() -> dict[int, list[bytes]]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        await consumer.start()
        got: dict[int, list[bytes]] = {}
        try:
            while sum(map(len, got.values())) < n:
                for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                    got.setdefault(tp.partition, []).extend(r.value for r in records)
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(asyncio.wait_for(read(), 60))
    assert {p: got[p] for p in range(3)} == {p: values[p::3] for p in range(3)}
