"""String and bytes values (issue 36 point 6): ``value.converter`` = StringConverter or
ByteArrayConverter puts each record's value in one column (``iceberg.tables.value-column``,
``value`` by default), with the key and metadata columns as for JSON values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import BinaryType, StringType

from agents.formats import RecordFormat
from icesink.shared.config import Settings, build
from icesink.shared.errors import ConfigError

STRING = "org.apache.kafka.connect.storage.StringConverter"
BYTES = "org.apache.kafka.connect.converters.ByteArrayConverter"


@dataclass
class Msg:
    value: bytes
    key: bytes | None = None
    topic: str = "t"
    partition: int = 0
    offset: int = 0
    timestamp: int | None = 1_700_000_000_000
    headers: list[Any] = field(default_factory=list)


def settings(converter: str, **extra: str) -> Settings:
    return build({"topics": "t", "iceberg.tables": "db.t", "value.converter": converter, **extra})


def convert(fmt: RecordFormat, values: list[bytes], keys: list[bytes | None] | None = None) -> Any:
    table = fmt.table_schema(values)  # with the key and metadata columns
    assert isinstance(table, Schema)
    schema = schema_to_pyarrow(table)
    msgs = [Msg(v, None if keys is None else keys[i], offset=i) for i, v in enumerate(values)]
    return fmt.convert(msgs, values, schema)


def test_string_values_fill_one_string_column_and_non_utf8_ones_are_rejects_naming_it() -> None:
    fmt = RecordFormat(settings(STRING))
    schema = fmt.table_schema([b"a"])
    assert isinstance(schema, Schema)
    [col] = schema.fields
    assert (col.name, col.field_type, col.required) == ("value", StringType(), False)
    values = [b"plain text", b'{"not": "parsed"}', b"caf\xc3\xa9", b"bad \xff byte", b"", b"last"]
    out = convert(fmt, values)
    assert out.table.column("value").to_pylist() == ["plain text", '{"not": "parsed"}', "café", "", "last"]
    assert out.indices.to_pylist() == [0, 1, 2, 4, 5]
    [reject] = out.rejects
    assert (reject.index, reject.field) == (3, "value")
    assert "not UTF-8" in reject.reason and "byte 4" in reject.reason


def test_bytes_values_fill_one_binary_column_byte_for_byte() -> None:
    fmt = RecordFormat(settings(BYTES, **{"iceberg.tables.value-column": "payload",
                                          "iceberg.tables.key-column": "_key"}))
    schema = fmt.table_schema([b"x"])
    assert isinstance(schema, Schema)
    assert [(f.name, f.field_type) for f in schema.fields] == [
        ("payload", BinaryType()), ("_key", StringType())]
    values = [b"\x00\xff\xfe", b"text", b""]
    out = convert(fmt, values, keys=[b"k0", None, b"k2"])
    assert out.table.column("payload").to_pylist() == values
    assert out.table.column("_key").to_pylist() == ["k0", None, "k2"]
    assert not out.rejects


def test_an_existing_table_with_more_columns_gets_nulls_there_and_a_binary_column_takes_text() -> None:
    fmt = RecordFormat(settings(STRING))
    target = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.binary())])
    out = fmt.convert([Msg(b"a"), Msg(b"b")], [b"a", b"b"], target)
    assert out.table.schema == target
    assert out.table.to_pydict() == {"id": [None, None], "value": [b"a", b"b"]}


def test_a_table_without_the_value_column_stops_the_replica_naming_the_setting() -> None:
    fmt = RecordFormat(settings(STRING))
    with pytest.raises(ConfigError, match="iceberg.tables.value-column"):
        fmt.convert([Msg(b"a")], [b"a"], pa.schema([pa.field("id", pa.int64())]))
    with pytest.raises(ConfigError, match="iceberg.tables.value-column"):
        fmt.convert([Msg(b"a")], [b"a"], pa.schema([pa.field("value", pa.int64())]))
    required = pa.schema([pa.field("value", pa.string()), pa.field("id", pa.int64(), nullable=False)])
    with pytest.raises(ConfigError, match="'id'"):
        fmt.convert([Msg(b"a")], [b"a"], required)


@pytest.mark.parametrize(("key", "value"), [
    ("iceberg.tables.route-field", "type"),
    ("iceberg.tables.cdc-field", "op"),
    ("iceberg.tables.timestamp-fields", "ts"),
    ("iceberg.tables.value-column", "_key"),
    ("value.converter.schemas.enable", "true"),
])
def test_settings_that_name_fields_of_a_json_value_are_refused_with_raw_values(key: str, value: str) -> None:
    extra = {key: value, "iceberg.tables.key-column": "_key"}
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        settings(STRING, **extra)


def test_the_debezium_transform_is_refused_with_raw_values() -> None:
    with pytest.raises(ConfigError, match="transforms"):
        settings(BYTES, transforms="dbz", **{"transforms.dbz.type": "org.apache.iceberg.connect.transforms.DebeziumTransform"})


def test_json_values_keep_their_format_and_an_unknown_converter_is_still_refused() -> None:
    assert settings("org.apache.kafka.connect.json.JsonConverter").value_column == "value"
    with pytest.raises(ConfigError, match="value.converter"):
        settings("com.example.OtherConverter")
