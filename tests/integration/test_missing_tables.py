"""A table that is missing when a worker loads it, with real processes (Tansu, Faust + Spark
workers, a SQLite catalog), every table read back by DuckDB (exact count and key set):

- without auto-create, a replica that starts while another writer has dropped one of two
  tables (the group has run) waits for it: it does not exit, it holds back the partition whose
  records go to that table, shows it in /status and a metric, and the other table keeps
  committing; once the table is back (same schema, spec and location) both tables are exact;
- with auto-create, a table dropped mid-run is created again by a starting replica from its
  records, and the rounds held for it (parked) commit into it: no duplicate, no gap.

Records with ``dest`` "a" go to mt.a, "b" to mt.b (route-regex); record ``i`` goes to source
partition ``i % 2``, so partition 0 holds only a's records and partition 1 only b's.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_round_commits import wait_for

pytestmark = pytest.mark.integration


def _values(n: int, seed: int) -> list[bytes]:
    from icesink.app.pizzas import pizza_values

    out = []
    for i, v in enumerate(pizza_values(n, seed=seed)):
        row = json.loads(v)
        row["dest"] = "a" if i % 2 == 0 else "b"
        out.append(json.dumps(row).encode())
    return out


def _keys(values: list[bytes], dest: str) -> set[str]:
    return {row["order_id"] for row in map(json.loads, values) if row["dest"] == dest}


def _setup(broker: Any, catalog_props: dict[str, str], tmp_path: Path, ns: str, **extra: Any) -> tuple[Any, str, Path]:
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import write_config

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace(ns)
    topic = f"{ns}-orders"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=f"{ns}.a,{ns}.b", bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group=f"{ns}-sink",
        **{"iceberg.tables.route-field": "dest", f"iceberg.table.{ns}.a.route-regex": "a",
           f"iceberg.table.{ns}.b.route-regex": "b", "iceberg.control.commit.park-after-ms": 4000, **extra})
    return catalog, topic, cfg


def _run_then_drop(broker: Any, catalog: Any, replicas: Any, topic: str, values: list[bytes], name: str,
                   ns: str) -> Any:
    """Start replica ``name``, commit the first 1000 records to both tables, drop ``ns.b`` (as
    another writer would: the running replica keeps writing its files, parked), send the next
    1000 and wait for ``ns.a`` to hold its rows of them; the table as it was before the drop."""
    from icesink.app.pizzas import produce
    from tests.support.sinkrun import wait_rows, wait_up

    a, b = f"{ns}.a", f"{ns}.b"
    replicas.start(name)
    wait_up(replicas)
    asyncio.run(produce(broker.bootstrap, topic, values[:1000], partitions=2))
    wait_rows(catalog, replicas, (a, b), 500, timeout_s=240)
    dropped = catalog.load_table(b)
    catalog.drop_table(b)
    asyncio.run(produce(broker.bootstrap, topic, values[1000:2000], partitions=2))
    wait_rows(catalog, replicas, (a,), 1000, timeout_s=120)
    return dropped


def _missing_status(replicas: Any) -> dict[str, Any]:
    from tests.support.sinkrun import http_json

    out: dict[str, Any] = {}
    for r in list(replicas.replicas.values()):
        try:
            out.update(http_json(r.metrics_port).get("missing_tables") or {})
        except OSError:
            continue
    return out


@pytest.mark.timeout(900)
def test_a_replica_started_while_a_table_is_dropped_waits_for_it_and_every_table_ends_exact(
        broker, catalog_props, tmp_path):
    from icesink.app.pizzas import PIZZA_SCHEMA, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, metric, total_rows, wait_rows, wait_up

    catalog, topic, cfg = _setup(broker, catalog_props, tmp_path, "mt",
                                 **{"iceberg.tables.auto-create-enabled": "false"})
    a, b = "mt.a", "mt.b"
    for name in (a, b):
        catalog.create_table(name, schema=PIZZA_SCHEMA)
    values = _values(4000, seed=41)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        dropped = _run_then_drop(broker, catalog, replicas, topic, values, "m1", "mt")
        schema, spec, location = dropped.schema(), dropped.spec(), dropped.location()

        # The replica restarts while b is gone: it loads a, finds b missing, and must neither
        # exit (it did, with exit code 2: "create table mt.b before starting") nor skip b's records.
        assert replicas.stop("m1") == 0
        replicas.start("m2")
        wait_up(replicas)
        asyncio.run(produce(broker.bootstrap, topic, values[2000:3000], partitions=2))
        wait_rows(catalog, replicas, (a,), 1500, timeout_s=240)  # a goes on meanwhile
        wait_for("b shown missing", lambda: b in _missing_status(replicas), 60, replicas)
        missing = _missing_status(replicas)[b]
        assert missing["held_partitions"] == [f"{topic}[1]"], missing
        port = replicas.replicas["m2"].metrics_port
        assert metric(port, f'icesink_table_missing{{table="{b}"}}') == 1
        assert metric(port, f'icesink_table_missing{{table="{a}"}}') == 0
        time.sleep(4)
        replicas.check_alive()

        # Back with the same schema, spec and location: the held partition resumes, the held
        # rounds commit, once.
        catalog.create_table(b, schema=schema, partition_spec=spec, location=location)
        asyncio.run(produce(broker.bootstrap, topic, values[3000:], partitions=2))
        wait_rows(catalog, replicas, (a, b), {a: 2000, b: 1500}, timeout_s=240)
        wait_for("b no longer missing", lambda: not _missing_status(replicas), 60, replicas)
        assert metric(port, f'icesink_table_missing{{table="{b}"}}') == 0
        time.sleep(5)  # a few more rounds: nothing may be added twice
        assert total_rows(catalog, a) == 2000 and total_rows(catalog, b) == 1500
    finally:
        replicas.stop_all()
    assert_exact(catalog, a, _keys(values, "a"))
    assert_exact(catalog, b, _keys(values[1000:], "b"))  # the rows of before the drop went with it


@pytest.mark.timeout(900)
def test_a_dropped_table_created_again_by_a_starting_replica_ends_exact(broker, catalog_props, tmp_path):
    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, coordinator_status, total_rows, wait_rows, wait_up

    catalog, topic, cfg = _setup(broker, catalog_props, tmp_path, "mc")  # auto-create (the fast config's default)
    a, b = "mc.a", "mc.b"
    values = _values(3000, seed=42)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        _run_then_drop(broker, catalog, replicas, topic, values, "c1", "mc")
        wait_for("b parked", lambda: b in ((coordinator_status(replicas) or (None, {}))[1].get("parked") or {}),
                 60, replicas)

        # A replica that starts now creates b again from its records (the catalog's default
        # location: where the held files are); the held rounds commit into it.
        assert replicas.stop("c1") == 0
        replicas.start("c2")
        wait_up(replicas)
        asyncio.run(produce(broker.bootstrap, topic, values[2000:], partitions=2))
        wait_rows(catalog, replicas, (a, b), {a: 1500, b: 1000}, timeout_s=240)
        wait_for("b no longer parked", lambda: not ((coordinator_status(replicas) or (None, {}))[1].get("parked")),
                 60, replicas)
        time.sleep(5)
        assert total_rows(catalog, a) == 1500 and total_rows(catalog, b) == 1000
    finally:
        replicas.stop_all()
    assert_exact(catalog, a, _keys(values, "a"))
    assert_exact(catalog, b, _keys(values[1000:], "b"))


@pytest.mark.timeout(900)
def test_held_files_are_not_committed_into_a_table_created_again_with_its_columns_numbered_anew(
        broker, catalog_props, tmp_path):
    """b is dropped, then created again at its location with its columns in another order (so
    other field ids, as auto-create from other records numbers them): the files held for it
    were written with the old ids, and committed they would be read as other columns. It stays
    parked, saying so; created again with the schema the files were written with, they commit."""
    import pyarrow as pa

    from icesink.app.pizzas import PIZZA_SCHEMA
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, coordinator_status, total_rows, wait_rows

    catalog, topic, cfg = _setup(broker, catalog_props, tmp_path, "mf",
                                 **{"iceberg.tables.auto-create-enabled": "false"})
    a, b = "mf.a", "mf.b"
    for name in (a, b):
        catalog.create_table(name, schema=PIZZA_SCHEMA)
    values = _values(2000, seed=43)
    replicas = ReplicaSet(cfg, tmp_path / "logs")

    def parked_error() -> str:
        return str(((coordinator_status(replicas) or (None, {}))[1].get("parked") or {}).get(b, {}).get("error"))

    try:
        dropped = _run_then_drop(broker, catalog, replicas, topic, values, "f1", "mf")
        schema, spec, location = dropped.schema(), dropped.spec(), dropped.location()
        arrow = schema.as_arrow()
        reordered = pa.schema([arrow.field(i).remove_metadata() for i in reversed(range(len(arrow)))])
        catalog.create_table(b, schema=reordered, location=location)
        wait_for("b parked for its field ids", lambda: "field id" in parked_error(), 120, replicas)
        assert catalog.load_table(b).current_snapshot() is None, "held files committed under other field ids"

        catalog.drop_table(b)
        catalog.create_table(b, schema=schema, partition_spec=spec, location=location)
        wait_rows(catalog, replicas, (b,), 500, timeout_s=240)
        time.sleep(4)
        assert total_rows(catalog, b) == 500
    finally:
        replicas.stop_all()
    assert_exact(catalog, a, _keys(values, "a"))
    assert_exact(catalog, b, _keys(values[1000:], "b"))


@pytest.mark.timeout(600)
def test_a_new_dynamic_route_without_auto_create_is_refused_not_held_once_the_group_has_run(
        broker, catalog_props, tmp_path):
    """Dynamic routing without auto-create: once the group has committed to md.a, a record for
    md.new (a table that never existed) stops the replica naming the setting, as on a first
    start; it is not waited for as a dropped table (its partition held for ever)."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import PIZZA_SCHEMA, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import wait_rows, wait_up, write_config

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("md")
    catalog.create_table("md.a", schema=PIZZA_SCHEMA)
    topic = "md-orders"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables="", bootstrap=broker.bootstrap, catalog_props=catalog_props,
        state_dir=tmp_path / "state", group="md-sink",
        **{"iceberg.tables.route-field": "dest", "iceberg.tables.dynamic-enabled": "true",
           "iceberg.tables.auto-create-enabled": "false"})
    values = [json.dumps({**json.loads(v), "dest": "md.a"}).encode() for v in _values(200, seed=44)]
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r = replicas.start("d1")
        wait_up(replicas)
        asyncio.run(produce(broker.bootstrap, topic, values, partitions=1))
        wait_rows(catalog, replicas, ("md.a",), 200, timeout_s=240)
        new = [json.dumps({**json.loads(values[0]), "dest": "md.new"}).encode()]
        asyncio.run(produce(broker.bootstrap, topic, new, partitions=1))
        deadline = time.monotonic() + 120
        while r.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        log = r.log_path.read_text(errors="replace")
        assert r.proc.poll() == 2, f"expected exit code 2, found {r.proc.poll()}: {_missing_status(replicas)}\n{log[-3000:]}"
        assert "iceberg.tables.auto-create-enabled" in log and "create table md.new" in log
    finally:
        replicas.stop_all()
