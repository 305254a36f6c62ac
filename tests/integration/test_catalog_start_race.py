"""Replicas that start together on a new catalog all start (issue 40, point 12).

Real processes, each loading the sink's catalog as a worker replica does at start-up
(``icesink.shared.iceberg.load_catalog``), released at the same instant on a catalog that does not
exist yet: the embedded SQLite catalog under ``state.dir``, and a SQLite catalog of the
connector's own (``iceberg.catalog.uri``). Every one must get the catalog; none may fail with
"table iceberg_tables already exists" (the catalog tables created twice).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROCESSES = 8
ROUNDS = 4  # the race was lost in about half the runs of 8 processes on 2 cores

_LOAD = """
import json, sys, time
from icesink.shared.config import build
from icesink.shared.iceberg import load_catalog

for raw, start in json.loads(sys.argv[1]):  # a new catalog each round
    settings = build(raw)
    time.sleep(max(0.0, start - time.time()))  # every process at the same instant
    load_catalog(settings).list_namespaces()
    print("loaded", raw["state.dir"], flush=True)
"""


def _config(catalog: str, directory: Path) -> dict[str, str]:
    raw = {"topics": "t", "iceberg.tables": "db.t", "state.dir": str(directory / "state")}
    if catalog == "sqlite uri":
        (directory / "own").mkdir(parents=True)
        raw |= {"iceberg.catalog.type": "sql", "iceberg.catalog.uri": f"sqlite:///{directory / 'own' / 'catalog.db'}",
                "iceberg.catalog.warehouse": f"file://{directory / 'own' / 'warehouse'}"}
    return raw


@pytest.mark.parametrize("catalog", ["embedded", "sqlite uri"])
def test_replicas_starting_together_on_a_new_sqlite_catalog_all_get_it(catalog, tmp_path):
    first = time.time() + 5  # the imports (pyiceberg, sqlalchemy) take a second or two each
    rounds = [(_config(catalog, tmp_path / f"round{i}"), first + 2 * i) for i in range(ROUNDS)]
    procs = [subprocess.Popen([sys.executable, "-c", _LOAD, json.dumps(rounds)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(PROCESSES)]
    results = [(p.wait(180), p.stdout.read() if p.stdout else "") for p in procs]
    failed = [out[-1500:] for code, out in results if code != 0 or out.count("loaded") != ROUNDS]
    assert not failed, f"expected all {PROCESSES} processes to load each new catalog, {len(failed)} failed:\n" + \
        "\n---\n".join(failed)
