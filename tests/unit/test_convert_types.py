"""Type fidelity of agents.convert: timestamps (ISO and epoch counts in a stated unit), dates,
times, decimals (numbers and Kafka Connect bytes), binary, fixed, uuid; the settings and
table properties that state units; the auto-create timestamp rule. No services.

Every case runs at two batch sizes: one record (the per-record reference path) and a batch
big enough for the bulk path; both must give the same row or the same reject.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    DateType,
    DecimalType,
    FixedType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

import agents.convert as convert
from agents.convert import limits
from agents.convert import DECIMAL_ENCODING, EPOCH_UNIT, decode_json, infer_schema, with_field_metadata
from agents.tables import _with_column_metadata
from icesink.shared.config import load_settings
from icesink.shared.errors import ConfigError, UnsupportedTypeError

BULK = 3 * limits.SMALL_RUN
SIZES = [1, BULK]
U = uuid.UUID("af69865f-61a7-4e39-824e-cbdcf4a0c45e")


def field(t: pa.DataType, **metadata: str) -> pa.Schema:
    return pa.schema([pa.field("id", pa.int64()), pa.field("x", t, metadata=metadata or None)])


def decode_one(schema: pa.Schema, value: object, size: int, *, filler: object = None, **kw: Any) -> Any:
    """Decode ``{"x": value}`` after ``size - 1`` fillers; the row's x, or the Reject."""
    values = [json.dumps({"id": 0, "x": filler}).encode()] * (size - 1)
    values.append(json.dumps({"id": 1, "x": value}).encode())
    result = decode_json(values, schema, **kw)
    result.validate()
    assert result.table.schema.equals(schema, check_metadata=True)
    rejects = [r for r in result.rejects if r.index == size - 1]
    if rejects:
        return rejects[0]
    assert not result.rejects, result.rejects
    return result.table.column("x")[-1].as_py()


def ok(schema: pa.Schema, value: object, size: int, **kw: Any) -> Any:
    out = decode_one(schema, value, size, **kw)
    assert not isinstance(out, convert.Reject), out
    return out


def rejected(schema: pa.Schema, value: object, size: int, why: str, **kw: Any) -> None:
    out = decode_one(schema, value, size, **kw)
    assert isinstance(out, convert.Reject), f"expected a reject, found {out!r}"
    assert out.field == "x" and why in out.reason, out


# --------------------------------------------------------------------------------------------
# Timestamps
# --------------------------------------------------------------------------------------------

TS = pa.timestamp("us")
TSZ = pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("unit", "count", "expected"),
    [
        ("s", 1700000000, datetime(2023, 11, 14, 22, 13, 20)),
        ("ms", 1700000000123, datetime(2023, 11, 14, 22, 13, 20, 123000)),
        ("us", 1700000000123456, datetime(2023, 11, 14, 22, 13, 20, 123456)),
        ("ns", 1700000000123456000, datetime(2023, 11, 14, 22, 13, 20, 123456)),
        ("ns", 1700000000123456789, datetime(2023, 11, 14, 22, 13, 20, 123456)),  # truncated
        ("ms", -1, datetime(1969, 12, 31, 23, 59, 59, 999000)),
        ("ns", -1, datetime(1969, 12, 31, 23, 59, 59, 999999)),  # floored, not toward zero
        ("ms", "1700000000123", datetime(2023, 11, 14, 22, 13, 20, 123000)),  # digits as a string
    ],
)
def test_epoch_counts_in_the_unit_of_the_field(size: int, unit: str, count: object, expected: datetime) -> None:
    schema = field(TS, **{EPOCH_UNIT: unit})
    assert ok(schema, count, size, filler=0) == expected
    tz = ok(field(TSZ, **{EPOCH_UNIT: unit}), count, size, filler=0)
    assert tz == expected.replace(tzinfo=UTC)


@pytest.mark.parametrize("size", SIZES)
def test_default_unit_applies_without_metadata_and_the_field_wins(size: int) -> None:
    assert ok(field(TS), 1700000000123, size, filler=0) == datetime(2023, 11, 14, 22, 13, 20, 123000)
    assert ok(field(TS), 1700000000123456, size, filler=0, epoch_unit="us") == datetime(
        2023, 11, 14, 22, 13, 20, 123456
    )
    schema = field(TS, **{EPOCH_UNIT: "s"})
    assert ok(schema, 1700000000, size, filler=0, epoch_unit="ns") == datetime(2023, 11, 14, 22, 13, 20)


