"""Unit tests for agents.convert: JSON record values -> Arrow tables (no services)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
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
)

from agents.convert import limits, reference, wrapped
from agents.convert import Converted, Reject, decode_json, infer_schema
from icesink.shared.errors import UnsupportedTypeError

SAMPLE = {
    "order_id": "af69865f-61a7-4e39-824e-cbdcf4a0c45e",
    "store_id": 42,
    "sauce": "extra",
    "cheese": "three cheese",
    "meats": "ham",
    "veggies": "onions & pineapple",
    "date_ordered": "2024-01-04 12:28:13",
}
#: Enough records that decode_json takes the bulk path (small batches go record by record).
BULK = 3 * limits.SMALL_RUN


class Raw(str):
    """JSON text to embed as is (for tokens Python cannot produce, like 1e400)."""


def _default(value: object) -> object:
    raise TypeError(f"cannot encode {value!r}")


def enc(record: object) -> bytes:
    """JSON for ``record``; Raw values are spliced in verbatim."""
    raws: dict[str, str] = {}

    def swap(v: object) -> object:
        if isinstance(v, Raw):
            marker = f"@raw{len(raws)}@"
            raws[marker] = str(v)
            return marker
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(record), default=_default)
    for marker, raw in raws.items():
        text = text.replace(f'"{marker}"', raw)
    return text.encode()


def arrow(*fields: NestedField) -> pa.Schema:
    """The Arrow schema icesink coerces to for an Iceberg table with these fields."""
    return schema_to_pyarrow(Schema(*fields))


def padded(values: Sequence[bytes], filler: bytes, before: int = BULK) -> list[bytes]:
    """``values`` after ``before`` copies of ``filler``, so a batch is big enough for bulk work."""
    return [filler] * before + list(values)


def rows_by_index(result: Converted) -> dict[int, dict[str, Any]]:
    return dict(zip(result.indices.to_pylist(), result.table.to_pylist(), strict=True))


def same(a: object, b: object) -> bool:
    """Equality that treats NaN as equal to NaN (floats from JSON may be NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.fixture
def oracle_calls(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Values that went through the per-record reference path."""
    calls: list[bytes] = []
    original = reference.Oracle.row

    def spy(self: reference.Oracle, value: bytes) -> dict[str, object]:
        calls.append(value)
        return original(self, value)

    monkeypatch.setattr(reference.Oracle, "row", spy)
    return calls


# --------------------------------------------------------------------------------------------
# Public models
# --------------------------------------------------------------------------------------------


def test_models_are_frozen() -> None:
    reject = Reject(3, "not a JSON object: found an array", None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        reject.index = 4  # type: ignore[misc]
    converted = decode_json([enc(SAMPLE)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        converted.rejects = ()  # type: ignore[misc]


def test_empty_input() -> None:
    schema = arrow(NestedField(1, "a", LongType()))
    result = decode_json([], schema)
    assert result.table.schema.equals(schema, check_metadata=True)
    assert result.table.num_rows == 0 and len(result.indices) == 0 and result.rejects == ()
    assert decode_json([]).table.num_columns == 0


def test_validate_catches_a_row_that_is_also_rejected() -> None:
    good = decode_json([enc(SAMPLE), b"nope"])
    good.validate()
    broken = Converted(good.table, good.indices, (Reject(0, "x", None),))
    with pytest.raises(ValueError, match="found both"):
        broken.validate()


# --------------------------------------------------------------------------------------------
# Inference
# --------------------------------------------------------------------------------------------


def test_inference_across_read_blocks_takes_a_field_null_in_the_first_block() -> None:
    """pyarrow reads a big batch in blocks (``BLOCK_SIZE``, 1 MiB) and infers each block's
    types alone: a field null all through the first block and an object or array later once
    failed the whole batch (ArrowNotImplementedError "JSON conversion to struct<a: int64> is
    not supported"), at the batch size of a busy partition."""
    pad = "p" * 100
    first = [enc({"id": i, "x": None, "l": None, "pad": pad}) for i in range(16_000)]
    later = [enc({"id": i, "x": {"a": i}, "l": [{"b": i}], "pad": pad}) for i in range(10)]
    assert sum(map(len, first)) > 2 * limits.BLOCK_SIZE
    result = decode_json(first + later)
    assert result.rejects == ()
    assert result.table.schema == pa.schema([
        ("id", pa.int64()), ("x", pa.struct([("a", pa.int64())])), ("l", pa.list_(pa.struct([("b", pa.int64())]))),
        ("pad", pa.string())])
    assert result.table.column("x").to_pylist()[-2:] == [{"a": 8}, {"a": 9}]


@pytest.mark.parametrize("size", [1, BULK])
def test_infer_sample_record(size: int) -> None:
    result = decode_json([enc(SAMPLE)] * size)
    assert result.table.schema == pa.schema(
        [
            ("order_id", pa.string()),
            ("store_id", pa.int64()),
            ("sauce", pa.string()),
            ("cheese", pa.string()),
            ("meats", pa.string()),
            ("veggies", pa.string()),
            ("date_ordered", pa.string()),  # pyarrow alone would infer timestamp[s]
        ]
    )
    assert all(f.nullable for f in result.table.schema)
    assert result.table.to_pylist() == [SAMPLE] * size
    assert result.indices.to_pylist() == list(range(size))


@pytest.mark.parametrize("size", [1, BULK])
def test_infer_scalar_kinds(size: int) -> None:
    records = [{"s": "x", "b": True, "i": 7, "f": 2.5, "n": None, "mixed": 1}] * (size - 1)
    records.append({"s": "y", "b": False, "i": -3, "f": 1e300, "n": None, "mixed": 0.5})
    schema = infer_schema([enc(r) for r in records])
    assert schema == pa.schema(
        [
            ("s", pa.string()),
            ("b", pa.bool_()),
            ("i", pa.int64()),
            ("f", pa.float64()),
            ("n", pa.string()),  # only ever null
            ("mixed", pa.float64()),  # int and float mixed
        ]
    )
    table = decode_json([enc(r) for r in records]).table
    assert table.column("mixed").to_pylist()[-2:] == [1.0, 0.5] if size > 1 else [0.5]
    assert table.column("n").null_count == size


@pytest.mark.parametrize("size", [1, BULK])
def test_infer_timestamp_looking_strings_stay_verbatim(size: int) -> None:
    texts = [
        "2024-01-04 12:28:13",
        "2024-01-04T12:28:13Z",
        "2024-01-04",
        "2024-01-04T12:28:13.123+02:00",
    ]
    values = [enc({"t": texts[i % len(texts)]}) for i in range(max(size, len(texts)))]
    result = decode_json(values)
    assert result.table.schema == pa.schema([("t", pa.string())])
    assert result.table.column("t").to_pylist() == [texts[i % len(texts)] for i in range(len(values))]


@pytest.mark.parametrize("size", [1, BULK])
def test_infer_nested_structs_and_lists(size: int) -> None:
    first = {
        "customer": {"name": "Ann", "address": {"zip": "12345", "geo": [1.5, 2]}},
        "items": [{"sku": "a", "qty": 1}],
        "tags": [],
    }
    later = {
        "customer": {"address": {"city": "Oslo"}, "vip": True},
        "items": [{"qty": 2, "note": None}],
        "tags": ["x"],
    }
    values = [*[enc(first)] * (size - 1), enc(later)] if size > 1 else [enc(first), enc(later)]
    schema = infer_schema(values)
    assert schema == pa.schema(
        [
            (
                "customer",
                pa.struct(
                    [
                        ("name", pa.string()),
                        (
                            "address",
                            pa.struct(
                                [("zip", pa.string()), ("geo", pa.list_(pa.float64())), ("city", pa.string())]
                            ),
                        ),
                        ("vip", pa.bool_()),
                    ]
                ),
            ),
            (
                "items",
                pa.list_(pa.struct([("sku", pa.string()), ("qty", pa.int64()), ("note", pa.string())])),
            ),
            ("tags", pa.list_(pa.string())),
        ]
    )
    rows = decode_json(values).table.to_pylist()
    assert rows[0]["customer"]["address"] == {"zip": "12345", "geo": [1.5, 2.0], "city": None}
    assert rows[-1]["items"] == [{"sku": None, "qty": 2, "note": None}]
    assert rows[-1]["customer"]["vip"] is True


@pytest.mark.parametrize("size", [2, BULK])
def test_infer_conflicting_kinds_hold_json_text(size: int) -> None:
    kinds: list[object] = ["x", 5, True, {"a": [1, 2.50]}, [1, "b"], None, 1.5]
    values = [enc({"c": kinds[i % len(kinds)], "k": i}) for i in range(max(size, len(kinds)))]
    result = decode_json(values)
    assert result.table.schema == pa.schema([("c", pa.string()), ("k", pa.int64())])
    expected = ["x", "5", "true", '{"a":[1,2.5]}', '[1,"b"]', None, "1.5"]
    assert result.table.column("c").to_pylist() == [expected[i % len(kinds)] for i in range(len(values))]


def test_infer_conflict_inside_a_list_and_a_struct() -> None:
    values = [enc({"l": [1, "a"], "s": {"x": 1}}), enc({"l": [2.5], "s": {"x": "y"}})] * BULK
    result = decode_json(values)
    assert result.table.schema == pa.schema(
        [("l", pa.list_(pa.string())), ("s", pa.struct([("x", pa.string())]))]
    )
    assert result.table.to_pylist()[:2] == [
        {"l": ["1", "a"], "s": {"x": "1"}},
        {"l": ["2.5"], "s": {"x": "y"}},
    ]


def test_infer_field_order_is_first_appearance_across_a_batch() -> None:
    values = [enc({"b": 1})] * BULK + [enc({"a": 1, "b": 2})] + [enc({"c": "x", "a": 2})] * BULK
    assert infer_schema(values).names == ["b", "a", "c"]


def test_infer_skips_bad_records_and_rejects_them() -> None:
    values = [enc({"a": 1})] * BULK + [b"{broken", b"[1]", b"null"] + [enc({"a": 2, "b": "x"})] * BULK
    result = decode_json(values)
    assert result.table.schema == pa.schema([("a", pa.int64()), ("b", pa.string())])
    assert [r.index for r in result.rejects] == [BULK, BULK + 1, BULK + 2]
    assert result.table.num_rows == 2 * BULK


def test_infer_integers_beyond_int64_become_double() -> None:
    assert infer_schema([enc({"a": 2**64})]) == pa.schema([("a", pa.float64())])
    assert infer_schema([enc({"a": 1})] * BULK + [enc({"a": 2**64})]) == pa.schema([("a", pa.float64())])


@pytest.mark.parametrize("size", [1, BULK])
def test_infer_schema_is_decode_json_schema(size: int) -> None:
    values = [enc({"a": {"b": [1, 2]}, "c": None, "d": "2024-01-04"})] * size + [enc({"a": {"b": [1.5]}})]
    assert infer_schema(values) == decode_json(values).table.schema


# --------------------------------------------------------------------------------------------
# Coercion to a table's schema
# --------------------------------------------------------------------------------------------

ICEBERG_FIELDS = (
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "qty", IntegerType()),
    NestedField(4, "ts", TimestampType()),
    NestedField(5, "tstz", TimestamptzType()),
    NestedField(6, "day", DateType()),
    NestedField(7, "price", DecimalType(10, 2)),
    NestedField(8, "tags", ListType(20, StringType(), element_required=False)),
    NestedField(
        9,
        "customer",
        StructType(
            NestedField(10, "name", StringType(), required=True),
            NestedField(11, "address", StructType(NestedField(12, "zip", IntegerType()))),
        ),
    ),
    NestedField(13, "ok", BooleanType()),
    NestedField(14, "ratio", FloatType()),
    NestedField(15, "score", DoubleType()),
    NestedField(
        16,
        "items",
        ListType(
            21,
            StructType(NestedField(17, "sku", StringType()), NestedField(18, "n", LongType(), required=True)),
            element_required=True,
        ),
    ),
)
FULL = {
    "id": 1,
    "name": "a",
    "qty": 2,
    "ts": "2024-01-04 12:28:13",
    "tstz": "2024-01-04T12:28:13+02:00",
    "day": "2024-01-04",
    "price": 1.25,
    "tags": ["x"],
    "customer": {"name": "Ann", "address": {"zip": 12345}},
    "ok": True,
    "ratio": 0.5,
    "score": 1e300,
    "items": [{"sku": "s", "n": 3}],
}


@pytest.mark.parametrize("size", [1, BULK])
def test_output_schema_is_exactly_the_tables_schema(size: int) -> None:
    schema = arrow(*ICEBERG_FIELDS)
    # What pyiceberg 0.12 gives, and so what decode_json must reproduce exactly:
    assert schema.field("name").type == pa.large_string()
    assert schema.field("id").metadata == {b"PARQUET:field_id": b"1"}
    assert not schema.field("id").nullable
    assert schema.field("tags").type.value_field.name == "element"
    result = decode_json([enc(FULL)] * size, schema)
    assert result.rejects == ()
    assert result.table.schema.equals(schema, check_metadata=True)
    row = result.table.to_pylist()[0]
    assert row["customer"] == {"name": "Ann", "address": {"zip": 12345}}
    assert row["price"] == Decimal("1.25")
    assert row["items"] == [{"sku": "s", "n": 3}]
    assert row["tstz"] == datetime(2024, 1, 4, 10, 28, 13, tzinfo=UTC)


def test_output_schema_is_exact_even_when_every_record_is_rejected() -> None:
    schema = arrow(*ICEBERG_FIELDS)
    result = decode_json([b"{}"] * BULK, schema)  # "id" is required
    assert result.table.num_rows == 0 and len(result.rejects) == BULK
    assert result.table.schema.equals(schema, check_metadata=True)


@pytest.mark.parametrize("size", [1, BULK])
@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        (LongType(), 42, 42),
        (LongType(), "42", 42),
        (LongType(), "-9223372036854775808", -(2**63)),
        (LongType(), 9223372036854775807, 2**63 - 1),
        (LongType(), 1.0, 1),
        (LongType(), 1e3, 1000),
        (LongType(), "1e3", 1000),
        (IntegerType(), 2147483647, 2147483647),
        (IntegerType(), "-7", -7),
        (DoubleType(), 3.5, 3.5),
        (DoubleType(), "3.5", 3.5),
        (DoubleType(), 7, 7.0),
        (DoubleType(), Raw("Infinity"), math.inf),
        (LongType(), Raw("1E2"), 100),
        (LongType(), Raw("-0"), 0),
        (DoubleType(), 9007199254740993, 9007199254740992.0),
        (FloatType(), 0.1, 0.10000000149011612),
        (FloatType(), "-2", -2.0),
        (DecimalType(10, 2), 1.25, Decimal("1.25")),
        (DecimalType(10, 2), "1.2", Decimal("1.20")),
        (DecimalType(10, 2), 12345678.9, Decimal("12345678.90")),
        (DecimalType(10, 2), 3, Decimal("3.00")),
        (DecimalType(10, 2), "1.500", Decimal("1.50")),
        (DecimalType(38, 0), "12345678901234567890123456789", Decimal("12345678901234567890123456789")),
        (StringType(), "text", "text"),
        (StringType(), 42, "42"),
        (StringType(), 1.50, "1.5"),
        (StringType(), True, "true"),
        (StringType(), {"a": [1, None]}, '{"a":[1,null]}'),
        (BooleanType(), True, True),
        (BooleanType(), "false", False),
        (DateType(), "2024-01-04", date(2024, 1, 4)),
        (DateType(), "0001-01-01", date(1, 1, 1)),
    ],
)
def test_coerce_scalars(size: int, field: Any, value: object, expected: object) -> None:
    schema = arrow(NestedField(1, "k", LongType()), NestedField(2, "x", field))
    values = [enc({"k": 0, "x": value})] * size
    result = decode_json(values, schema)
    assert result.rejects == ()
    got = result.table.column("x").to_pylist()
    assert all(type(v) is type(expected) and v == expected for v in got), (got, expected)


