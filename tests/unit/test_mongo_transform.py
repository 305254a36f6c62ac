"""The reference's MongoDebeziumTransform (agents/transforms/mongo.py, bson.py): Debezium MongoDB
change events (JSON with schemas, the envelope Debezium 2.x's MongoDB connector writes, its
documents in relaxed extended JSON as Debezium's docs and the reference's test resources show
them) become envelopes with typed before/after; chained with ExtractNewRecordState, rows."""

from __future__ import annotations

import json
from datetime import datetime, UTC
from typing import Any

import pyarrow as pa
import pytest

from pyiceberg.io.pyarrow import schema_to_pyarrow

from agents.debezium import DebeziumTransform
from agents.formats import RecordFormat
from agents.transforms.values import mongo_before_debezium
from agents.transforms.bson import typed
from agents.convert import decode_json
from icesink.shared.config import build
from icesink.shared.errors import ConfigError
from tests.unit.test_cdc_transforms import UNWRAP, run

MONGO = "org.apache.iceberg.connect.transforms.MongoDebeziumTransform"
_JSON = {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1}
ENVELOPE = {
    "type": "struct", "optional": False, "name": "dbserver1.inventory.customers.Envelope", "fields": [
        {**_JSON, "field": "before"},
        {**_JSON, "field": "after"},
        {"type": "struct", "optional": True, "name": "io.debezium.connector.mongodb.changestream.updatedescription",
         "version": 1, "field": "updateDescription", "fields": [
             {"type": "array", "items": {"type": "string", "optional": False}, "optional": True, "field": "removedFields"},
             {**_JSON, "field": "updatedFields"},
             {"type": "array", "optional": True, "field": "truncatedArrays", "items": {
                 "type": "struct", "optional": False, "name": "io.debezium.connector.mongodb.changestream.truncatedarray",
                 "version": 1, "fields": [{"type": "string", "optional": False, "field": "field"},
                                          {"type": "int32", "optional": False, "field": "size"}]}}]},
        {"type": "struct", "optional": False, "name": "io.debezium.connector.mongo.Source", "field": "source", "fields": [
            {"type": "string", "optional": False, "field": "version"},
            {"type": "string", "optional": False, "field": "connector"},
            {"type": "string", "optional": False, "field": "name"},
            {"type": "int64", "optional": False, "field": "ts_ms"},
            {"type": "string", "optional": False, "field": "db"},
            {"type": "string", "optional": False, "field": "rs"},
            {"type": "string", "optional": False, "field": "collection"},
            {"type": "int32", "optional": False, "field": "ord"}]},
        {"type": "string", "optional": True, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ]}
TS = 1558965515240


def event(op: str, after: str | None = None, before: str | None = None, updated: str | None = None,
          removed: list[str] | None = None, **extra: Any) -> bytes:
    """A Debezium 2.x MongoDB change event as the JsonConverter (schemas enabled) writes it."""
    source = {"version": "2.5.2.Final", "connector": "mongodb", "name": "dbserver1", "ts_ms": 1558965508000,
              "db": "inventory", "rs": "rs0", "collection": "customers", "ord": 31}
    update = None if updated is None and removed is None else {
        "removedFields": removed, "updatedFields": updated, "truncatedArrays": None}
    payload = {"before": before, "after": after, "updateDescription": update, "source": source, "op": op,
               "ts_ms": TS, **extra}
    return json.dumps({"schema": ENVELOPE, "payload": payload}).encode()


ANNE = '{"_id" : {"$numberLong" : "1004"},"first_name" : "Anne","last_name" : "Kretchmar","email" : "annek@noanswer.org"}'
ANNE_MARIE = ANNE.replace('"Anne"', '"Anne Marie"')


def mongo_format(unwrap: dict[str, str] | None = None, **props: str) -> RecordFormat:
    keys = {"topics": "t", "iceberg.tables": "db.t", "value.converter.schemas.enable": "true",
            "transforms": "m" if unwrap is None else "m,u", "transforms.m.type": MONGO,
            **{f"transforms.m.{k}": v for k, v in props.items()}}
    if unwrap is not None:
        keys |= {"transforms.u.type": UNWRAP, **{f"transforms.u.{k}": v for k, v in unwrap.items()}}
    return RecordFormat(build(keys))


def test_create_update_delete_become_typed_images_as_the_references_tests() -> None:
    values = [event("c", after=ANNE), event("u", before=ANNE, after=ANNE_MARIE), event("d", before=ANNE_MARIE)]
    names, rows, out = run(mongo_format(), values)
    assert names == ["before", "after", "updateDescription", "source", "op", "ts_ms"]
    assert out.rejects == ()
    anne = {"_id": 1004, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"}
    assert [(r["op"], r["before"], r["after"], r["ts_ms"]) for r in rows] == [
        ("c", None, anne, TS),
        ("u", anne, anne | {"first_name": "Anne Marie"}, TS),
        ("d", anne | {"first_name": "Anne Marie"}, None, TS),
    ]
    assert rows[0]["source"]["collection"] == "customers"
    image = out.table.schema.field("after").type
    assert image.field("_id").type == pa.int64()  # {"$numberLong"}: a long, as the reference's test


def test_extended_json_wrappers_become_the_references_types() -> None:
    doc = json.dumps({
        "_id": {"$oid": "5d1b8e2f9c1e4a0001a1b2c3"}, "n": 7, "big": {"$numberLong": "9007199254740993"},
        "i": {"$numberInt": "12"}, "d": {"$numberDouble": "-Infinity"}, "dec": {"$numberDecimal": "1.10"},
        "at": {"$date": "2019-05-27T14:38:28.123Z"}, "old": {"$date": {"$numberLong": "-1000"}},
        "ts": {"$timestamp": {"t": 1558965508, "i": 1}}, "bin": {"$binary": {"base64": "AQID", "subType": "00"}},
        "re": {"$regularExpression": {"pattern": "^a", "options": "i"}}, "min": {"$minKey": 1},
        "addr": {"city": "Oslo", "zip": {"$numberInt": "150"}}, "tags": ["a", "b"],
        "pts": [{"x": {"$numberDouble": "1.5"}}], "empty": [],
    })
    _names, rows, out = run(mongo_format(), [event("c", after=doc)])
    assert out.rejects == ()
    after = rows[0]["after"]
    utc = UTC
    assert after == {
        "_id": "5d1b8e2f9c1e4a0001a1b2c3", "n": 7, "big": 9007199254740993, "i": 12, "d": float("-inf"),
        "dec": "1.10", "at": datetime(2019, 5, 27, 14, 38, 28, 123000, tzinfo=utc),
        "old": datetime(1969, 12, 31, 23, 59, 59, tzinfo=utc), "ts": datetime(2019, 5, 27, 13, 58, 28, tzinfo=utc),
        "bin": b"\x01\x02\x03", "re": {"regex": "^a", "options": "i"}, "min": None,
        "addr": {"city": "Oslo", "zip": 150}, "tags": ["a", "b"], "pts": [{"x": 1.5}], "empty": [],
    }
    t = out.table.schema.field("after").type
    assert (t.field("i").type, t.field("at").type) == (pa.int32(), pa.timestamp("us", tz="UTC"))


def test_array_handling_mode_document_makes_structs_of_indexed_fields() -> None:
    doc = '{"_id": 1, "tags": ["a", "b"], "pts": [{"x": 1}], "none": []}'
    other = '{"_id": 2, "tags": ["c"]}'
    _names, rows, out = run(mongo_format(array_handling_mode="document"), [event("c", after=doc), event("c", after=other)])
    assert out.rejects == ()
    assert [r["after"] for r in rows] == [
        {"_id": 1, "tags": {"_0": "a", "_1": "b"}, "pts": {"_0": {"x": 1}}, "none": {}},
        {"_id": 2, "tags": {"_0": "c", "_1": None}, "pts": None, "none": None},
    ]


def test_partial_update_merges_updated_fields_into_before_and_drops_removed_ones() -> None:
    """Debezium's change_streams capture mode: no after, updateDescription says what changed."""
    pre = '{"_id": {"$numberLong": "1004"}, "first_name": "Anne", "email": "annek@noanswer.org", "age": 30}'
    values = [
        event("c", after=pre),
        event("u", before=pre, updated='{"first_name": "Anne Marie"}', removed=["email"]),
        event("u", updated='{"first_name": "Marie", "age": 31}', removed=[]),  # no pre-image: the updated fields only
    ]
    _names, rows, out = run(mongo_format(), values, create=1)
    assert out.rejects == ()
    assert [r["after"] for r in rows] == [
        {"_id": 1004, "first_name": "Anne", "email": "annek@noanswer.org", "age": 30},
        {"_id": 1004, "first_name": "Anne Marie", "email": None, "age": 30},
        {"_id": None, "first_name": "Marie", "email": None, "age": 31},  # no key: no _id
    ]


def mongo_key(id_json: str, schema: bool = True) -> bytes:
    """A Debezium 2.x MongoDB key: ``id`` the document id's extended JSON."""
    key_schema = {"type": "struct", "optional": False, "name": "dbserver1.inventory.customers.Key",
                  "fields": [{"type": "string", "optional": False, "field": "id"}]}
    return json.dumps({"schema": key_schema, "payload": {"id": id_json}} if schema else {"id": id_json}).encode()


def test_partial_update_without_id_takes_it_from_the_key_as_the_reference() -> None:
    from tests.unit.test_cdc_transforms import Msg

    fmt = mongo_format()
    values = [event("c", after='{"_id": {"$numberLong": "1004"}, "first_name": "Anne"}'),
              event("u", updated='{"first_name": "Marie"}', removed=[]),
              event("u", updated='{"first_name": "Ola"}', removed=[]),
              event("u", updated='{"_id": {"$numberLong": "7"}, "first_name": "Kari"}', removed=[])]
    keys = [mongo_key('{"$numberLong": "1004"}'), mongo_key('{"$numberLong": "1004"}'),
            mongo_key('{"$numberLong": "1005"}', schema=False), mongo_key('{"$numberLong": "8"}')]
    created = fmt.table_schema(values[:1])
    target = schema_to_pyarrow(created) if not isinstance(created, pa.Schema) else created
    out = fmt.convert([Msg(v, key=k) for v, k in zip(values, keys, strict=True)], values, target)
    assert out.rejects == ()
    assert [(r["after"]["_id"], r["after"]["first_name"]) for r in out.table.to_pylist()] == [
        (1004, "Anne"), (1004, "Marie"), (1005, "Ola"), (7, "Kari")]  # the document's own _id first


def test_malformed_events_oplog_patches_and_bad_documents_are_rejects_the_rest_flow() -> None:
    values = [
        event("c", after=ANNE),  # creates the table: _id a long
        event("u"),  # none of before, after, updateDescription: the reference fails on it
        event("u", patch='{"$set": {"first_name": "x"}}'),  # Debezium 1.x oplog
        event("c", after="[1, 2]"),  # no document
        event("c", after='{"_id": {"$oid": "5d1b8e2f9c1e4a0001a1b2c3"}, "first_name": "Ola"}'),  # no long
        event("c", after=ANNE_MARIE),
    ]
    _names, rows, out = run(mongo_format(), values, create=1)
    assert [(r["after"]["_id"], r["after"]["first_name"]) for r in rows] == [(1004, "Anne"), (1004, "Anne Marie")]
    assert [(r.index, r.field) for r in out.rejects] == [(1, "after"), (2, "patch"), (3, "after"), (4, "after")]
    assert "no after, before or updateDescription" in out.rejects[0].reason
    assert "oplog" in out.rejects[1].reason


def test_chained_with_extract_new_record_state_gives_rows_of_the_documents() -> None:
    values = [event("c", after=ANNE), event("u", before=ANNE, after=ANNE_MARIE), event("d", before=ANNE_MARIE)]
    fmt = mongo_format({"delete.tombstone.handling.mode": "rewrite", "add.fields": "op,source.ts_ms"})
    names, rows, _out = run(fmt, values)
    assert names == ["_id", "first_name", "last_name", "email", "__deleted", "__op", "__source_ts_ms"]
    assert [(r["_id"], r["first_name"], r["__deleted"], r["__op"]) for r in rows] == [
        (1004, "Anne", "false", "c"), (1004, "Anne Marie", "false", "u"), (1004, "Anne Marie", "true", "d")]
    assert {r["__source_ts_ms"] for r in rows} == {1558965508000}


def test_typed_leaves_plain_documents_and_dollar_named_fields_alone() -> None:
    t = decode_json([b'{"a": {"$weird": 1}, "b": {"c": 2}}']).table
    arr = pa.StructArray.from_arrays([c.combine_chunks() for c in t.columns], names=t.column_names)
    assert typed(arr).to_pylist() == [{"a": {"$weird": 1}, "b": {"c": 2}}]


@pytest.mark.parametrize(("keys", "named"), [
    ({"transforms.m.array_handling_mode": "struct"}, "transforms.m.array_handling_mode"),
    ({"transforms.m.unknown": "x"}, "transforms.m.unknown"),
    ({"value.converter.schemas.enable": "false"}, "value.converter.schemas.enable"),
    ({"transforms": "d,m", "transforms.d.type": "org.apache.iceberg.connect.transforms.DebeziumTransform"}, "transforms"),
    ({"transforms": "m,u,d", "transforms.u.type": UNWRAP,
      "transforms.d.type": "org.apache.iceberg.connect.transforms.DebeziumTransform"}, "transforms"),
    ({"transforms": "r,m", "transforms.r.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
      "transforms.r.exclude": "x"}, "transforms"),
    ({"iceberg.tables.evolve-schema-enabled": "true"}, "iceberg.tables.evolve-schema-enabled"),
    ({"iceberg.tables.route-field": "_cdc.target", "iceberg.tables.dynamic-enabled": "true"}, "iceberg.tables.route-field"),
    ({"transforms": "m,d", "transforms.d.type": "org.apache.iceberg.connect.transforms.DebeziumTransform",
      "iceberg.tables.route-field": "first_name", "iceberg.tables.dynamic-enabled": "true"}, "iceberg.tables.route-field"),
])
def test_mongo_transform_keys_are_checked_at_start(keys: dict[str, str], named: str) -> None:
    base = {"topics": "t", "iceberg.tables": "db.t", "value.converter.schemas.enable": "true",
            "transforms": "m", "transforms.m.type": MONGO}
    with pytest.raises(ConfigError) as e:
        build(base | keys)
    assert e.value.key == named


def test_both_class_names_start() -> None:
    for cls in (MONGO, "io.tabular.iceberg.connect.transforms.MongoDebeziumTransform"):
        s = build({"topics": "t", "iceberg.tables": "db.t", "value.converter.schemas.enable": "true",
                   "transforms": "m", "transforms.m.type": cls, "transforms.m.array_handling_mode": "Document"})
        assert [t.kind for t in s.transform_chain] == ["mongo-debezium"]


def test_before_debezium_transform_gives_change_rows_with_cdc_as_the_references_chain() -> None:
    """``transforms=mongo,debezium``, the reference's documented chain: DebeziumTransform reads the
    typed images; ``_cdc.source`` is ``{db}.{collection}`` (the reference reads ``source.table``,
    which a MongoDB event has not)."""
    keys = {"topics": "t", "iceberg.tables": "db.t", "value.converter.schemas.enable": "true",
            "transforms": "mongo,dbz", "transforms.mongo.type": MONGO,
            "transforms.dbz.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform",
            "transforms.dbz.cdc.target.pattern": "cdc.{table}"}
    settings = build(keys)
    assert not RecordFormat(settings).values  # DebeziumTransform runs it, not the value chain
    t = DebeziumTransform("cdc.{table}", schemas=True, mongo=mongo_before_debezium(settings.transform_chain))
    partial = event("u", before=ANNE, updated='{"email": "anne@example.org"}', removed=["last_name"])
    values = [event("c", after=ANNE), event("u", before=ANNE, after=ANNE_MARIE), partial, event("u"),
              event("d", before=ANNE_MARIE)]
    schema = t.infer_schema(values)
    assert schema.names == ["_id", "first_name", "last_name", "email", "_cdc"]
    assert schema.field("_id").type == pa.int64()
    out = t.apply(values, [10, 11, 12, 13, 14], schema)
    assert [(r.index, r.field) for r in out.rejects] == [(3, "after")]
    rows = out.table.to_pylist()
    assert [(r["_id"], r["first_name"], r["last_name"], r["email"]) for r in rows] == [
        (1004, "Anne", "Kretchmar", "annek@noanswer.org"), (1004, "Anne Marie", "Kretchmar", "annek@noanswer.org"),
        (1004, "Anne", None, "anne@example.org"), (1004, "Anne Marie", "Kretchmar", "annek@noanswer.org")]
    ts = datetime.fromtimestamp(1558965508, UTC)
    assert [(c["op"], c["ts"], c["offset"], c["source"], c["target"]) for c in (r["_cdc"] for r in rows)] == [
        ("I", ts, 10, "inventory.customers", "cdc.customers"), ("U", ts, 11, "inventory.customers", "cdc.customers"),
        ("U", ts, 12, "inventory.customers", "cdc.customers"), ("D", ts, 14, "inventory.customers", "cdc.customers")]


def test_before_debezium_transform_routes_on_cdc_target() -> None:
    """The reference's usual set-up: route-field ``_cdc.target``, dynamic tables (a row image field
    is refused at start: routing would read the extended-JSON strings)."""
    settings = build({"topics": "t", "iceberg.tables.route-field": "_cdc.target", "iceberg.tables.dynamic-enabled": "true",
                      "value.converter.schemas.enable": "true", "transforms": "m,d", "transforms.m.type": MONGO,
                      "transforms.d.type": "org.apache.iceberg.connect.transforms.DebeziumTransform",
                      "transforms.d.cdc.target.pattern": "cdc.{table}"})
    t = DebeziumTransform("cdc.{table}", schemas=True, mongo=mongo_before_debezium(settings.transform_chain))
    out = t.route_column([event("c", after=ANNE), event("d", before=ANNE)], "_cdc.target")
    assert out.rejects == ()
    assert out.table.column(0).to_pylist() == ["cdc.customers", "cdc.customers"]


def test_before_debezium_transform_a_partial_update_takes_id_from_the_key() -> None:
    settings = build({"topics": "t", "iceberg.tables": "db.t", "value.converter.schemas.enable": "true",
                      "transforms": "m,d", "transforms.m.type": MONGO,
                      "transforms.d.type": "org.apache.iceberg.connect.transforms.DebeziumTransform"})
    t = DebeziumTransform(schemas=True, mongo=mongo_before_debezium(settings.transform_chain))
    values = [event("c", after=ANNE), event("u", updated='{"email": "x@y.z"}', removed=[])]
    out = t.apply(values, [0, 1], t.infer_schema(values), keys=[None, mongo_key('{"$numberLong": "1004"}')])
    assert [(r["_id"], r["email"], r["_cdc"]["op"]) for r in out.table.to_pylist()] == [
        (1004, "annek@noanswer.org", "I"), (1004, "x@y.z", "U")]


def test_a_nested_change_in_updated_fields_is_a_reject_not_a_field_named_with_a_dot() -> None:
    """``{"addr.city": ...}``: the reference appends a field named ``addr.city``, which an
    Iceberg schema with ``addr.city`` nested cannot hold; here such a change is dead-lettered."""
    pre = '{"_id": 1, "addr": {"city": "Oslo"}}'
    values = [event("u", before=pre, updated='{"addr.city": "Bergen"}', removed=[]), event("c", after=pre)]
    _names, rows, out = run(mongo_format(), values)
    assert [r["after"] for r in rows] == [{"_id": 1, "addr": {"city": "Oslo"}}]
    assert [(r.index, r.field) for r in out.rejects] == [(0, "updateDescription")]
