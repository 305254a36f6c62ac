"""The bulk path against the per-record reference path (hypothesis), through every entry point
that decodes a batch: plain JSON against a table schema and inferred, Kafka Connect envelopes,
and Debezium change events with and without schemas (the transform, its schema inference and
routing on ``_cdc`` and row fields).

Each batch is decoded twice: in bulk (``agents.convert.limits.SMALL_RUN`` 1, so every run of two or
more records goes through pyarrow.json, whatever the batch size; ``BLOCK_SIZE`` sometimes
small, so a batch spans many of pyarrow's blocks) and by the reference path
alone (``SMALL_RUN`` past any batch: every record through ``Oracle``, inference through
``_type_of``). Both must give the same schema, rows, indices and rejects, or raise the same
way. Batches hold 1 to 300 records; fields are null (or absent) in every record, in the first
N records or here and there; structs may have no fields (objects always ``{}``); a few values
are of the wrong kind and a few records are not JSON at all.
"""

from __future__ import annotations

import base64
import json
import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.convert import limits
from agents.convert import Converted, decode_json
from agents.debezium import DebeziumTransform
from agents.formats import Envelopes, connect_arrow_schema, decode_envelopes
from tests.unit.test_convert_properties import Raw, dump

T = TypeVar("T")
C = "org.apache.kafka.connect.data."
EXAMPLES = 20  # each example decodes up to 300 records twice per entry point: a few seconds in all
#: pyarrow's read block in bulk: its default (1 MiB, one block for these batches), or small
#: enough that a batch spans many blocks (pyarrow infers each block's types on its own).
BLOCKS = st.sampled_from([1 << 20, 256, 1024, 4096])


# --------------------------------------------------------------------------------------------
# The two paths
# --------------------------------------------------------------------------------------------


@contextmanager
def tuned(small_run: int, block: int) -> Iterator[None]:
    saved = limits.SMALL_RUN, limits.BLOCK_SIZE
    limits.SMALL_RUN, limits.BLOCK_SIZE = small_run, block  # type: ignore[misc]
    try:
        yield
    finally:
        limits.SMALL_RUN, limits.BLOCK_SIZE = saved  # type: ignore[misc]


def outcome(fn: Callable[[], T]) -> T | tuple[str, str]:
    try:
        return fn()
    except Exception as exc:  # compared, not swallowed: both paths must fail alike
        return ("raised", f"{type(exc).__name__}: {exc}")


def both(fn: Callable[[], T], block: int) -> tuple[T | tuple[str, str], T | tuple[str, str]]:
    """``fn()`` in bulk (pyarrow reading ``block`` bytes at a time), then by the reference path alone."""
    with tuned(1, block):
        bulk = outcome(fn)
    with tuned(1 << 40, block):
        reference = outcome(fn)
    return bulk, reference


