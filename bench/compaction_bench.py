"""Table maintenance (issue 14): read time of a streamed table before and after compaction.

    .venv/bin/python bench/compaction_bench.py [--files 400] [--rows-per-file 2500]

A benchmark command, not a test: it prints figures. It builds the table a streaming sink leaves
behind (``--files`` small Parquet files, one per append, as short rounds make them; a SQLite
catalog on local files), reads it whole with a pyiceberg scan and with DuckDB's iceberg
extension, then compacts it the way the coordinator does (coordinator/maintenance.py: pyiceberg
reads the small files, a local Spark session writes target-size files, one replace snapshot;
steps of ``maintenance.compaction.max-bytes`` until nothing is due), expires the old snapshots,
and reads it again. Every read is checked against the row count. It prints each read's best of
three, the compaction's time per step, and the files before and after.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from coordinator.maintenance import MaintenanceSettings, compact, expire, live_files
from tests.support import duck
from spark_bridge.rewrite import rewrite_files
from spark_bridge.session import SparkSettings
from spark_bridge.writer import SparkFileWriter

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "store", StringType(), required=False),
                NestedField(3, "price", DoubleType(), required=False))


def best_of(n: int, fn) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def reads(table, rows: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    def py() -> None:
        assert table.scan().to_arrow().num_rows == rows

    location = duck.plain_path(table.metadata_location)

    def dk() -> None:
        with duck.connect(table.io.properties) as con:
            assert con.execute(f"SELECT count(*), sum(price) FROM iceberg_scan('{location}')").fetchone()[0] == rows

    return best_of(3, py), best_of(3, dk)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--rows-per-file", type=int, default=2500)
    ap.add_argument("--target-mb", type=int, default=128)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="compaction-bench-"))
    try:
        catalog = SqlCatalog("b", uri=f"sqlite:///{root}/c.db", warehouse=f"file://{root}/wh")
        catalog.create_namespace("db")
        table = catalog.create_table("db.t", SCHEMA)
        rng = np.random.default_rng(7)
        t0 = time.perf_counter()
        for i in range(args.files):
            n = args.rows_per_file
            table.append(pa.table({
                "id": pa.array(np.arange(i * n, (i + 1) * n), pa.int64()),
                "store": pa.array([f"store-{s}" for s in rng.integers(0, 120, n)]),
                "price": pa.array(rng.random(n) * 30),
            }))
        rows = args.files * args.rows_per_file
        table = catalog.load_table("db.t")
        print(f"table: {rows:,} rows in {len(live_files(table))} files, {len(table.metadata.snapshots)} snapshots "
              f"(built in {time.perf_counter() - t0:.1f} s)")
        py_before, dk_before = reads(table, rows)
        print(f"read before: pyiceberg {py_before:.3f} s, DuckDB {dk_before:.3f} s")

        spark = SparkFileWriter(SparkSettings(master="local[2]", conf={"spark.driver.memory": "2g"},
                                              app_name="compaction-bench", warm_up_rows=0))
        spark.start()
        target = args.target_mb * 1024 * 1024
        s = MaintenanceSettings(min_input_files=16, target_file_size_bytes=target, snapshot_max_age_ms=0,
                                retain_last=1)

        def rewrite(t, files, deletes, prefix):  # type: ignore[no-untyped-def]
            return rewrite_files(spark, t, files, deletes, file_prefix=prefix, target_file_size_bytes=target)

        lock = threading.Lock()
        steps = []
        t0 = time.perf_counter()
        while True:
            t = time.perf_counter()
            out = compact(catalog, "db.t", s, lock, rewrite)
            if out is None:
                break
            steps.append((time.perf_counter() - t, out.files_in, out.files_out, out.bytes_in))
        total = time.perf_counter() - t0
        for i, (secs, fin, fout, b) in enumerate(steps):
            print(f"compaction step {i + 1}: {fin} files ({b / 1e6:.1f} MB) -> {fout} in {secs:.2f} s")
        print(f"compaction: {len(steps)} steps in {total:.2f} s")
        expired = expire(catalog, "db.t", s, lock, {})
        table = catalog.load_table("db.t")
        print(f"expiry: {expired.snapshots} snapshots removed, {expired.files_deleted} files deleted; "
              f"now {len(live_files(table))} files, {len(table.metadata.snapshots)} snapshot")
        py_after, dk_after = reads(table, rows)
        print(f"read after:  pyiceberg {py_after:.3f} s, DuckDB {dk_after:.3f} s")
        print(f"speed-up: pyiceberg {py_before / py_after:.1f}x, DuckDB {dk_before / dk_after:.1f}x")
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
