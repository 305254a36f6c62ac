"""A real worker process ingests a backlog without full garbage collections
(icesink/shared/gc_tuning.py): the records of a fetch die by reference counting, not by collection."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request

import pytest

from tests.support.sinkrun import metric, wait_rows, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def collections(port: int) -> dict[str, float]:
    """python_gc_collections_total per generation, from the replica's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r'^python_gc_collections_total\{generation="(\d)"\} (\S+)$',
                                                    text, re.M)}


def test_a_backlog_is_ingested_without_full_collections(broker, catalog_props, tmp_path):
    """200k records over three partitions, ingested and committed by one replica. With Python's
    default threshold the collector ran about 1,700 young and 14 full collections per million
    records, each full one walking the whole heap; now none runs while the backlog is read."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic

    n = 200_000
    asyncio.run(ensure_topic(broker.bootstrap, "gc-pizzas", 3))
    cfg = write_config(tmp_path / "gc.json", topics="gc-pizzas", tables="gc.pizzas", bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="gc-sink")
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r = replicas.start("solo")
        deadline = time.monotonic() + 120
        while True:  # running, and past start-up: a round was committed
            replicas.check_alive()
            try:
                if metric(r.metrics_port, "icesink_rounds_committed_total") >= 1:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no round committed within 120 s"
            time.sleep(0.5)
        before = collections(r.metrics_port)
        assert set(before) == {"0", "1", "2"}, before
        asyncio.run(produce(broker.bootstrap, "gc-pizzas", pizza_values(n, seed=8), partitions=3))
        wait_rows(catalog, replicas, ("gc.pizzas",), n)
        after = collections(r.metrics_port)
    finally:
        replicas.stop_all()
    ran = {g: after[g] - before[g] for g in before}
    assert ran["2"] == 0, f"full collections while ingesting {n:,} records: {ran}"
    assert ran["0"] <= 5, f"young collections while ingesting {n:,} records: {ran}"
