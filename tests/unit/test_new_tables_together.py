"""A fetch routed to many new dynamic tables creates them side by side (agents/table_lookup.py
``TableLookup.targets_of``): their catalog calls overlap on the offload threads. One after
another, 200 new tables held the first fetch about 150 ms each (issue 42, many new tables)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from agents.kafka import Fetched
from agents.tables import Target
from icesink.shared.config import build
from icesink.shared.offload import Offload
from tests.unit.test_backpressure import P, make_parts

NEW = ("db.t0", "db.t1", "db.t2")


def fetch(names: tuple[str, ...]) -> Fetched:
    return Fetched({P: [SimpleNamespace(
        topic=P.topic, partition=P.partition, offset=o, value=b'{"tbl": "%s", "id": %d}' % (names[o % len(names)].encode(), o),
        timestamp=None, key=None, headers=(),
    ) for o in range(30)]}, time.monotonic())


def worker(monkeypatch: pytest.MonkeyPatch, create: Any) -> SimpleNamespace:
    settings = build({"topics": P.topic, "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "tbl",
                      "iceberg.tables.auto-create-enabled": "true"})
    monkeypatch.setattr("agents.table_lookup.load_target", lambda catalog, name, settings: None)
    monkeypatch.setattr("agents.table_lookup.create_target", create)
    w = make_parts(1 << 20, settings=settings, targets={}, offload=Offload(threads=4))
    w.tables.attach(object())
    return w


def test_new_tables_of_one_fetch_are_created_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    together = threading.Barrier(len(NEW), timeout=10)  # broken unless all three creations run at once

    def create(catalog: Any, settings: Any, name: str, inferred: Any) -> Target:
        together.wait()
        return Target(name, None, pa.schema([("tbl", pa.string()), ("id", pa.int64())]))

    w = worker(monkeypatch, create)
    asyncio.run(w.ingest.on_fetch(fetch(NEW)))
    assert w.failures == []
    assert sorted(w.targets) == list(NEW) and w.buffers.rows == 30


def test_a_failed_creation_fails_the_fetch_after_the_others_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    done: list[str] = []

    def create(catalog: Any, settings: Any, name: str, inferred: Any) -> Target:
        if name == "db.t1":
            raise RuntimeError("catalog said no")
        time.sleep(0.2)
        done.append(name)
        return Target(name, None, pa.schema([("tbl", pa.string()), ("id", pa.int64())]))

    w = worker(monkeypatch, create)
    with pytest.raises(RuntimeError, match="catalog said no"):
        asyncio.run(w.ingest.on_fetch(fetch(NEW)))
    assert sorted(done) == ["db.t0", "db.t2"]  # none left running unseen
    assert w.buffers.rows == 0
