"""Many new dynamic tables at once, in process, on a real SQLite catalog:
``python bench/new_tables_bench.py [--tables 200] [--repeat 3] [--dir /tmp]``.

1. Creation: ``--tables`` tables made from one inferred schema, one after another
   (``agents.tables.create_target``, what a fetch naming one new table does) against together
   (``create_targets``: one transaction, the namespace read once), alternating, each in a new
   catalog; CPU seconds and wall time of each.
2. First fetches: the worker's ``Ingest.on_fetch`` (agents/ingest.py) given fetches of pizza
   events routed round robin to 50 new tables each (as ``ingest_bench.py --tables`` routes them):
   each fetch looks its tables up, creates them together and decodes them together; CPU seconds
   and wall time for ``--tables`` new tables, and per table.

Nothing is asserted; the figures depend on the machine and its file system (``--dir``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyiceberg.io.pyarrow import schema_to_pyarrow

from agents.kafka import Fetched
from agents.tables import create_target, create_targets
from coordinator import iceberg_ext
from icesink.app.pizzas import PIZZA_SCHEMA, pizza_values
from icesink.shared.catalogs import sql_catalog_class, sqlite_catalog_properties
from icesink.shared.config import build
from icesink.shared.offload import Offload
from tests.unit.test_backpressure import P, make_parts

PER_FETCH = 50  # new tables a fetch names (ingest_bench --tables 200 on 4 partitions: 50 each)
RECORDS_PER_FETCH = 10_000


def catalog(directory: str) -> Any:
    c = sql_catalog_class()("bench", **sqlite_catalog_properties(tempfile.mkdtemp(dir=directory)))
    c.create_namespace("db")
    return c


def creation(directory: str, tables: int, together: bool) -> tuple[float, float]:
    settings = build({"topics": "t", "iceberg.tables": "db.a", "iceberg.tables.auto-create-enabled": "true"})
    schema = schema_to_pyarrow(PIZZA_SCHEMA)
    c = catalog(directory)
    for i in range(10):  # warm
        create_target(c, settings, f"db.w{i}", schema)
    cpu, wall = time.process_time(), time.perf_counter()
    if together:
        create_targets(c, settings, {f"db.t{i}": schema for i in range(tables)})
    else:
        for i in range(tables):
            create_target(c, settings, f"db.t{i}", schema)
    return time.process_time() - cpu, time.perf_counter() - wall


def first_fetches(directory: str, tables: int) -> tuple[float, float]:
    settings = build({"topics": P.topic, "iceberg.tables": "", "iceberg.tables.dynamic-enabled": "true",
                      "iceberg.tables.route-field": "tbl", "iceberg.tables.auto-create-enabled": "true"})
    c = catalog(directory)
    w = make_parts(1 << 30, settings=settings, targets={}, offload=Offload(threads=8))
    w.tables.attach(c)
    values = pizza_values(RECORDS_PER_FETCH)

    def fetch(prefix: str, start: int) -> Fetched:
        return Fetched({P: [SimpleNamespace(
            topic=P.topic, partition=P.partition, offset=start + o, timestamp=None, key=None, headers=(),
            value=v[:-1] + b',"tbl":"db.%s%03d"}' % (prefix.encode(), o % PER_FETCH),
        ) for o, v in enumerate(values)]}, time.monotonic())

    asyncio.run(w.ingest.on_fetch(fetch("warm", 0)))
    fetches = [fetch(f"f{k}_", RECORDS_PER_FETCH * (k + 1)) for k in range(max(1, tables // PER_FETCH))]
    cpu, wall = time.process_time(), time.perf_counter()
    for f in fetches:
        asyncio.run(w.ingest.on_fetch(f))
    assert not w.failures, w.failures
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the catalogs go (default: the temp directory)")
    args = parser.parse_args()
    iceberg_ext.install()
    directory = args.dir or tempfile.gettempdir()
    print(f"{args.tables} new tables, catalogs in {directory}")
    for _ in range(args.repeat):
        for together in (False, True):
            cpu, wall = creation(directory, args.tables, together)
            print(f"  creation {'together  ' if together else 'one by one'}: {cpu:.3f} CPU-s, {wall:.3f} s "
                  f"({cpu / args.tables * 1e3:.2f} ms CPU per table)")
    n = max(1, args.tables // PER_FETCH) * PER_FETCH
    for _ in range(args.repeat):
        cpu, wall = first_fetches(directory, args.tables)
        print(f"  first fetches ({n // PER_FETCH} of {RECORDS_PER_FETCH:,} records, {PER_FETCH} new tables each): "
              f"{cpu:.3f} CPU-s, {wall:.3f} s ({cpu / n * 1e3:.2f} ms CPU per new table)")


if __name__ == "__main__":
    main()
