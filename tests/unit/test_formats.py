"""Unit tests for agents.formats: the Kafka Connect schema envelope, key and metadata columns."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from agents.convert import decode_json
from agents.deadletter import DeadLetters
from agents.formats import (
    ConnectSchemaError,
    Envelopes,
    RecordFormat,
    connect_arrow_schema,
    connect_iceberg_schema,
    decode_envelopes,
    decode_schema,
    split_envelope,
)
from icesink.shared.config import build
from icesink.shared.errors import ConfigError, UnsupportedTypeError
from icesink.shared.metrics import Metrics

C = "org.apache.kafka.connect.data."
D = "io.debezium.time."


@dataclass
class Msg:
    """The attributes of a Faust message that the worker reads."""

    value: bytes | None
    key: bytes | None = None
    offset: int = 0
    partition: int = 3
    topic: str = "orders"
    timestamp: int | None = 1_700_000_000_123  # ms, as aiokafka gives it
    headers: Any = field(default_factory=list)


def struct(*fields: dict[str, Any], optional: bool = False) -> dict[str, Any]:
    return {"type": "struct", "fields": list(fields), "optional": optional}


def fld(field_name: str, type_: str, optional: bool = True, **extra: Any) -> dict[str, Any]:
    return {"field": field_name, "type": type_, "optional": optional, **extra}


def envelope(schema: dict[str, Any], payload: Any) -> bytes:
    """What JsonConverter (schemas.enable=true) writes: compact, schema first."""
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode()


def settings(**extra: Any):
    return build({"topics": "orders", "iceberg.tables": "db.t", **extra})


def only_type(connect_field: dict[str, Any]):
    return connect_iceberg_schema(struct(connect_field)).fields[0]


# ----------------------------------------------------------------------------------------------
# Connect schema -> Iceberg schema
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "connect, expected",
    [
        (fld("x", "int8"), IntegerType()),
        (fld("x", "int16"), IntegerType()),
        (fld("x", "int32"), IntegerType()),
        (fld("x", "int64"), LongType()),
        (fld("x", "float32"), FloatType()),
        (fld("x", "float64"), DoubleType()),
        (fld("x", "boolean"), BooleanType()),
        (fld("x", "string"), StringType()),
        (fld("x", "bytes"), BinaryType()),
        (fld("x", "int64", name=C + "Timestamp"), TimestamptzType()),
        (fld("x", "int32", name=C + "Date"), DateType()),
        (fld("x", "int32", name=C + "Time"), TimeType()),
        (fld("x", "bytes", name=C + "Decimal", parameters={"scale": "2"}), DecimalType(38, 2)),
        (fld("x", "bytes", name=C + "Decimal", parameters={"scale": "3", "connect.decimal.precision": "10"}),
         DecimalType(10, 3)),
        (fld("x", "int64", name=D + "Timestamp"), TimestampType()),
        (fld("x", "int64", name=D + "MicroTimestamp"), TimestampType()),
        (fld("x", "int64", name=D + "NanoTimestamp"), TimestampType()),
        (fld("x", "string", name=D + "ZonedTimestamp"), TimestamptzType()),
        (fld("x", "int32", name=D + "Date"), DateType()),
        (fld("x", "int32", name=D + "Time"), TimeType()),
        (fld("x", "int64", name=D + "MicroTime"), TimeType()),
        (fld("x", "int64", name=D + "NanoTime"), TimeType()),
        (fld("x", "string", name="io.debezium.data.Uuid"), UUIDType()),
        (fld("x", "string", name="io.debezium.data.Json"), StringType()),
        (fld("x", "int32", name="io.debezium.time.Year"), IntegerType()),  # unknown names: the base type
    ],
)
def test_every_connect_type_and_logical_type_maps_to_its_iceberg_type(connect, expected):
    f = only_type(connect)
    assert f.field_type == expected
    assert f.name == "x" and not f.required


def test_optional_decides_required_and_containers_nest():
    schema = connect_iceberg_schema(struct(
        fld("id", "int64", optional=False),
        fld("tags", "array", items={"type": "string", "optional": True}),
        fld("ints", "array", optional=False, items={"type": "int32"}),
        fld("attrs", "map", keys={"type": "string"}, values={"type": "float64", "optional": True}),
        fld("addr", "struct", fields=[fld("zip", "string", optional=False),
                                      fld("seen", "int64", name=C + "Timestamp")]),
    ))
    by = {f.name: f for f in schema.fields}
    assert by["id"].required and not by["tags"].required and by["ints"].required
    tags, ints, attrs, addr = (by[n].field_type for n in ("tags", "ints", "attrs", "addr"))
    assert isinstance(tags, ListType) and tags.element_type == StringType() and not tags.element_required
    assert isinstance(ints, ListType) and ints.element_type == IntegerType() and ints.element_required
    assert isinstance(attrs, MapType) and attrs.key_type == StringType() and attrs.value_type == DoubleType()
    assert not attrs.value_required
    assert isinstance(addr, StructType)
    assert [(f.name, f.field_type, f.required) for f in addr.fields] == [
        ("zip", StringType(), True), ("seen", TimestamptzType(), False)]
    ids = [f.field_id for f in schema.fields]
    assert ids == list(range(1, 6))  # fresh ids, as create_table assigns


@pytest.mark.parametrize(
    "schema, fragment",
    [
        ({"type": "string"}, "'string'; a table row needs a struct"),
        (struct(fld("x", "int128")), "unknown type 'int128'"),
        (struct(fld("x", "string", name=C + "Timestamp")), "annotates int64, found 'string'"),
        (struct(fld("x", "bytes", name=C + "Decimal")), "integer 'scale'"),
        (struct(fld("x", "bytes", name=C + "Decimal", parameters={"scale": "40"})), "precision 38 and scale 40"),
        ({"type": "struct", "fields": "id"}, "list of field schemas"),
        (struct({"type": "int32"}), "'field' name"),
        (struct(fld("a", "array")), "needs a schema in 'items'"),
    ],
)
def test_malformed_connect_schemas_say_what_is_wrong(schema, fragment):
    with pytest.raises(ConnectSchemaError) as err:
        connect_iceberg_schema(schema)
    assert fragment in err.value.reason


def test_maps_with_primitive_keys_map_and_struct_keys_are_unsupported():
    schema = connect_iceberg_schema(struct(fld("m", "map", keys={"type": "int32"}, values={"type": "string"})))
    assert str(schema.find_field("m").field_type) == "map<int, string>"
    with pytest.raises(UnsupportedTypeError, match="keyed by a struct"):
        connect_iceberg_schema(struct(fld("m", "map", keys={"type": "struct", "fields": []}, values={"type": "string"})))


def test_case_folded_connect_fields_take_the_encoding_of_the_first_spelling():
    """Values fold to the first non-null spelling; the encoding comes from the first listed."""
    target = pa.schema([pa.field("amount", pa.decimal128(10, 2))])
    connect = struct(fld("AMOUNT", "bytes", name=C + "Decimal", parameters={"scale": "2"}), fld("Amount", "int64"))
    assert decode_schema(target, connect).field("amount").metadata is None  # case-sensitive: no match
    folded = decode_schema(target, connect, fold_case=True).field("amount")
    assert folded.metadata == {b"icesink.decimal-encoding": b"connect-bytes"}
    exact = struct(fld("Amount", "int64"), fld("amount", "bytes", name=C + "Decimal", parameters={"scale": "2"}))
    assert decode_schema(target, exact, fold_case=True).field("amount").metadata  # the exact spelling first


def test_maps_with_other_keys_read_json_converter_pairs():
    """JsonConverter writes a map whose keys are not strings as an array of [key, value] pairs;
    the envelope's Connect schema says the key type (here a Connect Date: epoch days)."""
    schema = struct(
        fld("id", "int64"),
        fld("byId", "map", keys={"type": "int64"}, values={"type": "string", "optional": True}),
        fld("byDay", "map", keys={"type": "int32", "name": C + "Date"}, values={"type": "int32"}),
    )
    target = schema_to_pyarrow(connect_iceberg_schema(schema))
    payloads = [
        {"id": 1, "byId": [[10, "a"], [-3, None]], "byDay": [[19000, 1]]},
        {"id": 2, "byId": [], "byDay": None},
        {"id": 3, "byId": [[1, "x"], [1, "y"]]},  # one key twice: the record is dead-lettered
    ]
    values = [json.dumps({"schema": schema, "payload": p}).encode() for p in payloads]
    groups, rejects = Envelopes().group(values)
    out = decode_envelopes(groups, rejects, target)
    assert out.table.column("byId").to_pylist() == [[(10, "a"), (-3, None)], []]
    assert out.table.column("byDay").to_pylist() == [[(date(2022, 1, 8), 1)], None]
    assert [(r.index, r.field) for r in out.rejects] == [(2, "byId.1")]


