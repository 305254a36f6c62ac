"""Kafka Connect's Cast$Value and TimestampConverter$Value on decoded Arrow columns, and the
$Key transforms and ValueToKey where no key column lands (docs/transforms.md)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from agents.transforms.cast import cast_text, java_double
from icesink.shared.config import Settings, build
from icesink.shared.errors import ConfigError

from tests.unit.test_transforms import Msg  # a consumed record as the decoders read it

C = "org.apache.kafka.connect.transforms."


def settings(**keys: str) -> Settings:
    return build({"topics": "orders", "iceberg.tables": "db.t", **keys})


def run(values: list[bytes], **keys: str) -> Any:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from agents.formats import RecordFormat

    fmt = RecordFormat(settings(**keys))
    created = fmt.table_schema(values)
    assert created is not None
    target = created if isinstance(created, pa.Schema) else schema_to_pyarrow(created, include_field_ids=False)
    return target, fmt.convert([Msg(v, offset=i) for i, v in enumerate(values)], values, target)


TEXTS = pa.array(["1", "300", "-1.9", "1e3", "true", "false", "abc", '{"x":1}', None, "TRUE", " 2.5f ", "NaN"])


@pytest.mark.parametrize(("to", "values", "bad"), [
    # Number.byteValue() wraps a Long; a Double is truncated then narrowed; booleans are 1/0
    ("int8", [1, 44, -1, -24, 1, 0, None, None, None, None, None, None], [6, 7, 9, 10, 11]),
    ("int64", [1, 300, -1, 1000, 1, 0, None, None, None, None, None, None], [6, 7, 9, 10, 11]),
    # Float.parseFloat takes Java's spellings (spaces, a d/f suffix, NaN)
    ("float64", [1.0, 300.0, -1.9, 1000.0, 1.0, 0.0, None, None, None, None, 2.5, "nan"], [6, 7, 9]),
    # Number.longValue() != 0; Boolean.parseBoolean: 'true' in any case, anything else false
    ("boolean", [True, True, True, True, True, False, False, None, None, True, False, False], [7]),
    # a Double as Double.toString writes it
    ("string", ["1", "300", "-1.9", "1000.0", "true", "false", "abc", None, None, "TRUE", " 2.5f ", "NaN"], [7]),
])
def test_cast_acts_as_connects_cast_on_each_kind_of_json_value(to: str, values: list[Any], bad: list[int]) -> None:
    out, failed = cast_text(TEXTS, to)
    got = ["nan" if isinstance(v, float) and v != v else v for v in out.to_pylist()]
    assert got == values
    assert [i for i, b in enumerate(failed) if b] == bad


def test_doubles_saturate_as_javas_narrowing_casts() -> None:
    texts = pa.array(["1e300", "-1e300", "9.9e18", "3e9", "-2.5"])
    assert cast_text(texts, "int64")[0].to_pylist() == [2**63 - 1, -2**63, 2**63 - 1, 3_000_000_000, -2]
    assert cast_text(texts, "int32")[0].to_pylist() == [2**31 - 1, -2**31, 2**31 - 1, 2**31 - 1, -2]
    assert cast_text(texts, "int16")[0].to_pylist() == [-1, 0, -1, -1, -2]  # (short) (int) d


def test_doubles_are_written_as_javas_double_to_string() -> None:
    assert [java_double(x) for x in (1e7, 1.5e-5, 123.0, -1e21, 0.001, 9999999.5, -0.0)] == [
        "1.0E7", "1.5E-5", "123.0", "-1.0E21", "0.001", "9999999.5", "-0.0"]


def test_cast_value_shapes_the_created_table_and_dead_letters_what_cannot_be_cast() -> None:
    values = [b'{"id":"a","n":"7","amt":2.75,"ok":1}', b'{"id":"b","n":"x","amt":1,"ok":0}',
              b'{"id":"c","n":null,"amt":-3.5,"ok":2}']
    target, out = run(values, **{"transforms": "c", "transforms.c.type": f"{C}Cast$Value",
                                 "transforms.c.spec": "n:int32, amt:int64,ok:boolean"})
    assert [(f.name, f.type) for f in target] == [
        ("id", pa.large_string()), ("n", pa.int32()), ("amt", pa.int64()), ("ok", pa.bool_())]
    assert out.table.to_pylist() == [{"id": "a", "n": 7, "amt": 2, "ok": True},
                                     {"id": "c", "n": None, "amt": -3, "ok": True}]
    assert out.indices.to_pylist() == [0, 2]
    [reject] = out.rejects
    assert (reject.index, reject.field) == (1, "n")
    assert "value (x) cannot be cast to int32" in reject.reason


def test_a_chain_renames_then_casts_then_converts_a_timestamp() -> None:
    values = [b'{"id":1,"t":"2024-02-03 04:05:06","u":1700000000}', b'{"id":2,"t":"yesterday","u":5}',
              b'{"id":3,"t":null,"u":-1}']
    target, out = run(values, **{
        "transforms": "r,c,ts,tu",
        "transforms.r.type": f"{C}ReplaceField$Value", "transforms.r.renames": "id:key",
        "transforms.c.type": f"{C}Cast$Value", "transforms.c.spec": "key:string",
        "transforms.ts.type": f"{C}TimestampConverter$Value", "transforms.ts.field": "t",
        "transforms.ts.target.type": "Date", "transforms.ts.format": "yyyy-MM-dd HH:mm:ss",
        "transforms.tu.type": f"{C}TimestampConverter$Value", "transforms.tu.field": "u",
        "transforms.tu.target.type": "string", "transforms.tu.format": "yyyy-MM-dd'T'HH:mm:ss'Z'",
        "transforms.tu.unix.precision": "seconds"})
    assert [(f.name, str(f.type)) for f in target] == [("key", "large_string"), ("t", "date32[day]"),
                                                         ("u", "large_string")]
    rows = out.table.to_pylist()
    assert [(r["key"], str(r["t"]), r["u"]) for r in rows] == [
        ("1", "2024-02-03", "2023-11-14T22:13:20Z"), ("3", "None", "1969-12-31T23:59:59Z")]
    [reject] = out.rejects
    assert (reject.index, reject.field) == (1, "t") and "does not match pattern" in reject.reason


@pytest.mark.parametrize(("target", "precision", "raw", "want"), [
    ("unix", "microseconds", b'"2024-01-01 00:00:01"', 1704067201000000),
    ("Timestamp", "nanoseconds", b"1500999999", "1970-01-01 00:00:01.500000+00:00"),  # through ms, truncated
    ("Time", "milliseconds", b"90061001", "01:01:01.001000"),
])
def test_timestamp_converter_reads_unix_times_and_strings_as_connect(target: str, precision: str, raw: bytes,
                                                                     want: Any) -> None:
    _, out = run([b'{"t":' + raw + b"}"], **{
        "transforms": "ts", "transforms.ts.type": f"{C}TimestampConverter$Value", "transforms.ts.field": "t",
        "transforms.ts.target.type": target, "transforms.ts.format": "yyyy-MM-dd HH:mm:ss",
        "transforms.ts.unix.precision": precision})
    [got] = out.table.column("t").to_pylist()
    assert (got if isinstance(got, int) else str(got)) == want


@pytest.mark.parametrize(("keys", "named"), [
    ({"transforms.x.type": f"{C}Cast$Value", "transforms.x.spec": "a:int128"}, "transforms.x.spec"),
    ({"transforms.x.type": f"{C}Cast$Value", "transforms.x.spec": "int32,a:int8"}, "transforms.x.spec"),
    ({"transforms.x.type": f"{C}Cast$Value", "transforms.x.spec": "int32"}, "transforms.x.spec"),
    ({"transforms.x.type": f"{C}Cast$Value", "transforms.x.spec": "a:int8", "transforms.x.replace.null.with.default": "1"},
     "transforms.x.replace.null.with.default"),
    ({"transforms.x.type": f"{C}Cast$Value", "transforms.x.spec": "a:int8",
      "value.converter": "org.apache.kafka.connect.storage.StringConverter"}, "transforms.x.type"),
    ({"transforms.x.type": f"{C}Cast$Value", "transforms.x.spec": "a:int8",
      "iceberg.tables.evolve-schema-enabled": "true"}, "iceberg.tables.evolve-schema-enabled"),
    ({"transforms.x.type": f"{C}TimestampConverter$Value", "transforms.x.field": "t"}, "transforms.x.target.type"),
    ({"transforms.x.type": f"{C}TimestampConverter$Value", "transforms.x.field": "t",
      "transforms.x.target.type": "string"}, "transforms.x.format"),
    ({"transforms.x.type": f"{C}TimestampConverter$Value", "transforms.x.field": "t",
      "transforms.x.target.type": "Timestamp", "transforms.x.format": "yyyy-MM-dd HH:mm:ss.SSS"}, "transforms.x.format"),
    ({"transforms.x.type": f"{C}TimestampConverter$Value", "transforms.x.field": "t",
      "transforms.x.target.type": "timestamp"}, "transforms.x.target.type"),
    ({"transforms.x.type": f"{C}TimestampConverter$Value", "transforms.x.target.type": "unix"}, "transforms.x.field"),
    ({"transforms.x.type": f"{C}TimestampConverter$Value", "transforms.x.field": "t", "transforms.x.target.type": "unix",
      "transforms.x.unix.precision": "days"}, "transforms.x.unix.precision"),
    ({"transforms.x.type": f"{C}Cast$Value", "transforms.x.spec": "a:int8", "transforms.x.predicate": "p",
      "predicates": "p", "predicates.p.type": f"{C}predicates.RecordIsTombstone"}, "transforms.x.predicate"),
    ({"transforms.x.type": f"{C}ValueToKey"}, "transforms.x.fields"),
    ({"transforms.x.type": f"{C}ValueToKey", "transforms.x.fields": "id", "iceberg.tables.key-column": "k",
      "value.converter": "org.apache.kafka.connect.storage.StringConverter"}, "transforms.x.type"),
    ({"transforms": "x,y", "transforms.x.type": f"{C}ValueToKey", "transforms.x.fields": "a,t",
      "iceberg.tables.key-column": "k", "transforms.y.type": f"{C}TimestampConverter$Value", "transforms.y.field": "t",
      "transforms.y.target.type": "unix"}, "transforms.y.type"),
    ({"transforms.x.type": f"{C}Cast$Key", "transforms.x.spec": "id:int64", "iceberg.tables.key-column": "k"},
     "transforms.x.type"),  # the key column is the key's text: no struct to cast fields of
    ({"transforms.x.type": f"{C}ReplaceField$Key", "transforms.x.renames": "a:b", "iceberg.tables.key-column": "k"},
     "transforms.x.type"),
    ({"transforms.x.type": f"{C}InsertField$Key", "transforms.x.topic.field": "t", "iceberg.tables.key-column": "k"},
     "transforms.x.type"),  # no struct key to add a field to
    ({"transforms": "r,h,x", "transforms.r.type": f"{C}RegexRouter", "transforms.r.regex": "a", "transforms.r.replacement": "b",
      "transforms.h.type": f"{C}HoistField$Key", "transforms.h.field": "f",
      "transforms.x.type": f"{C}InsertField$Key", "transforms.x.topic.field": "t", "iceberg.tables.key-column": "k"},
     "transforms"),
    ({"transforms.x.type": f"{C}TimestampConverter$Key", "transforms.x.target.type": "unix", "transforms.x.field": "t",
      "iceberg.tables.key-column": "k"}, "transforms.x.type"),  # no struct key to take a field of
    ({"transforms": "h,x", "transforms.h.type": f"{C}HoistField$Key", "transforms.h.field": "f",
      "transforms.x.type": f"{C}TimestampConverter$Key", "transforms.x.target.type": "unix",
      "iceberg.tables.key-column": "k"}, "transforms.x.field"),  # Connect fails a whole struct
    ({"transforms": "h,x", "transforms.h.type": f"{C}HoistField$Key", "transforms.h.field": "f",
      "transforms.x.type": f"{C}Cast$Key", "transforms.x.spec": "int64", "iceberg.tables.key-column": "k"},
     "transforms.x.spec"),  # Connect fails a whole struct cast
    ({"transforms.x.type": f"{C}Cast$Key", "transforms.x.spec": "id:int8", "iceberg.tables.key-column": "k",
      "key.converter": "io.confluent.connect.avro.AvroConverter", "key.converter.schema.registry.url": "http://127.0.0.1:1"},
     "transforms.x.type"),
    ({"transforms.x.type": f"{C}Cast$Key", "transforms.x.spec": "int64", "iceberg.tables.key-column": "k",
      "transforms.x.predicate": "p", "predicates": "p", "predicates.p.type": f"{C}predicates.RecordIsTombstone"},
     "transforms.x.predicate"),
    ({"transforms.x.type": f"{C}Cast$Key", "transforms.x.spec": "int65"}, "transforms.x.spec"),
    ({"transforms.x.type": f"{C}HoistField$Key"}, "transforms.x.field"),
])
def test_conversion_and_key_transform_keys_are_checked_at_start(keys: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**{"transforms": "x", **keys})
    assert err.value.key == named


def test_key_transforms_start_where_no_key_lands_and_change_no_row() -> None:
    keys = {"transforms": "v,c,h,r,i,t",
            "transforms.v.type": f"{C}ValueToKey", "transforms.v.fields": "id",
            "transforms.c.type": f"{C}Cast$Key", "transforms.c.spec": "id:string",
            "transforms.h.type": f"{C}HoistField$Key", "transforms.h.field": "k",
            "transforms.r.type": f"{C}ReplaceField$Key", "transforms.r.renames": "k:key",
            "transforms.i.type": f"{C}InsertField$Key", "transforms.i.topic.field": "t",
            "transforms.t.type": f"{C}TimestampConverter$Key", "transforms.t.target.type": "unix"}
    values = [b'{"id":1}']
    _, out = run(values, **keys)
    assert out.table.to_pylist() == [{"id": 1}]


def test_value_to_key_makes_the_key_column_a_struct_of_value_fields_as_the_value_is_at_its_step() -> None:
    keys = {"transforms": "c,v,r", "iceberg.tables.key-column": "_key",
            "transforms.c.type": f"{C}Cast$Value", "transforms.c.spec": "id:string",
            "transforms.v.type": f"{C}ValueToKey", "transforms.v.fields": "id,region",
            "transforms.r.type": f"{C}ReplaceField$Value", "transforms.r.exclude": "region"}
    values = [b'{"id":1,"region":"eu","n":5}', b'{"id":2,"n":6}', b'{"id":{"x":1},"region":"us","n":7}']
    target, out = run(values, **keys)
    assert target.names == ["id", "n", "_key"]
    assert target.field("_key").type == pa.struct([pa.field("id", pa.large_string()),
                                                   pa.field("region", pa.large_string())])
    assert out.table.to_pylist() == [{"id": "1", "n": 5, "_key": {"id": "1", "region": "eu"}},
                                     {"id": "2", "n": 6, "_key": {"id": "2", "region": None}}]
    assert [r.index for r in out.rejects] == [2]  # Cast failed it first
    plain = pa.schema([("id", pa.string()), ("n", pa.int64()), ("_key", pa.string())])
    from agents.formats import RecordFormat
    with pytest.raises(ConfigError) as err:
        RecordFormat(settings(**keys)).convert([Msg(values[0])], values[:1], plain)
    assert err.value.key == "iceberg.tables.key-column"


def test_key_transforms_after_value_to_key_rename_drop_cast_and_hoist_its_struct() -> None:
    keys = {"transforms": "v,r,c,h", "iceberg.tables.key-column": "_key",
            "transforms.v.type": f"{C}ValueToKey", "transforms.v.fields": "id,region,n",
            "transforms.r.type": f"{C}ReplaceField$Key", "transforms.r.exclude": "region",
            "transforms.r.renames": "id:order_id",
            "transforms.c.type": f"{C}Cast$Key", "transforms.c.spec": "n:string",
            "transforms.h.type": f"{C}HoistField$Key", "transforms.h.field": "k"}
    values = [b'{"id":1,"region":"eu","n":5}', b'{"id":2,"n":6.5}']
    target, out = run(values, **keys)
    assert target.names == ["id", "region", "n", "_key"]
    assert target.field("_key").type == pa.struct([pa.field("k", pa.struct([
        pa.field("order_id", pa.int64()), pa.field("n", pa.large_string())]))])
    assert [r["_key"] for r in out.table.to_pylist()] == [{"k": {"order_id": 1, "n": "5"}},
                                                          {"k": {"order_id": 2, "n": "6.5"}}]


def test_hoist_then_cast_key_fields_and_a_whole_key_cast_of_the_key_text() -> None:
    keys = {"transforms": "c,h,r", "iceberg.tables.key-column": "_key",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "transforms.c.type": f"{C}Cast$Key", "transforms.c.spec": "int64",
            "transforms.h.type": f"{C}HoistField$Key", "transforms.h.field": "id",
            "transforms.r.type": f"{C}ReplaceField$Key", "transforms.r.renames": "id:order_id"}
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from agents.formats import RecordFormat
    fmt = RecordFormat(settings(**keys))
    values = [b'{"a":1}', b'{"a":2}', b'{"a":3}', b'{"a":4}']
    created = fmt.table_schema(values)
    target = schema_to_pyarrow(created, include_field_ids=False)
    assert target.field("_key").type == pa.struct([pa.field("order_id", pa.int64())])
    msgs = [Msg(v, offset=i, key=k) for i, (v, k) in enumerate(zip(values, [b"42", b"abc", None, b"-7"], strict=True))]
    out = fmt.convert(msgs, values, target)
    assert out.table.to_pylist() == [{"a": 1, "_key": {"order_id": 42}}, {"a": 3, "_key": {"order_id": None}},
                                     {"a": 4, "_key": {"order_id": -7}}]
    assert [(r.index, r.field) for r in out.rejects] == [(1, "_key")]
    assert "cannot be cast to int64" in out.rejects[0].reason
    plain = pa.schema([("a", pa.int64()), ("_key", pa.string())])
    with pytest.raises(ConfigError) as err:
        fmt.convert(msgs[:1], values[:1], plain)  # a text key column cannot hold the hoisted key
    assert err.value.key == "iceberg.tables.key-column"


def test_cast_key_of_a_value_to_key_field_that_is_a_struct_fails_its_record_as_connect() -> None:
    keys = {"transforms": "v,c", "iceberg.tables.key-column": "_key",
            "transforms.v.type": f"{C}ValueToKey", "transforms.v.fields": "id,o",
            "transforms.c.type": f"{C}Cast$Key", "transforms.c.spec": "id:int32,o:string"}
    values = [b'{"id":1.5,"o":{"x":1}}', b'{"id":7}']
    _, out = run(values, **keys)
    assert [r["_key"] for r in out.table.to_pylist()] == [{"id": 7, "o": None}]
    assert [(r.index, r.field) for r in out.rejects] == [(0, "_key.o")]


def test_timestamp_converter_key_converts_the_whole_key_text_or_a_field_of_value_to_keys_struct() -> None:
    import datetime as dt

    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from agents.formats import RecordFormat
    keys = {"transforms": "t,h", "iceberg.tables.key-column": "_key",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "transforms.t.type": f"{C}TimestampConverter$Key", "transforms.t.target.type": "Timestamp",
            "transforms.t.unix.precision": "seconds",
            "transforms.h.type": f"{C}HoistField$Key", "transforms.h.field": "at"}
    fmt = RecordFormat(settings(**keys))
    values = [b'{"a":1}', b'{"a":2}']
    target = schema_to_pyarrow(fmt.table_schema(values), include_field_ids=False)
    assert target.field("_key").type == pa.struct([pa.field("at", pa.timestamp("us", tz="UTC"))])
    out = fmt.convert([Msg(v, offset=i, key=k) for i, (v, k) in enumerate(zip(values, [b"1700000000", b"soon"]))],
                      values, target)
    assert out.table.to_pylist() == [{"a": 1, "_key": {"at": dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)}}]
    assert [(r.index, r.field) for r in out.rejects] == [(1, "_key")]

    keys = {"transforms": "v,t", "iceberg.tables.key-column": "_key",
            "transforms.v.type": f"{C}ValueToKey", "transforms.v.fields": "id,day",
            "transforms.t.type": f"{C}TimestampConverter$Key", "transforms.t.field": "day",
            "transforms.t.target.type": "Date", "transforms.t.unix.precision": "seconds"}
    target, out = run([b'{"id":1,"day":1700000000}', b'{"id":2,"day":true}'], **keys)
    assert target.field("_key").type == pa.struct([pa.field("id", pa.int64()), pa.field("day", pa.date32())])
    assert [r["_key"] for r in out.table.to_pylist()] == [{"id": 1, "day": dt.date(2023, 11, 14)}]
    assert [(r.index, r.field) for r in out.rejects] == [(1, "_key.day")]


def test_insert_field_key_adds_the_records_metadata_and_a_static_value_to_a_struct_key() -> None:
    import datetime as dt

    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from agents.formats import RecordFormat
    keys = {"transforms": "h,i", "iceberg.tables.key-column": "_key",
            "transforms.h.type": f"{C}HoistField$Key", "transforms.h.field": "k",
            "transforms.i.type": f"{C}InsertField$Key", "transforms.i.topic.field": "t!",
            "transforms.i.partition.field": "p", "transforms.i.offset.field": "o",
            "transforms.i.timestamp.field": "ts", "transforms.i.static.field": "s", "transforms.i.static.value": "v"}
    fmt = RecordFormat(settings(**keys))
    values = [b'{"a":1}', b'{"a":2}']
    target = schema_to_pyarrow(fmt.table_schema(values), include_field_ids=False)
    assert [(f.name, str(f.type)) for f in target.field("_key").type] == [
        ("k", "large_string"), ("t", "large_string"), ("p", "int32"), ("o", "int64"),
        ("ts", "timestamp[us, tz=UTC]"), ("s", "large_string")]
    msgs = [Msg(values[0], offset=7, key=b"x", partition=3, timestamp=1_700_000_000_000),
            Msg(values[1], offset=8, key=None, partition=3, timestamp=None)]
    out = fmt.convert(msgs, values, target)
    assert [r["_key"] for r in out.table.to_pylist()] == [
        {"k": "x", "t": "orders", "p": 3, "o": 7, "ts": dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC), "s": "v"},
        {"k": None, "t": "orders", "p": 3, "o": 8, "ts": None, "s": "v"}]
