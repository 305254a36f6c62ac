"""Config providers, as Kafka's: a value ``${file:/etc/icesink/creds.properties:s3-secret}`` or
``${env:S3_SECRET}`` in a config stands for a value read where the config is used, so that the
secret itself is in no config file, no config topic and no API answer. Leaf module: it reads
the files a reference names, and the environment it is handed; nothing else.

Declared as in Kafka (the process's settings, never a connector's)::

    config.providers=file,env
    config.providers.file.class=org.apache.kafka.common.config.provider.FileConfigProvider
    config.providers.file.param.allowed.paths=/etc/icesink/secrets
    config.providers.env.class=org.apache.kafka.common.config.provider.EnvVarConfigProvider
    config.providers.env.param.allowlist.pattern=S3_.*

A reference is ``${<provider>:[<path>:]<key>}`` (Kafka's ConfigTransformer pattern): for the file
provider ``<path>`` is a Java properties file and ``<key>`` one of its keys; for the env provider
there is no path and ``<key>`` is a variable. Unlike Kafka, whose providers read every path and
every variable unless restricted, ``allowed.paths`` and ``allowlist.pattern`` are required (a
reference in a config a caller PUT would otherwise read any file or variable of the host), and a
reference that does not resolve is an error naming the key, not a value left as written. The
resolved value is never put in an error message.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icesink.shared.errors import ConfigError
from icesink.shared.secrets import Hidden

PREFIX = "config.providers"
FILE_PROVIDER = "org.apache.kafka.common.config.provider.FileConfigProvider"
ENV_PROVIDER = "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
_PARAMS = {FILE_PROVIDER: "allowed.paths", ENV_PROVIDER: "allowlist.pattern"}
#: Kafka's ConfigTransformer.DEFAULT_PATTERN: ${provider:[path:]key}
REFERENCE = re.compile(r"\$\{([^}]*?):(([^}]*?):)?([^}]*?)\}")
#: Variables the env provider never sees: they are icesink's own settings (ICESINK_<KEY>).
SETTINGS_ENV_PREFIX = "ICESINK_"


def is_provider_key(key: str) -> bool:
    return key == PREFIX or key.startswith(PREFIX + ".")


def has_reference(value: object) -> bool:
    return isinstance(value, str) and REFERENCE.search(value) is not None


def is_reference(value: object) -> bool:
    """Whether ``value`` is exactly one reference (shown as written: it holds no secret)."""
    return isinstance(value, str) and REFERENCE.fullmatch(value.strip()) is not None


@dataclass(frozen=True)
class Provider:
    name: str
    kind: str  # FILE_PROVIDER or ENV_PROVIDER
    allowed_paths: tuple[Path, ...] = ()
    allowlist: re.Pattern[str] | None = None


def declared(raw: Mapping[str, Any]) -> dict[str, Provider]:
    """The providers ``raw``'s ``config.providers*`` keys declare; ConfigError names a bad key."""
    names = [n.strip() for n in str(raw.get(PREFIX, "")).split(",") if n.strip()]
    out: dict[str, Provider] = {}
    for name in names:
        cls_key = f"{PREFIX}.{name}.class"
        kind = str(raw.get(cls_key, ""))
        if kind not in _PARAMS:
            raise ConfigError(cls_key, raw.get(cls_key), f"{FILE_PROVIDER} or {ENV_PROVIDER}")
        param_key = f"{PREFIX}.{name}.param.{_PARAMS[kind]}"
        param = str(raw.get(param_key, "")).strip()
        if not param:
            what = "comma-separated absolute paths the references may read under" if kind == FILE_PROVIDER else \
                "a regular expression the variables the references may read match"
            raise ConfigError(param_key, None, f"{what} (required here: without it a config could read any "
                              f"{'file' if kind == FILE_PROVIDER else 'variable'} of the host)")
        if kind == FILE_PROVIDER:
            paths = []
            for entry in (p.strip() for p in param.split(",") if p.strip()):
                if not os.path.isabs(entry) or not os.path.exists(entry):
                    raise ConfigError(param_key, entry, "absolute paths that exist")
                paths.append(Path(os.path.realpath(entry)))
            out[name] = Provider(name, kind, allowed_paths=tuple(paths))
        else:
            try:
                out[name] = Provider(name, kind, allowlist=re.compile(param))
            except re.error as exc:
                raise ConfigError(param_key, param, f"a regular expression ({exc})") from None
    for key in raw:
        if not is_provider_key(key) or key == PREFIX:
            continue
        name, _, rest = key[len(PREFIX) + 1:].partition(".")
        known = name in out and (rest == "class" or rest == f"param.{_PARAMS[out[name].kind]}")
        if not known:
            raise ConfigError(key, raw[key], f"config.providers.<name>.class or its parameter "
                              f"(allowed.paths, allowlist.pattern) of a provider listed in {PREFIX} ({names})")
    return out


