"""The keys of icesink's settings and how they are read, below :mod:`icesink.shared.config` (which
re-exports every public name here): the converters and transforms accepted, the checks across
settings that ``Settings`` runs once built, the config file's and the environment's keys, and
how a config error shows a value. Leaf module: no I/O but reading the config file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tomllib
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icesink.shared.errors import ConfigError
from icesink.shared.registry_settings import is_registry_converter, registry_settings
from icesink.shared.transform_settings import TransformSpec, gone_fields, inserted_fields
from icesink.shared.secrets import Hidden, is_secret_key, mask_url

if TYPE_CHECKING:
    from icesink.shared.config import Settings

log = logging.getLogger("icesink.shared.config")  # the settings' own logger, as before this module was split out

JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
STRING_CONVERTER = "org.apache.kafka.connect.storage.StringConverter"
BYTES_CONVERTER = "org.apache.kafka.connect.converters.ByteArrayConverter"
KEY_CONVERTERS = (
    STRING_CONVERTER,
    JSON_CONVERTER,
    BYTES_CONVERTER,
)
VALUE_CONVERTERS = (JSON_CONVERTER, STRING_CONVERTER, BYTES_CONVERTER)
#: The ``_cdc`` fields Debezium change events can be routed on (``iceberg.tables.route-field``).
CDC_ROUTE_FIELDS = ("target", "source", "op")
# The reference's Debezium SMT, under its Tabular and its Apache package (agents/debezium.py).
DEBEZIUM_TRANSFORMS = (
    "io.tabular.iceberg.connect.transforms.DebeziumTransform",
    "org.apache.iceberg.connect.transforms.DebeziumTransform",
)
DEBEZIUM_PROPS = ("cdc.target.pattern",)

# Reference-sink keys that are accepted and have no effect here (documented in docs/config.md).
ACCEPTED_IGNORED = {
    "connector.class": "icesink is not a Kafka Connect plugin; the key is ignored",
    "tasks.max": "parallelism comes from worker replicas (processes), not tasks",
    "name": "the sink group is named by group.id",
}

# Kafka Connect's per-connector consumer overrides of settings icesink has, so a connector's
# config moves over as it is; the icesink key wins when both are given. Other
# consumer.override.* keys are unknown settings (warned about).
CONNECT_CONSUMER_OVERRIDES = {
    "consumer.override.fetch.min.bytes": "consumer.fetch-min-bytes",
    "consumer.override.max.poll.records": "consumer.max-batch",
    "consumer.override.session.timeout.ms": "consumer.session-timeout-ms",
    "consumer.override.max.poll.interval.ms": "consumer.max-poll-interval-ms",
}

PREFIX_CATALOG = "iceberg.catalog."
PREFIX_CREATE_PROPS = "iceberg.tables.auto-create-props."
# Per-table keys iceberg.table.<table>.<prop>: prop -> the map field holding table -> value.
TABLE_PROPS = ("partition-by", "route-regex", "timestamp-unit", "timestamp-fields", "id-columns", "commit-branch")
TABLE_KEY = re.compile(r"^iceberg\.table\.(?P<table>.+)\.(?P<prop>" + "|".join(TABLE_PROPS) + ")$")
#: The branch a table's commits go to unless the commit-branch keys name another (Iceberg's).
MAIN_BRANCH = "main"
#: What a ``worker.id`` may be: it names this replica's directories (staging, Faust's data) and
#: is part of its data files' names, so a plain name, never a path.
WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
WORKER_ID_RULE = ("a plain name: 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit "
                  "(it names this replica's directories and files, so never a path)")
#: Units of JSON numbers in timestamp and time columns (agents.convert.EPOCH_UNITS).
TIMESTAMP_UNITS = ("s", "ms", "us", "ns")


@dataclass(frozen=True)
class CommitBranches:
    """The branch each table's rounds commit to, as the reference sink's
    ``iceberg.tables.default-commit-branch`` and ``iceberg.table.<table>.commit-branch`` say
    (unset: main). A plain value: it crosses into the commit processes pickled."""

    default: str = MAIN_BRANCH
    tables: tuple[tuple[str, str], ...] = ()

    def of(self, table: str) -> str:
        return dict(self.tables).get(table, self.default)


# Checks across settings ---------------------------------------------------------------------


def check_settings(s: Settings) -> None:
    """What one setting cannot say alone: the checks across settings, run by ``Settings`` once built
    (raises ConfigError naming the key)."""
    if is_registry_converter(s.value_converter):
        registry_settings(s)  # raises naming the key (icesink/shared/registry_settings.py)
        _check_registry_values(s)
    elif s.value_converter not in VALUE_CONVERTERS:
        raise ConfigError("value.converter", s.value_converter, f"one of {VALUE_CONVERTERS} or a schema-registry "
                          "converter (docs/schema-registry.md)")
    else:
        for key in sorted(s.value_converter_props):
            log.info("setting %s accepted; it has no effect for this converter", key)
    _check_transforms(s)
    if s.commit_idle_interval_ms is not None and s.commit_idle_interval_ms < s.commit_interval_ms:
        raise ConfigError("iceberg.control.commit.idle-interval-ms", s.commit_idle_interval_ms,
                          f"unset or at least iceberg.control.commit.interval-ms ({s.commit_interval_ms})")
    json_text = any(t.kind == "json-to-map" for t in s.transform_chain)  # StringConverter values read as JSON
    if s.value_converter != JSON_CONVERTER and not is_registry_converter(s.value_converter) and not json_text:
        _check_raw_values(s)
    if is_registry_converter(s.key_converter):
        registry_settings(s, "key")  # the value converter's key family, under key.converter.*; keys decode into
        # iceberg.tables.key-column when set (agents/formats/registry_keys.py), else are not read
    elif s.key_converter not in KEY_CONVERTERS:
        raise ConfigError("key.converter", s.key_converter, f"one of {KEY_CONVERTERS} or a schema-registry "
                          "converter (docs/schema-registry.md)")
    else:
        for key in sorted(s.key_converter_props):
            log.info("setting %s accepted; it has no effect for this converter", key)
    if s.kafka_metadata and s.key_column and s.key_column.startswith(s.kafka_metadata_field):
        raise ConfigError(
            "iceberg.tables.key-column", s.key_column,
            f"a name apart from the Kafka metadata columns ({s.kafka_metadata_field}...)",
        )
    if s.sasl_mechanism and not s.security_protocol.startswith("SASL"):
        raise ConfigError(
            "security.protocol", s.security_protocol,
            "SASL_PLAINTEXT or SASL_SSL when sasl.mechanism is set",
        )
    # Without these aiokafka clients fail at construction and Faust's would fall back to
    # no SASL (agents/worker.py _faust_credentials): refuse at start-up instead.
    if s.security_protocol.startswith("SASL") and not s.sasl_mechanism:
        raise ConfigError(
            "sasl.mechanism", None,
            f"PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 when security.protocol is {s.security_protocol}",
        )
    if s.sasl_mechanism and (not s.sasl_username or s.sasl_password is None):
        key = "sasl.username" if not s.sasl_username else "sasl.password"
        raise ConfigError(key, None, f"a value when sasl.mechanism is {s.sasl_mechanism}")
    if not s.tables and not s.dynamic_tables:
        raise ConfigError("iceberg.tables", "", "one or more namespace.table names (or iceberg.tables.dynamic-enabled=true)")
    if s.dynamic_tables and not s.route_field:
        raise ConfigError("iceberg.tables.route-field", None,
                          "the field naming each record's table, since iceberg.tables.dynamic-enabled is true")
    if s.table_route_regex and not s.route_field:
        raise ConfigError("iceberg.tables.route-field", None, "a field name, since route-regex is set for "
                          + ", ".join(sorted(s.table_route_regex)))
    for table, pattern in s.table_route_regex.items():
        if table not in s.tables:
            raise ConfigError(f"iceberg.table.{table}.route-regex", pattern,
                              f"a table listed in iceberg.tables {list(s.tables)}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"iceberg.table.{table}.route-regex", pattern, f"a valid regular expression ({exc})") from None
    for prop, per_table in (
        ("partition-by", s.table_partition_by),
        ("timestamp-unit", s.table_timestamp_unit),
        ("timestamp-fields", s.table_timestamp_fields),
        ("id-columns", s.table_id_columns),
        ("commit-branch", s.table_commit_branch),
    ):
        for table in per_table:
            if table not in s.tables and not s.dynamic_tables:
                raise ConfigError(
                    f"iceberg.table.{table}.{prop}", table,
                    f"a table listed in iceberg.tables {list(s.tables)}",
                )
    units = {"iceberg.tables.timestamp-unit": s.timestamp_unit} | {
        f"iceberg.table.{t}.timestamp-unit": u for t, u in s.table_timestamp_unit.items()
    }
    for key, unit in units.items():
        if unit not in TIMESTAMP_UNITS:
            raise ConfigError(key, unit, f"one of {', '.join(TIMESTAMP_UNITS)} (the unit of epoch numbers)")
    patterns = {"iceberg.tables.timestamp-fields": s.timestamp_fields} | {
        f"iceberg.table.{t}.timestamp-fields": p for t, p in s.table_timestamp_fields.items()
    }
    for key, fields_pattern in patterns.items():
        if fields_pattern is not None:
            try:
                re.compile(fields_pattern)
            except re.error as exc:
                raise ConfigError(key, fields_pattern, f"a regular expression over dotted field names ({exc})") from None
    branches = {"iceberg.tables.default-commit-branch": s.default_commit_branch} | {
        f"iceberg.table.{t}.commit-branch": b for t, b in s.table_commit_branch.items()
    }
    for key, branch in branches.items():
        if branch is not None and (not branch.strip() or branch != branch.strip()):
            raise ConfigError(key, branch, "a branch name (no blank, no leading or trailing spaces); unset: main")
    for table in s.tables:
        if "." not in table:
            raise ConfigError("iceberg.tables", table, "namespace.table names, e.g. rpc.pizzas")
    version = s.auto_create_props.get("format-version")
    if version is not None and version not in ("1", "2"):
        raise ConfigError(  # pyiceberg 0.12 (which commits) refuses to write format-version 3 metadata
            "iceberg.tables.auto-create-props.format-version", version,
            "1 or 2 (format-version 3 tables cannot be committed by pyiceberg 0.12)",
        )
    # Partition expressions are parsed here so a typo stops the start-up, not a commit.
    from icesink.shared.partitioning import parse_partition_by  # pure parser

    if s.default_partition_by:
        reraise_as("iceberg.tables.default-partition-by", parse_partition_by, s.default_partition_by)
    for table, spec in s.table_partition_by.items():
        reraise_as(f"iceberg.table.{table}.partition-by", parse_partition_by, spec)


def _check_raw_values(s: Settings, why: str | None = None) -> None:
    """String or bytes values have no fields: refuse the settings that name one, and a value
    column that is also the key or a metadata column. ``why``: another format's reason."""
    fields = {
        "iceberg.tables.route-field": s.route_field, "iceberg.tables.cdc-field": s.cdc_field,
        "iceberg.tables.timestamp-fields": s.timestamp_fields or next(iter(s.table_timestamp_fields.values()), None),
        "value.converter.schemas.enable": "true" if s.value_converter_schemas_enable else None,
        "transforms": ",".join(s.transforms) or None,
    }
    for key, value in fields.items():
        if value is not None:
            raise ConfigError(key, value, f"unset: {s.value_converter} values are text or bytes, not JSON "
                              "objects with fields (the whole value goes to iceberg.tables.value-column)"
                              if why is None else f"unset with {s.value_converter}: {why}")
    if why is None and (s.value_column == s.key_column
                        or (s.kafka_metadata and s.value_column.startswith(s.kafka_metadata_field))):
        raise ConfigError("iceberg.tables.value-column", s.value_column,
                          "a name apart from the key and Kafka metadata columns")


