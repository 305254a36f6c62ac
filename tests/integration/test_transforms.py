"""Transforms and routing by topic with a real worker process, a real broker and a real catalog:
three topics each to its own table with no route field in the values, read back by DuckDB
(every id exactly once) and pyiceberg (the metadata columns)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

C = "org.apache.kafka.connect.transforms."
REF = "org.apache.iceberg.connect.transforms."
TOPICS = ("orders", "clicks", "users")


def values_of(topic: str, n: int) -> list[bytes]:
    return [json.dumps({"id": f"{topic}-{i}", "n": i}).encode() for i in range(n)]


def run_sink(broker: Any, catalog_props: dict[str, str], tmp_path: Path, prefix: str, tables: dict[str, int],
             extra_topic: str | None, **keys: Any) -> Any:
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import wait_rows, write_config

    topics = [f"{prefix}{t}" for t in TOPICS] + ([extra_topic] if extra_topic else [])
    for t in topics:
        asyncio.run(ensure_topic(broker.bootstrap, t, 2))
    listed = "" if "iceberg.tables.dynamic-enabled" in keys else ",".join(tables)
    cfg = write_config(tmp_path / "sink.json", topics=",".join(topics), tables=listed,
                       bootstrap=broker.bootstrap, catalog_props=catalog_props, state_dir=tmp_path / "state",
                       group=f"{prefix}sink", **keys)
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("r1")
        for t in topics:
            asyncio.run(produce(broker.bootstrap, t, values_of(t, 300), partitions=2))
        for table, n in tables.items():
            wait_rows(catalog, replicas, (table,), n)
    finally:
        replicas.stop_all()
    return catalog


@pytest.mark.timeout(300)
def test_three_topics_to_three_tables_the_references_way(broker, catalog_props, tmp_path: Path) -> None:
    """KafkaMetadataTransform + iceberg.tables.route-field=_kafka_metadata_topic + a route-regex per table."""
    from tests.support.sinkrun import assert_exact

    tables = {f"tt.{t}": 300 for t in TOPICS}
    catalog = run_sink(
        broker, catalog_props, tmp_path, "ref-", tables, None,
        **{"transforms": "kafkametadata", "transforms.kafkametadata.type": f"{REF}KafkaMetadataTransform",
           "iceberg.tables.route-field": "_kafka_metadata_topic"},
        **{f"iceberg.table.tt.{t}.route-regex": f"ref-{t}" for t in TOPICS},
    )
    for t in TOPICS:
        assert_exact(catalog, f"tt.{t}", {f"ref-{t}-{i}" for i in range(300)}, key="id")
        rows = catalog.load_table(f"tt.{t}").scan().to_arrow()
        assert set(rows.column("_kafka_metadata_topic").to_pylist()) == {f"ref-{t}"}
        assert "_kafka_metadata_headers" not in rows.column_names  # as the reference's transform


@pytest.mark.timeout(300)
def test_a_chain_of_five_transforms_routes_by_topic_and_shapes_the_rows(broker, catalog_props, tmp_path: Path) -> None:
    """Filter (TopicNameMatches) drops a topic, KafkaMetadataTransform adds the metadata,
    RegexRouter renames each topic to its table (route-field @topic, dynamic tables),
    ReplaceField renames a field and CopyValue copies one."""
    from tests.support.sinkrun import assert_exact

    tables = {f"chain.{t}": 300 for t in TOPICS}
    catalog = run_sink(
        broker, catalog_props, tmp_path, "prod-", tables, "prod-junk",
        **{"transforms": "dropJunk,meta,rename,fields,copy",
           "transforms.fields.type": f"{C}ReplaceField$Value", "transforms.fields.renames": "n:count",
           "transforms.copy.type": f"{REF}CopyValue", "transforms.copy.source.field": "id",
           "transforms.copy.target.field": "id_copy",
           "transforms.dropJunk.type": f"{C}Filter", "transforms.dropJunk.predicate": "junk",
           "predicates": "junk", "predicates.junk.type": f"{C}predicates.TopicNameMatches",
           "predicates.junk.pattern": ".*-junk",
           "transforms.meta.type": f"{REF}KafkaMetadataTransform", "transforms.meta.field_name": "_src",
           "transforms.rename.type": f"{C}RegexRouter", "transforms.rename.regex": "prod-(.*)",
           "transforms.rename.replacement": "chain.$1",
           "iceberg.tables.route-field": "@topic", "iceberg.tables.dynamic-enabled": "true"},
    )
    for t in TOPICS:
        assert_exact(catalog, f"chain.{t}", {f"prod-{t}-{i}" for i in range(300)}, key="id")
        rows = catalog.load_table(f"chain.{t}").scan().to_arrow()
        assert set(rows.column("_src_topic").to_pylist()) == {f"prod-{t}"}
        assert sorted(rows.column("_src_offset").to_pylist()) == sorted(list(range(150)) * 2)
        assert rows.column_names[:3] == ["id", "count", "id_copy"]
        assert rows.column("id").to_pylist() == rows.column("id_copy").to_pylist()
        assert sorted(rows.column("count").to_pylist()) == list(range(300))
    assert not catalog.table_exists("chain.junk")