def test_number_text_is_kept_for_string_columns() -> None:
    schema = arrow(NestedField(1, "x", StringType()))
    values = [b'{"x": 1.50}', b'{"x": -0}', b'{"x": 1E+2}', b'{"x": {"a": 1.50}}'] * BULK
    result = decode_json(values, schema)
    assert result.table.column("x").to_pylist()[:4] == ["1.50", "-0", "1E+2", '{"a":1.50}']


def _micros(moment: datetime) -> int:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return (moment - epoch) // timedelta(microseconds=1)


TIMESTAMPS = [
    # text, the instant it names as UTC (naive texts: wall time read as UTC)
    ("2024-01-04 12:28:13", datetime(2024, 1, 4, 12, 28, 13, tzinfo=UTC)),
    ("2024-01-04T12:28:13", datetime(2024, 1, 4, 12, 28, 13, tzinfo=UTC)),
    ("2024-01-04T12:28:13Z", datetime(2024, 1, 4, 12, 28, 13, tzinfo=UTC)),
    ("2024-01-04T12:28:13.5", datetime(2024, 1, 4, 12, 28, 13, 500000, tzinfo=UTC)),
    ("2024-01-04 12:28:13.000001Z", datetime(2024, 1, 4, 12, 28, 13, 1, tzinfo=UTC)),
    ("2024-01-04T12:28:13+02:00", datetime(2024, 1, 4, 10, 28, 13, tzinfo=UTC)),
    ("2024-01-04T12:28:13.25-05:30", datetime(2024, 1, 4, 17, 58, 13, 250000, tzinfo=UTC)),
    ("2024-01-04T00:30:00+0100", datetime(2024, 1, 3, 23, 30, tzinfo=UTC)),
    ("2024-01-04T00:30:00-01", datetime(2024, 1, 4, 1, 30, tzinfo=UTC)),
    ("2024-01-04T12:28:13.123456789Z", datetime(2024, 1, 4, 12, 28, 13, 123456, tzinfo=UTC)),  # truncated
    ("1969-12-31T23:59:59.999999Z", datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    ("2024-02-29 00:00:00", datetime(2024, 2, 29, tzinfo=UTC)),
]


@pytest.mark.parametrize("size", [1, BULK])
@pytest.mark.parametrize(("text", "instant"), TIMESTAMPS)
def test_timestamps_into_tz_and_naive_columns(size: int, text: str, instant: datetime) -> None:
    schema = arrow(NestedField(1, "naive", TimestampType()), NestedField(2, "tz", TimestamptzType()))
    values = [enc({"naive": text, "tz": text})] * size
    result = decode_json(values, schema)
    assert result.rejects == ()
    micros = _micros(instant)
    assert result.table.column("naive").cast(pa.int64()).to_pylist() == [micros] * size
    assert result.table.column("tz").cast(pa.int64()).to_pylist() == [micros] * size
    assert result.table.schema.equals(schema, check_metadata=True)


def test_timestamps_mixed_in_one_bulk_column(oracle_calls: list[bytes]) -> None:
    schema = arrow(NestedField(1, "tz", TimestamptzType()), NestedField(2, "naive", TimestampType()))
    values = [enc({"tz": text, "naive": text}) for text, _ in TIMESTAMPS] * 3
    result = decode_json(values, schema)
    assert result.rejects == ()
    want = [_micros(i) for _, i in TIMESTAMPS] * 3
    assert result.table.column("tz").cast(pa.int64()).to_pylist() == want
    assert result.table.column("naive").cast(pa.int64()).to_pylist() == want
    assert oracle_calls == []  # offsets and nanoseconds are handled in bulk


@pytest.mark.parametrize("size", [1, BULK])
@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2024-02-30 00:00:00", "day is out of range"),
        ("2024-01-04 24:00:00", "out of range"),
        ("2024-01-04T12:28:13+24:00", "offset out of range"),
        ("2024-01-04", "expected an ISO-8601 timestamp"),
        ("2024-01-04T12:28", "expected an ISO-8601 timestamp"),
        ("2024-01-04T12:28:13.Z", "expected an ISO-8601 timestamp"),
        ("04/01/2024 12:28:13", "expected an ISO-8601 timestamp"),
        (True, "expected an ISO-8601 timestamp"),
        (1704371293123456, "ms since the epoch is out of range"),  # micros are never read as millis
        ("0000-01-01T00:00:00", "year 0 is out of range"),
    ],
)
def test_bad_timestamps_reject_the_record(size: int, text: object, why: str) -> None:
    schema = arrow(NestedField(1, "id", LongType()), NestedField(2, "ts", TimestampType()))
    values = padded(
        [enc({"id": 1, "ts": text})], enc({"id": 0, "ts": "2024-01-04 00:00:00"}), before=size - 1
    )
    result = decode_json(values, schema)
    assert [(r.index, r.field) for r in result.rejects] == [(size - 1, "ts")]
    assert why in result.rejects[0].reason
    assert result.table.num_rows == size - 1


