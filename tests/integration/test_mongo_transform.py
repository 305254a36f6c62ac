"""The reference's MongoDebeziumTransform with a real worker process, a real broker and a real
catalog: Debezium 2.x MongoDB change events (JSON with schemas, extended-JSON documents) typed,
then ExtractNewRecordState makes rows of them (rewrite mode, ``add.fields``); a partial update
(change_streams capture mode) merged into its pre-image; a malformed event a dead letter. The
table read back with DuckDB, exact."""

from __future__ import annotations

import json
from datetime import datetime, UTC
from pathlib import Path

import pytest

from tests.integration.test_cdc_transforms import rows_of, run
from tests.unit.test_mongo_transform import MONGO, event

pytestmark = pytest.mark.integration


def doc(oid: str, name: str, qty: int, millis: int, city: str, tags: list[str]) -> str:
    return json.dumps({"_id": {"$oid": oid}, "name": name, "qty": {"$numberLong": str(qty)},
                       "at": {"$date": millis}, "addr": {"city": city}, "tags": tags})


@pytest.mark.timeout(300)
def test_mongo_events_land_as_typed_rows(broker, catalog_props, tmp_path: Path) -> None:
    a, b = "5d1b8e2f9c1e4a0001a1b2c3", "5d1b8e2f9c1e4a0001a1b2c4"
    a1, b1 = doc(a, "pen", 3, 1558965508000, "Oslo", ["x"]), doc(b, "ink", 10, 1558965509000, "Bergen", [])
    a2 = doc(a, "pen", 4, 1558965510000, "Oslo", ["x", "y"])
    values = [
        event("r", after=a1), event("c", after=b1),
        event("u", before=a1, after=a2),
        event("u", before=b1, updated='{"qty": {"$numberLong": "11"}}', removed=["tags"]),  # a partial update
        event("u"),  # malformed: a dead letter
        event("d", before=a2),
    ]
    catalog = run(broker, catalog_props, tmp_path, "mongo", {"mongo-items": values}, {"mongo.items": 5}, "mongo.items",
                  **{"value.converter.schemas.enable": "true", "transforms": "mongo,unwrap",
                     "transforms.mongo.type": MONGO,
                     "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
                     "transforms.unwrap.delete.tombstone.handling.mode": "rewrite",
                     "transforms.unwrap.add.fields": "op,source.ts_ms", "errors.tolerance": "all"})
    got = rows_of(catalog, "mongo.items", "SELECT _id, name, qty, \"at\", addr.city, tags, __deleted, __op FROM {}")
    utc = UTC

    def at(s: int) -> datetime:
        return datetime.fromtimestamp(s, utc)

    assert got == sorted([
        (a, "pen", 3, at(1558965508), "Oslo", ["x"], "false", "r"),
        (b, "ink", 10, at(1558965509), "Bergen", [], "false", "c"),
        (a, "pen", 4, at(1558965510), "Oslo", ["x", "y"], "false", "u"),
        (b, "ink", 11, at(1558965509), "Bergen", None, "false", "u"),
        (a, "pen", 4, at(1558965510), "Oslo", ["x", "y"], "true", "d"),
    ], key=repr)
    table = catalog.load_table("mongo.items")
    assert [f.name for f in table.schema().fields] == ["_id", "name", "qty", "at", "addr", "tags", "__deleted", "__op",
                                                       "__source_ts_ms"]
    assert str(table.schema().find_field("at").field_type) == "timestamptz"


@pytest.mark.timeout(300)
def test_mongo_then_debezium_transform_land_change_rows_with_cdc(broker, catalog_props, tmp_path: Path) -> None:
    """``transforms=mongo,debezium``, the reference's documented chain, routed as the reference's
    usual set-up: on ``_cdc.target`` (``{db}.{collection}``) to a dynamic table."""
    a = "5d1b8e2f9c1e4a0001a1b2c3"
    a1, a2 = doc(a, "pen", 3, 1558965508000, "Oslo", ["x"]), doc(a, "pen", 4, 1558965510000, "Oslo", [])
    values = [event("c", after=a1), event("u", before=a1, after=a2), event("d", before=a2)]
    catalog = run(broker, catalog_props, tmp_path, "mongo-dbz", {"mongo-dbz": values}, {"inventory.customers": 3}, "",
                  **{"value.converter.schemas.enable": "true", "transforms": "mongo,debezium",
                     "iceberg.tables.route-field": "_cdc.target", "iceberg.tables.dynamic-enabled": "true",
                     "transforms.mongo.type": "io.tabular.iceberg.connect.transforms.MongoDebeziumTransform",
                     "transforms.debezium.type": "org.apache.iceberg.connect.transforms.DebeziumTransform"})
    got = rows_of(catalog, "inventory.customers",
                  'SELECT _id, qty, tags, _cdc.op, _cdc."offset", _cdc.source, _cdc.target FROM {}')
    assert got == sorted([(a, 3, ["x"], "I", 0, "inventory.customers", "inventory.customers"),
                          (a, 4, [], "U", 1, "inventory.customers", "inventory.customers"),
                          (a, 4, [], "D", 2, "inventory.customers", "inventory.customers")], key=repr)
