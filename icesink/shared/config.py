"""Settings: one frozen, typed object built once at start-up. Leaf module (no I/O but reading
the config file handed to :func:`load_settings`).

Sources, later ones win: the config file (JSON or TOML, flat dotted keys as in the Iceberg
Kafka Connect sink, or nested TOML tables), then environment variables ``ICESINK_<KEY>``
(``ICESINK_METRICS_PORT`` for ``metrics.port``), then ``--set key=value`` flags. Values may be
Kafka config-provider references (``${file:/path:key}``, ``${env:VAR}``), resolved here with the
providers the config declares (icesink/shared/config_providers.py); what they resolve to is a secret.

Nothing else in icesink reads ``os.environ`` for settings.

The keys, the checks across settings and the reading of the file and environment are in
icesink/shared/config_load.py (a leaf below this module); its public names are re-exported here.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

# The keys, their checks and how they are read (icesink/shared/config_load.py): re-exported, so that
# `from icesink.shared.config import X` works for each as it did before the split.
from icesink.shared.config_load import (
    ACCEPTED_IGNORED as ACCEPTED_IGNORED, MAIN_BRANCH as MAIN_BRANCH, CommitBranches as CommitBranches,
    BYTES_CONVERTER as BYTES_CONVERTER, CDC_ROUTE_FIELDS as CDC_ROUTE_FIELDS,
    CONNECT_CONSUMER_OVERRIDES as CONNECT_CONSUMER_OVERRIDES, DEBEZIUM_PROPS as DEBEZIUM_PROPS,
    DEBEZIUM_TRANSFORMS as DEBEZIUM_TRANSFORMS, JSON_CONVERTER as JSON_CONVERTER, KEY_CONVERTERS as KEY_CONVERTERS,
    PREFIX_CATALOG as PREFIX_CATALOG, PREFIX_CREATE_PROPS as PREFIX_CREATE_PROPS,
    STRING_CONVERTER as STRING_CONVERTER, TABLE_KEY as TABLE_KEY, TABLE_PROPS as TABLE_PROPS,
    TIMESTAMP_UNITS as TIMESTAMP_UNITS, VALUE_CONVERTERS as VALUE_CONVERTERS, WORKER_ID as WORKER_ID,
    WORKER_ID_RULE as WORKER_ID_RULE, catalog_paths_absolute as catalog_paths_absolute, catalog_s3_addressing,
    check_null_defaults, check_settings as check_settings, kafka_security_kwargs, env_keys as env_keys,
    flatten as flatten, is_secret_setting as is_secret_setting, read_config_file as read_config_file,
    reraise_as as reraise_as, shown as shown,
)
from icesink.shared.errors import ConfigError
from icesink.shared.reference_keys import PREFIX_HADOOP, PREFIX_KAFKA, PREFIX_WRITE_PROPS, REFUSED, check_reference_settings
from icesink.shared.reference_keys import kafka_client_kwargs as kafka_props_kwargs
from icesink.shared.transform_settings import TransformSpec, metadata_columns, parse_chain
from icesink.shared.secrets import MASK, Hidden, Redactor, is_secret_key, mask_setting, mask_url, url_secrets

log = logging.getLogger(__name__)


class Settings(BaseSettings):
    """Every setting of a worker replica. Field aliases are the config keys."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    # What to read and where to write (reference keys).
    topics: tuple[str, ...] = Field(alias="topics", min_length=1)
    tables: tuple[str, ...] = Field((), alias="iceberg.tables")
    catalog_name: str = Field("icesink", alias="iceberg.catalog")
    catalog_props: dict[str, str] = Field(default_factory=dict, alias="iceberg.catalog.*")
    auto_create: bool = Field(False, alias="iceberg.tables.auto-create-enabled")
    default_partition_by: str | None = Field(None, alias="iceberg.tables.default-partition-by")
    table_partition_by: dict[str, str] = Field(
        default_factory=dict, alias="iceberg.table.<table>.partition-by"
    )
    # Routing (reference keys): every record to every table, unless route-field is set; then to
    # the tables whose route-regex matches its value, or (dynamic) to the table it names.
    route_field: str | None = Field(None, alias="iceberg.tables.route-field")
    table_route_regex: dict[str, str] = Field(default_factory=dict, alias="iceberg.table.<table>.route-regex")
    dynamic_tables: bool = Field(False, alias="iceberg.tables.dynamic-enabled")
    timestamp_unit: str = Field("ms", alias="iceberg.tables.timestamp-unit")
    table_timestamp_unit: dict[str, str] = Field(
        default_factory=dict, alias="iceberg.table.<table>.timestamp-unit"
    )
    timestamp_fields: str | None = Field(None, alias="iceberg.tables.timestamp-fields")
    table_timestamp_fields: dict[str, str] = Field(
        default_factory=dict, alias="iceberg.table.<table>.timestamp-fields"
    )
    # Schema evolution and auto-create (reference keys; agents/evolution.py, agents/tables.py).
    evolve_schema: bool = Field(False, alias="iceberg.tables.evolve-schema-enabled")
    schema_force_optional: bool = Field(False, alias="iceberg.tables.schema-force-optional")
    schema_case_insensitive: bool = Field(False, alias="iceberg.tables.schema-case-insensitive")
    auto_create_props: dict[str, str] = Field(default_factory=dict, alias="iceberg.tables.auto-create-props.*")
    # The reference's writer properties, over each table's own (icesink/shared/reference_keys.py).
    write_props: dict[str, str] = Field(default_factory=dict, alias="iceberg.tables.write-props.*")
    # Spark's Hadoop configuration: the *-site.xml files of this directory, then iceberg.hadoop.* (reference keys).
    hadoop_conf_dir: str | None = Field(None, alias="iceberg.hadoop-conf-dir")
    hadoop_props: dict[str, str] = Field(default_factory=dict, alias="iceberg.hadoop.*")
    # The control-topic clients' Kafka keys (reference key; the aiokafka-known ones act, others refused).
    kafka_props: dict[str, str] = Field(default_factory=dict, alias="iceberg.kafka.*")
    # A key that is neither the reference's nor icesink's: refused at start, or only warned about.
    unknown_keys: Literal["error", "warn"] = Field("error", alias="config.unknown-keys")
    default_id_columns: str | None = Field(None, alias="iceberg.tables.default-id-columns")
    # Mirror tables (CDC, docs/mirror-tables.md): changes applied by key with position deletes.
    cdc_field: str | None = Field(None, alias="iceberg.tables.cdc-field", min_length=1)
    upsert_mode: bool = Field(False, alias="iceberg.tables.upsert-mode-enabled")
    table_id_columns: dict[str, str] = Field(default_factory=dict, alias="iceberg.table.<table>.id-columns")
    # Commit branches (reference keys, docs/commits.md "Branches"): every table's, made from main's when missing.
    default_commit_branch: str | None = Field(None, alias="iceberg.tables.default-commit-branch")
    table_commit_branch: dict[str, str] = Field(default_factory=dict, alias="iceberg.table.<table>.commit-branch")
    control_topic: str = Field("control-iceberg", alias="iceberg.control.topic")
    # The consumer group the coordinator commits the control topic's offsets in (coordinator_group).
    control_group_id: str | None = Field(None, alias="iceberg.control.group-id", min_length=1)
    control_group_prefix: str | None = Field(None, alias="iceberg.control.group-id-prefix", min_length=1)
    # Schemaless JSON values have no schema defaults: true acts as the reference's; false refused elsewhere.
    replace_null_with_default: bool = Field(True, alias="iceberg.tables.replace-null-with-default")
    # As Kafka Connect's internal topics: 3 (fewer brokers: their count; Tansu takes any value).
    control_replication_factor: int = Field(3, alias="iceberg.control.topic.replication-factor", ge=1)
    # A recreated control topic's new id, to start the group over on it from the tables (docs/commits.md).
    control_adopt_log_id: str | None = Field(None, alias="iceberg.control.adopt-log-id")
    control_secret: SecretStr | None = Field(None, alias="iceberg.control.secret")
    # Without control_secret: the namespace whose property keeps the group's own secret (icesink/shared/group_secret.py).
    control_secret_namespace: str = Field("icesink", alias="iceberg.control.secret-namespace", min_length=1)
    group_id: str = Field("icesink", alias="group.id")
    commit_interval_ms: int = Field(300_000, alias="iceberg.control.commit.interval-ms", ge=100)
    commit_timeout_ms: int = Field(30_000, alias="iceberg.control.commit.timeout-ms", ge=100)
    # Early rounds past these rows or bytes, or once a backlog is read; a longer wait after an idle round (docs/commits.md).
    commit_catch_up: bool = Field(True, alias="iceberg.control.commit.catch-up")
    commit_max_records: int | None = Field(None, alias="iceberg.control.commit.max-records", ge=1)
    commit_max_bytes: int | None = Field(None, alias="iceberg.control.commit.max-bytes", ge=1)
    commit_idle_interval_ms: int | None = Field(None, alias="iceberg.control.commit.idle-interval-ms", ge=100)
    # Tables of a round committed at once (the reference sink's key); None: 2 x cores.
    commit_threads: int | None = Field(None, alias="iceberg.control.commit.threads", ge=1)
    # Table commits in this many processes (coordinator/commit_processes.py); 0: on the threads.
    commit_processes: int = Field(0, alias="iceberg.control.commit.processes", ge=0, le=64)
    # A table whose commit keeps failing this long is parked, the round goes on (coordinator/parking.py).
    commit_park_after_ms: int = Field(60_000, alias="iceberg.control.commit.park-after-ms", ge=0)
    value_converter: str = Field(JSON_CONVERTER, alias="value.converter")
    value_converter_schemas_enable: bool = Field(False, alias="value.converter.schemas.enable")
    # Schema-registry converters' keys (icesink/shared/registry_settings.py checks them); the secrets apart.
    value_converter_props: dict[str, str] = Field(default_factory=dict, alias="value.converter.*")
    value_converter_user_info: SecretStr | None = Field(None, alias="value.converter.basic.auth.user.info")
    value_converter_key_password: SecretStr | None = Field(None, alias="value.converter.schema.registry.ssl.key.password")
    key_converter: str = Field(STRING_CONVERTER, alias="key.converter")
    # The same registry keys for a registry key converter (Debezium's Avro pipelines set both).
    key_converter_props: dict[str, str] = Field(default_factory=dict, alias="key.converter.*")
    key_converter_user_info: SecretStr | None = Field(None, alias="key.converter.basic.auth.user.info")
    key_converter_key_password: SecretStr | None = Field(None, alias="key.converter.schema.registry.ssl.key.password")
    # StringConverter / ByteArrayConverter values: the one column holding them (agents/formats/raw.py).
    value_column: str = Field("value", alias="iceberg.tables.value-column", min_length=1)
    # Key and Kafka metadata columns (agents/formats.py); names as the reference's KafkaMetadataTransform.
    key_column: str | None = Field(None, alias="iceberg.tables.key-column", min_length=1)
    kafka_metadata: bool = Field(False, alias="iceberg.tables.kafka-metadata-enabled")
    kafka_metadata_field: str = Field("_kafka_metadata", alias="iceberg.tables.kafka-metadata-field", min_length=1)
    kafka_metadata_nested: bool = Field(False, alias="iceberg.tables.kafka-metadata-nested")
    # Single message transforms, as in Kafka Connect: names, then transforms.<name>.<prop>.
    transforms: tuple[str, ...] = Field((), alias="transforms")
    transform_props: dict[str, dict[str, str]] = Field(default_factory=dict, alias="transforms.<name>.*")
    # Their predicates (icesink/shared/transform_settings.py, agents/transforms/).
    predicates: tuple[str, ...] = Field((), alias="predicates")
    predicate_props: dict[str, dict[str, str]] = Field(default_factory=dict, alias="predicates.<name>.*")

    # Kafka clients (ours). Unset bootstrap.servers = the embedded broker.
    bootstrap_servers: str | None = Field(None, alias="bootstrap.servers")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", alias="security.protocol"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, alias="sasl.mechanism"
    )
    sasl_username: str | None = Field(None, alias="sasl.username")
    sasl_password: SecretStr | None = Field(None, alias="sasl.password")
    ssl_cafile: str | None = Field(None, alias="ssl.cafile")
    ssl_certfile: str | None = Field(None, alias="ssl.certfile")
    ssl_keyfile: str | None = Field(None, alias="ssl.keyfile")
    ssl_password: SecretStr | None = Field(None, alias="ssl.password")
    consumer_max_batch: int = Field(10_000, alias="consumer.max-batch", ge=1)
    # A fetch waits on the broker (at most 500 ms) until this many bytes are there: at a steady
    # few MB/s, fetches of a few records each cost the worker and the broker per fetch.
    fetch_min_bytes: int = Field(256 * 1024, alias="consumer.fetch-min-bytes", ge=1)
    # A member that stops heartbeating loses its partitions after this. Tansu holds every join for
    # half of it: there, not set, it is 6 s (agents/kafka/group.py HELD_JOIN_SESSION_TIMEOUT_MS).
    session_timeout_ms: int = Field(10_000, alias="consumer.session-timeout-ms", ge=1000)
    # The consumer leaves its group when a fetch is held longer (the agent busy with it): a
    # schema-registry wait gives up well before (agents/registry_source.py give_up_s).
    consumer_max_poll_interval_ms: int = Field(60_000, alias="consumer.max-poll-interval-ms", ge=10_000)

    # Spark (ours). spark.remote wins over spark.master; other spark.* keys are Spark conf.
    spark_master: str = Field("local[*]", alias="spark.master")
    spark_remote: str | None = Field(None, alias="spark.remote")
    spark_conf: dict[str, str] = Field(default_factory=dict, alias="spark.*")

    # Buffers, files, metrics, local state (ours).
    buffer_max_bytes: int = Field(256 * 1024 * 1024, alias="buffer.max-bytes", ge=1024)
    # Buffered Arrow bytes at which rows are written to data files before their round (0: only
    # at rounds): a backlog's writing then overlaps its reading.
    buffer_write_ahead_bytes: int = Field(32 * 1024 * 1024, alias="buffer.write-ahead-bytes", ge=0)
    target_file_size_bytes: int = Field(128 * 1024 * 1024, alias="write.target-file-size-bytes", ge=1024)
    # Object-store tables with a local Spark: write under state.dir, then upload (see README).
    write_staging: Literal["auto", "always", "never"] = Field("auto", alias="write.staging")
    # Throw-away Spark writes at start-up so the first round does not pay the JVM's warm-up: the
    # rows twice, then once into this many partition directories (partitioned or many tables).
    write_warm_up_rows: int = Field(20_000, alias="write.warm-up-rows", ge=0)
    write_warm_up_files: int = Field(100, alias="write.warm-up-files", ge=0)
    # A local session's JVM maps the class-data archive `icesink spark-archive` built, if any.
    write_class_archive: bool = Field(True, alias="write.class-archive-enabled")
    # Writes (rounds' and early ones) that may fail in a row, retried with capped backoff, before
    # the replica stops with exit code 2 (agents/write_failures.py).
    write_failure_limit: int = Field(5, alias="write.failure-limit", ge=1)
    metrics_port: int = Field(9400, alias="metrics.port", ge=0, le=65535)
    # Interface of /metrics and /status: all (IPv4) by default, as Prometheus exporters do.
    metrics_host: str = Field("0.0.0.0", alias="metrics.host", min_length=1)
    # Absolute once loaded (relative: to the directory the process started in), as every path.
    state_dir: Path = Field(Path("var"), alias="state.dir", validate_default=True)
    worker_id: str | None = Field(None, alias="worker.id")  # a plain name (WORKER_ID)
    shutdown_timeout_ms: int = Field(30_000, alias="shutdown.timeout-ms", ge=100)

    # Table maintenance by the coordinator (coordinator/maintenance.py, docs/maintenance.md).
    maintenance_enabled: bool = Field(True, alias="maintenance.enabled")
    maintenance_min_input_files: int = Field(16, alias="maintenance.compaction.min-input-files", ge=2)
    maintenance_min_delete_files: int = Field(1, alias="maintenance.compaction.min-delete-files", ge=1)
    maintenance_max_rewrite_bytes: int = Field(
        512 * 1024 * 1024, alias="maintenance.compaction.max-bytes", ge=1024
    )
    # Ten minutes: a table keeps about 600 snapshots at 1 s rounds, 120 at 5 s (docs/maintenance.md).
    maintenance_snapshot_max_age_ms: int = Field(10 * 60 * 1000, alias="maintenance.snapshots.max-age-ms", ge=0)
    maintenance_retain_last: int = Field(10, alias="maintenance.snapshots.retain-last", ge=1)
    maintenance_orphans_older_than_ms: int = Field(
        3 * 24 * 3600 * 1000, alias="maintenance.orphans.older-than-ms", ge=60_000
    )
    maintenance_orphans_every_ms: int = Field(24 * 3600 * 1000, alias="maintenance.orphans.interval-ms", ge=1000)
    # How often the coordinator deletes control-log records no group needs (0: never).
    maintenance_control_log_every_ms: int = Field(600_000, alias="maintenance.control-log.interval-ms", ge=0)

    # Bad records (Kafka Connect's keys, plus errors.max-record-bytes). errors.tolerance unset:
    # "all" when a dead-letter topic is set, else "none" (see agents/deadletter.py, README).
    errors_tolerance: Literal["none", "all"] | None = Field(None, alias="errors.tolerance")
    dlq_topic: str | None = Field(None, alias="errors.deadletterqueue.topic.name")
    dlq_replication_factor: int = Field(3, alias="errors.deadletterqueue.topic.replication.factor", ge=1)
    dlq_context_headers: bool = Field(True, alias="errors.deadletterqueue.context.headers.enable")
    max_record_bytes: int = Field(16 * 1024 * 1024, alias="errors.max-record-bytes", ge=1)
    deadletter_table: str | None = Field(None, alias="deadletter.table")  # dead letters as rows too (agents/deadletter.py)

    # Fault injection for the fault tests (icesink/shared/faults.py); never set in production.
    fault_crash_at: tuple[
        Literal["coordinator.between-table-commits", "worker.during-write", "worker.mid-response",
                "worker.after-dead-letters", "worker.ingest-bug", "worker.lz4-unavailable", "replay.after-table-commit",
                "worker.after-early-write", "coordinator.commit-process.after-commit", "rewind.after-table-commit",
                "rewind.after-alter", "coordinator.before-table-commit"], ...
    ] = Field((), alias="fault.crash-at")
    fault_hold_at: tuple[
        Literal["coordinator.after-table-commit", "coordinator.in-table-commit", "worker.spark-start",
                "replay.before-table-commit", "worker.after-fetch"], ...
    ] = Field((), alias="fault.hold-at")
    # What config-provider references resolved to: secrets wherever they landed (no config key).
    provided_values: tuple[SecretStr, ...] = Field((), alias="<config provider values>")
    ignored_keys: tuple[str, ...] = Field((), alias="<ignored keys>")  # config.unknown-keys=warn let these in

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # load_settings() merges file, environment and flags itself; nothing else is read.
        return (init_settings,)

    @field_validator("topics", "tables", "transforms", "predicates", "fault_crash_at", "fault_hold_at", mode="before")
    @classmethod
    def _split_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            return tuple(x.strip() for x in v.split(",") if x.strip())
        return v

    @field_validator("dlq_topic", "deadletter_table")
    @classmethod
    def _blank_is_none(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None  # Kafka Connect's default is "": no dead-letter topic
        return v.strip()

    @field_validator("worker_id")
    @classmethod
    def _plain_worker_id(cls, v: str | None) -> str | None:
        if v is not None and not WORKER_ID.fullmatch(v):
            raise ValueError(WORKER_ID_RULE)
        return v

    @field_validator("state_dir")
    @classmethod
    def _absolute_dir(cls, v: Path) -> Path:
        return Path(os.path.abspath(v))

    @field_validator("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    @classmethod
    def _absolute_file(cls, v: str | None) -> str | None:
        return os.path.abspath(v) if v is not None and v.strip() else None

    @field_validator("catalog_props")
    @classmethod
    def _absolute_catalog_paths(cls, v: dict[str, str]) -> dict[str, str]:
        return catalog_s3_addressing(catalog_paths_absolute(v))

    @field_validator("spark_remote")
    @classmethod
    def _check_remote(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("sc://"):
            raise ValueError("a Spark Connect URL sc://host:port")
        return v

    @model_validator(mode="after")
    def _check(self) -> Settings:
        check_settings(self)
        check_reference_settings(self, PREFIX_CREATE_PROPS, self._kafka_own())
        check_null_defaults(self)
        return self

    # Derived views -------------------------------------------------------------------------

    @property
    def debezium_target_pattern(self) -> str | None:
        """``cdc.target.pattern`` of the Debezium transform (default ``{db}.{table}``), or None
        when no Debezium transform is configured."""
        for name in self.transforms:
            props = self.transform_props.get(name, {})
            if props.get("type") in DEBEZIUM_TRANSFORMS:
                return props.get("cdc.target.pattern") or "{db}.{table}"
        return None

    @property
    def transform_chain(self) -> tuple[TransformSpec, ...]:
        """The configured transforms in order, checked (icesink/shared/transform_settings.py)."""
        return parse_chain(self.transforms, self.transform_props, self.predicates, self.predicate_props)

    @property
    def metadata_columns(self) -> tuple[str, bool, bool] | None:
        """The Kafka metadata columns: (field or prefix, nested, with headers), or None."""
        own = (self.kafka_metadata_field, self.kafka_metadata_nested, True) if self.kafka_metadata else None
        return metadata_columns(self.transform_chain, own)

    @property
    def table_commit_threads(self) -> int:
        """Tables of a round committed at once: iceberg.control.commit.threads, else 2 x cores."""
        return self.commit_threads or 2 * (os.cpu_count() or 1)

    @property
    def embedded_broker(self) -> bool:
        return self.bootstrap_servers is None

    @property
    def embedded_catalog(self) -> bool:
        return "type" not in self.catalog_props and "uri" not in self.catalog_props

    @property
    def tolerate_errors(self) -> bool:
        """errors.tolerance=all: dead-letter bad records and go on (else stop at the first); unset: with a
        dead-letter topic or table."""
        if self.errors_tolerance is None:
            return self.dlq_topic is not None or self.deadletter_table is not None
        return self.errors_tolerance == "all"

    @property
    def commit_branches(self) -> CommitBranches:
        """The branch each table's rounds commit to (and its exactly-once state is read from)."""
        return CommitBranches(self.default_commit_branch or MAIN_BRANCH, tuple(sorted(self.table_commit_branch.items())))

    def commit_branch(self, table: str) -> str:
        return self.commit_branches.of(table)

    def partition_by(self, table: str) -> str | None:
        return self.table_partition_by.get(table, self.default_partition_by)

    def timestamp_unit_of(self, table: str) -> Literal["s", "ms", "us", "ns"]:
        """The unit of epoch numbers in ``table``'s timestamp and time columns."""
        unit = self.table_timestamp_unit.get(table, self.timestamp_unit)
        return cast(Literal["s", "ms", "us", "ns"], unit)  # one of TIMESTAMP_UNITS: checked in _check

    def timestamp_fields_of(self, table: str) -> re.Pattern[str] | None:
        """Fields that auto-create makes timestamp columns (dotted names, full match)."""
        pattern = self.table_timestamp_fields.get(table, self.timestamp_fields)
        return None if pattern is None else re.compile(pattern)

    def id_columns(self, table: str) -> tuple[str, ...]:
        """Identifier fields of ``table`` when auto-created (comma-separated column names)."""
        raw = self.table_id_columns.get(table, self.default_id_columns) or ""
        return tuple(c.strip() for c in raw.split(",") if c.strip())

    @property
    def mirror(self) -> bool:
        """Whether tables are mirror tables: a change field or upsert mode is set (then every
        table of the sink is one, as in the reference sink)."""
        return self.cdc_field is not None or self.upsert_mode

    @property
    def coordinator_group(self) -> str:
        """The consumer group holding the coordinator's control-topic offsets: iceberg.control.group-id
        (Tabular's key), else iceberg.control.group-id-prefix + group.id, else ``<group.id>-coordinator``."""
        if self.control_group_id is not None:
            return self.control_group_id
        return f"{self.control_group_prefix}{self.group_id}" if self.control_group_prefix else f"{self.group_id}-coordinator"

    def control_client_kwargs(self) -> dict[str, Any]:
        """:meth:`kafka_client_kwargs` of the control-topic clients, with the iceberg.kafka.* keys."""
        return {**self.kafka_client_kwargs(), **kafka_props_kwargs(self.kafka_props, self._kafka_own())}

    def _kafka_own(self) -> dict[str, object]:
        return {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security_protocol,
                "sasl.mechanism": self.sasl_mechanism}

    def id_columns_key(self, table: str) -> str:
        return f"iceberg.table.{table}.id-columns" if table in self.table_id_columns else "iceberg.tables.default-id-columns"

    def kafka_client_kwargs(self) -> dict[str, Any]:
        """Security settings for aiokafka clients (producer, consumer, admin)."""
        return kafka_security_kwargs(self)

    def masked(self, only_given: bool = False) -> dict[str, Any]:
        """Settings for logs and status output, secrets masked (icesink/shared/secrets.py).
        ``only_given``: only those the config, environment and flags gave (no defaults)."""
        out = self.model_dump(by_alias=True)
        del out["<config provider values>"], out["<ignored keys>"]
        if only_given:
            given = {Settings.model_fields[f].alias or f for f in self.model_fields_set}
            out = {k: v for k, v in out.items() if k in given and v not in ({}, ())}
        for field in ("iceberg.catalog.*", "spark.*", "value.converter.*", "key.converter.*"):
            if field not in out:
                continue
            out[field] = {k: mask_setting(k.removeprefix("key.converter."), v) for k, v in out[field].items()}
        return {k: (MASK if isinstance(v, SecretStr) else mask_url(v) if isinstance(v, str) else v)
                for k, v in out.items()}

    def control_signing_key(self) -> bytes | None:
        """The key that signs and checks control events (icesink/shared/signing.py), if set."""
        return self.control_secret.get_secret_value().encode() if self.control_secret is not None else None

    def secret_values(self) -> set[str]:
        """Every secret value in these settings: what must never leave the process."""
        out = {s.get_secret_value() for s in (self.sasl_password, self.ssl_password, self.control_secret,
                                              self.value_converter_user_info, self.value_converter_key_password,
                                              self.key_converter_user_info, self.key_converter_key_password)
               if s is not None}
        out.update(s.get_secret_value() for s in self.provided_values)
        keys = {k.removeprefix("key.converter."): v for k, v in self.key_converter_props.items()}  # not "key"
        for props in (self.catalog_props, self.spark_conf, self.value_converter_props, keys):
            for k, v in props.items():
                if is_secret_key(k):
                    out.add(v)
                out.update(url_secrets(v))
        out.update(url_secrets(self.spark_remote or ""))
        return {v for v in out if v}

    def redactor(self) -> Redactor:
        return Redactor(self.secret_values())


# Loading -----------------------------------------------------------------------------------

_FIELD_KEYS = {
    f.alias: name for name, f in Settings.model_fields.items() if f.alias and "*" not in f.alias and "<" not in f.alias
}


def _env_key_map() -> dict[str, str]:
    return {re.sub(r"[.\-]", "_", alias).upper(): alias for alias in _FIELD_KEYS}


def keys_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``ICESINK_<KEY>`` variables as config keys (see :func:`icesink.shared.config_load.env_keys`)."""
    return env_keys(environ, _env_key_map())


def build(raw: Mapping[str, Any], *, provided: Mapping[str, str] | None = None) -> Settings:
    """Sort flat keys into fields and maps, refuse unknown keys (or warn: config.unknown-keys), validate.
    ``provided``: the keys whose values config providers resolved (errors never quote them)."""
    provided = dict(provided or {})
    try:
        return _build(raw, provided)
    except ConfigError as exc:
        if exc.key in provided and not isinstance(exc.value, Hidden):
            raise ConfigError(exc.key, Hidden(exc.value), exc.expected) from None
        raise


def build_resolved(raw: Mapping[str, Any], environ: Mapping[str, str]) -> Settings:
    """:func:`build` after resolving config-provider references with the providers ``raw``
    declares (``environ``: what the env provider reads)."""
    from icesink.shared.config_providers import declared, resolve

    resolved, provided = resolve(raw, declared(raw), environ)
    return build(resolved, provided=provided)


def _build(raw: Mapping[str, Any], provided: dict[str, str]) -> Settings:
    fields: dict[str, Any] = {}
    write_props: dict[str, str] = {}
    hadoop: dict[str, str] = {}
    kafka: dict[str, str] = {}
    catalog: dict[str, str] = {}
    create_props: dict[str, str] = {}
    spark: dict[str, str] = {}
    per_table: dict[str, dict[str, str]] = {prop: {} for prop in TABLE_PROPS}
    transforms: dict[str, dict[str, str]] = {}
    predicates: dict[str, dict[str, str]] = {}
    converter_props: dict[str, str] = {}
    key_converter_props: dict[str, str] = {}
    unknown: list[str] = []
    for key, value in raw.items():
        if key in _FIELD_KEYS:
            fields[key] = value
        elif key in ACCEPTED_IGNORED:
            log.info("setting %s accepted: %s", key, ACCEPTED_IGNORED[key])
        elif (own := CONNECT_CONSUMER_OVERRIDES.get(key)) is not None:
            if own in raw:
                log.warning("setting %s ignored: %s is set too, and wins", key, own)
            else:
                fields[own] = value
        elif key.startswith(PREFIX_CATALOG):
            catalog[key[len(PREFIX_CATALOG):]] = str(value)
        elif key == "iceberg.connect.group-id":  # the reference's source consumer group: ours is group.id
            if raw.get("group.id", value) != value:
                raise ConfigError(key, value, f"unset or the same as group.id ({raw['group.id']}), which is set too")
            fields["group.id"] = value
        elif key in REFUSED:
            raise ConfigError(key, shown(key, value), REFUSED[key])
        elif key.startswith(PREFIX_WRITE_PROPS):
            write_props[key[len(PREFIX_WRITE_PROPS):]] = str(value)
        elif key.startswith(PREFIX_HADOOP):
            hadoop[key[len(PREFIX_HADOOP):]] = str(value)
        elif key.startswith(PREFIX_KAFKA):
            kafka[key[len(PREFIX_KAFKA):]] = str(value)
        elif key.startswith(PREFIX_CREATE_PROPS):
            create_props[key[len(PREFIX_CREATE_PROPS):]] = str(value)
        elif key.startswith("spark."):
            spark[key] = str(value)
        elif key.startswith("transforms.") and key.count(".") >= 2:
            name, _, prop = key[len("transforms."):].partition(".")
            transforms.setdefault(name, {})[prop] = str(value)
        elif key.startswith("predicates.") and key.count(".") >= 2:
            name, _, prop = key[len("predicates."):].partition(".")
            predicates.setdefault(name, {})[prop] = str(value)
        elif (m := TABLE_KEY.match(key)) is not None:
            per_table[m["prop"]][m["table"]] = str(value)
        elif key.startswith("iceberg.table.") and not key.endswith(".commit-branch"):
            raise ConfigError(key, shown(key, value), "a per-table key iceberg.table.<table>.<prop> with prop one of "
                              + ", ".join(TABLE_PROPS) + " (docs/reference-keys.md)")
        elif key.startswith("value.converter."):
            converter_props[key] = str(value)
        elif key.startswith("key.converter."):
            key_converter_props[key] = str(value)
        else:
            unknown.append(key)
    # config.unknown-keys (default error) decides; its value is checked with the other fields.
    if unknown and str(raw.get("config.unknown-keys", "error")) != "warn":
        key = sorted(unknown)[0]
        raise ConfigError(key, shown(key, raw[key]), "a key icesink has (README, Settings); this one would be "
                          "ignored; config.unknown-keys=warn starts anyway"
                          + (f" (and {len(unknown) - 1} more: {', '.join(sorted(unknown)[1:])})"
                                       if len(unknown) > 1 else ""))
    if unknown:
        log.warning("unknown settings ignored: %s", ", ".join(sorted(unknown)))
    fields["iceberg.catalog.*"] = catalog
    fields["spark.*"] = spark
    fields["iceberg.tables.auto-create-props.*"] = create_props
    fields["iceberg.tables.write-props.*"] = write_props
    fields["iceberg.hadoop.*"] = hadoop
    fields["iceberg.kafka.*"] = kafka
    if (size := write_props.get("write.target-file-size-bytes")) is not None:
        own = fields.setdefault("write.target-file-size-bytes", size)
        if str(own) != size:
            raise ConfigError(PREFIX_WRITE_PROPS + "write.target-file-size-bytes", size,
                              f"unset or the same as write.target-file-size-bytes ({own}), which is set too")
    for prop, values in per_table.items():
        fields[f"iceberg.table.<table>.{prop}"] = values
    fields["transforms.<name>.*"] = transforms
    fields["predicates.<name>.*"] = predicates
    fields["value.converter.*"] = converter_props
    fields["key.converter.*"] = key_converter_props
    fields["<config provider values>"] = tuple(SecretStr(v) for v in provided.values())
    fields["<ignored keys>"] = tuple(sorted(unknown))
    try:
        return Settings(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err["loc"][0] if err["loc"] else "?"
        key = str(loc)
        if key in Settings.model_fields:
            key = Settings.model_fields[key].alias or key
        found = Hidden(err.get("input")) if key in provided else shown(key, err.get("input", fields.get(key)))
        if err["type"] == "missing":
            raise ConfigError(key, None, "a value (the setting is required)") from None
        raise ConfigError(key, found, err["msg"].removeprefix("Value error, ")) from None


def load_settings(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    raw: dict[str, Any] = {}
    if path is not None:
        raw.update(read_config_file(path))
    if environ is not None:
        raw.update(keys_from_env(environ))
    if overrides:
        raw.update(overrides)
    return build_resolved(raw, environ or {})
