"""Config providers as Kafka's (``${file:path:key}``, ``${env:VAR}``): declared by the process,
restricted to allowed paths and variables, resolved values never quoted in an error, and secrets
of the settings wherever they land."""

from __future__ import annotations

import json
import os

import pytest

from icesink.shared.config import load_settings
from icesink.shared.config_providers import (
    ENV_PROVIDER, FILE_PROVIDER, declared, is_reference, parse_properties, resolve,
)
from icesink.shared.errors import ConfigError

SECRET = "file-secret-value-1"


def _declare(allowed: str, pattern: str = "APP_.*") -> dict[str, str]:
    return {"config.providers": "file,env", "config.providers.file.class": FILE_PROVIDER,
            "config.providers.file.param.allowed.paths": allowed, "config.providers.env.class": ENV_PROVIDER,
            "config.providers.env.param.allowlist.pattern": pattern}


@pytest.fixture
def secrets_dir(tmp_path):
    d = tmp_path / "secrets"
    d.mkdir()
    (d / "creds.properties").write_text(f"# creds\ntoken={SECRET}\nuser: alice\nspaced value\n")
    (tmp_path / "outside.properties").write_text("token=outside-value-9\n")
    return d


def test_references_resolve_with_the_declared_providers(secrets_dir):
    raw = {**_declare(str(secrets_dir)), "iceberg.catalog.token": f"${{file:{secrets_dir}/creds.properties:token}}",
           "iceberg.catalog.uri": "https://${env:APP_USER}@catalog:8181", "topics": "t"}
    out, provided = resolve(raw, declared(raw), {"APP_USER": "bob", "HOME": "/root"})
    assert out == {"iceberg.catalog.token": SECRET, "iceberg.catalog.uri": "https://bob@catalog:8181", "topics": "t"}
    assert provided == {"iceberg.catalog.token": SECRET, "iceberg.catalog.uri": "https://bob@catalog:8181"}
    assert is_reference(raw["iceberg.catalog.token"]) and not is_reference(raw["iceberg.catalog.uri"])


@pytest.mark.parametrize("value, why", [
    ("${file:{outside}:token}", "allowed.paths"),
    ("${file:{secrets}/../outside.properties:token}", "allowed.paths"),
    ("${file:{link}:token}", "allowed.paths"),  # a symbolic link inside pointing outside
    ("${file:{secrets}/creds.properties:missing}", "missing is not one"),
    ("${file:{secrets}/none.properties:token}", "readable"),
    ("${file:relative.properties:token}", "ABSOLUTE"),
    ("${env:HOME}", "allowlist.pattern"),
    ("${env:APP_UNSET}", "not"),
    ("${env:ICESINK_SECRET_X}", "not"),  # icesink's own settings are not the provider's to read
    ("${env:/path:APP_USER}", "no path"),
    ("${vault:/a:b}", "declared in config.providers"),
])
def test_references_that_do_not_resolve_name_the_key_and_never_the_value(secrets_dir, tmp_path, value, why):
    os.symlink(tmp_path / "outside.properties", secrets_dir / "link.properties")
    value = value.replace("{outside}", str(tmp_path / "outside.properties")).replace("{secrets}", str(secrets_dir)) \
        .replace("{link}", str(secrets_dir / "link.properties"))
    raw = {**_declare(str(secrets_dir), "APP_.*|ICESINK_SECRET_X"), "iceberg.catalog.token": value}
    with pytest.raises(ConfigError) as info:
        resolve(raw, declared(raw), {"APP_USER": "bob", "HOME": "home-value-8", "ICESINK_SECRET_X": "own-value-7"})
    assert info.value.key == "iceberg.catalog.token" and why in str(info.value)
    assert not [v for v in (SECRET, "outside-value-9", "home-value-8", "own-value-7") if v in str(info.value)]


@pytest.mark.parametrize("raw, key", [
    ({"config.providers": "file"}, "config.providers.file.class"),
    ({"config.providers": "file", "config.providers.file.class": "com.acme.Vault"}, "config.providers.file.class"),
    ({"config.providers": "file", "config.providers.file.class": FILE_PROVIDER},
     "config.providers.file.param.allowed.paths"),
    ({"config.providers": "env", "config.providers.env.class": ENV_PROVIDER}, "config.providers.env.param.allowlist.pattern"),
    ({"config.providers": "file", "config.providers.file.class": FILE_PROVIDER,
      "config.providers.file.param.allowed.paths": "relative/dir"}, "config.providers.file.param.allowed.paths"),
    ({"config.providers.other.class": FILE_PROVIDER}, "config.providers.other.class"),
    ({**_declare("/"), "config.providers.env.param.allowed.paths": "/"}, "config.providers.env.param.allowed.paths"),
])
def test_bad_provider_declarations_name_the_key(raw, key):
    with pytest.raises(ConfigError) as info:
        declared(raw)
    assert info.value.key == key


def test_properties_files_read_as_java_reads_them():
    text = "# comment\n! other\n\na=1\nb: 2\nc 3\nd = four five \\\n  six\ne\\:f=g\n  h=  spaced\n"
    assert parse_properties(text) == {"a": "1", "b": "2", "c": "3", "d": "four five six", "e:f": "g", "h": "spaced"}


def test_a_worker_resolves_references_and_keeps_what_they_resolve_to_secret(secrets_dir, tmp_path, caplog):
    path = tmp_path / "sink.json"
    path.write_text(json.dumps({
        **_declare(str(secrets_dir)), "topics": "t", "iceberg.tables": "db.t",
        "iceberg.catalog.token": f"${{file:{secrets_dir}/creds.properties:token}}",
        "iceberg.control.topic": "${env:APP_TOPIC}"}))
    settings = load_settings(path, {"APP_TOPIC": "ctl-from-env"}, {})
    assert settings.catalog_props["token"] == SECRET and settings.control_topic == "ctl-from-env"
    assert {SECRET, "ctl-from-env"} <= settings.secret_values()
    assert SECRET not in str(settings.masked()) and "ctl-from-env" not in settings.redactor()(str(settings.masked()))
    assert "unknown" not in caplog.text  # config.providers* are not settings of the sink
    # an invalid value from a reference: the error names the key and hides the value
    reference = f"${{file:{secrets_dir}/creds.properties:token}}"
    path.write_text(json.dumps({**_declare(str(secrets_dir)), "topics": "t", "iceberg.tables": "db.t",
                                "iceberg.control.commit.interval-ms": reference}))
    with pytest.raises(ConfigError) as info:
        load_settings(path, {}, {})
    assert info.value.key == "iceberg.control.commit.interval-ms" and SECRET not in str(info.value)
