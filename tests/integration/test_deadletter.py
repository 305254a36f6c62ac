"""Dead letters with real processes (Tansu, Faust + Spark workers, SQLite catalog, DuckDB):

- errors.tolerance=all (the default with a dead-letter topic), 2 replicas: pizzas mixed with
  malformed JSON, uncoercible values (store_id "abc" for a long column), values over
  errors.max-record-bytes and tombstones. The table holds every good record exactly once; the
  dead-letter topic, created by the workers, holds exactly the bad offsets (at least once each)
  with Kafka Connect's context headers, ours, and the original key, value and headers;
  tombstones are counted and never dead-lettered.
- errors.tolerance=none: the replica stops with exit code 2 and a log line naming topic,
  partition, offset and field; nothing at or after the bad offset of that partition lands.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest

pytestmark = pytest.mark.integration

MAX_BYTES = 4096


def _setup(broker: Any, catalog_props: dict[str, str], namespace: str, topic: str, partitions: int) -> Any:
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import PIZZA_SCHEMA

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace(namespace)
    catalog.create_table(f"{namespace}.pizzas", schema=PIZZA_SCHEMA)
    asyncio.run(ensure_topic(broker.bootstrap, topic, partitions))
    return catalog


def _send(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes | None, list[Any]]]) -> list[int]:
    """(partition, key, value, headers) in order; returns each record's offset."""
    from aiokafka import AIOKafkaProducer

    async def go() -> list[int]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all",
                                    linger_ms=5, max_request_size=1024 * 1024)
        await producer.start()
        try:
            futures = [await producer.send(topic, v, key=k, headers=h, partition=p) for p, k, v, h in records]
            return [(await f).offset for f in futures]
        finally:
            await producer.stop()

    return asyncio.run(go())


def _pizza(rng: Any, **fields: Any) -> tuple[str, bytes]:
    from icesink.app.pizzas import pizza_event

    event = {**pizza_event(rng), **fields}
    return event["order_id"], json.dumps(event).encode()


@pytest.mark.timeout(300)
def test_bad_records_dead_lettered_with_headers_while_the_rest_land_exactly_once(broker, catalog_props, tmp_path):
    import random

    from agents import deadletter as dl
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, metric, read_topic, wait_rows, write_config

    topic, dlq, table = "dl-pizzas", "dl-pizzas-dlq", "dl.pizzas"
    catalog = _setup(broker, catalog_props, "dl", topic, 3)
    rng = random.Random(17)
    records: list[tuple[int, bytes | None, bytes | None, list[Any]]] = []
    kinds: list[str] = []  # per record: good or the bad kind
    good: set[str] = set()
    bad_kinds = ("malformed", "uncoercible", "too-large", "tombstone")
    for i in range(2400):
        part, key = i % 3, f"k-{i}".encode()
        if i % 37 == 5:
            kind = bad_kinds[(i // 37) % 4]
            headers = [("origin", f"test-{i}".encode())]
            value: bytes | None
            if kind == "malformed":
                value = b'{"order_id": "broken-' + str(i).encode() + b'", "store_id": '
            elif kind == "uncoercible":
                value = _pizza(rng, store_id="abc")[1]
            elif kind == "too-large":
                value = _pizza(rng, note="x" * MAX_BYTES)[1]
            else:
                value = None
            records.append((part, key, value, headers))
            kinds.append(kind)
        else:
            order_id, value = _pizza(rng)
            good.add(order_id)
            records.append((part, key, value, []))
            kinds.append("good")
    tombstones = kinds.count("tombstone")
    assert all(kinds.count(k) >= 10 for k in bad_kinds)

    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="dl-sink",
                       **{"errors.deadletterqueue.topic.name": dlq, "errors.max-record-bytes": MAX_BYTES,
                          "errors.deadletterqueue.topic.replication.factor": 1,
                          "iceberg.tables.auto-create-enabled": "false"})
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("w1")
        replicas.start("w2")
        offsets = _send(broker.bootstrap, topic, records)
        wait_rows(catalog, replicas, (table,), len(good), timeout_s=180)
        assert_exact(catalog, table, good)

        expected = {(records[i][0], offsets[i]): i for i, k in enumerate(kinds) if k not in ("good", "tombstone")}
        letters = read_topic(broker.bootstrap, dlq, len(expected), timeout_s=60)
        seen: dict[tuple[int, int], int] = {}
        for r in letters:
            h = dict(r.headers)
            where = (int(h[dl.H_PARTITION]), int(h[dl.H_OFFSET]))
            assert where in expected, f"dead letter for {where}, which is not a bad record: {h}"
            i = expected[where]
            part, key, value, headers = records[i]
            assert h[dl.H_TOPIC] == topic.encode()
            assert (r.key, r.value, h["origin"]) == (key, value, headers[0][1])
            assert h[dl.H_EXCEPTION] == b"icesink.shared.errors.DataError"
            assert h[dl.H_REASON].decode() == kinds[i]
            message = h[dl.H_MESSAGE].decode()
            assert f"offset={offsets[i]}" in message
            if kinds[i] == "uncoercible":
                assert h[dl.H_FIELD] == b"store_id" and h[dl.H_TABLE] == table.encode()
                assert "cannot coerce 'abc'" in message
            elif kinds[i] == "too-large":
                assert f"record of {len(value)} bytes exceeds errors.max-record-bytes={MAX_BYTES}" in message
            else:
                assert "malformed JSON" in message and dl.H_FIELD not in h
            seen[where] = seen.get(where, 0) + 1
        assert seen.keys() == expected.keys(), f"missing dead letters: {sorted(expected.keys() - seen.keys())[:5]}"

        ports = [r.metrics_port for r in replicas.replicas.values()]
        deadline = time.monotonic() + 30
        while sum(metric(p, "icesink_tombstones_total") for p in ports) < tombstones:
            assert time.monotonic() < deadline, "tombstones not counted"
            time.sleep(1)
        assert sum(metric(p, "icesink_records_deadlettered_total") for p in ports) >= len(expected)
        rejected = f'icesink_records_rejected_total{{reason="uncoercible",topic="{topic}"}}'
        assert sum(metric(p, rejected) for p in ports) >= kinds.count("uncoercible")
        replicas.check_alive()
    finally:
        replicas.stop_all()


@pytest.mark.timeout(300)
def test_crash_after_dead_letters_went_out_duplicates_letters_never_rows(broker, catalog_props, tmp_path):
    """The at-least-once edge of the dead-letter topic, forced: the replica dies (SIGKILL) right
    after a round's dead letters are acknowledged, before it reports the round's offsets. Its
    replacement reads the same records again: every good record lands exactly once, every bad
    one is dead-lettered at least once, and those of the lost round twice."""
    import random
    import signal

    from agents import deadletter as dl
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, read_topic, wait_rows, write_config

    topic, dlq, table = "dlc-pizzas", "dlc-pizzas-dlq", "dlc.pizzas"
    catalog = _setup(broker, catalog_props, "dlc", topic, 2)
    rng = random.Random(5)
    records: list[tuple[int, bytes | None, bytes | None, list[Any]]] = []
    good: set[str] = set()
    bad: list[int] = []
    for i in range(1200):
        if i % 25 == 3:
            bad.append(i)
            records.append((i % 2, None, _pizza(rng, store_id="abc")[1], []))
        else:
            order_id, value = _pizza(rng)
            good.add(order_id)
            records.append((i % 2, None, value, []))
    offsets = _send(broker.bootstrap, topic, records)
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=state, group="dlc-sink",
                       **{"errors.deadletterqueue.topic.name": dlq,
                          "errors.deadletterqueue.topic.replication.factor": 1,
                          "iceberg.tables.auto-create-enabled": "false",
                          "fault.crash-at": "worker.after-dead-letters"})
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        first = replicas.start("w1")
        deadline = time.monotonic() + 120
        while first.alive:
            assert time.monotonic() < deadline, "the replica never reached worker.after-dead-letters"
            time.sleep(0.5)
        assert first.proc.returncode == -signal.SIGKILL and (state / "fault-worker.after-dead-letters.fired").exists()
        replicas.replicas.pop("w1").log_handle.close()
        replicas.start("w2")
        wait_rows(catalog, replicas, (table,), len(good), timeout_s=120)
        assert_exact(catalog, table, good)
        letters = read_topic(broker.bootstrap, dlq, len(bad) + 1, timeout_s=60)
    finally:
        replicas.stop_all()
    count: dict[tuple[int, int], int] = {}
    for r in letters:
        h = dict(r.headers)
        where = (int(h[dl.H_PARTITION]), int(h[dl.H_OFFSET]))
        count[where] = count.get(where, 0) + 1
    expected = {(records[i][0], offsets[i]) for i in bad}
    assert count.keys() == expected, f"missing {sorted(expected - count.keys())[:5]}, extra {sorted(count.keys() - expected)[:5]}"
    twice = sum(1 for c in count.values() if c > 1)
    assert twice > 0, "the crashed round's dead letters should have been sent again"
    print(f"{len(bad)} bad records, {len(letters)} letters, {twice} sent twice")


