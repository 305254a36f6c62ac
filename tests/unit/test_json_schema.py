"""agents/formats/json_schema.py: registered JSON Schemas (what confluent-kafka's JSONSerializer
registers: the schema text as written) to Iceberg as the reference sink maps them (Confluent's
JsonSchemaData, then Connect to Iceberg), and payloads decoded in bulk with decode_json. The payloads
here are ``json.dumps`` of the records, what JSONSerializer writes after the wire header;
tests/integration/test_schema_registry.py decodes JSONSerializer's own bytes."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import uuid
from typing import Any

import pytest
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from agents.formats.json_schema import JsonSchemaError, decode_json_schema, json_schema_plan

CONNECT = "org.apache.kafka.connect.data."
ADDRESS = {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": ["string", "null"]}},
           "required": ["street"]}
EVERYTHING = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Everything", "type": "object",
    "definitions": {"Address": ADDRESS},
    "properties": {
        "b": {"type": "boolean"},
        "n": {"type": "integer"},
        "i8": {"type": "integer", "connect.type": "int8"},
        "i16": {"type": "integer", "connect.type": "int16"},
        "i32": {"type": "integer", "connect.type": "int32"},
        "i64": {"type": "integer", "connect.type": "int64"},
        "x": {"type": "number"},
        "f32": {"type": "number", "connect.type": "float32"},
        "f64": {"type": "number", "connect.type": "float64"},
        "s": {"type": "string"},
        "raw": {"type": "string", "connect.type": "bytes"},
        "color": {"type": "string", "enum": ["RED", "GREEN"]},
        "address": {"$ref": "#/definitions/Address"},
        "previous": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/Address"}]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "maybe_tags": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
        "attrs": {"type": "object", "connect.type": "map", "additionalProperties": {"type": "integer"}},
        "extras": {"type": "object", "additionalProperties": {"type": "string"}},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "clock": {"type": "string", "format": "time"},
        "id": {"type": "string", "format": "uuid"},
        "ts": {"type": "integer", "title": CONNECT + "Timestamp", "connect.type": "int64"},
        "days": {"type": "integer", "title": CONNECT + "Date", "connect.type": "int32"},
        "ms": {"type": "integer", "title": CONNECT + "Time", "connect.type": "int32"},
        "price": {"type": "number", "title": CONNECT + "Decimal", "connect.type": "bytes",
                  "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"}},
    },
    "required": ["b", "n", "s", "address", "tags"],
}
TEXT = json.dumps(EVERYTHING)
T0 = dt.datetime(2026, 11, 29, 6, 30, 15, 123456, tzinfo=dt.UTC)


def record(k: int) -> dict[str, Any]:
    """The k-th record; odd k leave the optional properties out (or null)."""
    r: dict[str, Any] = {"b": k % 2 == 0, "n": 2**40 + k, "s": f"s{k}é", "address": {"street": f"st{k}"},
                         "tags": [f"t{j}" for j in range(k % 3)]}
    if k % 2:
        return r | {"previous": None, "i8": None}
    return r | {
        "i8": -k, "i16": 300 + k, "i32": 70_000 + k, "i64": -(2**50) - k, "x": k / 4, "f32": 0.5 + k, "f64": k / 3,
        "raw": base64.b64encode(bytes([k, 255])).decode(), "color": "GREEN",
        "address": {"street": f"st{k}", "zip": "12345"}, "previous": {"street": "old", "zip": None},
        "maybe_tags": [k, None], "attrs": {"a": k}, "extras": {"e": "v"},
        "at": (T0 + dt.timedelta(seconds=k)).isoformat(), "day": "2026-11-29", "clock": "06:30:15.5",
        "id": str(uuid.UUID(int=k + 1)), "ts": 1_700_000_000_000 + k, "days": 20_000 + k, "ms": 3_600_000 + k,
        "price": 12.34 + k,
    }


def expected(k: int) -> dict[str, Any]:
    r = record(k)
    nulls = {name: None for name in EVERYTHING["properties"]}  # type: ignore[attr-defined]
    if k % 2:
        return nulls | r | {"address": {"street": f"st{k}", "zip": None}}
    return nulls | r | {
        "raw": bytes([k, 255]), "attrs": [("a", k)], "extras": [("e", "v")],
        "at": T0 + dt.timedelta(seconds=k), "day": dt.date(2026, 11, 29), "clock": dt.time(6, 30, 15, 500000),
        "id": uuid.UUID(int=k + 1), "ts": dt.datetime.fromtimestamp(1_700_000_000 + k / 1000, dt.UTC),
        "days": dt.date(1970, 1, 1) + dt.timedelta(days=20_000 + k), "ms": dt.time(1, 0, 0, k * 1000),
        "price": decimal.Decimal(f"{12.34 + k:.2f}"),
    }


def payloads(n: int) -> list[bytes]:
    return [json.dumps(record(k)).encode() for k in range(n)]


@pytest.mark.parametrize(("name", "iceberg", "required"), [
    ("b", BooleanType(), True), ("n", LongType(), True), ("i8", IntegerType(), False), ("i16", IntegerType(), False),
    ("i32", IntegerType(), False), ("i64", LongType(), False), ("x", DoubleType(), False),
    ("f32", FloatType(), False), ("f64", DoubleType(), False), ("s", StringType(), True),
    ("raw", BinaryType(), False), ("color", StringType(), False), ("at", TimestamptzType(), False),
    ("day", DateType(), False), ("clock", TimeType(), False), ("id", UUIDType(), False),
    ("ts", TimestamptzType(), False), ("days", DateType(), False), ("ms", TimeType(), False),
    ("price", DecimalType(10, 2), False),
], ids=lambda v: str(v))
def test_json_schema_types_map_as_jsonschemadata(name: str, iceberg: IcebergType, required: bool) -> None:
    field = json_schema_plan(TEXT).iceberg.find_field(name)
    assert (field.field_type, field.required) == (iceberg, required)


def test_objects_arrays_maps_refs_and_nullables_map_to_nested_types() -> None:
    schema = json_schema_plan(TEXT).iceberg

    def shape(t: IcebergType) -> Any:
        if isinstance(t, StructType):
            return {f.name: (shape(f.field_type), f.required) for f in t.fields}
        if isinstance(t, ListType):
            return ["list", shape(t.element_type), t.element_required]
        if isinstance(t, MapType):
            return ["map", shape(t.key_type), shape(t.value_type), t.value_required]
        return t

    address = {"street": (StringType(), True), "zip": (StringType(), False)}
    types = {f.name: (shape(f.field_type), f.required) for f in schema.fields}
    assert types["address"] == (address, True)
    assert types["previous"] == (address, False)
    assert types["tags"] == (["list", StringType(), True], True)
    assert types["maybe_tags"] == (["list", LongType(), False], False)
    assert types["attrs"] == (["map", StringType(), LongType(), True], False)
    assert types["extras"] == (["map", StringType(), StringType(), True], False)
    assert [f.name for f in schema.fields] == list(EVERYTHING["properties"])  # type: ignore[call-overload]


def test_every_type_decodes_value_for_value() -> None:
    plan = json_schema_plan(TEXT)
    out = decode_json_schema(payloads(6), plan, plan.arrow, schema_id=3)
    out.validate()
    assert out.rejects == ()
    assert out.indices.to_pylist() == list(range(6))
    rows = out.table.to_pylist()
    assert rows == [expected(k) for k in range(6)]


def test_records_that_break_the_schema_are_rejects_by_index_naming_the_schema_id() -> None:
    plan = json_schema_plan(TEXT)
    good = payloads(3)
    values = [good[0], b'{"b": true, "s": "x", "tags": [], "address": {"street": "a"}}',  # n is required
              good[1], b'{"b": "yes"', json.dumps(record(2) | {"i32": 2**40}).encode(), good[2]]
    out = decode_json_schema(values, plan, plan.arrow, schema_id=11, positions=[20, 21, 22, 23, 24, 25])
    out.validate()
    assert out.indices.to_pylist() == [20, 22, 25]
    assert out.table.to_pylist() == [expected(k) for k in range(3)]
    assert [(r.index, r.field) for r in out.rejects] == [(21, "n"), (23, None), (24, "i32")]
    assert all(r.reason.startswith("JSON Schema record of schema id 11: ") for r in out.rejects), out.rejects


def test_references_resolve_by_name() -> None:
    """A ``$ref`` naming one of the schema's references (registered under that name, as
    confluent-kafka's references are) is that schema."""
    main = {"type": "object", "properties": {"home": {"$ref": "address.json"}}}
    plan = json_schema_plan(json.dumps(main), (("address.json", json.dumps(ADDRESS)),))
    home = plan.iceberg.find_field("home").field_type
    assert isinstance(home, StructType) and [f.name for f in home.fields] == ["street", "zip"]


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "string"}, "the value schema is 'string'; a table row needs an object"),
    ({"type": "object", "properties": {"u": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}},
     r"a oneOf/anyOf of 2 non-null branches.*\(at u\)"),
    ({"type": "object", "properties": {"a": {"$ref": "#/definitions/Nope"}}}, r"\$ref '#/definitions/Nope'"),
    ({"type": "object", "definitions": {"N": {"type": "object", "properties": {"n": {"$ref": "#/definitions/N"}}}},
      "properties": {"n": {"$ref": "#/definitions/N"}}}, r"contains itself.*\(at n\.n\)"),
    ({"type": "object", "properties": {"a": {}}}, r"no type.*\(at a\)"),
    ({"type": "object", "properties": {"a": {"type": "array"}}}, r"an array needs 'items'.*\(at a\)"),
    ("{not json", "not valid JSON"),
])
def test_schemas_that_cannot_map_are_refused_saying_why(schema: Any, message: str) -> None:
    with pytest.raises(JsonSchemaError, match=message):
        json_schema_plan(schema if isinstance(schema, str) else json.dumps(schema))
