"""SparkFileWriter against a Spark standalone cluster (``spark.master = spark://host:port``).

The README lets ``spark.master`` be a master URL, not only ``local[*]``: here the write tasks run
in an executor process the worker starts, not in this process's driver JVM. Master and worker
come from the pyspark wheel on free loopback ports; the warehouse is a local directory, which the
executor (same host) writes to directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from tests.support import duck
from spark_bridge.session import SparkSettings
from spark_bridge.writer import SparkFileWriter
from tests.support.spark_cluster import SparkStandalone, stop_classic_spark
from tests.support.tables import (
    assert_same_rows,
    commit,
    create_pizza_table,
    file_partition_counts,
    files_under,
    local_path,
    pizza_partition_counts,
    pizzas,
    sqlite_catalog,
)

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::FutureWarning")]

APP_NAME = "icesink-standalone-test"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    spark = SparkStandalone(tmp_path_factory.mktemp("standalone"))
    try:
        spark.start()
        yield spark
    finally:
        spark.stop()


@pytest.fixture(scope="module")
def standalone_writer(cluster: SparkStandalone) -> Iterator[SparkFileWriter]:
    # One SparkContext per JVM, and getOrCreate would hand back a live local session whatever the
    # master: stop any session another module left (their fixtures stop theirs; stop is idempotent).
    stop_classic_spark()
    writer = SparkFileWriter(
        SparkSettings(
            master=cluster.url,
            app_name=APP_NAME,
            conf={
                # The executor connects back to the driver: on this host, at loopback.
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.memory": "512m",
            },
        )
    )
    writer.start()
    try:
        yield writer
    finally:
        writer.stop()


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    return sqlite_catalog(tmp_path)


def test_standalone_cluster_writes_committable_files(
    cluster: SparkStandalone, standalone_writer: SparkFileWriter, catalog: SqlCatalog
) -> None:
    spark = standalone_writer.spark
    assert spark.sparkContext.master == cluster.url  # not a reused local session

    table = create_pizza_table(catalog, "db.standalone_pizzas")
    data = pizzas(table, 5_000, seed=11)
    files = standalone_writer.write(table, data, file_prefix="standalone-1/worker-a")

    # The cluster ran the job: our application holds an executor on the worker.
    state = cluster.master_state()
    assert state is not None
    apps = [a for a in state["activeapps"] if a["name"] == APP_NAME]
    assert len(apps) == 1, state["activeapps"]
    assert apps[0]["cores"] == 1
    executor_dirs = list((cluster.work_dir / apps[0]["id"]).iterdir())
    assert executor_dirs, f"no executor directory for {apps[0]['id']}:\n{cluster.logs()}"

    # One file per partition tuple, field ids in the footers, nothing but Parquet files written.
    expected = pizza_partition_counts(data.to_pylist())
    assert any(None in t for t in expected)  # null partitions are exercised
    assert file_partition_counts(files) == expected
    written = files_under(local_path(table.location()) + "/data/standalone-1/worker-a")
    assert len(written) == len(files)
    assert all(name.endswith(".parquet") for name in written), written
    footer = pq.read_schema(local_path(files[0].file_path))
    assert [int(f.metadata[b"PARQUET:field_id"]) for f in footer] == list(range(1, 8))

    for f in files:  # each file holds exactly the rows of its partition tuple
        rows = pq.read_table(local_path(f.file_path), columns=["store_id", "date_ordered"]).to_pylist()
        assert set(pizza_partition_counts(rows)) == {(f.partition[0], f.partition[1])}

    table = commit(table, files, "standalone-c-1")
    assert_same_rows(table.scan().to_arrow(), data, "order_id")
    # DuckDB reads the committed table back: every row, once, in its partition.
    assert duck.count_and_distinct(table.metadata_location, "order_id") == (5_000, 5_000)
    assert pizza_partition_counts(duck.scan_rows(table.metadata_location)) == expected
