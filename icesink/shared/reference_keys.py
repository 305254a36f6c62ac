"""The reference sink's keys (Apache Iceberg Kafka Connect sink 1.x, Tabular's 0.6) that are not
a field of Settings of their own: which act here and how, and which are refused at start and
why (docs/reference-keys.md lists every key). Leaf module: no I/O.

- ``iceberg.tables.write-props.*``: the writer properties Spark's files take, over the table's
  own properties as the reference's writer takes them (spark_bridge/files.py).
- ``iceberg.hadoop.*``: Spark's Hadoop configuration (``spark.hadoop.*``).
- ``iceberg.kafka.*``: the control-topic clients, for the keys aiokafka has.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib.util import find_spec
from typing import TYPE_CHECKING

from icesink.shared.errors import ConfigError

if TYPE_CHECKING:
    from icesink.shared.config import Settings

PREFIX_WRITE_PROPS = "iceberg.tables.write-props."
PREFIX_HADOOP = "iceberg.hadoop."
PREFIX_KAFKA = "iceberg.kafka."

#: Parquet codecs Spark's parquet-mr and pyarrow both write (Iceberg's names; ``none`` = uncompressed).
PARQUET_CODECS = ("zstd", "snappy", "gzip", "lz4", "brotli", "uncompressed", "none")
#: Integer writer properties (bytes) that act on the files written (spark_bridge/files.py).
_INT_WRITE_PROPS = (
    "write.parquet.compression-level", "write.parquet.row-group-size-bytes", "write.parquet.page-size-bytes",
    "write.parquet.dict-size-bytes", "write.target-file-size-bytes",
)
#: Metrics modes (Iceberg's MetricsModes): pyiceberg computes each file's column metrics by them.
_METRICS_MODE_KEYS = ("write.metadata.metrics.default", "write.metadata.metrics.column.")
FILE_FORMATS_WRITTEN = ("parquet", "orc", "avro")
#: Formats whose files carry no Iceberg field ids and no column metrics here (read by the name mapping).
UNMAPPED_FORMATS = ("orc", "avro")
#: ORC codecs Spark's ORC writer takes (Iceberg's write.orc.compression-codec names; Iceberg's default zlib).
ORC_CODECS = ("zlib", "snappy", "lz4", "zstd", "none")
#: Iceberg's write.avro.compression-codec names -> Spark's Avro writer's (Iceberg's default gzip is Avro's deflate).
AVRO_CODECS = {"gzip": "deflate", "zstd": "zstandard", "snappy": "snappy", "uncompressed": "uncompressed"}
#: Why write.avro.compression-level is refused.
AVRO_LEVEL_WHY = ("unset: Spark's Avro writer takes a codec's level only as a session conf "
                  "(spark.sql.avro.deflate.level, spark.sql.avro.zstandard.level), not per table's write")
#: Why other formats are refused (write.format.default).
FORMAT_WHY = "parquet, orc or avro (the formats Spark writes Iceberg data files in here)"
#: Why Avro files cannot take column metrics modes (spark_bridge/files.py counts their records only).
AVRO_METRICS_WHY = ("unset (or none) with write.format.default=avro: icesink's Avro data files carry their record "
                   "count only (their blocks' counts; no column statistics to read), so a metrics mode could not act")
#: Why mirror tables cannot take ORC or Avro files.
ORC_MIRROR_WHY = ("parquet with mirror tables (iceberg.tables.upsert-mode-enabled, iceberg.tables.cdc-field): "
                  "their position deletes are found by reading the round's data files' key columns as Parquet")

#: Reference keys icesink refuses, and why (each names what to use instead).
REFUSED: dict[str, str] = {
    "iceberg.control.commit.max-consecutive-failures": (
        "unset: icesink never stops its coordinator on failed commits; a table whose commits keep failing is "
        "parked and retried (iceberg.control.commit.park-after-ms, docs/commits.md)"),
    "iceberg.coordinator.transactional.prefix": (
        "unset: icesink's control producers are not transactional (its exactly-once state is in the tables' "
        "snapshot summaries, docs/commits.md), so there is no transactional id to prefix"),
    "iceberg.coordinator.transactional.suffix": "unset: an internal key of the reference's tasks",
}

#: ``iceberg.kafka.<key>`` -> the aiokafka keyword of every control-topic client.
KAFKA_CLIENT_KEYS: dict[str, str] = {
    "client.id": "client_id",
    "request.timeout.ms": "request_timeout_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
}
_KAFKA_INT_KEYS = ("request.timeout.ms", "retry.backoff.ms", "metadata.max.age.ms", "connections.max.idle.ms")
#: ``iceberg.kafka.<key>`` that must equal icesink's own key (one set of clients' connection settings).
KAFKA_SAME_AS: dict[str, str] = {
    "bootstrap.servers": "bootstrap.servers", "security.protocol": "security.protocol",
    "sasl.mechanism": "sasl.mechanism",
}


def check_write_props(props: Mapping[str, str], prefix: str = PREFIX_WRITE_PROPS) -> None:
    """Refuse a writer property that would not act on the files written (ConfigError naming
    ``prefix + key``): unknown ones, values that are not of their type, Avro with metrics modes."""
    counts_only = props.get("write.format.default", "parquet").lower() == "avro"
    for key, value in sorted(props.items()):
        name = prefix + key
        if key == "write.format.default":
            if value.lower() not in FILE_FORMATS_WRITTEN:
                raise ConfigError(name, value, FORMAT_WHY)
        elif key == "write.orc.compression-codec":
            if value.lower() not in ORC_CODECS:
                raise ConfigError(name, value, f"one of {', '.join(ORC_CODECS)}")
        elif key == "write.avro.compression-codec":
            if value.lower() not in AVRO_CODECS:
                raise ConfigError(name, value, f"one of {', '.join(AVRO_CODECS)}")
            if prefix != PREFIX_WRITE_PROPS and value.lower() == "snappy" and find_spec("snappy") is None:
                raise ConfigError(name, value, "gzip, zstd or uncompressed as a table's property: pyiceberg writes "
                                  "the table's manifests with it too, and its snappy codec needs python-snappy, "
                                  "not installed (as a write-prop it acts on the data files only)")
        elif key == "write.avro.compression-level":
            raise ConfigError(name, value, AVRO_LEVEL_WHY)
        elif counts_only and key.startswith(_METRICS_MODE_KEYS) and value.strip().lower() != "none":
            raise ConfigError(name, value, AVRO_METRICS_WHY)
        elif key == "write.parquet.compression-codec":
            if value.lower() not in PARQUET_CODECS:
                raise ConfigError(name, value, f"one of {', '.join(PARQUET_CODECS)}")
        elif key in _INT_WRITE_PROPS:
            if not value.strip().isdigit() or int(value) < 1:
                raise ConfigError(name, value, "a positive integer")
        elif key.startswith(_METRICS_MODE_KEYS) or key == "write.metadata.metrics.max-inferred-column-defaults":
            _check_metrics_mode(name, key, value)
        elif prefix == PREFIX_WRITE_PROPS:
            raise ConfigError(name, value, "a writer property icesink's files take: write.format.default, "
                              "write.orc.compression-codec, write.avro.compression-codec, "
                              "write.parquet.compression-codec, -level, row-group-size-bytes, page-size-bytes, "
                              "dict-size-bytes, write.target-file-size-bytes or write.metadata.metrics.* "
                              "(docs/reference-keys.md)")


def _check_metrics_mode(name: str, key: str, value: str) -> None:
    if key.endswith("max-inferred-column-defaults"):
        if not value.strip().isdigit():
            raise ConfigError(name, value, "a number of columns")
        return
    mode = value.strip().lower()
    if mode in ("none", "counts", "full"):
        return
    if mode.startswith("truncate(") and mode.endswith(")") and mode[9:-1].isdigit() and int(mode[9:-1]) > 0:
        return
    raise ConfigError(name, value, "none, counts, full or truncate(N)")


def hadoop_spark_conf(hadoop: Mapping[str, str]) -> dict[str, str]:
    """``iceberg.hadoop.<k>`` as Spark's Hadoop configuration ``spark.hadoop.<k>``."""
    return {f"spark.hadoop.{k}": v for k, v in hadoop.items()}