def _check_registry_values(s: Settings) -> None:
    """Registry values state their types: refuse the settings that only JSON values take.
    Route and CDC fields read the decoded rows (agents/routing.py, agents/mirror.py); the
    Debezium transform reads Debezium's Avro events (agents/debezium.py)."""
    timestamp_fields = s.timestamp_fields or next(iter(s.table_timestamp_fields.values()), None)
    if timestamp_fields is not None:
        raise ConfigError("iceberg.tables.timestamp-fields", timestamp_fields,
                          f"unset with {s.value_converter}: it makes JSON strings timestamps; Avro schemas "
                          "state their types (timestamp-millis and timestamp-micros land as timestamps)")
    if s.value_converter_schemas_enable:
        raise ConfigError("value.converter.schemas.enable", "true",
                          f"unset with {s.value_converter}: the registry's schema is the records' schema")


def _converted_fields(t: TransformSpec) -> set[str]:
    if t.kind == "cast":
        return {e.split(":")[0].strip() for e in t.props["spec"].split(",") if ":" in e}
    return {t.props.get("field", "")}


def _check_conversions(s: Settings, chain: tuple[TransformSpec, ...]) -> None:
    """Cast and TimestampConverter on the value's top-level fields of JSON values; the $Key
    transforms and ValueToKey where no key lands (docs/transforms.md)."""
    for t in chain:
        key = f"transforms.{t.name}"
        if t.predicate is not None and t.kind in ("cast", "timestamp-converter"):
            raise ConfigError(f"{key}.predicate", t.predicate.name, f"unset: {t.props['type']} applies to every "
                              "record here (a predicate on a value transform is not built yet)")
        if t.kind in ("cast", "timestamp-converter"):
            whole = ("spec", t.props["spec"]) if t.kind == "cast" and ":" not in t.props["spec"] else (
                ("field", t.props.get("field", "")) if t.kind == "timestamp-converter" and not t.props.get("field") else None)
            if whole is not None:
                raise ConfigError(f"{key}.{whole[0]}", whole[1], "a field of the value: converting the whole value "
                                  "(a struct here) fails every record in Kafka Connect")
            if s.value_converter != JSON_CONVERTER or any(d.kind == "debezium" for d in chain):
                raise ConfigError(f"{key}.type", t.props["type"], "unset with this value.converter or a Debezium "
                                  "transform: it acts on JSON values' fields here (not built yet for the others)")
        if t.kind == "value-to-key" and s.key_column is not None and (
                s.value_converter in (STRING_CONVERTER, BYTES_CONVERTER) or any(d.kind == "debezium" for d in chain)):
            raise ConfigError(f"{key}.type", t.props["type"], "unset with this value.converter or a Debezium transform "
                              "and iceberg.tables.key-column: it keys by value fields of a struct value (Connect fails "
                              "string values; not built yet after Debezium)")
        if t.kind == "value-to-key" and s.key_column is not None:
            fields = {f.strip() for f in t.props["fields"].split(",")}
            later = chain[chain.index(t) + 1:]
            for c in later:
                if c.kind in ("cast", "timestamp-converter") and fields & _converted_fields(c):
                    raise ConfigError(f"transforms.{c.name}.type", c.props["type"], f"unset, or before ValueToKey "
                                      f"{t.name}: converting a field of its key after it is not built yet")
        if t.kind.endswith("-key") and t.kind != "value-to-key" and s.key_column is not None:
            _check_key_transform(s, chain, t)


