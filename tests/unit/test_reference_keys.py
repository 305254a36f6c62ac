"""Every key of the reference sink acts as there or is refused at start naming it
(docs/reference-keys.md): write-props, write.format.default, iceberg.hadoop.*, iceberg.kafka.*,
the control group keys, per-table keys, the refused ones."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from icesink.app.files import hadoop_site_conf, spark_conf
from icesink.shared.config import build
from icesink.shared.errors import ConfigError
from spark_bridge.files import arrow_parquet_options, parquet_options, writer_properties

BASE = {"topics": "a", "iceberg.tables": "db.t"}


def settings(**extra: Any) -> Any:
    return build({**BASE, **extra})


def refused(key: str, value: Any = "x", **extra: Any) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        build({**BASE, key: value, **extra})
    assert err.value.key == key, err.value
    return err.value


# iceberg.tables.write-props.* ----------------------------------------------------------------


def test_write_props_are_read_and_win_over_the_tables_own_properties() -> None:
    s = settings(**{"iceberg.tables.write-props.write.parquet.compression-codec": "gzip",
                    "iceberg.tables.write-props.write.parquet.row-group-size-bytes": "65536",
                    "iceberg.tables.write-props.write.metadata.metrics.default": "counts"})
    assert s.write_props == {"write.parquet.compression-codec": "gzip", "write.parquet.row-group-size-bytes": "65536",
                             "write.metadata.metrics.default": "counts"}
    table = SimpleNamespace(metadata=SimpleNamespace(properties={"write.parquet.compression-codec": "snappy",
                                                                 "write.parquet.page-size-bytes": "4096"}))
    props = writer_properties(table, s.write_props)  # type: ignore[arg-type]
    assert props["write.parquet.compression-codec"] == "gzip" and props["write.parquet.page-size-bytes"] == "4096"
    assert writer_properties(table, {}) == table.metadata.properties  # type: ignore[arg-type]


def test_write_props_become_spark_and_pyarrow_parquet_options() -> None:
    props = {"write.parquet.compression-codec": "zstd", "write.parquet.compression-level": "9",
             "write.parquet.row-group-size-bytes": "1048576", "write.parquet.page-size-bytes": "8192",
             "write.parquet.dict-size-bytes": "16384"}
    assert parquet_options(props) == {
        "compression": "zstd", "parquet.compression.codec.zstd.level": "9", "parquet.block.size": "1048576",
        "parquet.page.size": "8192", "parquet.dictionary.page.size": "16384"}
    assert arrow_parquet_options(props, 16) == {
        "compression": "zstd", "compression_level": 9, "row_group_size": 65536, "data_page_size": 8192,
        "dictionary_pagesize_limit": 16384}


def test_write_prop_target_file_size_is_the_target_of_every_write() -> None:
    s = settings(**{"iceberg.tables.write-props.write.target-file-size-bytes": "1048576"})
    assert s.target_file_size_bytes == 1048576
    refused("iceberg.tables.write-props.write.target-file-size-bytes", "1048576",
            **{"write.target-file-size-bytes": 2048})  # two different values: refused, not one ignored


@pytest.mark.parametrize("key, value, fragment", [
    ("write.parquet.compression-codec", "lzo", "zstd"),
    ("write.parquet.row-group-size-bytes", "big", "positive integer"),
    ("write.metadata.metrics.default", "truncate(x)", "truncate(N)"),
    ("write.metadata.metrics.column.id", "most", "counts"),
    ("write.parquet.bloom-filter-enabled.column.id", "true", "writer property icesink's files take"),
    ("write.object-storage.enabled", "true", "writer property icesink's files take"),
    ("write.format.default", "csv", "parquet, orc or avro"),
    ("write.avro.compression-codec", "lz4", "gzip"),
    ("write.avro.compression-level", "3", "Spark's Avro writer"),
])
def test_write_props_that_cannot_act_are_refused_naming_the_key(key: str, value: str, fragment: str) -> None:
    err = refused(f"iceberg.tables.write-props.{key}", value)
    assert fragment in err.expected


def test_write_format_parquet_and_metrics_modes_are_accepted() -> None:
    s = settings(**{"iceberg.tables.write-props.write.format.default": "parquet",
                    "iceberg.tables.write-props.write.metadata.metrics.column.id": "truncate(8)",
                    "iceberg.tables.auto-create-props.write.format.default": "PARQUET"})
    assert s.write_props["write.format.default"] == "parquet"


def test_write_format_avro_is_accepted_and_a_csv_table_refused() -> None:
    s = settings(**{"iceberg.tables.auto-create-props.write.format.default": "avro",
                    "iceberg.tables.write-props.write.avro.compression-codec": "zstd"})
    assert s.auto_create_props["write.format.default"] == "avro"
    refused("iceberg.tables.auto-create-props.write.format.default", "csv")
    err = refused("iceberg.tables.auto-create-props.write.avro.compression-codec", "snappy")  # the manifests' too
    assert "python-snappy" in err.expected
    settings(**{"iceberg.tables.write-props.write.avro.compression-codec": "snappy"})  # the data files' only
    refused("iceberg.tables.auto-create-props.write.parquet.compression-codec", "lzo")
    settings(**{"iceberg.tables.auto-create-props.commit.retry.num-retries": "9"})  # any other table property
    with pytest.raises(ConfigError) as err_table:  # an existing table's own property: its writes refused
        parquet_options({"write.format.default": "csv"})
    assert err_table.value.key == "write.format.default"
    with pytest.raises(ConfigError):
        arrow_parquet_options({"write.format.default": "orc"}, 8)


# iceberg.hadoop.*, iceberg.hadoop-conf-dir ----------------------------------------------------


def test_hadoop_keys_and_conf_dir_become_sparks_hadoop_configuration(tmp_path) -> None:
    (tmp_path / "core-site.xml").write_text(
        "<configuration><property><name>fs.defaultFS</name><value>hdfs://nn:8020</value></property>"
        "<property><name>fs.s3a.endpoint</name><value>http://dir</value></property></configuration>")
    (tmp_path / "hdfs-site.xml").write_text(
        "<configuration><property><name>dfs.replication</name><value>2</value></property></configuration>")
    s = settings(**{"iceberg.hadoop-conf-dir": str(tmp_path), "iceberg.hadoop.fs.s3a.endpoint": "http://sink",
                    "iceberg.hadoop.dfs.replication": "1", "spark.hadoop.dfs.replication": "3"})
    assert hadoop_site_conf(str(tmp_path)) == {"fs.defaultFS": "hdfs://nn:8020", "fs.s3a.endpoint": "http://dir",
                                               "dfs.replication": "2"}
    conf = spark_conf(s)  # the reference's order: sink config over the directory; spark.* keys win over both
    assert conf["spark.hadoop.fs.defaultFS"] == "hdfs://nn:8020"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://sink"
    assert conf["spark.hadoop.dfs.replication"] == "3"


def test_a_hadoop_conf_dir_that_is_not_a_directory_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError) as err:
        spark_conf(settings(**{"iceberg.hadoop-conf-dir": str(tmp_path / "missing")}))
    assert err.value.key == "iceberg.hadoop-conf-dir"
    (tmp_path / "core-site.xml").write_text("<configuration><property>")
    with pytest.raises(ConfigError, match="XML"):
        hadoop_site_conf(str(tmp_path))


# iceberg.kafka.*, control groups ----------------------------------------------------------------


def test_kafka_keys_reach_the_control_clients_and_only_them() -> None:
    s = settings(**{"iceberg.kafka.client.id": "ctl", "iceberg.kafka.request.timeout.ms": "45000",
                    "iceberg.kafka.retry.backoff.ms": "250", "iceberg.kafka.security.protocol": "PLAINTEXT"})
    kw = s.control_client_kwargs()
    assert (kw["client_id"], kw["request_timeout_ms"], kw["retry_backoff_ms"]) == ("ctl", 45000, 250)
    assert "client_id" not in s.kafka_client_kwargs()


@pytest.mark.parametrize("key, value, fragment", [
    ("iceberg.kafka.acks", "1", "control-topic client key"),
    ("iceberg.kafka.sasl.jaas.config", "x", "control-topic client key"),
    ("iceberg.kafka.bootstrap.servers", "other:9092", "same as bootstrap.servers"),
    ("iceberg.kafka.security.protocol", "SSL", "same as security.protocol"),
    ("iceberg.kafka.request.timeout.ms", "soon", "milliseconds"),
])
def test_kafka_keys_that_cannot_act_are_refused_naming_them(key: str, value: str, fragment: str) -> None:
    assert fragment in refused(key, value).expected


def test_control_group_keys_name_the_coordinators_consumer_group() -> None:
    assert settings(**{"group.id": "g"}).coordinator_group == "g-coordinator"  # as before: no key set
    assert settings(**{"group.id": "g", "iceberg.control.group-id-prefix": "cg-control-"}).coordinator_group == \
        "cg-control-g"
    assert settings(**{"iceberg.control.group-id": "offsets"}).coordinator_group == "offsets"  # Tabular's key


def test_connect_group_id_is_the_source_consumer_group() -> None:
    assert settings(**{"iceberg.connect.group-id": "connect-x"}).group_id == "connect-x"
    refused("iceberg.connect.group-id", "connect-x", **{"group.id": "other"})


# per-table keys, refused keys ---------------------------------------------------------------


def test_per_table_keys_act_and_any_other_is_refused_by_name() -> None:
    s = settings(**{"iceberg.table.db.t.id-columns": "id", "iceberg.table.db.t.partition-by": "day(ts)",
                    "iceberg.table.db.t.route-regex": "t.*", "iceberg.tables.route-field": "kind"})
    assert (s.id_columns("db.t"), s.partition_by("db.t"), s.table_route_regex) == (("id",), "day(ts)", {"db.t": "t.*"})
    err = refused("iceberg.table.db.t.sort-order", "id")
    assert "id-columns" in err.expected and "route-regex" in err.expected


@pytest.mark.parametrize("key", ["iceberg.control.commit.max-consecutive-failures",
                                 "iceberg.coordinator.transactional.prefix",
                                 "iceberg.coordinator.transactional.suffix"])
def test_reference_keys_icesink_cannot_honour_are_refused_saying_why(key: str) -> None:
    assert refused(key, "1").expected.startswith("unset")


def test_replace_null_with_default() -> None:
    assert settings().replace_null_with_default  # schemaless JSON maps have no defaults: as the reference
    assert not settings(**{"iceberg.tables.replace-null-with-default": "false"}).replace_null_with_default
    refused("iceberg.tables.replace-null-with-default", "false", **{"value.converter.schemas.enable": "true"})


def test_unknown_keys_error_by_default_in_the_connect_path_too() -> None:
    with pytest.raises(ConfigError) as err:
        build({**BASE, "iceberg.tables.typo": "1"})
    assert err.value.key == "iceberg.tables.typo"
    assert build({**BASE, "iceberg.tables.typo": "1", "config.unknown-keys": "warn"})
