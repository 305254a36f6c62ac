"""Property tests of agents.convert.decode_json (hypothesis): generated schemas of every
supported type, nested structs, lists and maps (string or int keys; values of any kind, maps
of maps, lists of maps), and generated records of JSON values in every
encoding a type accepts.

- Only valid values: no rejects, and every row holds exactly what was written (within the
  type's precision: timestamps and times to the microsecond, floored).
- Some invalid values: every record is exactly one of an exact row or a reject naming the
  first bad field (the reference path reports fields in schema order).
- Both hold with ``fold_case`` (schema-case-insensitive) for records whose struct keys are
  spelt in another case at any level.

Batches run up to ~60 records so both the bulk path and the per-record path are exercised.
Examples per test come from the hypothesis profile (tests/unit/conftest.py): ``dev`` by
default, ``--hypothesis-profile=ci`` for many more.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Context, Decimal
from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from agents.convert import grammar
from agents.convert import DECIMAL_ENCODING, EPOCH_UNIT, EPOCH_UNITS, decode_json

EPOCH = datetime(1970, 1, 1)
UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}
MIN_DAYS = date(1, 1, 1).toordinal() - EPOCH.toordinal()
MAX_DAYS = date(9999, 12, 31).toordinal() - EPOCH.toordinal()
INT64 = (-(2**63), 2**63 - 1)
EXACT = Context(prec=100)  # Decimal arithmetic without rounding


class Raw(str):
    """JSON text spliced in as is (decimal numbers keep their exact digits)."""


def dump(v: object) -> str:
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k) + ":" + dump(x) for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(dump(x) for x in v) + "]"
    return json.dumps(v)


@dataclass(frozen=True)
class Kind:
    """A column type: its Arrow field and strategies for (JSON value, expected value) and bad values."""

    type: pa.DataType
    metadata: dict[str, str] | None
    good: st.SearchStrategy[tuple[object, object]]
    bad: st.SearchStrategy[object]


# --------------------------------------------------------------------------------------------
# Leaf kinds
# --------------------------------------------------------------------------------------------


def ticks_to_micros(count: int, digits: int) -> int:
    """``count`` units of 10**-digits s as microseconds, floored (the documented truncation)."""
    return count * 10**6 // 10**digits


def as_number_or_digits(count: int) -> st.SearchStrategy[object]:
    return st.sampled_from([count, str(count)])


@st.composite
def iso_timestamp(draw: st.DrawFn, zoned: bool) -> tuple[object, object]:
    local = draw(st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31)))
    nanos = local.microsecond * 1000 + draw(st.integers(0, 999))
    digits = draw(st.integers(0, 9))
    fraction = f"{nanos:09d}"[:digits]
    offset_minutes = draw(st.none() | st.integers(-(23 * 60 + 59), 23 * 60 + 59))
    sep = draw(st.sampled_from("T "))
    text = (f"{local.year:04d}-{local.month:02d}-{local.day:02d}{sep}" + local.strftime("%H:%M:%S")
            + ("." + fraction if digits else ""))
    if offset_minutes is not None:
        sign = "+" if offset_minutes >= 0 else "-"
        hours, minutes = divmod(abs(offset_minutes), 60)
        styles = [f"{sign}{hours:02d}:{minutes:02d}", f"{sign}{hours:02d}{minutes:02d}"]
        if offset_minutes == 0:
            styles.append("Z")
        if minutes == 0:
            styles.append(f"{sign}{hours:02d}")
        text += draw(st.sampled_from(styles))
    micros = int((fraction + "000000")[:6]) if digits else 0
    instant = local.replace(microsecond=micros) - timedelta(minutes=offset_minutes or 0)
    return text, instant.replace(tzinfo=UTC) if zoned else instant


@st.composite
def epoch_timestamp(draw: st.DrawFn, unit: str, zoned: bool) -> tuple[object, object]:
    digits = UNIT_DIGITS[unit]
    lo, hi = grammar.ts_bounds(digits)
    count = draw(st.integers(lo, hi) | st.integers(-(10 ** (digits + 9)), 10 ** (digits + 9)))
    instant = EPOCH + timedelta(microseconds=ticks_to_micros(count, digits))
    return draw(as_number_or_digits(count)), instant.replace(tzinfo=UTC) if zoned else instant


def timestamp_kind(draw: st.DrawFn, default_unit: str) -> Kind:
    zoned = draw(st.booleans())
    unit = draw(st.none() | st.sampled_from(EPOCH_UNITS))
    effective = unit or default_unit
    digits = UNIT_DIGITS[effective]
    past_9999 = (grammar.MAX_SECONDS + 1) * 10**digits  # never read in the wrong unit
    too_big = st.integers(past_9999, past_9999 * 10)
    return Kind(
        pa.timestamp("us", tz="UTC" if zoned else None),
        {EPOCH_UNIT: unit} if unit else None,
        iso_timestamp(zoned) | epoch_timestamp(effective, zoned),
        st.sampled_from(["soon", "2024-02-30T00:00:00", "2024-01-04", True, [1]]) | too_big,
    )


@st.composite
def good_date(draw: st.DrawFn, unit: str | None) -> tuple[object, object]:
    days = draw(st.integers(MIN_DAYS, MAX_DAYS))
    day = date.fromordinal(days + EPOCH.toordinal())
    if draw(st.booleans()):
        return day.isoformat(), day
    count = days if unit is None else days * 86_400 * 10 ** UNIT_DIGITS[unit]
    return draw(as_number_or_digits(count)), day


def date_kind(draw: st.DrawFn, default_unit: str) -> Kind:
    unit = draw(st.none() | st.sampled_from(EPOCH_UNITS))
    not_whole = 1 if unit is None else 10 ** UNIT_DIGITS[unit]  # a second past midnight
    bad = st.sampled_from(["2024-02-30", "2024-1-4", "2024-01-04T00:00:00", True, Raw("1.5")])
    if unit is not None:
        bad = bad | st.integers(MIN_DAYS + 1, MAX_DAYS - 1).map(lambda d: d * 86_400 * not_whole + not_whole)
    return Kind(pa.date32(), {EPOCH_UNIT: unit} if unit else None, good_date(unit), bad)


@st.composite
def good_time(draw: st.DrawFn, unit: str) -> tuple[object, object]:
    digits = UNIT_DIGITS[unit]
    if draw(st.booleans()):
        t = draw(st.times())
        nanos = t.microsecond * 1000 + draw(st.integers(0, 999))
        n = draw(st.integers(0, 9))
        fraction = f"{nanos:09d}"[:n]
        text = t.strftime("%H:%M:%S") + ("." + fraction if n else "")
        return text, t.replace(microsecond=int((fraction + "000000")[:6]) if n else 0)
    count = draw(st.integers(0, 86_400 * 10**digits - 1))
    micros = ticks_to_micros(count, digits)
    seconds, micro = divmod(micros, 10**6)
    return draw(as_number_or_digits(count)), time(seconds // 3600, seconds // 60 % 60, seconds % 60, micro)


def time_kind(draw: st.DrawFn, default_unit: str) -> Kind:
    unit = draw(st.none() | st.sampled_from(EPOCH_UNITS))
    effective = unit or default_unit
    day = 86_400 * 10 ** UNIT_DIGITS[effective]
    bad = st.sampled_from(["24:00:00", "12:60:00", "12:00", "noon", -1, day, False])
    return Kind(pa.time64("us"), {EPOCH_UNIT: unit} if unit else None, good_time(effective), bad)


def connect_bytes(unscaled: int) -> str:
    length = (unscaled + (unscaled < 0)).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def decimal_kind(draw: st.DrawFn, default_unit: str) -> Kind:
    precision = draw(st.integers(1, 38))
    scale = draw(st.integers(0, precision))
    connect = draw(st.booleans())
    unscaled = st.integers(-(10**precision - 1), 10**precision - 1)

    def encode(u: int) -> st.SearchStrategy[tuple[object, object]]:
        value = Decimal(u).scaleb(-scale, EXACT)
        if connect:
            return st.just((connect_bytes(u), value))
        return st.sampled_from([Raw(str(value)), str(value), Raw(f"{value:f}")]).map(lambda v: (v, value))

    too_fine = st.integers(-(10**precision - 1), 10**precision - 1).map(
        lambda u: Decimal(u * 10 + 1).scaleb(-(scale + 1), EXACT)
    )
    too_big = st.just(Decimal(10**precision).scaleb(-scale, EXACT))
    if connect:
        bad = (too_fine.map(lambda _: "@@==") | too_big.map(lambda d: connect_bytes(int(d.scaleb(scale, EXACT))))
               | st.sampled_from([Raw("12"), ""]))
    else:
        bad = (too_fine | too_big).map(lambda d: Raw(str(d))) | st.just("ten")
    return Kind(
        pa.decimal128(precision, scale),
        {DECIMAL_ENCODING: "connect-bytes"} if connect else None,
        unscaled.flatmap(encode),
        bad,
    )


def simple(t: pa.DataType, good: st.SearchStrategy[tuple[object, object]], bad: st.SearchStrategy[object]) -> Callable[
    [st.DrawFn, str], Kind
]:
    return lambda draw, unit: Kind(t, None, good, bad)


def binary_kind(draw: st.DrawFn, default_unit: str) -> Kind:
    width = draw(st.none() | st.integers(1, 20))
    raw = st.binary(max_size=40) if width is None else st.binary(min_size=width, max_size=width)
    bad = st.sampled_from(["AAE", "A===", "AA=A", "AAE!", Raw("1234")])
    if width is not None:
        bad = bad | st.just(base64.b64encode(b"\x00" * (width + 1)).decode())
    return Kind(
        pa.large_binary() if width is None else pa.binary(width), None,
        raw.map(lambda b: (base64.b64encode(b).decode(), b)), bad,
    )


LEAVES: list[Callable[[st.DrawFn, str], Kind]] = [
    simple(pa.string(), st.text(max_size=12).map(lambda s: (s, s)), st.nothing()),
    simple(pa.int64(), st.integers(*INT64).map(lambda i: (i, i)), st.sampled_from(["x", Raw("1.5"), True])),
    simple(
        pa.float64(),
        st.floats(allow_nan=False, allow_infinity=False).map(lambda f: (f, f)),
        st.sampled_from(["x", Raw("1e400"), [1.0]]),
    ),
    simple(pa.bool_(), st.booleans().map(lambda b: (b, b)), st.sampled_from(["yes", Raw("1")])),
    simple(
        pa.uuid(),
        st.uuids().flatmap(lambda u: st.sampled_from([(str(u), u), (str(u).upper(), u)])),
        st.sampled_from(["xyz", "af69865f61a74e39824ecbdcf4a0c45e", Raw("1")]),
    ),
    timestamp_kind,
    date_kind,
    time_kind,
    decimal_kind,
    binary_kind,
]


# --------------------------------------------------------------------------------------------
# Schemas and records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A field and how to draw (json, expected, first bad path) for it."""

    field: pa.Field
    draw_value: Callable[[st.DrawFn, str, float], tuple[object, object, str | None]]


