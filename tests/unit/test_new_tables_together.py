"""A fetch routed to many new dynamic tables looks them up side by side and creates them together
(agents/table_lookup.py ``TableLookup.targets_of``, agents/tables.py ``create_targets``): their
loads overlap on the offload threads, and the SQL catalog creates them in one transaction, each
namespace read once. One after another, 200 new tables held the first fetch about 150 ms each
(issue 42, many new tables)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import pyarrow as pa
import pytest

from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from sqlalchemy import event

from agents.kafka import Fetched
from agents.tables import Target, create_targets
from coordinator.iceberg_ext.catalogs import SqlCatalog
from icesink.shared.catalogs import sqlite_catalog_properties
from icesink.shared.config import build
from icesink.shared.offload import Offload
from tests.unit.test_backpressure import P, make_parts

NEW = ("db.t0", "db.t1", "db.t2")


def fetch(names: tuple[str, ...]) -> Fetched:
    return Fetched({P: [SimpleNamespace(
        topic=P.topic, partition=P.partition, offset=o, value=b'{"tbl": "%s", "id": %d}' % (names[o % len(names)].encode(), o),
        timestamp=None, key=None, headers=(),
    ) for o in range(30)]}, time.monotonic())


SETTINGS = {"topics": P.topic, "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "tbl",
            "iceberg.tables.auto-create-enabled": "true"}


def worker(monkeypatch: pytest.MonkeyPatch, load: Any, create: Any) -> SimpleNamespace:
    monkeypatch.setattr("agents.table_lookup.load_target", load)
    monkeypatch.setattr("agents.table_lookup.create_targets", create)
    w = make_parts(1 << 20, settings=build(SETTINGS), targets={}, offload=Offload(threads=4))
    w.tables.attach(object())
    return w


def created(catalog: Any, settings: Any, wanted: dict[str, Any]) -> dict[str, Target]:
    return {name: Target(name, None, pa.schema([("tbl", pa.string()), ("id", pa.int64())])) for name in wanted}


def test_new_tables_of_one_fetch_are_looked_up_side_by_side_and_created_together(
        monkeypatch: pytest.MonkeyPatch) -> None:
    together = threading.Barrier(len(NEW), timeout=10)  # broken unless all three look-ups run at once
    batches: list[list[str]] = []

    def load(catalog: Any, name: str, settings: Any) -> None:
        together.wait()

    def create(catalog: Any, settings: Any, wanted: dict[str, Any]) -> dict[str, Target]:
        batches.append(sorted(wanted))
        return created(catalog, settings, wanted)

    w = worker(monkeypatch, load, create)
    asyncio.run(w.ingest.on_fetch(fetch(NEW)))
    assert w.failures == []
    assert batches == [list(NEW)]
    assert sorted(w.targets) == list(NEW) and w.buffers.rows == 30


def test_a_failed_look_up_fails_the_fetch_after_the_others_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    done: list[str] = []

    def load(catalog: Any, name: str, settings: Any) -> None:
        if name == "db.t1":
            raise RuntimeError("catalog said no")
        time.sleep(0.2)
        done.append(name)

    w = worker(monkeypatch, load, created)
    with pytest.raises(RuntimeError, match="catalog said no"):
        asyncio.run(w.ingest.on_fetch(fetch(NEW)))
    assert sorted(done) == ["db.t0", "db.t2"]  # none left running unseen
    assert w.buffers.rows == 0 and w.targets == {}


def test_a_failed_creation_fails_the_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    def create(catalog: Any, settings: Any, wanted: dict[str, Any]) -> dict[str, Target]:
        raise RuntimeError("catalog said no")

    w = worker(monkeypatch, lambda catalog, name, settings: None, create)
    with pytest.raises(RuntimeError, match="catalog said no"):
        asyncio.run(w.ingest.on_fetch(fetch(NEW)))
    assert w.buffers.rows == 0 and w.targets == {}


def sql_catalog(tmp_path: Path) -> Any:
    catalog = SqlCatalog("c", **sqlite_catalog_properties(tmp_path))
    catalog.create_namespace("db")
    return catalog


def transactions(catalog: Any) -> list[str]:
    seen: list[str] = []
    event.listen(catalog.engine, "commit", lambda connection: seen.append("commit"))
    return seen


def test_a_fetchs_new_tables_are_created_in_one_transaction_reading_their_namespace_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQL catalog icesink builds, a real SQLite file, the worker's own fetch path."""
    catalog = sql_catalog(tmp_path)
    catalog.create_table("db.t1", schema=Schema(NestedField(1, "tbl", StringType()), NestedField(2, "id", LongType())))
    names = (*NEW, "db.t3", "db.t4")
    w = make_parts(1 << 20, settings=build(SETTINGS), targets={}, offload=Offload(threads=4))
    w.tables.attach(catalog)
    commits = transactions(catalog)
    reads: list[str] = []
    real = SqlCatalog.load_namespace_properties
    monkeypatch.setattr(SqlCatalog, "load_namespace_properties",
                        lambda self, namespace: reads.append(namespace) or real(self, namespace))
    decodes: list[str] = []
    decode = w.decoder.decode
    monkeypatch.setattr(w.decoder, "decode", lambda name, *a: decodes.append(name) or decode(name, *a))
    asyncio.run(w.ingest.on_fetch(fetch(names)))
    assert w.failures == [] and w.buffers.rows == 30
    assert commits == ["commit"] and reads == ["db"]  # db.t1 existed: the four others in one go
    assert len(decodes) == 1  # the new tables have db.t1's schema: all five decoded together
    assert sorted(w.buffers.partitions[P].chunks[0].tables) == sorted(names)
    for name in names:
        table = catalog.load_table(name)
        assert w.targets[name].table.metadata == table.metadata
        assert name == "db.t1" or table.properties["schema.name-mapping.default"]
    assert [f.name for f in catalog.load_table("db.t3").schema().fields] == ["tbl", "id"]


