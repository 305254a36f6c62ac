"""Settings: the reference tutorial config, sources and their order, clear refusals."""

import json
import logging

import pytest

from icesink.shared.config import build, load_settings
from icesink.shared.errors import ConfigError

TUTORIAL = {
    "connector.class": "io.tabular.iceberg.connect.IcebergSinkConnector",
    "tasks.max": "6",
    "topics": "completed-pizzas",
    "iceberg.tables": "rpc.pizzas",
    "iceberg.catalog": "demo",
    "iceberg.catalog.type": "rest",
    "iceberg.catalog.uri": "http://iceberg-rest:8181",
    "iceberg.catalog.client.region": "us-east-1",
    "iceberg.catalog.s3.endpoint": "http://minio:9000",
    "iceberg.catalog.s3.path-style-access": "true",
    "iceberg.tables.auto-create-enabled": "true",
    "iceberg.tables.evolve-schema-enabled": "true",
    "iceberg.control.commit.interval-ms": 180000,
    "key.converter": "org.apache.kafka.connect.storage.StringConverter",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "value.converter.schemas.enable": "false",
}


def write(tmp_path, data, name="c.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data) if name.endswith(".json") else data)
    return p


def test_tutorial_config_loads_unchanged(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        s = load_settings(write(tmp_path, TUTORIAL), {})
    assert s.topics == ("completed-pizzas",) and s.tables == ("rpc.pizzas",)
    assert s.catalog_name == "demo"
    assert s.catalog_props == {
        "type": "rest", "uri": "http://iceberg-rest:8181", "client.region": "us-east-1",
        "s3.endpoint": "http://minio:9000", "s3.path-style-access": "true",
        "s3.force-virtual-addressing": "false",  # path style, as pyiceberg names it
    }
    assert s.auto_create and s.commit_interval_ms == 180000 and s.commit_timeout_ms == 30000
    assert s.control_topic == "control-iceberg" and not s.embedded_catalog
    assert "unknown" not in caplog.text  # every tutorial key is known


def test_defaults_mean_the_embedded_stack(tmp_path):
    s = load_settings(write(tmp_path, {"topics": "a,b", "iceberg.tables": "db.t"}), {})
    assert s.topics == ("a", "b") and s.embedded_broker and s.embedded_catalog
    assert s.commit_interval_ms == 300000 and s.metrics_port == 9400


def test_environment_overrides_file_and_flags_override_environment(tmp_path):
    p = write(tmp_path, {"topics": "a", "iceberg.tables": "db.t", "metrics.port": 9000})
    env = {"ICESINK_METRICS_PORT": "9101", "ICESINK_ICEBERG_CATALOG_S3_ENDPOINT": "http://s3:1",
           "ICESINK_BOOTSTRAP_SERVERS": "k:9092"}
    s = load_settings(p, env)
    assert s.metrics_port == 9101 and s.catalog_props["s3.endpoint"] == "http://s3:1"
    assert s.bootstrap_servers == "k:9092"
    assert load_settings(p, env, {"metrics.port": "9102"}).metrics_port == 9102


def test_toml_with_nested_tables(tmp_path):
    text = 'topics = "a"\n[iceberg]\ntables = "db.t"\n[iceberg.catalog]\ntype = "sql"\nuri = "sqlite:////data/x.db"\n'
    s = load_settings(write(tmp_path, text, "c.toml"), {})
    assert s.catalog_props == {"type": "sql", "uri": "sqlite:////data/x.db"}


def test_partition_by_per_table_and_default(tmp_path):
    s = load_settings(write(tmp_path, {
        "topics": "a", "iceberg.tables": "db.t,db.u",
        "iceberg.tables.default-partition-by": "day(ts)",
        "iceberg.table.db.u.partition-by": "bucket(id, 8), truncate(name, 4)",
    }), {})
    assert s.partition_by("db.t") == "day(ts)"
    assert s.partition_by("db.u") == "bucket(id, 8), truncate(name, 4)"


def test_spark_and_security_settings(tmp_path):
    s = load_settings(write(tmp_path, {
        "topics": "a", "iceberg.tables": "db.t", "spark.remote": "sc://spark:15002",
        "spark.driver.memory": "2g", "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "hunter2",
    }), {})
    assert s.spark_remote == "sc://spark:15002" and s.spark_conf == {"spark.driver.memory": "2g"}
    kw = s.kafka_client_kwargs()
    assert kw["sasl_plain_password"] == "hunter2" and kw["security_protocol"] == "SASL_PLAINTEXT"
    assert "hunter2" not in json.dumps(s.masked(), default=str)


def test_unknown_keys_are_refused_naming_them_or_with_config_unknown_keys_warn_named_in_a_warning(tmp_path, caplog):
    config = {"topics": "a", "iceberg.tables": "db.t", "iceberg.tabels.typo": 1}
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, config), {})
    assert err.value.key == "iceberg.tabels.typo" and "config.unknown-keys=warn" in str(err.value)
    with caplog.at_level(logging.WARNING):
        s = load_settings(write(tmp_path, {**config, "config.unknown-keys": "warn"}), {})
    assert "iceberg.tabels.typo" in caplog.text
    assert s.ignored_keys == ("iceberg.tabels.typo",)  # for the connector's status (icesink connect)
    assert "<ignored keys>" not in s.masked()
    with pytest.raises(ConfigError, match="config.unknown-keys"):
        load_settings(write(tmp_path, {**config, "config.unknown-keys": "ignore"}), {})