@pytest.mark.parametrize("size", [1, BULK])
@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2024-01-04T00:00:00", "found a timestamp"),
        ("2024-13-01", "month must be in 1..12"),
        ("2024-1-4", "expected 'YYYY-MM-DD'"),
        (20240104, "days since the epoch out of range"),
        (True, "expected 'YYYY-MM-DD'"),
    ],
)
def test_bad_dates_reject_the_record(size: int, text: object, why: str) -> None:
    schema = arrow(NestedField(1, "day", DateType()))
    values = padded([enc({"day": text})], enc({"day": "2024-01-04"}), before=size - 1)
    result = decode_json(values, schema)
    assert [(r.index, r.field) for r in result.rejects] == [(size - 1, "day")]
    assert why in result.rejects[0].reason


@pytest.mark.parametrize("size", [1, BULK])
@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        (LongType(), 3.5, "fractional part"),
        (LongType(), "3.5", "fractional part"),
        (LongType(), 2**63, "out of range"),
        (LongType(), "abc", "cannot coerce 'abc' to long"),
        (LongType(), True, "cannot coerce true to long"),
        (LongType(), [1], "cannot coerce [1] to long"),
        (IntegerType(), 2**31, "out of range"),
        (DoubleType(), Raw("1e400"), "out of range"),
        (DoubleType(), Raw("-1E+400"), "out of range"),
        (DoubleType(), "1e400", "out of range"),
        (DoubleType(), "NaN", "cannot coerce 'NaN' to double"),
        (FloatType(), 1e39, "out of range"),
        (DecimalType(10, 2), 1.255, "more than 2 decimal places"),
        (DecimalType(10, 2), 123456789.5, "more than 8 integer digits"),
        (DecimalType(10, 2), "1,5", "cannot coerce '1,5' to decimal(10, 2)"),
        (DecimalType(10, 2), False, "cannot coerce false"),
        (BooleanType(), "yes", "cannot coerce 'yes' to boolean"),
        (BooleanType(), 1, "cannot coerce 1 to boolean"),
    ],
)
def test_uncoercible_values_reject_the_record(size: int, field: Any, value: object, why: str) -> None:
    schema = arrow(NestedField(1, "k", LongType()), NestedField(2, "x", field))
    values = padded([enc({"k": 1, "x": value})], enc({"k": 0, "x": None}), before=size - 1)
    result = decode_json(values.copy(), schema)
    assert [(r.index, r.field) for r in result.rejects] == [(size - 1, "x")], result.rejects
    assert why in result.rejects[0].reason
    assert result.table.column("k").to_pylist() == [0] * (size - 1)


