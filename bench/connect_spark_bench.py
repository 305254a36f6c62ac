"""``icesink connect``: memory and ingest rate of one shared Spark against a JVM per task.

For each task count and mode (``connect.spark.shared`` true or false) it starts the embedded
broker's ``icesink connect`` process, PUTs one connector of that many tasks over a topic that
already holds ``--records`` pizza orders, and waits until the table holds them all. It prints the
connect process tree's RSS (peak, and once every task is running and the backlog is drained),
its JVM count and the rate from PUT to the last row committed.

    .venv/bin/python bench/connect_spark_bench.py --tasks 1,6 --records 120000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import MIB, RssSampler, descendants, tree_rss_bytes
from icesink.app.embedded import EmbeddedBroker, free_port
from icesink.shared.catalogs import sqlite_catalog_properties


def _call(port: int, method: str, path: str, body: object = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(response.status)


def _jvms(root: int) -> int:
    count = 0
    for pid in descendants(root):
        try:
            count += os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "java"
        except OSError:
            continue
    return count


def run(broker: EmbeddedBroker, work: Path, topic: str, records: int, tasks: int, shared: bool) -> str:
    from pyiceberg.catalog import load_catalog

    from icesink.shared.iceberg import total_rows

    run_dir = work / f"{'shared' if shared else 'separate'}-{tasks}"
    run_dir.mkdir()
    props = sqlite_catalog_properties(run_dir / "catalog")
    api, metrics = free_port(), free_port()
    config = run_dir / "connect.json"
    config.write_text(json.dumps({
        "bootstrap.servers": broker.bootstrap, "listeners": f"http://127.0.0.1:{api}",
        "rest.advertised.host.name": "127.0.0.1", "metrics.port": metrics, "group.id": f"bench-{run_dir.name}",
        "config.storage.topic": f"bench-{run_dir.name}-configs", "state.dir": str(run_dir / "state"),
        "connect.spark.shared": str(shared).lower(),
        "connector.config.override.allow": "iceberg.catalog.uri,iceberg.catalog.warehouse",
    }))
    log = (run_dir / "connect.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "icesink", "connect", "--config", str(config)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    sampler = RssSampler(proc.pid).start()
    try:
        while True:
            assert proc.poll() is None, (run_dir / "connect.log").read_text()[-3000:]
            try:
                if _call(api, "GET", "/") == 200:
                    break
            except OSError:
                time.sleep(0.5)
        connector = {"connector.class": "org.apache.iceberg.connect.IcebergSinkConnector", "tasks.max": str(tasks),
                     "topics": topic, "iceberg.tables": "bench.pizzas", "iceberg.catalog": "bench",
                     "iceberg.tables.auto-create-enabled": "true", "iceberg.tables.evolve-schema-enabled": "true",
                     "key.converter": "org.apache.kafka.connect.storage.StringConverter",
                     **{f"iceberg.catalog.{k}": v for k, v in props.items()},
                     "iceberg.control.topic": f"bench-{run_dir.name}-control",
                     "iceberg.control.commit.interval-ms": 2000,
                     "value.converter": "org.apache.kafka.connect.json.JsonConverter",
                     "value.converter.schemas.enable": "false"}
        began = time.monotonic()
        _call(api, "PUT", f"/connectors/{run_dir.name}/config", connector)  # its own sink group
        catalog = load_catalog("bench", **props)
        rows = 0
        while rows < records:
            assert proc.poll() is None, (run_dir / "connect.log").read_text()[-3000:]
            time.sleep(1)
            try:
                rows = total_rows(catalog, "bench.pizzas")
            except Exception:  # noqa: BLE001 - not created yet
                rows = 0
        took = time.monotonic() - began
        steady, procs = tree_rss_bytes(proc.pid)
        jvms = _jvms(proc.pid)
    finally:
        sampler.stop()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return (f"{'shared' if shared else 'separate':8} tasks={tasks:2d} jvms={jvms:2d} processes={procs:3d} "
            f"rss_drained={steady / MIB:7.0f} MiB rss_peak={sampler.peak_tree_bytes / MIB:7.0f} MiB "
            f"put_to_last_row={took:6.1f} s rate={records / took:8.0f} records/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="1,6", help="task counts, comma-separated")
    parser.add_argument("--modes", default="shared,separate")
    parser.add_argument("--records", type=int, default=120_000)
    parser.add_argument("--partitions", type=int, default=12)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the run's processes on the way out
    from icesink.app.pizzas import pizza_values, produce
    from icesink.shared.kafka_admin import ensure_topic

    with tempfile.TemporaryDirectory(prefix="connect-spark-bench-") as tmp:
        work = Path(tmp)
        broker = EmbeddedBroker(work / "broker")
        broker.start()
        try:
            topic = "bench-pizzas"
            asyncio.run(ensure_topic(broker.bootstrap, topic, args.partitions))
            asyncio.run(produce(broker.bootstrap, topic, pizza_values(args.records, seed=1), partitions=args.partitions))
            print(f"{args.records} records in {args.partitions} partitions; {os.cpu_count()} cores", flush=True)
            for tasks in (int(t) for t in args.tasks.split(",")):
                for mode in args.modes.split(","):
                    print(run(broker, work, topic, args.records, tasks, mode == "shared"), flush=True)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
