"""The Debezium transform on real change events (tests/unit/fixtures/debezium/, captured from
PostgreSQL 15 by Debezium 3.6's embedded engine with tests/support/debezium_capture.py).

Each fixture holds the same six events, as the JsonConverter wrote them without (plain.jsonl)
and with (schema.jsonl) schemas: two snapshot reads (ids 1 and 2), an insert (3), an update (1),
a delete (2; the table has REPLICA IDENTITY FULL, so ``before`` is the whole row) and the
tombstone after the delete.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from agents.convert import limits
from agents.debezium import CDC_TYPE, DebeziumTransform
from icesink.shared.config import build
from icesink.shared.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
OFFSETS = [100, 101, 102, 103, 104, 105]


def events(form: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / f"{form}.jsonl").read_text().splitlines()]


def values(form: str) -> list[bytes]:
    return [e["value"].encode() if e["value"] is not None else b"" for e in events(form)]


def payloads(form: str) -> list[dict[str, Any] | None]:
    out = []
    for e in events(form):
        v = json.loads(e["value"]) if e["value"] else None
        out.append(v["payload"] if v is not None and form == "schema" else v)
    return out


def utc_micros(us: int) -> datetime:
    return datetime.fromtimestamp(us // 1_000_000, tz=UTC).replace(microsecond=us % 1_000_000)


def check_cdc(rows: list[dict[str, Any]], indices: list[int], form: str, target: str = "public.orders") -> None:
    """Every _cdc value against the event it came from."""
    raw = payloads(form)
    for row, i in zip(rows, indices):
        p = raw[i]
        assert p is not None
        src = p["source"]
        assert row["_cdc"] == {
            "op": {"r": "I", "c": "I", "u": "U", "d": "D"}[p["op"]],
            "ts": utc_micros(src["ts_us"]),
            "offset": OFFSETS[i],
            "source": f"{src['schema']}.{src['table']}",
            "target": target,
            "lsn": src["lsn"],
            "position": str(src["lsn"]),
        }


def test_plain_events_become_change_rows() -> None:
    t = DebeziumTransform()
    vals = values("plain")
    schema = t.infer_schema(vals)
    assert schema.names == ["id", "name", "amount", "created", "seen", "ok", "_cdc"]
    assert schema.field("created").type == pa.int64()  # no schema: a MicroTimestamp is a long
    out = t.apply(vals, OFFSETS, schema)
    rows = out.table.to_pylist()
    assert [(r["id"], r["_cdc"]["op"]) for r in rows] == [(1, "I"), (2, "I"), (3, "I"), (1, "U"), (2, "D")]
    assert out.indices.to_pylist() == [0, 1, 2, 3, 4]
    # the tombstone after the delete is not a change row (engineer 4's code skips it before)
    assert [(r.index, r.reason) for r in out.rejects] == [(5, "malformed JSON: empty record")]
    check_cdc(rows, out.indices.to_pylist(), "plain")
    assert rows[0]["created"] == 1704371293123456  # the microseconds, exactly
    assert rows[3]["name"] == "a2"  # the update's after image
    assert rows[4]["name"] == "b"  # the delete's before image
    assert rows[0]["seen"] == "2024-01-04T10:28:13.654321Z"


def test_existing_table_is_filled_by_name() -> None:
    """A table made by hand: columns in another order, one the events lack, a required key,
    a _cdc struct with fewer fields (e.g. created by the reference sink)."""
    schema = pa.schema([
        pa.field("ok", pa.bool_()),
        pa.field("id", pa.int64(), nullable=False),
        pa.field("extra", pa.string()),
        pa.field("_cdc", pa.struct([pa.field("target", pa.string()), pa.field("op", pa.string())])),
    ])
    out = DebeziumTransform("cdc_{db}.{table}_log").apply(values("plain"), OFFSETS, schema)
    assert out.table.schema == schema
    assert out.table.to_pylist()[3] == {
        "ok": True, "id": 1, "extra": None, "_cdc": {"target": "cdc_public.orders_log", "op": "U"},
    }


def test_required_field_missing_from_image_is_rejected() -> None:
    """A delete under the default replica identity: ``before`` holds the key only."""
    delete = payloads("plain")[4]
    assert delete is not None
    delete["before"] = {"id": 2, "name": None, "amount": None, "created": None, "seen": None, "ok": None}
    schema = pa.schema([pa.field("id", pa.int32()), pa.field("name", pa.string(), nullable=False),
                        pa.field("_cdc", CDC_TYPE)])
    vals = values("plain")[:4] + [json.dumps(delete).encode()]
    out = DebeziumTransform().apply(vals, OFFSETS[:5], schema)
    assert out.indices.to_pylist() == [0, 1, 2, 3]
    assert [(r.index, r.reason, r.field) for r in out.rejects] == [(4, "required field is null or missing", "name")]


def test_records_that_are_not_change_events_are_rejected_in_place() -> None:
    vals = values("plain")[:5]
    truncate = json.loads(vals[0])
    truncate.update(op="t", before=None, after=None)
    batch = [vals[0], b'{"id": 9}', b"{not json", vals[1], json.dumps(truncate).encode(), vals[2]]
    offsets = [10, 11, 12, 13, 14, 15]
    out = DebeziumTransform().apply(batch, offsets, DebeziumTransform().infer_schema(vals))
    assert out.indices.to_pylist() == [0, 3, 5]
    assert [r["_cdc"]["offset"] for r in out.table.to_pylist()] == [10, 13, 15]
    reasons = {r.index: r.reason for r in out.rejects}
    assert reasons[1] == "not a Debezium change event: no op"
    assert reasons[2].startswith("malformed JSON")
    assert reasons[4] == "Debezium event without a row image (op 't')"


def test_binlog_position_and_db_without_schema() -> None:
    """Hand-written in the MySQL connector's shape (source has db, file and pos, no schema)."""
    event = {"before": None, "after": {"id": 7}, "op": "c", "ts_ms": 1700000000999,
             "source": {"db": "inventory", "table": "customers", "ts_ms": 1700000000123, "file": "binlog.000003", "pos": 154}}
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("_cdc", CDC_TYPE)])
    out = DebeziumTransform().apply([json.dumps(event).encode()], [0], schema)
    cdc = out.table.to_pylist()[0]["_cdc"]
    assert (cdc["source"], cdc["target"], cdc["lsn"], cdc["position"]) == (
        "inventory.customers", "inventory.customers", None, "binlog.000003:154")
    assert cdc["ts"] == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)  # source.ts_ms, not ts_ms


