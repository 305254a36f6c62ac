"""The tutorial's deployment shape: an Iceberg REST catalog whose tables live on S3.

SeaweedFS serves both (S3 plus a REST catalog over an S3 table bucket, which assigns every table
an ``s3://`` location). Spark here has no hadoop-aws jars, so workers stage: Spark writes each
batch under ``state.dir``, and the files are uploaded with the table's FileIO before they are
announced. Two worker processes ingest through the REST catalog; DuckDB (httpfs, reading S3)
must find every record exactly once, and every data file must be an ``s3://`` object.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

TOPIC = "rest-pizzas"
TABLE = "rpc.pizzas"


@pytest.fixture
def seaweed(tmp_path: Path):
    from tests.support.seaweed import SeaweedS3

    s3 = SeaweedS3(tmp_path / "seaweed", "unused", table_bucket="warehouse")
    s3.start()
    try:
        yield s3
    finally:
        s3.stop()


@pytest.mark.timeout(600)
def test_rest_catalog_with_s3_tables_exact(seaweed, broker, tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, total_rows, wait_rows, write_config

    props = seaweed.rest_catalog_props()
    catalog = load_catalog("it", **props)
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 6))
    cfg = write_config(
        tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap, catalog_props=props,
        state_dir=tmp_path / "state", group="rest-sink",
        **{"iceberg.table.rpc.pizzas.partition-by": "bucket(store_id, 4)"},
    )
    values = pizza_values(20_000, seed=21)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("r1")
        replicas.start("r2")
        asyncio.run(produce(broker.bootstrap, TOPIC, values, partitions=6))
        wait_rows(catalog, replicas, (TABLE,), 20_000, timeout_s=420)
        assert total_rows(catalog, TABLE) == 20_000
    finally:
        replicas.stop_all()

    table = catalog.load_table(TABLE)
    assert table.location().startswith("s3://warehouse/"), table.location()
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert files and all(f.startswith(f"{table.location()}/data/") for f in files), files[:3]
    assert_exact(catalog, TABLE, keys)  # DuckDB over httpfs
    # Nothing left behind in the staging directories once the workers stopped cleanly.
    staged = [p for p in (tmp_path / "state" / "staging").rglob("*") if p.is_file() and p.name != ".icesink-staging"]
    assert staged == [], staged[:5]
