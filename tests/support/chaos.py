"""A chaos run: real worker processes ingest a known set of pizza orders while replicas are
killed with SIGKILL (and now and then stopped with SIGTERM) and restarted at random instants.
At the end every table is read back with DuckDB's iceberg extension and compared with what was
produced: row count, duplicates, missing keys.

Used by the CI-sized chaos test (tests/integration/test_chaos.py) and by the soak command
``bench/chaos.py`` (flags for duration, replicas, kill rate).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icesink.shared.iceberg import total_rows
from icesink.app.replicas import ReplicaSet, write_fast_config

log = logging.getLogger(__name__)

TOPIC = "chaos-pizzas"
TABLES = ("chaos.pizzas", "chaos.pizzas_by_day")


@dataclass
class ChaosReport:
    produced: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    rows: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    unexpected: dict[str, int] = field(default_factory=dict)
    shutdown_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    settle_s: float = 0.0

    @property
    def exact(self) -> bool:
        return all(
            self.rows.get(t) == self.produced and not self.duplicates.get(t) and not self.missing.get(t)
            and not self.unexpected.get(t)
            for t in TABLES
        )

    def lines(self) -> list[str]:
        out = [
            f"records produced: {self.produced}",
            "faults injected: " + (", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"),
            f"graceful stops: {len(self.shutdown_s)}, slowest {max(self.shutdown_s, default=0):.1f}s",
            f"elapsed: {self.elapsed_s:.0f}s (settling after the last fault {self.settle_s:.0f}s)",
        ]
        for t in TABLES:
            out.append(
                f"{t}: rows {self.rows.get(t)}, duplicates {self.duplicates.get(t)}, "
                f"missing keys {self.missing.get(t)}, unexpected keys {self.unexpected.get(t)}"
            )
        out.append("result: " + ("EXACT" if self.exact else "NOT EXACT"))
        return out


def run_chaos(
    workdir: Path,
    *,
    bootstrap: str,
    catalog_props: dict[str, str],
    records: int,
    replicas: int = 3,
    fault_s: float = 120.0,
    kill_every_s: tuple[float, float] = (4.0, 10.0),
    graceful_share: float = 0.2,
    settle_timeout_s: float = 600.0,
    seed: int = 1,
    say: Callable[[str], None] = print,
) -> ChaosReport:
    """Produce ``records`` pizzas spread over ``fault_s`` seconds while faults hit the replicas
    every ``kill_every_s`` seconds; then let the group finish and compare."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce

    rng = random.Random(seed)
    report = ChaosReport(produced=records)
    values = pizza_values(records, seed=seed, spread_days=3)
    keys = {json.loads(v)["order_id"] for v in values}
    asyncio.run(ensure_topic(bootstrap, TOPIC, 6))
    catalog = load_catalog("chaos", **catalog_props)
    catalog.create_namespace_if_not_exists("chaos")
    if not catalog.table_exists(TABLES[1]):  # typed and partitioned; TABLES[0] is auto-created
        from icesink.app.pizzas import PIZZA_SCHEMA
        from icesink.shared.partitioning import build_partition_spec, parse_partition_by

        spec = build_partition_spec(parse_partition_by("day(date_ordered), bucket(store_id, 4)"), PIZZA_SCHEMA)
        catalog.create_table(TABLES[1], schema=PIZZA_SCHEMA, partition_spec=spec)
    cfg = write_fast_config(workdir / "sink.json", topics=TOPIC, tables=",".join(TABLES), bootstrap=bootstrap,
                            catalog_name="chaos", catalog_props=catalog_props, state_dir=workdir / "state",
                            group="chaos")
    group = ReplicaSet(cfg, workdir / "logs")
    began = time.monotonic()

    def send() -> None:
        asyncio.run(produce(bootstrap, TOPIC, values, partitions=6, rate_per_s=records / (fault_s * 0.8)))

    sender = threading.Thread(target=send, name="chaos-producer", daemon=True)
    try:
        for _ in range(replicas):
            group.start()
        sender.start()
        while time.monotonic() - began < fault_s:
            time.sleep(rng.uniform(*kill_every_s))
            alive = [n for n, r in group.replicas.items() if r.alive]
            victim = rng.choice(alive) if alive else None
            if victim is not None:
                graceful = rng.random() < graceful_share
                if graceful:
                    t0 = time.monotonic()
                    code = group.stop(victim, timeout_s=60)
                    report.shutdown_s.append(time.monotonic() - t0)
                    report.faults["SIGTERM"] += 1
                    if code != 0:
                        say(f"{victim} exited with {code} on SIGTERM")
                else:
                    group.kill(victim)
                    report.faults["SIGKILL"] += 1
                say(f"[{time.monotonic() - began:5.0f}s] {'SIGTERM' if graceful else 'SIGKILL'} {victim}")
            for name in [n for n, r in group.replicas.items() if not r.alive]:
                group.replicas.pop(name).log_handle.close()  # died by itself: counted below
                report.faults["died"] += 1
            time.sleep(rng.uniform(0.5, 2.0))
            while len(group.replicas) < replicas:
                group.start()
        sender.join()
        last_fault = time.monotonic()
        say(f"[{last_fault - began:5.0f}s] faults over; waiting for the group to catch up")
        deadline = last_fault + settle_timeout_s
        while time.monotonic() < deadline:
            group.check_alive()
            counts = {t: total_rows(catalog, t) for t in TABLES}
            if all(c >= records for c in counts.values()):
                break
            time.sleep(2)
        report.settle_s = time.monotonic() - last_fault
        time.sleep(6)  # a few more rounds: nothing may be added twice
    finally:
        group.stop_all(timeout_s=30)
        sender.join(timeout=5)
    report.elapsed_s = time.monotonic() - began
    for t in TABLES:
        _compare(report, catalog, t, keys)
    return report