def test_schema_envelope_gives_exact_types_and_encodings() -> None:
    t = DebeziumTransform(schemas=True)
    schema = t.infer_schema(values("schema"))
    assert [(f.name, f.type) for f in schema][:6] == [
        ("id", pa.int32()), ("name", pa.large_string()), ("amount", pa.decimal128(10, 2)),
        ("created", pa.timestamp("us")), ("seen", pa.timestamp("us", tz="UTC")), ("ok", pa.bool_()),
    ]
    assert schema.field("created").metadata == {b"icesink.epoch-unit": b"us"}
    assert schema.field("amount").metadata == {b"icesink.decimal-encoding": b"connect-bytes"}


def test_schema_envelope_rows() -> None:
    """The columns decode_json fills today, from the schema'd events."""
    schema = pa.schema([pa.field("id", pa.int32()), pa.field("name", pa.string()), pa.field("seen", pa.timestamp("us", tz="UTC")),
                        pa.field("ok", pa.bool_()), pa.field("_cdc", CDC_TYPE)])
    out = DebeziumTransform(schemas=True).apply(values("schema"), OFFSETS, schema)
    rows = out.table.to_pylist()
    assert [(r["id"], r["_cdc"]["op"]) for r in rows] == [(1, "I"), (2, "I"), (3, "I"), (1, "U"), (2, "D")]
    check_cdc(rows, out.indices.to_pylist(), "schema")
    assert rows[0]["seen"] == datetime(2024, 1, 4, 10, 28, 13, 654321, tzinfo=UTC)


