"""The settings of an ``icesink connect`` process, and what its tasks are started with.

A process's config holds four kinds of keys:

- its own (:data:`CONNECT_DEFAULTS`, Kafka Connect's names where it has them) and its REST
  listeners' security (icesink/app/connect_security.py);
- process-level keys it hands to every task and that a connector's config may not set unless
  ``connector.config.override.allow`` lets it (icesink/app/connect_policy.py): the Kafka
  connection, ``state.dir``, the config providers;
- defaults for every connector's tasks (Spark, catalog, commit interval...), which a connector's
  config overrides. None of them may be a secret: a secret default would be handed to every
  connector a caller creates, so the process refuses to start (connectors reference secrets
  through config providers instead);
- nothing else: an unknown key is refused at start, naming it.

References to config providers (``${file:...}``, ``${env:...}``) are resolved for the process's
own use; what tasks are handed keeps them as written, and each task resolves them where it runs.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icesink.app.connect_policy import (
    CONNECTOR_ONLY, OVERRIDE_ALLOW, allowed_patterns, check_connector, check_name, secret_default,
)
from icesink.app.connect_security import (
    EXTENSIONS, HTTPS_PREFIX, JAAS, JAVA_SSL_KEYS, SSL_KEYS, Listener, RestSecurity, parse_listeners, rest_keys,
    rest_security,
)
from icesink.app.connect_state import tasks_max
from icesink.shared.config import Settings, build_resolved, keys_from_env, read_config_file
from icesink.shared.config_providers import SETTINGS_ENV_PREFIX, declared, is_provider_key, resolve
from icesink.shared.errors import ConfigError
from icesink.shared.secrets import Hidden

SPARK_SHARED = "connect.spark.shared"
#: Settings of the connect process itself, with their defaults.
CONNECT_DEFAULTS: dict[str, Any] = {
    # Loopback only: the API creates connectors, whose tasks run on this host. Listen elsewhere
    # with authentication (basic auth, https client certificates) or behind something that has it.
    "listeners": "http://127.0.0.1:8083",
    "rest.advertised.host.name": None,
    "rest.advertised.port": None,
    "rest.advertised.listener": None,
    "group.id": "icesink-connect",
    "config.storage.topic": "icesink-connect-configs",
    "heartbeat.interval-ms": 2000,
    "session.timeout-ms": 10000,
    "metrics.port": 9400,
    "metrics.host": "0.0.0.0",
    "state.dir": "var",
    OVERRIDE_ALLOW: "",
    # A task whose replica exits during start-up (before it runs), but for a config error, is
    # started again this many times, after 1, 2, 4... times the backoff (at most a minute).
    "tasks.start.retries": 3,
    "tasks.start.retry.backoff-ms": 2000,
    # One local Spark Connect server for every task of this process, instead of a Spark JVM per
    # task (icesink/app/connect_spark.py); the process's spark.* defaults configure it.
    SPARK_SHARED: "false",
}
#: Worker settings that are the process's, handed to every task as they are.
PROCESS_LEVEL = ("security.protocol", "sasl.mechanism", "sasl.username", "sasl.password", "ssl.cafile",
                 "ssl.certfile", "ssl.keyfile", "ssl.password")
_OWN_ENV_KEYS = [*CONNECT_DEFAULTS, EXTENSIONS, JAAS, *SSL_KEYS, *JAVA_SSL_KEYS,
                 *(HTTPS_PREFIX + k for k in (*SSL_KEYS, *JAVA_SSL_KEYS))]
_ENV = {re.sub(r"[.\-]", "_", k).upper(): k for k in _OWN_ENV_KEYS}


@dataclass(frozen=True)
class ConnectSettings:
    bootstrap_servers: str | None
    listeners: tuple[Listener, ...]
    advertised_scheme: str
    advertised_host: str
    advertised_port: int
    group_id: str
    config_topic: str
    heartbeat_s: float
    session_s: float
    metrics_host: str
    metrics_port: int
    state_dir: Path
    #: defaults for every connector's tasks, as written (references unresolved)
    task_defaults: dict[str, Any] = field(default_factory=dict)
    #: process-level keys handed to every task, as written
    process_keys: dict[str, Any] = field(default_factory=dict)
    override_allow: tuple[str, ...] = ()
    start_retries: int = 3
    start_backoff_s: float = 2.0
    security: RestSecurity = field(default_factory=RestSecurity)
    #: what the env config provider reads, here and in the tasks (no ICESINK_* variables)
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)
    rest_secrets: frozenset[str] = field(default_factory=frozenset, repr=False)
    #: connect.spark.shared: the tasks share one Spark Connect server this process starts
    spark_shared: bool = False
    #: session.timeout-ms was given (else a broker that holds joins gets a shorter one: connect_group.py)
    session_set: bool = False

    @property
    def listen_host(self) -> str:
        return self.listeners[0].host

    @property
    def listen_port(self) -> int:
        return self.listeners[0].port

    @property
    def worker_id(self) -> str:
        return f"{self.advertised_host}:{self.advertised_port}"

    @property
    def metrics_local_host(self) -> str:
        """Where this process reaches its tasks' ``/status`` (they listen on ``metrics.host``)."""
        return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.metrics_host, self.metrics_host)

    @property
    def metrics_instance(self) -> str:
        """The ``instance`` label of this process's tasks' series: its own metrics address."""
        return host_port(self.advertised_host, self.metrics_port) if self.metrics_port else self.worker_id

    def metrics_target(self, port: int) -> str:
        """Where other machines scrape a task of this process that listens on ``port``."""
        return host_port(self.advertised_host, port)

    @property
    def url(self) -> str:
        return f"{self.advertised_scheme}://{self.worker_id}"

    def task_config(self, name: str, config: Mapping[str, str], bootstrap: str | None) -> dict[str, Any]:
        """What a task of connector ``name`` is started with (references unresolved): the
        defaults, the process-level keys, then the connector's own keys."""
        own = {k: v for k, v in config.items() if k not in CONNECTOR_ONLY}
        out: dict[str, Any] = {**self.task_defaults, **self.process_keys, "state.dir": str(self.state_dir),
                               "metrics.host": self.metrics_host, **own}
        if "iceberg.connect.group-id" not in own:  # the reference's key for it, read as group.id
            out.setdefault("group.id", f"connect-{name}")
        if "bootstrap.servers" not in own:
            out["bootstrap.servers"] = bootstrap or self.bootstrap_servers
        if out["bootstrap.servers"] is None:
            del out["bootstrap.servers"]
        return out

    def check(self, name: str, config: Mapping[str, str], bootstrap: str | None = None) -> Settings:
        """A connector's config as its tasks' settings; ConfigError names what is wrong: the
        name, ``tasks.max``, a key the connector may not set, an unknown key, a reference that
        does not resolve, an invalid value."""
        check_name(name)
        tasks_max(dict(config))
        check_connector(config, self.override_allow, {**self.task_defaults, **self.process_keys})
        return build_resolved(self.task_config(name, config, bootstrap), self.environ)

    def sink_settings(self, config: Mapping[str, str]) -> Settings:
        """A connector's config as ``icesink worker`` settings (its name aside)."""
        return self.check(str(config.get("name", "connector")), config)

    def process_settings(self) -> Settings:
        """The defaults as worker settings (Kafka clients, state dir, secrets to redact) for this
        process's own use; the topic and table only fill required keys."""
        raw = {"topics": "-", "iceberg.tables": "icesink.connect", **self.task_defaults, **self.process_keys,
               "state.dir": str(self.state_dir)}
        if self.bootstrap_servers is not None:
            raw["bootstrap.servers"] = self.bootstrap_servers
        return build_resolved(raw, self.environ)

    def client_kwargs(self) -> dict[str, Any]:
        return dict(self.process_settings().kafka_client_kwargs())

    def secret_values(self) -> set[str]:
        """Every secret this process knows: what its logs must never hold."""
        return self.process_settings().secret_values() | set(self.rest_secrets)


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _int(raw: Mapping[str, Any], key: str, low: int) -> int:
    try:
        value = int(str(raw[key]))
    except (TypeError, ValueError):
        raise ConfigError(key, raw[key], "a whole number") from None
    if value < low:
        raise ConfigError(key, value, f"at least {low}")
    return value


