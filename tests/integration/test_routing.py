"""Routing with real worker processes: one topic of three event types fanned out to tables by
route-regex, and dynamic routing to 200 tables. Every table is read back by DuckDB."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def events(n: int, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        kind = rnd.choice(["click", "order", "refund"])
        body: dict[str, object] = {"type": kind, "id": f"{kind}-{i}"}
        if kind == "click":
            body["url"] = rnd.choice(["/", "/menu", "/cart"])
        elif kind == "order":
            body |= {"amount": rnd.randrange(100, 9000) / 100, "store_id": rnd.randrange(100)}
        else:
            body |= {"order": f"order-{rnd.randrange(i + 1)}", "reason": {"code": rnd.randrange(5)}}
        out.append(json.dumps(body).encode())
    return out


def ids_of(values: list[bytes], pattern: str) -> set[str]:
    import re

    rx = re.compile(pattern)
    return {d["id"] for d in map(json.loads, values) if rx.fullmatch(str(d.get("type")))}


@pytest.mark.timeout(600)
def test_three_event_types_fan_out_by_regex(broker, catalog_props, tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, metric, read_topic, total_rows, wait_rows, write_config

    topic = "mixed-events"
    regexes = {"ev.clicks": "click", "ev.orders": "order", "ev.refunds": "refund", "ev.money": "order|refund"}
    asyncio.run(ensure_topic(broker.bootstrap, topic, 4))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=",".join(regexes), bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group="route-sink",
        **{"iceberg.tables.route-field": "type", "errors.deadletterqueue.topic.name": "mixed-dlq",
           "errors.deadletterqueue.topic.replication.factor": 1},
        **{f"iceberg.table.{t}.route-regex": rx for t, rx in regexes.items()},
    )
    values = events(12_000, seed=3)
    unroutable = [b'{"type":"ping","id":"ping-1"}', b'{"id":"no-type"}']
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r1 = replicas.start("r1")
        r2 = replicas.start("r2")
        asyncio.run(produce(broker.bootstrap, topic, values[:6000] + unroutable + values[6000:], partitions=4))
        expected = {t: ids_of(values, rx) for t, rx in regexes.items()}
        for t, ids in expected.items():
            wait_rows(catalog, replicas, (t,), len(ids))
        time.sleep(5)  # a late duplicate would show up here
        assert {t: total_rows(catalog, t) for t in regexes} == {t: len(ids) for t, ids in expected.items()}
        # counted per read: a record read again after the second replica's join counts again
        # (the dead letters below are the exact check)
        unrouted = sum(metric(r.metrics_port, "icesink_records_unrouted_total") for r in (r1, r2))
        assert unrouted >= 2
    finally:
        replicas.stop_all()
    for t, ids in expected.items():
        assert_exact(catalog, t, ids, key="id")
    # Each table got its event type's columns only.
    assert [f.name for f in catalog.load_table("ev.clicks").schema().fields] == ["type", "id", "url"]
    assert "reason" in [f.name for f in catalog.load_table("ev.refunds").schema().fields]
    letters = read_topic(broker.bootstrap, "mixed-dlq", 2, timeout_s=30)
    assert sorted(m.value for m in letters) == sorted(unroutable)
    for m in letters:
        headers = {k: v.decode() for k, v in m.headers}
        assert headers["icesink.errors.reason"] == "no-route"
        assert headers["icesink.errors.field"] == "type"
        assert headers["__connect.errors.topic"] == topic


@pytest.mark.timeout(900)
def test_dynamic_routing_to_200_tables(broker, catalog_props, tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog

    from tests.support.duck import connect, plain_path
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import http_json, total_rows, write_config

    topic = "dyn-events"
    n_tables, per_table = 200, 50
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    bound = 4 * 1024 * 1024
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables="", bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group="dyn-sink",
        **{"iceberg.tables.route-field": "tenant", "iceberg.tables.dynamic-enabled": "true",
           "iceberg.control.commit.interval-ms": 10000, "iceberg.control.commit.timeout-ms": 120000,
           "buffer.max-bytes": bound},
    )
    rnd = random.Random(5)

    def wave(ids: range) -> list[bytes]:
        values = [json.dumps({"tenant": f"Tenants.T{t:03d}", "id": f"{t}-{i}", "n": i}).encode()
                  for t in range(n_tables) for i in ids]
        rnd.shuffle(values)
        return values

    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    started = time.monotonic()
    peak_buffered = 0
    try:
        r = replicas.start("solo")
        deadline = time.monotonic() + 600
        # The second wave finds every table created: the worker reads its fetches once for all
        # 200 tables (agents/decode.py, BatchDecoder.decode_fanout); the first decodes them the usual way.
        for ids in (range(per_table - 20), range(per_table - 20, per_table)):
            asyncio.run(produce(broker.bootstrap, topic, wave(ids), partitions=2))
            while True:
                replicas.check_alive()
                try:
                    peak_buffered = max(peak_buffered, int(http_json(r.metrics_port)["buffered"]["bytes"]))
                except OSError:
                    pass
                tables = catalog.list_tables("tenants") if ("tenants",) in catalog.list_namespaces() else []
                if len(tables) == n_tables and all(total_rows(catalog, ".".join(t)) == ids.stop for t in tables):
                    break
                assert time.monotonic() < deadline, f"{len(tables)} tables after 600 s"
                time.sleep(2)
        elapsed = time.monotonic() - started
        rss_kb = int(next(line.split()[1] for line in Path(f"/proc/{r.proc.pid}/status").read_text().splitlines()
                          if line.startswith("VmHWM")))
    finally:
        replicas.stop_all()
    print(f"200 tables: {elapsed:.0f} s, peak buffered {peak_buffered} bytes, worker peak RSS {rss_kb // 1024} MiB")
    assert peak_buffered <= bound * 2
    with connect() as con:
        for ns, name in catalog.list_tables("tenants"):
            table = catalog.load_table(f"{ns}.{name}")
            count, distinct = con.execute(
                "SELECT count(*), count(DISTINCT id) FROM iceberg_scan(?)", [plain_path(table.metadata_location)]
            ).fetchone()
            assert (count, distinct) == (per_table, per_table), name
            assert len(table.snapshots()) <= 6, f"{name}: {len(table.snapshots())} snapshots"