def test_schema_envelope_timestamps_and_decimals_exact() -> None:
    t = DebeziumTransform(schemas=True)
    vals = values("schema")
    out = t.apply(vals, OFFSETS, t.infer_schema(vals))
    rows = out.table.to_pylist()
    assert [r.index for r in out.rejects] == [5]
    assert rows[0]["created"] == datetime(2024, 1, 4, 12, 28, 13, 123456)
    assert rows[2]["created"] == datetime(2024, 1, 4, 12, 28, 13, 1)
    assert str(rows[0]["amount"]) == "12.34" and str(rows[3]["amount"]) == "99.99"


# Settings --------------------------------------------------------------------------------------

BASE = {"topics": "t", "iceberg.tables": "db.t"}


def test_reference_transform_keys() -> None:
    s = build({**BASE, "transforms": "debezium",
               "transforms.debezium.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform",
               "transforms.debezium.cdc.target.pattern": "mirror.{db}_{table}",
               "value.converter.schemas.enable": "true"})
    assert s.debezium_target_pattern == "mirror.{db}_{table}"
    s = build({**BASE, "transforms": "dbz", "transforms.dbz.type": "org.apache.iceberg.connect.transforms.DebeziumTransform"})
    assert s.debezium_target_pattern == "{db}.{table}"
    assert build(BASE).debezium_target_pattern is None