def _check_key_transform(s: Settings, chain: tuple[TransformSpec, ...], t: TransformSpec) -> None:
    """A $Key transform with a key column: ReplaceField$Key, HoistField$Key and Cast$Key act on
    it (agents/transforms/keys.py); the others are refused, each saying why."""
    key, type_ = f"transforms.{t.name}", t.props["type"]
    before = chain[:chain.index(t)]
    if any(c.kind == "value-to-key" for c in chain[chain.index(t) + 1:]):
        return  # ValueToKey replaces the key it changed, as in Connect
    if t.kind == "insert-field-key" and t.props.get("topic.field") and any(c.kind == "regex-router" for c in before):
        raise ConfigError("transforms", ",".join(s.transforms), "InsertField$Key before any RegexRouter: its topic "
                          "field records the topic as consumed (routing still sees the new one)")
    if t.predicate is not None:
        raise ConfigError(f"{key}.predicate", t.predicate.name, f"unset: {type_} applies to every record's key "
                          "here (a predicate on a key transform is not built yet)")
    if is_registry_converter(s.key_converter) and t.kind in ("cast-key", "timestamp-converter-key") and not any(
            c.kind == "value-to-key" for c in before):
        raise ConfigError(f"{key}.type", type_, "unset with a schema-registry key.converter and "
                          f"iceberg.tables.key-column: {type_.split('.')[-1]} on registry keys is not built yet")
    # a registry key is a struct when its schema is one (a record, message, object): known per record
    struct = is_registry_converter(s.key_converter) or any(c.kind in ("value-to-key", "hoist-field-key") for c in before)
    whole = (t.kind == "cast-key" and ":" not in t.props["spec"]) or (
        t.kind == "timestamp-converter-key" and not t.props.get("field"))
    if whole and struct:
        prop = "spec" if t.kind == "cast-key" else "field"
        raise ConfigError(f"{key}.{prop}", t.props.get(prop), f"{'field:type pairs' if prop == 'spec' else 'a field'}: "
                          "the key is a struct here (a ValueToKey or HoistField$Key before it), and Kafka Connect "
                          "fails converting a whole struct")
    if t.kind in ("replace-field-key", "cast-key", "timestamp-converter-key", "insert-field-key") and not whole \
            and not struct:
        raise ConfigError(f"{key}.type", type_, "a ValueToKey or HoistField$Key before it: the key column is the "
                          f"key's text or bytes as consumed, not a struct, and Connect's {type_.split('.')[-1]} "
                          "fails every record with another key")


