"""Debezium's Avro change events (issue 36 point 5) through the Debezium transform: the
``Envelope`` record (``before``/``after`` of the table's ``Value`` record, ``source``, ``op``,
``ts_ms``) as Debezium's AvroConverter registers it, decoded per schema id, gives the change rows
the JSON form gives; Debezium's ``connect.name`` annotations (io.debezium.time.*) type the columns
as the JSON path's Connect schema names do."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pyarrow as pa

from agents.debezium import DebeziumTransform
from agents.formats.avro import avro_plan
from agents.formats.registry_values import RegistryValues
from tests.unit.test_registry_values import FakeRegistry, framed

NS = "dbserver1.public.accounts"


def _dbz(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "connect.version": 1, "connect.name": name}


VALUE: dict[str, Any] = {"type": "record", "name": "Value", "namespace": NS, "fields": [
    {"name": "id", "type": "int"},
    {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "updated", "type": ["null", _dbz("long", "io.debezium.time.MicroTimestamp")], "default": None},
    {"name": "born", "type": ["null", _dbz("int", "io.debezium.time.Date")], "default": None},
    {"name": "seen", "type": ["null", _dbz("long", "io.debezium.time.Timestamp")], "default": None},
    {"name": "shipped", "type": ["null", _dbz("string", "io.debezium.time.ZonedTimestamp")], "default": None},
], "connect.name": f"{NS}.Value"}
SOURCE: dict[str, Any] = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
    {"name": "version", "type": "string"}, {"name": "connector", "type": "string"}, {"name": "name", "type": "string"},
    {"name": "ts_ms", "type": "long"},
    {"name": "snapshot", "type": [{"type": "string", "connect.version": 1, "connect.parameters": {
        "allowed": "true,last,false,incremental"}, "connect.default": "false", "connect.name": "io.debezium.data.Enum"},
        "null"], "default": "false"},
    {"name": "db", "type": "string"}, {"name": "sequence", "type": ["null", "string"], "default": None},
    {"name": "ts_us", "type": ["null", "long"], "default": None},
    {"name": "schema", "type": "string"}, {"name": "table", "type": "string"},
    {"name": "txId", "type": ["null", "long"], "default": None}, {"name": "lsn", "type": ["null", "long"], "default": None},
], "connect.name": "io.debezium.connector.postgresql.Source"}
ENVELOPE: dict[str, Any] = {"type": "record", "name": "Envelope", "namespace": NS, "fields": [
    {"name": "before", "type": ["null", VALUE], "default": None},
    {"name": "after", "type": ["null", f"{NS}.Value"], "default": None},
    {"name": "source", "type": SOURCE},
    {"name": "transaction", "type": ["null", {"type": "record", "name": "block", "namespace": "event", "fields": [
        {"name": "id", "type": "string"}, {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"}], "connect.version": 1, "connect.name": "event.block"}],
     "default": None},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None},
], "connect.version": 2, "connect.name": f"{NS}.Envelope"}

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, 123456)


def row(i: int, name: str | None) -> dict[str, Any]:
    micros = int((T0 - dt.datetime(1970, 1, 1)).total_seconds() * 1_000_000) + i
    return {"id": i, "name": name, "updated": micros, "born": 20000 + i, "seen": micros // 1000,
            "shipped": f"2026-03-0{i}T10:00:00.5+02:00"}


def event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, lsn: int) -> dict[str, Any]:
    return {"before": before, "after": after, "op": op, "ts_ms": 1_772_000_000_000 + lsn, "transaction": None,
            "source": {"version": "3.6.0", "connector": "postgresql", "name": "dbserver1", "ts_ms": 1_771_999_999_000 + lsn,
                       "snapshot": "false", "db": "shop", "sequence": None, "ts_us": None, "schema": "public",
                       "table": "accounts", "txId": 7, "lsn": lsn}}


EVENTS = [
    event("r", None, row(1, "a"), 100),
    event("c", None, row(2, "b"), 101),
    event("u", None, row(1, "a2"), 102),
    event("d", {"id": 2, "name": None, "updated": None, "born": None, "seen": None, "shipped": None}, None, 103),
]


def transform() -> tuple[DebeziumTransform, list[bytes]]:
    registry = RegistryValues(FakeRegistry({5: ENVELOPE}))
    values = [framed(5, ENVELOPE, e) for e in EVENTS] + [b"\x00\x00\x00\x00\x05"]  # the last: no payload
    asyncio.run(registry.prepare(values))
    return DebeziumTransform("mirror.{db}_{table}", registry=registry), values


def test_debezium_time_annotations_type_avro_columns_as_the_json_path_does() -> None:
    plan = avro_plan(json.dumps(VALUE))
    types = {f.name: f.type for f in plan.arrow}
    assert types["updated"] == pa.timestamp("us") and types["seen"] == pa.timestamp("us")
    assert types["born"] == pa.date32() and types["id"] == pa.int32()
    assert types["shipped"] == pa.timestamp("us", tz="UTC")  # ZonedTimestamp: timestamptz, as the JSON path


def test_avro_change_events_give_the_change_rows_of_the_json_form() -> None:
    t, values = transform()
    schema = t.infer_schema(values)
    assert schema.names == ["id", "name", "updated", "born", "seen", "shipped", "_cdc"]
    assert schema.field("updated").type == pa.timestamp("us") and schema.field("born").type == pa.date32()
    out = t.apply(values, list(range(10, 10 + len(values))), schema)
    got = out.table.to_pylist()
    assert [(r["id"], r["name"], r["_cdc"]["op"], r["_cdc"]["offset"], r["_cdc"]["lsn"]) for r in got] == [
        (1, "a", "I", 10, 100), (2, "b", "I", 11, 101), (1, "a2", "U", 12, 102), (2, None, "D", 13, 103)]
    assert got[0]["updated"] == T0.replace(microsecond=123457)
    assert got[0]["born"] == dt.date(1970, 1, 1) + dt.timedelta(days=20001)
    assert got[0]["seen"] == T0.replace(microsecond=123000)
    assert got[0]["shipped"] == dt.datetime(2026, 3, 1, 8, 0, 0, 500000, tzinfo=dt.UTC)
    assert {r["_cdc"]["target"] for r in got} == {"mirror.public_accounts"}
    assert {r["_cdc"]["source"] for r in got} == {"public.accounts"}
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    assert got[1]["_cdc"]["ts"] == epoch + dt.timedelta(milliseconds=1_771_999_999_000 + 101)  # source.ts_ms
    assert [r.index for r in out.rejects] == [4] and "does not decode" in out.rejects[0].reason


def test_avro_change_events_route_on_cdc_fields_and_row_fields() -> None:
    t, values = transform()
    target = t.route_column(values, "_cdc.target")
    assert target.table.column(0).to_pylist() == ["mirror.public_accounts"] * 4
    assert target.indices.to_pylist() == [0, 1, 2, 3]
    names = t.route_column(values, "name")
    assert names.table.column(0).to_pylist() == ["a", "b", "a2", None]  # a delete: its before image
