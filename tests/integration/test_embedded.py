"""The embedded stack against real processes: Tansu broker, aiokafka clients, SQLite catalog,
pyiceberg writes and DuckDB reads."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from icesink.app.embedded import BrokerStartError, EmbeddedBroker
from icesink.shared.kafka_admin import TopicError, end_offsets, ensure_topic
from icesink.app.pizzas import pizza_values, produce

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Tansu holds a new group's first join for about half the session timeout: keep it short.
FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


def _topic() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _process_gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (absent, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _wait_until(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


# ---------------------------------------------------------------------------- broker lifecycle


def test_broker_starts_answers_and_stops(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "b")
    began = time.monotonic()
    broker.start()
    start_s = time.monotonic() - began
    pid, port = broker.pid, broker.port
    assert pid is not None and broker.running
    assert broker.bootstrap == f"127.0.0.1:{port}"
    assert _port_open(port)
    assert start_s < 10, f"broker took {start_s:.2f} s to start"
    assert "listening on" in broker.log_path.read_text()

    broker.stop()
    assert broker.pid is None and not broker.running
    assert _process_gone(pid)
    assert not _port_open(port)
    broker.stop()  # idempotent

    # A restart comes back on the same address; the context manager stops it.
    with broker as again:
        assert again.port == port and _port_open(port)
        second_pid = again.pid
        assert second_pid is not None and second_pid != pid
    assert second_pid is not None and _process_gone(second_pid)
    assert not _port_open(port)


def test_broker_start_fails_with_log_when_port_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = EmbeddedBroker(tmp_path / "b", port=port, start_timeout_s=10)
        with pytest.raises(BrokerStartError) as raised:
            broker.start()
    message = str(raised.value)
    assert f"127.0.0.1:{port}" in message and "in use" in message
    assert "AddrInUse" in message  # the broker's own log lines are included
    assert broker.pid is None and not broker.running


def test_broker_dies_with_its_parent(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from icesink.app.embedded import EmbeddedBroker\n"
        f"b = EmbeddedBroker({str(tmp_path / 'b')!r})\n"
        "b.start()\n"
        "print(b.pid, b.port, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, "the parent process did not start a broker"
        pid, port = (int(x) for x in line.split())
        assert not _process_gone(pid) and _port_open(port)
        parent.send_signal(signal.SIGKILL)  # no chance to clean up
        parent.wait(10)
        assert _wait_until(lambda: _process_gone(pid), 10), f"broker {pid} outlived its parent"
        assert _wait_until(lambda: not _port_open(port), 10)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# ---------------------------------------------------------------------------- topics


def test_ensure_topic_creates_partitions(broker: EmbeddedBroker) -> None:
    name = _topic()

    async def scenario() -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        await ensure_topic(broker.bootstrap, name, 6)
        assert await end_offsets(broker.bootstrap, name) == {p: 0 for p in range(6)}
        await ensure_topic(broker.bootstrap, name, 6)  # exists: no error, no change

        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            (meta,) = await admin.describe_topics([name])
        finally:
            await admin.close()
        assert meta["error_code"] == 0
        assert sorted(p["partition"] for p in meta["partitions"]) == list(range(6))
        assert all(p["leader"] >= 0 for p in meta["partitions"])

        with pytest.raises(TopicError, match="expected 3 partitions, found 6"):
            await ensure_topic(broker.bootstrap, name, 3)

    asyncio.run(scenario())


def test_end_offsets_of_missing_topic_fails_and_does_not_create_it(
    broker: EmbeddedBroker,
) -> None:
    name = _topic()

    async def scenario() -> list[str]:
        from aiokafka.admin import AIOKafkaAdminClient

        with pytest.raises(TopicError, match="no such topic"):
            await end_offsets(broker.bootstrap, name)
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            return await admin.list_topics()
        finally:
            await admin.close()

    assert name not in asyncio.run(scenario())


def test_end_offsets_counts_every_record_of_the_last_batch(broker: EmbeddedBroker) -> None:
    """Tansu's ListOffsets answers base offset of the last batch + 1; end_offsets must not."""
    topic = _topic()

    async def scenario() -> dict[int, int]:
        await ensure_topic(broker.bootstrap, topic, 2)
        # One record batch of 10 records per partition, then one more batch of 5 on partition 0.
        await produce(broker.bootstrap, topic, [b"x"] * 20, partitions=2)
        await produce(broker.bootstrap, topic, [b"y"] * 5, partitions=1)
        return await end_offsets(broker.bootstrap, topic)

    assert asyncio.run(scenario()) == {0: 15, 1: 10}


# ---------------------------------------------------------------------------- produce / consume


async def _drain(consumer: AIOKafkaConsumer, expected: int, timeout_s: float) -> list[Any]:
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < expected and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=500, max_records=5000)
        for part in batch.values():
            records.extend(part)
    # Anything beyond the expected count would be a duplicate: look once more.
    batch = await consumer.getmany(timeout_ms=300)
    for part in batch.values():
        records.extend(part)
    return records


