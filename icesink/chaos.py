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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from icesink.iceberg import total_rows
from icesink.replicas import ReplicaSet, write_fast_config

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

    from icesink.kafka_admin import ensure_topic
    from icesink.pizzas import pizza_values, produce

    rng = random.Random(seed)
    report = ChaosReport(produced=records)
    values = pizza_values(records, seed=seed, spread_days=3)
    keys = {json.loads(v)["order_id"] for v in values}
    asyncio.run(ensure_topic(bootstrap, TOPIC, 6))
    catalog = load_catalog("chaos", **catalog_props)
    catalog.create_namespace_if_not_exists("chaos")
    if not catalog.table_exists(TABLES[1]):  # typed and partitioned; TABLES[0] is auto-created
        from icesink.pizzas import PIZZA_SCHEMA
        from spark_bridge.partitioning import build_partition_spec, parse_partition_by

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
    from icesink.duck import connect, plain_path

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
