"""``write.format.default=orc`` in a real worker process (Tansu, Faust, Spark, a SQL catalog): the
auto-created table's data files are ORC (with the write-props' codec), committed as ORC with their
record counts and column metrics (from the ORC footer's statistics: the id column's bounds equal its
values' minimum and maximum), and two readers that are not icesink's, Spark with the Iceberg runtime
and a pyiceberg scan, read every row back exactly, struct and list columns included (found by the table's name mapping:
Spark's ORC files carry no Iceberg field ids)."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.integration

TOPIC = "orcfiles"
TABLE = "orc.events"
GROUP = "orc-sink"
N = 3000


def test_a_worker_writes_orc_files_that_spark_and_pyiceberg_read_exactly(broker, catalog_props, tmp_path,
                                                                        spark_reader):
    import pyarrow.orc as orc
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck
    from tests.support.sinkrun import nested_record as record, send_json, sink_until, write_config
    from tests.support.spark_reader import _rows, assert_engines_agree

    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 1))
    asyncio.run(send_json(broker.bootstrap, TOPIC, map(record, range(N))))
    cfg = write_config(
        tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap, catalog_props=catalog_props,
        state_dir=tmp_path / "state", group=GROUP, **{
            "iceberg.tables.write-props.write.format.default": "orc",
            "iceberg.tables.write-props.write.orc.compression-codec": "lz4",  # neither Spark's default nor Iceberg's
        },
    )
    sink_until(cfg, tmp_path / "logs", catalog, (TABLE,), N)

    table = catalog.load_table(TABLE)
    files = list(table.inspect.files().to_pylist())
    assert files
    assert {f["file_format"] for f in files} == {"ORC"}
    for f in files:
        assert f["file_path"].endswith(".orc"), f["file_path"]
        orc_file = orc.ORCFile(duck.plain_path(f["file_path"]))
        assert orc_file.compression == "LZ4"
        assert orc_file.nrows == f["record_count"]
        ids = orc_file.read(columns=["id"]).column("id").to_pylist()  # column metrics from the footer's statistics
        id_field = table.schema().find_field("id").field_id
        lower, upper = dict(f["lower_bounds"]), dict(f["upper_bounds"])
        assert (lower[id_field], upper[id_field]) == (
            min(ids).to_bytes(8, "little", signed=True), max(ids).to_bytes(8, "little", signed=True))
        assert dict(f["null_value_counts"])[id_field] == 0 and dict(f["value_counts"])[id_field] == len(ids)
    assert sum(f["record_count"] for f in files) == N

    columns = [c.name for c in table.schema().fields]
    want = _rows([record(i) for i in range(N)], columns, set())
    spark = spark_reader.catalog(catalog.name, catalog.properties)
    read = {"spark": _rows(spark.table(TABLE).to_pylist(), columns, set()),
            "pyiceberg": _rows(table.scan().to_arrow().to_pylist(), columns, set())}
    assert_engines_agree(read, f"{TABLE} (ORC files)")
    assert read["spark"] == want
