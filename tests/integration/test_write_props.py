"""The reference's ``iceberg.tables.write-props.*`` and control-client keys in a real worker process
(Tansu, Faust, Spark, a SQL catalog): the data files' Parquet footers have the codec and the
row-group size the write-props name, over the table's own codec (auto-create-props), and the
manifests hold the metrics the write-props' metrics modes ask for; ``iceberg.kafka.client.id``
reaches the control clients and ``iceberg.control.group-id-prefix`` names the group the coordinator
commits its control offsets in. DuckDB reads every row back exactly once."""

from __future__ import annotations

import asyncio
import json

import pytest

pytestmark = pytest.mark.integration

TOPIC = "wprops"
TABLE = "wp.events"
GROUP = "wprops-sink"
N = 6000
PREFIX = "cg-ctl-"


async def send(bootstrap: str) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all", linger_ms=20)
    await producer.start()
    try:
        futures = [await producer.send(TOPIC, json.dumps({"id": i, "note": f"note {i % 97} " + "x" * (i % 40),
                                                          "score": i * 0.5}).encode(), partition=0)
                   for i in range(N)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def committed(bootstrap: str, group: str, topic: str) -> int | None:
    from icesink.shared.kafka_admin import group_offset

    return await group_offset(bootstrap, group, topic, 0)


def test_write_props_reach_the_parquet_footers_and_metrics(broker, catalog_props, tmp_path):
    import pyarrow.parquet as pq
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck
    from tests.support.sinkrun import assert_exact, sink_until, write_config

    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 1))
    asyncio.run(send(broker.bootstrap))
    cfg = write_config(
        tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap, catalog_props=catalog_props,
        state_dir=tmp_path / "state", group=GROUP, **{
            "iceberg.tables.auto-create-props.write.parquet.compression-codec": "snappy",  # the table's own
            "iceberg.tables.write-props.write.parquet.compression-codec": "gzip",  # wins, as in the reference
            "iceberg.tables.write-props.write.parquet.row-group-size-bytes": "32768",
            "iceberg.tables.write-props.write.parquet.page-size-bytes": "8192",
            "iceberg.tables.write-props.write.format.default": "parquet",
            "iceberg.tables.write-props.write.metadata.metrics.default": "counts",
            "iceberg.tables.write-props.write.metadata.metrics.column.id": "full",
            "iceberg.kafka.client.id": "wprops-control",
            "iceberg.control.group-id-prefix": PREFIX,
        },
    )
    sink_until(cfg, tmp_path / "logs", catalog, (TABLE,), N)

    table = catalog.load_table(TABLE)
    assert table.properties["write.parquet.compression-codec"] == "snappy"  # the table's property is untouched
    files = list(table.inspect.files().to_pylist())
    assert files
    ids = {f.name: f.field_id for f in table.schema().fields}
    row_groups = 0
    for f in files:
        assert f["file_format"] == "PARQUET"
        meta = pq.read_metadata(duck.plain_path(f["file_path"]))
        row_groups += meta.num_row_groups
        for rg in range(meta.num_row_groups):
            assert {meta.row_group(rg).column(c).compression for c in range(meta.num_columns)} == {"GZIP"}
        # metrics modes: counts for every column, bounds only for id (full)
        assert dict(f["value_counts"]) == {i: meta.num_rows for i in ids.values()}
        assert dict(f["lower_bounds"]).keys() == {ids["id"]} == dict(f["upper_bounds"]).keys()
    # Several row groups a file: 6000 rows (about 280 KiB) are far over 32 KiB; parquet-mr checks the size
    # every few thousand rows, so groups are over 32 KiB, but without the write-prop a file is one group.
    assert row_groups > len(files)
    assert_exact(catalog, TABLE, {str(i) for i in range(N)}, key="CAST(id AS VARCHAR)")
    # The coordinator committed its control offsets in the group the prefix names (not <group>-coordinator).
    assert asyncio.run(committed(broker.bootstrap, PREFIX + GROUP, f"{GROUP}-control")) is not None
    assert asyncio.run(committed(broker.bootstrap, f"{GROUP}-coordinator", f"{GROUP}-control")) is None
    logs = (tmp_path / "logs").glob("*")
    assert not any("unknown settings" in p.read_text(errors="replace") for p in logs if p.is_file())
