"""Cast$Value's cheap path (issue 39's 15 % constraint): a Cast field is parsed as JSON integers
while a batch holds only integers, and a text column of integers is cast in one Arrow pass; the
values, nulls and rejects stay Connect's (agents/transforms/cast.py) on every kind of batch."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from agents.convert import JSON_TEXT, NUMBERS_FIRST, decode_json
from agents.convert.plan import Plan
from agents.transforms.cast import cast_text
from icesink.shared.errors import UnsupportedTypeError
from tests.unit.test_conversion_transforms import C, run

MARKED = pa.field("n", pa.string(), metadata={JSON_TEXT: NUMBERS_FIRST})


REPEAT = 20  # batches longer than agents.convert.limits.SMALL_RUN: read in bulk, not per record


def cast_batch(ns: list[Any], to: str) -> tuple[list[Any], list[int]]:
    """The ``n`` of each record (a JSON value) through the decode and ``Cast$Value`` ``n:to``:
    the rows' ``n`` in input order (None for a reject), and the rejected inputs."""
    ns = ns * REPEAT
    values = [json.dumps({"id": i, "n": n}).encode() for i, n in enumerate(ns)]
    _, out = run(values, transforms="c", **{"transforms.c.type": f"{C}Cast$Value", "transforms.c.spec": f"n:{to}"})
    got: dict[int, Any] = {row["id"]: row["n"] for row in out.table.to_pylist()}
    rejected = sorted(r.index for r in out.rejects)
    assert all(r.field == "n" and f"cannot be cast to {to}" in r.reason for r in out.rejects)
    return [got.get(i) for i in range(len(ns))], rejected


def test_a_cast_field_is_parsed_as_integers_first_and_read_as_the_same_text() -> None:
    assert Plan.of([MARKED]).parse_schema.field("v").type.field("n").type == pa.int64()
    values = [b'{"n":12}', b'{"n":null}', b"{}", b'{"n":9223372036854775807}'] * REPEAT
    assert decode_json(values, pa.schema([MARKED])).table.column("n").to_pylist() == [
        "12", None, None, "9223372036854775807"] * REPEAT
    mixed = [b'{"n":1}', b'{"n":"a b"}', b'{"n":2.50}', b'{"n":true}', b'{"n":[1]}', b'{"n":1e400}',
             b'{"n":-0}'] * REPEAT
    assert decode_json(mixed, pa.schema([MARKED])).table.column("n").to_pylist() == [
        "1", "a b", "2.50", "true", "[1]", "1e400", "-0"] * REPEAT


def test_the_marker_is_refused_on_a_field_that_is_no_string() -> None:
    with pytest.raises(UnsupportedTypeError, match="icesink.json-text"):
        decode_json([b"{}"], pa.schema([MARKED.with_type(pa.int64())]))


@pytest.mark.parametrize(("to", "ns", "want", "bad"), [
    # Number.intValue() of a Long wraps; beyond Long the text is no Long: rejected
    ("int32", [1, 3_000_000_000, -2**31 - 1, 2**63 - 1, None, 2**63], [1, -1294967296, 2**31 - 1, -1, None, None], [5]),
    ("int8", [300, -129, 127], [44, 127, 127], []),
    ("int64", [2**63 - 1, -2**63], [2**63 - 1, -2**63], []),
    # a Double (fraction or exponent) is truncated toward zero and saturated, then narrowed
    ("int32", [7, 2.9, -2.9, 1e3, 1e300], [7, 2, -2, 1000, 2**31 - 1], []),
    # numeric strings cast as Connect parses them; Arrow's hex ("0x10") is no number to Connect
    ("int32", ["12", "-0", "007", "0x10", " 5", "+5"], [12, 0, 7, None, None, None], [3, 4, 5]),
    # a batch mixing strings and numbers, booleans and nulls
    ("int16", [1, "2", True, False, None, "x", 70000], [1, 2, 1, 0, None, None, 70000 - 2**16], [5]),
    ("boolean", [0, 5, "0", "TRUE", None, 2**64], [False, True, False, True, None, None], [5]),
    ("string", [12, -3, 1.5e7, None], ["12", "-3", "1.5E7", None], []),
    ("float64", [3, 2**53 + 1, "-0", None, "1.5"], [3.0, float(2**53), -0.0, None, 1.5], []),
    ("float32", [16_777_217, 1], [16_777_216.0, 1.0], []),
])
def test_cast_gives_connects_values_on_batches_of_integers_and_on_mixed_ones(
        to: str, ns: list[Any], want: list[Any], bad: list[int]) -> None:
    got, rejected = cast_batch(ns, to)
    want, bad = want * REPEAT, [b + k * len(ns) for k in range(REPEAT) for b in bad]
    assert (got, rejected) == (want, bad)
    if to.startswith("float"):  # -0.0 == 0.0: the sign too
        assert [str(g) for g in got] == [str(w) for w in want]


def test_a_column_of_integer_texts_casts_as_the_regular_expressions_do() -> None:
    texts = pa.array(["0", "-0", "-007", "9223372036854775807", None, "-9223372036854775808"])
    for to in ("int8", "int16", "int32", "int64", "boolean", "string", "float32", "float64"):
        fast, bad = cast_text(texts, to)
        slow, slow_bad = cast_text(pa.concat_arrays([texts, pa.array(["x"])]), to)  # "x": the general path
        assert [str(v) for v in fast.to_pylist()] == [str(v) for v in slow.to_pylist()[:-1]], to
        assert not bad.any() and slow_bad.tolist() == [False] * len(texts) + [to != "string" and to != "boolean"]


def test_a_fraction_in_a_cast_field_makes_it_text_and_leaves_integer_columns_parsed_as_integers() -> None:
    schema = pa.schema([MARKED, pa.field("q", pa.int64())])
    plan = Plan.of(list(schema)).adapt("JSON parse error: Failed to convert JSON to int64")
    assert plan is not None
    assert [(f.name, f.type) for f in plan.parse_schema.field("v").type] == [("n", pa.string()), ("q", pa.int64())]
    values = [b'{"n":2.5,"q":1}', b'{"n":3,"q":2.0}'] * REPEAT  # then q's 2.0: integers widened
    assert decode_json(values, schema).table.to_pylist() == [{"n": "2.5", "q": 1}, {"n": "3", "q": 2}] * REPEAT
