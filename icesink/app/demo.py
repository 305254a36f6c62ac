"""``icesink demo``: the reference tutorial's pizza scenario on the embedded stack."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import tempfile
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from icesink.shared.catalogs import sqlite_catalog_properties
from icesink.app.embedded import EmbeddedBroker
from icesink.shared.kafka_admin import ensure_topic
from icesink.app.pizzas import pizza_event, produce
from icesink.app.replicas import ReplicaSet

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

TOPIC = "completed-pizzas"
TABLE = "rpc.pizzas"


def tutorial_config(bootstrap: str, catalog_dir: Path, interval_ms: int) -> dict[str, object]:
    """The reference tutorial's connector config, unchanged apart from addresses."""
    props = sqlite_catalog_properties(catalog_dir)
    return {
        "connector.class": "io.tabular.iceberg.connect.IcebergSinkConnector",
        "tasks.max": "6",
        "topics": TOPIC,
        "iceberg.tables": TABLE,
        "iceberg.catalog": "demo",
        "iceberg.catalog.type": props["type"],
        "iceberg.catalog.uri": props["uri"],
        "iceberg.catalog.warehouse": props["warehouse"],
        "iceberg.tables.auto-create-enabled": "true",
        "iceberg.tables.evolve-schema-enabled": "true",
        "iceberg.control.commit.interval-ms": interval_ms,
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "bootstrap.servers": bootstrap,
        "spark.master": "local[1]",
    }


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def run_demo(duration_s: float, rate: float, replicas: int, interval_ms: int, state_dir: Path | None) -> int:
    own_dir = state_dir is None
    root = Path(tempfile.mkdtemp(prefix="icesink-demo-")) if own_dir else state_dir
    assert root is not None
    root.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker(root / "broker")
    workers: ReplicaSet | None = None
    try:
        _say(f"starting the embedded broker (Tansu) in {root}")
        broker.start()
        asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 6))
        config = tutorial_config(broker.bootstrap, root / "catalog", interval_ms)
        cfg_path = root / "connector.json"
        cfg_path.write_text(json.dumps(config, indent=2))
        _say(f"config (the tutorial's, with local addresses): {cfg_path}")
        workers = ReplicaSet(cfg_path, root / "workers", env={"ICESINK_STATE_DIR": str(root / "state")})
        for _ in range(replicas):
            r = workers.start()
            _say(f"started worker replica {r.name} (pid {r.proc.pid}, metrics on :{r.metrics_port}, log {r.log_path})")
        _say("waiting for the workers to join the group and finish a first (empty) round")
        _wait_first_round(workers)
        total = int(duration_s * rate)
        _say(f"producing {total} pizza orders to {TOPIC} (6 partitions) at {rate:.0f}/s for {duration_s:.0f}s")
        rng = random.Random()
        values = [json.dumps(pizza_event(rng, when=datetime.now(UTC))).encode() for _ in range(total)]
        producer = threading.Thread(
            target=lambda: asyncio.run(produce(broker.bootstrap, TOPIC, values, partitions=6, rate_per_s=rate)))
        producer.start()
        started = time.monotonic()
        catalog = _catalog(root / "catalog")
        rows = 0
        while producer.is_alive() or rows < total:
            time.sleep(5)
            workers.check_alive()
            rows = _rows(catalog)
            _say(f"t={time.monotonic() - started:5.0f}s  rows committed to {TABLE}: {rows}")
            if not producer.is_alive() and time.monotonic() - started > duration_s + 6 * interval_ms / 1000 + 120:
                _say("giving up waiting for the last commits")
                break
        producer.join()
        _report(catalog, total)
        return 0 if rows == total else 1
    finally:
        if workers is not None:
            _say("stopping workers")
            workers.stop_all()
        broker.stop()
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
        _say("stopped everything the demo started")


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def _wait_first_round(workers: ReplicaSet, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers.check_alive()
        done = 0.0
        for r in workers.replicas.values():
            try:
                done += _metric(r.metrics_port, "icesink_rounds_committed_total")
            except OSError:
                pass
        if done >= 1:
            return
        time.sleep(1)
    raise RuntimeError("the workers did not complete a commit round in time; see their logs")


def _catalog(directory: Path) -> Catalog:
    from pyiceberg.catalog import load_catalog

    return load_catalog("demo", **sqlite_catalog_properties(directory))


def _rows(catalog: Catalog) -> int:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = catalog.load_table(TABLE)
    except NoSuchTableError:
        return 0
    snap = table.current_snapshot()
    if not (snap and snap.summary):
        return 0
    total = snap.summary["total-records"]
    assert total is not None  # pyiceberg writes every snapshot's summary with its totals
    return int(total)


def _report(catalog: Catalog, produced: int) -> None:
    table = catalog.load_table(TABLE)
    data: pa.Table = table.scan().to_arrow()
    print()
    distinct = pc.count_distinct(data["order_id"]).as_py()
    print(f"rows in {TABLE}: {data.num_rows} (produced {produced}), distinct order_id: {distinct}")
    print()
    print("top 5 stores (SELECT store_id, count(*) FROM rpc.pizzas GROUP BY store_id ORDER BY 2 DESC LIMIT 5):")
    top = data.group_by("store_id").aggregate([("order_id", "count")]).sort_by([("order_id_count", "descending")])
    for row in top.slice(0, 5).to_pylist():
        print(f"  store {row['store_id']:>4}  {row['order_id_count']:>6} pizzas")
    print()
    print("snapshot history (one per commit interval with data):")
    for snap in table.snapshots():
        s = snap.summary
        when = datetime.fromtimestamp(snap.timestamp_ms / 1000, UTC).strftime("%H:%M:%S")
        print(f"  {when}  snapshot {snap.snapshot_id}  +{s['added-records'] if s else '?'} rows  "
              f"{s['added-data-files'] if s else '?'} files  round {s['icesink.commit-id'] if s else '?'}")
    print()
