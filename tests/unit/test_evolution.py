"""Schema evolution: the schema union (every change kind), decoding without loss, casting to the
evolved table, the coordinator's one update per table per round, and auto-create settings.
Real pyiceberg SQLite catalogs in a temp dir; no services."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType, FloatType, IntegerType, ListType, LongType, NestedField, StringType, StructType,
)

from agents.evolution import Evolver, conform
from agents.tables import create_target, target_of
from coordinator.evolution import apply_proposals, merge_proposals
from coordinator.state import CoordinatorState
from icesink.shared.config import build
from icesink.shared.errors import ConfigError
from icesink.shared.protocol import SchemaProposal, decode, encode
from icesink.shared.schema_changes import (
    AddField, MakeOptional, Widen, apply_changes, changes, from_proposal, holds, identifier_paths, to_proposal,
)
from icesink.shared.metrics import Metrics


def js(*records: dict) -> list[bytes]:
    return [json.dumps(r).encode() for r in records]


@pytest.fixture
def catalog(tmp_path):
    from icesink.shared.catalogs import sqlite_catalog_properties

    cat = load_catalog("t", **sqlite_catalog_properties(tmp_path / "catalog"))
    cat.create_namespace("db")
    return cat


def narrow_table(catalog, name="db.t"):
    return catalog.create_table(name, Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "n", IntegerType(), required=False),
        NestedField(3, "s", StructType(NestedField(4, "a", StringType(), required=False)), required=False),
        NestedField(5, "f", FloatType(), required=False),
        NestedField(6, "d", DecimalType(5, 2), required=False),
        NestedField(7, "r", StringType(), required=True),
        NestedField(8, "items", ListType(9, StructType(NestedField(10, "q", LongType(), required=False)),
                                        element_required=False), required=False),
        identifier_field_ids=[1],
    ))


# The union ------------------------------------------------------------------------------------

BASE = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("n", pa.int32()),
    pa.field("s", pa.struct([pa.field("a", pa.large_string())])),
    pa.field("f", pa.float32()),
    pa.field("d", pa.decimal128(5, 2)),
    pa.field("r", pa.large_string(), nullable=False),
    pa.field("items", pa.large_list(pa.field("element", pa.struct([pa.field("q", pa.int64())])))),
])


def test_changes_finds_every_kind_and_ignores_conflicts():
    want = pa.schema([
        pa.field("id", pa.string(), nullable=False),  # conflict: no evolution (decode coerces or rejects)
        pa.field("n", pa.int64()),  # widen int -> long
        pa.field("s", pa.struct([pa.field("a", pa.string()), pa.field("b", pa.bool_())])),  # nested add
        pa.field("f", pa.float64()),  # widen float -> double
        pa.field("d", pa.decimal128(9, 2)),  # precision up, same scale
        pa.field("r", pa.string(), nullable=True),  # required -> optional
        pa.field("items", pa.list_(pa.struct([pa.field("q", pa.int64()), pa.field("w", pa.float64())]))),
        pa.field("new", pa.struct([pa.field("x", pa.int64(), nullable=False)])),  # top-level add, made optional
        pa.field("empty", pa.struct([])),  # nothing to hold: not added
    ])
    assert changes(BASE, want) == [
        Widen(("n",), pa.int64()),
        AddField(("s", "b"), pa.bool_()),
        Widen(("f",), pa.float64()),
        Widen(("d",), pa.decimal128(9, 2)),
        MakeOptional(("r",)),
        AddField(("items", "element", "w"), pa.float64()),
        AddField(("new",), pa.struct([pa.field("x", pa.int64())])),
    ]


def test_narrower_or_other_scale_types_are_no_change_and_identifier_fields_stay_required():
    want = pa.schema([pa.field("id", pa.int64(), nullable=True), pa.field("d", pa.decimal128(9, 3)),
                      pa.field("n", pa.int8())])
    assert changes(BASE, want, keep_required=frozenset({("id",)})) == []
    assert changes(BASE, want) == [MakeOptional(("id",))]


def test_case_insensitive_matching_adds_no_second_spelling():
    want = pa.schema([pa.field("ID", pa.int64()), pa.field("S", pa.struct([pa.field("A", pa.string())])),
                      pa.field("N", pa.int64())])
    assert changes(BASE, want, case_insensitive=True, keep_required=frozenset({("id",)})) == [Widen(("n",), pa.int64())]
    assert AddField(("ID",), pa.int64()) in changes(BASE, want)


def test_applied_changes_hold_what_was_wanted_and_keep_field_ids():
    base = schema_to_pyarrow(Schema(NestedField(1, "n", IntegerType()), NestedField(2, "s", StructType(
        NestedField(3, "a", StringType())))))
    want = pa.schema([pa.field("n", pa.int64()), pa.field("s", pa.struct([pa.field("b", pa.int64())])),
                      pa.field("z", pa.string())])
    evolved = apply_changes(base, changes(base, want))
    assert holds(evolved, want) and not holds(base, want)
    assert evolved.names == ["n", "s", "z"]
    assert evolved.field("n").metadata == {b"PARQUET:field_id": b"1"}
    assert [f.name for f in evolved.field("s").type] == ["a", "b"]


def test_conform_orders_fills_widens_and_matches_case():
    data = pa.table({
        "Z": pa.array(["z1", None]),
        "n": pa.array([1, 2], pa.int32()),
        "s": pa.array([{"b": 7}, None], pa.struct([pa.field("b", pa.int64())])),
    })
    target = pa.schema([pa.field("n", pa.int64()), pa.field("s", pa.struct([pa.field("a", pa.large_string()),
                                                                             pa.field("b", pa.int64())])),
                        pa.field("z", pa.large_string()), pa.field("gone", pa.float64())])
    out = conform(data, target, case_insensitive=True)
    assert out.schema.equals(target)
    assert out.to_pylist() == [
        {"n": 1, "s": {"a": None, "b": 7}, "z": "z1", "gone": None},
        {"n": 2, "s": None, "z": None, "gone": None},
    ]
    assert conform(data, target).column("z").null_count == 2  # case-sensitive: Z is not z


# The worker's decoding -----------------------------------------------------------------------


def test_decode_keeps_new_values_and_proposes_once(catalog):
    t = narrow_table(catalog)
    target = target_of("db.t", t)
    ev = Evolver("w1", evolve=True, case_insensitive=False)
    keep = identifier_paths(t)
    first = ev.decode("db.t", target.arrow_schema, js({"id": 1, "r": "a", "new": "x", "s": {"a": "p", "b": 2}}), keep)
    assert first.converted.rejects == () and first.proposal is not None
    assert first.converted.table.to_pylist()[0]["new"] == "x"
    assert first.converted.table.to_pylist()[0]["s"] == {"a": "p", "b": 2}
    again = ev.decode("db.t", target.arrow_schema, js({"id": 2, "r": "b", "new": "y"}), keep)
    assert again.proposal is None  # nothing beyond what was proposed
    assert again.converted.table.column("new").to_pylist() == ["y"]
    wider = ev.decode("db.t", target.arrow_schema, js({"id": 3, "r": "c", "n": 2**40}), keep)
    assert wider.proposal is not None and from_proposal(wider.proposal).field("n").type == pa.int64()
    assert wider.converted.table.column("n").to_pylist() == [2**40]


def test_decode_widens_relaxes_and_still_rejects_what_is_no_evolution(catalog):
    t = narrow_table(catalog)
    target = target_of("db.t", t)
    ev = Evolver("w1", evolve=True, case_insensitive=False)
    out = ev.decode("db.t", target.arrow_schema, js(
        {"id": 1, "r": "a", "n": 5, "f": 1.5, "d": 1.25},  # fits the table as it is
        {"id": 2, "r": None, "f": 1e300, "d": 123456.78},  # null in required r; float and decimal overflow
        {"id": None, "r": "c"},  # identifier field null: rejected as without evolution
        {"id": 4, "r": "d", "n": "text"},  # a string in an int column: rejected, no evolution
    ), identifier_paths(t))
    assert [r.index for r in out.converted.rejects] == [2, 3]
    s = out.converted.table.schema
    assert s.field("f").type == pa.float64() and s.field("d").type == pa.decimal128(8, 2)
    assert s.field("r").nullable and not s.field("id").nullable and s.field("n").type == pa.int32()
    rows = out.converted.table.to_pylist()
    assert rows[1]["f"] == 1e300 and rows[1]["d"] == Decimal("123456.78") and rows[1]["r"] is None


def test_all_null_new_fields_are_not_added_and_narrow_values_keep_the_type(catalog):
    t = narrow_table(catalog)
    target = target_of("db.t", t)
    ev = Evolver("w1", evolve=True, case_insensitive=False)
    out = ev.decode("db.t", target.arrow_schema, js({"id": 1, "r": "a", "maybe": None, "n": 7}), identifier_paths(t))
    assert out.proposal is None and out.converted.table.schema.equals(target.arrow_schema)


def test_case_insensitive_folds_spellings_into_the_column(catalog):
    t = narrow_table(catalog)
    target = target_of("db.t", t)
    ev = Evolver("w1", evolve=False, case_insensitive=True)
    out = ev.decode("db.t", target.arrow_schema, js({"ID": 1, "R": "a"}, {"id": 2, "r": "b", "N": 3}), identifier_paths(t))
    assert out.converted.rejects == ()
    assert [(r["id"], r["r"], r["n"]) for r in out.converted.table.to_pylist()] == [(1, "a", None), (2, "b", 3)]
    assert out.converted.table.schema.equals(target.arrow_schema)  # written as it is, no reload
    missing = ev.decode("db.t", target.arrow_schema, js({"Id": 5, "r": "x"}, {"R": "y"}), identifier_paths(t))
    assert [(r.index, r.field) for r in missing.converted.rejects] == [(1, "id")]
    assert missing.converted.indices.to_pylist() == [0]


def test_case_insensitive_folds_nested_spellings_and_adds_one_column(catalog):
    """Nested fields and list elements are matched ignoring case too; a new field spelt two
    ways is added once, under its first spelling, and holds the values of both."""
    t = narrow_table(catalog)
    target = target_of("db.t", t)
    ev = Evolver("w1", evolve=True, case_insensitive=True)
    out = ev.decode("db.t", target.arrow_schema, js(
        {"Id": 1, "r": "a", "S": {"A": "x", "Extra": 1}, "ITEMS": [{"Q": 5}]},
        {"id": 2, "R": "b", "s": {"a": "y", "EXTRA": 2}, "items": [{"q": 6}, {"Q": 7}]},
    ), identifier_paths(t))
    assert out.converted.rejects == ()
    rows = out.converted.table.to_pylist()
    assert [(r["id"], r["r"], r["s"], r["items"]) for r in rows] == [
        (1, "a", {"a": "x", "Extra": 1}, [{"q": 5}]), (2, "b", {"a": "y", "Extra": 2}, [{"q": 6}, {"q": 7}]),
    ]
    proposed = from_proposal(out.proposal)
    assert proposed.field("s").type.names == ["a", "Extra"] and proposed.names == target.arrow_schema.names
    apply_proposals(catalog, "db.t", [out.proposal], case_insensitive=True, group="g", epoch=1)
    evolved = target_of("db.t", catalog.load_table("db.t"))
    assert conform(out.converted.table, evolved.arrow_schema, case_insensitive=True).column("s").to_pylist() == [
        {"a": "x", "Extra": 1}, {"a": "y", "Extra": 2},
    ]


def test_case_insensitive_envelopes_take_encodings_of_fields_spelt_otherwise(catalog):
    """Connect fields fill columns ignoring case at every level, with the encodings their
    schema states (a Decimal's bytes, a Timestamp's epoch millis), and add no second spelling."""
    from agents.formats import RecordFormat

    t = _envelope_table(catalog)
    target = target_of("db.env", t)
    fmt = RecordFormat(build({"topics": "orders", "iceberg.tables": "db.env", "value.converter.schemas.enable": "true",
                              "iceberg.tables.schema-case-insensitive": "true"}))
    shouting = [dict(f, field=f["field"].upper()) for f in NEW_FIELDS]
    shouting[2] = dict(shouting[2], fields=[dict(c, field=c["field"].upper()) for c in NEW_FIELDS[2]["fields"]])
    values = [
        _envelope(shouting, {"ID": 1, "N": 2**40, "S": {"A": "x", "B": "MDk="}, "COLOR": "red", "AT": 1_700_000_000_123}),
        _envelope(OLD_FIELDS, {"id": 2, "n": 5, "s": {"a": "y"}}),
    ]
    ev = Evolver("w1", evolve=True, case_insensitive=True)
    growth = ev.growth("db.env", target.arrow_schema, identifier_paths(t), frozenset(fmt.extras.names()))
    out = growth.done(fmt.convert([_msg(v, i) for i, v in enumerate(values)], values, growth.schema, grow=growth))
    assert out.converted.rejects == ()
    rows = out.converted.table.to_pylist()
    assert [(r["id"], r["n"], r["s"], r["COLOR"]) for r in rows] == [
        (1, 2**40, {"a": "x", "B": Decimal("123.45")}, "red"), (2, 5, {"a": "y", "B": None}, None),
    ]
    assert rows[0]["AT"].timestamp() == 1_700_000_000.123
    proposed = from_proposal(out.proposal)
    assert proposed.names == ["id", "n", "s", "_key", "_kafka_metadata_offset", "COLOR", "AT"]
    assert proposed.field("n").type == pa.int64() and proposed.field("s").type.names == ["a", "B"]

    # Applied; records spelt in lower case now fill B (base64 Decimal bytes) and AT by the encodings
    # of their own Connect fields.
    apply_proposals(catalog, "db.env", [out.proposal], case_insensitive=True, group="g", epoch=0)
    evolved = target_of("db.env", catalog.load_table("db.env"))
    ev.refreshed("db.env", evolved.arrow_schema)
    lower = [_envelope(NEW_FIELDS, {"id": 3, "n": 1, "s": {"a": "z", "b": "MDk="}, "color": "blue", "at": 1_700_000_000_456})]
    again = ev.growth("db.env", evolved.arrow_schema, identifier_paths(t), frozenset())
    more = again.done(fmt.convert([_msg(lower[0], 5)], lower, again.schema, grow=again))
    assert more.proposal is None and more.converted.rejects == ()
    row = more.converted.table.to_pylist()[0]
    assert (row["s"]["B"], row["AT"].timestamp(), row["COLOR"]) == (Decimal("123.45"), 1_700_000_000.456, "blue")


def test_proposal_round_trips_through_the_control_event():
    schema = pa.schema([pa.field("a", pa.int64()), pa.field("s", pa.struct([pa.field("b", pa.string())]))])
    ev = to_proposal("w1", "db.t", schema)
    back = decode(encode(ev))
    assert isinstance(back, SchemaProposal) and back == ev
    assert holds(from_proposal(back), schema) and holds(schema, from_proposal(back))


# The coordinator: one schema update per table per round ----------------------------------------


def test_several_proposals_make_one_schema_update(catalog):
    t = narrow_table(catalog)
    base = schema_to_pyarrow(t.schema())
    p1 = to_proposal("w1", "db.t", apply_changes(base, [AddField(("x",), pa.string()), Widen(("n",), pa.int64())]))
    p2 = to_proposal("w2", "db.t", apply_changes(base, [AddField(("x",), pa.int64()), AddField(("s", "b"), pa.int64()),
                                                        MakeOptional(("r",))]))
    schemas_before = len(t.metadata.schemas)
    done = apply_proposals(catalog, "db.t", [p1, p2], case_insensitive=False, group="g", epoch=1)
    t = catalog.load_table("db.t")
    assert len(t.metadata.schemas) == schemas_before + 1 and t.current_snapshot() is None  # no data commit
    s = t.schema()
    assert s.find_field("x").field_type == StringType()  # the first proposal decided x's type
    assert s.find_field("n").field_type == LongType() and s.find_field("s.b").field_type == LongType()
    assert not s.find_field("r").required and s.find_field("id").required
    assert len(done) == 4
    # Applied again (a re-sent proposal): nothing left to do, no new schema.
    assert apply_proposals(catalog, "db.t", [p2, p1], case_insensitive=False, group="g", epoch=1) == []
    assert len(catalog.load_table("db.t").metadata.schemas) == schemas_before + 1


def test_merge_ignores_stale_proposals_and_list_elements_grow(catalog):
    t = narrow_table(catalog)
    base = schema_to_pyarrow(t.schema())
    widened = apply_changes(base, [Widen(("n",), pa.int64())])
    stale = to_proposal("w2", "db.t", base)  # made before the widening: asks nothing narrower
    grow = to_proposal("w1", "db.t", apply_changes(widened, [AddField(("items", "element", "w"), pa.float64())]))
    todo = merge_proposals(widened, [stale, grow], case_insensitive=False, keep_required=frozenset())
    assert todo == [AddField(("items", "element", "w"), pa.float64())]
    apply_proposals(catalog, "db.t", [grow], case_insensitive=False, group="g", epoch=1)
    assert catalog.load_table("db.t").schema().find_field("items.element.w").field_type.__class__.__name__ == "DoubleType"


def test_state_keeps_the_newest_proposal_per_worker_and_returns_failed_ones():
    st = CoordinatorState()
    a1, a2, b1 = SchemaProposal("w1", "db.t", "1"), SchemaProposal("w1", "db.t", "2"), SchemaProposal("w2", "db.t", "3")
    for i, ev in enumerate([a1, b1, a2]):
        st.apply(i, ev)
    assert st.take_proposals() == {"db.t": [a2, b1]}
    assert st.take_proposals() == {}
    st.apply(5, SchemaProposal("w2", "db.t", "4"))
    st.return_proposals("db.t", [a2, b1])
    assert st.take_proposals() == {"db.t": [a2, SchemaProposal("w2", "db.t", "4")]}  # log order


def test_coordinator_applies_before_start_commit_once_per_table():
    from coordinator import service

    calls = []

    def fake_apply(catalog, table, proposals, **kw):
        calls.append((table, [p.worker for p in proposals]))
        if table == "db.bad":
            raise RuntimeError("catalog down")
        return [AddField(("x",), pa.string())]

    class Offload:
        async def run(self, fn, *a, **kw):
            return fn(*a, **kw)

    sent = []

    class Producer:
        keyring = None  # unsigned

        async def send(self, ev):
            sent.append(ev)

    async def make():  # aiokafka builds its (unused) control consumer on a loop
        settings = build({"topics": "src", "iceberg.tables": "db.t", "bootstrap.servers": "127.0.0.1:1",
                          "group.id": "g"})
        return service.Coordinator(settings, "127.0.0.1:1", Producer(), None, Offload(), Metrics())

    c = asyncio.run(make())
    c.session.epoch = 3
    for i, ev in enumerate([SchemaProposal("w1", "db.t", "{}"), SchemaProposal("w2", "db.t", "{}"),
                            SchemaProposal("w1", "db.bad", "{}")]):
        c.session.state.apply(i, ev)
    orig, orig_sleep = service.apply_proposals, service.asyncio.sleep
    service.apply_proposals = fake_apply

    async def no_sleep(_):
        return None

    service.asyncio.sleep = no_sleep
    try:
        asyncio.run(c._maybe_start_round())
    finally:
        service.apply_proposals, service.asyncio.sleep = orig, orig_sleep
    assert calls == [("db.t", ["w1", "w2"])] + [("db.bad", ["w1"])] * service.SCHEMA_ATTEMPTS
    assert type(sent[-1]).__name__ == "StartCommit" and len(sent) == 1
    assert c.metrics.schema_changes.labels(table="db.t")._value.get() == 1
    assert c.metrics.schema_change_failures.labels(table="db.bad")._value.get() == service.SCHEMA_ATTEMPTS
    assert list(c.session.state.take_proposals()) == ["db.bad"]  # waits for the next round


# Settings and auto-create --------------------------------------------------------------------------


def settings(**extra):
    return build({"topics": "t", "iceberg.tables": "db.a,db.b", "iceberg.tables.auto-create-enabled": "true", **extra})


def test_evolution_and_auto_create_settings_parse():
    s = settings(**{
        "iceberg.tables.evolve-schema-enabled": "true", "iceberg.tables.schema-force-optional": "true",
        "iceberg.tables.schema-case-insensitive": "true", "iceberg.tables.auto-create-props.format-version": "1",
        "iceberg.tables.default-id-columns": "id", "iceberg.table.db.b.id-columns": "k1, k2",
    })
    assert s.evolve_schema and s.schema_force_optional and s.schema_case_insensitive
    assert s.auto_create_props == {"format-version": "1"}
    assert s.id_columns("db.a") == ("id",) and s.id_columns("db.b") == ("k1", "k2")
    with pytest.raises(ConfigError, match="iceberg.table.db.zz.id-columns"):
        settings(**{"iceberg.table.db.zz.id-columns": "id"})
    with pytest.raises(ConfigError, match="auto-create-props.format-version.*1 or 2"):
        settings(**{"iceberg.tables.auto-create-props.format-version": "3"})  # pyiceberg 0.12 cannot commit v3


def test_auto_create_sets_props_and_required_identifier_fields(catalog):
    s = settings(**{"iceberg.tables.auto-create-props.format-version": "1", "iceberg.tables.default-id-columns": "id,meta.k",
                    "iceberg.tables.schema-force-optional": "true"})
    inferred = pa.schema([("id", pa.int64()), ("meta", pa.struct([("k", pa.string()), ("v", pa.int64())])), ("x", pa.float64())])
    t = create_target(catalog, s, "db.a", inferred).table
    assert t.metadata.format_version == 1
    schema = t.schema()
    assert [schema.find_column_name(i) for i in schema.identifier_field_ids] == ["id", "meta.k"]
    assert schema.find_field("id").required and schema.find_field("meta").required and schema.find_field("meta.k").required
    assert not schema.find_field("x").required and not schema.find_field("meta.v").required


@pytest.mark.parametrize("columns, message", [("nope", "'nope' is not among them"), ("x", "non-floating")])
def test_bad_id_columns_name_the_key(catalog, columns, message):
    s = settings(**{"iceberg.table.db.a.id-columns": columns})
    with pytest.raises(ConfigError, match=message) as err:
        create_target(catalog, s, "db.a", pa.schema([("id", pa.int64()), ("x", pa.float64())]))
    assert err.value.key == "iceberg.table.db.a.id-columns"


# Schema-driven evolution: the Kafka Connect envelope --------------------------------------------


def _envelope(fields: list[dict], payload: dict) -> bytes:
    schema = {"type": "struct", "fields": fields, "optional": False}
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode()


def _msg(value: bytes, i: int) -> SimpleNamespace:
    return SimpleNamespace(value=value, key=f"k{i}".encode(), offset=100 + i, partition=2, topic="orders",
                           timestamp=1_700_000_000_000 + 1000 * i, headers=())


OLD_FIELDS = [
    {"field": "id", "type": "int64", "optional": False},
    {"field": "n", "type": "int32", "optional": True},
    {"field": "s", "type": "struct", "optional": True, "fields": [{"field": "a", "type": "string", "optional": True}]},
]
NEW_FIELDS = [
    {"field": "id", "type": "int64", "optional": False},
    {"field": "n", "type": "int64", "optional": True},  # int32 -> int64
    {"field": "s", "type": "struct", "optional": True, "fields": [
        {"field": "a", "type": "string", "optional": True},
        {"field": "b", "type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
         "parameters": {"scale": "2", "connect.decimal.precision": "6"}},  # nested, with its encoding
    ]},
    {"field": "color", "type": "string", "optional": True},  # a new top-level field
    {"field": "at", "type": "int64", "optional": True, "name": "org.apache.kafka.connect.data.Timestamp"},
]


def _envelope_table(catalog):
    return catalog.create_table("db.env", Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "n", IntegerType(), required=False),
        NestedField(3, "s", StructType(NestedField(4, "a", StringType(), required=False)), required=False),
        NestedField(5, "_key", StringType(), required=False),
        NestedField(6, "_kafka_metadata_offset", LongType(), required=False),
    ))


def _envelope_batch() -> list[bytes]:
    return [
        _envelope(OLD_FIELDS, {"id": 1, "n": 5, "s": {"a": "x"}}),
        _envelope(NEW_FIELDS, {"id": 2, "n": 2**40, "s": {"a": "y", "b": "MDk="}, "color": "red",
                               "at": 1_700_000_000_123}),  # b: unscaled 12345 -> 123.45
        _envelope(OLD_FIELDS, {"id": 3, "n": 7, "s": None}),
        _envelope(NEW_FIELDS, {"id": 4, "n": None, "s": {"a": "z", "b": None}, "color": None, "at": None}),
    ]


def test_envelope_records_evolve_by_their_connect_schemas_and_keep_key_and_metadata(catalog):
    from agents.formats import RecordFormat

    t = _envelope_table(catalog)
    target = target_of("db.env", t)
    fmt = RecordFormat(build({"topics": "orders", "iceberg.tables": "db.env", "value.converter.schemas.enable": "true",
                              "iceberg.tables.key-column": "_key", "iceberg.tables.kafka-metadata-enabled": "true"}))
    ev = Evolver("w1", evolve=True, case_insensitive=False)
    values = _envelope_batch()
    msgs = [_msg(v, i) for i, v in enumerate(values)]
    growth = ev.growth("db.env", target.arrow_schema, identifier_paths(t), frozenset(fmt.extras.names()))
    out = growth.done(fmt.convert(msgs, values, growth.schema, grow=growth))
    assert out.converted.rejects == ()
    rows = out.converted.table.to_pylist()
    assert [(r["id"], r["n"], r["color"], r["s"]) for r in rows] == [
        (1, 5, None, {"a": "x", "b": None}), (2, 2**40, "red", {"a": "y", "b": Decimal("123.45")}),
        (3, 7, None, None), (4, None, None, {"a": "z", "b": None}),
    ]
    assert rows[1]["at"].timestamp() == 1_700_000_000.123  # epoch ms, the Connect Timestamp's encoding
    assert [(r["_key"], r["_kafka_metadata_offset"]) for r in rows] == [("k0", 100), ("k1", 101), ("k2", 102), ("k3", 103)]
    proposed = from_proposal(out.proposal)
    assert proposed.field("n").type == pa.int64() and proposed.field("color").type == pa.large_string()
    assert proposed.field("s").type.field("b").type == pa.decimal128(6, 2)
    assert proposed.field("at").type == pa.timestamp("us", tz="UTC")
    assert proposed.names == ["id", "n", "s", "_key", "_kafka_metadata_offset", "color", "at"]
    assert not proposed.field("id").nullable  # identifier field and stated required: stays required

    # The next batch needs nothing more: no second proposal, decoded against S' at once.
    again = ev.growth("db.env", target.arrow_schema, identifier_paths(t), frozenset(fmt.extras.names()))
    more = again.done(fmt.convert([_msg(values[1], 9)], values[1:2], again.schema, grow=again))
    assert more.proposal is None and more.converted.table.schema.equals(out.converted.table.schema)

    # The coordinator applies the proposal; the buffered rows then conform to the table.
    apply_proposals(catalog, "db.env", [out.proposal], case_insensitive=False, group="g", epoch=0)
    evolved = target_of("db.env", catalog.load_table("db.env"))
    assert holds(evolved.arrow_schema, out.converted.table.schema)
    written = conform(out.converted.table, evolved.arrow_schema)
    assert written.column("color").to_pylist() == [None, "red", None, None]
    ev.refreshed("db.env", evolved.arrow_schema)
    assert "db.env" not in ev.schemas


def test_envelope_without_evolution_drops_fields_the_table_lacks(catalog):
    """The reference behaviour with evolution off: the table decides, new fields are not kept."""
    from agents.formats import RecordFormat

    t = _envelope_table(catalog)
    target = target_of("db.env", t)
    fmt = RecordFormat(build({"topics": "orders", "iceberg.tables": "db.env", "value.converter.schemas.enable": "true"}))
    values = _envelope_batch()
    off = Evolver("w1", evolve=False, case_insensitive=True)  # case-insensitive only: no growth
    growth = off.growth("db.env", target.arrow_schema)
    out = growth.done(fmt.convert([_msg(v, i) for i, v in enumerate(values)], values, growth.schema, grow=growth))
    assert out.proposal is None and out.converted.table.schema.equals(target.arrow_schema)
    assert [r.index for r in out.converted.rejects] == [1]  # 2**40 does not fit the int column
    assert out.converted.table.column("id").to_pylist() == [1, 3, 4]