def _check_key_fields(s: Settings, gone: Mapping[str, str]) -> None:
    """id-columns and cdc-field name the fields as the transforms leave them (the reference reads
    them from the sink record, after every transform): refuse one the chain renamed or dropped."""
    named = [("iceberg.tables.default-id-columns", s.default_id_columns or ""),
             *((f"iceberg.table.{t}.id-columns", v) for t, v in sorted(s.table_id_columns.items()))]
    for key, raw in named:
        for column in (c.strip() for c in raw.split(",") if c.strip()):
            if column in gone:
                raise ConfigError(key, raw, f"columns as the transforms leave them: {column!r} is {gone[column]}")
    if s.cdc_field is not None and (top := s.cdc_field.split(".")[0]) in gone:
        raise ConfigError("iceberg.tables.cdc-field", s.cdc_field,
                          f"a field as the transforms leave it: {top!r} is {gone[top]}")


def _check_transforms(s: Settings) -> None:
    for name in s.transform_props.keys() - set(s.transforms):
        log.warning("settings transforms.%s.* ignored: %s is not listed in transforms", name, name)
    chain = s.transform_chain  # raises naming the bad key (icesink/shared/transform_settings.py)
    debezium = [t.name for t in chain if t.kind == "debezium"]
    for spec in chain:
        if spec.predicate is not None and spec.kind in ("debezium", "kafka-metadata", "insert-field"):
            raise ConfigError(f"transforms.{spec.name}.predicate", spec.predicate.name,
                              f"unset: {spec.props['type']} applies to every record here")
    kinds = [t.kind for t in chain]
    for k in ("kafka-metadata", "insert-field"):
        if k in kinds and "regex-router" in kinds[:len(kinds) - kinds[::-1].index(k) - 1]:
            raise ConfigError("transforms", ",".join(s.transforms), f"the {k} transform before any RegexRouter: "
                              "its topic column records the topic as consumed (routing still sees the new one)")
    _check_key_fields(s, gone_fields(chain))
    made = {t.props["target.field"] for t in chain if t.kind == "copy-value"} | {
        pair.split(":")[1].strip() for t in chain if t.kind == "replace-field"
        for pair in t.props.get("renames", "").split(",") if pair.strip()} | {
        name for name, source, _ in inserted_fields(chain) if source != "topic"}
    if s.evolve_schema and any(t.kind in ("copy-value", "replace-field", "hoist-field", "cast", "timestamp-converter")
                               for t in chain):
        raise ConfigError("iceberg.tables.evolve-schema-enabled", "true", "unset with ReplaceField, CopyValue, "
                          "HoistField, Cast or TimestampConverter: schema evolution reads the values before the "
                          "transforms (not supported yet)")
    _check_conversions(s, chain)
    if any(t.kind == "hoist-field" for t in chain) and s.route_field and s.route_field != "@topic":
        raise ConfigError("iceberg.tables.route-field", s.route_field, "unset or @topic with HoistField: routing "
                          "reads the values before it (not supported yet)")
    if s.route_field in made:
        raise ConfigError("iceberg.tables.route-field", s.route_field, "a field of the consumed value: routing reads "
                          "the values before ReplaceField and CopyValue (route on the field's original name)")
    if [t.kind for t in chain].count("kafka-metadata") > 1:
        raise ConfigError("transforms", ",".join(s.transforms), "at most one KafkaMetadataTransform")
    if s.kafka_metadata and "kafka-metadata" in [t.kind for t in chain]:
        raise ConfigError("iceberg.tables.kafka-metadata-enabled", "true",
                          "unset with a KafkaMetadataTransform: one of the two adds the metadata columns")
    if len(debezium) > 1:
        raise ConfigError("transforms", ",".join(s.transforms), "at most one Debezium transform")
    _check_cdc_transforms(s, chain)
    pattern = s.debezium_target_pattern
    if pattern is not None:
        for found in re.findall(r"\{[^{}]*\}", pattern):
            if found not in ("{db}", "{table}"):
                raise ConfigError(
                    f"transforms.{debezium[0]}.cdc.target.pattern", pattern,
                    f"a pattern using only the placeholders {{db}} and {{table}} ({found} is unknown)",
                )
        route = s.route_field or ""
        if route.startswith("_cdc.") and route[5:] not in CDC_ROUTE_FIELDS:
            raise ConfigError("iceberg.tables.route-field", route, "a field of the row image or one of "
                              + ", ".join(f"_cdc.{f}" for f in CDC_ROUTE_FIELDS) + " (Debezium transform)")


