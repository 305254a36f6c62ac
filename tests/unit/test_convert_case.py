"""Case-insensitive keys in agents.convert.decode_json (``fold_case``, what
``iceberg.tables.schema-case-insensitive`` turns on): a key fills the field it names ignoring
case, at every level. No services.

Every case runs at two batch sizes: one record (the per-record reference path) and a batch big
enough for the bulk path; both must agree.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

import agents.convert as convert
from agents.convert import limits, wrapped
from agents.convert import decode_json

BULK = 3 * limits.SMALL_RUN
SIZES = [1, BULK]

ADDRESS = pa.struct([pa.field("zip", pa.string()), pa.field("lines", pa.list_(pa.string()))])
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("customerName", pa.string()),
    pa.field("customer", pa.struct([pa.field("address", ADDRESS), pa.field("vip", pa.bool_())])),
    pa.field("items", pa.list_(pa.struct([pa.field("sku", pa.string()), pa.field("qty", pa.int32())]))),
    pa.field("byStore", pa.map_(pa.string(), pa.struct([pa.field("openedAt", pa.timestamp("us"))]))),
])


def decode(docs: list[dict[str, Any]], size: int, schema: pa.Schema = SCHEMA, fold: bool = True) -> convert.Converted:
    """The docs after ``size - 1`` exactly spelt fillers; the result without the fillers."""
    filler = json.dumps({"id": 0}).encode()
    values = [filler] * (size - 1) + [json.dumps(d).encode() for d in docs]
    out = decode_json(values, schema, fold_case=fold)
    out.validate()
    assert out.table.schema.equals(schema, check_metadata=True)
    keep = pa.array([i >= size - 1 for i in out.indices.to_pylist()], pa.bool_())
    return convert.Converted(
        out.table.filter(keep), pa.array([i - size + 1 for i in out.indices.to_pylist() if i >= size - 1], pa.int64()),
        tuple(convert.Reject(r.index - size + 1, r.reason, r.field) for r in out.rejects if r.index >= size - 1),
    )


@pytest.mark.parametrize("size", SIZES)
def test_keys_fill_fields_ignoring_case_at_every_level(size: int) -> None:
    doc = {
        "ID": 7,
        "CUSTOMERNAME": "Ada",
        "Customer": {"Address": {"ZIP": "1011", "Lines": ["a", "b"]}, "VIP": True},
        "ITEMS": [{"SKU": "p1", "Qty": 2}, {"sku": "p2", "qty": 1}],
        "bystore": {"Store A": {"OPENEDAT": "2024-01-02T03:04:05"}},
    }
    out = decode([doc], size)
    assert out.rejects == ()
    assert out.table.to_pylist() == [{
        "id": 7,
        "customerName": "Ada",
        "customer": {"address": {"zip": "1011", "lines": ["a", "b"]}, "vip": True},
        "items": [{"sku": "p1", "qty": 2}, {"sku": "p2", "qty": 1}],
        "byStore": [("Store A", {"openedAt": pa.scalar(1704164645000000, pa.timestamp("us")).as_py()})],
    }]


@pytest.mark.parametrize("size", SIZES)
def test_without_fold_case_other_spellings_are_ignored(size: int) -> None:
    out = decode([{"id": 1, "CustomerName": "Ada", "customer": {"VIP": True}}], size, fold=False)
    assert out.table.to_pylist()[0]["customerName"] is None
    assert out.table.to_pylist()[0]["customer"] == {"address": None, "vip": None}


@pytest.mark.parametrize("size", SIZES)
def test_two_spellings_of_one_field_exact_wins_else_first_non_null(size: int) -> None:
    docs = [
        {"id": 1, "CustomerName": "other", "customerName": "exact"},
        {"id": 2, "customerName": None, "CUSTOMERNAME": "upper", "customername": "lower"},
        {"id": 3, "customer": {"Vip": None, "VIP": False}},
    ]
    out = decode(docs, size)
    rows = out.table.to_pylist()
    assert [r["customerName"] for r in rows] == ["exact", "upper", None]
    assert rows[2]["customer"]["vip"] is False


@pytest.mark.parametrize("size", SIZES)
def test_rejects_name_the_field_as_the_schema_spells_it(size: int) -> None:
    docs = [
        {"Id": 1, "Items": [{"SKU": "a", "QTY": "many"}]},
        {"ID": None, "customerName": "no id"},
        {"iD": 3, "ByStore": {"s": {"OpenedAt": "yesterday"}}},
    ]
    out = decode(docs, size)
    assert [(r.index, r.field) for r in out.rejects] == [(0, "items[0].qty"), (1, "id"), (2, "byStore.s.openedAt")]
    assert out.table.num_rows == 0


def test_batch_spelt_exactly_is_not_rewritten(monkeypatch: pytest.MonkeyPatch) -> None:
    """The byte-level fast path stays: only a batch with another spelling is rewritten. An
    optional struct column that is null in every record does not count as one."""
    calls: list[bool] = []
    real = wrapped.rewritten

    def spy(values: Any, schema: pa.Schema, *, fold: bool) -> list[bytes]:
        calls.append(fold)
        return real(values, schema, fold=fold)

    monkeypatch.setattr(convert, "rewritten", spy)
    plain = pa.schema([f for f in SCHEMA if f.name != "byStore"])
    exact = [json.dumps({"id": i, "customerName": "x", "customer": None, "items": [{"sku": "s"}]}).encode() for i in range(BULK)]
    assert decode_json(exact, plain, fold_case=True).table.num_rows == BULK
    assert calls == []
    other = exact[:-1] + [b'{"id": 99, "Items": [{"SKU": "t"}]}']
    out = decode_json(other, plain, fold_case=True)
    assert calls == [True] and out.table.column("items").to_pylist()[-1] == [{"sku": "t", "qty": None}]


def test_names_that_differ_only_in_case_keep_their_own_keys() -> None:
    """A table may hold ``a`` and ``A`` (created case-sensitively): exact keys still go to their
    own column; another spelling goes to the first of them."""
    schema = pa.schema([pa.field("a", pa.int64()), pa.field("A", pa.int64())])
    out = decode_json([b'{"a": 1, "A": 2}', b'{"A": 3}', b'{"a": 4}'] * BULK, schema, fold_case=True)
    assert out.table.to_pylist()[:3] == [{"a": 1, "A": 2}, {"a": None, "A": 3}, {"a": 4, "A": None}]


def test_a_rewritten_batch_keeps_minus_zero() -> None:
    """The rewrite parses each record with json.loads, which reads a bare -0 as the int 0: a
    float column would lose its sign and a string column its text. Both paths keep them."""
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("x", pa.float64()), pa.field("s", pa.string()),
                        pa.field("l", pa.list_(pa.float64()))])
    values = [b'{"id": 1, "x": -0, "s": -0, "l": [ -0 ,0,-0]}', b'{"ID": 2, "s": "a-0,"}'] + [b'{"id": 0}'] * BULK
    for batch in (values, values[:1]):
        row = decode_json(batch, schema, fold_case=True).table.to_pylist()[0]
        assert (row["s"], str(row["x"]), [str(v) for v in row["l"]]) == ("-0", "-0.0", ["-0.0", "0.0", "-0.0"])
    assert decode_json(values, schema, fold_case=True).table.column("s").to_pylist()[1] == "a-0,"
