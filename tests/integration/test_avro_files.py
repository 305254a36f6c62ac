"""``write.format.default=avro`` in a real worker process (Tansu, Faust, Spark, a SQL catalog): the
auto-created table's data files are Avro (Spark's built-in AvroFileFormat, with Iceberg's default
codec gzip as Avro's deflate, and Iceberg's own Avro schema with every field id), committed as AVRO
with their record counts; fastavro decodes each file and Spark with the Iceberg runtime reads every
row back exactly, struct, list and map columns and both timestamps included. pyiceberg's scan refuses
Avro data files and DuckDB reads none: neither is asked."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.integration

TOPIC = "avrofiles"
TABLE = "avro.events"
GROUP = "avro-sink"
N = 3000


def test_a_worker_writes_avro_files_that_fastavro_and_spark_read_exactly(broker, catalog_props, tmp_path,
                                                                          spark_reader):
    import fastavro
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck
    from tests.support.sinkrun import nested_record as record, send_json, sink_until, write_config
    from tests.support.spark_reader import _rows

    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 1))
    asyncio.run(send_json(broker.bootstrap, TOPIC, map(record, range(N))))
    cfg = write_config(
        tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap, catalog_props=catalog_props,
        state_dir=tmp_path / "state", group=GROUP, **{"iceberg.tables.write-props.write.format.default": "avro"},
    )
    sink_until(cfg, tmp_path / "logs", catalog, (TABLE,), N)

    table = catalog.load_table(TABLE)
    files = list(table.inspect.files().to_pylist())
    assert files
    assert {f["file_format"] for f in files} == {"AVRO"}
    columns = [c.name for c in table.schema().fields]
    decoded: list[dict[str, object]] = []
    for f in files:
        assert f["file_path"].endswith(".avro"), f["file_path"]
        with open(duck.plain_path(f["file_path"]), "rb") as stream:
            reader = fastavro.reader(stream)
            assert reader.codec == "deflate"  # Iceberg's default gzip, not Spark's default snappy
            by_name = {f["name"]: f for f in reader.writer_schema["fields"]}  # Iceberg's schema, ids included
            assert {n: by_name[n]["field-id"] for n in columns} == {f.name: f.field_id for f in table.schema().fields}
            rows = list(reader)
        assert len(rows) == f["record_count"]
        decoded += rows
    assert sum(f["record_count"] for f in files) == N

    want = _rows([record(i) for i in range(N)], columns, set())
    assert _rows(decoded, columns, set()) == want
    spark = spark_reader.catalog(catalog.name, catalog.properties)
    assert _rows(spark.table(TABLE).to_pylist(), columns, set()) == want


def test_spark_writes_avro_files_of_every_type_it_has_that_icebergs_reader_reads_exactly(catalog_props, tmp_path,
                                                                                         spark_reader):
    """Types the JSON test does not reach, through the writer itself: timestamp and timestamptz (Spark's
    local-timestamp-micros and timestamp-micros), date, decimal (Avro fixed), binary, float, a map of
    string keys, a required column, and a day partition of the timestamptz column."""
    import datetime as dt
    from decimal import Decimal

    import pyarrow as pa
    from pyiceberg.catalog import load_catalog
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform
    from pyiceberg.types import (
        BinaryType, DateType, DecimalType, FloatType, LongType, MapType, NestedField, StringType, TimestampType,
        TimestamptzType,
    )

    from spark_bridge.schema import name_mapping_properties
    from spark_bridge.session import SparkSettings
    from spark_bridge.writer import SparkFileWriter
    from tests.support.spark_reader import _rows

    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "at", TimestampType(), required=False),
        NestedField(3, "tz", TimestamptzType(), required=False), NestedField(4, "d", DateType(), required=False),
        NestedField(5, "dec", DecimalType(12, 3), required=False), NestedField(6, "b", BinaryType(), required=False),
        NestedField(7, "f", FloatType(), required=False),
        NestedField(8, "m", MapType(9, StringType(), 10, LongType(), value_required=False), required=False),
    )
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("avro")
    table = catalog.create_table(
        "avro.types", schema=schema,
        partition_spec=PartitionSpec(PartitionField(3, 1000, DayTransform(), "tz_day")),
        properties={**name_mapping_properties(schema), "write.format.default": "avro",
                    "write.avro.compression-codec": "zstd"})
    utc = dt.UTC
    rows = [{"id": i, "at": None if i % 5 == 0 else dt.datetime(2024, 1, 1 + i % 3, i % 24, 7, 9, i),
             "tz": dt.datetime(2024, 3, 1 + i % 4, 12, 0, i % 60, 250, tzinfo=utc),
             "d": dt.date(2020, 2, 1 + i % 28), "dec": None if i % 7 == 0 else Decimal(f"{i * 3.5 - 40:.3f}"),
             "b": bytes([i % 256, 0, 255]), "f": i / 4, "m": None if i % 6 == 0 else [(f"k{i % 3}", i), ("z", None)]}
            for i in range(400)]
    data = pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema()))
    writer = SparkFileWriter(SparkSettings(master="local[1]", app_name="icesink-avro-test", warm_up_rows=0))
    writer.start()
    try:
        files = writer.write(table, data, file_prefix="avro-types")
    finally:
        writer.stop()
    assert {f.file_format.name for f in files} == {"AVRO"} and len(files) == 4  # one per day
    assert sum(f.record_count for f in files) == len(rows)
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for f in files:
            append.append_data_file(f)

    def entries(r: dict) -> dict:  # a map's entries in key order (Avro maps keep none)
        return {**r, "m": None if r["m"] is None else dict(sorted(dict(r["m"]).items()))}

    columns = [c.name for c in schema.fields]
    want = _rows([entries(r) for r in rows], columns, set())
    got = spark_reader.catalog(catalog.name, catalog.properties).table("avro.types").to_pylist()
    assert _rows([entries(r) for r in got], columns, set()) == want