# ----------------------------------------------------------------------------------------------
# Table schema (the truth) + record schema (the encodings)
# ----------------------------------------------------------------------------------------------

TABLE = Schema(
    NestedField(1, "ts", TimestampType()),
    NestedField(2, "tstz", TimestamptzType()),
    NestedField(3, "t", TimeType()),
    NestedField(4, "amount", DecimalType(10, 2)),
    NestedField(5, "n", LongType()),
    NestedField(6, "d", DateType()),
    NestedField(7, "items", ListType(10, StructType(NestedField(11, "at", TimestamptzType())))),
    NestedField(8, "only_in_table", StringType()),
)


def meta(f: pa.Field) -> dict[bytes, bytes]:
    return {k: v for k, v in (f.metadata or {}).items() if k.startswith(b"icesink.")}


def test_decode_schema_takes_encodings_from_the_record_and_types_from_the_table():
    target = schema_to_pyarrow(TABLE)
    record = struct(
        fld("ts", "int64", name=D + "MicroTimestamp"),
        fld("tstz", "int64", name=C + "Timestamp"),
        fld("t", "int64", name=D + "NanoTime"),
        fld("amount", "bytes", name=C + "Decimal", parameters={"scale": "2"}),
        fld("n", "int64", name=C + "Timestamp"),  # a long column keeps the number as it is
        fld("d", "int32", name=C + "Date"),
        fld("items", "array", items=struct(fld("at", "int64", name=D + "Timestamp"))),
        fld("only_in_record", "string"),
    )
    out = decode_schema(target, record)
    assert out.names == target.names and [f.type for f in out] == [f.type for f in target]
    got = {f.name: meta(f) for f in out}
    assert got["ts"] == {b"icesink.epoch-unit": b"us"}
    assert got["tstz"] == {b"icesink.epoch-unit": b"ms"}
    assert got["t"] == {b"icesink.epoch-unit": b"ns"}
    assert got["amount"] == {b"icesink.decimal-encoding": b"connect-bytes"}
    assert got["n"] == got["d"] == got["only_in_table"] == {}
    element = out.field("items").type.value_type
    assert meta(element.field("at")) == {b"icesink.epoch-unit": b"ms"}
    assert out.field("ts").metadata[b"PARQUET:field_id"] == b"1"  # the table's metadata is kept


