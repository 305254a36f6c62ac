"""The answers of ``icesink connect``'s plugin and admin endpoints in Kafka Connect's shapes (pure,
no I/O): ``GET /connector-plugins``, ``PUT /connector-plugins/{plugin}/config/validate``
(Connect's ``ConfigInfos``), ``/admin/loggers`` (this process's Python loggers, levels named as
log4j names them) and the connector classes a connector may name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from icesink.app.connect_policy import shown
from icesink.app.connect_state import PLUGIN_VERSION
from icesink.shared.errors import ConfigError
from icesink.shared.secrets import MASK

#: The Iceberg sink's classes a connector may name: the Apache Iceberg sink's and Tabular's
#: (also by their simple names, as Connect's plugin aliases allow).
CONNECTOR_CLASSES = ("org.apache.iceberg.connect.IcebergSinkConnector",
                     "io.tabular.iceberg.connect.IcebergSinkConnector")
_ALIASES = ("IcebergSinkConnector", "IcebergSink")
#: The connector's own keys, always listed by validate (Connect's "Common" group).
_COMMON = ("name", "connector.class", "tasks.max", "topics", "topics.regex")


def plugins() -> list[dict[str, str]]:
    return [{"class": c, "type": "sink", "version": PLUGIN_VERSION} for c in CONNECTOR_CLASSES]


def is_iceberg_sink(klass: str) -> bool:
    return klass.strip() in CONNECTOR_CLASSES or klass.strip() in _ALIASES


def check_class(config: Mapping[str, str]) -> None:
    """ConfigError naming ``connector.class`` unless it names the Iceberg sink."""
    klass = config.get("connector.class")
    if klass is None:
        raise ConfigError("connector.class", None, f"the Iceberg sink's class ({' or '.join(CONNECTOR_CLASSES)})")
    if not is_iceberg_sink(klass):
        raise ConfigError("connector.class", klass, f"the Iceberg sink's class ({' or '.join(CONNECTOR_CLASSES)}): "
                          "icesink runs no other connector")


def plugin_matches(plugin: str, klass: str) -> bool:
    """Connect's rule: the config's class must end with the plugin named in the path."""
    def norm(name: str) -> str:
        return name[:-len("Connector")] if name.endswith("Connector") else name

    return norm(klass).endswith(norm(plugin))


def validate(config: Mapping[str, str], check: Callable[[dict[str, str]], object]) -> dict[str, Any]:
    """Connect's ``ConfigInfos`` for ``config``: every key given and the connector's own keys,
    each with the errors icesink's settings check finds for it. The check names one key at a
    time: a key found wrong is set aside (a missing one filled with a stand-in) and the rest
    checked again, so each key's error is found."""
    errors: dict[str, list[str]] = {}
    trial = dict(config)
    for _ in range(len(config) + len(_COMMON) + 5):
        try:
            if "connector.class" not in errors:
                check_class(trial)
            check(trial)
            break
        except ConfigError as exc:
            if exc.key in errors:
                break
            errors[exc.key] = [str(exc)]
            if exc.key == "connector.class":
                continue
            if exc.key in trial:
                del trial[exc.key]
            else:
                trial[exc.key] = "validate-stand-in"
    # As Connect shows a password's value as [hidden]: secrets and URL passwords masked, in the
    # values and in the errors that quote them.
    display = shown(config)
    hidden = sorted({v for k, v in config.items() if display[k] != v} - {""}, key=len, reverse=True)
    for messages in errors.values():
        for secret in hidden:
            messages[:] = [m.replace(secret, MASK) for m in messages]
    keys = [*_COMMON, *sorted(k for k in {*config, *errors} if k not in _COMMON)]
    configs = []
    for order, key in enumerate(keys):
        group = "Common" if key in _COMMON else "Iceberg"
        configs.append({
            "definition": {"name": key, "type": "STRING", "required": key in ("name", "connector.class"),
                           "default_value": None, "importance": "HIGH" if key in _COMMON else "MEDIUM",
                           "documentation": "", "group": group, "order_in_group": order, "width": "NONE",
                           "display_name": key, "dependents": []},
            "value": {"name": key, "value": display.get(key), "recommended_values": [],
                      "errors": errors.get(key, []), "visible": True},
        })
    return {"name": str(config.get("connector.class", "")), "error_count": sum(len(e) for e in errors.values()),
            "groups": ["Common", "Iceberg"], "configs": configs}


# --- /admin/loggers ---------------------------------------------------------------------------

_TO_PYTHON = {"ALL": logging.NOTSET + 1, "TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
              "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL,
              "OFF": logging.CRITICAL + 10}
_CHANGED: dict[str, int] = {}  # logger -> when its level was last set through the API (ms)


def _level_name(level: int) -> str:
    if level >= logging.CRITICAL + 10:
        return "OFF"
    if level >= logging.CRITICAL:
        return "FATAL"
    return {logging.ERROR: "ERROR", logging.WARNING: "WARN", logging.INFO: "INFO"}.get(level, "DEBUG")


def _entry(name: str, logger: logging.Logger) -> dict[str, Any]:
    return {"level": _level_name(logger.getEffectiveLevel()), "last_modified": _CHANGED.get(name)}


def _known() -> dict[str, logging.Logger]:
    return {n: lg for n, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}


def loggers() -> dict[str, dict[str, Any]]:
    """Connect's ``GET /admin/loggers``: the root logger and every logger with a level set."""
    out = {"root": _entry("root", logging.getLogger())}
    for name, lg in sorted(_known().items()):
        if lg.level != logging.NOTSET:
            out[name] = _entry(name, lg)
    return out


def logger(name: str) -> dict[str, Any] | None:
    if name == "root":
        return _entry("root", logging.getLogger())
    lg = _known().get(name)
    return None if lg is None else _entry(name, lg)


def set_level(name: str, level: str) -> list[str] | None:
    """Set ``name`` and the loggers under it to log4j's ``level``: the loggers changed (Connect's
    answer), or None if ``level`` is not a log4j level."""
    value = _TO_PYTHON.get(level.upper())
    if value is None:
        return None
    now = int(time.time() * 1000)
    if name == "root":
        targets = {"root": logging.getLogger(), **_known()}
    else:
        targets = {n: lg for n, lg in _known().items() if n == name or n.startswith(name + ".")}
        if name not in targets:
            targets[name] = logging.getLogger(name)
    for n, lg in targets.items():
        lg.setLevel(value)
        _CHANGED[n] = now
    return sorted(targets)