def _check_cdc_transforms(s: Settings, chain: Any) -> None:
    """ExtractNewRecordState, DmsTransform, JsonToMapTransform, MongoDebeziumTransform
    (agents/transforms/unwrap.py, dms.py, json_to_map.py, mongo.py)."""
    cdc = [t for t in chain if t.kind in ("unwrap", "dms", "json-to-map", "mongo-debezium")]
    if not cdc:
        return
    for t in cdc:
        if t.predicate is not None:
            raise ConfigError(f"transforms.{t.name}.predicate", t.predicate.name,
                              f"unset: {t.props['type']} applies to every record here")
    first = cdc[0]
    kinds = [t.kind for t in chain]
    if first.kind == "mongo-debezium" and len(cdc) == 1 and "debezium" in kinds:
        if kinds.index("debezium") < kinds.index("mongo-debezium"):
            raise ConfigError("transforms", ",".join(s.transforms), f"{first.props['type']} before DebeziumTransform: "
                              "it types the change events that one reads")
    elif any(t.kind == "debezium" for t in chain):
        raise ConfigError("transforms", ",".join(s.transforms), "one of DebeziumTransform and "
                          f"{first.props['type']}: both read the change events")
    if s.evolve_schema:
        raise ConfigError("iceberg.tables.evolve-schema-enabled", "true", f"unset with {first.props['type']}: schema "
                          "evolution reads the values before the transforms (not supported yet)")
    mongo_cdc = first.kind == "mongo-debezium" and "debezium" in kinds and (s.route_field or "").startswith("_cdc.")
    if s.route_field and s.route_field != "@topic" and not mongo_cdc:  # _cdc fields: read from op and source
        raise ConfigError("iceberg.tables.route-field", s.route_field, f"unset or @topic with {first.props['type']}: "
                          "routing reads the values before it (not supported yet)")
    for t in cdc:
        if t.kind == "json-to-map" and s.value_converter != STRING_CONVERTER:
            raise ConfigError("value.converter", s.value_converter, f"{STRING_CONVERTER} with {t.props['type']}: "
                              "it takes JSON text values, as the reference")
        if t.kind == "json-to-map" and s.value_converter_schemas_enable:
            raise ConfigError("value.converter.schemas.enable", "true", f"unset with {STRING_CONVERTER}")
        before = [x.kind for x in chain[:list(chain).index(t)]]
        if t.kind == "json-to-map" and set(before) - {"filter", "regex-router", "kafka-metadata", "insert-field"}:
            raise ConfigError("transforms", ",".join(s.transforms), f"{t.props['type']} before the transforms that "
                              "change values: they need an object, it makes one of the text")
        if t.kind == "mongo-debezium" and set(before) - {"filter", "regex-router", "kafka-metadata", "insert-field"}:
            raise ConfigError("transforms", ",".join(s.transforms), f"{t.props['type']} before the transforms that "
                              "change values: they need its typed before/after")
        if t.kind == "mongo-debezium" and (s.value_converter != JSON_CONVERTER or not s.value_converter_schemas_enable):
            raise ConfigError("value.converter.schemas.enable" if s.value_converter == JSON_CONVERTER else "value.converter",
                              "false" if s.value_converter == JSON_CONVERTER else s.value_converter,
                              f"{JSON_CONVERTER} with value.converter.schemas.enable=true for {t.props['type']}: the "
                              "reference reads Envelope-schema values only (others become tombstones); "
                              "registry values not supported yet")
        if t.kind == "dms" and (s.value_converter != JSON_CONVERTER or s.value_converter_schemas_enable):
            raise ConfigError("value.converter.schemas.enable" if s.value_converter == JSON_CONVERTER
                              else "value.converter", "true" if s.value_converter == JSON_CONVERTER else s.value_converter,
                              f"schemaless JSON with {t.props['type']}: it refuses values with a schema, as the reference")


