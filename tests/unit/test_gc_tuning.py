"""The collector's settings in a replica process (icesink/shared/gc_tuning.py), in a child
interpreter: the test process's own collector is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import gc, json
from icesink.shared import gc_tuning

def collections():
    return [s["collections"] for s in gc.get_stats()]

gc_tuning.tune()
before = collections()
keep = [[i] for i in range(300_000)]  # start-up's long-lived objects, three young thresholds' worth
during = collections()
gc_tuning.freeze_start_up()
frozen = collections()
churn = [[[i]] for i in range(150_000)]  # reading: the collector runs again
print(json.dumps({"before": before, "during": during, "frozen": frozen, "after": collections(),
                  "enabled": gc.isenabled(), "threshold": gc.get_threshold()[0], "freeze_count": gc.get_freeze_count()}))
"""


def test_start_up_runs_no_collection_and_reading_runs_them_again():
    """Start-up allocates some 180k long-lived objects (imports, catalogs, the Spark session's
    py4j objects); each young collection over them found about 10 objects of garbage and cost a
    replica 0.1-0.3 s of its GIL before the first record, and the full collection before the
    freeze 0.1-0.3 s more while the backlog was read (py-spy, bench/README.md)."""
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["during"] == got["before"], f"collections during start-up: {got}"
    assert got["frozen"] == got["before"], f"freezing collected: {got}"
    assert got["enabled"] and got["threshold"] == 100_000
    assert got["freeze_count"] >= 300_000
    assert got["after"][0] > got["before"][0], f"no young collection once reading: {got}"