def provider_settings(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if is_provider_key(k)}


def resolve(raw: Mapping[str, Any], providers: Mapping[str, Provider],
            environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``raw`` with every reference replaced (its ``config.providers*`` keys dropped), and the
    keys whose values came from a provider, with their resolved values (secrets from here on:
    never logged, never shown). ConfigError names the key of a reference that does not resolve,
    without its value."""
    out: dict[str, Any] = {}
    provided: dict[str, str] = {}
    env = {k: v for k, v in environ.items() if not k.startswith(SETTINGS_ENV_PREFIX)}
    for key, value in raw.items():
        if is_provider_key(key):
            continue
        if not has_reference(value):
            out[key] = value
            continue
        text = str(value)
        resolved = REFERENCE.sub(functools.partial(_lookup, key, providers=providers, env=env), text)
        out[key] = provided[key] = resolved
    return out, provided


def _lookup(key: str, match: re.Match[str], *, providers: Mapping[str, Provider], env: Mapping[str, str]) -> str:
    name, path, variable = match.group(1), match.group(3) or "", match.group(4)
    provider = providers.get(name)
    if provider is None:
        raise ConfigError(key, match.group(0), f"a reference to a provider declared in {PREFIX} "
                          f"({', '.join(providers) or 'none is'})")
    if provider.kind == ENV_PROVIDER:
        if path:
            raise ConfigError(key, match.group(0), f"${{{name}:VARIABLE}}: the env provider takes no path")
        assert provider.allowlist is not None
        if not provider.allowlist.fullmatch(variable):
            raise ConfigError(key, match.group(0), f"a variable matching {PREFIX}.{name}.param.allowlist.pattern "
                              f"({provider.allowlist.pattern})")
        if variable not in env:
            raise ConfigError(key, match.group(0), f"a variable set in the environment ({variable} is not)")
        return env[variable]
    if not path or not os.path.isabs(path):
        raise ConfigError(key, match.group(0), f"${{{name}:/ABSOLUTE/PATH:KEY}}")
    real = Path(os.path.realpath(path))
    if not any(real == allowed or real.is_relative_to(allowed) for allowed in provider.allowed_paths):
        raise ConfigError(key, match.group(0), f"a file under {PREFIX}.{name}.param.allowed.paths "
                          f"({', '.join(map(str, provider.allowed_paths))})")
    try:
        properties = parse_properties(real.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(key, match.group(0), f"a readable properties file ({exc.strerror})") from None
    if variable not in properties:
        raise ConfigError(key, match.group(0), f"a key of {path} ({variable} is not one)")
    return properties[variable]


def parse_properties(text: str) -> dict[str, str]:
    """A Java properties file's ``key=value``, ``key: value`` or ``key value`` lines (``#`` and
    ``!`` comments, blank lines; a line ending in an odd number of backslashes continues on the
    next), as ``java.util.Properties.load`` reads them for the simple files secrets are kept in."""
    out: dict[str, str] = {}
    logical: list[str] = []
    for line in text.splitlines():
        stripped = line.lstrip()
        if not logical and (not stripped or stripped[0] in "#!"):
            continue
        trailing = len(stripped) - len(stripped.rstrip("\\"))
        if trailing % 2 == 1:
            logical.append(stripped[:-1])
            continue
        logical.append(stripped)
        entry, logical = "".join(logical), []
        m = re.match(r"((?:\\.|[^=:\s\\])*)\s*[=:\s]?\s*(.*)$", entry)
        if m is None:  # pragma: no cover - the pattern matches every string
            continue
        out[_unescape(m.group(1))] = _unescape(m.group(2))
    return out


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(m.group(1), m.group(1)), text)


def hidden(key: str, value: object, provided: Mapping[str, str]) -> object:
    """How an error may quote ``key``'s value: a provided value only by its type."""
    return Hidden(value) if key in provided else value