def test_missing_and_extra_fields() -> None:
    schema = arrow(*ICEBERG_FIELDS)
    record = {"id": 7, "customer": {"name": "Bo", "extra": 1}, "unknown": {"deep": [1, 2]}, "ok": None}
    for values in ([enc(record)], [enc(record)] * BULK):
        row = decode_json(values, schema).table.to_pylist()[0]
        assert row["id"] == 7
        assert row["customer"] == {"name": "Bo", "address": None}
        assert row["name"] is None and row["tags"] is None and row["items"] is None and row["ok"] is None
        assert "unknown" not in row


@pytest.mark.parametrize("size", [1, BULK])
@pytest.mark.parametrize(
    ("record", "field", "why"),
    [
        ({"id": None}, "id", "required field is null or missing"),
        ({}, "id", "required field is null or missing"),
        ({"id": 1, "customer": {"address": None}}, "customer.name", "required field"),
        (
            {"id": 1, "customer": {"name": "A", "address": {"zip": "abc"}}},
            "customer.address.zip",
            "'abc' to int",
        ),
        ({"id": 1, "customer": "Ann"}, "customer", "expected a JSON object"),
        ({"id": 1, "tags": "x"}, "tags", "expected a JSON array"),
        ({"id": 1, "items": [{"n": 1}, {"sku": "b"}]}, "items[1].n", "required field"),
        ({"id": 1, "items": [{"n": 1}, None]}, "items[1]", "required field"),
        ({"id": 1, "items": [{"n": 1}, {"n": 2.5}]}, "items[1].n", "fractional part"),
    ],
)
def test_rejects_name_the_field(size: int, record: dict[str, Any], field: str, why: str) -> None:
    schema = arrow(*ICEBERG_FIELDS)
    values = padded([enc(record)], enc(FULL), before=size - 1)
    result = decode_json(values, schema)
    assert [(r.index, r.field) for r in result.rejects] == [(size - 1, field)], result.rejects
    assert why in result.rejects[0].reason
    assert result.table.num_rows == size - 1


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b'{"id": 1', "malformed JSON"),
        (b'{"id": 1,}', "malformed JSON"),
        (b"", "malformed JSON: empty record"),
        (b"   \n ", "malformed JSON: empty record"),
        (b"[1, 2]", "not a JSON object: found an array"),
        (b"42", "not a JSON object: found a number"),
        (b'"s"', "not a JSON object: found a string"),
        (b"null", "not a JSON object: found null"),
        (b'{"id": 1}{"id": 2}', "malformed JSON: Extra data"),
        (b'{"id": 1}} {"v": {"id": 2}', "malformed JSON: Extra data"),  # would end the wrapper early
        (b'{"id": 1, "id": 2}', "duplicate key 'id'"),
        (b'{"id": 1, "name": "\xff"}', "invalid UTF-8"),
        (b'{"id": 1, "name": "\\ud800"}', "unpaired surrogate"),
        (b'{"id": 1, "name": "a\nb"}', "malformed JSON: Invalid control character"),
        (b'{"id": 1, "name": NaN}', None),  # accepted: NaN is a number token; text "NaN"
    ],
)
def test_malformed_and_non_object_values_in_the_middle_of_a_batch(value: bytes, why: str | None) -> None:
    schema = arrow(*ICEBERG_FIELDS)
    values = (
        [enc(dict(FULL, id=i)) for i in range(BULK)] + [value] + [enc(dict(FULL, id=i)) for i in range(BULK)]
    )
    result = decode_json(values, schema)
    if why is None:
        assert result.rejects == ()
        assert result.table.column("name").to_pylist()[BULK] == "NaN"
        return
    assert [(r.index, r.field) for r in result.rejects] == [(BULK, None)], result.rejects
    assert why in result.rejects[0].reason
    assert result.indices.to_pylist() == [*range(BULK), *range(BULK + 1, 2 * BULK + 1)]
    assert result.table.column("id").to_pylist() == [*range(BULK), *range(BULK)]


