"""A running worker's ingest with a real (SQLite) catalog: another tool adds a column to the
table; the next fetch whose records carry that field reloads the table (once) and its values land,
with schema evolution off; rows buffered before the change are written to the new schema with
the new column null (agents/schema_watch.py, TableLookup.refresh, Rounds._arrow_tables)."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from agents.kafka.source_consumer import Fetched
from agents.tables import load_target
from icesink.shared.config import build
from tests.unit.test_backpressure import P, TABLE, make_parts


def fetch(start: int, records: list[dict]) -> Fetched:
    return Fetched({P: [SimpleNamespace(
        topic=P.topic, partition=P.partition, offset=start + k, value=json.dumps(r).encode(), timestamp=None, key=None,
        headers=(),
    ) for k, r in enumerate(records)]}, time.monotonic())


def test_a_column_added_by_another_tool_is_filled_from_the_next_fetch_on(tmp_path) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    catalog.create_table(TABLE, schema=Schema(NestedField(1, "id", LongType(), required=False)))
    settings = build({"topics": P.topic, "iceberg.tables": TABLE})
    assert not settings.evolve_schema
    target = load_target(catalog, TABLE, settings)
    assert target is not None
    w = make_parts(1 << 30, settings=settings, targets={TABLE: target})
    w.tables.attach(catalog)
    loads = []
    load_table = catalog.load_table

    def counted(name):  # type: ignore[no-untyped-def]
        loads.append(name)
        return load_table(name)

    catalog.load_table = counted  # type: ignore[method-assign]

    async def run() -> None:
        await w.ingest.on_fetch(fetch(0, [{"id": 0}, {"id": 1}]))
        assert loads == []  # nothing new in the records: no catalog load
        with load_table(TABLE).update_schema() as update:  # another tool
            update.add_column("note", StringType())
        loads.clear()  # (pyiceberg's own loads of that commit)
        await w.ingest.on_fetch(fetch(2, [{"id": 2, "note": "two"}, {"id": 3, "note": "three"}]))
        await w.ingest.on_fetch(fetch(4, [{"id": 4, "note": "four"}]))
        snap = w.buffers.take(1, None)
        tables = await w.rounds._arrow_tables(snap)
        assert tables[TABLE].column_names == ["id", "note"]
        assert tables[TABLE].to_pylist() == [
            {"id": 0, "note": None}, {"id": 1, "note": None}, {"id": 2, "note": "two"}, {"id": 3, "note": "three"},
            {"id": 4, "note": "four"},
        ]
        assert loads == [TABLE]  # reloaded once; the next fetch finds the column in the cache

    asyncio.run(run())
    assert w.failures == []