def _compare(report: ChaosReport, catalog: Any, name: str, keys: set[str]) -> None:
    from tests.support.duck import connect, plain_path

    if not catalog.table_exists(name):
        report.rows[name], report.duplicates[name], report.missing[name], report.unexpected[name] = 0, 0, len(keys), 0
        return
    location = plain_path(catalog.load_table(name).metadata_location)
    con = connect()
    got = Counter(r[0] for r in con.execute(f"SELECT order_id FROM iceberg_scan('{location}')").fetchall())
    report.rows[name] = sum(got.values())
    report.duplicates[name] = sum(c - 1 for c in got.values() if c > 1)
    report.missing[name] = len(keys - got.keys())
    report.unexpected[name] = len(got.keys() - keys)


# Mirror tables (CDC) under chaos ----------------------------------------------------------

MIRROR_TOPIC = "chaos-changes"
MIRROR_TABLES = ("chaos.mirror", "chaos.mirror_by_bucket")


@dataclass
class MirrorReport:
    produced: int = 0
    live_keys: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    rows: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    wrong: dict[str, int] = field(default_factory=dict)  # keys missing, back from a delete, or with stale values
    elapsed_s: float = 0.0

    @property
    def exact(self) -> bool:
        return all(self.rows.get(t) == self.live_keys and not self.duplicates.get(t) and not self.wrong.get(t)
                   for t in MIRROR_TABLES)

    def lines(self) -> list[str]:
        out = [f"change events produced: {self.produced}, live keys at the end: {self.live_keys}",
               "faults injected: " + (", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"),
               f"elapsed: {self.elapsed_s:.0f}s"]
        out += [f"{t}: rows {self.rows.get(t)}, keys twice {self.duplicates.get(t)}, wrong keys {self.wrong.get(t)}"
                for t in MIRROR_TABLES]
        out.append("result: " + ("EXACT" if self.exact else "NOT EXACT"))
        return out


def change_events(n: int, keys: int, seed: int) -> tuple[list[tuple[int, bytes]], dict[int, str]]:
    """``n`` change events ``{"id", "v", "op"}`` over ``keys`` keys (inserts, updates, deletes,
    re-inserts, upserts of live keys, deletes of absent keys) and the state they leave: key ->
    value, applying them in order (each key's events stay in one partition, in order)."""
    rng = random.Random(seed)
    live: dict[int, str] = {}
    out = []
    for i in range(n):
        k = rng.randrange(keys)
        if k in live:
            op = rng.choices(["u", "d", "c"], [6, 2, 2])[0]
        else:
            op = rng.choices(["c", "r", "d"], [8, 1, 1])[0]
        v = f"{k}-{i}"
        if op == "d":
            live.pop(k, None)
        else:
            live[k] = v
        out.append((k, json.dumps({"id": k, "v": None if op == "d" else v, "op": op}).encode()))
    return out, live


