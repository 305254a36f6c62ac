"""Catalog faults with real processes on a PostgreSQL-backed SQL catalog (the catalog replicas on
several hosts would share): another writer appends to the same table all along, and PostgreSQL
is stopped for 30 s mid-stream. Commits must retry (visible in /metrics and /status) and resume
by themselves; the table must hold every produced record once, plus the other writer's rows."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pyarrow as pa
import pytest

pytestmark = pytest.mark.integration

TOPIC = "pg-pizzas"
TABLE = "pg.pizzas"


class OtherWriter(threading.Thread):
    """Appends 5 rows with keys ext-<n>-<i> every 0.7 s through its own catalog object."""

    def __init__(self, props: dict[str, str]) -> None:
        super().__init__(name="other-writer", daemon=True)
        self.props = props
        self.keys: set[str] = set()
        self.conflicts = 0
        self.paused = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import CommitFailedException

        from icesink.app.pizzas import PIZZA_SCHEMA

        # Same catalog name (tables are per name); pre-ping: pooled connections die with the server.
        catalog = load_catalog("it", **self.props, pool_pre_ping="true")
        arrow_schema = PIZZA_SCHEMA.as_arrow()
        n = 0
        while not self.done.is_set():
            time.sleep(0.7)
            if self.paused.is_set():
                continue
            n += 1
            keys = [f"ext-{n}-{i}" for i in range(5)]
            batch = pa.Table.from_pylist([{"order_id": k, "store_id": 0} for k in keys], schema=arrow_schema)
            try:
                catalog.load_table(TABLE).append(batch)
            except CommitFailedException:
                self.conflicts += 1  # lost the race to the sink: not committed, retried next time
                continue
            self.keys.update(keys)


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_concurrent_writer_and_postgres_outage(broker, postgres, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import PIZZA_SCHEMA, pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, http_json, metric, total_rows, wait_rows, write_config

    props = {"type": "sql", "uri": postgres.uri, "warehouse": f"file://{tmp_path / 'warehouse'}"}
    # The workers' catalog has no pre-ping: their first commit after the outage fails on a dead
    # pooled connection and is retried. The test's own reads use pre-ping.
    catalog = load_catalog("it", **props, pool_pre_ping="true")
    catalog.create_namespace("pg")
    catalog.create_table(TABLE, schema=PIZZA_SCHEMA)
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 6))
    cfg = write_config(tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap,
                       catalog_props=props, state_dir=tmp_path / "state", group="pg-sink")
    values = pizza_values(30_000, seed=21)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    other = OtherWriter(props)
    try:
        replicas.start("p1")
        replicas.start("p2")
        asyncio.run(produce(broker.bootstrap, TOPIC, values[:3000], partitions=6))
        wait_rows(catalog, replicas, (TABLE,), 3000)  # the group is up and committing

        other.start()
        sender = threading.Thread(target=lambda: asyncio.run(
            produce(broker.bootstrap, TOPIC, values[3000:], partitions=6, rate_per_s=1000)))
        sender.start()
        time.sleep(8)

        other.paused.set()
        time.sleep(1)  # let an append in flight finish: its outcome must be known
        postgres.stop()
        time.sleep(30)
        ports = [r.metrics_port for r in replicas.replicas.values()]
        failures = sum(metric(p, "icesink_commit_failures_total") for p in ports)
        statuses = [http_json(p)["coordinator"] for p in ports]
        coordinator = next(s for s in statuses if s is not None)
        assert failures >= 1, "commit failures must show in /metrics while the catalog is down"
        assert coordinator["phase"] == "commit-retrying" and coordinator["attempt"] >= 1, coordinator
        assert coordinator.get("error"), coordinator
        assert sum(metric(p, "icesink_commit_retrying") for p in ports) == 1
        postgres.start()
        other.paused.clear()

        sender.join()
        time.sleep(5)
        other.done.set()
        other.join(timeout=30)
        wait_rows(catalog, replicas, (TABLE,), len(keys) + len(other.keys), timeout_s=420)
        time.sleep(6)  # further rounds add nothing
        assert total_rows(catalog, TABLE) == len(keys) + len(other.keys)
        assert sum(metric(p, "icesink_commit_retrying") for p in ports) == 0
    finally:
        other.done.set()
        replicas.stop_all()

    assert len(other.keys) >= 20
    assert_exact(catalog, TABLE, keys | other.keys)
