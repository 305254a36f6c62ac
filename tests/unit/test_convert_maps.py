"""Map columns in agents.convert.decode_json: JSON objects -> map<K, V> entries in the object's
order, keys and values coerced as columns of their types would be, rejects naming the entry.
No services.

Every case runs at two batch sizes: one record (the per-record reference path) and a batch big
enough for the bulk path (records rewritten as entry lists); both must agree.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, MapType, NestedField, StringType, StructType

import agents.convert as convert
from agents.convert import limits
from agents.convert import DECIMAL_ENCODING, EPOCH_UNIT, check_schema, decode_json, infer_schema, with_field_metadata
from icesink.shared.errors import UnsupportedTypeError

BULK = 3 * limits.SMALL_RUN
SIZES = [1, BULK]
TS = pa.timestamp("us")


def schema_of(t: pa.DataType, *, nullable: bool = True) -> pa.Schema:
    return pa.schema([pa.field("id", pa.int64()), pa.field("x", t, nullable=nullable)])


def map_of(value: pa.DataType | pa.Field, key: pa.DataType = pa.string()) -> pa.DataType:  # noqa: B008 - immutable
    return pa.map_(key, value)


def decode_raw(schema: pa.Schema, text: str, size: int, filler: str = "null") -> Any:
    """Decode the record ``{"id": 1, "x": <text>}`` after ``size - 1`` fillers: its x, or its Reject."""
    values = [f'{{"id": 0, "x": {filler}}}'.encode()] * (size - 1)
    values.append(f'{{"id": 1, "x": {text}}}'.encode())
    result = decode_json(values, schema)
    result.validate()
    assert result.table.schema.equals(schema, check_metadata=True)
    mine = [r for r in result.rejects if r.index == size - 1]
    if mine:
        return mine[0]
    assert not result.rejects, result.rejects
    assert result.indices.to_pylist() == list(range(size))
    return result.table.column("x")[-1].as_py()


def ok(schema: pa.Schema, text: str, size: int, **kw: Any) -> Any:
    out = decode_raw(schema, text, size, **kw)
    assert not isinstance(out, convert.Reject), out
    return out


def rejected(schema: pa.Schema, text: str, size: int, field: str, why: str) -> None:
    out = decode_raw(schema, text, size)
    assert isinstance(out, convert.Reject), f"expected a reject, found {out!r}"
    assert (out.field, why in out.reason) == (field, True), out


# --------------------------------------------------------------------------------------------
# Shape: entries, order, nulls, non-objects
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_object_becomes_entries_in_the_objects_order(size: int) -> None:
    schema = schema_of(map_of(pa.int64()))
    assert ok(schema, '{"z": 1, "a": 2, "m": -3}', size) == [("z", 1), ("a", 2), ("m", -3)]
    assert ok(schema, "{}", size) == []
    assert ok(schema, "null", size) is None
    assert ok(schema, '{"é ü": 1, "a.b": 2, "": 3}', size) == [("é ü", 1), ("a.b", 2), ("", 3)]


@pytest.mark.parametrize("size", SIZES)
def test_missing_map_is_null_and_required_map_rejects(size: int) -> None:
    values = [b'{"id": 1}'] * size
    result = decode_json(values, schema_of(map_of(pa.int64())))
    assert result.table.column("x").to_pylist() == [None] * size
    required = schema_of(map_of(pa.int64()), nullable=False)
    rejected(required, "null", size, "x", "required field is null or missing")
    result = decode_json(values, required)
    assert [(r.field, r.reason) for r in result.rejects] == [("x", "required field is null or missing")] * size


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("text", ['[{"k": "a", "v": 1}]', '"a=1"', "7", "true", '[["a"]]', '[["a", 1, 2]]', '["a", 1]'])
def test_non_object_rejects(size: int, text: str) -> None:
    rejected(schema_of(map_of(pa.int64())), text, size, "x",
             "to map: expected a JSON object or an array of [key, value] pairs")


@pytest.mark.parametrize("size", SIZES)
def test_null_values_and_required_values(size: int) -> None:
    assert ok(schema_of(map_of(pa.int64())), '{"a": null, "b": 2}', size) == [("a", None), ("b", 2)]
    required = schema_of(pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False)))
    assert ok(required, '{"a": 1}', size) == [("a", 1)]
    rejected(required, '{"a": 1, "b": null}', size, "x.b", "required field is null or missing")


@pytest.mark.parametrize("size", SIZES)
def test_duplicate_keys_are_malformed_json(size: int) -> None:
    out = decode_raw(schema_of(map_of(pa.int64())), '{"a": 1, "a": 2}', size)
    assert isinstance(out, convert.Reject) and "duplicate key 'a'" in out.reason


# --------------------------------------------------------------------------------------------
# Values: coerced exactly as a column of the value type
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_values_follow_column_rules(size: int) -> None:
    assert ok(schema_of(map_of(pa.int32())), '{"a": "42", "b": 7, "c": 1e2}', size) == [("a", 42), ("b", 7), ("c", 100)]
    rejected(schema_of(map_of(pa.int32())), '{"a": 1, "b": 1.5}', size, "x.b", "fractional part")
    rejected(schema_of(map_of(pa.int32())), '{"a": 3000000000}', size, "x.a", "out of range")
    rejected(schema_of(map_of(pa.int64())), '{"a": 1, "b": "abc"}', size, "x.b", "cannot coerce 'abc' to long")
    assert ok(schema_of(map_of(pa.bool_())), '{"a": true, "b": "false"}', size) == [("a", True), ("b", False)]
    # Numbers keep their JSON text in string values and their exact digits in decimals.
    assert ok(schema_of(map_of(pa.string())), '{"a": 1.50, "b": "s", "c": {"n": 1e3}}', size) == [
        ("a", "1.50"), ("b", "s"), ("c", '{"n":1e3}')
    ]
    # A NUL escape (the rewrite's number marker) goes to the reference path, still exact.
    assert ok(schema_of(map_of(pa.string())), '{"a": "x\\u0000y", "b": 2.50}', size) == [("a", "x\x00y"), ("b", "2.50")]
    big = "12345678901234567890.123456789012345678"
    assert ok(schema_of(map_of(pa.decimal128(38, 18))), f'{{"a": {big}}}', size) == [("a", Decimal(big))]
    rejected(schema_of(map_of(pa.int64())), '{"a": 1.0000000000000000001}', size, "x.a", "fractional part")


@pytest.mark.parametrize("size", SIZES)
def test_temporal_values_honour_the_value_fields_epoch_unit(size: int) -> None:
    seconds = schema_of(map_of(pa.field("value", TS, metadata={EPOCH_UNIT: "s"})))
    assert ok(seconds, '{"a": 86400, "b": "2024-03-01T12:00:00+01:00"}', size) == [
        ("a", datetime(1970, 1, 2)), ("b", datetime(2024, 3, 1, 11))
    ]
    millis = schema_of(map_of(TS))  # decode_json's default unit: ms
    assert ok(millis, '{"a": 86400000}', size) == [("a", datetime(1970, 1, 2))]
    rejected(millis, '{"a": 1, "b": 1700000000000000}', size, "x.b", "is the unit right?")
    assert ok(schema_of(map_of(pa.date32())), '{"d": "2024-02-29"}', size)[0][1].isoformat() == "2024-02-29"
    rejected(schema_of(map_of(pa.date32())), '{"d": "2023-02-29"}', size, "x.d", "cannot coerce")


@pytest.mark.parametrize("size", SIZES)
def test_binary_uuid_and_connect_decimal_values(size: int) -> None:
    u = uuid.uuid4()
    assert ok(schema_of(map_of(pa.uuid())), f'{{"u": "{u}"}}', size) == [("u", u)]
    rejected(schema_of(map_of(pa.uuid())), '{"u": "nope"}', size, "x.u", "to uuid")
    b64 = base64.b64encode(b"\x00\xffhi").decode()
    assert ok(schema_of(map_of(pa.binary())), f'{{"b": "{b64}"}}', size) == [("b", b"\x00\xffhi")]
    # 1e10 reads as valid base64 if it were quoted: a number must stay a reject.
    rejected(schema_of(map_of(pa.binary())), '{"b": 1e10}', size, "x.b", "expected a base64 string")
    connect = schema_of(map_of(pa.field("value", pa.decimal128(10, 2), metadata={DECIMAL_ENCODING: "connect-bytes"})))
    unscaled = base64.b64encode((-12345).to_bytes(2, "big", signed=True)).decode()
    assert ok(connect, f'{{"p": "{unscaled}"}}', size) == [("p", Decimal("-123.45"))]
    rejected(connect, '{"p": 12}', size, "x.p", "Kafka Connect Decimal")


# --------------------------------------------------------------------------------------------
# Keys: the object's key text coerced to the key type
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_integer_keys_from_key_text(size: int) -> None:
    schema = schema_of(map_of(pa.string(), key=pa.int32()))
    assert ok(schema, '{"42": "a", "-7": "b", "0": "c"}', size) == [(42, "a"), (-7, "b"), (0, "c")]
    assert ok(schema, '{"007": "a", "+8": "b"}', size) == [(7, "a"), (8, "b")]  # as numeric strings are
    rejected(schema, '{"1": "a", "abc": "b"}', size, "x.abc", "map key: cannot coerce 'abc' to int")
    rejected(schema, '{"3000000000": "a"}', size, "x.3000000000", "map key: cannot coerce")
    rejected(schema, '{"1": "a", "01": "b"}', size, "x.01", "map key '01' is the same int as key '1'")


@pytest.mark.parametrize("size", SIZES)
def test_other_key_types(size: int) -> None:
    dates = schema_of(map_of(pa.int64(), key=pa.date32()))
    out = ok(dates, '{"2024-01-02": 1}', size)
    assert [(k.isoformat(), v) for k, v in out] == [("2024-01-02", 1)]
    rejected(dates, '{"tomorrow": 1}', size, "x.tomorrow", "map key: cannot coerce 'tomorrow' to date")
    longs = schema_of(map_of(pa.int64(), key=pa.int64()))
    assert ok(longs, '{"9223372036854775807": 1}', size) == [(2**63 - 1, 1)]


# --------------------------------------------------------------------------------------------
# Arrays of [key, value] pairs (Kafka Connect's JsonConverter, keys that are not strings)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_arrays_of_pairs_are_entries_in_their_order(size: int) -> None:
    ints = schema_of(map_of(pa.string(), key=pa.int32()))
    assert ok(ints, '[[42, "a"], [-7, "b"], [0, "c"]]', size) == [(42, "a"), (-7, "b"), (0, "c")]
    assert ok(ints, '[["5", "numeric text"]]', size) == [(5, "numeric text")]
    assert ok(ints, "[]", size) == []
    rejected(ints, '[[1, "a"], [1.5, "b"]]', size, "x.1.5", "map key: cannot coerce '1.5' to int")
    rejected(ints, '[[1, "a"], [1, "b"]]', size, "x.1", "map key '1' is the same int as key '1'")
    rejected(ints, '[[1, "a"], [null, "b"]]', size, "x[1]", "map key: expected a string, number or boolean, found null")
    rejected(ints, '[[{"a": 1}, "b"]]', size, "x[0]", "map key: expected a string, number or boolean, found an object")
    rejected(ints, '[[3000000000, "a"]]', size, "x.3000000000", "map key: cannot coerce")
    doubles = schema_of(map_of(pa.int64(), key=pa.float64()))
    assert ok(doubles, '[[1.5, 1], [-2e3, 2], [7, 3]]', size) == [(1.5, 1), (-2000.0, 2), (7.0, 3)]
    bools = schema_of(map_of(pa.int64(), key=pa.bool_()))
    assert ok(bools, '[[true, 1], [false, 0]]', size) == [(True, 1), (False, 0)]
    rejected(bools, '[[true, 1], ["true", 2]]', size, "x.true", "map key 'true' is the same boolean")
    texts = schema_of(map_of(pa.int64()))  # string keys: a key is its JSON text
    assert ok(texts, '[["a", 1], [2, 2], [-0, 3], [1.50, 4], [false, 5]]', size) == [
        ("a", 1), ("2", 2), ("-0", 3), ("1.50", 4), ("false", 5)
    ]


@pytest.mark.parametrize("size", SIZES)
def test_pairs_nested_and_holding_structs(size: int) -> None:
    point = pa.struct([pa.field("n", pa.int64())])
    of_struct = schema_of(map_of(point, key=pa.int64()))
    assert ok(of_struct, '[[1, {"n": 1}], [2, null]]', size) == [(1, {"n": 1}), (2, None)]
    rejected(of_struct, '[[1, {"n": "x"}]]', size, "x.1.n", "cannot coerce 'x' to long")
    in_list = schema_of(pa.list_(map_of(pa.string(), key=pa.int32())))
    assert ok(in_list, '[[[1, "a"]], {"2": "b"}, []]', size) == [[(1, "a")], [(2, "b")], []]


def test_bulk_batch_of_pairs_matches_the_reference_path() -> None:
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("m", map_of(pa.string(), key=pa.int64()))])
    values = [json.dumps({"id": i, "m": [[i, f"v{i}"], [-i - 1, None]]}).encode() for i in range(200)]
    values[10] = b'{"id": 10, "m": [[1, "a"], [1, "b"]]}'
    values[11] = b'{"id": 11, "m": [[null, "a"]]}'
    values[12] = b'{"id": 12, "m": [[0, "zero"], ["007", "seven"]]}'
    whole = decode_json(values, schema)
    rows = dict(zip(whole.indices.to_pylist(), whole.table.to_pylist(), strict=True))
    assert sorted(r.index for r in whole.rejects) == [10, 11]
    assert rows[5]["m"] == [(5, "v5"), (-6, None)] and rows[12]["m"] == [(0, "zero"), (7, "seven")]
    for i, value in enumerate(values):
        alone = decode_json([value], schema)
        assert alone.table.to_pylist() == ([rows[i]] if i in rows else []), i


# --------------------------------------------------------------------------------------------
# Nesting
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_maps_nested_anywhere(size: int) -> None:
    point = pa.struct([pa.field("n", pa.int64()), pa.field("s", pa.string())])
    of_struct = schema_of(map_of(point))
    assert ok(of_struct, '{"a": {"n": 1, "s": "x"}, "b": null, "c": {}}', size) == [
        ("a", {"n": 1, "s": "x"}), ("b", None), ("c", {"n": None, "s": None})
    ]
    rejected(of_struct, '{"a": {"n": 1}, "b": {"n": "two"}}', size, "x.b.n", "cannot coerce 'two' to long")
    rejected(of_struct, '{"a": [1]}', size, "x.a", "to struct: expected a JSON object")

    of_list = schema_of(map_of(pa.list_(pa.int64())))
    assert ok(of_list, '{"a": [1, 2], "b": []}', size) == [("a", [1, 2]), ("b", [])]
    rejected(of_list, '{"a": [1, "x"]}', size, "x.a[1]", "cannot coerce 'x' to long")

    of_map = schema_of(map_of(map_of(pa.int64())))
    assert ok(of_map, '{"a": {"p": 1, "q": 2}, "b": {}, "c": null}', size) == [
        ("a", [("p", 1), ("q", 2)]), ("b", []), ("c", None)
    ]
    rejected(of_map, '{"a": {"p": 1, "q": "z"}}', size, "x.a.q", "cannot coerce 'z' to long")
    rejected(of_map, '{"a": 5}', size, "x.a", "to map: expected a JSON object")

    list_of = schema_of(pa.list_(map_of(pa.int64())))
    assert ok(list_of, '[{"a": 1}, {}, null, {"b": 2, "c": 3}]', size) == [
        [("a", 1)], [], None, [("b", 2), ("c", 3)]
    ]
    rejected(list_of, '[{"a": 1}, {"b": "x"}]', size, "x[1].b", "cannot coerce 'x' to long")

    in_struct = schema_of(pa.struct([pa.field("id", pa.string()), pa.field("tags", map_of(pa.string()))]))
    assert ok(in_struct, '{"id": "i", "tags": {"k": "v"}}', size) == {"id": "i", "tags": [("k", "v")]}
    rejected(in_struct, '{"id": "i", "tags": ["k"]}', size, "x.tags", "to map: expected a JSON object")


def test_bulk_batch_of_varied_maps_matches_the_reference_path() -> None:
    """Mixed kinds across records (numbers and numeric strings), some bad records, pretty-printed
    and BOM-prefixed ones: the bulk answer equals each record decoded alone."""
    schema = pa.schema([
        pa.field("id", pa.int64()),
        pa.field("m", map_of(pa.int64())),
        pa.field("s", pa.struct([pa.field("tags", map_of(pa.string(), key=pa.int32()))])),
    ])
    values = []
    for i in range(200):
        m = {"a": i, "b": str(i)} if i % 3 else {"c": None}
        doc = {"id": i, "m": m, "s": {"tags": {str(i): f"t{i}"}}}
        text = json.dumps(doc, indent=2 if i % 17 == 0 else None).encode()
        if i % 29 == 0:
            text = b"\xef\xbb\xbf" + text
        values.append(text)
    values[50] = b'{"id": 50, "m": {"a": "x"}}'
    values[51] = b'{"id": 51, "m": {"a": 1, "a": 2}}'
    values[52] = b'{"id": 52, "m": {"a": NaN}}'
    values[53] = b'{"id": 53, "m": {"a": "\\u0000"}}'
    values[54] = b'{"id": 54, "m": [{"k": "a", "v": 1}]}'
    values[55] = b'{"id": 55, "s": {"tags": {"07": "x"}}}'
    values[56] = None
    values[57] = b'{"id": 57, "m": {"a": 1}'
    whole = decode_json(values, schema)
    whole.validate()
    rows = dict(zip(whole.indices.to_pylist(), whole.table.to_pylist(), strict=True))
    rejects = {r.index: (r.field, r.reason) for r in whole.rejects}
    assert set(rejects) == {50, 51, 52, 53, 54, 56, 57}
    assert rejects[50] == ("m.a", "cannot coerce 'x' to long")
    assert rows[55]["s"] == {"tags": [(7, "x")]}
    assert rows[4]["m"] == [("a", 4), ("b", 4)] and rows[4]["s"] == {"tags": [(4, "t4")]}
    assert rows[3]["m"] == [("c", None)]
    for i, value in enumerate(values):
        alone = decode_json([value], schema)
        if i in rejects:
            assert [(r.field, r.reason) for r in alone.rejects] == [rejects[i]], i
        else:
            assert alone.table.to_pylist() == [rows[i]], i


def test_schemas_without_maps_skip_the_rewrite(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object) -> None:
        raise AssertionError("rewrote a batch without maps")

    monkeypatch.setattr(convert, "rewritten", boom)
    result = decode_json([b'{"x": {"a": 1}}'] * BULK, schema_of(pa.struct([pa.field("a", pa.int64())])))
    assert result.table.num_rows == BULK


# --------------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------------


def test_iceberg_map_columns_decode() -> None:
    schema = schema_to_pyarrow(Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "attrs", MapType(3, StringType(), 4, LongType(), value_required=True)),
        NestedField(5, "byid", MapType(6, IntegerType(), 7, StructType(NestedField(8, "n", StringType())))),
    ))
    check_schema(schema)
    values = [b'{"id": 1, "attrs": {"a": 1}, "byid": {"5": {"n": "x"}}}'] * BULK + [b'{"id": 2, "attrs": {"a": null}}']
    result = decode_json(values, schema)
    assert result.table.schema.equals(schema, check_metadata=True)
    assert result.table.num_rows == BULK
    assert result.table.to_pylist()[0] == {"id": 1, "attrs": [("a", 1)], "byid": [(5, {"n": "x"})]}
    assert [(r.index, r.field) for r in result.rejects] == [(BULK, "attrs.a")]


def test_map_keys_must_be_scalars() -> None:
    with pytest.raises(UnsupportedTypeError) as info:
        check_schema(schema_of(pa.map_(pa.struct([pa.field("a", pa.int64())]), pa.int64())))
    assert info.value.field == "x.key"
    with pytest.raises(UnsupportedTypeError) as info:
        check_schema(schema_of(map_of(pa.timestamp("us", tz="Europe/Paris"))))
    assert info.value.field == "x.value"


def test_field_metadata_reaches_map_keys_and_values() -> None:
    schema = with_field_metadata(schema_of(map_of(TS, key=TS)), {"x.value": {EPOCH_UNIT: "s"}, "x.key": {EPOCH_UNIT: "us"}})
    t = schema.field("x").type
    assert t.item_field.metadata == {EPOCH_UNIT.encode(): b"s"} and t.key_field.metadata == {EPOCH_UNIT.encode(): b"us"}
    assert ok(schema, '{"86400000000": 60}', 1) == [(datetime(1970, 1, 2), datetime(1970, 1, 1, 0, 1))]


def test_inference_still_reads_objects_as_structs() -> None:
    schema = infer_schema([b'{"attrs": {"a": 1, "b": "x"}}', b'{"attrs": {"c": true}}'])
    assert schema.field("attrs").type == pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.bool_())])


@pytest.mark.parametrize("size", SIZES)
def test_required_children_under_null_parents_stay_castable(size: int) -> None:
    """A null struct (a top-level column, a list element, a map value) whose fields are required:
    the table holds no null in a non-nullable field, so casts to the target schema (as the
    Connect format does to add metadata) and Spark accept it."""
    point = pa.struct([
        pa.field("n", pa.int64(), nullable=False),
        pa.field("u", pa.uuid(), nullable=False),
        pa.field("l", pa.list_(pa.int64()), nullable=False),
        pa.field("s", pa.struct([pa.field("q", pa.string(), nullable=False)]), nullable=False),
    ])
    for t, text in [(point, "null"), (pa.list_(point), "[null]"), (map_of(point), '{"a": null}')]:
        schema = schema_of(t)
        values = [f'{{"id": {i}, "x": {text}}}'.encode() for i in range(size)]
        result = decode_json(values, schema)
        assert not result.rejects and result.table.num_rows == size
        result.table.validate(full=True)
        target = pa.schema([schema.field("id"), schema.field("x").with_metadata({"k": "v"})])
        assert result.table.cast(target).column("x").to_pylist() == [decode_raw(schema, text, 1)] * size


def test_schema_force_optional_makes_map_values_optional() -> None:
    from agents.tables import _all_optional

    schema = Schema(NestedField(1, "m", MapType(2, StringType(), 3, LongType(), value_required=True), required=True))
    m = _all_optional(schema).find_field("m")
    assert not m.required and isinstance(m.field_type, MapType) and not m.field_type.value_required
