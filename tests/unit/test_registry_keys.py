"""Avro keys (issue 36 point 1): ``key.converter`` = a registry converter with the same key family
as values (``key.converter.schema.registry.url``, credentials, PEM TLS), each key acting or
refused at start naming it; Debezium's Avro pipelines set both converters."""

from __future__ import annotations

import pytest

from icesink.shared.config import Settings, build
from icesink.shared.errors import ConfigError
from icesink.shared.registry_settings import registry_settings

AVRO = "io.confluent.connect.avro.AvroConverter"


def settings(**extra: str) -> Settings:
    return build({"topics": "t", "iceberg.tables": "db.t", "key.converter": AVRO, **extra})


def test_an_avro_key_converter_takes_the_value_converters_key_family() -> None:
    s = settings(**{
        "key.converter.schema.registry.url": "http://a:8081,http://b:8081",
        "key.converter.basic.auth.credentials.source": "USER_INFO",
        "key.converter.basic.auth.user.info": "alice:k3y-secret",
        "key.converter.auto.register.schemas": "false",
    })
    r = registry_settings(s, "key")
    assert r is not None and r.format == "avro" and r.urls == ("http://a:8081", "http://b:8081")
    assert r.user_info is not None and r.user_info.get_secret_value() == "alice:k3y-secret"
    assert registry_settings(s) is None  # the value converter is JSON
    assert "k3y-secret" not in repr(s) and "k3y-secret" not in str(s.masked())
    assert "alice:k3y-secret" in s.secret_values() and "http://a:8081,http://b:8081" not in s.secret_values()


@pytest.mark.parametrize(("extra", "key"), [
    ({}, "key.converter.schema.registry.url"),
    ({"key.converter.schema.registry.url": "http://a:8081", "key.converter.colour": "red"}, "key.converter.colour"),
    ({"key.converter.schema.registry.url": "http://a:8081",
      "key.converter.basic.auth.credentials.source": "SASL_INHERIT"}, "key.converter.basic.auth.credentials.source"),
])
def test_bad_or_missing_key_converter_keys_are_refused_naming_the_key(extra: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**extra)
    assert err.value.key == key


def test_a_key_column_of_avro_keys_is_refused_for_now_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        settings(**{"key.converter.schema.registry.url": "http://a:8081", "iceberg.tables.key-column": "k"})
    assert err.value.key == "iceberg.tables.key-column" and "Avro" in str(err.value)


def test_json_key_converters_still_take_their_keys_with_no_effect() -> None:
    s = build({"topics": "t", "iceberg.tables": "db.t", "key.converter": "org.apache.kafka.connect.json.JsonConverter",
               "key.converter.schemas.enable": "false"})
    assert registry_settings(s, "key") is None