def test_decimal_scale_differing_from_the_column_is_refused():
    record = struct(fld("amount", "bytes", name=C + "Decimal", parameters={"scale": "3"}))
    with pytest.raises(ConnectSchemaError) as err:
        decode_schema(schema_to_pyarrow(TABLE), record)
    assert err.value.field == "amount" and "scale 3" in err.value.reason and "decimal(10, 2)" in err.value.reason


# ----------------------------------------------------------------------------------------------
# Envelopes
# ----------------------------------------------------------------------------------------------

S = struct(fld("id", "int64", optional=False), fld("name", "string"))


@pytest.mark.parametrize(
    "value",
    [
        envelope(S, {"id": 1, "name": "a"}),
        json.dumps({"schema": S, "payload": {"id": 1, "name": "a"}}, indent=2).encode(),
        json.dumps({"payload": {"id": 1, "name": "a"}, "schema": S}).encode(),
        b"\xef\xbb\xbf" + envelope(S, {"id": 1, "name": "a"}),
    ],
)
def test_split_envelope_in_any_order_and_spacing(value):
    schema, payload = split_envelope(value)
    assert schema == S and json.loads(payload) == {"id": 1, "name": "a"}


@pytest.mark.parametrize(
    "value, fragment",
    [
        (None, "tombstone"),
        (b'{"id": 1}', "no 'schema' or 'payload' key (was it written with value.converter.schemas.enable=false?)"),
        (b'{"schema": {"type": "struct", "fields": []}}', "no 'payload' key"),
        (b'[1, 2]', "not a JSON object"),
        (b'{"schema": {}, "payload": {}, "schema": {}}', "duplicate key 'schema'"),
        (b'{"schema": {"type": "struct", "fields": []}, "payload": {"id": ', "malformed JSON"),
        (b'{"schema": {}, "payload": {}} x', "malformed JSON"),
        (b'\xff{}', "invalid UTF-8"),
    ],
)
def test_split_envelope_names_what_is_wrong(value, fragment):
    reason = split_envelope(value)
    assert isinstance(reason, str) and fragment in reason