def same(a: object, b: object) -> bool:
    """Equality that tells -0.0 from 0.0, and 1.0 from 1."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return str(a) == str(b)
    return type(a) is type(b) and a == b


def check_converted(fn: Callable[[], Converted], values: list[bytes], block: int) -> None:
    bulk, reference = both(fn, block)
    assert not isinstance(reference, tuple), f"the reference path raised: {reference[1]}"
    assert not isinstance(bulk, tuple), f"the bulk path raised where the reference did not: {bulk[1]}"
    bulk.validate()
    assert bulk.table.schema.equals(reference.table.schema, check_metadata=True), (
        f"schema: expected {reference.table.schema}, found {bulk.table.schema}")
    assert bulk.indices.to_pylist() == reference.indices.to_pylist()
    assert [(r.index, r.reason, r.field) for r in bulk.rejects] == [
        (r.index, r.reason, r.field) for r in reference.rejects]
    rows = zip(bulk.indices.to_pylist(), bulk.table.to_pylist(), reference.table.to_pylist(), strict=True)
    for i, found, expected in rows:
        assert same(found, expected), f"record {i} {values[i][:300]!r}: expected {expected}, found {found}"


def check_same(fn: Callable[[], T], block: int) -> None:
    bulk, reference = both(fn, block)
    assert bulk == reference


# --------------------------------------------------------------------------------------------
# Shapes: a column type, how its values are written and where they are null
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    kind: str  # int, long, double, bool, string, ts, date, decimal, bytes, struct, array
    optional: bool = True
    nulls: str = "some"  # some, all, first (the first ``k`` records), none
    absent: bool = False  # a null is left out rather than written as null
    k: int = 0
    children: tuple[tuple[str, Shape], ...] = ()  # struct fields; the element of an array

    def connect(self, name: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "int": {"type": "int32"}, "long": {"type": "int64"}, "double": {"type": "float64"},
            "bool": {"type": "boolean"}, "string": {"type": "string"}, "bytes": {"type": "bytes"},
            "ts": {"type": "int64", "name": C + "Timestamp", "version": 1},
            "date": {"type": "int32", "name": C + "Date", "version": 1},
            "decimal": {"type": "bytes", "name": C + "Decimal", "version": 1,
                        "parameters": {"scale": "2", "connect.decimal.precision": "10"}},
        }.get(self.kind, {})
        if self.kind == "struct":
            out = {"type": "struct", "fields": [s.connect(n) for n, s in self.children]}
        elif self.kind == "array":
            out = {"type": "array", "items": self.children[0][1].connect()}
        out = {**out, "optional": self.optional}
        return {**out, "field": name} if name is not None else out


#: How many records a field is null in first: past a block or two of pyarrow's, or any number.
FIRST = st.sampled_from([20, 60, 150, 250]) | st.integers(1, 300)
#: Batch sizes: any, and often big enough to span blocks.
SIZES = st.integers(1, 300) | st.integers(150, 300)
LEAF_KINDS = ["int", "long", "double", "bool", "string", "ts", "date", "decimal", "bytes"]


@st.composite
def shapes(draw: st.DrawFn, depth: int = 0, element: bool = False) -> Shape:
    """A column shape; structs may have no fields, except as list elements (pyiceberg cannot
    make a ListType of an empty struct: connect_arrow_schema raises KeyError 'element_type')."""
    kinds = LEAF_KINDS + (["struct", "struct", "array"] if depth < 2 else [])
    kind = draw(st.sampled_from(kinds))
    children: tuple[tuple[str, Shape], ...] = ()
    if kind == "struct":
        children = tuple((f"f{i}", draw(shapes(depth + 1))) for i in range(draw(st.integers(int(element), 3 - depth))))
    elif kind == "array":
        children = (("element", draw(shapes(depth + 1, element=True))),)
    return Shape(
        kind, optional=draw(st.integers(0, 9)) > 0,
        nulls=draw(st.sampled_from(["some", "all", "first", "first", "first", "none"])),
        absent=draw(st.booleans()), k=draw(FIRST), children=children,
    )


@st.composite
def rows(draw: st.DrawFn) -> Shape:
    """The fields of a record (a struct that is never null)."""
    fields = tuple((f"c{i}", draw(shapes())) for i in range(draw(st.integers(1, 4))))
    return Shape("struct", optional=False, nulls="none", children=fields)


def is_null(s: Shape, row: int, rnd: random.Random) -> bool:
    return {"none": False, "all": True, "first": row < s.k, "some": rnd.random() < 0.1}[s.nulls]


def value(s: Shape, row: int, rnd: random.Random, connect: bool, bad: float) -> Any:
    """A JSON value of shape ``s`` for record ``row`` (never null: see ``fill``)."""
    if bad and rnd.random() < bad:
        return rnd.choice(["x", Raw("1.5"), True, [1], {"a": 1}, Raw("1e400"), -1])
    k = s.kind
    if k == "struct":
        return fill(s, row, rnd, connect, bad)
    if k == "array":
        element = s.children[0][1]
        return [None if is_null(element, row, rnd) else value(element, row, rnd, connect, bad)
                for _ in range(rnd.randint(0, 3))]
    if k in ("int", "long"):
        bits = 31 if k == "int" else 63
        return rnd.choice([rnd.randint(-(2**bits), 2**bits - 1), rnd.randint(-5, 5), Raw("-0")])
    if k == "double":
        return rnd.choice([rnd.uniform(-1e6, 1e6), float(rnd.randint(-3, 3)), -0.0, 1e300, Raw("1E+2"), 7])
    if k == "bool":
        return rnd.random() < 0.5
    if k == "string":
        return rnd.choice(["", "Oslo", "ünïcødé", 'q"uote', "line\nbreak", str(rnd.random()), "[null,\"1\"]"])
    if k == "ts":
        ms = rnd.randint(-(10**12), 4 * 10**12)
        return ms if connect or rnd.random() < 0.5 else "2026-11-23T21:53:0%d.%03dZ" % (rnd.randint(0, 9), ms % 1000)
    if k == "date":
        return rnd.randint(-1000, 50_000)
    unscaled = rnd.randint(-(10**10) + 1, 10**10 - 1)
    if k == "decimal" and not connect:
        return Raw(str(Decimal(unscaled).scaleb(-2)))
    if k == "decimal":
        n = (unscaled + (unscaled < 0)).bit_length() // 8 + 1
        return base64.b64encode(unscaled.to_bytes(n, "big", signed=True)).decode()
    return base64.b64encode(rnd.randbytes(rnd.randint(0, 6))).decode()  # bytes


def fill(s: Shape, row: int, rnd: random.Random, connect: bool, bad: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, child in s.children:
        if is_null(child, row, rnd):
            if not child.absent:
                out[name] = None
        else:
            out[name] = value(child, row, rnd, connect, bad)
    return out


def broken(values: list[bytes], rnd: random.Random) -> list[bytes]:
    """A few records that are not JSON objects, as a topic may carry."""
    return [rnd.choice([b"{not json", b"", b"[1,2]", b"null", v[: len(v) // 2]]) if rnd.random() < 0.02 else v
            for v in values]


# --------------------------------------------------------------------------------------------
# Plain JSON and Connect envelopes
# --------------------------------------------------------------------------------------------


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows(), SIZES, st.randoms(use_true_random=False), st.sampled_from([0.0, 0.0, 0.02]), BLOCKS)
def test_plain_json_in_bulk_is_the_reference(row: Shape, n: int, rnd: random.Random, bad: float, block: int) -> None:
    values = broken([dump(fill(row, i, rnd, False, bad)).encode() for i in range(n)], rnd)
    target = connect_arrow_schema(row.connect())
    assert target is not None
    check_converted(lambda: decode_json(values, target), values, block)
    check_converted(lambda: decode_json(values), values, block)  # the schema inferred


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows(), rows(), SIZES, st.randoms(use_true_random=False), st.sampled_from([0.0, 0.02]), BLOCKS)
def test_connect_envelopes_in_bulk_are_the_reference(
    row: Shape, other: Shape, n: int, rnd: random.Random, bad: float, block: int,
) -> None:
    """Records of one schema, some of a second (two groups), against the first one's table."""
    schemas = [json.dumps(row.connect()), json.dumps(other.connect())]
    values = []
    for i in range(n):
        which = 1 if rnd.random() < 0.2 else 0
        payload = dump(fill((row, other)[which], i, rnd, True, bad))
        values.append(f'{{"schema":{schemas[which]},"payload":{payload}}}'.encode())
    values = broken(values, rnd)
    target = connect_arrow_schema(row.connect())
    assert target is not None
    check_converted(lambda: decode_envelopes(*Envelopes().group(values), target), values, block)