def catalog_paths_absolute(props: Mapping[str, str]) -> dict[str, str]:
    """Catalog properties with their local paths made absolute: a SQLite ``uri``
    (``sqlite:///relative.db``) and the ``warehouse`` of a catalog that is not REST (where it
    names a warehouse, not a directory) when it is a plain relative path: table locations
    written into metadata must not depend on a process's directory."""
    out = dict(props)
    uri = out.get("uri", "")
    if (m := _SQLITE_RELATIVE.fullmatch(uri)) is not None and not m["path"].startswith((":memory:", "file:")):
        out["uri"] = f"{m['scheme']}:///{os.path.abspath(m['path'])}{m['query'] or ''}"
    warehouse = out.get("warehouse")
    rest = out.get("type", "rest" if uri.startswith(("http://", "https://")) else "").lower() == "rest"
    if warehouse and not rest and "://" not in warehouse and not os.path.isabs(warehouse):
        out["warehouse"] = os.path.abspath(warehouse)
    return out


def catalog_s3_addressing(props: Mapping[str, str]) -> dict[str, str]:
    """The reference's ``s3.path-style-access`` (Java S3FileIO's) as pyiceberg's opposite switch
    ``s3.force-virtual-addressing``: pyiceberg 0.12 has no path-style key and ignored it (with an
    endpoint it then addressed buckets by path whatever the user set)."""
    style = props.get("s3.path-style-access")
    if style is None:
        return dict(props)
    if style.strip().lower() not in ("true", "false"):
        raise ConfigError(PREFIX_CATALOG + "s3.path-style-access", style, "true or false")
    virtual = "false" if style.strip().lower() == "true" else "true"
    given = props.get("s3.force-virtual-addressing")
    if given is not None and given.strip().lower() != virtual:
        raise ConfigError(PREFIX_CATALOG + "s3.path-style-access", style,
                          f"a value that agrees with {PREFIX_CATALOG}s3.force-virtual-addressing={given} "
                          "(path style is virtual addressing off), or only one of the two")
    return {**props, "s3.force-virtual-addressing": virtual}