@pytest.mark.parametrize("size", SIZES)
def test_micros_are_never_read_as_millis(size: int) -> None:
    # 1700000000123456 ms would be the year 55840: rejected, with the unit named.
    rejected(field(TS), 1700000000123456, size, "ms since the epoch is out of range", filler=0)
    rejected(field(TS, **{EPOCH_UNIT: "us"}), 1700000000123456789, size, "us since the epoch is out of range",
             filler=0)
    rejected(field(TS, **{EPOCH_UNIT: "s"}), 10**18, size, "out of range", filler=0)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2023-11-14T22:13:20.123456", datetime(2023, 11, 14, 22, 13, 20, 123456)),
        ("2023-11-14 22:13:20", datetime(2023, 11, 14, 22, 13, 20)),
        ("2023-11-14T22:13:20.123456Z", datetime(2023, 11, 14, 22, 13, 20, 123456)),
        ("2023-11-14T23:13:20.5+01:00", datetime(2023, 11, 14, 22, 13, 20, 500000)),
        ("2023-11-14T17:13:20-0500", datetime(2023, 11, 14, 22, 13, 20)),
        ("2023-11-14T22:13:20.123456789Z", datetime(2023, 11, 14, 22, 13, 20, 123456)),
    ],
)
def test_iso_strings_with_and_without_offsets(size: int, text: str, expected: datetime) -> None:
    filler = "2020-01-01T00:00:00"
    assert ok(field(TS), text, size, filler=filler) == expected
    assert ok(field(TSZ), text, size, filler=filler) == expected.replace(tzinfo=UTC)


@pytest.mark.parametrize("size", SIZES)
def test_a_column_mixing_iso_strings_and_counts(size: int) -> None:
    values = [json.dumps({"x": v}).encode() for v in ["2023-11-14T22:13:20Z", 1700000000000, None] * size]
    result = decode_json(values, pa.schema([pa.field("x", TSZ)]))
    assert not result.rejects
    expected = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert result.table.column("x").to_pylist() == [expected, expected, None] * size


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("value", "why"),
    [
        (True, "expected an ISO-8601 timestamp"),
        ("yesterday", "expected an ISO-8601 timestamp"),
        ({"a": 1}, "expected an ISO-8601 timestamp"),
        ("2023-11-14", "expected an ISO-8601 timestamp"),
        (1e300, "out of range"),
    ],
)
def test_bad_timestamps_are_rejects(size: int, value: object, why: str) -> None:
    rejected(field(TSZ), value, size, why, filler=0)


@pytest.mark.parametrize("size", SIZES)
def test_fractional_counts_are_exact(size: int) -> None:
    schema = field(TS, **{EPOCH_UNIT: "s"})
    assert ok(schema, 1700000000.5, size, filler=0) == datetime(2023, 11, 14, 22, 13, 20, 500000)
    assert ok(schema, "1.7e9", size, filler=0) == datetime(2023, 11, 14, 22, 13, 20)