async def _produce_keyed(bootstrap: str, topic: str, events: list[tuple[int, bytes]], partitions: int,
                         rate_per_s: float) -> None:
    """As Kafka Connect does: a key's events to one partition (key % partitions), in order."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=False)
    await producer.start()
    try:
        began = time.monotonic()
        step = max(1, int(rate_per_s / 20))
        for start in range(0, len(events), step):
            futures = [await producer.send(topic, v, key=str(k).encode(), partition=k % partitions)
                       for k, v in events[start:start + step]]
            await asyncio.gather(*futures)
            ahead = (start + step) / rate_per_s - (time.monotonic() - began)
            if ahead > 0:
                await asyncio.sleep(ahead)
    finally:
        await producer.stop()


def run_mirror_chaos(
    workdir: Path,
    *,
    bootstrap: str,
    catalog_props: dict[str, str],
    events: int,
    keys: int,
    replicas: int = 3,
    fault_s: float = 60.0,
    kill_every_s: tuple[float, float] = (4.0, 10.0),
    settle_timeout_s: float = 420.0,
    seed: int = 1,
    extra: dict[str, str] | None = None,
    say: Callable[[str], None] = print,
) -> MirrorReport:
    """Change events for two mirror tables (one auto-created, one bucketed on the key) produced
    over ``fault_s`` seconds while replicas are killed with SIGKILL and restarted; then wait
    until both tables equal the state the events leave, and compare with DuckDB."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.shared.partitioning import build_partition_spec, parse_partition_by

    rng = random.Random(seed)
    changes, want = change_events(events, keys, seed)
    report = MirrorReport(produced=events, live_keys=len(want))
    asyncio.run(ensure_topic(bootstrap, MIRROR_TOPIC, 6))
    catalog = load_catalog("chaos", **catalog_props)
    catalog.create_namespace_if_not_exists("chaos")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType()),
                    NestedField(3, "op", StringType()), identifier_field_ids=[1])
    if not catalog.table_exists(MIRROR_TABLES[1]):
        spec = build_partition_spec(parse_partition_by("bucket(id, 4)"), schema)
        catalog.create_table(MIRROR_TABLES[1], schema=schema, partition_spec=spec, properties={"format-version": "2"})
    cfg = write_fast_config(
        workdir / "sink.json", topics=MIRROR_TOPIC, tables=",".join(MIRROR_TABLES), bootstrap=bootstrap,
        catalog_name="chaos", catalog_props=catalog_props, state_dir=workdir / "state", group="chaos-mirror",
        **{"iceberg.tables.cdc-field": "op", "iceberg.tables.upsert-mode-enabled": "true",
           "iceberg.tables.default-id-columns": "id", **(extra or {})})
    group = ReplicaSet(cfg, workdir / "logs")
    began = time.monotonic()
    sender = threading.Thread(target=lambda: asyncio.run(_produce_keyed(
        bootstrap, MIRROR_TOPIC, changes, 6, events / (fault_s * 0.8))), name="mirror-producer", daemon=True)
    try:
        for _ in range(replicas):
            group.start()
        sender.start()
        while time.monotonic() - began < fault_s:
            time.sleep(rng.uniform(*kill_every_s))
            alive = [n for n, r in group.replicas.items() if r.alive]
            if alive:
                victim = rng.choice(alive)
                group.kill(victim)
                report.faults["SIGKILL"] += 1
                say(f"[{time.monotonic() - began:5.0f}s] SIGKILL {victim}")
            for name in [n for n, r in group.replicas.items() if not r.alive]:
                group.replicas.pop(name).log_handle.close()
                report.faults["died"] += 1  # a fault point (fault.crash-at) or a kill above
            time.sleep(rng.uniform(0.5, 2.0))
            while len(group.replicas) < replicas:
                group.start()
        sender.join()
        deadline = time.monotonic() + settle_timeout_s
        while time.monotonic() < deadline:
            for name in [n for n, r in group.replicas.items() if not r.alive]:  # a fault point fired late
                group.replicas.pop(name).log_handle.close()
                report.faults["died"] += 1
                group.start()
            if all(_mirror_rows(catalog, t) == want for t in MIRROR_TABLES):
                break
            time.sleep(2)
        time.sleep(6)  # a few more rounds: nothing may change any more
    finally:
        group.stop_all(timeout_s=30)
        sender.join(timeout=5)
    report.elapsed_s = time.monotonic() - began
    for t in MIRROR_TABLES:
        _compare_mirror(report, catalog, t, want)
    return report


def _mirror_rows(catalog: Any, name: str) -> dict[int, str] | None:
    from tests.support.duck import scan_rows

    if not catalog.table_exists(name):
        return None
    rows = scan_rows(catalog.load_table(name).metadata_location)
    out = {r["id"]: r["v"] for r in rows}
    return out if len(out) == len(rows) else None


def _compare_mirror(report: MirrorReport, catalog: Any, name: str, want: dict[int, str]) -> None:
    from tests.support.duck import scan_rows

    if not catalog.table_exists(name):
        report.rows[name], report.duplicates[name], report.wrong[name] = 0, 0, len(want)
        return
    rows = scan_rows(catalog.load_table(name).metadata_location)
    got = Counter(r["id"] for r in rows)
    values = {r["id"]: r["v"] for r in rows}
    report.rows[name] = len(rows)
    report.duplicates[name] = sum(c - 1 for c in got.values() if c > 1)
    report.wrong[name] = sum(1 for k in want.keys() | values.keys() if values.get(k) != want.get(k) or k not in want)