@pytest.mark.timeout(300)
def test_tolerance_none_stops_the_replica_at_the_first_bad_record(broker, catalog_props, tmp_path):
    import random

    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import key_counts, wait_rows, write_config

    topic, table = "dln-pizzas", "dln.pizzas"
    catalog = _setup(broker, catalog_props, "dln", topic, 2)
    rng = random.Random(3)
    first = [_pizza(rng) for _ in range(200)]
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="dln-sink",
                       **{"errors.tolerance": "none", "iceberg.tables.auto-create-enabled": "false"})
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        w1 = replicas.start("w1")
        _send(broker.bootstrap, topic, [(i % 2, None, v, []) for i, (_, v) in enumerate(first)])
        wait_rows(catalog, replicas, (table,), len(first), timeout_s=180)

        # Partition 0: one uncoercible record, then good ones; partition 1: good ones.
        bad_id, bad = _pizza(rng, store_id="abc")
        after0 = [_pizza(rng) for _ in range(50)]
        after1 = [_pizza(rng) for _ in range(50)]
        offsets = _send(broker.bootstrap, topic, [(0, None, bad, [])] + [(0, None, v, []) for _, v in after0]
                        + [(1, None, v, []) for _, v in after1])
        deadline = time.monotonic() + 90
        while w1.alive:
            assert time.monotonic() < deadline, "the replica did not stop on the bad record"
            time.sleep(0.5)
        assert w1.proc.returncode == 2
        log = w1.log_path.read_text(errors="replace")
        line = next((x for x in log.splitlines() if "stopping:" in x and "errors.tolerance=none" in x), None)
        assert line is not None, log[-3000:]
        assert re.search(rf"topic={topic}, partition=0, offset={offsets[0]}, field=store_id", line), line

        got = key_counts(catalog, table)
        assert all(c == 1 for c in got.values()), "duplicates"
        assert {k for k, _ in first} <= got.keys()
        landed_after = got.keys() & ({bad_id} | {k for k, _ in after0})
        assert not landed_after, f"{len(landed_after)} records at or after the bad offset of partition 0 landed"
        assert got.keys() <= {k for k, _ in first} | {k for k, _ in after1}
    finally:
        replicas.stop_all()
