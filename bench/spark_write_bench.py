"""Measure SparkFileWriter throughput: ``python bench/spark_write_bench.py [--rows N] [--remote sc://...]``.

Creates a throw-away SQLite catalog, writes one cold batch of pizza orders (JVM warm-up), then
``--repeat`` warm batches, and prints rows/s of each, with the CPU seconds used (local mode) and,
as a yardstick from the same run, pyarrow writing the same rows to one Parquet file. Partitioned like the demo table
(``day(date_ordered), bucket(store_id, 8)``) unless ``--partition-by ''``. ``--tables K`` splits each batch over K unpartitioned
tables written by one ``write_many`` (a round routed to many dynamic tables). Nothing is asserted:
the figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table

from icesink.app.pizzas import PIZZA_SCHEMA
from icesink.shared.partitioning import build_partition_spec, parse_partition_by
from spark_bridge.session import SparkSettings
from spark_bridge.writer import SparkFileWriter



def pizzas(table: Table, n: int, offset: int, rng: np.random.Generator) -> pa.Table:
    def pick(choices: list[str]) -> pa.Array:
        return pa.array(np.array(choices, dtype=object)[rng.integers(0, len(choices), n)], pa.large_string())

    return pa.table(
        {
            "order_id": pa.array([f"order-{offset + i:012d}" for i in range(n)], pa.large_string()),
            "store_id": pa.array(rng.integers(0, 50, n), pa.int64()),
            "sauce": pick(["tomato", "bbq", "white", "pesto"]),
            "cheese": pick(["mozzarella", "cheddar", "vegan"]),
            "meats": pick(["ham", "pepperoni", "sausage", "bacon"]),
            "veggies": pick(["onion", "pepper", "olive", "mushroom"]),
            "date_ordered": pa.array(1_704_067_200_000_000 + rng.integers(0, 3 * 86_400 * 10**6, n), pa.int64()).cast(
                pa.timestamp("us")
            ),
        }
    ).cast(schema_to_pyarrow(table.schema()))


def _jvm_cpu_seconds(writer: SparkFileWriter) -> float | None:
    """CPU seconds used so far by the local driver JVM (Linux), or None (remote, other OS)."""
    try:
        proc = writer.spark.sparkContext._gateway.proc  # type: ignore[union-attr]
        with open(f"/proc/{proc.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except Exception:
        return None


def _cpu_seconds(writer: SparkFileWriter) -> float | None:
    jvm = _jvm_cpu_seconds(writer)
    if jvm is None:
        return None
    own = os.times()
    return jvm + own.user + own.system


def main() -> None:
    parser = argparse.ArgumentParser(description="Measure SparkFileWriter throughput.")
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--remote", default=None, help="Spark Connect URL sc://host:port")
    parser.add_argument("--partition-by", default="day(date_ordered), bucket(store_id, 8)")
    parser.add_argument("--conf", action="append", default=[], help="extra spark conf key=value")
    parser.add_argument("--tables", type=int, default=1,
                        help="split each batch over this many unpartitioned tables, written at once (write_many), "
                             "as a round routed to many dynamic tables is")
    parser.add_argument("--codec", default=None,
                        help="the tables' write.parquet.compression-codec (default: the writer's, zstd)")
    parser.add_argument("--warm-up-rows", type=int, default=0,
                        help="run the worker's start-up warm-up (write.warm-up-rows) before the first write")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="spark-bridge-bench-") as tmp:
        catalog = SqlCatalog("bench", uri=f"sqlite:///{tmp}/catalog.db", warehouse=f"file://{tmp}/wh")
        catalog.create_namespace("db")
        spec = build_partition_spec(parse_partition_by(args.partition_by), PIZZA_SCHEMA)
        properties = {} if args.codec is None else {"write.parquet.compression-codec": args.codec}
        table = catalog.create_table("db.pizzas", schema=PIZZA_SCHEMA, partition_spec=spec, properties=properties)
        many = [catalog.create_table(f"db.t{k:03d}", schema=PIZZA_SCHEMA, properties=properties)
                for k in range(args.tables)] \
            if args.tables > 1 else []
        conf = dict(item.split("=", 1) for item in args.conf)
        writer = SparkFileWriter(SparkSettings(master=args.master, remote=args.remote, conf=conf,
                                               warm_up_rows=args.warm_up_rows))
        started = time.perf_counter()
        writer.start()
        print(f"session start: {time.perf_counter() - started:.1f} s")
        if args.warm_up_rows:
            cpu_before, started = _cpu_seconds(writer), time.perf_counter()
            writer.warm_up()
            cpu_after = _cpu_seconds(writer)
            cpu = "" if cpu_before is None or cpu_after is None else f", {cpu_after - cpu_before:.1f} CPU s"
            print(f"warm-up ({args.warm_up_rows:,} rows): {time.perf_counter() - started:.1f} s{cpu}")
        rng = np.random.default_rng(1)
        try:
            for i in range(args.repeat + 1):
                data = pizzas(table, args.rows, i * args.rows, rng)
                cpu_before = _cpu_seconds(writer)
                started = time.perf_counter()
                if many:
                    per = -(-args.rows // len(many))
                    files = [f for fs in writer.write_many(
                        [(t, data.slice(k * per, per), f"bench-{i}") for k, t in enumerate(many)]) for f in fs]
                else:
                    files = writer.write(table, data, file_prefix=f"bench-{i}")
                elapsed = time.perf_counter() - started
                cpu_after = _cpu_seconds(writer)
                label = ("first" if args.warm_up_rows else "cold") if i == 0 else "warm"
                # Reference measured in the same run: pyarrow writing the same rows to one file.
                started = time.perf_counter()
                pq.write_table(data, f"{tmp}/reference.parquet", compression="zstd")
                reference = args.rows / (time.perf_counter() - started)
                cpu = (
                    ""
                    if cpu_before is None or cpu_after is None
                    else f", {cpu_after - cpu_before:.1f} CPU s (JVM + Python)"
                )
                print(
                    f"{label} write: {args.rows:,} rows ({data.nbytes / 1e6:.0f} MB Arrow) in {elapsed:.2f} s "
                    f"= {args.rows / elapsed:,.0f} rows/s{cpu}, {len(files)} files, "
                    f"{sum(f.file_size_in_bytes for f in files) / 1e6:.1f} MB Parquet; "
                    f"pyarrow to one file: {reference:,.0f} rows/s ({args.rows / elapsed / reference:.1%})"
                )
        finally:
            writer.stop()


if __name__ == "__main__":
    main()