@pytest.mark.parametrize(("extra", "key"), [
    ({"transforms": "x", "transforms.x.type": "org.apache.kafka.connect.transforms.Flatten$Value"}, "transforms.x.type"),
    ({"transforms": "x"}, "transforms.x.type"),
    ({"transforms": "x", "transforms.x.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform",
      "transforms.x.cdc.target.pattern": "{schema}.{table}"}, "transforms.x.cdc.target.pattern"),
])
def test_bad_transform_settings(extra: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build({**BASE, **extra})
    assert exc.value.key == key


# Schema evolution, key and metadata columns ---------------------------------------------------


def _added_column(value: bytes, form: str, note: str | None) -> bytes:
    """The event as Debezium writes it after ``ALTER TABLE orders ADD COLUMN note text``."""
    doc = json.loads(value)
    payload = doc["payload"] if form == "schema" else doc
    for image in ("before", "after"):
        if payload.get(image) is not None:
            payload[image]["note"] = note
    if form == "schema":
        for f in doc["schema"]["fields"]:
            if f["field"] in ("before", "after"):
                f["fields"].append({"type": "string", "optional": True, "field": "note"})
    return json.dumps(doc, separators=(",", ":")).encode()


def _evolving_batch(form: str) -> list[bytes]:
    """The first three events as captured, then the update and delete after the ALTER."""
    vals = values(form)[:5]
    return vals[:3] + [_added_column(vals[3], form, "n3"), _added_column(vals[4], form, None)]


def _messages(vals: list[bytes]) -> list[Any]:
    from types import SimpleNamespace

    return [SimpleNamespace(value=v, key=b'{"id":%d}' % i, offset=OFFSETS[i], partition=0, topic="dbz.public.orders",
                            timestamp=1_700_000_000_000, headers=()) for i, v in enumerate(vals)]


def _format(form: str):
    from agents.formats import RecordFormat

    return RecordFormat(build({**BASE, "value.converter.schemas.enable": str(form == "schema").lower(),
                               "iceberg.tables.key-column": "_key", "iceberg.tables.kafka-metadata-enabled": "true"}))


def _created(fmt, t: DebeziumTransform, vals: list[bytes]) -> pa.Schema:
    """The table the worker auto-creates from ``vals`` (value columns, _cdc, key and metadata)."""
    from agents.tables import iceberg_schema
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(iceberg_schema(fmt.with_extras(t.infer_schema(vals))))


@pytest.mark.parametrize("form", ["schema", "plain"])
def test_added_source_column_evolves_the_table_with_key_and_metadata(form: str) -> None:
    """With evolution on, a column added in the source reaches the table (its Connect schema
    says so, or without schemas its values do); _cdc never evolves; key and metadata columns
    are filled on the Debezium path too."""
    from agents.evolution import Evolver
    from icesink.shared.schema_changes import from_proposal

    t = DebeziumTransform(schemas=form == "schema")
    fmt = _format(form)
    table = _created(fmt, t, values(form)[:3])
    assert "_key" in table.names and "_kafka_metadata_offset" in table.names and "note" not in table.names
    vals = _evolving_batch(form)
    msgs = _messages(vals)
    rows_of = lambda s, grow: t.apply(vals, OFFSETS[:5], s, grow=grow)  # noqa: E731
    frozen = frozenset(fmt.extras.names() | {"_cdc"})
    ev = Evolver("w1", evolve=True, case_insensitive=False)
    if form == "schema":
        growth = ev.growth("db.t", table, frozenset(), frozen)
        out = growth.done(fmt.convert(msgs, vals, growth.schema, grow=growth, decode_values=rows_of))
    else:
        out = ev.decode("db.t", table, vals, frozen=frozen, infer=lambda: t.row_schema(vals),
                        decode=lambda probe: fmt.convert(msgs, vals, probe, decode_values=rows_of))
    assert out.converted.rejects == ()
    rows = out.converted.table.to_pylist()
    assert [(r["id"], r["note"], r["_cdc"]["op"]) for r in rows] == [
        (1, None, "I"), (2, None, "I"), (3, None, "I"), (1, "n3", "U"), (2, None, "D")]
    check_cdc([r for r in rows], out.converted.indices.to_pylist(), form)
    assert [r["_key"] for r in rows] == ['{"id":%d}' % i for i in range(5)]
    assert [r["_kafka_metadata_offset"] for r in rows] == OFFSETS[:5]
    assert rows[0]["_kafka_metadata_topic"] == "dbz.public.orders"
    proposed = from_proposal(out.proposal)
    assert proposed.names == [*table.names, "note"]
    assert proposed.field("_cdc").type == table.field("_cdc").type  # never evolved
    assert out.converted.table.schema.field("_cdc").type == table.field("_cdc").type


def test_without_evolution_an_added_source_column_is_dropped_but_key_and_metadata_fill() -> None:
    t = DebeziumTransform(schemas=True)
    fmt = _format("schema")
    table = _created(fmt, t, values("schema")[:3])
    vals = _evolving_batch("schema")
    out = fmt.convert(_messages(vals), vals, table, decode_values=lambda s, grow: t.apply(vals, OFFSETS[:5], s, grow=grow))
    assert out.table.schema == table and out.rejects == ()
    assert [r["_key"] for r in out.table.to_pylist()][3] == '{"id":3}'


def test_schema_widening_in_the_source_widens_the_column() -> None:
    """``ALTER TABLE orders ALTER COLUMN id TYPE bigint``: the Connect schema says int64."""
    from agents.evolution import Evolver
    from icesink.shared.schema_changes import from_proposal

    t = DebeziumTransform(schemas=True)
    table = t.infer_schema(values("schema")[:3])
    assert table.field("id").type == pa.int32()
    doc = json.loads(values("schema")[2])
    for f in doc["schema"]["fields"]:
        if f["field"] in ("before", "after"):
            f["fields"][0]["type"] = "int64"
    doc["payload"]["after"]["id"] = 2**40
    vals = [values("schema")[0], json.dumps(doc).encode()]
    growth = Evolver("w1", evolve=True, case_insensitive=False).growth("db.t", table, frozenset(), frozenset({"_cdc"}))
    out = growth.done(t.apply(vals, OFFSETS[:2], growth.schema, grow=growth))
    assert out.converted.table.column("id").to_pylist() == [1, 2**40]
    assert from_proposal(out.proposal).field("id").type == pa.int64()


def test_auto_create_uses_the_envelope_formats_connect_mapping() -> None:
    """One Connect mapping (agents.formats): io.debezium.data.Uuid is a uuid column, as it is
    for envelope records, and such a table can be created (pyarrow writes its files)."""
    from agents.formats import connect_arrow_schema

    doc = json.loads(values("schema")[0])
    row = next(f for f in doc["schema"]["fields"] if f["field"] == "after")
    row["fields"].append({"type": "string", "optional": True, "name": "io.debezium.data.Uuid", "field": "u"})
    t = DebeziumTransform(schemas=True)
    schema = t.infer_schema([json.dumps(doc).encode()])
    assert schema.field("u").type == connect_arrow_schema({"type": "struct", "fields": [row["fields"][-1]]}).field("u").type
    assert schema.field("u").type == pa.uuid()
    created = _format("schema").with_extras(schema)
    assert str(created.find_field("u").field_type) == "uuid"
    # A delete's before image and an insert's after image with a uuid (pyarrow has no if_else for it).
    ref = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    doc["payload"]["after"]["u"] = ref
    deleted = json.loads(json.dumps(doc))
    deleted["payload"].update(op="d", before=doc["payload"]["after"], after=None)
    out = t.apply([json.dumps(doc).encode(), json.dumps(deleted).encode()], [0, 1], schema)
    assert not out.rejects and out.table.column("u").to_pylist() == [uuid.UUID(ref)] * 2


@pytest.mark.parametrize("form", ["plain", "schema"])
def test_case_insensitive_row_fields_fill_columns_spelt_otherwise(form: str) -> None:
    """``schema-case-insensitive``: a mirror table whose columns are upper-cased (created by
    hand, say) is filled from the lower-case row images, with each field's encoding (with
    schemas: the Decimal bytes and MicroTimestamp of ``amount`` and ``created``)."""
    t = DebeziumTransform(schemas=form == "schema")
    lower = t.infer_schema(values(form))
    upper = pa.schema([f if f.name == "_cdc" else f.with_name(f.name.upper()) for f in lower])
    expected = t.apply(values(form), OFFSETS, lower)
    folded = DebeziumTransform(schemas=form == "schema", fold_case=True).apply(values(form), OFFSETS, upper)
    assert folded.rejects == expected.rejects and folded.table.num_rows == 5
    assert folded.table.rename_columns(lower.names).equals(expected.table)
    assert folded.table.column("ID").to_pylist() == [1, 2, 3, 1, 2]
    exact = t.apply(values(form), OFFSETS, upper)  # without folding nothing matches
    assert exact.table.column("ID").null_count == exact.table.num_rows


@pytest.mark.parametrize("form", ["plain", "schema"])
def test_a_batch_of_many_inserts_then_deletes_infers_the_row_schema(form: str) -> None:
    """Thousands of inserts (``before`` null) then deletes (``before`` the row): read in 1 MiB
    blocks, the first blocks never see ``before`` as an object, which once failed inference of
    a schemaless batch (auto-create, schema evolution) with ArrowNotImplementedError."""
    insert, delete = (v for v in values(form)[2:5:2])  # the fixture's insert and delete
    batch = [insert] * 6000 + [delete] * 10
    assert sum(map(len, batch)) > 2 * limits.BLOCK_SIZE
    t = DebeziumTransform(schemas=form == "schema")
    schema = t.infer_schema(batch)
    assert schema == t.infer_schema(values(form))
    out = t.apply(batch, list(range(len(batch))), schema)
    assert out.rejects == () and out.table.num_rows == len(batch)
    assert out.table.column("_cdc").combine_chunks().field("op").to_pylist()[-11:] == ["I"] + ["D"] * 10