def test_many_rejects_keep_good_rows_in_order(oracle_calls: list[bytes]) -> None:
    schema = arrow(*ICEBERG_FIELDS)
    bad_kinds = [b"{oops", b"[]", enc({"id": "x"}), enc({"id": 1, "ts": "later"}), b"", enc({"customer": 5})]
    values: list[bytes] = []
    expected_bad: list[int] = []
    for i in range(600):
        if i % 37 == 5:
            expected_bad.append(i)
            values.append(bad_kinds[len(expected_bad) % len(bad_kinds)])
        else:
            values.append(enc(dict(FULL, id=i)))
    result = decode_json(values, schema)
    result.validate()
    assert [r.index for r in result.rejects] == expected_bad
    good = [i for i in range(600) if i not in expected_bad]
    assert result.indices.to_pylist() == good
    assert result.table.column("id").to_pylist() == good
    assert len(oracle_calls) < 600 // 2  # the good records mostly stayed in bulk


def test_clean_batch_never_takes_the_per_record_path(oracle_calls: list[bytes]) -> None:
    schema = arrow(*ICEBERG_FIELDS)
    result = decode_json([enc(dict(FULL, id=i)) for i in range(200)], schema)
    assert result.table.num_rows == 200
    assert oracle_calls == []


def test_values_with_embedded_newlines() -> None:
    schema = arrow(*ICEBERG_FIELDS)
    pretty = [json.dumps(dict(FULL, id=i), indent=2).encode() for i in range(BULK)]
    crlf = [v.replace(b"\n", b"\r\n") for v in pretty]
    for values in (pretty, crlf, [enc(FULL)] * BULK + pretty):
        result = decode_json(values, schema)
        assert result.rejects == ()
        assert result.table.num_rows == len(values)
    mixed = [*pretty, b'{"id": 99, "name": "line\nbreak"}', *pretty]
    result = decode_json(mixed, schema)
    assert [r.index for r in result.rejects] == [BULK]  # a raw newline inside a string is invalid
    assert result.table.column("id").to_pylist() == [*range(BULK), *range(BULK)]