# --------------------------------------------------------------------------------------------
# Debezium change events
# --------------------------------------------------------------------------------------------


SOURCE_SCHEMA = {"type": "struct", "optional": False, "field": "source", "fields": [
    {"type": "string", "optional": False, "field": "version"},
    {"type": "string", "optional": False, "field": "connector"},
    {"type": "string", "optional": False, "field": "name"},
    {"type": "int64", "optional": False, "field": "ts_ms"},
    {"type": "string", "optional": True, "field": "snapshot"},
    {"type": "string", "optional": False, "field": "db"},
    {"type": "string", "optional": True, "field": "sequence"},
    {"type": "int64", "optional": True, "field": "ts_us"},
    {"type": "int64", "optional": True, "field": "ts_ns"},
    {"type": "string", "optional": False, "field": "schema"},
    {"type": "string", "optional": False, "field": "table"},
    {"type": "int64", "optional": True, "field": "txId"},
    {"type": "int64", "optional": True, "field": "lsn"},
    {"type": "int64", "optional": True, "field": "xmin"},
]}


def change_event(row: Shape, i: int, rnd: random.Random, connect: bool, bad: float, inserts: int) -> dict[str, Any]:
    """A change event as Debezium 3.6 writes it for PostgreSQL; the first ``inserts`` are
    inserts (``before`` null), as a snapshot or a bulk load starts a topic."""
    op = "c" if i < inserts else rnd.choice("ccccrud")
    image = fill(row, i, rnd, connect, bad)
    before = image if op == "d" or (op == "u" and rnd.random() < 0.5) else None
    ts_ms = 1795000000000 + i
    return {
        "before": before, "after": None if op == "d" else image,
        "source": {"version": "3.6.3.Final", "connector": "postgresql", "name": "dbz", "ts_ms": ts_ms,
                   "snapshot": "true" if op == "r" else "false", "db": "shop",
                   "sequence": f'[null,"{1000 + i}"]', "ts_us": rnd.choice([ts_ms * 1000, None]), "ts_ns": None,
                   "schema": rnd.choice(["public", "inventory"]), "table": rnd.choice(["customers", "Orders"]),
                   "txId": 700 + i, "lsn": 1000 + i, "xmin": None},
        "transaction": rnd.choice([None, {"id": f"700:{i}", "total_order": 1, "data_collection_order": 1}]),
        "op": op, "ts_ms": ts_ms, "ts_us": ts_ms * 1000, "ts_ns": ts_ms * 1_000_000,
    }