def kafka_client_kwargs(kafka: Mapping[str, str], own: Mapping[str, object]) -> dict[str, object]:
    """aiokafka keywords of the ``iceberg.kafka.*`` keys (without the prefix); ``own``: icesink's
    own value of each key of KAFKA_SAME_AS. Raises ConfigError naming any other key."""
    out: dict[str, object] = {}
    for key, value in sorted(kafka.items()):
        name = PREFIX_KAFKA + key
        if key in KAFKA_CLIENT_KEYS:
            if key in _KAFKA_INT_KEYS:
                if not value.strip().isdigit():
                    raise ConfigError(name, value, "a number of milliseconds")
                out[KAFKA_CLIENT_KEYS[key]] = int(value)
            else:
                out[KAFKA_CLIENT_KEYS[key]] = value
        elif key in KAFKA_SAME_AS:
            mine = own.get(KAFKA_SAME_AS[key])
            if value != mine:
                raise ConfigError(name, value, f"unset or the same as {KAFKA_SAME_AS[key]} ({mine}): icesink's "
                                  "control topic is on the cluster, with the credentials, of its other clients")
        else:
            raise ConfigError(name, value, "a control-topic client key icesink's clients have: "
                              + ", ".join(PREFIX_KAFKA + k for k in (*KAFKA_CLIENT_KEYS, *KAFKA_SAME_AS))
                              + " (other Kafka client settings are icesink's own keys: README, Settings)")
    return out


def check_orc_mirror(mirror: bool, *props: tuple[str, Mapping[str, str]]) -> None:
    """Refuse ``write.format.default=orc`` or ``avro`` in any ``(prefix, props)`` when tables are mirror tables."""
    for prefix, values in props:
        value = values.get("write.format.default", "parquet")
        if mirror and value.lower() in UNMAPPED_FORMATS:
            raise ConfigError(prefix + "write.format.default", value, ORC_MIRROR_WHY)


def check_reference_settings(s: Settings, create_prefix: str, kafka_own: Mapping[str, object]) -> None:
    """The checks across the reference's keys, run by ``Settings`` once built: the write-props and
    auto-create-props it knows, ORC against mirror tables, iceberg.kafka.* (raises naming a key
    that cannot act)."""
    check_write_props(s.write_props)
    check_write_props(s.auto_create_props, create_prefix)  # the format and values it knows
    check_orc_mirror(s.mirror, (PREFIX_WRITE_PROPS, s.write_props), (create_prefix, s.auto_create_props))
    kafka_client_kwargs(s.kafka_props, kafka_own)
    if (dl := s.deadletter_table) is not None:  # dead letters as rows of a table (agents/deadletter.py)
        if not re.fullmatch(r"[^.\s]+(\.[^.\s]+)+", dl) or dl in s.tables:
            raise ConfigError("deadletter.table", dl, "namespace.table, a table no route writes")
        if s.errors_tolerance == "none":
            raise ConfigError("deadletter.table", dl, "unset, or errors.tolerance=all: under errors.tolerance=none "
                              "a bad record stops the replica and nothing is dead-lettered")