def leaf_column(name: str, kind: Kind) -> Column:
    def draw_value(draw: st.DrawFn, path: str, bad_rate: float) -> tuple[object, object, str | None]:
        if draw(st.integers(0, 9)) == 0:
            return None, None, None
        if bad_rate and not kind.bad.is_empty and draw(st.floats(0, 1)) < bad_rate:
            return draw(kind.bad), None, path
        value, expected = draw(kind.good)
        return value, expected, None

    return Column(pa.field(name, kind.type, metadata=kind.metadata), draw_value)


def struct_column(name: str, children: list[Column]) -> Column:
    def draw_value(draw: st.DrawFn, path: str, bad_rate: float) -> tuple[object, object, str | None]:
        if draw(st.integers(0, 9)) == 0:
            return None, None, None
        doc, expected, first_bad = record(draw, children, bad_rate, prefix=f"{path}.")
        return doc, expected, first_bad

    return Column(pa.field(name, pa.struct([c.field for c in children])), draw_value)


def list_column(name: str, element: Column) -> Column:
    def draw_value(draw: st.DrawFn, path: str, bad_rate: float) -> tuple[object, object, str | None]:
        if draw(st.integers(0, 9)) == 0:
            return None, None, None
        items, expected, first_bad = [], [], None
        for i in range(draw(st.integers(0, 3))):
            value, exp, bad = element.draw_value(draw, f"{path}[{i}]", bad_rate)
            items.append(value)
            expected.append(exp)
            first_bad = first_bad or bad
        return items, expected, first_bad

    return Column(pa.field(name, pa.list_(element.field)), draw_value)