def connect_format(**extra: Any) -> RecordFormat:
    return RecordFormat(settings(**{"value.converter.schemas.enable": "true", **extra}))


def test_envelopes_decode_in_bulk_grouped_by_schema_in_input_order():
    other = struct(fld("id", "int64", optional=False), fld("name", "string"), fld("extra", "boolean"))
    # A "payload" key inside the schema (a parameter) makes the byte search cut wrongly.
    tricky = struct(fld("id", "int64", optional=False, parameters={"payload": "x"}), fld("name", "string"))
    values = [envelope(other if i % 3 == 1 else S, {"id": i, "name": f"n{i}", "extra": True}) for i in range(100)]
    values[50] = envelope(tricky, {"id": 50, "name": "n50"})
    values[60] = json.dumps({"payload": {"id": 60, "name": "n60"}, "schema": S}).encode()
    target = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
    msgs = [Msg(v, offset=i) for i, v in enumerate(values)]
    out = connect_format().convert(msgs, values, target)
    out.validate()
    assert out.rejects == ()
    assert out.table.schema == target
    assert out.table.column("id").to_pylist() == list(range(100))
    assert out.table.column("name").to_pylist() == [f"n{i}" for i in range(100)]
    assert out.indices.to_pylist() == list(range(100))


def test_malformed_envelopes_are_rejects_dead_lettered_with_their_position(tmp_path):
    values: list[bytes | None] = [envelope(S, {"id": i, "name": "x"}) for i in range(40)]
    values[2] = b'{"id": 2}'
    values[5] = None
    values[7] = b'{"schema": {"type": "string"}, "payload": "hello"}'
    values[9] = b'{"schema": null, "payload": {"id": 9}}'
    values[11] = envelope(S, {"id": "eleven"})
    values[13] = envelope(S, None)
    values[15] = b'{"schema": {"type": "struct", "fields": [{"field": "id", "type": "uint8"}]}, "payload": {}}'
    values[17] = b'{"schema":{"type":"struct","fields":[]},"payload":{"id":'
    msgs = [Msg(v, key=b"k", offset=1000 + i) for i, v in enumerate(values)]
    target = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
    out = connect_format().convert(msgs, [v or b"" for v in values], target)
    out.validate()
    reasons = {r.index: r for r in out.rejects}
    assert set(reasons) == {2, 5, 7, 9, 11, 13, 15, 17}
    assert "no 'schema' or 'payload'" in reasons[2].reason
    assert "tombstone" in reasons[5].reason
    assert "'string'; a table row needs a struct" in reasons[7].reason
    assert "the schema is null" in reasons[9].reason
    assert reasons[11].field == "id" and "'eleven'" in reasons[11].reason
    assert "null" in reasons[13].reason
    assert "unknown type 'uint8'" in reasons[15].reason and reasons[15].field == "id"
    assert "malformed JSON" in reasons[17].reason
    assert out.table.column("id").to_pylist() == [i for i in range(40) if i not in reasons]

    metrics = Metrics(CollectorRegistry())
    settings = build({"topics": "orders", "iceberg.tables": "db.t", "errors.tolerance": "all",
                      "state.dir": str(tmp_path)})
    asyncio.run(DeadLetters(settings, metrics, "w1").reject(msgs, [(r, "db.t") for r in out.rejects]))
    lines = [json.loads(line) for line in (tmp_path / "deadletter" / "orders.jsonl").read_text().splitlines()]
    assert [(d["topic"], d["partition"], d["offset"]) for d in lines] == [("orders", 3, 1000 + i) for i in sorted(reasons)]
    assert lines[0]["error"].startswith(reasons[2].reason)
    assert base64.b64decode(lines[0]["value"]) == b'{"id": 2}'


