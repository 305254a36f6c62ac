"""The CDC transforms of issue 39 with real worker processes, a real broker and a real catalog,
tables read back with DuckDB, exact:

- Debezium's ExtractNewRecordState (rewrite mode, ``add.fields``) on real captured Debezium
  events (JSON with schemas, tests/unit/fixtures/debezium), two topics routed by topic through a
  RegexRouter to their own tables;
- the reference's DmsTransform on AWS DMS records (schemaless JSON: a second run, as
  ``value.converter.schemas.enable`` is one setting of a worker);
- the reference's JsonToMapTransform on text values (StringConverter: a third run)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "debezium"


def debezium_events(table: str, shift: int) -> list[dict[str, Any]]:
    """The captured events of public.orders, as if of ``table`` with ids shifted by ``shift``."""
    out = []
    for line in (FIXTURES / "schema.jsonl").read_text().splitlines():
        if not json.loads(line)["value"]:
            continue
        event = json.loads(json.loads(line)["value"])
        p = event["payload"]
        for image in ("before", "after"):
            if p[image] is not None:
                p[image]["id"] += shift
        p["source"]["table"] = table
        out.append(event)
    return out


def expected_rows(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    rows = []
    for e in events:
        p = e["payload"]
        image = p["after"] if p["after"] is not None else p["before"]
        rows.append((image["id"], image["name"], image["ok"], "true" if p["after"] is None else "false", p["op"],
                     p["source"]["table"], p["source"]["ts_ms"]))
    return sorted(rows, key=repr)


def run(broker: Any, catalog_props: dict[str, str], tmp_path: Path, name: str, topics: dict[str, list[bytes]],
        counts: dict[str, int], listed: str, **keys: Any) -> Any:
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import produce
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import sink_until, write_config

    for topic, values in topics.items():
        asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
        asyncio.run(produce(broker.bootstrap, topic, values, partitions=1))
    cfg = write_config(tmp_path / f"{name}.json", topics=",".join(topics), tables=listed, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / f"{name}-state", group=f"{name}-sink", **keys)
    catalog = load_catalog("it", **catalog_props)
    sink_until(cfg, tmp_path / f"{name}-logs", catalog, tuple(counts), counts)
    return catalog


def rows_of(catalog: Any, table: str, sql: str) -> list[tuple[Any, ...]]:
    from tests.support.duck import connect, plain_path

    loaded = catalog.load_table(table)
    with connect(loaded.io.properties) as con:
        return sorted(con.execute(sql.format(f"iceberg_scan('{plain_path(loaded.metadata_location)}')")).fetchall(),
                      key=repr)


@pytest.mark.timeout(300)
def test_extract_new_record_state_and_dms_transform_land_exact_rows(broker, catalog_props, tmp_path: Path) -> None:
    orders, clients = debezium_events("orders", 0), debezium_events("clients", 100)
    catalog = run(
        broker, catalog_props, tmp_path, "unwrap",
        {"dbz-orders": [json.dumps(e).encode() for e in orders], "dbz-clients": [json.dumps(e).encode() for e in clients]},
        {"cdc.orders": len(orders), "cdc.clients": len(clients)},
        "", **{
            "value.converter.schemas.enable": "true", "transforms": "unwrap,route",
            "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
            "transforms.unwrap.delete.handling.mode": "rewrite", "transforms.unwrap.drop.tombstones": "false",
            "transforms.unwrap.add.fields": "op,table,source.ts_ms",
            "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
            "transforms.route.regex": "dbz-(.*)", "transforms.route.replacement": "cdc.$1",
            "iceberg.tables.route-field": "@topic", "iceberg.tables.dynamic-enabled": "true"})
    for table, events in (("cdc.orders", orders), ("cdc.clients", clients)):
        got = rows_of(catalog, table, "SELECT id, name, ok, __deleted, __op, __table, __source_ts_ms FROM {}")
        assert got == expected_rows(events), table
        columns = [f.name for f in catalog.load_table(table).schema().fields]
        assert columns == ["id", "name", "amount", "created", "seen", "ok", "__deleted", "__op", "__table",
                           "__source_ts_ms"]

    def dms(op: str, row: dict[str, Any]) -> bytes:
        return json.dumps({"data": row, "metadata": {"timestamp": f"2024-05-01T10:00:0{row['id']}.5Z", "operation": op,
                                                     "schema-name": "sales", "table-name": "orders"}}).encode()

    values = [dms("load", {"id": 1, "v": "a"}), dms("insert", {"id": 2, "v": "b"}), dms("update", {"id": 1, "v": "c"}),
              b'{"metadata": {"operation": "insert"}}',  # no data: the reference drops it
              dms("delete", {"id": 2, "v": "b"})]
    catalog = run(broker, catalog_props, tmp_path, "dms", {"dms-orders": values}, {"dms.orders": 4}, "dms.orders",
                  **{"transforms": "dms", "transforms.dms.type": "io.tabular.iceberg.connect.transforms.DmsTransform"})
    got = rows_of(catalog, "dms.orders", "SELECT id, v, _cdc.op, _cdc.ts, _cdc.source FROM {}")
    assert got == sorted([(1, "a", "I", "2024-05-01T10:00:01.5Z", "sales.orders"),
                          (2, "b", "I", "2024-05-01T10:00:02.5Z", "sales.orders"),
                          (1, "c", "U", "2024-05-01T10:00:01.5Z", "sales.orders"),
                          (2, "b", "D", "2024-05-01T10:00:02.5Z", "sales.orders")], key=repr)

    texts = [b'{"id": 1, "tags": ["a", "b"], "attrs": {"color": "red", "size": 2, "dims": [1, 2], "gone": null}}',
             b'{"id": 2, "attrs": {"color": "blue"}}', b'not json: a dead letter']
    catalog = run(broker, catalog_props, tmp_path, "j2m", {"j2m-items": texts}, {"j2m.items": 2}, "j2m.items",
                  **{"value.converter": "org.apache.kafka.connect.storage.StringConverter", "transforms": "j",
                     "transforms.j.type": "org.apache.iceberg.connect.transforms.JsonToMapTransform",
                     "errors.tolerance": "all"})
    got = rows_of(catalog, "j2m.items", "SELECT id, tags, map_entries(attrs) FROM {}")
    assert got == [(1, ["a", "b"], [{"key": "color", "value": "red"}, {"key": "size", "value": "2"},
                                    {"key": "dims", "value": "[1,2]"}, {"key": "gone", "value": "null"}]),
                   (2, None, [{"key": "color", "value": "blue"}])]
