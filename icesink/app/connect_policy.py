"""What a connector's config may hold in ``icesink connect``, and how configs are shown (pure,
no I/O).

Anyone who can call the REST API can PUT a connector, so a connector's config must not choose
what runs on the host or where on it the process keeps its files. Keys that load code (Spark's
class paths, plugins and JVM options, pyiceberg's ``*-impl`` classes), start programs, name a
path or a port of the host, or carry the process's own Kafka connection are **process-level**:
a connector config that sets one is refused (400 naming the key) unless the process lists it in
``connector.config.override.allow`` (glob patterns, as Kafka Connect's
``connector.client.config.override.policy`` decides which client settings a connector may
override). Every Spark key is process-level but for :data:`CONNECTOR_SPARK_KEYS` (resources and
output tuning): Spark reads hundreds of keys, too many of which name classes or programs for a
list of the dangerous ones to be complete.

Secrets never leave the API: :func:`shown` masks them as logs do (icesink/shared/secrets.py), and a
config PUT back with a mask keeps the stored value (:func:`unmasked`). A secret in the process's
own settings would be handed to every connector a caller creates: :func:`secret_default` finds
it so that the process refuses to start (connectors reference secrets through config providers).
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import unicodedata
from collections.abc import Mapping
from urllib.parse import urlsplit

from icesink.shared.config import catalog_paths_absolute, is_secret_setting
from icesink.shared.config_providers import PREFIX as PROVIDERS, has_reference, is_reference
from icesink.shared.errors import ConfigError
from icesink.shared.secrets import MASK, Hidden, mask_url

OVERRIDE_ALLOW = "connector.config.override.allow"
#: Keys naming the connector, not the sink (Kafka Connect's own).
CONNECTOR_ONLY = ("name", "tasks.max", "connector.class")
#: Spark conf a connector may set: resources and output tuning, S3A's address and keys.
CONNECTOR_SPARK_KEYS = frozenset({
    "spark.driver.memory", "spark.driver.cores", "spark.driver.maxResultSize", "spark.executor.memory",
    "spark.executor.cores", "spark.executor.instances", "spark.cores.max", "spark.default.parallelism",
    "spark.sql.shuffle.partitions", "spark.sql.files.maxRecordsPerFile", "spark.sql.parquet.compression.codec",
    "spark.sql.session.timeZone", "spark.sql.execution.arrow.maxRecordsPerBatch",
    "spark.hadoop.fs.s3a.access.key", "spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.session.token",
    "spark.hadoop.fs.s3a.endpoint", "spark.hadoop.fs.s3a.endpoint.region", "spark.hadoop.fs.s3a.path.style.access",
    "spark.hadoop.fs.s3a.connection.ssl.enabled",
})
_LOCAL_MASTER = re.compile(r"local(\[(\d+|\*)(,\s*\d+)?\])?")
#: Keys the process sets for each task itself: no connector sets them, whatever the process allows.
ASSIGNED = {
    "worker.id": "the name the process gives each task's replica",
    "metrics.port": "the port the process gives each task's replica (listed by GET /metrics/targets)",
}
_KAFKA = "the process's Kafka connection (as Kafka Connect's worker settings)"
_PROCESS_KEYS = {
    "state.dir": "a directory of this host (the process keeps every task's files under its own)",
    "metrics.host": "an interface of this host (each task's /metrics and /status listen where the process's "
                    "metrics.host says)",
    "bootstrap.servers": _KAFKA, "security.protocol": _KAFKA, "sasl.mechanism": _KAFKA, "sasl.username": _KAFKA,
    "sasl.password": _KAFKA, "ssl.password": _KAFKA,
    "ssl.cafile": "a file of this host (the process's Kafka TLS)", "ssl.certfile": "a file of this host "
    "(the process's Kafka TLS)", "ssl.keyfile": "a file of this host (the process's Kafka TLS)",
}
_CODE = "it loads a class or starts a program on this host"
_SPARK = ("Spark conf can load code and start programs on this host (class paths, plugins, JVM options, "
          "listeners, executables); a connector may set only resources and output tuning")
_PATH = "it names a path on this host"
_RELATIVE = ("it names a path on this host: a relative one, made absolute against the process's working "
             "directory when it is used")
_CATALOG = "iceberg.catalog."
_TABLE_PROPS = "iceberg.tables.auto-create-props."
_NAME_MAX = 255


def process_level(key: str, value: object) -> str | None:
    """Why a connector may not set ``key`` (to ``value``) unless the process allows it, or None."""
    if key in _PROCESS_KEYS:
        return _PROCESS_KEYS[key]
    if key.startswith("fault."):
        return "fault injection, for tests only"
    if key == PROVIDERS or key.startswith(PROVIDERS + "."):
        return "the process declares the config providers (what references may read)"
    text = str(value)
    if key == "spark.master":
        return None if _LOCAL_MASTER.fullmatch(text.strip()) else \
            "where Spark runs: a Spark cluster's executors send the driver objects it deserializes"
    if key.startswith("spark."):
        return None if key in CONNECTOR_SPARK_KEYS else _SPARK
    if key.startswith("iceberg.hadoop."):  # Spark's Hadoop conf: spark.hadoop.<key> (icesink/app/spark_session.py)
        return None if "spark.hadoop." + key[len("iceberg.hadoop."):] in CONNECTOR_SPARK_KEYS else _SPARK
    if key == "iceberg.hadoop-conf-dir":
        return _PATH
    for prefix in (_CATALOG, _TABLE_PROPS):
        if key.startswith(prefix):
            prop = key[len(prefix):].lower()
            if prop.endswith("impl"):
                return _CODE
            if _local_path(text):
                return _PATH
    return None


def _local_path(value: str) -> bool:
    if has_reference(value):
        return False  # a reference: check_connector decides by the key
    scheme = urlsplit(value.strip()).scheme.lower()
    return scheme in ("file", "sqlite") or scheme.startswith("sqlite+") or value.strip().startswith("/")


def relative_paths(config: Mapping[str, str], defaults: Mapping[str, object]) -> set[str]:
    """The keys of ``config`` whose value is a relative path of this host once used as the
    settings use it: catalog properties that :func:`icesink.shared.config.catalog_paths_absolute` makes
    absolute (judged with the process's ``defaults``, which may say the catalog is REST, where a
    warehouse is a name), and table paths and locations without a scheme."""
    merged = {**{k: str(v) for k, v in defaults.items()}, **config}
    props = {k[len(_CATALOG):]: v for k, v in merged.items() if k.startswith(_CATALOG)}
    made = catalog_paths_absolute(props)
    out = {_CATALOG + k for k, v in props.items()
           if made.get(k) != v and _CATALOG + k in config and not has_reference(v)}
    for key, value in config.items():
        if key.startswith(_TABLE_PROPS) and key.lower().endswith(("path", "location")) and value.strip() and \
                not has_reference(value) and not urlsplit(value.strip()).scheme:
            out.add(key)
    return out


def check_connector(config: Mapping[str, str], allow: tuple[str, ...],
                    defaults: Mapping[str, object] | None = None) -> None:
    """Refuse (ConfigError naming the key) a key the connector may not set, unless allowed.
    A value that is a config-provider reference counts as a path if it names one when resolved:
    references in catalog and table properties are refused in the keys where a path would be.
    A relative path counts as the absolute path it becomes (:func:`relative_paths`; ``defaults``:
    the process's task defaults, which the connector's keys complete)."""
    relative = relative_paths(config, defaults or {})
    for key, value in config.items():
        if key in CONNECTOR_ONLY:
            continue
        if key in ASSIGNED:
            raise ConfigError(key, value, f"no value: a connector cannot set it ({ASSIGNED[key]})")
        reason = process_level(key, value) or (_RELATIVE if key in relative else None)
        if reason is None and has_reference(value) and key.startswith(("iceberg.catalog.", "spark.")) and \
                key.rsplit(".", 1)[-1] in ("uri", "warehouse", "path", "location"):
            reason = "it may name a path on this host once resolved"
        if reason is not None and not any(fnmatch.fnmatchcase(key, pattern) for pattern in allow):
            shown = Hidden(value) if is_secret_setting(key) else value
            raise ConfigError(key, shown, f"no value in a connector's config: {reason}. The process allows it "
                              f"with {OVERRIDE_ALLOW}={key}")


def allowed_patterns(value: object) -> tuple[str, ...]:
    return tuple(p.strip() for p in str(value or "").split(",") if p.strip())


def check_name(name: str) -> None:
    """Kafka Connect's rule (no ISO control characters), plus what icesink needs: a name that a
    URL path can hold (no ``/``), of at most 255 characters."""
    if not name:
        raise ConfigError("name", name, "a connector name")
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise ConfigError("name", name, "a name without ISO control characters")
    if "/" in name:
        raise ConfigError("name", name, "a name without '/' (the API addresses connectors by it in paths)")
    if len(name) > _NAME_MAX:
        raise ConfigError("name", f"{name[:40]}... ({len(name)} characters)", f"at most {_NAME_MAX} characters")


def shown(config: Mapping[str, str]) -> dict[str, str]:
    """A connector's config as the API shows it: secrets masked, URL passwords masked; a value
    that is a config-provider reference as written (it holds no secret)."""
    return {k: v if is_reference(v) else MASK if is_secret_setting(k) else mask_url(v) for k, v in config.items()}


def unmasked(config: Mapping[str, str], stored: Mapping[str, str] | None) -> dict[str, str]:
    """``config`` with every value that is exactly what :func:`shown` shows for the stored
    config's value replaced by that stored value (a config read with GET, changed and PUT back
    keeps its secrets). A masked value with nothing stored behind it is refused."""
    out = dict(config)
    for key, value in config.items():
        if MASK not in value:
            continue
        if stored is not None and key in stored and shown({key: stored[key]})[key] == value:
            out[key] = stored[key]
        else:
            raise ConfigError(key, value, "the value itself (this is the mask the API shows for a secret, and "
                              "the connector has no stored value it stands for)")
    return out


def secret_default(raw: Mapping[str, object]) -> str | None:
    """The first secret among a connect process's task defaults, or None. The Kafka client's
    passwords are the process's own connection (handed to its tasks, never to a connector's
    config); every other secret would be handed to every connector a caller creates."""
    for key, value in raw.items():
        if key in _PROCESS_KEYS or key == PROVIDERS or key.startswith(PROVIDERS + "."):
            continue
        if is_secret_setting(key) or (isinstance(value, str) and mask_url(value) != value):
            return key
    return None


def replica_name(connector: str, task: int, worker_id: str) -> str:
    """A task's replica name (its worker.id, file and log names): letters, digits, ``_.-`` only,
    at most 64 characters whatever the connector's name, unique by a digest of the whole."""
    def slug(text: str, size: int) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:size]

    digest = hashlib.sha256(f"{connector}\0{task}\0{worker_id}".encode()).hexdigest()[:8]
    head = slug(connector, 24)
    head = head if head[:1].isalnum() else "c" + head[:23]
    return f"{head}-{task}-{slug(worker_id, 20)}-{digest}"
