"""Pizza tables for the Spark bridge tests: generated orders, committing DataFiles, checking files and rows."""

from __future__ import annotations

import datetime as dt
import os
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, DayTransform
from pyiceberg.types import LongType, TimestampType

from coordinator.iceberg_ext.catalogs import SqlCatalog
from icesink.app.pizzas import PIZZA_SCHEMA
from icesink.shared.partitioning import build_partition_spec, parse_partition_by

#: The partitioning of pizza tables: both transforms, with null partition values.
PIZZA_PARTITION_BY = "day(date_ordered), bucket(store_id, 8)"
pizza_day = DayTransform().transform(TimestampType())
pizza_bucket = BucketTransform(8).transform(LongType())


def sqlite_catalog(directory: Path) -> SqlCatalog:
    """A fresh SQLite SQL catalog (icesink's, as the sink uses) with namespace ``db``, its warehouse
    under ``directory``."""
    cat = SqlCatalog("t", uri=f"sqlite:///{directory}/catalog.db", warehouse=f"file://{directory}/wh")
    cat.create_namespace("db")
    return cat


def create_pizza_table(catalog: Catalog, identifier: str) -> Table:
    """A table of PIZZA_SCHEMA partitioned by PIZZA_PARTITION_BY."""
    spec = build_partition_spec(parse_partition_by(PIZZA_PARTITION_BY), PIZZA_SCHEMA)
    return catalog.create_table(identifier, schema=PIZZA_SCHEMA, partition_spec=spec)


def pizzas(table: Table, n: int, *, seed: int, start: int = 0) -> pa.Table:
    """n pizza orders over three days and 50 stores; about 1% null store_id / date_ordered."""
    rnd = random.Random(seed)
    base = dt.datetime(2024, 1, 1)

    def maybe_null(value: Any) -> Any:
        return None if rnd.random() < 0.01 else value

    return pa.Table.from_pydict(
        {
            "order_id": [f"order-{start + i:08d}" for i in range(n)],
            "store_id": [maybe_null(rnd.randrange(50)) for _ in range(n)],
            "sauce": [rnd.choice(["tomato", "bbq", "white", "pesto"]) for _ in range(n)],
            "cheese": [rnd.choice(["mozzarella", "cheddar", "vegan"]) for _ in range(n)],
            "meats": [rnd.choice(["ham", "pepperoni", "sausage", None]) for _ in range(n)],
            "veggies": [rnd.choice(["onion", "pepper", "olive", "mushroom"]) for _ in range(n)],
            "date_ordered": [
                maybe_null(base + dt.timedelta(microseconds=rnd.randrange(3 * 86_400_000_000))) for _ in range(n)
            ],
        },
        schema=schema_to_pyarrow(table.schema()),
    )


def pizza_partition_counts(rows: Iterable[Mapping[str, Any]]) -> Counter[tuple[Any, ...]]:
    """Rows per (day, bucket) partition tuple, as Iceberg stores the tuple."""
    return Counter((pizza_day(r["date_ordered"]), pizza_bucket(r["store_id"])) for r in rows)


def file_partition_counts(files: Iterable[DataFile]) -> Counter[tuple[Any, ...]]:
    """Records per partition tuple of two-field DataFiles; also checks there is one file per tuple."""
    counts = Counter({(f.partition[0], f.partition[1]): f.record_count for f in files})
    assert sum(counts.values()) == sum(f.record_count for f in files), "two files share a partition tuple"
    return counts


def commit(table: Table, files: list[DataFile], commit_id: str) -> Table:
    with (
        table.transaction() as tx,
        tx.update_snapshot(snapshot_properties={"icesink.commit-id": commit_id}).fast_append() as append,
    ):
        for data_file in files:
            append.append_data_file(data_file)
    return table.refresh()


def local_path(uri: str) -> str:
    assert uri.startswith("file://"), uri
    return urlparse(uri).path


def files_under(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def assert_same_rows(actual: pa.Table, expected: pa.Table, key: str) -> None:
    actual = actual.select(expected.column_names).sort_by(key)
    expected = expected.sort_by(key)
    assert actual.num_rows == expected.num_rows
    for name in expected.column_names:
        assert actual.column(name).to_pylist() == expected.column(name).to_pylist(), name
