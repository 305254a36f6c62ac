"""Partition expressions, specs and values. No Spark, no I/O."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    DateType,
    DecimalType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from icesink.shared.errors import ConfigError
from icesink.shared.partitioning import (
    PartitionExpr,
    build_partition_spec,
    parse_partition_by,
    parse_partition_expr,
    partition_values,
)

# ---------------------------------------------------------------------------------------------
# Parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("store_id", PartitionExpr("identity", "store_id", None)),
        ("  store_id  ", PartitionExpr("identity", "store_id", None)),
        ("identity(store_id)", PartitionExpr("identity", "store_id", None)),
        ("year(ts)", PartitionExpr("year", "ts", None)),
        ("years(ts)", PartitionExpr("year", "ts", None)),
        ("month(ts)", PartitionExpr("month", "ts", None)),
        ("months(ts)", PartitionExpr("month", "ts", None)),
        ("day(ts)", PartitionExpr("day", "ts", None)),
        ("days( ts )", PartitionExpr("day", "ts", None)),
        ("DAY(ts)", PartitionExpr("day", "ts", None)),
        ("hour(ts)", PartitionExpr("hour", "ts", None)),
        ("hours(ts)", PartitionExpr("hour", "ts", None)),
        ("bucket(store_id, 8)", PartitionExpr("bucket", "store_id", 8)),
        ("bucket(8, store_id)", PartitionExpr("bucket", "store_id", 8)),
        ("bucket(store_id,16)", PartitionExpr("bucket", "store_id", 16)),
        ("truncate(name, 4)", PartitionExpr("truncate", "name", 4)),
        ("truncate(4, name)", PartitionExpr("truncate", "name", 4)),
        ("day(payload.ts)", PartitionExpr("day", "payload.ts", None)),
        ("payload.kind", PartitionExpr("identity", "payload.kind", None)),
        ("bucket(a.b.c, 3)", PartitionExpr("bucket", "a.b.c", 3)),
    ],
)
def test_parse_partition_expr_accepts_every_form(text: str, expected: PartitionExpr) -> None:
    assert parse_partition_expr(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "day()",
        "day(ts, 3)",
        "day(a b)",
        "weeks(ts)",
        "bucket(store_id)",
        "bucket(store_id, 0)",
        "bucket(store_id, -2)",
        "bucket(store_id, x)",
        "bucket(3, 4)",
        "bucket(store_id, 8, 9)",
        "truncate(name)",
        "day(ts",
        "ts)",
        "day((ts))",
        "a b",
        "a..b",
        ".a",
        "day(ts) x",
    ],
)
def test_parse_partition_expr_rejects_bad_input(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_partition_expr(text)
    err = info.value
    assert err.key == "partition-by"
    assert err.value == text
    message = str(err)
    assert repr(text) in message  # names the text found
    for form in ("identity(col)", "day(col)", "hour(col)", "bucket(col, N)", "truncate(col, W)"):
        assert form in message  # and the valid forms


def test_parse_partition_by_splits_on_top_level_commas_only() -> None:
    assert parse_partition_by("day(date_ordered), bucket(store_id, 8)") == (
        PartitionExpr("day", "date_ordered", None),
        PartitionExpr("bucket", "store_id", 8),
    )
    assert parse_partition_by("bucket(8,store_id),truncate(4, name) , region") == (
        PartitionExpr("bucket", "store_id", 8),
        PartitionExpr("truncate", "name", 4),
        PartitionExpr("identity", "region", None),
    )
    assert parse_partition_by("") == ()
    assert parse_partition_by("  ") == ()


@pytest.mark.parametrize(
    "text",
    ["a,,b", "day(ts),", ",a", "day(ts), bucket(x)", "bucket(x, 4", "a), b", "day(ts), foo(x)"],
)
def test_parse_partition_by_rejects_bad_lists(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_partition_by(text)
    assert info.value.key == "partition-by"
    assert info.value.value == text
    assert "bucket(col, N)" in str(info.value)


def test_partition_expr_str_round_trips() -> None:
    for text in ["store_id", "day(ts)", "bucket(store_id, 8)", "truncate(name, 4)", "hour(payload.ts)"]:
        assert str(parse_partition_expr(text)) == text
        assert parse_partition_expr(str(parse_partition_expr(text))) == parse_partition_expr(text)


# ---------------------------------------------------------------------------------------------
# Specs

SCHEMA = Schema(
    NestedField(1, "order_id", StringType(), required=True),
    NestedField(2, "store_id", LongType()),
    NestedField(3, "date_ordered", TimestampType()),
    NestedField(4, "ts_tz", TimestamptzType()),
    NestedField(5, "day_of", DateType()),
    NestedField(6, "qty", IntegerType()),
    NestedField(7, "price", DecimalType(10, 2)),
    NestedField(8, "blob", BinaryType()),
    NestedField(
        9,
        "payload",
        StructType(
            NestedField(10, "kind", StringType()),
            NestedField(11, "ts", TimestampType()),
        ),
    ),
    NestedField(12, "tags", ListType(13, StringType(), element_required=False)),
)


def test_build_partition_spec_names_and_ids_like_iceberg() -> None:
    exprs = parse_partition_by(
        "store_id, year(date_ordered), month(ts_tz), day(day_of), hour(payload.ts), "
        "bucket(order_id, 16), truncate(qty, 10), payload.kind"
    )
    spec = build_partition_spec(exprs, SCHEMA)
    assert [(f.field_id, f.name, f.source_id, f.transform) for f in spec.fields] == [
        (1000, "store_id", 2, IdentityTransform()),
        (1001, "date_ordered_year", 3, YearTransform()),
        (1002, "ts_tz_month", 4, MonthTransform()),
        (1003, "day_of_day", 5, DayTransform()),
        (1004, "payload.ts_hour", 11, HourTransform()),
        (1005, "order_id_bucket", 1, BucketTransform(16)),
        (1006, "qty_trunc", 6, TruncateTransform(10)),
        (1007, "payload.kind", 10, IdentityTransform()),
    ]
    assert spec.spec_id == 0


def test_build_partition_spec_empty_is_unpartitioned() -> None:
    assert build_partition_spec((), SCHEMA).is_unpartitioned()


@pytest.mark.parametrize(
    ("text", "must_mention"),
    [
        ("day(missing)", "missing"),
        ("day(payload.nope)", "payload.nope"),
        ("day(order_id)", "order_id"),
        ("hour(day_of)", "day_of"),
        ("truncate(date_ordered, 3)", "date_ordered"),
        ("payload", "payload"),
        ("tags.element", "tags.element"),
        ("day(date_ordered), day(date_ordered)", "date_ordered_day"),
    ],
)
def test_build_partition_spec_rejects_bad_columns(text: str, must_mention: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_partition_spec(parse_partition_by(text), SCHEMA)
    assert info.value.key == "partition-by"
    assert must_mention in str(info.value)


def test_build_partition_spec_rejects_a_name_that_is_a_column() -> None:
    schema = Schema(NestedField(1, "ts", TimestampType()), NestedField(2, "ts_day", IntegerType()))
    with pytest.raises(ConfigError, match="ts_day"):
        build_partition_spec(parse_partition_by("day(ts)"), schema)


# ---------------------------------------------------------------------------------------------
# Values: vectorised transforms must equal pyiceberg's per-value transforms.

TS = [dt.datetime(2024, 1, 4, 10, 5, 7, 123456), None, dt.datetime(1969, 12, 31, 23, 59, 59), dt.datetime(2000, 2, 29)]
TSTZ = [v.replace(tzinfo=dt.UTC) if v is not None else None for v in TS]
DATES = [dt.date(2024, 1, 4), None, dt.date(1969, 12, 31), dt.date(1970, 1, 1)]
STRINGS = ["abcdef", None, "", "é漢字ab"]
LONGS = [5, -7, None, 2**40]
INTS = [5, -7, None, 0]
DECIMALS = [decimal.Decimal("12.34"), None, decimal.Decimal("-0.05"), decimal.Decimal("99999999.99")]
BLOBS = [b"abcdef", None, b"", b"\x00\xff"]

_TIME: list[Transform[Any, Any]] = [YearTransform(), MonthTransform(), DayTransform(), HourTransform()]
CASES: list[tuple[str, IcebergType, list[Any], Transform[Any, Any]]] = [
    *[(f"ts-{t}", TimestampType(), TS, t) for t in _TIME],
    *[(f"tstz-{t}", TimestamptzType(), TSTZ, t) for t in _TIME],
    *[(f"date-{t}", DateType(), DATES, t) for t in _TIME[:3]],
    ("ts-bucket", TimestampType(), TS, BucketTransform(7)),
    ("date-bucket", DateType(), DATES, BucketTransform(7)),
    ("string-bucket", StringType(), STRINGS, BucketTransform(16)),
    ("long-bucket", LongType(), LONGS, BucketTransform(8)),
    ("int-bucket", IntegerType(), INTS, BucketTransform(8)),
    ("decimal-bucket", DecimalType(10, 2), DECIMALS, BucketTransform(5)),
    ("binary-bucket", BinaryType(), BLOBS, BucketTransform(5)),
    ("string-truncate", StringType(), STRINGS, TruncateTransform(3)),
    ("long-truncate", LongType(), LONGS, TruncateTransform(10)),
    ("int-truncate", IntegerType(), INTS, TruncateTransform(10)),
    ("decimal-truncate", DecimalType(10, 2), DECIMALS, TruncateTransform(50)),
    ("binary-truncate", BinaryType(), BLOBS, TruncateTransform(2)),
    ("string-identity", StringType(), STRINGS, IdentityTransform()),
    ("long-identity", LongType(), LONGS, IdentityTransform()),
    ("date-identity", DateType(), DATES, IdentityTransform()),
    ("ts-identity", TimestampType(), TS, IdentityTransform()),
]


@pytest.mark.parametrize(("source_type", "values", "transform"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_partition_values_match_pyiceberg_per_value_transforms(
    source_type: IcebergType, values: list[Any], transform: Transform[Any, Any]
) -> None:
    schema = Schema(NestedField(1, "c", source_type), NestedField(2, "other", LongType()))
    spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=transform, name="c_p"))
    arrow_schema = schema_to_pyarrow(schema)
    data = pa.table({"c": pa.array(values, arrow_schema.field("c").type), "other": list(range(len(values)))})
    data = pa.Table.from_batches(data.to_batches(max_chunksize=2))  # several chunks

    result = partition_values(data, spec, schema)

    assert result.column_names == ["c_p"]
    assert result.num_rows == len(values)
    expected = [transform.transform(source_type)(v) for v in values]
    assert result.column("c_p").to_pylist() == expected
    assert result.column("c_p").null_count == values.count(None)


def test_partition_values_several_fields_nested_and_null_parent() -> None:
    schema = Schema(
        NestedField(1, "store_id", LongType()),
        NestedField(
            2, "payload", StructType(NestedField(3, "ts", TimestampType()), NestedField(4, "kind", StringType()))
        ),
    )
    spec = build_partition_spec(parse_partition_by("day(payload.ts), bucket(store_id, 4), payload.kind"), schema)
    payloads = [
        {"ts": dt.datetime(2024, 1, 4, 1), "kind": "a"},
        None,  # a null struct: its children count as null
        {"ts": None, "kind": "b"},
        {"ts": dt.datetime(2024, 1, 5, 23), "kind": None},
    ]
    data = pa.table(
        {"store_id": [1, 2, None, 4], "payload": payloads},
        schema=schema_to_pyarrow(schema),
    )
    result = partition_values(data, spec, schema)
    assert result.column_names == ["payload.ts_day", "store_id_bucket", "payload.kind"]
    day: Callable[[Any], Any] = DayTransform().transform(TimestampType())
    bucket: Callable[[Any], Any] = BucketTransform(4).transform(LongType())
    assert result.column("payload.ts_day").to_pylist() == [
        day(dt.datetime(2024, 1, 4, 1)),
        None,
        None,
        day(dt.datetime(2024, 1, 5, 23)),
    ]
    assert result.column("payload.ts_day").to_pylist()[0] == 19726
    assert result.column("store_id_bucket").to_pylist() == [bucket(1), bucket(2), None, bucket(4)]
    assert result.column("payload.kind").to_pylist() == ["a", None, "b", None]


def test_partition_values_of_an_empty_table() -> None:
    schema = Schema(NestedField(1, "ts", TimestampType()))
    spec = build_partition_spec(parse_partition_by("day(ts)"), schema)
    empty = schema_to_pyarrow(schema).empty_table()
    result = partition_values(empty, spec, schema)
    assert result.num_rows == 0
    assert result.column_names == ["ts_day"]


def test_known_values_from_the_iceberg_spec() -> None:
    # Iceberg spec, "Appendix B: 32-bit Hash Requirements": hash(34L) = 2017239379, so bucket 16 -> 3.
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "s", StringType()))
    spec = build_partition_spec(parse_partition_by("bucket(id, 16), bucket(s, 16), truncate(s, 3)"), schema)
    data = pa.table({"id": [34], "s": ["iceberg"]}, schema=schema_to_pyarrow(schema))
    result = partition_values(data, spec, schema)
    assert result.to_pylist() == [
        {"id_bucket": 2017239379 % 16, "s_bucket": (1210000089 & 0x7FFFFFFF) % 16, "s_trunc": "ice"}
    ]


# ---------------------------------------------------------------------------------------------
# Directory labels used by the Spark writer (pure helpers: no session is started).


def test_spark_escape_matches_spark_and_round_trips() -> None:
    from spark_bridge.labels import spark_escape, spark_unescape

    # ExternalCatalogUtils.escapePathName: these characters become %XX (upper-case hex).
    assert spark_escape("a/b:c=d%e f") == "a%2Fb%3Ac%3Dd%25e f"
    assert spark_escape("2024-01-04T10:00:00") == "2024-01-04T10%3A00%3A00"
    assert spark_escape("é漢字") == "é漢字"
    every = "".join(chr(c) for c in range(1, 128)) + "é漢字"
    assert spark_unescape(spark_escape(every)) == every


def test_labels_are_iceberg_human_strings_and_unambiguous() -> None:
    from spark_bridge.labels import HIVE_DEFAULT_PARTITION, assign_labels, label_column_names

    schema = Schema(
        NestedField(1, "name", StringType()),
        NestedField(2, "ts", TimestampType()),
        NestedField(3, "store_id", LongType()),
    )
    spec = build_partition_spec(parse_partition_by("name, hour(ts), day(ts), bucket(store_id, 8)"), schema)
    name_f, hour_f, day_f, bucket_f = spec.fields

    assert label_column_names(spec, ["name", "ts", "store_id"]) == [
        "name_identity",
        "ts_hour",
        "ts_day",
        "store_id_bucket",
    ]

    labels, mapping = assign_labels(day_f, schema, [19726, None])
    assert labels == ["2024-01-04", None]
    assert mapping == {"2024-01-04": 19726}
    labels, _ = assign_labels(hour_f, schema, [473434])
    assert labels == ["2024-01-04-10"]
    labels, _ = assign_labels(bucket_f, schema, [3, 0])
    assert labels == ["3", "0"]

    # Spark writes "" and null both as __HIVE_DEFAULT_PARTITION__: labels must keep them apart.
    values = ["a/b", "", None, HIVE_DEFAULT_PARTITION, "~1", "x"]
    labels, mapping = assign_labels(name_f, schema, values)
    assert labels[values.index(None)] is None
    real = [lbl for lbl in labels if lbl is not None]
    assert len(set(real)) == len(real) == 5
    assert "" not in real and HIVE_DEFAULT_PARTITION not in real
    assert labels[0] == "a/b" and labels[4] == "~1" and labels[5] == "x"
    assert {mapping[lbl] for lbl in real} == {"a/b", "", HIVE_DEFAULT_PARTITION, "~1", "x"}
