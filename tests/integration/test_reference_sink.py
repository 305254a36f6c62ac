"""The reference sink beside icesink: Apache Kafka Connect running the Apache Iceberg Kafka
Connect sink (tests/support/kafka_connect.py; jars from Maven Central) and one icesink replica
sink the same topic of a real Kafka broker into one PostgreSQL database, Iceberg's JDBC catalog
and pyiceberg's SQL catalog sharing its ``iceberg_tables`` (told apart by the catalog name).
Both tables are read back exact by pyiceberg and by DuckDB.

Marked ``reference``: not in the default suite (a Connect JVM, about a minute);
``./dev test -m reference`` runs it. bench/versus_reference.py measures the same pair.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.reference]

TOPIC = "ref-pizzas"
TABLE = "versus.pizzas"
RECORDS = 3000


def _order_ids(catalog: Any, table: str) -> Counter[str]:
    """``order_id`` of every row, read by pyiceberg."""
    scanned = catalog.load_table(table).scan(selected_fields=("order_id",)).to_arrow()
    return Counter(scanned["order_id"].to_pylist())


def _wait_rows(catalogs: dict[str, Any], want: int, alive: Any, timeout_s: float = 300.0) -> None:
    """Until ``TABLE`` holds ``want`` rows in every catalog; ``alive()`` raises if a sink died."""
    from icesink.shared.iceberg import total_rows

    seen: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive()
        seen = {name: total_rows(cat, TABLE) for name, cat in catalogs.items()}
        if all(n >= want for n in seen.values()):
            return
        time.sleep(1)
    raise AssertionError(f"expected {want} rows in each catalog, found {seen}")


@pytest.mark.timeout(600)
def test_reference_and_icesink_sink_one_topic_exactly_into_one_postgres_catalog(
        kafka: Any, postgres: Any, tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog
    from sqlalchemy import create_engine, text

    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet, write_fast_config
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.kafka_connect import KafkaConnect, iceberg_sink_config, jdbc_catalog
    from tests.support.sinkrun import assert_exact

    # pyiceberg creates the catalog's tables first (its layout); Iceberg's JDBC catalog uses them.
    catalogs = {name: load_catalog(name, type="sql", uri=postgres.uri) for name in ("ref", "ice")}
    values = pizza_values(RECORDS, seed=35)
    keys = {json.loads(v)["order_id"] for v in values}

    async def topics() -> None:
        await ensure_topic(kafka.bootstrap, TOPIC, 3)
        for control in ("ref-control", "ice-control"):
            await ensure_topic(kafka.bootstrap, control, 1)
        await produce(kafka.bootstrap, TOPIC, values, partitions=3)

    asyncio.run(topics())
    reference = KafkaConnect(
        tmp_path / "connect", kafka.bootstrap,
        iceberg_sink_config("ref", TOPIC, jdbc_catalog("ref", "127.0.0.1", postgres.port, "icesink",
                                                       tmp_path / "wh-ref"),
                            tables=TABLE, interval_ms=2000, control_topic="ref-control"),
        worker={"offset.flush.interval.ms": "500"})
    config = write_fast_config(
        tmp_path / "ice.json", topics=TOPIC, tables=TABLE, bootstrap=kafka.bootstrap, catalog_name="ice",
        catalog_props={"type": "sql", "uri": postgres.uri, "warehouse": f"file://{tmp_path / 'wh-ice'}"},
        state_dir=tmp_path / "state", group="ice", **{"iceberg.control.topic.replication-factor": 1})
    replicas = ReplicaSet(config, tmp_path / "logs")

    def alive() -> None:
        replicas.check_alive()
        if not reference.running:
            raise AssertionError(f"Kafka Connect exited:\n{reference.log_tail()}")

    with reference:  # returns once the connector and its task are RUNNING
        replicas.start("r1")
        try:
            _wait_rows(catalogs, RECORDS, alive)
        finally:
            replicas.stop_all()

    with create_engine(postgres.uri).connect() as conn:
        rows = conn.execute(text("SELECT catalog_name, table_namespace, table_name FROM iceberg_tables")).fetchall()
    assert sorted(tuple(r) for r in rows) == [("ice", "versus", "pizzas"), ("ref", "versus", "pizzas")]
    for name, catalog in catalogs.items():
        ids = _order_ids(catalog, TABLE)
        assert set(ids) == keys and max(ids.values()) == 1, (
            f"{name}: {sum(ids.values())} rows for {len(keys)} keys (pyiceberg)")
        assert_exact(catalog, TABLE, keys)  # DuckDB