# --------------------------------------------------------------------------------------------
# Dates and times
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_dates_from_strings_days_and_stated_units(size: int) -> None:
    assert ok(field(pa.date32()), "2023-11-14", size, filler="2020-01-01") == date(2023, 11, 14)
    assert ok(field(pa.date32()), 19675, size, filler=0) == date(2023, 11, 14)
    assert ok(field(pa.date32()), -1, size, filler=0) == date(1969, 12, 31)
    assert ok(field(pa.date32(), **{EPOCH_UNIT: "ms"}), 19675 * 86_400_000, size, filler=0) == date(2023, 11, 14)
    rejected(field(pa.date32(), **{EPOCH_UNIT: "ms"}), 19675 * 86_400_000 + 1, size, "not a whole day", filler=0)
    rejected(field(pa.date32()), 1.5, size, "not a whole day", filler=0)
    rejected(field(pa.date32()), 10**9, size, "days since the epoch out of range", filler=0)
    rejected(field(pa.date32()), "14/11/2023", size, "expected 'YYYY-MM-DD'", filler=0)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        ("12:34:56", None, time(12, 34, 56)),
        ("12:34:56.789", None, time(12, 34, 56, 789000)),
        ("23:59:59.999999999", None, time(23, 59, 59, 999999)),  # truncated
        ("00:00:00", None, time(0, 0)),
        (45296789, None, time(12, 34, 56, 789000)),  # the default unit: ms since midnight
        (45296789123, "us", time(12, 34, 56, 789123)),
        (45296, "s", time(12, 34, 56)),
        (45296789123456, "ns", time(12, 34, 56, 789123)),
    ],
)
def test_times_from_strings_and_counts(size: int, value: object, unit: str | None, expected: time) -> None:
    schema = field(pa.time64("us"), **({EPOCH_UNIT: unit} if unit else {}))
    assert ok(schema, value, size, filler="00:00:00") == expected


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("24:00:00", "time of day out of range"),
        ("12:60:00", "time of day out of range"),
        ("12:34", "expected 'HH:MM:SS"),
        ("noon", "expected 'HH:MM:SS"),
        (86_400_000, "since midnight out of range"),
        (-1, "since midnight out of range"),
        (False, "expected 'HH:MM:SS"),
    ],
)
def test_bad_times_are_rejects(size: int, value: object, why: str) -> None:
    rejected(field(pa.time64("us")), value, size, why, filler="00:00:00")


# --------------------------------------------------------------------------------------------
# Decimals, binary, uuid
# --------------------------------------------------------------------------------------------


