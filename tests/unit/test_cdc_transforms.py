"""The CDC transforms of issue 39: Debezium's ExtractNewRecordState and the reference's
DmsTransform, on decoded Arrow columns (agents/transforms/unwrap.py, dms.py), with their keys
checked at start. Debezium events are the real captured ones of tests/unit/fixtures/debezium
(JSON with schemas) and test_debezium_avro's registry events."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow

from agents.formats import RecordFormat
from agents.formats.registry_values import RegistryValues
from icesink.shared.config import build
from icesink.shared.errors import ConfigError

UNWRAP = "io.debezium.transforms.ExtractNewRecordState"
DMS = "org.apache.iceberg.connect.transforms.DmsTransform"
FIXTURES = Path(__file__).parent / "fixtures" / "debezium"


@dataclass
class Msg:
    value: bytes | None
    headers: Any = ()
    topic: str = "t"
    partition: int = 0
    offset: int = 0
    timestamp: int | None = 0
    key: bytes | None = None


def dbz_values(form: str = "schema") -> list[bytes]:
    lines = [json.loads(x) for x in (FIXTURES / f"{form}.jsonl").read_text().splitlines()]
    return [e["value"].encode() for e in lines if e["value"]]


def unwrap_format(schemas: bool = True, **props: str) -> RecordFormat:
    keys = {"topics": "t", "iceberg.tables": "db.t", "transforms": "u", "transforms.u.type": UNWRAP,
            **{f"transforms.u.{k}": v for k, v in props.items()}}
    if schemas:
        keys["value.converter.schemas.enable"] = "true"
    return RecordFormat(build(keys))


def run(fmt: RecordFormat, values: list[bytes], create: int | None = None) -> tuple[list[str], list[dict[str, Any]], Any]:
    """The table ``fmt`` creates for ``values[:create]`` and the batch ``values`` converted into it."""
    import pyarrow as pa

    created = fmt.table_schema(values[:create])
    assert created is not None
    target = created if isinstance(created, pa.Schema) else schema_to_pyarrow(created)
    out = fmt.convert([Msg(v) for v in values], values, target)
    return [f.name for f in target], out.table.to_pylist(), out


ROW = ["id", "name", "amount", "created", "seen", "ok"]


def test_unwrap_default_mode_keeps_the_new_rows_and_drops_deletes() -> None:
    """delete.tombstone.handling.mode=tombstone (the default): a delete becomes a tombstone,
    which a sink skips; nothing is dead-lettered."""
    values = dbz_values()
    names, rows, out = run(unwrap_format(), values)
    assert names == ROW
    assert [(r["id"], r["name"], r["ok"]) for r in rows] == [(1, "a", True), (2, "b", None), (3, "c", False),
                                                             (1, "a2", True)]
    assert str(rows[3]["amount"]) == "99.99" and rows[0]["created"].isoformat() == "2024-01-04T12:28:13.123456"
    assert out.indices.to_pylist() == [0, 1, 2, 3] and out.rejects == ()


def test_unwrap_rewrite_keeps_deletes_with_deleted_and_add_fields_as_debezium_names_them() -> None:
    values = dbz_values()
    names, rows, _ = run(unwrap_format(**{"delete.handling.mode": "rewrite",
                                          "add.fields": "op,table,source.ts_ms,lsn:pos,ts_ms,transaction.id"}), values)
    assert names == [*ROW, "__deleted", "__op", "__table", "__source_ts_ms", "__pos", "__ts_ms", "__transaction_id"]
    events = [json.loads(v)["payload"] for v in values]
    assert [(r["id"], r["__deleted"], r["__op"]) for r in rows] == [
        (1, "false", "r"), (2, "false", "r"), (3, "false", "c"), (1, "false", "u"), (2, "true", "d")]
    assert [r["__source_ts_ms"] for r in rows] == [e["source"]["ts_ms"] for e in events]
    assert [r["__pos"] for r in rows] == [e["source"]["lsn"] for e in events]
    assert [r["__ts_ms"] for r in rows] == [e["ts_ms"] for e in events]
    assert {r["__table"] for r in rows} == {"orders"} and {r["__transaction_id"] for r in rows} == {None}


def test_unwrap_add_fields_prefix_and_drop_mode() -> None:
    names, rows, _ = run(unwrap_format(**{"delete.tombstone.handling.mode": "drop", "add.fields": "op,db",
                                          "add.fields.prefix": "cdc_"}), dbz_values())
    assert names == [*ROW, "cdc_op", "cdc_db"]
    assert [r["cdc_op"] for r in rows] == ["r", "r", "c", "u"] and {r["cdc_db"] for r in rows} == {"postgres"}


def test_unwrap_truncates_are_dropped_and_values_without_op_rejected() -> None:
    values = dbz_values()
    schema = json.loads(values[0])["schema"]
    truncate = json.dumps({"schema": schema, "payload": {"before": None, "after": None, "op": "t",
                                                        "source": json.loads(values[0])["payload"]["source"]}})
    no_op = json.dumps({"schema": schema, "payload": {"before": None, "after": {"id": 9}, "op": None,
                                                     "source": json.loads(values[0])["payload"]["source"]}})
    batch = [values[0], truncate.encode(), no_op.encode(), values[2]]
    _, rows, out = run(unwrap_format(), batch)
    assert [r["id"] for r in rows] == [1, 3] and out.indices.to_pylist() == [0, 3]
    assert [(r.index, r.field) for r in out.rejects] == [(2, "op")] and "no op" in out.rejects[0].reason


def test_unwrap_passes_schemaless_values_unchanged_as_debezium() -> None:
    """Debezium unwraps only values whose schema is an Envelope: schemaless JSON passes as is."""
    values = dbz_values("plain")
    names, rows, _ = run(unwrap_format(schemas=False), values)
    assert {"before", "after", "op", "source"} <= set(names)
    assert rows[0]["after"]["id"] == 1 and rows[0]["op"] == "r"


def test_unwrap_reads_registry_avro_events() -> None:
    from tests.unit.test_debezium_avro import ENVELOPE, EVENTS
    from tests.unit.test_registry_values import FakeRegistry, framed

    registry = RegistryValues(FakeRegistry({5: ENVELOPE}))
    values = [framed(5, ENVELOPE, e) for e in EVENTS]
    asyncio.run(registry.prepare(values))
    s = build({"topics": "t", "iceberg.tables": "db.t", "value.converter": "io.confluent.connect.avro.AvroConverter",
               "value.converter.schema.registry.url": "http://127.0.0.1:1", "transforms": "u",
               "transforms.u.type": UNWRAP, "transforms.u.delete.tombstone.handling.mode": "rewrite",
               "transforms.u.add.fields": "op,source.lsn"})
    names, rows, _ = run(RecordFormat(s, registry=registry), values)
    assert names == ["id", "name", "updated", "born", "seen", "shipped", "__deleted", "__op", "__source_lsn"]
    assert [(r["id"], r["name"], r["__deleted"], r["__op"], r["__source_lsn"]) for r in rows] == [
        (1, "a", "false", "r", 100), (2, "b", "false", "c", 101), (1, "a2", "false", "u", 102),
        (2, None, "true", "d", 103)]


def dms_format() -> RecordFormat:
    return RecordFormat(build({"topics": "t", "iceberg.tables": "db.t", "transforms": "dms", "transforms.dms.type": DMS}))


def dms(op: str | None, data: Any, schema: str | None = "public") -> bytes:
    meta = {"timestamp": "2024-05-01T10:00:00.123456Z", "record-type": "data", "operation": op,
            "partition-key-type": "schema-table", "table-name": "orders"}
    if schema is not None:
        meta["schema-name"] = schema
    return json.dumps({"data": data, "metadata": meta}).encode()


def test_dms_records_become_rows_with_cdc_as_the_reference() -> None:
    values = [dms("load", {"id": 1, "v": "a"}), dms("insert", {"id": 2, "v": "b"}), dms("update", {"id": 1, "v": "c"}),
              dms("delete", {"id": 2, "v": "b"}, schema=None), b'{"data": "x", "metadata": {"operation": "insert"}}',
              b'{"metadata": {"operation": "insert"}}', dms(None, {"id": 3, "v": "d"})]
    names, rows, out = run(dms_format(), values, create=4)
    assert names == ["id", "v", "_cdc"]
    ts = "2024-05-01T10:00:00.123456Z"
    assert rows == [
        {"id": 1, "v": "a", "_cdc": {"op": "I", "ts": ts, "source": "public.orders"}},
        {"id": 2, "v": "b", "_cdc": {"op": "I", "ts": ts, "source": "public.orders"}},
        {"id": 1, "v": "c", "_cdc": {"op": "U", "ts": ts, "source": "public.orders"}},
        {"id": 2, "v": "b", "_cdc": {"op": "D", "ts": ts, "source": "null.orders"}},
    ]
    # data not an object: a reject of the decode here (the reference drops it); no data: dropped; no operation: a reject
    assert out.indices.to_pylist() == [0, 1, 2, 3]
    assert [r.index for r in out.rejects] == [4, 6] and out.rejects[1].field == "metadata.operation"


def test_dms_fills_an_existing_timestamptz_cdc_ts() -> None:
    import pyarrow as pa

    fmt = dms_format()
    target = pa.schema([pa.field("id", pa.int64()), pa.field("_cdc", pa.struct([
        pa.field("op", pa.string()), pa.field("ts", pa.timestamp("us", tz="UTC")), pa.field("source", pa.string())]))])
    values = [dms("update", {"id": 7})]
    out = fmt.convert([Msg(v) for v in values], values, target)
    row = out.table.to_pylist()[0]
    assert row["_cdc"]["ts"].isoformat() == "2024-05-01T10:00:00.123456+00:00" and row["_cdc"]["op"] == "U"


BASE = {"topics": "t", "iceberg.tables": "db.t"}


@pytest.mark.parametrize(("keys", "named"), [
    ({"transforms.u.delete.tombstone.handling.mode": "keep"}, "transforms.u.delete.tombstone.handling.mode"),
    ({"transforms.u.delete.handling.mode": "keep"}, "transforms.u.delete.handling.mode"),
    ({"transforms.u.delete.handling.mode": "drop", "transforms.u.delete.tombstone.handling.mode": "drop"},
     "transforms.u.delete.handling.mode"),
    ({"transforms.u.drop.tombstones": "maybe"}, "transforms.u.drop.tombstones"),
    ({"transforms.u.add.fields": "a:b:c"}, "transforms.u.add.fields"),
    ({"transforms.u.add.headers": "op"}, "transforms.u.add.headers"),
    ({"transforms.u.route.by.field": "name"}, "transforms.u.route.by.field"),
    ({"transforms.u.drop.fields.header.name": "h"}, "transforms.u.drop.fields.header.name"),
    ({"iceberg.tables.route-field": "name"}, "iceberg.tables.route-field"),
    ({"iceberg.tables.evolve-schema-enabled": "true"}, "iceberg.tables.evolve-schema-enabled"),
    ({"transforms": "u,d", "transforms.d.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform"}, "transforms"),
    ({"transforms": "u,p", "transforms.p.type": DMS}, "value.converter.schemas.enable"),
    ({"transforms.u.predicate": "p", "predicates": "p",
      "predicates.p.type": "org.apache.kafka.connect.transforms.predicates.RecordIsTombstone"}, "transforms.u.predicate"),
])
def test_cdc_transform_keys_are_checked_at_start(keys: dict[str, str], named: str) -> None:
    all_keys = {**BASE, "value.converter.schemas.enable": "true", "transforms": "u", "transforms.u.type": UNWRAP, **keys}
    with pytest.raises(ConfigError) as err:
        build(all_keys)
    assert err.value.key == named


def test_the_usual_unwrap_settings_start() -> None:
    s = build({**BASE, "value.converter.schemas.enable": "true", "transforms": "unwrap", "transforms.unwrap.type": UNWRAP,
               "transforms.unwrap.drop.tombstones": "false", "transforms.unwrap.delete.handling.mode": "rewrite",
               "transforms.unwrap.add.fields": "op,table,lsn,source.ts_ms", "transforms.unwrap.add.headers.prefix": "h_",
               "iceberg.tables.route-field": "@topic"})
    assert [t.kind for t in s.transform_chain] == ["unwrap"]


JSON_TO_MAP = "org.apache.iceberg.connect.transforms.JsonToMapTransform"
STRING = "org.apache.kafka.connect.storage.StringConverter"
#: A part of the reference's test file (kafka-connect-transforms/src/test/resources/jsonmap.json).
JSONMAP = (b'{"string": "string", "int": 42, "long": 3147483647, "boolean": true, "float_is_double": 3.0, '
           b'"double": 0.3, "empty_obj": {}, "empty_string": "", "array_int": [1, 1], '
           b'"array_array_int": [[1,1], [2,2]], "array_objects": [{"key": 1}], "array_empty_object": [{}, {}], '
           b'"array_different_types": ["one", 1], "nested_obj": {"key": {"nested_key": 1}, "n": null, "s": "x"}}')


def json_to_map_format(**props: str) -> RecordFormat:
    return RecordFormat(build({"topics": "t", "iceberg.tables": "db.t", "value.converter": STRING, "transforms": "j",
                               "transforms.j.type": JSON_TO_MAP, **{f"transforms.j.{k}": v for k, v in props.items()}}))


def test_json_to_map_makes_columns_of_the_top_level_fields_and_maps_of_objects() -> None:
    values = [JSONMAP, b'{"string": "s2", "int": 7, "nested_obj": {"a": [1, {"b": 2}]}}', b'not json', b'[1, 2]']
    names, rows, out = run(json_to_map_format(), values, create=1)
    assert names == ["string", "int", "long", "boolean", "float_is_double", "double", "empty_string", "array_int",
                     "array_array_int", "array_objects", "array_empty_object", "array_different_types", "nested_obj"]
    first = rows[0]
    assert (first["string"], first["int"], first["long"], first["boolean"], first["float_is_double"], first["double"]) == (
        "string", 42, 3147483647, True, 3.0, 0.3)
    assert first["array_int"] == [1, 1] and first["array_array_int"] == [[1, 1], [2, 2]]
    assert first["array_objects"] == [[("key", "1")]] and first["array_empty_object"] == [[], []]
    assert first["array_different_types"] == ["one", "1"]
    assert first["nested_obj"] == [("key", '{"nested_key":1}'), ("n", "null"), ("s", "x")]  # Jackson's text
    assert rows[1]["nested_obj"] == [("a", '[1,{"b":2}]')] and rows[1]["int"] == 7 and rows[1]["long"] is None
    assert [r.index for r in out.rejects] == [2, 3]  # the reference fails on them


def test_json_to_map_at_the_root_makes_one_payload_map() -> None:
    values = [b'{"key":1,"a":"a"}', b'{"o": {"x": null}, "n": null, "l": [1, "x"]}', b'"text"']
    names, rows, out = run(json_to_map_format(**{"json.root": "true"}), values)
    assert names == ["payload"]
    assert [dict(r["payload"]) for r in rows] == [{"key": "1", "a": "a"}, {"o": '{"x":null}', "n": "null", "l": '[1,"x"]'}]
    assert [r.index for r in out.rejects] == [2]


@pytest.mark.parametrize(("keys", "named"), [
    ({"value.converter": "org.apache.kafka.connect.json.JsonConverter"}, "value.converter"),
    ({"transforms.j.json.root": "yes"}, "transforms.j.json.root"),
    ({"transforms": "r,j", "transforms.r.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
      "transforms.r.exclude": "a"}, "transforms"),
    ({"iceberg.tables.route-field": "a"}, "iceberg.tables.route-field"),
    ({"value.converter.schemas.enable": "true"}, "value.converter.schemas.enable"),
])
def test_json_to_map_keys_are_checked_at_start(keys: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        build({**BASE, "value.converter": STRING, "transforms": "j", "transforms.j.type": JSON_TO_MAP, **keys})
    assert err.value.key == named


def test_unwrap_rewrite_with_cdc_field_op_mirrors_a_table_as_the_references_usual_setup() -> None:
    """ExtractNewRecordState (rewrite, add.fields=op) + iceberg.tables.cdc-field=__op: the
    change rows collapse by key as the reference applies them (d deletes, u updates, r/c insert)."""
    from agents import mirror

    keys = {"topics": "t", "iceberg.tables": "db.t", "value.converter.schemas.enable": "true", "transforms": "u",
            "transforms.u.type": UNWRAP, "transforms.u.delete.handling.mode": "rewrite", "transforms.u.add.fields": "op",
            "iceberg.tables.cdc-field": "__op", "iceberg.tables.default-id-columns": "id"}
    s = build(keys)
    _, _, out = run(RecordFormat(s), dbz_values())
    collapsed = mirror.collapse(out.table, ["id"], s.cdc_field, upsert=False)
    assert sorted((r["id"], r["name"]) for r in collapsed.rows.to_pylist()) == [(1, "a2"), (3, "c")]
    assert sorted(collapsed.deleted_keys.column("id").to_pylist()) == [1, 2]


def test_unwrap_then_cast_casts_the_new_rows_and_drops_the_deletes_first() -> None:
    """Debezium's usual chain before a sink: ExtractNewRecordState, then a Cast of a field of
    the row (merged from two branches: a screened step's drops before a Cast's conversion)."""
    keys = {"topics": "t", "iceberg.tables": "db.t", "value.converter.schemas.enable": "true",
            "transforms": "u,c", "transforms.u.type": UNWRAP, "transforms.u.delete.tombstone.handling.mode": "drop",
            "transforms.c.type": "org.apache.kafka.connect.transforms.Cast$Value", "transforms.c.spec": "id:string"}
    names, rows, out = run(RecordFormat(build(keys)), dbz_values())
    assert names == ROW
    assert [(r["id"], r["name"]) for r in rows] == [("1", "a"), ("2", "b"), ("3", "c"), ("1", "a2")]
    assert out.indices.to_pylist() == [0, 1, 2, 3] and out.rejects == ()