def test_without_a_table_every_record_is_a_reject():
    values = [b'{"id": 1}', envelope(S, {"id": 2})]
    out = connect_format().convert([Msg(v) for v in values], values, None)
    assert out.table.num_rows == 0 and [r.index for r in out.rejects] == [0, 1]
    assert "does not exist" in out.rejects[1].reason


def test_table_schema_comes_from_the_first_struct_envelope_with_extra_columns():
    fmt = connect_format(**{"iceberg.tables.kafka-metadata-enabled": "true", "iceberg.tables.key-column": "_key"})
    ts = struct(fld("id", "int64", optional=False), fld("at", "int64", name=C + "Timestamp"),
                fld("amount", "bytes", name=C + "Decimal", parameters={"scale": "2"}))
    bad = struct(fld("id", "uint8"))
    schema = fmt.table_schema([b"garbage", envelope({"type": "string"}, "x"), envelope(bad, {}), envelope(ts, {"id": 1})])
    assert isinstance(schema, Schema)
    assert [(f.name, str(f.field_type), f.required) for f in schema.fields] == [
        ("id", "long", True), ("at", "timestamptz", False), ("amount", "decimal(38, 2)", False),
        ("_key", "string", False), ("_kafka_metadata_topic", "string", False),
        ("_kafka_metadata_partition", "int", False), ("_kafka_metadata_offset", "long", False),
        ("_kafka_metadata_timestamp", "timestamptz", False),
        ("_kafka_metadata_headers", "list<struct<11: key: optional string, 12: value: optional binary>>", False),
    ]
    assert fmt.table_schema([b"garbage", None]) is None


def test_table_schema_keeps_map_and_uuid_columns():
    fmt = connect_format()
    maps = struct(fld("m", "map", keys={"type": "string"}, values={"type": "string"}))
    assert fmt.table_schema([envelope(maps, {})]) is not None  # decode_json fills maps
    uuids = fmt.table_schema([envelope(struct(fld("u", "string", name="io.debezium.data.Uuid")), {})])
    assert isinstance(uuids, Schema) and str(uuids.find_field("u").field_type) == "uuid"  # pyarrow writes it
    assert fmt.table_schema([envelope(struct(fld("t", "int32", name=C + "Time")), {})]) is not None


def test_plain_json_without_extras_is_decode_json_unchanged():
    fmt = RecordFormat(settings())
    assert fmt.plain
    values = [json.dumps({"id": i}).encode() for i in range(30)]
    target = pa.schema([pa.field("id", pa.int64())])
    assert fmt.convert([Msg(v) for v in values], values, target) == decode_json(values, target)
    assert fmt.table_schema(values) == pa.schema([pa.field("id", pa.int64())])


# ----------------------------------------------------------------------------------------------
# Key and metadata columns
# ----------------------------------------------------------------------------------------------