_SQLITE_RELATIVE = re.compile(r"(?P<scheme>sqlite(?:\+\w+)?):///(?P<path>[^/?][^?]*)(?P<query>\?.*)?")


def reraise_as(key: str, fn: Any, value: str) -> None:
    try:
        fn(value)
    except ConfigError as exc:
        raise ConfigError(key, value, exc.expected) from None


# Loading -----------------------------------------------------------------------------------


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        # Nested TOML tables flatten to dotted keys, except the values of known map keys.
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # missing, a directory, no permission, not text
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError("--config", str(path), f"a readable settings file ({reason})") from None
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("--config", str(path), f"a valid JSON or TOML file ({exc})") from exc
    if not isinstance(raw, dict):
        raise ConfigError("--config", str(path), "a JSON object or TOML document of settings")
    return flatten(raw)


#: pyiceberg 0.12 catalog and FileIO properties whose names hold a ``-`` (from pyiceberg.io and
#: its catalogs), so that ``ICESINK_ICEBERG_CATALOG_S3_ACCESS_KEY_ID`` means ``s3.access-key-id``.
_HYPHENATED_CATALOG_PROPS = (
    "adls.account-host", "adls.account-key", "adls.account-name", "adls.blob-storage-authority",
    "adls.blob-storage-scheme", "adls.client-id", "adls.client-secret", "adls.connection-string",
    "adls.dfs-storage-authority", "adls.dfs-storage-scheme", "adls.sas-token", "adls.tenant-id",
    "client.access-key-id", "client.profile-name", "client.role-arn", "client.role-session-name",
    "client.secret-access-key", "client.session-token", "gcs.cache-timeout", "gcs.default-bucket-location",
    "gcs.oauth2.token-expires-at", "gcs.project-id", "gcs.requester-pays", "gcs.version-aware",
    "glue.access-key-id", "glue.max-retries", "glue.profile-name", "glue.retry-mode", "glue.secret-access-key",
    "glue.session-token", "glue.skip-archive", "oauth2-server-uri", "rest.signing-name", "rest.signing-region",
    "rest.sigv4-enabled", "s3.access-key-id", "s3.connect-timeout", "s3.force-virtual-addressing",
    "s3.profile-name", "s3.proxy-uri", "s3.request-timeout", "s3.resolve-region", "s3.role-arn",
    "s3.role-session-name", "s3.secret-access-key", "s3.server-side-encryption", "s3.session-token",
    "s3.sse-kms-key-id",
)
_CATALOG_ENV = {k.upper().replace(".", "_").replace("-", "_"): k for k in _HYPHENATED_CATALOG_PROPS}