def connect_settings(raw: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> ConnectSettings:
    env = {k: v for k, v in (environ or {}).items() if not k.startswith(SETTINGS_ENV_PREFIX)}
    resolved, _ = resolve({**CONNECT_DEFAULTS, **raw}, declared(raw), env)
    listeners = parse_listeners(resolved["listeners"])
    advertised = _advertised(resolved, listeners)
    security, rest_secrets = rest_security({k: resolved[k] for k in rest_keys(raw)}, listeners)
    metrics_port = _int(resolved, "metrics.port", 0)
    for listener in listeners:
        if listener.port == metrics_port:
            raise ConfigError("metrics.port", metrics_port, "a port apart from the API's listeners (metrics only)")
    own = set(CONNECT_DEFAULTS) | rest_keys(raw) | {"bootstrap.servers"}
    process_keys = {k: v for k, v in raw.items() if k in PROCESS_LEVEL or is_provider_key(k)}
    defaults = {k: v for k, v in raw.items() if k not in own and k not in process_keys}
    secret = secret_default(defaults)
    if secret is not None:
        raise ConfigError(secret, Hidden(defaults[secret]), "no secret among icesink connect's settings: it would be "
                          "handed to every connector a caller creates. A connector that needs it references it "
                          "through a config provider (config.providers; e.g. ${file:/etc/icesink/secrets.properties:KEY} "
                          "or ${env:VAR} in the connector's config)")
    settings = ConnectSettings(
        bootstrap_servers=str(raw["bootstrap.servers"]) if raw.get("bootstrap.servers") else None,
        listeners=tuple(listeners), advertised_scheme=advertised.scheme, advertised_host=advertised.host,
        advertised_port=advertised.port,
        group_id=str(resolved["group.id"]), config_topic=str(resolved["config.storage.topic"]),
        heartbeat_s=_int(resolved, "heartbeat.interval-ms", 100) / 1000,
        session_s=_int(resolved, "session.timeout-ms", 1000) / 1000,
        metrics_host=str(resolved["metrics.host"]), metrics_port=metrics_port,
        state_dir=Path(str(resolved["state.dir"])).resolve(), task_defaults=defaults, process_keys=process_keys,
        override_allow=allowed_patterns(resolved[OVERRIDE_ALLOW]),
        start_retries=_int(resolved, "tasks.start.retries", 0),
        start_backoff_s=_int(resolved, "tasks.start.retry.backoff-ms", 100) / 1000,
        security=security, environ=env, rest_secrets=frozenset(rest_secrets),
        spark_shared=_shared_spark(resolved, defaults), session_set="session.timeout-ms" in raw,
    )
    if settings.session_s <= 2 * settings.heartbeat_s:
        raise ConfigError("session.timeout-ms", resolved["session.timeout-ms"],
                          "more than twice heartbeat.interval-ms")
    settings.client_kwargs()  # the task defaults and the Kafka client settings must be valid too
    return settings


def _shared_spark(resolved: Mapping[str, Any], defaults: Mapping[str, Any]) -> bool:
    raw = str(resolved[SPARK_SHARED]).strip().lower()
    if raw not in ("true", "false"):
        raise ConfigError(SPARK_SHARED, resolved[SPARK_SHARED], "true or false")
    if raw == "false":
        return False
    if "spark.remote" in defaults or not str(defaults.get("spark.master", "local[*]")).startswith("local"):
        key = "spark.remote" if "spark.remote" in defaults else "spark.master"
        raise ConfigError(SPARK_SHARED, raw, f"false when the tasks' default {key} is not a local Spark "
                          f"({defaults[key]}): the shared Spark is a local Spark Connect server this process starts")
    return True


def _advertised(resolved: Mapping[str, Any], listeners: list[Listener]) -> Listener:
    scheme = resolved["rest.advertised.listener"]
    chosen = listeners[0]
    if scheme is not None:
        matching = [x for x in listeners if x.scheme == str(scheme).lower()]
        if not matching:
            raise ConfigError("rest.advertised.listener", scheme, "http or https, the scheme of one of the listeners")
        chosen = matching[0]
    host = resolved["rest.advertised.host.name"] or (
        socket.gethostname() if chosen.host in ("", "0.0.0.0", "::") else chosen.host)
    port = _int(resolved, "rest.advertised.port", 1) if resolved["rest.advertised.port"] is not None else chosen.port
    return Listener(chosen.scheme, str(host), port)


def load_connect_settings(path: Path | None, environ: Mapping[str, str], overrides: Mapping[str, Any]) -> ConnectSettings:
    raw: dict[str, Any] = dict(read_config_file(path)) if path is not None else {}
    env = {k: v for k, v in environ.items() if k.startswith("ICESINK_")}
    own = {name: value for name, value in env.items() if name[len("ICESINK_"):] in _ENV}
    raw.update({_ENV[name[len("ICESINK_"):]]: value for name, value in own.items()})
    raw.update(keys_from_env({k: v for k, v in env.items() if k not in own}))
    raw.update(overrides)
    return connect_settings(raw, environ)