def test_key_and_flat_metadata_columns_on_plain_json():
    fmt = RecordFormat(settings(**{"iceberg.tables.kafka-metadata-enabled": "true", "iceberg.tables.key-column": "_key"}))
    values = [json.dumps({"id": i}).encode() for i in range(30)]
    values[4] = b"not json"
    msgs = [Msg(v, key=None if i == 1 else f"k{i}".encode(), offset=500 + i, timestamp=1_700_000_000_500 + 1000 * i,
                headers=[("trace", b"t%d" % i), ("trace", b"\xff")] if i == 2 else ())
            for i, v in enumerate(values)]
    msgs[3].timestamp = None
    schema = fmt.table_schema(values)
    target = schema_to_pyarrow(schema)
    out = fmt.convert(msgs, values, target)
    out.validate()
    assert [r.index for r in out.rejects] == [4]
    assert out.table.schema == target
    rows = out.table.to_pylist()
    assert [r["id"] for r in rows] == [i for i in range(30) if i != 4]
    first, second, third, fourth = rows[:4]
    assert first["_key"] == "k0" and second["_key"] is None
    assert first["_kafka_metadata_topic"] == "orders" and first["_kafka_metadata_partition"] == 3
    assert [r["_kafka_metadata_offset"] for r in rows[:4]] == [500, 501, 502, 503]
    assert first["_kafka_metadata_timestamp"] == datetime(2023, 11, 14, 22, 13, 20, 500_000, tzinfo=UTC)
    assert fourth["_kafka_metadata_timestamp"] is None
    assert third["_kafka_metadata_headers"] == [{"key": "trace", "value": b"t2"}, {"key": "trace", "value": b"\xff"}]
    assert first["_kafka_metadata_headers"] == []


def test_nested_metadata_and_binary_keys():
    fmt = RecordFormat(settings(**{
        "iceberg.tables.kafka-metadata-enabled": "true", "iceberg.tables.kafka-metadata-nested": "true",
        "iceberg.tables.kafka-metadata-field": "_pos", "iceberg.tables.key-column": "k",
        "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
    }))
    values = [b'{"id": 1}'] * 20
    msgs = [Msg(v, key=b"\xff\x00", offset=i, headers={"a": b"b"}) for i, v in enumerate(values)]
    target = schema_to_pyarrow(fmt.table_schema(values))
    assert target.field("k").type == pa.large_binary()
    out = fmt.convert(msgs, values, target)
    row = out.table.to_pylist()[7]
    assert row["k"] == b"\xff\x00"
    assert row["_pos"]["offset"] == 7 and row["_pos"]["topic"] == "orders"
    assert row["_pos"]["headers"] == [{"key": "a", "value": b"b"}]


def test_keys_that_are_not_utf8_are_rejects_for_a_string_key_column():
    fmt = RecordFormat(settings(**{"iceberg.tables.key-column": "_key"}))
    values = [b'{"id": 1}'] * 20
    msgs = [Msg(v, key=b"\xc3(" if i == 6 else b"ok", offset=i) for i, v in enumerate(values)]
    out = fmt.convert(msgs, values, schema_to_pyarrow(fmt.table_schema(values)))
    out.validate()
    assert [(r.index, r.field) for r in out.rejects] == [(6, "_key")]
    assert "not UTF-8" in out.rejects[0].reason
    assert out.table.num_rows == 19 and 6 not in out.indices.to_pylist()


def test_an_existing_table_gets_the_metadata_columns_it_has_in_its_types():
    """A table made by the reference's KafkaMetadataTransform holds the timestamp as a long (ms)."""
    fmt = RecordFormat(settings(**{"iceberg.tables.kafka-metadata-enabled": "true"}))
    table = Schema(
        NestedField(1, "id", LongType()),
        NestedField(2, "_kafka_metadata_offset", LongType()),
        NestedField(3, "_kafka_metadata_timestamp", LongType()),
        NestedField(4, "_kafka_metadata_partition", LongType()),
    )
    values = [b'{"id": 1}'] * 20
    msgs = [Msg(v, offset=i, timestamp=1_700_000_000_123) for i, v in enumerate(values)]
    out = fmt.convert(msgs, values, schema_to_pyarrow(table))
    row = out.table.to_pylist()[3]
    assert row == {"id": 1, "_kafka_metadata_offset": 3, "_kafka_metadata_timestamp": 1_700_000_000_123,
                   "_kafka_metadata_partition": 3}


def test_metadata_column_of_an_impossible_type_is_a_config_error():
    fmt = RecordFormat(settings(**{"iceberg.tables.kafka-metadata-enabled": "true"}))
    table = pa.schema([pa.field("_kafka_metadata_headers", pa.int64())])
    with pytest.raises(ConfigError, match="_kafka_metadata_headers"):
        fmt.convert([Msg(b"{}")], [b"{}"], table)


