"""Routing of raw JSON values to tables (agents/routing.py), without services."""

from __future__ import annotations

import pytest

from agents.routing import Router
from icesink.shared.config import build
from icesink.shared.errors import ConfigError

BASE = {"topics": "events"}


def router(**keys: str) -> Router:
    return Router(build({**BASE, **keys}))


def routed(r: Router, values: list[bytes]) -> dict[str, list[int]]:
    return {t: idx.tolist() for t, idx in r.route(values).by_table.items()}


def test_without_route_field_every_record_goes_to_every_table() -> None:
    r = router(**{"iceberg.tables": "db.a,db.b"})
    assert routed(r, [b'{"x":1}', b"not json"]) == {"db.a": [0, 1], "db.b": [0, 1]}


def test_static_regex_routes_by_whole_value_and_fans_out() -> None:
    r = router(**{
        "iceberg.tables": "db.clicks,db.orders,db.all_orders,db.none",
        "iceberg.tables.route-field": "type",
        "iceberg.table.db.clicks.route-regex": "click",
        "iceberg.table.db.orders.route-regex": "order",
        "iceberg.table.db.all_orders.route-regex": "order.*",
    })
    values = [b'{"type":"click"}', b'{"type":"order"}', b'{"type":"order_cancel"}', b'{"type":"clicks"}',
              b'{"type":null}', b'{"other":1}', b"{broken", b'{"type":"click","n":2}']
    result = r.route(values)
    assert {t: i.tolist() for t, i in result.by_table.items()} == {
        "db.clicks": [0, 7], "db.orders": [1], "db.all_orders": [1, 2],
    }
    reasons = {rej.index: rej.reason for rej in result.unrouted}
    assert sorted(reasons) == [3, 4, 5, 6]
    assert "'clicks' matches no table's route-regex" in reasons[3]
    assert "null or missing" in reasons[4] and "null or missing" in reasons[5]
    assert all(rej.field == "type" for rej in result.unrouted if rej.index != 6)


def test_nested_route_field_and_numbers_as_text() -> None:
    r = router(**{
        "iceberg.tables": "db.v1,db.v2",
        "iceberg.tables.route-field": "meta.version",
        "iceberg.table.db.v1.route-regex": "1",
        "iceberg.table.db.v2.route-regex": "2|two",
    })
    assert routed(r, [b'{"meta":{"version":1}}', b'{"meta":{"version":"two"}}', b'{"meta":{"version":2}}']) == {
        "db.v1": [0], "db.v2": [1, 2],
    }


def test_dynamic_lower_cases_and_refuses_names_without_namespace() -> None:
    r = router(**{"iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "table"})
    result = r.route([b'{"table":"Shop.Orders"}', b'{"table":"shop.orders"}', b'{"table":"orders"}',
                      b'{"table":"a.b.c"}', b'{"table":"x y.z"}'])
    assert {t: i.tolist() for t, i in result.by_table.items()} == {"shop.orders": [0, 1], "a.b.c": [3]}
    assert [rej.index for rej in result.unrouted] == [2, 4]
    assert "not a namespace.table name" in result.unrouted[0].reason


def test_route_cache_is_bounded() -> None:
    r = router(**{"iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "t"})
    r.CACHE_LIMIT = 50
    for start in range(0, 400, 100):
        r.route([f'{{"t":"db.t{i}"}}'.encode() for i in range(start, start + 100)])
        assert len(r._cache) <= 100


@pytest.mark.parametrize(("keys", "bad_key"), [
    ({"iceberg.tables.dynamic-enabled": "true"}, "iceberg.tables.route-field"),
    ({"iceberg.tables": "db.a", "iceberg.table.db.a.route-regex": "x"}, "iceberg.tables.route-field"),
    ({"iceberg.tables": "db.a", "iceberg.tables.route-field": "t", "iceberg.table.db.b.route-regex": "x"},
     "iceberg.table.db.b.route-regex"),
    ({"iceberg.tables": "db.a", "iceberg.tables.route-field": "t", "iceberg.table.db.a.route-regex": "("},
     "iceberg.table.db.a.route-regex"),
    ({}, "iceberg.tables"),
])
def test_routing_settings_are_checked(keys: dict[str, str], bad_key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build({**BASE, **keys})
    assert err.value.key == bad_key
