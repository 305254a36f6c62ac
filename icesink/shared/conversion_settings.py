"""Kafka Connect's ``Cast`` and ``TimestampConverter`` settings, read and checked at start (leaf
module, no I/O): the ``spec`` of a Cast (``field:type,...`` or one type for the whole value),
and a TimestampConverter's ``target.type``, ``unix.precision`` and ``format`` (a Java
SimpleDateFormat pattern, translated to a strftime/strptime one; what has no exact translation is
refused by name)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from icesink.shared.errors import ConfigError

__all__ = ["CAST_TYPES", "TARGET_TYPES", "UNIX_PRECISIONS", "cast_spec", "check_conversion", "strftime_of"]

#: Cast's output types (Connect's SUPPORTED_CAST_OUTPUT_TYPES), lower case as its spec spells them.
CAST_TYPES: Final = ("int8", "int16", "int32", "int64", "float32", "float64", "boolean", "string")
TARGET_TYPES: Final = ("string", "unix", "Date", "Time", "Timestamp")
UNIX_PRECISIONS: Final = ("seconds", "milliseconds", "microseconds", "nanoseconds")
#: SimpleDateFormat letters with an exact strftime twin (UTC, as TimestampConverter sets it).
_LETTERS: Final[Mapping[str, str]] = {"yyyy": "%Y", "MM": "%m", "dd": "%d", "HH": "%H", "mm": "%M", "ss": "%S"}


def cast_spec(value: str) -> dict[str | None, str]:
    """Cast's ``spec`` as field -> type (field None: the whole value); raises ValueError saying why,
    as Connect's parseFieldTypes refuses."""
    out: dict[str | None, str] = {}
    entries = [e for e in value.split(",") if e.strip()]
    if not entries:
        raise ValueError("at least one field to cast")
    for entry in entries:
        parts = entry.split(":")
        if len(parts) > 2:
            raise ValueError(f"field:type pairs ({entry!r} is not one)")
        t = parts[-1].strip().lower()
        if t not in CAST_TYPES:
            raise ValueError(f"types among {', '.join(CAST_TYPES)} ({parts[-1].strip()!r} is not one)")
        out[None if len(parts) == 1 else parts[0].strip()] = t
    if None in out and len(entries) > 1:
        raise ValueError("a single type when it casts the whole value")
    return out


def strftime_of(pattern: str) -> str:
    """A SimpleDateFormat pattern as a strftime one; raises ValueError naming what has none."""
    out = []
    for m in re.finditer(r"'([^']*)'|([A-Za-z])\2*|([^A-Za-z']+)", pattern):
        quoted, literal = m.group(1), m.group(3)
        if quoted is not None:
            out.append("'" if quoted == "" else quoted.replace("%", "%%"))
        elif literal is not None:
            out.append(literal.replace("%", "%%"))
        elif m.group(0) in _LETTERS:
            out.append(_LETTERS[m.group(0)])
        else:
            raise ValueError(f"only {', '.join(_LETTERS)}, quoted text and punctuation ({m.group(0)!r} is not "
                             "translated yet)")
    if sum(len(m.group(0)) for m in re.finditer(r"'([^']*)'|([A-Za-z])\2*|([^A-Za-z']+)", pattern)) != len(pattern):
        raise ValueError("a pattern whose quotes are closed")
    return "".join(out)


def check_conversion(name: str, kind: str, props: Mapping[str, str]) -> None:
    """Raises ConfigError naming the first bad property of a Cast or TimestampConverter."""
    key = f"transforms.{name}"
    if "replace.null.with.default" in props and props["replace.null.with.default"].strip().lower() not in ("true", "false"):
        raise ConfigError(f"{key}.replace.null.with.default", props["replace.null.with.default"], "true or false")
    if kind.startswith("cast"):
        try:
            cast_spec(props["spec"])
        except ValueError as exc:
            raise ConfigError(f"{key}.spec", props["spec"], str(exc)) from None
        return
    target = props["target.type"]
    if target not in TARGET_TYPES:
        raise ConfigError(f"{key}.target.type", target, f"one of {', '.join(TARGET_TYPES)}")
    precision = props.get("unix.precision", "milliseconds")
    if precision not in UNIX_PRECISIONS:
        raise ConfigError(f"{key}.unix.precision", precision, f"one of {', '.join(UNIX_PRECISIONS)}")
    fmt = props.get("format", "").strip()
    if target == "string" and not fmt:
        raise ConfigError(f"{key}.format", props.get("format"), "set: TimestampConverter needs it for string timestamps")
    if fmt:
        try:
            strftime_of(props["format"])
        except ValueError as exc:
            raise ConfigError(f"{key}.format", props["format"], f"a SimpleDateFormat pattern of {exc}") from None