def map_column(name: str, value: Column, int_keys: bool) -> Column:
    """A map of string or int keys; int keys are written as their text, sometimes "0042"."""

    def draw_value(draw: st.DrawFn, path: str, bad_rate: float) -> tuple[object, object, str | None]:
        if draw(st.integers(0, 9)) == 0:
            return None, None, None
        doc: dict[str, object] = {}
        expected: list[tuple[object, object]] = []
        first_bad: str | None = None
        keys: list[Any] = draw(
            st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3, unique=True)
            if int_keys
            else st.lists(st.text(max_size=6), max_size=3, unique=True)
        )
        for key in keys:
            text = str(key)
            if int_keys and draw(st.booleans()):
                text = f"{key:+05d}" if key < 0 else f"{key:05d}"
            if int_keys and bad_rate and draw(st.floats(0, 1)) < bad_rate:
                text = f"k{text}"
                first_bad = first_bad or f"{path}.{text}"
            v, exp, bad = value.draw_value(draw, f"{path}.{text}", bad_rate)
            doc[text] = v
            expected.append((key, exp))
            first_bad = first_bad or bad
        return doc, expected, first_bad

    key = pa.int32() if int_keys else pa.string()
    return Column(pa.field(name, pa.map_(key, value.field.with_name("value"))), draw_value)