def test_bom_and_surrounding_whitespace_are_tolerated(oracle_calls: list[bytes]) -> None:
    schema = arrow(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))
    values = [
        b"\xef\xbb\xbf" + enc({"id": 1, "name": "\ufeffkeep"}),
        b' \t\r\n{"id": 2}\n\n ',
        enc({"id": 3}),
    ]
    for batch in (values, values * BULK):
        result = decode_json(batch, schema)
        assert result.rejects == ()
        assert result.table.column("id").to_pylist()[:3] == [1, 2, 3]
        assert result.table.column("name").to_pylist()[0] == "\ufeffkeep"  # only a leading BOM goes
    assert len(oracle_calls) == len(values)  # the big batch stayed in bulk
    assert decode_json([b" \xef\xbb\xbf{}"], schema).rejects[0].reason.startswith("malformed JSON")


def test_tombstones_and_non_bytes_are_rejected() -> None:
    values: list[Any] = [enc({"a": 1})] * BULK + [None, bytearray(b'{"a": 2}'), memoryview(b'{"a": 3}')]
    result = decode_json(values, arrow(NestedField(1, "a", LongType())))
    assert [(r.index, r.reason) for r in result.rejects] == [
        (BULK, "not a JSON object: the record value is null (a tombstone)")
    ]
    assert result.table.column("a").to_pylist()[-2:] == [2, 3]


def test_unsupported_types_fail_fast() -> None:
    keys = StructType(NestedField(4, "a", LongType()))
    schema = arrow(NestedField(1, "m", MapType(2, keys, 3, LongType())))  # JSON keys are text
    with pytest.raises(UnsupportedTypeError, match="field 'm.key'"):
        decode_json([b"{}"], schema)
    with pytest.raises(UnsupportedTypeError, match="field 't'"):
        decode_json([b"{}"], pa.schema([("t", pa.timestamp("us", tz="Europe/Paris"))]))


@pytest.mark.parametrize("nulls", [False, True], ids=["never-null", "some-null"])
def test_fields_of_empty_struct_type_keep_every_row_in_bulk(nulls: bool) -> None:
    """A ``struct<>`` field (how routing reads a Debezium row image it only needs to be there)
    has no child to carry the row count: every row stays, at any depth, null or not."""
    empty = pa.struct([])
    schema = pa.schema([
        pa.field("e", empty), pa.field("s", pa.struct([pa.field("e", empty), pa.field("n", pa.int64())])),
        pa.field("l", pa.list_(empty)), pa.field("m", pa.map_(pa.string(), empty)),
        pa.field("r", empty, nullable=False), pa.field("id", pa.int64()),
    ])
    docs = [{"e": None if nulls and i % 3 == 0 else {"x": i}, "s": {"e": {}, "n": i}, "l": [{}, {"y": 1}],
             "m": {"k": {}}, "r": {}, "id": i} for i in range(BULK)]
    result = decode_json([enc(d) for d in docs], schema)
    assert result.rejects == ()
    assert result.table.to_pylist() == [
        {"e": None if nulls and i % 3 == 0 else {}, "s": {"e": {}, "n": i}, "l": [{}, {}], "m": [("k", {})],
         "r": {}, "id": i} for i in range(BULK)]


def test_an_object_that_is_always_empty_infers_and_decodes_in_bulk() -> None:
    result = decode_json([enc({"a": i, "m": {}}) for i in range(BULK)])
    assert result.table.schema == pa.schema([("a", pa.int64()), ("m", pa.struct([]))])
    assert result.table.to_pylist() == [{"a": i, "m": {}} for i in range(BULK)]


# --------------------------------------------------------------------------------------------
# Bulk adaptation: batches whose kinds differ from the schema
# --------------------------------------------------------------------------------------------

