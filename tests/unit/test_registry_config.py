"""The schema-registry converters' settings (issue 36 point 1): ``value.converter`` =
Confluent's or Apicurio's AvroConverter with its registry keys; each key acts or is refused
at start naming it."""

from __future__ import annotations

import pytest

from icesink.shared.config import Settings, build
from icesink.shared.errors import ConfigError
from icesink.shared.registry_settings import registry_settings

AVRO = "io.confluent.connect.avro.AvroConverter"
APICURIO = "io.apicurio.registry.utils.converter.AvroConverter"


def settings(converter: str = AVRO, **extra: str) -> Settings:
    return build({"topics": "t", "iceberg.tables": "db.t", "value.converter": converter, **extra})


def test_confluent_avro_takes_its_registry_urls_credentials_and_pem_truststore() -> None:
    s = settings(**{
        "value.converter.schema.registry.url": "http://a:8081, http://b:8081/",
        "value.converter.basic.auth.credentials.source": "USER_INFO",
        "value.converter.basic.auth.user.info": "alice:s3cret",
        "value.converter.schema.registry.ssl.truststore.location": "/etc/ca.pem",
        "value.converter.schema.registry.ssl.truststore.type": "PEM",
    })
    r = registry_settings(s)
    assert r is not None and r.format == "avro"
    assert r.urls == ("http://a:8081", "http://b:8081")
    assert r.user_info is not None and r.user_info.get_secret_value() == "alice:s3cret"
    assert r.cafile == "/etc/ca.pem"
    assert "s3cret" not in repr(s) and "s3cret" not in str(s.model_dump())


def test_url_credentials_are_the_default_source() -> None:
    r = registry_settings(settings(**{"value.converter.schema.registry.url": "http://u:p@a:8081"}))
    assert r is not None and r.user_info is None and r.urls == ("http://u:p@a:8081",)
    assert registry_settings(settings("org.apache.kafka.connect.json.JsonConverter")) is None


@pytest.mark.parametrize(("extra", "key"), [
    ({}, "value.converter.schema.registry.url"),
    ({"value.converter.schema.registry.url": " , "}, "value.converter.schema.registry.url"),
    ({"value.converter.schema.registry.url": "ftp://a"}, "value.converter.schema.registry.url"),
    ({"value.converter.basic.auth.credentials.source": "SASL_INHERIT"}, "value.converter.basic.auth.credentials.source"),
    ({"value.converter.basic.auth.credentials.source": "USER_INFO"}, "value.converter.basic.auth.user.info"),
    ({"value.converter.schema.registry.ssl.truststore.location": "/t.jks"},
     "value.converter.schema.registry.ssl.truststore.type"),
    ({"value.converter.schema.registry.ssl.truststore.location": "/t.jks",
      "value.converter.schema.registry.ssl.truststore.type": "JKS"}, "value.converter.schema.registry.ssl.truststore.type"),
    ({"value.converter.schema.registry.ssl.keystore.location": "/k.p12",
      "value.converter.schema.registry.ssl.keystore.type": "PKCS12"}, "value.converter.schema.registry.ssl.keystore.type"),
    ({"value.converter.some.unknown.key": "x"}, "value.converter.some.unknown.key"),
])
def test_bad_or_missing_registry_keys_are_refused_naming_the_key(extra: dict[str, str], key: str) -> None:
    base = {"value.converter.schema.registry.url": "http://a:8081"}
    if key == "value.converter.schema.registry.url":
        base = {}
    with pytest.raises(ConfigError) as e:
        settings(**{**base, **extra})
    assert e.value.key == key


def test_secrets_never_show_in_the_refusal() -> None:
    with pytest.raises(ConfigError) as e:
        settings(**{"value.converter.schema.registry.url": "http://a:8081",
                    "value.converter.basic.auth.credentials.source": "BAD",
                    "value.converter.basic.auth.user.info": "alice:s3cret"})
    assert "s3cret" not in str(e.value)


def test_apicurio_avro_reads_its_ccompat_api_and_refuses_other_frames_without_headers() -> None:
    """Without headers, Confluent's frame only; headers mode: tests/unit/test_registry_apicurio_headers.py."""
    r = registry_settings(settings(APICURIO, **{"value.converter.apicurio.registry.url": "http://r:8080/apis/registry/v3"}))
    assert r is not None and r.format == "avro" and r.urls == ("http://r:8080/apis/ccompat/v7",)
    for key, value in [("value.converter.apicurio.registry.id-handler", "io.apicurio.registry.serde.Legacy8ByteIdHandler"),
                       ("value.converter.apicurio.registry.use-id", "globalId")]:
        with pytest.raises(ConfigError) as e:
            settings(APICURIO, **{"value.converter.apicurio.registry.url": "http://r:8080/apis/registry/v3", key: value})
        assert e.value.key == key
    with pytest.raises(ConfigError) as e:
        settings(APICURIO)
    assert e.value.key == "value.converter.apicurio.registry.url"


def test_apicurio_2_settings_are_read_only_with_content_ids_and_no_headers_said_outright() -> None:
    """Apicurio 2's serdes default to 8-byte global ids in Kafka headers; its
    ``as-confluent=true`` (a key Apicurio 3 no longer has) or its ``Legacy4ByteIdHandler`` change
    only the frame, to 4 bytes of the global id. Such settings are read when ``use-id=contentId``
    and ``headers.enabled=false`` are given too (what tests/integration/test_apicurio.py's Java
    producer writes), and refused naming the missing key otherwise: a global id read as a content
    id can name another schema."""
    pre = "value.converter.apicurio.registry."
    url = {pre + "url": "http://r:8080/apis/registry/v2"}
    both = {pre + "use-id": "contentId", pre + "headers.enabled": "false"}
    for two in ({pre + "as-confluent": "true"}, {pre + "id-handler": "io.apicurio.registry.serde.Legacy4ByteIdHandler"},
                {pre + "as-confluent": "true", pre + "id-handler": "io.apicurio.registry.serde.Legacy4ByteIdHandler"}):
        r = registry_settings(settings(APICURIO, **url, **two, **both))
        assert r is not None and r.urls == ("http://r:8080/apis/ccompat/v7",)
        for missing in both:
            with pytest.raises(ConfigError) as e:
                settings(APICURIO, **url, **two, **{k: v for k, v in both.items() if k != missing})
            assert e.value.key == missing and "Apicurio 2" in str(e.value)
    with pytest.raises(ConfigError) as e:  # Apicurio 2's 8-byte DefaultIdHandler
        settings(APICURIO, **url, **both, **{pre + "as-confluent": "false"})
    assert e.value.key == pre + "as-confluent"


@pytest.mark.parametrize("converter", [
    "io.apicurio.registry.utils.converter.ExtJsonConverter",
])
def test_other_registry_converters_are_refused_for_now_naming_the_key(converter: str) -> None:
    with pytest.raises(ConfigError) as e:
        settings(converter, **{"value.converter.schema.registry.url": "http://a:8081"})
    assert e.value.key == "value.converter" and "not yet" in str(e.value)


def test_registry_secrets_are_masked_and_redacted() -> None:
    s = settings(**{"value.converter.schema.registry.url": "http://u:pw123@a:8081",
                    "value.converter.basic.auth.user.info": "alice:s3cret"})
    shown = str(s.masked())
    assert "pw123" not in shown and "s3cret" not in shown
    assert {"pw123", "alice:s3cret"} <= s.secret_values()