def connect_bytes(unscaled: int) -> str:
    """Kafka Connect Decimal: big-endian two's complement, minimal length."""
    length = max(1, (unscaled + (unscaled < 0)).bit_length() // 8 + 1)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("unscaled", [0, 1, -1, 1234, -1234, 127, 128, -128, -129, 9_999_999_999, -9_999_999_999])
def test_connect_decimal_bytes(size: int, unscaled: int) -> None:
    schema = field(pa.decimal128(10, 2), **{DECIMAL_ENCODING: "connect-bytes"})
    assert ok(schema, connect_bytes(unscaled), size, filler="AA==") == Decimal(unscaled).scaleb(-2)


@pytest.mark.parametrize("size", SIZES)
def test_bad_connect_decimals_are_rejects(size: int) -> None:
    schema = field(pa.decimal128(10, 2), **{DECIMAL_ENCODING: "connect-bytes"})
    rejected(schema, connect_bytes(10**10), size, "more than 8 integer digits", filler="AA==")
    rejected(schema, 12.34, size, "expected a base64 string", filler="AA==")
    rejected(schema, "12.34", size, "expected a base64 string", filler="AA==")
    rejected(schema, "", size, "no bytes", filler="AA==")
    # Sign-extended beyond 15 bytes: exact per record.
    assert ok(schema, base64.b64encode(b"\xff" * 17).decode(), size, filler="AA==") == Decimal("-0.01")


@pytest.mark.parametrize("size", SIZES)
def test_decimals_never_round(size: int) -> None:
    schema = field(pa.decimal128(10, 2))
    assert ok(schema, 12.3, size, filler=0) == Decimal("12.30")
    assert ok(schema, "-99999999.99", size, filler=0) == Decimal("-99999999.99")
    rejected(schema, 12.345, size, "more than 2 decimal places", filler=0)
    rejected(schema, 123456789, size, "more than 8 integer digits", filler=0)


def decode_raw(schema: pa.Schema, text: str, size: int) -> Any:
    """``{"x": text}`` with ``text`` as written (a number's own spelling), after fillers: the
    row's x, or its reject."""
    t = schema.field("x").type
    filler = b"[]" if pa.types.is_list(t) else b"{}" if pa.types.is_struct(t) or pa.types.is_map(t) else b"0"
    values = [b'{"id": 0, "x": ' + filler + b"}"] * (size - 1) + [b'{"id": 1, "x": ' + text.encode() + b"}"]
    result = decode_json(values, schema)
    result.validate()
    rejects = [(r.field, r.reason) for r in result.rejects if r.index == size - 1]
    return rejects[0] if rejects else result.table.column("x")[-1].as_py()


@pytest.mark.parametrize(("t", "text"), [
    (pa.decimal128(10, 2), "2.0342086067022478e-231"), (pa.decimal128(10, 2), '"2.0342086067022478e-231"'),
    (pa.decimal128(10, 2), "932735479114036433e-61"), (pa.decimal128(18, 9), "9956904000258e-102"),
    (pa.decimal128(38, 0), "9e26"), (pa.decimal128(38, 0), '"9e26"'), (pa.decimal128(38, 0), '"289769e33"'),
    (pa.decimal128(38, 0), '"' + "9" * 39 + '"'), (pa.decimal128(38, 2), '"0.' + "0" * 40 + '1"'),
    (pa.int64(), "5e-243"), (pa.int64(), "3.061892005e-225"), (pa.int32(), "8.3e23"),
    (pa.timestamp("us"), "7.465e-227"), (pa.decimal128(38, 0), "289769e33"),
    (pa.list_(pa.decimal128(10, 2)), "[0.5, 2.0342086067022478e-231]"),
    (pa.struct([pa.field("y", pa.decimal128(10, 2))]), '{"y" : "59719334552589356e-237"}'),
    (pa.map_(pa.string(), pa.decimal128(10, 2)), '{"k": 1, "j": 4e-254}'),
    (pa.struct([pa.field("beløp", pa.decimal128(10, 2))]), '{"bel\\u00f8p": 2.0342086067022478e-231}'),
])
def test_numbers_arrows_decimal_parse_would_misread_are_decoded_exactly(t: pa.DataType, text: str) -> None:
    """Arrow's decimal parse, which the bulk path's JSON reader and casts use, returns a wrong
    value without an error for some texts (apache/arrow#49817: more than 38 digits; exponents
    far from the scale): 2.0342086067022478e-231 was 0.00 where the reference path rejects it,
    9e26 a 20-digit number, and 5e-243 an integer 0. The bulk path gives such records to the
    reference path: both decode alike (a hypothesis run of test_bulk_reference found the first)."""
    schema = field(t)
    assert decode_raw(schema, text, BULK) == decode_raw(schema, text, 1)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("raw", [b"", b"\x00", b"\x00\x01", b"\xff\xfe\xfd", bytes(range(256))])
def test_binary_from_base64(size: int, raw: bytes) -> None:
    text = base64.b64encode(raw).decode()
    assert ok(field(pa.large_binary()), text, size, filler="AAEC") == raw
    assert ok(field(pa.binary()), text, size, filler="AAEC") == raw


@pytest.mark.parametrize("size", SIZES)
def test_fixed_and_bad_binary(size: int) -> None:
    assert ok(field(pa.binary(4)), "AQIDBA==", size, filler="AAAAAA==") == b"\x01\x02\x03\x04"
    rejected(field(pa.binary(4)), "AQID", size, "found 3 bytes", filler="AAAAAA==")
    for bad in ("AQI", "AQ=D", "a b=", "AQID!", "AQIDBA", 1234):
        rejected(field(pa.large_binary()), bad, size, "expected a base64 string", filler="AAEC")


@pytest.mark.parametrize("size", SIZES)
def test_uuids(size: int) -> None:
    schema = field(pa.uuid())
    assert ok(schema, str(U), size, filler=str(uuid.UUID(int=0))) == U
    assert ok(schema, str(U).upper(), size, filler=str(uuid.UUID(int=0))) == U
    for bad in (U.hex, "{" + str(U) + "}", str(U)[:-1], "not-a-uuid", 12):
        rejected(schema, bad, size, "expected 'xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx'", filler=str(U))


def test_quoting_never_turns_numbers_into_base64() -> None:
    """A key that is a timestamp in one place and binary in another: 1234 is not base64 '1234'."""
    schema = pa.schema([
        pa.field("ts", pa.string()),
        pa.field("inner", pa.struct([pa.field("ts", pa.large_binary())])),
    ])
    values = [json.dumps({"ts": "a", "inner": {"ts": "AAEC"}}).encode()] * BULK
    values += [json.dumps({"ts": 1, "inner": {"ts": 1234}}).encode()]
    result = decode_json(values, schema)
    assert [(r.index, r.field) for r in result.rejects] == [(BULK, "inner.ts")]


def test_nested_paths_in_reasons() -> None:
    schema = pa.schema([
        pa.field("order", pa.struct([
            pa.field("events", pa.list_(pa.struct([pa.field("at", TSZ)]))),
            pa.field("id", pa.uuid()),
        ])),
    ])
    good = {"order": {"events": [{"at": 1700000000000}], "id": str(U)}}
    bad = {"order": {"events": [{"at": 1}, {"at": 1700000000123456}], "id": str(U)}}
    bad_id = {"order": {"events": [], "id": "x"}}
    for size in SIZES:
        values = [json.dumps(good).encode()] * (size - 1) + [json.dumps(bad).encode(), json.dumps(bad_id).encode()]
        result = decode_json(values, schema)
        assert [(r.index, r.field) for r in result.rejects] == [(size - 1, "order.events[1].at"), (size, "order.id")]


# --------------------------------------------------------------------------------------------
# Schemas as pyiceberg gives them, metadata, unsupported
# --------------------------------------------------------------------------------------------


def test_every_iceberg_type_is_filled_in_bulk_and_per_record_alike() -> None:
    schema = schema_to_pyarrow(Schema(
        NestedField(1, "ts", TimestampType()), NestedField(2, "tz", TimestamptzType()),
        NestedField(3, "d", DateType()), NestedField(4, "t", TimeType()),
        NestedField(5, "dec", DecimalType(10, 2)), NestedField(6, "u", UUIDType()),
        NestedField(7, "b", BinaryType()), NestedField(8, "f", FixedType(2)),
        NestedField(9, "s", StructType(NestedField(10, "n", LongType()), NestedField(11, "c", StringType()))),
    ))
    record = {
        "ts": "2023-11-14T22:13:20.123456", "tz": 1700000000123, "d": "2023-11-14", "t": "22:13:20.5",
        "dec": "12.34", "u": str(U), "b": "AAEC", "f": "AAE=", "s": {"n": 1, "c": "é"},
    }
    one = decode_json([json.dumps(record).encode()], schema)
    many = decode_json([json.dumps(record).encode()] * BULK, schema)
    assert not one.rejects and not many.rejects
    assert many.table.to_pylist() == one.table.to_pylist() * BULK
    assert one.table.to_pylist()[0] == {
        "ts": datetime(2023, 11, 14, 22, 13, 20, 123456), "tz": datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC),
        "d": date(2023, 11, 14), "t": time(22, 13, 20, 500000), "dec": Decimal("12.34"), "u": U,
        "b": b"\x00\x01\x02", "f": b"\x00\x01", "s": {"n": 1, "c": "é"},
    }