def test_settings():
    s = settings(**{"value.converter.schemas.enable": "true", "iceberg.tables.key-column": "_key"})
    assert s.value_converter_schemas_enable and s.key_column == "_key" and not s.kafka_metadata
    with pytest.raises(ConfigError) as err:
        settings(**{"iceberg.tables.kafka-metadata-enabled": "true", "iceberg.tables.key-column": "_kafka_metadata_key"})
    assert err.value.key == "iceberg.tables.key-column"


# ----------------------------------------------------------------------------------------------
# Values through the decode_json contract (icesink.epoch-unit, icesink.decimal-encoding)
# ----------------------------------------------------------------------------------------------


def connect_decimal(value: Decimal, scale: int) -> str:
    unscaled = int(value.scaleb(scale))
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()


def test_connect_logical_values_decode_exactly():
    schema = struct(
        fld("id", "int64", optional=False),
        fld("at", "int64", name=C + "Timestamp"),
        fld("day", "int32", name=C + "Date"),
        fld("tod", "int32", name=C + "Time"),
        fld("amount", "bytes", name=C + "Decimal", parameters={"scale": "2", "connect.decimal.precision": "10"}),
        fld("micros", "int64", name=D + "MicroTimestamp"),
        fld("zoned", "string", name=D + "ZonedTimestamp"),
    )
    payload = {"id": 1, "at": 1_700_000_000_123, "day": 19_000, "tod": 3_723_004,
               "amount": connect_decimal(Decimal("-1234.56"), 2), "micros": 1_700_000_000_123_456,
               "zoned": "2024-01-02T03:04:05.5+02:00"}
    values = [envelope(schema, payload)] * 20
    fmt = connect_format()
    table = Schema(*[f for f in connect_iceberg_schema(schema).fields if f.name != "tod"],
                   NestedField(99, "tod", TimeType()))
    out = fmt.convert([Msg(v) for v in values], values, schema_to_pyarrow(table))
    assert out.rejects == ()
    row = out.table.to_pylist()[0]
    assert row["at"] == datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC)
    assert row["day"] == date(2022, 1, 8)
    assert row["tod"] == time(1, 2, 3, 4000)
    assert row["amount"] == Decimal("-1234.56")
    assert row["micros"] == datetime(2023, 11, 14, 22, 13, 20, 123_456)
    assert row["zoned"] == datetime(2024, 1, 2, 1, 4, 5, 500_000, tzinfo=UTC)


def test_grow_gets_the_stated_schema_of_each_well_formed_group():
    """Schema-driven evolution: ``grow`` sees what each record group's Connect schema needs
    (malformed schemas state nothing: their records are rejects) and the batch is decoded
    against the schema it returns, the key column filled around it."""
    fmt = RecordFormat(settings(**{"value.converter.schemas.enable": "true", "iceberg.tables.key-column": "_key"}))
    old = struct(fld("id", "int32", optional=False))
    new = struct(fld("id", "int64", optional=False), fld("at", "int32", name=C + "Date"))
    values = [envelope(old, {"id": 1}), envelope(struct(fld("x", "nope")), {}), envelope(new, {"id": 2**40, "at": 3})]
    msgs = [Msg(v, key=b"k%d" % i, offset=i) for i, v in enumerate(values)]
    table = pa.schema([pa.field("id", pa.int32(), nullable=False), pa.field("_key", pa.large_string())])
    seen: list[pa.Schema] = []

    def grow(wanted):
        seen.extend(wanted)
        return pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("_key", pa.large_string()),
                          pa.field("at", pa.date32())])

    out = fmt.convert(msgs, values, table, grow=grow)
    assert [(f.name, f.type, f.nullable) for w in seen for f in w] == [
        ("id", pa.int32(), False), ("id", pa.int64(), False), ("at", pa.date32(), True)]
    assert connect_arrow_schema(struct(fld("x", "nope"))) is None
    assert [r.index for r in out.rejects] == [1]
    assert out.table.to_pylist() == [{"id": 1, "_key": "k0", "at": None}, {"id": 2**40, "_key": "k2", "at": date(1970, 1, 4)}]
