"""Routing of real Debezium change events (tests/unit/fixtures/debezium/) on ``_cdc`` fields and
row fields, as the reference routes after its DebeziumTransform (agents/routing.py)."""

from __future__ import annotations

import json

import pytest

from agents.debezium import DebeziumTransform
from agents.routing import Router
from icesink.shared.config import build
from icesink.shared.errors import ConfigError
from tests.unit.test_debezium import events

DEBEZIUM = {
    "topics": "cdc",
    "transforms": "dbz",
    "transforms.dbz.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform",
    "transforms.dbz.cdc.target.pattern": "mirror.{db}_{table}",
}


def router(form: str, **keys: str) -> Router:
    settings = build({**DEBEZIUM, "value.converter.schemas.enable": str(form == "schema").lower(), **keys})
    assert settings.debezium_target_pattern is not None
    return Router(settings, DebeziumTransform(settings.debezium_target_pattern, form == "schema"))


def batch(form: str) -> list[bytes]:
    """The fixture's five change events (no tombstone: screening removes those), then the same
    events as if captured from ``inventory.Customers``, then a value that is not JSON."""
    real = [e["value"] for e in events(form) if e["value"] is not None]
    other = [v.replace('"schema":"public","table":"orders"', '"schema":"inventory","table":"Customers"') for v in real]
    assert other != real
    return [v.encode() for v in real + other] + [b"{not json"]


@pytest.mark.parametrize("form", ["plain", "schema"])
def test_dynamic_routing_on_cdc_target_sends_each_source_table_to_its_own_table(form: str) -> None:
    r = router(form, **{"iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "_cdc.target"})
    routes = r.route(batch(form))
    assert {t: i.tolist() for t, i in routes.by_table.items()} == {
        "mirror.public_orders": [0, 1, 2, 3, 4],
        "mirror.inventory_customers": [5, 6, 7, 8, 9],  # lower-cased, as dynamic routing does
    }
    assert [r.index for r in routes.unrouted] == [10]


@pytest.mark.parametrize("form", ["plain", "schema"])
def test_static_routing_on_the_op_and_on_a_row_field_of_the_image(form: str) -> None:
    by_op = router(form, **{
        "iceberg.tables": "db.inserts,db.deletes",
        "iceberg.tables.route-field": "_cdc.op",
        "iceberg.table.db.inserts.route-regex": "I",
        "iceberg.table.db.deletes.route-regex": "D",
    }).route(batch(form)[:5])
    ops = [json.loads(v)["payload" if form == "schema" else "op"] for v in batch(form)[:5]]
    ops = [o["op"] if isinstance(o, dict) else o for o in ops]
    assert ops == ["r", "r", "c", "u", "d"]
    assert {t: i.tolist() for t, i in by_op.by_table.items()} == {"db.inserts": [0, 1, 2], "db.deletes": [4]}
    assert [(u.index, u.field) for u in by_op.unrouted] == [(3, "_cdc.op")]  # U matches no table
    assert "'U' matches no table's route-regex" in by_op.unrouted[0].reason

    # A row field: the delete (index 4) is routed by its before image, like the row it becomes.
    by_name = router(form, **{
        "iceberg.tables": "db.a,db.b",
        "iceberg.tables.route-field": "name",
        "iceberg.table.db.a.route-regex": "a.*",
        "iceberg.table.db.b.route-regex": "b",
    }).route(batch(form)[:5])
    assert {t: i.tolist() for t, i in by_name.by_table.items()} == {"db.a": [0, 3], "db.b": [1, 4]}
    assert [u.index for u in by_name.unrouted] == [2]  # name 'c'


def test_route_on_a_cdc_field_routing_cannot_read_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"iceberg.tables.route-field.*_cdc.target.*found .?_cdc.ts"):
        build({**DEBEZIUM, "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "_cdc.ts"})


def insert_event(i: int) -> dict[str, object]:
    """An insert as Debezium 3.6 emits it for PostgreSQL without schemas (issue 11, item 14)."""
    return {
        "before": None, "after": {"id": i, "name": f"n{i}", "city": "Oslo", "score": i},
        "source": {"version": "3.6.3.Final", "connector": "postgresql", "name": "dbz", "ts_ms": 1795000001000 + i,
                   "snapshot": "false", "db": "shop", "sequence": f'[null,"{1000 + i}"]', "ts_us": 1, "ts_ns": 1,
                   "schema": "public", "table": "customers", "txId": 1, "lsn": 1000 + i, "xmin": None},
        "transaction": None, "op": "c", "ts_ms": 1, "ts_us": 1, "ts_ns": 1,
    }


@pytest.mark.parametrize("form", ["plain", "schema"])
@pytest.mark.parametrize("field", ["_cdc.target", "_cdc.source", "_cdc.op"])
def test_a_batch_of_more_than_sixteen_events_routes_on_a_cdc_field(form: str, field: str) -> None:
    """Past 16 records the bulk path reads the batch; routing on a ``_cdc`` field reads the row
    images as empty structs, which once came back with no rows ("Arrays were not all the same
    length: 0 vs 20") and stopped every replica that took the partition."""
    if form == "plain":
        values = [json.dumps(insert_event(i)).encode() for i in range(20)]
    else:  # the fixture's real insert (with its Connect schema), twenty times
        values = [e["value"].encode() for e in events("schema") if e["value"] is not None][2:3] * 20
    r = router(form, **{"iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": field}) \
        if field == "_cdc.target" else router(form, **{
            "iceberg.tables": "db.t", "iceberg.tables.route-field": field,
            "iceberg.table.db.t.route-regex": "I|public\\..*"})
    routes = r.route(values)
    expected = "mirror.public_customers" if form == "plain" else "mirror.public_orders"
    assert {t: i.tolist() for t, i in routes.by_table.items()} == {
        expected if field == "_cdc.target" else "db.t": list(range(20))}
    assert routes.unrouted == ()
