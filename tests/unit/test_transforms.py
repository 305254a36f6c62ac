"""Single message transforms and predicates (icesink/shared/transform_settings.py checks them at
start; agents/transforms/ runs their batch steps; routing by topic in agents/routing.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from agents.deadletter import screen
from agents.formats.extras import Extras
from agents.routing import Router
from agents.transforms import Chain
from icesink.shared.config import Settings, build
from icesink.shared.errors import ConfigError
from icesink.shared.transform_settings import java_replacement

BASE = {"topics": "orders,clicks,users", "iceberg.tables": "db.t"}
C = "org.apache.kafka.connect.transforms."
P = "org.apache.kafka.connect.transforms.predicates."
REF = "org.apache.iceberg.connect.transforms."


@dataclass
class Msg:
    value: bytes | None
    headers: Any = ()
    topic: str = "orders"
    partition: int = 0
    offset: int = 0
    timestamp: int | None = 0
    key: bytes | None = None


def settings(**keys: str) -> Settings:
    return build({**BASE, **keys})


# Start-up checks: every key acts or is refused by name ----------------------------------------


@pytest.mark.parametrize(("keys", "named"), [
    ({"transforms": "x", "transforms.x.type": f"{C}Nope"}, "transforms.x.type"),
    ({"transforms": "x", "transforms.x.type": f"{C}RegexRouter", "transforms.x.regex": "(.*)"},
     "transforms.x.replacement"),
    ({"transforms": "x", "transforms.x.type": f"{C}RegexRouter", "transforms.x.regex": "(.*",
      "transforms.x.replacement": "a"}, "transforms.x.regex"),
    ({"transforms": "x", "transforms.x.type": f"{C}RegexRouter", "transforms.x.regex": "(.*)",
      "transforms.x.replacement": "a$2"}, "transforms.x.replacement"),
    ({"transforms": "x", "transforms.x.type": f"{C}RegexRouter", "transforms.x.regex": "a",
      "transforms.x.replacement": "b", "transforms.x.bogus": "1"}, "transforms.x.bogus"),
    ({"transforms": "x", "transforms.x.type": f"{C}Filter", "transforms.x.predicate": "p"}, "transforms.x.predicate"),
    ({"transforms": "x", "transforms.x.type": f"{C}Filter", "transforms.x.negate": "true"}, "transforms.x.negate"),
    ({"transforms": "x", "transforms.x.type": f"{C}Filter", "transforms.x.predicate": "p",
      "predicates": "p", "predicates.p.type": f"{P}Nope"}, "predicates.p.type"),
    ({"transforms": "x", "transforms.x.type": f"{C}Filter", "transforms.x.predicate": "p",
      "predicates": "p", "predicates.p.type": f"{P}HasHeaderKey"}, "predicates.p.name"),
    ({"transforms": "x", "transforms.x.type": f"{C}Filter", "transforms.x.predicate": "p",
      "predicates": "p", "predicates.p.type": f"{P}TopicNameMatches", "predicates.p.pattern": "[x"},
     "predicates.p.pattern"),
    ({"transforms": "x", "transforms.x.type": f"{C}Filter", "transforms.x.predicate": "p", "transforms.x.negate": "yes",
      "predicates": "p", "predicates.p.type": f"{P}RecordIsTombstone"}, "transforms.x.negate"),
    ({"transforms": "m", "transforms.m.type": f"{REF}KafkaMetadataTransform", "transforms.m.external_field": "a,b"},
     "transforms.m.external_field"),
    ({"transforms": "m", "transforms.m.type": f"{REF}KafkaMetadataTransform", "transforms.m.nested": "maybe"},
     "transforms.m.nested"),
    ({"transforms": "m", "transforms.m.type": f"{REF}KafkaMetadataTransform",
      "iceberg.tables.kafka-metadata-enabled": "true"}, "iceberg.tables.kafka-metadata-enabled"),
    ({"transforms": "r,m", "transforms.r.type": f"{C}RegexRouter", "transforms.r.regex": "a",
      "transforms.r.replacement": "b", "transforms.m.type": f"{REF}KafkaMetadataTransform"}, "transforms"),
])
def test_a_bad_transform_or_predicate_key_is_refused_at_start_by_name(keys: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**keys)
    assert err.value.key == named


def test_the_references_usual_debezium_and_kafka_metadata_chain_starts() -> None:
    s = settings(**{
        "transforms": "debezium,kafkametadata",
        "transforms.debezium.type": "io.tabular.iceberg.connect.transforms.DebeziumTransform",
        "transforms.kafkametadata.type": f"{REF}KafkaMetadataTransform",
    })
    assert [t.kind for t in s.transform_chain] == ["debezium", "kafka-metadata"]
    assert s.metadata_columns == ("_kafka_metadata", False, False)


def test_java_replacements_become_python_ones() -> None:
    assert java_replacement("db.$1_${x}\\$") == "db.\\g<1>_\\g<x>$"


# The batch steps --------------------------------------------------------------------------------


def chain(**keys: str) -> Chain:
    return Chain(settings(**keys).transform_chain)


def test_regex_router_renames_a_whole_match_only() -> None:
    c = chain(**{"transforms": "r", "transforms.r.type": f"{C}RegexRouter",
                 "transforms.r.regex": "prod-(.*)", "transforms.r.replacement": "db.$1"})
    assert c.apply("prod-orders", [Msg(b"{}")] * 2).topic() == "db.orders"
    assert c.apply("xprod-orders", [Msg(b"{}")]).topic() == "xprod-orders"


def test_filter_with_predicates_drops_and_negates_and_guards_a_router() -> None:
    c = chain(**{
        "transforms": "dropTomb,keepAudit,route",
        "transforms.dropTomb.type": f"{C}Filter", "transforms.dropTomb.predicate": "tomb",
        "transforms.keepAudit.type": f"{C}Filter", "transforms.keepAudit.predicate": "audit",
        "transforms.keepAudit.negate": "true",
        "transforms.route.type": f"{C}RegexRouter", "transforms.route.predicate": "orders",
        "transforms.route.regex": "(.*)", "transforms.route.replacement": "db.$1",
        "predicates": "tomb,audit,orders",
        "predicates.tomb.type": f"{P}RecordIsTombstone",
        "predicates.audit.type": f"{P}HasHeaderKey", "predicates.audit.name": "audit",
        "predicates.orders.type": f"{P}TopicNameMatches", "predicates.orders.pattern": "ord.*",
    })
    msgs = [Msg(b"1", [("audit", b"y")]), Msg(None, [("audit", b"y")]), Msg(b"3"), Msg(b"4", [(b"audit", None)])]
    applied = c.apply("orders", msgs)
    assert applied.dropped is not None and applied.dropped.tolist() == [False, True, True, False]
    kept = applied.topics.dictionary_decode().to_pylist()
    assert [kept[0], kept[3]] == ["db.orders", "db.orders"]
    screened = screen(msgs, 1000, applied.dropped)
    assert screened.values == [b"1", b"4"] and screened.positions == [0, 3] and not screened.whole
    assert c.apply("users", msgs).topic() == "users"  # the router's predicate does not hold


def test_filter_without_predicate_drops_every_record() -> None:
    applied = chain(**{"transforms": "f", "transforms.f.type": f"{C}Filter"}).apply("t", [Msg(b"1"), Msg(b"2")])
    assert applied.dropped is not None and applied.dropped.all()


# Routing by topic -------------------------------------------------------------------------------


def topics(*names: str) -> pa.Array:
    return pa.array(list(names), pa.string())


def test_the_shorthand_routes_each_topic_to_its_table_dynamically() -> None:
    r = Router(settings(**{"iceberg.tables.route-field": "@topic", "iceberg.tables.dynamic-enabled": "true"}))
    routes = r.route([b"{}", b"{}", b"{}"], topics=topics("db.orders", "db.clicks", "db.orders"))
    assert {t: i.tolist() for t, i in routes.by_table.items()} == {"db.orders": [0, 2], "db.clicks": [1]}


def test_the_references_way_routes_on_the_kafka_metadata_topic_column() -> None:
    r = Router(settings(**{
        "transforms": "m", "transforms.m.type": f"{REF}KafkaMetadataTransform",
        "iceberg.tables": "db.o,db.c", "iceberg.tables.route-field": "_kafka_metadata_topic",
        "iceberg.table.db.o.route-regex": "orders", "iceberg.table.db.c.route-regex": "clicks",
    }))
    routes = r.route([b'{"x":1}'] * 3, topics=topics("orders", "clicks", "users"))
    assert {t: i.tolist() for t, i in routes.by_table.items()} == {"db.o": [0], "db.c": [1]}
    assert [u.index for u in routes.unrouted] == [2]  # no table: dead-lettered, never dropped


def test_kafka_metadata_transform_columns_have_no_headers_as_the_reference() -> None:
    meta = settings(**{"transforms": "m", "transforms.m.type": f"{REF}KafkaMetadataTransform",
                       "transforms.m.field_name": "_meta"}).metadata_columns
    assert meta is not None
    extras = Extras(None, False, *meta)
    assert extras.names() == {"_meta_topic", "_meta_partition", "_meta_offset", "_meta_timestamp"}


# Value transforms: ReplaceField$Value and CopyValue, on the decoded columns -------------------


def value_format(**keys: str) -> Any:
    from agents.formats import RecordFormat

    return RecordFormat(settings(**keys))


def test_replace_field_and_copy_value_shape_the_created_table_and_its_rows() -> None:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    fmt = value_format(**{
        "transforms": "rf,cp",
        "transforms.rf.type": f"{C}ReplaceField$Value", "transforms.rf.exclude": "secret",
        "transforms.rf.renames": "id:order_id,amt:amount",
        "transforms.cp.type": f"{REF}CopyValue", "transforms.cp.source.field": "order_id",
        "transforms.cp.target.field": "id_copy",
    })
    values = [b'{"id":"a","amt":1.5,"secret":"x","n":1}', b'{"id":"b","amt":2,"secret":"y","n":2}']
    created = fmt.table_schema(values)
    assert created is not None
    target = schema_to_pyarrow(created)
    assert target.names == ["order_id", "amount", "n", "id_copy"]
    out = fmt.convert([Msg(v) for v in values], values, target)
    assert out.table.to_pylist() == [
        {"order_id": "a", "amount": 1.5, "n": 1, "id_copy": "a"},
        {"order_id": "b", "amount": 2.0, "n": 2, "id_copy": "b"},
    ]


_EXISTING = pa.schema([("id", pa.string()), ("store_id", pa.int64()), ("store_ref", pa.string())])


@pytest.mark.parametrize(("props", "values", "rows"), [
    # the report: Connect drops the field before the sink converts, so "abc" never meets the long column
    ({"exclude": "store_id"}, [b'{"id":"a","store_id":"abc"}', b'{"id":"b","store_id":7}'],
     [("a", None, None), ("b", None, None)]),
    ({"include": "id,store_ref"}, [b'{"id":"a","store_id":"abc","store_ref":"r"}'], [("a", None, "r")]),
    # a renamed field is coerced to its new column, not to the table's column of its old name
    ({"renames": "store_id:store_ref"}, [b'{"id":"a","store_id":"abc"}', b'{"id":"b","store_id":7}'],
     [("a", None, "abc"), ("b", None, "7")]),
    ({"renames": "store_id:store_ref,store_ref:store_id"}, [b'{"id":"a","store_id":"abc","store_ref":5}'],
     [("a", 5, "abc")]),
])
def test_a_field_replace_field_drops_or_renames_is_not_coerced_to_its_old_names_column(
        props: dict[str, str], values: list[bytes], rows: list[tuple[Any, ...]]) -> None:
    keys = {"transforms": "r", "transforms.r.type": f"{C}ReplaceField$Value",
            **{f"transforms.r.{k}": v for k, v in props.items()}}
    out = value_format(**keys).convert([Msg(v, offset=i) for i, v in enumerate(values)], values, _EXISTING)
    assert out.rejects == ()
    assert [(r["id"], r["store_id"], r["store_ref"]) for r in out.table.to_pylist()] == rows


@pytest.mark.parametrize(("first", "column", "value"), [
    ({"transforms.k.type": f"{C}ValueToKey", "transforms.k.fields": "store_id", "iceberg.tables.key-column": "_key"},
     ("_key", pa.struct([("store_id", pa.string())])), {"store_id": "abc"}),
    ({"transforms.k.type": f"{REF}CopyValue", "transforms.k.source.field": "store_id",
      "transforms.k.target.field": "copy"}, ("copy", pa.string()), "abc"),
])
def test_a_field_taken_before_replace_field_drops_it_is_read_as_what_takes_it(
        first: dict[str, str], column: tuple[str, pa.DataType], value: Any) -> None:
    keys = {"transforms": "k,r", **first, "transforms.r.type": f"{C}ReplaceField$Value", "transforms.r.exclude": "store_id"}
    table = pa.schema([("id", pa.string()), ("store_id", pa.int64()), column])
    values = [b'{"id":"a","store_id":"abc"}']
    out = value_format(**keys).convert([Msg(v) for v in values], values, table)
    assert out.rejects == ()
    assert out.table.to_pylist() == [{"id": "a", "store_id": None, column[0]: value}]


def test_cast_reads_the_raw_value_not_the_tables_column_and_fails_a_field_dropped_after_it() -> None:
    cast = {"transforms.c.type": f"{C}Cast$Value", "transforms.c.spec": "store_id:string"}
    table = pa.schema([("id", pa.string()), ("store_id", pa.string())])
    values = [b'{"id":"a","store_id":17}', b'{"id":"b","store_id":1e7}']
    out = value_format(transforms="c", **cast).convert([Msg(v) for v in values], values, table)
    assert out.table.to_pylist() == [{"id": "a", "store_id": "17"}, {"id": "b", "store_id": "1.0E7"}]
    # Connect casts before ReplaceField drops the field: a value it cannot cast fails its record
    keys = {"transforms": "c,r", **cast, "transforms.c.spec": "store_id:int64",
            "transforms.r.type": f"{C}ReplaceField$Value", "transforms.r.exclude": "store_id"}
    values = [b'{"id":"a","store_id":"x"}', b'{"id":"b","store_id":"5"}']
    out = value_format(**keys).convert([Msg(v, offset=i) for i, v in enumerate(values)], values, _EXISTING)
    assert [(r.index, r.field) for r in out.rejects] == [(0, "store_id")]
    assert out.table.to_pylist() == [{"id": "b", "store_id": None, "store_ref": None}]
    # likewise a field the table has no column for, and TimestampConverter's field
    only_id = pa.schema([("id", pa.string())])
    msgs = [Msg(v, offset=i) for i, v in enumerate(values)]
    out = value_format(transforms="c", **{**cast, "transforms.c.spec": "store_id:int64"}).convert(msgs, values, only_id)
    assert [(r.index, r.field) for r in out.rejects] == [(0, "store_id")] and out.table.num_rows == 1
    ts = {"transforms": "t", "transforms.t.type": f"{C}TimestampConverter$Value", "transforms.t.field": "at",
          "transforms.t.target.type": "Timestamp"}
    values = [b'{"id":"a","at":"noon"}', b'{"id":"b","at":1700000000000}']
    out = value_format(**ts).convert([Msg(v, offset=i) for i, v in enumerate(values)], values, only_id)
    assert [(r.index, r.field) for r in out.rejects] == [(0, "at")] and out.table.to_pylist() == [{"id": "b"}]


@pytest.mark.parametrize(("keys", "named"), [
    ({"transforms": "rf", "transforms.rf.type": f"{C}ReplaceField$Value", "transforms.rf.renames": "a-b"},
     "transforms.rf.renames"),
    ({"transforms": "cp", "transforms.cp.type": f"{REF}CopyValue", "transforms.cp.source.field": "a"},
     "transforms.cp.target.field"),
    ({"transforms": "rf", "transforms.rf.type": f"{C}ReplaceField$Value", "transforms.rf.renames": "a:b",
      "iceberg.tables.route-field": "b"}, "iceberg.tables.route-field"),
    ({"transforms": "rf", "transforms.rf.type": f"{C}ReplaceField$Value", "transforms.rf.exclude": "a",
      "iceberg.tables.evolve-schema-enabled": "true"}, "iceberg.tables.evolve-schema-enabled"),
])
def test_value_transform_keys_are_checked_at_start(keys: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**keys)
    assert err.value.key == named


def test_insert_field_adds_the_records_position_and_a_constant_and_routes_on_its_topic() -> None:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    keys = {"transforms": "ins", "transforms.ins.type": f"{C}InsertField$Value",
            "transforms.ins.topic.field": "src!", "transforms.ins.offset.field": "pos",
            "transforms.ins.timestamp.field": "at?", "transforms.ins.static.field": "origin",
            "transforms.ins.static.value": "eu"}
    fmt = value_format(**keys)
    values = [b'{"id":"a"}', b'{"id":"b"}']
    created = fmt.table_schema(values)
    assert created is not None
    assert [(f.name, f.required) for f in created.fields] == [
        ("id", False), ("src", True), ("pos", False), ("at", False), ("origin", False)]
    msgs = [Msg(v, topic="orders", offset=7 + i, timestamp=1_000 * i) for i, v in enumerate(values)]
    out = fmt.convert(msgs, values, schema_to_pyarrow(created))
    rows = out.table.to_pylist()
    assert [(r["id"], r["src"], r["pos"], r["origin"]) for r in rows] == [("a", "orders", 7, "eu"), ("b", "orders", 8, "eu")]
    assert rows[1]["at"].timestamp() == 1.0
    r = Router(settings(**keys, **{"iceberg.tables.route-field": "src", "iceberg.tables.dynamic-enabled": "true"}))
    assert r.by_topic


@pytest.mark.parametrize(("keys", "named"), [
    ({"transforms.ins.static.field": "x"}, "transforms.ins.static.value"),
    ({"transforms.ins.timestamp.field": "t!"}, "transforms.ins.timestamp.field"),
    ({"transforms.ins.offset.field": "o", "iceberg.tables.route-field": "o"}, "iceberg.tables.route-field"),
])
def test_insert_field_keys_are_checked_at_start(keys: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**{"transforms": "ins", "transforms.ins.type": f"{C}InsertField$Value", **keys})
    assert err.value.key == named


def test_hoist_field_wraps_the_value_in_one_struct_column() -> None:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    fmt = value_format(**{"transforms": "h", "transforms.h.type": f"{C}HoistField$Value", "transforms.h.field": "row",
                          "iceberg.tables.kafka-metadata-enabled": "true"})
    values = [b'{"id":"a","n":1}', b'{"id":"b","n":null}']
    created = fmt.table_schema(values)
    assert created is not None
    assert created.fields[0].name == "row" and [f.name for f in created.fields[0].field_type.fields] == ["id", "n"]
    out = fmt.convert([Msg(v) for v in values], values, schema_to_pyarrow(created))
    assert out.table.column("row").to_pylist() == [{"id": "a", "n": 1}, {"id": "b", "n": None}]
    assert out.table.column("_kafka_metadata_topic").to_pylist() == ["orders", "orders"]
    with pytest.raises(ConfigError) as err:
        settings(**{"transforms": "h", "transforms.h.type": f"{C}HoistField$Value"})
    assert err.value.key == "transforms.h.field"
    with pytest.raises(ConfigError) as err:
        settings(**{"transforms": "h", "transforms.h.type": f"{C}HoistField$Value", "transforms.h.field": "row",
                    "iceberg.tables.route-field": "row.id"})
    assert err.value.key == "iceberg.tables.route-field"


# id-columns and cdc-field name the fields as the transforms leave them (issue 39 point 3) ---

_RENAMES = {"transforms": "names", "transforms.names.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
            "transforms.names.renames": "pk:id,kind:op", "transforms.names.exclude": "junk",
            "iceberg.tables.cdc-field": "op"}


@pytest.mark.parametrize("key, value, old", [
    ("iceberg.tables.default-id-columns", "pk", "pk"),
    ("iceberg.table.db.t.id-columns", "id,pk", "pk"),
    ("iceberg.tables.default-id-columns", "junk", "junk"),
    ("iceberg.tables.cdc-field", "kind", "kind"),
])
def test_key_and_operation_fields_renamed_or_dropped_by_replace_field_are_refused_naming_the_key(
        key: str, value: str, old: str) -> None:
    with pytest.raises(ConfigError) as err:
        build({"topics": "a", "iceberg.tables": "db.t", **_RENAMES, key: value})
    assert err.value.key == key
    assert f"{old!r}" in err.value.expected and "transforms.names" in err.value.expected


def test_key_and_operation_fields_by_their_names_after_the_transforms_start() -> None:
    s = build({"topics": "a", "iceberg.tables": "db.t", **_RENAMES, "iceberg.table.db.t.id-columns": "id"})
    assert s.id_columns("db.t") == ("id",)
    # renamed back by a later transform: the name is there again
    build({"topics": "a", "iceberg.tables": "db.t", **_RENAMES, "iceberg.tables.default-id-columns": "pk",
           "transforms": "names,copy", "transforms.copy.type": "org.apache.iceberg.connect.transforms.CopyValue",
           "transforms.copy.source.field": "id", "transforms.copy.target.field": "pk"})


@pytest.mark.parametrize("kind, props", [
    ("ReplaceField$Value", {"exclude": "a"}), ("HoistField$Value", {"field": "v"}),
    ("ValueToKey", {"fields": "a"}),
    ("CopyValue", {"source.field": "a", "target.field": "b"}),
])
def test_a_predicate_on_a_transform_that_runs_on_every_record_is_refused_by_its_key(kind, props) -> None:
    """The value steps run on every record of a batch: a predicate guarding one was accepted and
    then ignored (an exclude guarded by TopicNameMatches dropped the field of every topic)."""
    cls = f"org.apache.iceberg.connect.transforms.{kind}" if kind == "CopyValue" else f"{C}{kind}"
    raw = {"topics": "a", "iceberg.tables": "db.t", "transforms": "x", "transforms.x.type": cls,
           **{f"transforms.x.{k}": v for k, v in props.items()}, "transforms.x.predicate": "p", "predicates": "p",
           "predicates.p.type": f"{C}predicates.TopicNameMatches", "predicates.p.pattern": "a"}
    with pytest.raises(ConfigError) as err:
        build(raw)
    assert err.value.key == "transforms.x.predicate" and "Filter" in err.value.expected
