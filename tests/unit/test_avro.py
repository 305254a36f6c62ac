"""agents/formats/avro.py: Avro schemas to Iceberg as the reference sink maps them (Confluent's
AvroData, then Connect to Iceberg), and registry Avro payloads decoded in bulk. Payloads are written
with fastavro's schemaless_writer (what Confluent's serializers put after the wire header);
tests/integration/test_schema_registry.py decodes confluent-kafka's AvroSerializer's bytes."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import uuid
from typing import Any

import fastavro
import pyarrow as pa
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
    TimeType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

from agents.formats.avro import AvroSchemaError, avro_arrow_schema, avro_iceberg_schema, avro_plan, decode_avro

UTC = dt.UTC
ADDRESS = {"type": "record", "name": "Address", "fields": [
    {"name": "street", "type": "string"}, {"name": "zip", "type": ["null", "string"]}]}
EVERYTHING = {
    "type": "record", "name": "Everything", "namespace": "icesink.test",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "address", "type": ADDRESS},
        {"name": "previous", "type": ["null", "Address"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "maybe_tags", "type": {"type": "array", "items": ["null", "long"]}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "opt", "type": ["null", "int"]},
        {"name": "opt_last", "type": ["string", "null"]},
        {"name": "single", "type": ["long"]},
        {"name": "either", "type": ["int", "string", "Address"]},
        {"name": "maybe_either", "type": ["null", "long", "Color"]},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 4}},
        {"name": "dec_fixed", "type": {"type": "fixed", "name": "Dec", "size": 8, "logicalType": "decimal",
                                       "precision": 18, "scale": 2}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lts_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "lts_us", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    ],
}
TEXT = json.dumps(EVERYTHING)


def write(schema: Any, records: list[dict[str, Any]]) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    out = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(buf.getvalue())
    return out


def record(n: int) -> dict[str, Any]:
    """A record with every type; ``n`` picks the union branches and nulls."""
    return {
        "b": n % 2 == 0, "i": -n, "l": 2**40 + n, "f": 1.5 + n, "d": 0.1 * n, "s": f"s{n}é",
        "raw": bytes([n, 0, 255]), "fx": bytes([n, 1, 2, 3]), "color": ["RED", "GREEN"][n % 2],
        "address": {"street": f"{n} Main St", "zip": None if n % 2 else f"{n:05d}"},
        "previous": None if n % 2 else {"street": "old", "zip": None},
        "tags": [f"t{k}" for k in range(n % 3)], "maybe_tags": [n, None], "attrs": {"x": n, "y": -n},
        "opt": None if n % 2 else n, "opt_last": None if n % 2 == 0 else "set", "single": n,
        "either": [n, f"e{n}", {"street": "u", "zip": "z"}][n % 3],
        "maybe_either": [None, n * 10, "GREEN"][n % 3],
        "dec": decimal.Decimal("1234567890123456.7891") * (-1) ** n,
        "dec_fixed": decimal.Decimal("-0.05") + n,
        "id": uuid.UUID(int=n * 7919 + 1),
        "day": dt.date(2026, 2, 28) + dt.timedelta(days=n),
        "t_ms": dt.time(23, 59, 59, 999000), "t_us": dt.time(0, 0, 1, 123456 + n),
        "ts_ms": dt.datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC),
        "ts_us": dt.datetime(1969, 12, 31, 23, 59, 59, 999999 - n, tzinfo=UTC),
        "lts_ms": dt.datetime(2026, 3, 1, 12, 0, 0, 456000), "lts_us": dt.datetime(2026, 3, 1, 12, 0, 0, 654321 + n),
    }


def expected(n: int) -> dict[str, Any]:
    """``record(n)`` as the table holds it: unions as structs, maps as pairs."""
    r = record(n)
    branches = ["int", "string", "Address"]
    either = {b: (r["either"] if k == n % 3 else None) for k, b in enumerate(branches)}
    maybe = None if n % 3 == 0 else {"long": r["maybe_either"] if n % 3 == 1 else None,
                                     "Color": r["maybe_either"] if n % 3 == 2 else None}
    return {**r, "attrs": list(r["attrs"].items()), "either": either, "maybe_either": maybe}


# (field, Iceberg type, required?): the mapping table of docs/schema-registry.md ("Avro types").
MAPPING: list[tuple[str, IcebergType, bool]] = [
    ("b", BooleanType(), True), ("i", IntegerType(), True), ("l", LongType(), True), ("f", FloatType(), True),
    ("d", DoubleType(), True), ("s", StringType(), True), ("raw", BinaryType(), True), ("fx", BinaryType(), True),
    ("color", StringType(), True), ("opt", IntegerType(), False), ("opt_last", StringType(), False),
    ("single", LongType(), True), ("dec", DecimalType(20, 4), True), ("dec_fixed", DecimalType(18, 2), True),
    ("id", UUIDType(), True), ("day", DateType(), True), ("t_ms", TimeType(), True), ("t_us", TimeType(), True),
    ("ts_ms", TimestamptzType(), True), ("ts_us", TimestamptzType(), True),
    ("lts_ms", TimestampType(), True), ("lts_us", TimestampType(), True),
]


@pytest.mark.parametrize(("name", "iceberg", "required"), MAPPING, ids=[m[0] for m in MAPPING])
def test_avro_types_map_to_iceberg_as_the_reference_sink(name: str, iceberg: IcebergType, required: bool) -> None:
    field = avro_iceberg_schema(TEXT).find_field(name)
    assert (field.field_type, field.required) == (iceberg, required)


def shape(t: IcebergType) -> Any:
    """A type without its field ids."""
    if isinstance(t, StructType):
        return [(f.name, shape(f.field_type), f.required) for f in t.fields]
    return t


def test_records_arrays_maps_and_unions_map_to_nested_types() -> None:
    schema = avro_iceberg_schema(TEXT)
    address = schema.find_field("address").field_type
    assert isinstance(address, StructType)
    assert [(f.name, f.field_type, f.required) for f in address.fields] == [
        ("street", StringType(), True), ("zip", StringType(), False)]
    previous = schema.find_field("previous")
    assert not previous.required and shape(previous.field_type) == shape(address)
    tags, maybe_tags = schema.find_field("tags").field_type, schema.find_field("maybe_tags").field_type
    assert isinstance(tags, ListType) and tags.element_type == StringType() and tags.element_required
    assert isinstance(maybe_tags, ListType) and maybe_tags.element_type == LongType() and not maybe_tags.element_required
    attrs = schema.find_field("attrs").field_type
    assert isinstance(attrs, MapType) and (attrs.key_type, attrs.value_type, attrs.value_required) == (
        StringType(), LongType(), True)
    # other unions: AvroData's struct of one optional field per branch, named by the type or the
    # record's short name; optional when a branch is null
    either = schema.find_field("either")
    assert either.required and isinstance(either.field_type, StructType)
    assert [(f.name, f.required) for f in either.field_type.fields] == [
        ("int", False), ("string", False), ("Address", False)]
    assert shape(either.field_type.fields[2].field_type) == shape(address)
    maybe = schema.find_field("maybe_either")
    assert not maybe.required and isinstance(maybe.field_type, StructType)
    assert [(f.name, f.field_type) for f in maybe.field_type.fields] == [("long", LongType()), ("Color", StringType())]
    assert avro_arrow_schema(TEXT).field("ts_us").type == pa.timestamp("us", tz="UTC")


def test_every_type_decodes_value_for_value() -> None:
    n = 6
    plan = avro_plan(TEXT)
    out = decode_avro(write(EVERYTHING, [record(k) for k in range(n)]), plan, plan.arrow, schema_id=3)
    out.validate()
    assert out.rejects == () and out.indices.to_pylist() == list(range(n))
    rows = out.table.to_pylist()
    for k in range(n):
        assert rows[k] == expected(k), k
    # exact decimals and microseconds, whatever == would forgive
    assert str(rows[0]["dec"]) == "1234567890123456.7891" and str(rows[1]["dec_fixed"]) == "0.95"
    assert rows[3]["ts_us"].microsecond == 999996 and rows[0]["id"] == uuid.UUID(int=1)
    assert out.table.schema == plan.arrow


def test_bad_payloads_are_rejects_naming_the_schema_id_and_the_rest_are_rows() -> None:
    plan = avro_plan(TEXT)
    good = write(EVERYTHING, [record(k) for k in range(5)])
    payloads = [good[0], good[1][:-9], good[2], b"", b"\xff" * 12, good[3], good[4][:1]]
    out = decode_avro(payloads, plan, plan.arrow, schema_id=42, positions=[10, 11, 12, 13, 14, 15, 16])
    out.validate()
    assert out.indices.to_pylist() == [10, 12, 15]
    assert [r["i"] for r in out.table.to_pylist()] == [0, -2, -3]
    assert [r.index for r in out.rejects] == [11, 13, 14, 16]
    for reject in out.rejects:
        assert reject.reason.startswith("Avro payload of schema id 42 does not decode: "), reject.reason


def test_many_bad_payloads_are_each_a_reject_and_the_good_ones_rows() -> None:
    plan = avro_plan(TEXT)
    good = write(EVERYTHING, [record(k) for k in range(3)])
    payloads = [p for k in range(30) for p in (good[k % 3], good[k % 3][:-5])]  # past the container's restarts
    out = decode_avro(payloads, plan, plan.arrow, schema_id=5)
    assert out.indices.to_pylist() == list(range(0, 60, 2)) and [r.index for r in out.rejects] == list(range(1, 60, 2))
    assert out.table.to_pylist() == [expected(k % 3) for k in range(30)]
    assert all(r.reason.startswith("Avro payload of schema id 5 does not decode: ") for r in out.rejects)


def test_a_batch_of_only_bad_payloads_gives_an_empty_table_of_the_target() -> None:
    plan = avro_plan(TEXT)
    empty = decode_avro([], plan, plan.arrow, schema_id=1)
    assert empty.table.num_rows == 0 and empty.table.schema == plan.arrow and empty.rejects == ()
    out = decode_avro([b"\x01", b""], plan, plan.arrow, schema_id=1)
    assert out.table.num_rows == 0 and out.table.schema == plan.arrow and len(out.rejects) == 2


def test_rows_fill_the_target_by_name_and_a_record_that_does_not_fit_is_a_reject() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]}
    target = pa.schema([("id", pa.int64()), ("amount", pa.decimal128(4, 2)), ("added", pa.string())])
    payloads = write(schema, [{"id": 1, "amount": decimal.Decimal("12.34")}, {"id": 2, "amount": decimal.Decimal("1234.56")}])
    out = decode_avro(payloads, avro_plan(json.dumps(schema)), target, schema_id=9)
    assert out.table.to_pylist() == [{"id": 1, "amount": decimal.Decimal("12.34"), "added": None}]
    assert [r.index for r in out.rejects] == [1]
    assert out.rejects[0].reason.startswith("Avro record of schema id 9 does not fit the table: ")


def test_named_types_from_references_are_defined_in_the_writer_schema() -> None:
    reference = {"type": "record", "name": "Money", "namespace": "shared",
                 "fields": [{"name": "cents", "type": "long"}, {"name": "currency", "type": "string"}]}
    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "price", "type": "shared.Money"}, {"name": "tip", "type": ["null", "shared.Money"]}]}
    plan = avro_plan(json.dumps(schema), (json.dumps(reference),))
    price = plan.iceberg.find_field("price").field_type
    assert isinstance(price, StructType) and [f.name for f in price.fields] == ["cents", "currency"]
    parsed: dict[str, Any] = {}
    fastavro.parse_schema(reference, named_schemas=parsed)
    records = [{"price": {"cents": 5, "currency": "EUR"}, "tip": None}, {"price": {"cents": 1, "currency": "USD"},
                                                                         "tip": {"cents": 2, "currency": "USD"}}]
    payloads = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schema, named_schemas=dict(parsed)), r)
        payloads.append(buf.getvalue())
    assert decode_avro(payloads, plan, plan.arrow, schema_id=1).table.to_pylist() == records


@pytest.mark.parametrize(("schema", "found"), [
    ('"string"', "the value schema is 'string'; a table row needs a record"),
    ('{"type": "record", "name": "R", "fields": [{"name": "x", "type": "null"}]}', "a null type stands alone"),
    ('{"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}',
     "Node contains itself"),
    ('{"type": "record", "name": "R", "fields": [{"name": "x", "type": {"type": "bytes", '
     '"logicalType": "decimal", "precision": 40, "scale": 2}}]}', "decimal precision 40 is over Iceberg's 38"),
    ('{"type": "record", "name": "R", "fields": [{"name": "x", "type": ["int", "string", {"type": "record", '
     '"name": "int", "fields": []}]}]}', "two union branches map to the struct field 'int'"),
    ('{"type": "record", "name": "R", "fields": [{"name": "x", "type": "Missing"}]}', "not valid Avro"),
    ('{"type": "record", "name": "R", "fields": [{"name": "x", "type": [{"type": "record", "name": "a.Same", '
     '"fields": []}, {"type": "record", "name": "b.Same", "fields": []}]}]}',
     "two union branches map to the struct field 'Same'"),
    ("{", "not valid Avro"),
])
def test_schemas_that_cannot_map_are_refused_saying_why(schema: str, found: str) -> None:
    with pytest.raises(AvroSchemaError, match="Avro schema: ") as caught:
        avro_plan(schema)
    assert found in str(caught.value)


ZONED = {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"}
ROW = {"type": "record", "name": "Row", "namespace": "db", "fields": [
    {"name": "id", "type": "int"},
    {"name": "at", "type": ZONED},
    {"name": "maybe", "type": ["null", ZONED], "default": None},
    {"name": "many", "type": {"type": "array", "items": ZONED}},
]}
#: Debezium's envelope names the row record twice: ``after`` refers to it by name.
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "db", "fields": [
    {"name": "before", "type": ["null", ROW], "default": None},
    {"name": "after", "type": ["null", "db.Row"], "default": None},
]}


def test_debezium_zoned_timestamps_are_timestamptz_as_the_json_path_types_them() -> None:
    plan = avro_plan(json.dumps(ENVELOPE))
    after = plan.iceberg.find_field("after").field_type
    assert isinstance(after, StructType)
    assert [(f.name, f.field_type) for f in after.fields if f.name != "many"] == [
        ("id", IntegerType()), ("at", TimestamptzType()), ("maybe", TimestamptzType())]
    assert isinstance(plan.iceberg.find_field("before.many").field_type, ListType)
    assert plan.iceberg.find_field("before.many").field_type.element_type == TimestamptzType()
    row = {"id": 1, "at": "2026-03-01T10:00:00.123456Z", "maybe": "2026-03-01T12:00:00+02:00",
           "many": ["2026-03-02T00:00:00Z"]}
    bad = {**row, "id": 2, "at": "yesterday"}
    payloads = write(ENVELOPE, [{"before": None, "after": row}, {"before": row, "after": bad},
                                {"before": None, "after": {**row, "id": 3, "maybe": None}}])
    out = decode_avro(payloads, plan, plan.arrow, schema_id=9)
    want = {"id": 1, "at": dt.datetime(2026, 3, 1, 10, 0, 0, 123456, tzinfo=UTC),
            "maybe": dt.datetime(2026, 3, 1, 10, 0, tzinfo=UTC), "many": [dt.datetime(2026, 3, 2, tzinfo=UTC)]}
    assert out.table.to_pylist() == [{"before": None, "after": want},
                                     {"before": None, "after": {**want, "id": 3, "maybe": None}}]
    assert out.indices.to_pylist() == [0, 2]
    assert [r.index for r in out.rejects] == [1] and "ZonedTimestamp" in out.rejects[0].reason