def record(
    draw: st.DrawFn, columns: list[Column], bad_rate: float, prefix: str = ""
) -> tuple[dict[str, object], dict[str, object], str | None]:
    doc: dict[str, object] = {}
    expected: dict[str, object] = {}
    first_bad: str | None = None
    for c in columns:
        value, exp, bad = c.draw_value(draw, prefix + c.field.name, bad_rate)
        expected[c.field.name] = exp
        if value is not None or draw(st.booleans()):  # a null is written as null or left out
            doc[c.field.name] = value
        first_bad = first_bad or bad
    return doc, expected, first_bad


@st.composite
def columns(draw: st.DrawFn, default_unit: str) -> list[Column]:
    out: list[Column] = []
    for i in range(draw(st.integers(1, 6))):
        shape = draw(st.sampled_from(["leaf", "leaf", "leaf", "struct", "list", "map"]))
        name = f"c{i}"
        if shape == "map":
            def leaf() -> Column:
                return leaf_column("value", draw(st.sampled_from(LEAVES))(draw, default_unit))

            inner = draw(st.sampled_from(["leaf", "leaf", "struct", "map", "list"]))
            if inner == "struct":
                value = struct_column("value", [leaf_column(f"n{j}", draw(st.sampled_from(LEAVES))(draw, default_unit))
                                                for j in range(draw(st.integers(1, 2)))])
            elif inner == "map":
                value = map_column("value", leaf(), draw(st.booleans()))
            elif inner == "list":
                value = list_column("value", leaf_column("element", draw(st.sampled_from(LEAVES))(draw, default_unit)))
            else:
                value = leaf()
            column = map_column(name, value, draw(st.booleans()))
            out.append(list_column(name, column) if draw(st.integers(0, 3)) == 0 else column)
        elif shape == "struct":
            kids = [leaf_column(f"n{j}", draw(st.sampled_from(LEAVES))(draw, default_unit))
                    for j in range(draw(st.integers(1, 3)))]
            out.append(struct_column(name, kids))
        elif shape == "list":
            out.append(list_column(name, leaf_column("element", draw(st.sampled_from(LEAVES))(draw, default_unit))))
        else:
            out.append(leaf_column(name, draw(st.sampled_from(LEAVES))(draw, default_unit)))
    return out


def recase(v: object, t: pa.DataType | None, draw: st.DrawFn) -> object:
    """``v`` (a record or a value of type ``t``) with some struct keys upper-cased, at every
    level; map keys are data and stay as they are."""
    if isinstance(v, dict) and t is not None and pa.types.is_struct(t):
        return {
            (k.upper() if draw(st.booleans()) else k): recase(x, t.field(k).type if t.get_field_index(k) >= 0 else None, draw)
            for k, x in v.items()
        }
    if isinstance(v, dict) and t is not None and pa.types.is_map(t):
        return {k: recase(x, t.item_type, draw) for k, x in v.items()}
    if isinstance(v, list) and t is not None and (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return [recase(x, t.value_type, draw) for x in v]
    return v


def run(data: st.DataObject, bad_rate: float) -> None:
    unit = data.draw(st.sampled_from(EPOCH_UNITS), label="epoch_unit")
    cols = data.draw(columns(unit), label="columns")
    schema = pa.schema([c.field for c in cols])
    n = data.draw(st.integers(0, 60), label="records")
    docs, expected, bad_paths = [], [], []
    for _ in range(n):
        doc, exp, bad = record(data.draw, cols, bad_rate)
        docs.append(doc)
        expected.append(exp)
        bad_paths.append(bad)
    fold = data.draw(st.booleans(), label="fold_case")  # schema-case-insensitive: keys spelt in any case
    if fold:
        docs = [recase(d, pa.struct(list(schema)), data.draw) for d in docs]
    values = [dump(d).encode() for d in docs]

    result = decode_json(values, schema, epoch_unit=unit, fold_case=fold)
    result.validate()
    assert result.table.schema.equals(schema, check_metadata=True)
    rows = dict(zip(result.indices.to_pylist(), result.table.to_pylist(), strict=True))
    rejects = {r.index: r for r in result.rejects}
    assert sorted([*rows, *rejects]) == list(range(n))  # each record exactly once
    for i in range(n):
        if bad_paths[i] is None:
            assert i not in rejects, f"record {i} {values[i]!r} rejected: {rejects.get(i)}"
            assert rows[i] == expected[i], f"record {i} {values[i]!r}"
        else:
            assert i in rejects, f"record {i} {values[i]!r}: expected a reject at {bad_paths[i]}, found {rows.get(i)}"
            assert rejects[i].field == bad_paths[i], (values[i], rejects[i])


@given(st.data())
def test_valid_records_round_trip_exactly(data: st.DataObject) -> None:
    run(data, bad_rate=0.0)


@given(st.data())
def test_every_record_is_an_exact_row_or_a_reject_naming_the_field(data: st.DataObject) -> None:
    run(data, bad_rate=0.05)