def test_kafka_connect_consumer_overrides_are_read_and_icesinks_own_keys_win(tmp_path, caplog):
    base = {"topics": "a", "iceberg.tables": "db.t"}
    overrides = {"consumer.override.fetch.min.bytes": "1", "consumer.override.max.poll.records": "500",
                 "consumer.override.session.timeout.ms": "45000", "consumer.override.auto.offset.reset": "latest"}
    with pytest.raises(ConfigError) as err:  # an override icesink has no setting for: refused by name
        load_settings(write(tmp_path, {**base, **overrides}), {})
    assert err.value.key == "consumer.override.auto.offset.reset"
    base["config.unknown-keys"] = "warn"
    with caplog.at_level(logging.WARNING):
        s = load_settings(write(tmp_path, {**base, **overrides}), {})
    assert (s.fetch_min_bytes, s.consumer_max_batch, s.session_timeout_ms) == (1, 500, 45000)
    assert "unknown settings ignored: consumer.override.auto.offset.reset" in caplog.text  # not applied: said
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        s = load_settings(write(tmp_path, {**base, **overrides, "consumer.fetch-min-bytes": 4096}), {})
    assert s.fetch_min_bytes == 4096
    assert "consumer.override.fetch.min.bytes ignored: consumer.fetch-min-bytes is set too" in caplog.text
    with pytest.raises(ConfigError, match="consumer.fetch-min-bytes"):  # validated like the icesink key
        load_settings(write(tmp_path, {**base, "consumer.override.fetch.min.bytes": "0"}), {})


@pytest.mark.parametrize(
    "extra, key, fragment",
    [
        ({"iceberg.control.commit.interval-ms": "soon"}, "iceberg.control.commit.interval-ms", "integer"),
        ({"value.converter": "com.example.OtherConverter"}, "value.converter", "JsonConverter"),
        ({"iceberg.tables.default-partition-by": "weekly(ts)"}, "iceberg.tables.default-partition-by", "bucket"),
        ({"iceberg.table.db.zz.partition-by": "day(ts)"}, "iceberg.table.db.zz.partition-by", "iceberg.tables"),
        ({"spark.remote": "http://x"}, "spark.remote", "sc://"),
        ({"metrics.port": 70000}, "metrics.port", "65535"),
        ({"security.protocol": "TLS"}, "security.protocol", "PLAINTEXT"),
        ({"security.protocol": "SASL_SSL"}, "sasl.mechanism", "SCRAM-SHA-512"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256", "sasl.password": "p"},
         "sasl.username", "SCRAM-SHA-256"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "u"},
         "sasl.password", "PLAIN"),
    ],
)
def test_invalid_values_refuse_to_start_naming_key_value_and_valid(tmp_path, extra, key, fragment):
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, {"topics": "a", "iceberg.tables": "db.t", **extra}), {})
    assert err.value.key == key
    assert fragment in str(err.value)


def test_missing_required_key(tmp_path):
    with pytest.raises(ConfigError, match="topics"):
        load_settings(write(tmp_path, {"iceberg.tables": "db.t"}), {})


def test_hyphenated_catalog_properties_can_come_from_the_environment():
    """pyiceberg spells credentials with hyphens (s3.access-key-id); reading every ``_`` of
    the variable as ``.`` made ICESINK_ICEBERG_CATALOG_S3_ACCESS_KEY_ID the unknown
    property s3.access.key.id, so the credential was silently not used."""
    from icesink.shared.config import keys_from_env

    env = {"ICESINK_ICEBERG_CATALOG_S3_ACCESS_KEY_ID": "a", "ICESINK_ICEBERG_CATALOG_S3_SECRET_ACCESS_KEY": "b",
           "ICESINK_ICEBERG_CATALOG_S3_ENDPOINT": "http://minio:9000", "ICESINK_ICEBERG_CATALOG_CLIENT_REGION": "eu"}
    assert keys_from_env(env) == {
        "iceberg.catalog.s3.access-key-id": "a", "iceberg.catalog.s3.secret-access-key": "b",
        "iceberg.catalog.s3.endpoint": "http://minio:9000", "iceberg.catalog.client.region": "eu"}


@pytest.mark.parametrize(("style", "virtual"), [("true", "false"), ("false", "true"), ("TRUE", "false")])
def test_s3_path_style_access_acts_through_pyiceberg_force_virtual_addressing_37(style, virtual):
    """The reference's (Java S3FileIO's) s3.path-style-access: pyiceberg 0.12 has no such key and
    ignored it; its s3.force-virtual-addressing is the opposite switch."""
    s = build({"topics": "t", "iceberg.tables": "db.t", "iceberg.catalog.s3.endpoint": "http://minio:9000",
               "iceberg.catalog.s3.path-style-access": style})
    assert s.catalog_props["s3.force-virtual-addressing"] == virtual


def test_s3_path_style_access_against_force_virtual_addressing_is_refused_37():
    with pytest.raises(ConfigError, match="s3.path-style-access"):
        build({"topics": "t", "iceberg.tables": "db.t", "iceberg.catalog.s3.path-style-access": "true",
               "iceberg.catalog.s3.force-virtual-addressing": "true"})
    with pytest.raises(ConfigError, match="s3.path-style-access"):
        build({"topics": "t", "iceberg.tables": "db.t", "iceberg.catalog.s3.path-style-access": "sometimes"})


def test_the_settings_log_line_holds_only_what_was_given_37():
    """The worker's INFO line of settings was 3,000 characters of defaults: it shows what the
    config, environment and flags gave (secrets masked); DEBUG logs them all."""
    s = build({"topics": "t", "iceberg.tables": "db.t", "sasl.password": "pw-9", "iceberg.catalog.uri": "sqlite:///x.db",
               "spark.driver.memory": "1g"})
    given = s.masked(only_given=True)
    assert set(given) == {"topics", "iceberg.tables", "sasl.password", "iceberg.catalog.*", "spark.*"}
    assert "pw-9" not in str(given)
    assert "maintenance.snapshots.retain-last" in s.masked()
