"""Table maintenance with real replicas, Spark and a real catalog: about 90 one-second rounds over
3 partitions with compaction after 6 small files and a 5-second snapshot age. The table's live
data files and snapshots stay bounded, compaction and expiry really ran (metrics, /status), no
emptied write directory is left behind, the table is exact by DuckDB and by a pyiceberg scan;
then the coordinator's replica is killed -9 and more data flows: still exact."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.integration

TOPIC, TABLE = "maint-pizzas", "maint.pizzas"


@pytest.mark.chaos
def test_maintenance_keeps_files_and_snapshots_bounded_and_the_table_exact_through_a_coordinator_kill(
        broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from coordinator.maintenance import live_files
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, coordinator_status, metric, total_rows, wait_rows, write_config

    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 3))
    values = pizza_values(11_000, seed=14)
    keys = {json.loads(v)["order_id"] for v in values}
    cfg = write_config(tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="maint-sink",
                       **{"iceberg.control.commit.interval-ms": 1000,
                          "maintenance.compaction.min-input-files": 6,
                          "maintenance.snapshots.max-age-ms": 5000,
                          "maintenance.snapshots.retain-last": 3})
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    sizes: list[tuple[int, int]] = []  # (live data files, snapshots) sampled while rounds run

    def sample() -> None:
        try:
            t = catalog.load_table(TABLE)
            sizes.append((len(live_files(t)), len(t.metadata.snapshots)))
        except Exception:  # noqa: BLE001 - not created yet
            pass

    try:
        for _ in range(2):
            replicas.start()
        stop = threading.Event()

        def feed() -> None:  # 90 small batches, one a second: a round each
            for i in range(90):
                if stop.is_set():
                    return
                asyncio.run(produce(broker.bootstrap, TOPIC, values[i * 100:(i + 1) * 100], partitions=3))
                time.sleep(1)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        deadline = time.monotonic() + 300
        while feeder.is_alive() and time.monotonic() < deadline:
            replicas.check_alive()
            sample()
            time.sleep(2)
        stop.set()
        feeder.join(30)
        wait_rows(catalog, replicas, (TABLE,), 9000, timeout_s=180)
        time.sleep(8)  # a few more rounds: the last expiry and compaction steps
        sample()
        print(f"(live data files, snapshots) sampled every 2 s: {sizes}")
        late = sizes[len(sizes) // 3:]  # after warm-up
        assert late, sizes
        assert max(files for files, _ in late) <= 30, sizes  # without compaction: hundreds
        assert max(snaps for _, snaps in late) <= 25, sizes  # without expiry: one per round
        # Each round writes into a directory of its own under data/; expiry removes the ones it
        # empties (a local warehouse has directories): about 90 would be left, one per round.
        data = Path(urlparse(catalog.load_table(TABLE).location()).path) / "data"
        empty = [d for d in data.rglob("*") if d.is_dir() and not any(d.iterdir())]
        assert len(empty) <= 2, f"{len(empty)} empty directories under {data}, e.g. {empty[:3]}"  # a write's, in flight
        found = coordinator_status(replicas)
        assert found is not None
        coord_replica, status = found
        assert status["maintenance"][TABLE]["error"] is None, status["maintenance"]
        assert metric(coord_replica.metrics_port, "icesink_maintenance_files_rewritten_total") > 0
        assert metric(coord_replica.metrics_port, "icesink_maintenance_snapshots_expired_total") > 0
        table = catalog.load_table(TABLE)
        assert table.scan().to_arrow().num_rows == 9000 == total_rows(catalog, TABLE)
        assert_exact(catalog, TABLE, {json.loads(v)["order_id"] for v in values[:9000]})

        # the coordinator's replica killed -9, another one started, more data: still exact
        replicas.kill(coord_replica.name)
        replicas.start()
        asyncio.run(produce(broker.bootstrap, TOPIC, values[9000:], partitions=3))
        wait_rows(catalog, replicas, (TABLE,), 11_000, timeout_s=240)
        time.sleep(5)
        assert catalog.load_table(TABLE).scan().to_arrow().num_rows == 11_000
        assert_exact(catalog, TABLE, keys)
    finally:
        replicas.stop_all()