@pytest.mark.parametrize(
    ("t", "metadata", "why"),
    [
        (TS, {EPOCH_UNIT: "minutes"}, "icesink.epoch-unit='minutes'"),
        (pa.int64(), {EPOCH_UNIT: "ms"}, "on a timestamp, date or time field"),
        (pa.decimal128(10, 2), {DECIMAL_ENCODING: "avro"}, "icesink.decimal-encoding='avro'"),
        (pa.string(), {DECIMAL_ENCODING: "connect-bytes"}, "on a decimal field"),
    ],
)
def test_bad_schemas_raise_naming_the_field(t: pa.DataType, metadata: dict[str, str], why: str) -> None:
    with pytest.raises(UnsupportedTypeError, match=re.escape(why)) as info:
        decode_json([b"{}"], pa.schema([pa.field("x", t, metadata=metadata or None)]))
    assert info.value.field == "x"


def test_bad_epoch_unit_argument() -> None:
    with pytest.raises(ValueError, match="epoch_unit"):
        decode_json([b"{}"], field(TS), epoch_unit="minutes")  # type: ignore[arg-type]


def test_with_field_metadata_reaches_nested_fields_and_names_missing_ones() -> None:
    schema = pa.schema([pa.field("a", pa.struct([pa.field("b", pa.list_(pa.field("item", TS)))]))])
    out = with_field_metadata(schema, {"a.b[]": {EPOCH_UNIT: "us"}})
    assert out.field("a").type.field("b").type.value_field.metadata == {b"icesink.epoch-unit": b"us"}
    with pytest.raises(KeyError, match="a.c"):
        with_field_metadata(schema, {"a.c": {EPOCH_UNIT: "us"}})