def env_keys(environ: Mapping[str, str], known: Mapping[str, str]) -> dict[str, str]:
    """``ICESINK_<KEY>`` variables as config keys. Known keys map exactly; catalog properties
    use ``ICESINK_ICEBERG_CATALOG_<PROP>``: pyiceberg's hyphenated properties by name
    (``S3_ACCESS_KEY_ID``: ``s3.access-key-id``), any other with ``_`` read as ``.``
    (s3.endpoint, client.region). ``known``: ``METRICS_PORT`` -> ``metrics.port`` for every key
    of Settings."""
    out: dict[str, str] = {}
    for name, value in environ.items():
        if not name.startswith("ICESINK_"):
            continue
        rest = name[len("ICESINK_"):]
        if rest in known:
            out[known[rest]] = value
        elif rest.startswith("ICEBERG_CATALOG_"):
            prop = rest[len("ICEBERG_CATALOG_"):]
            out[PREFIX_CATALOG + _CATALOG_ENV.get(prop, prop.lower().replace("_", "."))] = value
        elif rest.startswith("SPARK_"):
            out["spark." + rest[len("SPARK_"):].lower().replace("_", ".")] = value
        else:
            log.warning("ignoring environment variable %s: no setting has that name", name)
    return out


def is_secret_setting(key: str) -> bool:
    """Whether config key ``key`` names a secret (README, Secrets): masked wherever shown."""
    return key in _SECRET_FIELDS or (
        key.startswith((PREFIX_CATALOG, "spark.")) and is_secret_key(key.removeprefix(PREFIX_CATALOG)))


_SECRET_FIELDS = {"sasl.password", "ssl.password", "iceberg.control.secret"}


def shown(key: str, value: Any) -> Any:
    """A value as a config error may quote it: secrets only by type, URL passwords masked."""
    if key in _SECRET_FIELDS or (
        key.startswith((PREFIX_CATALOG, "spark.")) and is_secret_key(key.removeprefix(PREFIX_CATALOG))
    ):
        return Hidden(value)
    return mask_url(value) if isinstance(value, str) else value


def kafka_security_kwargs(s: Settings) -> dict[str, Any]:
    """Security settings for aiokafka clients (producer, consumer, admin): ``Settings.kafka_client_kwargs``."""
    kw: dict[str, Any] = {"security_protocol": s.security_protocol}
    if s.sasl_mechanism:
        kw["sasl_mechanism"] = s.sasl_mechanism
        kw["sasl_plain_username"] = s.sasl_username
        kw["sasl_plain_password"] = s.sasl_password.get_secret_value() if s.sasl_password else None
    if s.security_protocol in ("SSL", "SASL_SSL"):
        import ssl  # stdlib, no I/O at import

        ctx = ssl.create_default_context(cafile=s.ssl_cafile)
        if s.ssl_certfile:
            ctx.load_cert_chain(
                s.ssl_certfile, s.ssl_keyfile,
                s.ssl_password.get_secret_value() if s.ssl_password else None,
            )
        kw["ssl_context"] = ctx
    return kw


def check_null_defaults(s: Settings) -> None:
    """iceberg.tables.replace-null-with-default=false acts only where values carry no schema."""
    if not s.replace_null_with_default and (s.value_converter != JSON_CONVERTER or s.value_converter_schemas_enable):
        raise ConfigError("iceberg.tables.replace-null-with-default", "false",
                          f"true (the default) with {s.value_converter}"
                          f"{' and schemas' if s.value_converter_schemas_enable else ''}: icesink "
                          "writes a null field as null, it does not substitute a schema's default")