def envelope_schema(row: Shape) -> str:
    image = row.connect()
    return json.dumps({"type": "struct", "optional": False, "name": "dbz.public.customers.Envelope", "fields": [
        {**image, "optional": True, "field": "before"}, {**image, "optional": True, "field": "after"},
        SOURCE_SCHEMA,
        {"type": "struct", "optional": True, "field": "transaction", "fields": [
            {"type": "string", "optional": False, "field": "id"},
            {"type": "int64", "optional": False, "field": "total_order"},
            {"type": "int64", "optional": False, "field": "data_collection_order"}]},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        {"type": "int64", "optional": True, "field": "ts_us"},
        {"type": "int64", "optional": True, "field": "ts_ns"},
    ]})


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows(), st.booleans(), SIZES, st.randoms(use_true_random=False), st.sampled_from([0.0, 0.0, 0.02]),
       BLOCKS, FIRST)
def test_debezium_events_in_bulk_are_the_reference(
    row: Shape, schemas: bool, n: int, rnd: random.Random, bad: float, block: int, inserts: int,
) -> None:
    envelope = envelope_schema(row)
    values = []
    for i in range(n):
        event = dump(change_event(row, i, rnd, schemas, bad, inserts))
        values.append((f'{{"schema":{envelope},"payload":{event}}}' if schemas else event).encode())
    values = broken(values, rnd)
    transform = DebeziumTransform("mirror.{db}_{table}", schemas)
    check_same(lambda: transform.infer_schema(values), block)
    schema = transform.infer_schema(values)
    offsets = list(range(5000, 5000 + n))
    check_converted(lambda: transform.apply(values, offsets, schema), values, block)
    for field in ("_cdc.target", "_cdc.source", "_cdc.op", row.children[0][0]):
        check_converted(lambda field=field: transform.route_column(values, field), values, block)