def test_when_one_of_them_was_taken_meanwhile_each_is_created_on_its_own(tmp_path: Path) -> None:
    catalog = sql_catalog(tmp_path)
    settings = build(SETTINGS)
    inferred = pa.schema([("tbl", pa.string()), ("id", pa.int64())])
    taken = catalog.create_table("db.t1", schema=Schema(NestedField(1, "tbl", StringType()),
                                                        NestedField(2, "id", LongType())))
    commits = transactions(catalog)
    with patch.object(catalog, "create_table_batch", wraps=catalog.create_table_batch) as batch:
        targets = create_targets(catalog, settings, {n: inferred for n in NEW})
    assert [len(c.args[0]) for c in batch.call_args_list] == [3, 1, 1, 1]  # all, then each (create_table)
    assert sorted(targets) == list(NEW)
    assert targets["db.t1"].table.metadata.table_uuid == taken.metadata.table_uuid  # the name mapping set on it
    assert len(commits) == 3  # the batch rolled back; db.t0 and db.t2 one by one, db.t1 given its name mapping
    metadata = sorted(p.name for p in (tmp_path / "warehouse").rglob("*.metadata.json"))
    assert len(metadata) == 4  # db.t1's two, one each of the others: none left behind by the batch


def test_at_a_first_start_the_namespace_is_created_and_then_the_tables_together(tmp_path: Path) -> None:
    """The first fetch of a first start names tables of a namespace that does not exist yet."""
    catalog = SqlCatalog("c", **sqlite_catalog_properties(tmp_path))
    inferred = pa.schema([("tbl", pa.string()), ("id", pa.int64())])
    commits = transactions(catalog)
    with patch.object(catalog, "create_table_batch", wraps=catalog.create_table_batch) as batch:
        targets = create_targets(catalog, build(SETTINGS), {n: inferred for n in NEW})
    assert [len(c.args[0]) for c in batch.call_args_list] == [3, 3]  # refused for the namespace, then all at once
    assert len(commits) == 2  # the namespace, then the three tables
    assert sorted(targets) == list(NEW) and catalog.list_namespaces() == [("db",)]
    assert all(catalog.load_table(n).metadata == targets[n].table.metadata for n in NEW)