def test_produce_10k_round_robin_and_consume_in_a_group(
    broker: EmbeddedBroker, record_property: Any
) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    topic, group, n, partitions = _topic(), f"g-{uuid.uuid4().hex[:8]}", 10_000, 6
    values = pizza_values(n, seed=42, spread_days=3)
    expected_counts = {p: len(range(p, n, partitions)) for p in range(partitions)}

    async def scenario() -> None:
        await ensure_topic(broker.bootstrap, topic, partitions)
        began = time.monotonic()
        await produce(broker.bootstrap, topic, values, partitions=partitions)
        produce_s = time.monotonic() - began
        record_property("produce_records_per_s", round(n / produce_s))
        assert await end_offsets(broker.bootstrap, topic) == expected_counts

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=broker.bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **FAST_GROUP,
        )
        began = time.monotonic()
        await consumer.start()
        try:
            records = await _drain(consumer, n, timeout_s=60)
            record_property("consume_incl_join_s", round(time.monotonic() - began, 2))
            assert len(records) == n
            per_partition = Counter(r.partition for r in records)
            assert dict(per_partition) == expected_counts
            # Exact placement: partition p holds values[p::6] in offset order.
            for p in range(partitions):
                mine = sorted((r for r in records if r.partition == p), key=lambda r: r.offset)
                assert [r.offset for r in mine] == list(range(expected_counts[p]))
                assert [r.value for r in mine] == values[p::partitions]
            assert len({json.loads(r.value)["order_id"] for r in records}) == n

            await consumer.commit()
        finally:
            await consumer.stop()

        # The commit is stored by the broker: a new member of the group sees it.
        checker = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False
        )
        await checker.start()
        try:
            committed = {
                p: await checker.committed(TopicPartition(topic, p)) for p in range(partitions)
            }
        finally:
            await checker.stop()
        assert committed == expected_counts

    asyncio.run(scenario())


def test_produce_keys_at_a_steady_rate(broker: EmbeddedBroker) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    topic, n, partitions, rate = _topic(), 300, 3, 1000.0
    values = pizza_values(n, seed=3)
    keys = [f"k{i}".encode() for i in range(n)]

    async def scenario() -> float:
        await ensure_topic(broker.bootstrap, topic, partitions)
        began = time.monotonic()
        await produce(
            broker.bootstrap, topic, values, partitions=partitions, keys=keys, rate_per_s=rate
        )
        elapsed = time.monotonic() - began
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            records = await _drain(consumer, n, timeout_s=30)
        finally:
            await consumer.stop()
        assert len(records) == n
        for r in records:
            i = int(r.key.decode()[1:])
            assert r.partition == i % partitions and r.value == values[i]
        return elapsed

    elapsed = asyncio.run(scenario())
    assert elapsed >= (n - 1) / rate * 0.95, f"{n} records at {rate}/s took only {elapsed:.3f} s"


# ---------------------------------------------------------------------------- DuckDB reader


def test_duckdb_reads_a_table_pyiceberg_committed(catalog_props: dict[str, str]) -> None:
    import pyarrow as pa
    import pyarrow.json as pj
    from pyiceberg.catalog import load_catalog

    from tests.support import duck

    assert catalog_props["uri"].startswith("sqlite:////")
    assert catalog_props["warehouse"].startswith("file:///")
    catalog = load_catalog("icesink", **catalog_props)
    catalog.create_namespace("pizza")

    values = pizza_values(3000, seed=8, spread_days=2)
    batch = pj.read_json(pa.BufferReader(b"\n".join(values)))
    table = catalog.create_table("pizza.orders", schema=batch.schema)
    table.append(batch.slice(0, 1000))
    table.append(batch.slice(1000))
    location = table.metadata_location
    assert location.startswith("file://")

    rows = duck.scan_rows(location)
    assert len(rows) == 3000
    by_id = {row["order_id"]: row for row in rows}
    expected = {e["order_id"]: e for e in (json.loads(v) for v in values)}
    assert by_id.keys() == expected.keys()
    some = next(iter(expected))
    assert {k: by_id[some][k] for k in ("store_id", "sauce", "veggies")} == {
        k: expected[some][k] for k in ("store_id", "sauce", "veggies")
    }
    assert duck.count_and_distinct(location, "order_id") == (3000, 3000)
    assert duck.count_and_distinct(location, "sauce") == (3000, 3)
    # A plain path reads the same as the file:// URI.
    assert duck.count_and_distinct(location.removeprefix("file://"), "store_id") == (3000, 120)

    snaps = duck.snapshots(location)
    assert [s["snapshot_id"] for s in snaps] == [s.snapshot_id for s in table.snapshots()]
    assert [s["operation"] for s in snaps] == ["append", "append"]

    # Another process's view: a catalog opened anew sees the same current snapshot.
    reopened = load_catalog("icesink", **catalog_props).load_table("pizza.orders")
    assert reopened.metadata_location == location
    assert os.path.exists(location.removeprefix("file://"))