ADAPT_SCHEMA = arrow(
    NestedField(1, "i", LongType()),
    NestedField(2, "s", StringType()),
    NestedField(3, "f", DoubleType()),
    NestedField(4, "b", BooleanType()),
    NestedField(5, "d", DecimalType(12, 3)),
    NestedField(6, "n", StructType(NestedField(7, "i", IntegerType()))),
)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda k: {"i": str(k)}, id="numeric strings in a long column"),
        pytest.param(lambda k: {"i": k if k % 2 else str(k)}, id="long column alternating 1 and '1'"),
        pytest.param(lambda k: {"i": k if k % 50 else float(k)}, id="long column with 2.0 tokens"),
        pytest.param(lambda k: {"s": k}, id="numbers in a string column"),
        pytest.param(lambda k: {"s": [k, str(k), k % 2 == 0][k % 3]}, id="string column of mixed kinds"),
        pytest.param(lambda k: {"f": str(k / 4)}, id="numeric strings in a double column"),
        pytest.param(lambda k: {"f": k / 4 if k % 3 else str(k)}, id="double column of mixed kinds"),
        pytest.param(lambda k: {"b": ["true", False][k % 2]}, id="bool column of mixed kinds"),
        pytest.param(lambda k: {"d": [k / 8, str(k / 8)][k % 2]}, id="decimal column of mixed kinds"),
        pytest.param(lambda k: {"n": {"i": [k, str(k)][k % 2]}, "i": k}, id="nested int of mixed kinds"),
        pytest.param(
            lambda k: {"i": [k, "x", None][k % 3], "d": [1, "y"][k % 2]},
            id="garbage strings in numeric columns",
        ),
    ],
)
def test_bulk_matches_per_record_when_kinds_vary(make: Callable[[int], dict[str, Any]]) -> None:
    values = [enc(make(k)) for k in range(300)]
    bulk = decode_json(values, ADAPT_SCHEMA)
    bulk.validate()
    assert bulk.table.schema.equals(ADAPT_SCHEMA, check_metadata=True)
    expected_rows: dict[int, dict[str, Any]] = {}
    expected_rejects: list[Reject] = []
    for i, value in enumerate(values):
        single = decode_json([value], ADAPT_SCHEMA)
        for row in single.table.to_pylist():
            expected_rows[i] = row
        expected_rejects.extend(dataclasses.replace(r, index=i) for r in single.rejects)
    assert rows_by_index(bulk) == expected_rows
    assert list(bulk.rejects) == expected_rejects


def test_mixed_kinds_are_quoted_in_bulk_not_per_record(oracle_calls: list[bytes]) -> None:
    values = [enc({"i": [k, str(k)][k % 2], "s": [k, "x", True][k % 3]}) for k in range(2000)]
    result = decode_json(values, ADAPT_SCHEMA)
    assert result.table.column("i").to_pylist() == list(range(2000))
    assert result.table.column("s").to_pylist()[:3] == ["0", "x", "true"]
    assert oracle_calls == []


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes (bytes) of the pyarrow.json reads decode_json makes."""
    sizes: list[int] = []
    original = wrapped.read_buffer

    def spy(data: pa.Buffer, *args: Any, **kwargs: Any) -> pa.Table:
        sizes.append(data.size)
        return original(data, *args, **kwargs)

    monkeypatch.setattr(wrapped, "read_buffer", spy)
    return sizes


@pytest.mark.parametrize("infer", [False, True])
def test_dense_failures_do_not_cost_a_read_per_record(reads: list[int], infer: bool) -> None:
    """Every other record has a string where an object belongs: no adaptation can help."""
    schema = None if infer else ADAPT_SCHEMA
    values = [enc({"n": [{"i": k}, "oops"][k % 2], "i": k}) for k in range(2000)]
    result = decode_json(values, schema)
    if infer:
        assert result.table.schema.field("n").type == pa.string()  # conflicting kinds
        assert result.table.num_rows == 2000
    else:
        assert [r.index for r in result.rejects] == list(range(1, 2000, 2))
        assert all(r.field == "n" for r in result.rejects)
        assert result.table.column("i").to_pylist() == list(range(0, 2000, 2))
    assert len(reads) < 150, len(reads)


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------

KEYS = st.text(alphabet="abcdefghij_", min_size=1, max_size=6) | st.sampled_from(["a/b", "é", "x y", "T"])
SCALAR_KINDS = ("int", "float", "str", "bool")


def kinds(depth: int = 2) -> st.SearchStrategy[Any]:
    """A field's kind: a scalar kind, ("list", kind) or ("struct", {key: kind})."""
    scalar = st.sampled_from(SCALAR_KINDS)
    if depth == 0:
        return scalar
    return st.one_of(
        scalar,
        st.tuples(st.just("list"), kinds(depth - 1)),
        st.tuples(st.just("struct"), st.dictionaries(KEYS, kinds(depth - 1), min_size=1, max_size=3)),
    )


def values_of(kind: Any) -> st.SearchStrategy[Any]:
    if kind == "int":
        return st.integers(min_value=-(2**63), max_value=2**63 - 1)
    if kind == "float":
        # Non-integral floats keep the "float" kind whatever json.dumps prints.
        return st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer())
    if kind == "str":
        return st.text(max_size=12) | st.sampled_from(
            ["2024-01-04 12:28:13", "2024-01-04T12:28:13Z", "42", ""]
        )
    if kind == "bool":
        return st.booleans()
    if kind[0] == "list":
        return st.lists(values_of(kind[1]) | st.none(), max_size=3)
    fields = kind[1]
    return st.fixed_dictionaries({}, optional={k: values_of(v) | st.none() for k, v in fields.items()})


@st.composite
def record_batches(draw: st.DrawFn) -> list[dict[str, Any]]:
    shape = draw(st.dictionaries(KEYS, kinds(), min_size=1, max_size=5))
    record = st.fixed_dictionaries({}, optional={k: values_of(v) | st.none() for k, v in shape.items()})
    size = draw(st.sampled_from([1, 3, BULK, 60]))
    return draw(st.lists(record, min_size=size, max_size=size))