def test_table_properties_state_column_units_and_encodings() -> None:
    schema = schema_to_pyarrow(Schema(
        NestedField(1, "at", TimestamptzType()), NestedField(2, "n", LongType()),
        NestedField(3, "amount", DecimalType(10, 2)),
    ))
    props = {"icesink.epoch-unit.at": "us", "icesink.decimal-encoding.amount": "connect-bytes", "other": "x"}
    out = _with_column_metadata("db.t", schema, props)
    assert out.field("at").metadata[b"icesink.epoch-unit"] == b"us"
    assert out.field("at").metadata[b"PARQUET:field_id"] == b"1"  # kept
    assert out.field("amount").metadata[b"icesink.decimal-encoding"] == b"connect-bytes"
    assert _with_column_metadata("db.t", schema, {}) is schema
    with pytest.raises(ConfigError, match="icesink.epoch-unit='minutes'") as info:
        _with_column_metadata("db.t", schema, {"icesink.epoch-unit.at": "minutes"})
    assert "column at" in info.value.key
    with pytest.raises(ConfigError, match="on a timestamp, date or time field"):
        _with_column_metadata("db.t", schema, {"icesink.epoch-unit.n": "us"})
    with pytest.raises(ConfigError, match="columns of db.t"):
        _with_column_metadata("db.t", schema, {"icesink.epoch-unit.nope": "us"})


# --------------------------------------------------------------------------------------------
# Settings and the auto-create rule
# --------------------------------------------------------------------------------------------

BASE = {"topics": "a", "iceberg.tables": "db.t,db.u"}


def test_timestamp_settings_default_and_per_table() -> None:
    s = load_settings(overrides=BASE)
    assert s.timestamp_unit_of("db.t") == "ms" and s.timestamp_fields_of("db.t") is None
    s = load_settings(overrides={
        **BASE, "iceberg.tables.timestamp-unit": "us", "iceberg.table.db.u.timestamp-unit": "ns",
        "iceberg.tables.timestamp-fields": ".*_at", "iceberg.table.db.u.timestamp-fields": "ts",
    })
    assert (s.timestamp_unit_of("db.t"), s.timestamp_unit_of("db.u")) == ("us", "ns")
    pattern = s.timestamp_fields_of("db.t")
    assert pattern is not None and pattern.pattern == ".*_at"
    assert s.timestamp_fields_of("db.u").pattern == "ts"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("iceberg.tables.timestamp-unit", "minutes", "one of s, ms, us, ns"),
        ("iceberg.table.db.t.timestamp-unit", "sec", "one of s, ms, us, ns"),
        ("iceberg.tables.timestamp-fields", "([", "a regular expression"),
        ("iceberg.table.db.x.timestamp-fields", "ts", "a table listed in iceberg.tables"),
    ],
)
def test_bad_timestamp_settings_name_the_key(key: str, value: str, why: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(why)) as info:
        load_settings(overrides={**BASE, key: value})
    assert info.value.key == key


def test_auto_create_rule_makes_timestamp_columns() -> None:
    values = [
        json.dumps({
            "created_at": "2023-11-14T22:13:20Z", "local_at": "2023-11-14 22:13:20", "epoch_at": 1700000000000,
            "name_at": None, "other": "2023-11-14 22:13:20", "order": {"placed_at": "2023-11-14T22:13:20+01:00"},
            "events": [{"seen_at": "2023-11-14 22:13:20"}],
        }).encode()
    ]
    plain = infer_schema(values)
    assert plain.field("created_at").type == pa.string()
    schema = infer_schema(values, timestamp_fields=re.compile(r".*_at"))
    assert schema.field("created_at").type == TSZ
    assert schema.field("local_at").type == TS
    assert schema.field("epoch_at").type == TSZ
    assert schema.field("name_at").type == TS  # null-only strings: no offset seen
    assert schema.field("other").type == pa.string()
    assert schema.field("order").type.field("placed_at").type == TSZ
    assert schema.field("events").type.value_type.field("seen_at").type == TS
    result = decode_json(values + [json.dumps({"created_at": "soon"}).encode()], schema)
    assert result.table.column("epoch_at")[0].as_py() == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert [(r.index, r.field) for r in result.rejects] == [(1, "created_at")]
