"""Fields of Avro rows (issue 36 point 1): with registry values, ``iceberg.tables.route-field``
routes on the decoded Avro field (dotted paths into records, numbers and enums as text) and
``iceberg.tables.cdc-field`` reads the decoded operation column, as with JSON records;
``iceberg.tables.timestamp-fields`` (a JSON inference hint: Avro states its types) stays refused."""

from __future__ import annotations

import asyncio
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow

from agents import mirror
from agents.formats.registry_values import RegistryValues
from agents.routing import Router
from icesink.shared.config import Settings, build
from icesink.shared.errors import ConfigError
from tests.unit.test_raw_values import Msg
from tests.unit.test_registry_values import FakeRegistry, fmt, framed

AVRO = {"value.converter": "io.confluent.connect.avro.AvroConverter",
        "value.converter.schema.registry.url": "http://127.0.0.1:1"}
V1 = {"type": "record", "name": "Event", "fields": [
    {"name": "id", "type": "long"},
    {"name": "meta", "type": {"type": "record", "name": "Meta", "fields": [
        {"name": "table", "type": ["null", "string"]},
        {"name": "op", "type": {"type": "enum", "name": "Op", "symbols": ["c", "u", "d"]}},
        {"name": "version", "type": "int"},
    ]}},
]}
# a second version where the route field is missing: those records have no route
V2 = {"type": "record", "name": "Event", "fields": [{"name": "id", "type": "long"}]}


def settings(**extra: str) -> Settings:
    return build({"topics": "t", **AVRO, **extra})


def values() -> list[bytes]:
    def ev(i: int, table: str | None, op: str, version: int) -> bytes:
        return framed(1, V1, {"id": i, "meta": {"table": table, "op": op, "version": version}})
    return [ev(1, "Shop.Orders", "c", 1), ev(2, "shop.items", "u", 2), ev(3, None, "d", 2),
            framed(2, V2, {"id": 4}), b"not framed", ev(5, "shop.orders", "d", 1)]


def prepared(registry: RegistryValues, vs: list[bytes]) -> RegistryValues:
    asyncio.run(registry.prepare(vs))
    return registry


def test_a_dynamic_route_field_of_avro_rows_routes_on_the_decoded_nested_field() -> None:
    s = settings(**{"iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "meta.table"})
    vs = values()
    router = Router(s, registry=prepared(RegistryValues(FakeRegistry({1: V1, 2: V2})), vs))
    routes = router.route(vs)
    assert {t: i.tolist() for t, i in routes.by_table.items()} == {"shop.orders": [0, 5], "shop.items": [1]}
    reasons = {r.index: r.reason for r in routes.unrouted}
    assert sorted(reasons) == [2, 3, 4]
    assert "null or missing" in reasons[2] and "null or missing" in reasons[3]
    assert "magic byte" in reasons[4] or "wire format" in reasons[4], reasons[4]


def test_a_static_route_field_matches_avro_numbers_and_enums_as_text() -> None:
    s = settings(**{"iceberg.tables": "db.v1,db.v2", "iceberg.tables.route-field": "meta.version",
                    "iceberg.table.db.v1.route-regex": "1", "iceberg.table.db.v2.route-regex": "2"})
    vs = values()
    router = Router(s, registry=prepared(RegistryValues(FakeRegistry({1: V1, 2: V2})), vs))
    assert {t: i.tolist() for t, i in router.route(vs).by_table.items()} == {"db.v1": [0, 5], "db.v2": [1, 2]}
    s = settings(**{"iceberg.tables": "db.d", "iceberg.tables.route-field": "meta.op",
                    "iceberg.table.db.d.route-regex": "d"})
    router = Router(s, registry=prepared(RegistryValues(FakeRegistry({1: V1, 2: V2})), vs))
    assert {t: i.tolist() for t, i in router.route(vs).by_table.items()} == {"db.d": [2, 5]}


def test_a_cdc_field_of_avro_rows_is_accepted_and_read_from_the_decoded_rows() -> None:
    s = settings(**{"iceberg.tables": "db.t", "iceberg.tables.cdc-field": "meta.op",
                    "iceberg.table.db.t.id-columns": "id"})
    assert s.cdc_field == "meta.op"
    registry = FakeRegistry({1: V1, 2: V2})
    f = fmt(registry)
    vs = values()
    vs = vs[:3] + vs[5:]  # version 1 only
    asyncio.run(f.registry.prepare(vs))  # type: ignore[union-attr]
    schema = f.table_schema(vs)
    assert schema is not None
    converted = f.convert([Msg(v) for v in vs], vs, schema_to_pyarrow(schema))
    ops, bad = mirror.operations(converted.table, ["id"], s.cdc_field)
    assert ops.to_pylist() == ["C", "U", "D", "D"] and not bad


@pytest.mark.parametrize(("key", "value"), [
    ("iceberg.tables.timestamp-fields", "ts"),
    ("value.converter.schemas.enable", "true"),
])
def test_what_does_not_apply_to_avro_rows_stays_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**{"iceberg.tables": "db.t", key: value})
    assert err.value.key == key
    assert "Avro" in str(err.value) or "schema" in str(err.value)