def filled(value: Any, t: pa.DataType) -> Any:
    """A record as the table returns it: every schema field present, missing ones None."""
    if value is None:
        return None
    if pa.types.is_struct(t):
        return {f.name: filled(value.get(f.name), f.type) for f in t}
    if pa.types.is_list(t):
        return [filled(v, t.value_type) for v in value]
    return value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_batches())
def test_property_infer_then_coerce_round_trips(records: list[dict[str, Any]]) -> None:
    values = [enc(r) for r in records]
    inferred = decode_json(values)
    assert inferred.rejects == ()
    schema = inferred.table.schema
    assert schema == infer_schema(values)
    struct = pa.struct(list(schema))
    expected = [filled(r, struct) for r in records]
    assert same(inferred.table.to_pylist(), expected)
    coerced = decode_json(values, schema)
    assert coerced.table.schema.equals(schema, check_metadata=True)
    assert same(coerced.table.to_pylist(), expected)
    assert coerced.indices.to_pylist() == list(range(len(records)))


JUNK = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, width=64),
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(str),
    st.sampled_from(["", "abc", "true", "1e3", "+5", ".5", "1.0", "-0", "2024-01-04", "NaN", "\uff11"]),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)).map(lambda d: d.isoformat()),
    st.builds(
        lambda d, h, m, sep: d.isoformat(sep=sep) + f"{'+' if h >= 0 else '-'}{abs(h):02d}:{m:02d}",
        st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1)),
        st.integers(min_value=-23, max_value=23),
        st.integers(min_value=0, max_value=59),
        st.sampled_from(["T", " "]),
    ),
    st.booleans(),
    st.none(),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=2),
    st.dictionaries(st.sampled_from(["i", "x"]), st.integers(min_value=-3, max_value=3), max_size=2),
)

PROPERTY_SCHEMA = arrow(
    NestedField(1, "long", LongType()),
    NestedField(2, "int", IntegerType()),
    NestedField(3, "double", DoubleType()),
    NestedField(4, "float", FloatType()),
    NestedField(5, "dec", DecimalType(9, 3)),
    NestedField(6, "str", StringType()),
    NestedField(7, "bool", BooleanType()),
    NestedField(8, "ts", TimestampType()),
    NestedField(9, "tstz", TimestamptzType()),
    NestedField(10, "day", DateType()),
    NestedField(11, "nested", StructType(NestedField(12, "i", IntegerType(), required=True))),
    NestedField(13, "list", ListType(14, LongType(), element_required=False)),
    NestedField(
        15,
        "deep",
        ListType(
            16,
            StructType(
                NestedField(17, "when", TimestamptzType()),
                NestedField(18, "amount", DecimalType(38, 10)),
                NestedField(19, "big", DecimalType(38, 0)),
                NestedField(20, "tags", ListType(21, StringType(), element_required=True)),
                NestedField(22, "day", DateType(), required=True),
            ),
            element_required=False,
        ),
    ),
)


def shaped(t: pa.DataType) -> st.SearchStrategy[Any]:
    """Values that mostly follow ``t``'s shape, with junk at every level."""
    if pa.types.is_struct(t):
        fields = {f.name: shaped(f.type) for f in t}
        return st.fixed_dictionaries({}, optional=fields) | JUNK
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return st.lists(shaped(t.value_type), max_size=3) | JUNK
    return JUNK


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(shaped(pa.struct(list(PROPERTY_SCHEMA))), min_size=BULK, max_size=80),
    st.randoms(use_true_random=False),
)
def test_property_bulk_equals_per_record(records: list[Any], rnd: Any) -> None:
    values = [enc(r) for r in records]
    # A sprinkle of broken records.
    for _ in range(rnd.randint(0, 3)):
        values[rnd.randrange(len(values))] = rnd.choice([b"{", b"[]", b"", b'{"long": 1}{}'])
    bulk = decode_json(values, PROPERTY_SCHEMA)
    bulk.validate()
    assert bulk.table.schema.equals(PROPERTY_SCHEMA, check_metadata=True)
    got = rows_by_index(bulk)
    for i, value in enumerate(values):
        single = decode_json([value], PROPERTY_SCHEMA)
        if single.rejects:
            (reject,) = single.rejects
            assert dataclasses.replace(reject, index=i) in bulk.rejects, (value, reject)
            assert i not in got
        else:
            assert same(got[i], single.table.to_pylist()[0]), value


def test_timezone_offsets_property_spot_check() -> None:
    """Offsets: every quarter hour from -23:45 to +23:45 lands on the right UTC instant."""
    schema = arrow(NestedField(1, "tz", TimestamptzType()), NestedField(2, "naive", TimestampType()))
    base = datetime(2024, 6, 1, 12, 0, 0, 250000)
    texts, instants = [], []
    for quarter in range(-95, 96):
        offset = timedelta(minutes=15 * quarter)
        sign = "+" if quarter >= 0 else "-"
        minutes = abs(quarter) * 15
        texts.append(f"{base.isoformat()}{sign}{minutes // 60:02d}:{minutes % 60:02d}")
        instants.append(base.replace(tzinfo=timezone(offset)))
    result = decode_json([enc({"tz": t, "naive": t}) for t in texts], schema)
    assert result.rejects == ()
    want = [_micros(i) for i in instants]
    assert result.table.column("tz").cast(pa.int64()).to_pylist() == want
    assert result.table.column("naive").cast(pa.int64()).to_pylist() == want
