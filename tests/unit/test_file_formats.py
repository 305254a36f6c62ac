"""``write.format.default`` = orc (issue 39 point 1): accepted at start, Spark's ORC options from
``write.orc.compression-codec``, ORC files listed and committed as FileFormat.ORC with their
record counts; avro refused with the reason; ORC with mirror tables or column metrics refused
naming the key."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.orc as orc
import pytest
from pyiceberg.manifest import FileFormat

from icesink.shared.config import build
from icesink.shared.errors import ConfigError
from pyiceberg.typedef import Record

from spark_bridge.files import AVRO_SOURCE, file_format, list_data_files, read_data_files, spark_write_options

BASE = {"topics": "a", "iceberg.tables": "db.t"}


def refused(key: str, value: str, **extra: Any) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        build({**BASE, key: value, **extra})
    assert err.value.key == key, err.value
    return err.value


def test_orc_is_accepted_in_write_props_and_auto_create_props() -> None:
    s = build({**BASE, "iceberg.tables.write-props.write.format.default": "orc",
               "iceberg.tables.write-props.write.orc.compression-codec": "snappy",
               "iceberg.tables.auto-create-props.write.format.default": "ORC"})
    assert s.write_props["write.format.default"] == "orc"


def test_other_formats_and_codecs_are_refused_with_the_reason() -> None:
    err = refused("iceberg.tables.write-props.write.format.default", "csv")
    assert "avro" in err.expected
    refused("iceberg.tables.write-props.write.orc.compression-codec", "brotli")


def test_orc_with_mirror_tables_is_refused_naming_the_key_and_metrics_modes_act() -> None:
    err = refused("iceberg.tables.write-props.write.format.default", "orc",
                  **{"iceberg.tables.upsert-mode-enabled": "true", "iceberg.tables.default-id-columns": "id"})
    assert "mirror" in err.expected
    build({**BASE, "iceberg.tables.write-props.write.metadata.metrics.default": "full",  # ORC files have metrics now
           "iceberg.tables.write-props.write.format.default": "orc"})


def test_spark_options_follow_the_format() -> None:
    assert file_format({}) == FileFormat.PARQUET
    assert file_format({"write.format.default": "ORC"}) == FileFormat.ORC
    assert spark_write_options({"write.format.default": "orc"}) == ("orc", {"compression": "zlib"})
    assert spark_write_options({"write.format.default": "orc", "write.orc.compression-codec": "zstd"}) == (
        "orc", {"compression": "zstd"})
    fmt, options = spark_write_options({"write.parquet.compression-codec": "gzip"})
    assert (fmt, options["compression"]) == ("parquet", "gzip")
    with pytest.raises(ConfigError) as err:  # an existing table's own property
        spark_write_options({"write.format.default": "csv"})
    assert err.value.key == "write.format.default"


def test_orc_files_are_listed_and_read_as_orc_data_files(two_tables, tmp_path) -> None:
    table = two_tables.load_table("db.a")
    out = tmp_path / "out"
    out.mkdir()
    orc.write_table(pa.table({"id": pa.array(range(7), pa.int64())}), str(out / "part-0.zlib.orc"))
    fs = pafs.LocalFileSystem()
    assert [r for r, _ in list_data_files(fs, str(out))] == ["part-0.zlib.orc"]
    [data_file] = read_data_files(table, fs, str(out), "file:///x", [],
                                  properties={"write.format.default": "orc"})
    assert data_file.file_format == FileFormat.ORC
    assert data_file.record_count == 7
    assert data_file.file_size_in_bytes == (out / "part-0.zlib.orc").stat().st_size
    assert data_file.file_path == "file:///x/part-0.zlib.orc"


def test_compaction_of_an_orc_table_reads_with_pyiceberg_and_writes_through_the_writer(two_tables) -> None:
    from types import SimpleNamespace

    from spark_bridge.rewrite import _why_pyiceberg_reads

    table = two_tables.load_table("db.a")
    writer: Any = SimpleNamespace(session=SimpleNamespace(settings=SimpleNamespace(
        write_props={"write.format.default": "orc"})))
    why = _why_pyiceberg_reads(writer, table, [])
    assert why is not None and "ORC" in why


def test_a_mirror_table_whose_own_property_is_orc_is_refused(two_tables) -> None:
    from agents.tables import target_of

    table = two_tables.load_table("db.a")
    with table.transaction() as tx:
        tx.set_properties({"write.format.default": "orc"})
    s = build({"topics": "a", "iceberg.tables": "db.a", "iceberg.tables.upsert-mode-enabled": "true",
               "iceberg.tables.default-id-columns": "id"})
    with pytest.raises(ConfigError) as err:
        target_of("db.a", two_tables.load_table("db.a"), s)
    assert "write.format.default" in err.value.key
    assert "mirror" in err.value.expected


def test_an_orc_file_reported_over_the_control_topic_is_committed_as_orc(two_tables) -> None:
    from icesink.shared.iceberg import to_data_file
    from icesink.shared.protocol.events import FileInfo

    table = two_tables.load_table("db.a")
    orc_file = to_data_file(FileInfo(path="file:///w/d/part-0.snappy.orc", record_count=3, size_bytes=9, spec_id=0), table)
    assert orc_file.file_format == FileFormat.ORC
    parquet = to_data_file(FileInfo(path="file:///w/d/part-0.parquet", record_count=3, size_bytes=9, spec_id=0), table)
    assert parquet.file_format == FileFormat.PARQUET


def test_orc_of_a_table_with_a_timestamptz_column_is_refused_naming_it(tmp_path) -> None:
    from types import SimpleNamespace

    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StructType, TimestamptzType

    from spark_bridge.writer import _check_format

    schema = Schema(NestedField(1, "id", LongType(), required=False),
                    NestedField(2, "s", StructType(NestedField(3, "at", TimestamptzType(), required=False)),
                                required=False))
    table: Any = SimpleNamespace(name=lambda: ("db", "t"), schema=lambda: schema)
    with pytest.raises(ConfigError) as err:
        _check_format(table, "orc", None, None)
    assert err.value.key == "write.format.default"
    assert "s.at" in err.value.expected and "TIMESTAMP_INSTANT" in err.value.expected


# write.format.default=avro ------------------------------------------------------------------


def test_avro_takes_sparks_avro_file_format_with_icebergs_codec_names() -> None:
    assert file_format({"write.format.default": "AVRO"}) == FileFormat.AVRO
    assert spark_write_options({"write.format.default": "avro"}) == (AVRO_SOURCE, {"compression": "deflate"})
    for iceberg, spark in (("zstd", "zstandard"), ("snappy", "snappy"), ("uncompressed", "uncompressed"),
                           ("gzip", "deflate")):
        assert spark_write_options({"write.format.default": "avro", "write.avro.compression-codec": iceberg}) == (
            AVRO_SOURCE, {"compression": spark})
    with pytest.raises(ConfigError) as err:
        spark_write_options({"write.format.default": "avro", "write.avro.compression-codec": "lz4"})
    assert err.value.key == "write.avro.compression-codec"
    with pytest.raises(ConfigError) as err:  # a table's own level would be ignored by Spark's writer
        spark_write_options({"write.format.default": "avro", "write.avro.compression-level": "3"})
    assert err.value.key == "write.avro.compression-level"


def test_avro_with_mirror_tables_or_column_metrics_is_refused_naming_the_key() -> None:
    err = refused("iceberg.tables.write-props.write.format.default", "avro",
                  **{"iceberg.tables.upsert-mode-enabled": "true", "iceberg.tables.default-id-columns": "id"})
    assert "mirror" in err.expected
    err = refused("iceberg.tables.write-props.write.metadata.metrics.column.id", "counts",
                  **{"iceberg.tables.write-props.write.format.default": "avro"})
    assert "avro" in err.expected


def test_avro_files_are_listed_and_read_as_avro_data_files_with_their_block_counts(two_tables, tmp_path) -> None:
    import fastavro

    table = two_tables.load_table("db.a")
    out = tmp_path / "out"
    out.mkdir()
    schema = {"type": "record", "name": "r", "fields": [{"name": "id", "type": ["long", "null"]}]}
    with (out / "part-0.avro").open("wb") as f:  # several blocks, deflate: counted without decoding
        fastavro.writer(f, schema, ({"id": i} for i in range(2500)), codec="deflate", sync_interval=1000,
                        metadata={"k": "v" * 300})
    fs = pafs.LocalFileSystem()
    assert [r for r, _ in list_data_files(fs, str(out))] == ["part-0.avro"]
    [data_file] = read_data_files(table, fs, str(out), "file:///x", [], properties={"write.format.default": "avro"})
    assert data_file.file_format == FileFormat.AVRO
    assert data_file.record_count == 2500
    assert data_file.file_path == "file:///x/part-0.avro"


def test_an_avro_file_reported_over_the_control_topic_is_committed_as_avro(two_tables) -> None:
    from icesink.shared.iceberg import to_data_file
    from icesink.shared.protocol.events import FileInfo

    table = two_tables.load_table("db.a")
    avro_file = to_data_file(FileInfo(path="file:///w/d/part-0.deflate.avro", record_count=3, size_bytes=9, spec_id=0),
                             table)
    assert avro_file.file_format == FileFormat.AVRO


def test_compaction_leaves_avro_data_files_alone(two_tables, caplog) -> None:
    from pyiceberg.manifest import DataFile, DataFileContent

    from coordinator import maintenance

    caplog.set_level("INFO", logger=maintenance.__name__)
    table = two_tables.load_table("db.a")
    files = []
    for i, fmt in enumerate((FileFormat.AVRO, FileFormat.PARQUET, FileFormat.AVRO)):
        f = DataFile.from_args(content=DataFileContent.DATA, file_path=f"file:///x/{i}.{fmt.name.lower()}",
                               file_format=fmt, partition=Record(), record_count=1, file_size_in_bytes=10)
        f.spec_id = 0
        files.append(f)
    assert maintenance.compactable(".".join(table.name()), files) == [files[1]]
    assert "leaves its Avro data files alone" in caplog.text


def test_a_mirror_table_whose_own_property_is_avro_is_refused(two_tables) -> None:
    from agents.tables import target_of

    table = two_tables.load_table("db.a")
    with table.transaction() as tx:
        tx.set_properties({"write.format.default": "avro"})
    s = build({"topics": "a", "iceberg.tables": "db.a", "iceberg.tables.upsert-mode-enabled": "true",
               "iceberg.tables.default-id-columns": "id"})
    with pytest.raises(ConfigError) as err:
        target_of("db.a", two_tables.load_table("db.a"), s)
    assert "mirror" in err.value.expected


def test_avro_of_a_table_with_a_map_of_non_string_keys_is_refused_naming_it() -> None:
    from types import SimpleNamespace

    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, MapType, NestedField, StringType

    from spark_bridge.writer import _check_format

    schema = Schema(NestedField(1, "id", LongType(), required=False),
                    NestedField(2, "m", MapType(3, LongType(), 4, StringType()), required=False))
    table: Any = SimpleNamespace(name=lambda: ("db", "t"), schema=lambda: schema)
    with pytest.raises(ConfigError) as err:
        _check_format(table, "avro", None, None)
    assert err.value.key == "write.format.default"
    assert "'m'" in err.value.expected


def test_the_avro_schema_spark_writes_is_icebergs_with_every_field_id() -> None:
    import json

    import fastavro
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        DecimalType, ListType, LongType, MapType, NestedField, StringType, StructType, TimestampType, TimestamptzType,
    )

    from spark_bridge.avro import avro_schema, avro_unwritable

    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "a", DecimalType(9, 2), required=False), NestedField(3, "b", DecimalType(9, 2), required=False),
        NestedField(4, "at", TimestampType(), required=False), NestedField(5, "tz", TimestamptzType(), required=False),
        NestedField(6, "l", ListType(7, StringType(), element_required=False), required=False),
        NestedField(8, "m", MapType(9, StringType(), 10, LongType(), value_required=True), required=False),
        NestedField(11, "s", StructType(NestedField(12, "x", LongType(), required=False)), required=True),
    )
    assert avro_unwritable(schema) is None
    text = avro_schema(schema)
    fastavro.parse_schema(json.loads(text))  # one definition per named type (decimal_9_2 twice)
    fields = {f["name"]: f for f in json.loads(text)["fields"]}
    assert fields["id"] == {"name": "id", "type": "long", "field-id": 1}
    assert fields["a"]["type"][1] == {"type": "fixed", "name": "decimal_9_2", "size": 4, "logicalType": "decimal",
                                      "precision": 9, "scale": 2}
    assert fields["b"]["type"] == ["null", "decimal_9_2"]
    assert fields["at"]["type"][1]["adjust-to-utc"] is False and fields["tz"]["type"][1]["adjust-to-utc"] is True
    assert fields["l"]["type"][1] == {"type": "array", "items": ["null", "string"], "element-id": 7}
    assert fields["m"]["type"][1] == {"type": "map", "values": "long", "key-id": 9, "value-id": 10}
    assert fields["s"]["type"]["name"] == "r11" and fields["s"]["type"]["fields"][0]["field-id"] == 12


# ORC column metrics (issue 39 point 2) -------------------------------------------------------


def test_orc_files_get_column_metrics_from_their_footer_statistics(tmp_path) -> None:
    import datetime as dt
    from decimal import Decimal

    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.conversions import from_bytes
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BooleanType, DateType, DecimalType, DoubleType, ListType, LongType, NestedField, StringType, StructType,
    )

    schema = Schema(
        NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(), required=False),
        NestedField(3, "d", DateType(), required=False), NestedField(4, "flag", BooleanType(), required=False),
        NestedField(5, "dec", DecimalType(9, 2), required=False), NestedField(6, "x", DoubleType(), required=False),
        NestedField(7, "s", StructType(NestedField(8, "n", LongType(), required=False)), required=False),
        NestedField(9, "l", ListType(10, LongType(), element_required=False), required=False),
    )
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    table = catalog.create_table("db.o", schema=schema)
    rows = pa.table({
        "id": pa.array([5, None, -3, 12], pa.int64()),
        "name": pa.array(["pear", "apple", None, "a" * 40]),
        "d": pa.array([dt.date(2024, 1, 2), dt.date(2023, 5, 6), None, None]),
        "flag": pa.array([True, True, None, True]),
        "dec": pa.array([Decimal("1.25"), Decimal("-7.50"), None, Decimal("3.00")], pa.decimal128(9, 2)),
        "x": pa.array([1.5, None, 2.5, 0.5]),
        "s": pa.array([{"n": 4}, None, {"n": 9}, {"n": None}], pa.struct([("n", pa.int64())])),
        "l": pa.array([[1, 2], [], None, [3]], pa.list_(pa.int64())),
    })
    out = tmp_path / "out"
    out.mkdir()
    orc.write_table(rows, str(out / "part-0.orc"))
    fs = pafs.LocalFileSystem()
    [f] = read_data_files(table, fs, str(out), "file:///x", [], properties={"write.format.default": "orc"})

    fields = table.schema()  # pyiceberg numbers the columns afresh: s.n is 9
    ids = {name: fields.find_field(name).field_id for name in ("id", "name", "d", "flag", "dec", "x", "s.n")}

    def by_name(which: dict[int, Any], decode: bool = False) -> dict[str, Any]:
        return {n: from_bytes(fields.find_type(i), which[i]) if decode else which[i]  # type: ignore[arg-type]
                for n, i in ids.items() if i in which}

    days = (dt.date(2023, 5, 6) - dt.date(1970, 1, 1)).days, (dt.date(2024, 1, 2) - dt.date(1970, 1, 1)).days
    assert f.record_count == 4
    assert by_name(f.null_value_counts) == {"id": 1, "name": 1, "d": 2, "flag": 1, "dec": 1, "x": 1, "s.n": 2}
    assert by_name(f.value_counts) == dict.fromkeys(ids, 4)
    assert set(f.value_counts) == set(ids.values())  # nothing for the list's elements
    assert by_name(f.lower_bounds, True) == {"id": -3, "name": "a" * 16, "d": days[0], "flag": True,
                                             "dec": Decimal("-7.50")}  # s.n: counts (pyiceberg's plan, as Parquet's)
    assert by_name(f.upper_bounds, True) == {"id": 12, "name": "pear", "d": days[1], "flag": True,
                                             "dec": Decimal("3.00")}
    # the table's metrics modes act: counts only for name, none for id; strings truncated to 16 by default
    with table.transaction() as tx:
        tx.set_properties({"write.metadata.metrics.column.name": "counts", "write.metadata.metrics.column.id": "none"})
    [f] = read_data_files(catalog.load_table("db.o"), fs, str(out), "file:///x", [],
                          properties={"write.format.default": "orc", "write.metadata.metrics.column.name": "counts",
                                      "write.metadata.metrics.column.id": "none"})
    assert ids["id"] not in f.value_counts and ids["id"] not in f.lower_bounds
    assert f.value_counts[ids["name"]] == 4 and ids["name"] not in f.lower_bounds | f.upper_bounds
