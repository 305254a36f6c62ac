"""Mirror tables (issue 12): the cost of a round of changed keys against the table's size.

    .venv/bin/python bench/mirror_bench.py [--rows 1000000] [--changed 10000] [--rounds 5]

A benchmark command, not a test: it prints figures. For a table of ``--rows`` rows (format
version 2, a SQLite catalog on local files, written as 100k-row Parquet files), it builds the
key index from the table (coordinator/key_index.py: what a coordinator does after a failover),
then runs ``--rounds`` rounds of ``--changed`` changed keys each (half updates of existing keys,
a quarter deletes, a quarter new keys) through the coordinator's commit of a mirror table
(coordinator/committer.py with coordinator/mirror.py): a worker's response of one data file and
one keys file; the old rows' positions taken from the index, one position delete file written
and committed with the data file in one snapshot, the new rows indexed. It prints the index
build time and memory, each round's time (with ``--trace-memory`` also its peak Python memory,
rounds then run slower), and the time
to read the whole table with a pyiceberg scan and with DuckDB as delete files accumulate. It
runs the same rounds on a table a tenth the size, so the growth with table size shows.
Every read is checked against the expected row count.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.types import LongType, NestedField, StringType

from coordinator import iceberg_ext
from coordinator.committer import RoundCommit, commit_table
from coordinator.iceberg_ext.deletes import WithPositionDeletes, write_position_deletes
from coordinator.mirror import MirrorIndexes
from coordinator.state import Accepted
from tests.support import duck
from icesink.shared.config import load_settings
from icesink.shared.protocol import FileInfo, TopicPartition

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType(), required=False),
                identifier_field_ids=[1])
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"1"}),
                   pa.field("v", pa.string(), metadata={b"PARQUET:field_id": b"2"})])
FILE_ROWS = 100_000


class MirrorAppend(WithPositionDeletes, _FastAppendFiles):
    pass


def commit(table, name: str, data: pa.Table, deletes: pa.Table):
    path = f"{table.location()}/data/{name}.parquet"
    Path(path.removeprefix("file://")).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data.cast(ARROW), path.removeprefix("file://"))
    with table.transaction() as tx:
        update = tx.update_snapshot()
        op = Operation.OVERWRITE if deletes.num_rows else Operation.APPEND
        producer = MirrorAppend(operation=op, transaction=tx, io=update._io, branch=update._branch)
        producer.position_deletes = [write_position_deletes(table, deletes)] if deletes.num_rows else []
        with producer as append:
            append.append_data_file(parquet_file_to_data_file(table.io, table.metadata, path))
    return path


def run(directory: Path, rows: int, changed: int, rounds: int, trace: bool = False) -> None:
    catalog = SqlCatalog("m", uri=f"sqlite:///{directory}/cat.db", warehouse=f"file://{directory}/wh")
    catalog.create_namespace("db")
    table = catalog.create_table("db.mirror", schema=SCHEMA, properties={"format-version": "2"})
    for start in range(0, rows, FILE_ROWS):
        ids = np.arange(start, min(rows, start + FILE_ROWS), dtype=np.int64)
        commit(table, f"load-{start}", pa.table({"id": ids, "v": pa.array(np.char.mod("v%d", ids))}), pa.table({}))
        table = table.refresh()
    settings = load_settings(None, None, {"topics": "cdc", "iceberg.tables": "db.mirror", "iceberg.catalog.type": "sql",
                                          "state.dir": str(directory / "state"), "iceberg.tables.cdc-field": "op",
                                          "iceberg.tables.upsert-mode-enabled": "true",
                                          "iceberg.tables.default-id-columns": "id"})
    mirrors = MirrorIndexes(settings)
    gc.collect()
    tracemalloc.start()
    began = time.perf_counter()
    index = mirrors.take("db.mirror", table, ("id",))  # what a coordinator does after a failover
    build_s = time.perf_counter() - began
    _, peak = tracemalloc.get_traced_memory()
    current = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    mirrors.keep("db.mirror", table.current_snapshot().snapshot_id, index)
    print(f"  table of {rows:,} rows: index of {len(index):,} keys built from the table in {build_s:.2f} s, "
          f"{current / 1e6:.0f} MB held ({peak / 1e6:.0f} MB peak while building)")
    rng = np.random.default_rng(7)
    live = rows
    next_id = rows
    for r in range(rounds):
        n_upd, n_del = changed // 2, changed // 4
        n_new = changed - n_upd - n_del
        existing = rng.choice(np.fromiter(index._where.keys(), dtype=np.int64, count=len(index)), n_upd + n_del, replace=False)
        upd, dele = existing[:n_upd], existing[n_upd:]
        new = np.arange(next_id, next_id + n_new, dtype=np.int64)
        next_id += n_new
        ids = np.concatenate([upd, new])
        data = pa.table({"id": ids, "v": pa.array(np.char.mod(f"r{r}-%d", ids))})
        # what a worker's response brings: the collapsed rows and the keys whose old rows go
        data_path = write(table, f"round-{r}", data.cast(ARROW))
        keys_path = write(table, f"round-{r}-keys", pa.table({"id": np.concatenate([upd, dele])}))
        response = Accepted(
            r + 1, f"r{r}", "w1", (), {"db.mirror": (FileInfo(data_path, data.num_rows, 1, 0),)}, None,
            {"db.mirror": (FileInfo(keys_path, n_upd + n_del, 1, 0),)})
        if trace:
            tracemalloc.start()
        began = time.perf_counter()
        done = commit_table(catalog, "db.mirror", [response], RoundCommit(group="bench", epoch=1, commit_id=f"r{r}",
                            positions={TopicPartition("cdc", 0): r + 1}, valid_through_ms=None), mirrors=mirrors)
        round_s = time.perf_counter() - began
        memory = ""
        if trace:
            memory = f" ({tracemalloc.get_traced_memory()[1] / 1e6:.1f} MB peak Python memory)"
            tracemalloc.stop()
        table = catalog.load_table("db.mirror")
        index = mirrors.take("db.mirror", table, ("id",))  # the kept one: the table did not move
        mirrors.keep("db.mirror", done.snapshot_id, index)
        live += n_new - n_del
        began = time.perf_counter()
        scanned = table.scan().to_arrow().num_rows
        scan_s = time.perf_counter() - began
        began = time.perf_counter()
        with duck.connect() as con:
            counted = con.execute("SELECT count(*) FROM iceberg_scan(?)",
                                  [duck.plain_path(table.metadata_location)]).fetchone()[0]
        duck_s = time.perf_counter() - began
        if scanned != live or counted != live or len(index) != live:
            raise SystemExit(f"expected {live:,} rows, found {scanned:,} (pyiceberg), {counted:,} (DuckDB), "
                             f"{len(index):,} keys indexed")
        print(f"  round {r + 1}: {changed:,} changed keys ({n_upd + n_del:,} rows deleted by position) committed in "
              f"{round_s:.2f} s{memory}; then a full read: pyiceberg {scan_s:.2f} s, DuckDB {duck_s:.2f} s "
              f"({r + 1} delete files)")


def write(table, name: str, data: pa.Table) -> str:
    path = f"{table.location()}/data/{name}.parquet"
    pq.write_table(data, path.removeprefix("file://"))
    return path


def main() -> int:
    iceberg_ext.install()  # as a replica does (coordinator/iceberg_ext/): the committer requires it
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changed", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trace-memory", action="store_true",
                        help="also trace each round's peak Python memory (tracemalloc: rounds run slower)")
    args = parser.parse_args()
    if args.rows < 10 * args.changed:
        parser.error("expected --rows >= 10 x --changed")
    for rows in (args.rows // 10, args.rows):
        directory = Path(tempfile.mkdtemp(prefix="icesink-mirror-"))
        try:
            run(directory, rows, args.changed, args.rounds, args.trace_memory)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
