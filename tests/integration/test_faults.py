"""Faults at chosen instants, with real processes (Tansu, Faust + Spark workers, SQLite catalog):
- ``fault.crash-at`` makes replicas SIGKILL themselves, once each: between two table commits of
  one round (on the coordinator's replica), after sending some but not all of a response's
  events, and while Spark writes files;
- a replica frozen with SIGSTOP past the session timeout while its partitions move, then
  resumed (a zombie);
- a replica added and removed again (rebalances), stopped with SIGTERM within its bound.
Both tables must then hold every produced record exactly once (DuckDB), the files of the
abandoned response must be gone, and ``icesink gc`` must not touch a committed file."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.integration

TOPIC = "ft-pizzas"
AUTO, PARTED = "ft.pizzas", "ft.pizzas_by_day"
GROUP = "ft-sink"
POINTS = ("coordinator.between-table-commits", "worker.mid-response", "worker.during-write")


@pytest.mark.chaos
@pytest.mark.timeout(1200)
def test_injected_crashes_zombie_and_rebalances(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.shared.protocol import DataComplete, DataWritten, Rewind
    from icesink.shared.iceberg import local_path
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import PIZZA_SCHEMA, pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.partitioning import build_partition_spec, parse_partition_by
    from tests.support.sinkrun import assert_exact, control_events, http_json, wait_rows, write_config

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("ft")
    spec = build_partition_spec(parse_partition_by("day(date_ordered), bucket(store_id, 4)"), PIZZA_SCHEMA)
    catalog.create_table(PARTED, schema=PIZZA_SCHEMA, partition_spec=spec)
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 6))
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "sink.json", topics=TOPIC, tables=f"{AUTO},{PARTED}", bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=state, group=GROUP, **{"fault.crash-at": ",".join(POINTS)})
    values = pizza_values(60_000, seed=5, spread_days=2)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp_path / "logs")

    def send(part: list[bytes], rate: float) -> threading.Thread:
        t = threading.Thread(target=lambda: asyncio.run(produce(broker.bootstrap, TOPIC, part, partitions=6, rate_per_s=rate)))
        t.start()
        return t

    crashed: list[str] = []

    def restart_dead() -> None:
        for name in [n for n, r in replicas.replicas.items() if not r.alive]:
            r = replicas.replicas.pop(name)
            r.log_handle.close()
            assert r.proc.returncode == -signal.SIGKILL, f"{name} exited with {r.proc.returncode}"
            crashed.append(name)
            replicas.start()

    try:
        for _ in range(3):
            replicas.start()
        sender = send(values[:30_000], 700)
        deadline = time.monotonic() + 300
        while not all((state / f"fault-{p}.fired").exists() for p in POINTS):
            assert time.monotonic() < deadline, f"fault points not all reached: {sorted(os.listdir(state))}"
            time.sleep(1)
            restart_dead()
        sender.join()
        time.sleep(3)
        restart_dead()
        assert len(crashed) == 3, crashed
        wait_rows(catalog, replicas, (AUTO, PARTED), 30_000, timeout_s=300)

        # Zombie: freeze a replica that does not run the coordinator, past the session timeout.
        zombie = next(r for r in replicas.replicas.values() if http_json(r.metrics_port)["coordinator"] is None)
        owned = http_json(zombie.metrics_port)["partitions"]
        assert owned, "the zombie-to-be owns no partition"
        sender = send(values[30_000:45_000], 700)
        time.sleep(4)  # it buffers some records first
        os.killpg(zombie.proc.pid, signal.SIGSTOP)
        time.sleep(20)  # session timeout 6 s: its partitions move to the others
        os.killpg(zombie.proc.pid, signal.SIGCONT)
        sender.join()

        # Rebalances: a replica joins, then leaves with SIGTERM, while data flows.
        sender = send(values[45_000:], 700)
        extra = replicas.start("extra")
        time.sleep(15)
        began = time.monotonic()
        assert replicas.stop(extra.name) == 0
        assert time.monotonic() - began < 20  # shutdown.timeout-ms is 15 s
        sender.join()
        wait_rows(catalog, replicas, (AUTO, PARTED), 60_000, timeout_s=420)
        time.sleep(6)
    finally:
        replicas.stop_all()

    for table in (AUTO, PARTED):
        assert_exact(catalog, table, keys)

    log = control_events(broker.bootstrap, f"{GROUP}-control", GROUP)
    completed = {ev.response_id for _, ev in log if isinstance(ev, DataComplete)}
    abandoned = [f.path for _, ev in log if isinstance(ev, DataWritten) and ev.response_id not in completed for f in ev.files]
    assert abandoned, "the mid-response crash left no open response"
    assert not [p for p in abandoned if local_path(p).exists()], "files of abandoned responses must be deleted"
    rewinds = [ev for _, ev in log if isinstance(ev, Rewind)]
    print(f"crashed {crashed}; zombie {zombie.name}; rewinds {[(r.worker, r.reason) for r in rewinds]}")

    gc = subprocess.run([sys.executable, "-m", "icesink", "gc", "--config", str(cfg), "--older-than", "0s", "--delete"],
                        capture_output=True, text=True, timeout=300, check=True)
    print(gc.stdout, gc.stderr)
    for table in (AUTO, PARTED):
        assert_exact(catalog, table, keys)
