"""Soak / chaos command: real replicas, random SIGKILL/SIGTERM and restarts, then an exact check.

    .venv/bin/python bench/chaos.py --minutes 15 --records 1000000 --replicas 3 --kill-every 5:15

Starts its own embedded broker and SQLite catalog (or uses --bootstrap / a catalog under
--workdir), and prints the faults injected, records produced, rows found, duplicates and
missing keys per table. Exit code 0 only if every table is exact.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.chaos import run_chaos
from icesink.shared.catalogs import sqlite_catalog_properties
from icesink.app.embedded import EmbeddedBroker


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=15.0, help="how long faults are injected (default 15)")
    p.add_argument("--records", type=int, default=1_000_000, help="pizza orders produced over that time")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--kill-every", default="5:15", help="seconds between faults, MIN:MAX (default 5:15)")
    p.add_argument("--graceful-share", type=float, default=0.2, help="share of faults that are SIGTERM (default 0.2)")
    p.add_argument("--settle-minutes", type=float, default=30.0, help="how long to wait for the group to catch up")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=None, help="keep logs and tables here (default: a temp dir)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    lo, _, hi = args.kill_every.partition(":")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="icesink-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir {workdir}", flush=True)
    broker = EmbeddedBroker(workdir / "broker")
    broker.start()
    try:
        report = run_chaos(
            workdir, bootstrap=broker.bootstrap, catalog_props=sqlite_catalog_properties(workdir / "catalog"),
            records=args.records, replicas=args.replicas, fault_s=args.minutes * 60,
            kill_every_s=(float(lo), float(hi or lo)), graceful_share=args.graceful_share,
            settle_timeout_s=args.settle_minutes * 60, seed=args.seed,
            say=lambda line: print(line, flush=True),
        )
    finally:
        broker.stop()
    print("\n".join(report.lines()), flush=True)
    return 0 if report.exact else 1


if __name__ == "__main__":
    sys.exit(main())
