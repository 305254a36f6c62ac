"""A real write that begins while the warm-up writes: how long it takes when it cancels the
warm-up's write in flight (spark_bridge/warm_up.py) and when it runs beside it (as before).

    .venv/bin/python bench/warm_up_race_bench.py [--rows 100000] [--delays 1,2,3] [--pairs 2]

Each run is a fresh process with its own local Spark session (``local[2]``, the default
warm-up: two writes of 20k rows, then one into 100 files): it starts the warm-up in a thread,
waits ``delay`` seconds after the session started, then writes ``--rows`` pizza orders to a new
unpartitioned table of a SQLite catalog, and prints how long that write took and when the
warm-up ended. "beside" calls the writer's write path without its cancel (the behaviour before
it), "cancel" the public ``write_many``. Runs alternate, "beside" first. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support, as bench/benchlib.py


def one(mode: str, delay: float, rows: int) -> str:
    from icesink.app.pizzas import PIZZA_SCHEMA
    from spark_bridge.session import SparkSettings
    from spark_bridge.writer import DEFAULT_TARGET_FILE_SIZE_BYTES, SparkFileWriter
    from tests.support.tables import pizzas, sqlite_catalog

    tmp = Path(tempfile.mkdtemp(prefix="icesink-bench-race-"))
    writer = SparkFileWriter(SparkSettings(master="local[2]", staging_dir=str(tmp / "staging")))
    writer.start()
    table = sqlite_catalog(tmp).create_table("db.race", schema=PIZZA_SCHEMA)
    data = pizzas(table, rows, seed=1)
    warming = threading.Thread(target=writer.warm_up)
    warming.start()
    time.sleep(delay)
    began = time.monotonic()
    if mode == "beside":  # the write path without the cancel around it
        writer._write_many([(table, data, "r1")], DEFAULT_TARGET_FILE_SIZE_BYTES)
    else:
        writer.write_many([(table, data, "r1")])
    took = time.monotonic() - began
    warming.join()
    ended = time.monotonic() - began
    writer.stop()
    return f"{mode:7s} delay {delay:.1f} s: real write {took:.2f} s, warm-up ended {ended:.2f} s after it began"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--delays", default="1,2,3", help="seconds after the session's start, comma-separated")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("MODE", "DELAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(one(args.one[0], float(args.one[1]), args.rows), flush=True)
        return 0
    for delay in (float(d) for d in args.delays.split(",")):
        for _ in range(args.pairs):
            for mode in ("beside", "cancel"):
                run = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--one", mode, str(delay)],
                                     capture_output=True, text=True, check=False)
                lines = [line for line in run.stdout.splitlines() if "real write" in line]
                print(lines[-1] if lines else f"{mode} delay {delay}: failed\n{run.stderr[-2000:]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
