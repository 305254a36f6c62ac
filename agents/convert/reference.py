"""Step 4 of agents.convert: the per-record reference path (plain Python ``json``). It defines
the semantics; the bulk path only accepts what it converts to the same value.
"""

from __future__ import annotations

import base64
import json
import struct
import uuid
from datetime import date
from decimal import ROUND_FLOOR, Decimal, InvalidOperation, localcontext

import pyarrow as pa

from agents.convert.columns import (
    EPOCH_UNIT, EpochUnit, connect_bytes, int_bounds, is_binary, is_list, is_string, is_uuid, meta, type_name,
    unsupported,
)
from agents.convert.grammar import (
    B64_RE, CONSTANTS, DATE_RE, DAY_SECONDS, EPOCH_ORDINAL, EXACT, INT64, MAX_DAYS, MIN_DAYS, MIN_SECONDS,
    NUM_RE, TIME_FORMAT, TIME_RE, TS_FORMAT, TS_RE, UNIT_DIGITS, UUID_RE, ts_bounds,
)
from agents.convert.wrapped import map_items, rewriter, utf8_reason


class Bad(Exception):
    def __init__(self, reason: str, field: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


class Number:
    """A JSON number token, kept as its text so every conversion is exact."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    @property
    def is_int(self) -> bool:
        return not any(c in self.text for c in ".eE") and self.text not in CONSTANTS


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise Bad(f"malformed JSON: duplicate key {key!r}", None)
            seen.add(key)
    return out


def _check_text(value: object) -> None:
    """Strings must be encodable: JSON escapes can spell lone surrogates ("\\ud800")."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise Bad("malformed JSON: a string holds an unpaired surrogate escape", None) from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def load(value: bytes | bytearray | memoryview) -> object:
    """One record, parsed as the bulk reader would; raises Bad for malformed JSON."""
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Bad(utf8_reason(exc), None) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip(" \t\r\n"):
        raise Bad("malformed JSON: empty record", None)
    try:
        doc = json.loads(
            text,
            object_pairs_hook=_object,
            parse_int=Number,
            parse_float=Number,
            parse_constant=Number,
        )
    except json.JSONDecodeError as exc:
        raise Bad(f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", None) from None
    except RecursionError:
        raise Bad("malformed JSON: nested too deeply", None) from None
    _check_text(doc)
    return doc


def _json_text(v: object) -> str:
    """Compact JSON of a parsed value; numbers keep their original text."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, Number):
        return v.text
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ",".join(_json_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return (
            "{"
            + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _json_text(x) for k, x in v.items())
            + "}"
        )
    raise TypeError(f"not a parsed JSON value: {type(v).__name__}")


def _show(v: object) -> str:
    text = repr(v) if isinstance(v, str) else _json_text(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, Number):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _numeric(v: object) -> Decimal | None:
    """The exact value of a JSON number or numeric string (None for NaN, Infinity, others)."""
    if isinstance(v, Number):
        return None if v.text in CONSTANTS else Decimal(v.text)
    if isinstance(v, str) and NUM_RE.fullmatch(v):
        return Decimal(v)
    return None


def _coerce(v: object, f: pa.Field, path: str, unit: EpochUnit) -> object:
    """A parsed JSON value -> a Python value pyarrow stores as field ``f``; raises Bad.
    ``unit``: the epoch unit of temporal fields without their own."""
    t = f.type
    if v is None:
        if not f.nullable:
            raise Bad("required field is null or missing", path)
        return None
    if pa.types.is_struct(t):
        if not isinstance(v, dict):
            raise Bad(f"cannot coerce {_show(v)} to struct: expected a JSON object", path)
        return {c.name: _coerce(v.get(c.name), c, f"{path}.{c.name}", unit) for c in t}
    if is_list(t):
        if not isinstance(v, list):
            raise Bad(f"cannot coerce {_show(v)} to list: expected a JSON array", path)
        element = t.value_field
        return [_coerce(x, element, f"{path}[{i}]", unit) for i, x in enumerate(v)]
    if pa.types.is_map(t):
        return _coerce_map(v, t, path, unit)
    if is_string(t):
        return v if isinstance(v, str) else _json_text(v)
    if pa.types.is_boolean(t):
        if isinstance(v, bool):
            return v
        if v in ("true", "false"):
            return v == "true"
        raise Bad(f"cannot coerce {_show(v)} to boolean", path)
    if pa.types.is_integer(t):
        return _coerce_integer(v, t, path)
    if pa.types.is_floating(t):
        return _coerce_float(v, t, path)
    if connect_bytes(f):
        return _coerce_connect_decimal(v, t, path)
    if pa.types.is_decimal(t):
        return _coerce_decimal(v, t, path)
    if pa.types.is_timestamp(t):
        return _coerce_timestamp(v, t, meta(f, EPOCH_UNIT) or unit, path)
    if pa.types.is_date32(t):
        return _coerce_date(v, meta(f, EPOCH_UNIT), path)
    if pa.types.is_time(t):
        return _coerce_time(v, t, meta(f, EPOCH_UNIT) or unit, path)
    if is_uuid(t):
        return _coerce_uuid(v, path)
    if is_binary(t):
        return _coerce_binary(v, t, path)
    raise unsupported(path, t)


def _coerce_map(v: object, t: pa.MapType, path: str, unit: EpochUnit) -> list[tuple[object, object]]:
    """A JSON object or an array of ``[key, value]`` pairs -> map entries in their order; keys
    are coerced to the key type (an object's key as its text), values as a column of the value
    type would be."""
    items = map_items(v)
    if items is None:
        raise Bad(
            f"cannot coerce {_show(v)} to map: expected a JSON object or an array of [key, value] pairs", path,
        )
    entries: list[tuple[object, object]] = []
    seen: dict[object, str] = {}
    for i, (k, x) in enumerate(items):
        if k is None or isinstance(k, (list, dict)):
            raise Bad(f"map key: expected a string, number or boolean, found {_kind(k)}", f"{path}[{i}]")
        k = k if isinstance(k, str) else _json_text(k)
        at = f"{path}.{k}"
        try:
            key = _coerce(k, t.key_field, at, unit)
        except Bad as bad:
            raise Bad(f"map key: {bad.reason}", at) from None
        if key in seen:
            raise Bad(f"map key {k!r} is the same {type_name(t.key_type)} as key {seen[key]!r}", at)
        seen[key] = k
        entries.append((key, _coerce(x, t.item_field, at, unit)))
    return entries


def _coerce_integer(v: object, t: pa.DataType, path: str) -> int:
    name = type_name(t)
    number = None if isinstance(v, bool) else _numeric(v)
    if number is None:
        raise Bad(f"cannot coerce {_show(v)} to {name}", path)
    lo, hi = int_bounds(t)
    if number.adjusted() > 40:
        raise Bad(f"cannot coerce {_show(v)} to {name}: out of range [{lo}, {hi}]", path)
    if number != number.to_integral_value():
        raise Bad(f"cannot coerce {_show(v)} to {name}: it has a fractional part", path)
    value = int(number)
    if not lo <= value <= hi:
        raise Bad(f"cannot coerce {_show(v)} to {name}: out of range [{lo}, {hi}]", path)
    return value


def _coerce_float(v: object, t: pa.DataType, path: str) -> float:
    name = type_name(t)
    if isinstance(v, Number):
        value = float(v.text)
        literal = v.text in CONSTANTS
    elif isinstance(v, str) and NUM_RE.fullmatch(v):
        value = float(v)
        literal = False
    else:
        raise Bad(f"cannot coerce {_show(v)} to {name}", path)
    overflow = value in (float("inf"), float("-inf")) and not literal
    if not overflow and pa.types.is_float32(t):
        try:
            struct.pack("<f", value)
        except OverflowError:
            overflow = True
    if overflow:
        raise Bad(f"cannot coerce {_show(v)} to {name}: out of range", path)
    return value


def _coerce_decimal(v: object, t: pa.DataType, path: str) -> Decimal:
    name = type_name(t)
    number = None if isinstance(v, bool) else _numeric(v)
    if number is None:
        raise Bad(f"cannot coerce {_show(v)} to {name}", path)
    return _exact_decimal(v, number, t, path)


def _exact_decimal(v: object, number: Decimal, t: pa.DataType, path: str) -> Decimal:
    name = type_name(t)
    digits = t.precision - t.scale
    if number and number.adjusted() >= digits:
        raise Bad(f"cannot coerce {_show(v)} to {name}: more than {digits} integer digits", path)
    with localcontext() as ctx:
        ctx.prec = 80
        try:
            exact = number.quantize(Decimal(1).scaleb(-t.scale))
        except InvalidOperation:
            exact = None
    if exact is None or exact != number:
        raise Bad(f"cannot coerce {_show(v)} to {name}: more than {t.scale} decimal places", path)
    return exact


def _coerce_connect_decimal(v: object, t: pa.DataType, path: str) -> Decimal:
    raw = _base64(v, f"{type_name(t)} (Kafka Connect Decimal bytes)", path)
    if not raw:
        raise Bad(f"cannot coerce {_show(v)} to {type_name(t)}: no bytes", path)
    number = Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-t.scale, EXACT)
    return _exact_decimal(v, number, t, path)


def _base64(v: object, name: str, path: str) -> bytes:
    if not isinstance(v, str) or not B64_RE.fullmatch(v):
        raise Bad(f"cannot coerce {_show(v)} to {name}: expected a base64 string (standard, padded)", path)
    return base64.b64decode(v)


def _coerce_binary(v: object, t: pa.DataType, path: str) -> bytes:
    name = type_name(t)
    raw = _base64(v, name, path)
    if pa.types.is_fixed_size_binary(t) and len(raw) != t.byte_width:
        raise Bad(f"cannot coerce {_show(v)} to {name}: found {len(raw)} bytes", path)
    return raw


def _coerce_uuid(v: object, path: str) -> bytes:
    if not isinstance(v, str) or not UUID_RE.fullmatch(v):
        raise Bad(f"cannot coerce {_show(v)} to uuid: expected 'xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx'", path)
    return uuid.UUID(v).bytes


def _count(v: object, name: str, unit: str, to_digits: int, since: str, path: str) -> int | None:
    """A JSON number or numeric string counting ``unit`` -> ticks of ``10**-to_digits`` s,
    floored; None when ``v`` is not numeric."""
    number = None if isinstance(v, bool) else _numeric(v)
    if number is None:
        return None
    if number and number.adjusted() > 40:
        raise Bad(f"cannot coerce {_show(v)} to {name}: out of range ({unit} since {since})", path)
    with localcontext() as ctx:
        ctx.prec = 100
        return int(number.scaleb(to_digits - UNIT_DIGITS[unit]).to_integral_value(rounding=ROUND_FLOOR))


def _coerce_timestamp(v: object, t: pa.DataType, unit: str, path: str) -> int:
    name = type_name(t)
    digits = UNIT_DIGITS[t.unit]
    ticks = _count(v, name, unit, digits, "the epoch", path)
    if ticks is not None:
        lo, hi = ts_bounds(digits)
        if not lo <= ticks <= hi:
            raise Bad(
                f"cannot coerce {_show(v)} to {name}: {unit} since the epoch is out of range "
                f"(0001-01-01 to 9999-12-31); is the unit right? set {EPOCH_UNIT} or the "
                "table's timestamp-unit",
                path,
            )
        return ticks
    match = TS_RE.fullmatch(v) if isinstance(v, str) else None
    if match is None:
        raise Bad(f"cannot coerce {_show(v)} to {name}: expected {TS_FORMAT} ({unit})", path)
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    fraction, offset = match.group(7) or "", match.group(8)
    try:
        days = date(year, month, day).toordinal() - EPOCH_ORDINAL
    except ValueError as exc:
        raise Bad(f"cannot coerce {_show(v)} to {name}: {exc}", path) from None
    if hour > 23 or minute > 59 or second > 59:
        raise Bad(f"cannot coerce {_show(v)} to {name}: time of day out of range", path)
    shift = 0
    if offset and offset != "Z":
        offset_digits = offset[1:].replace(":", "")
        off_hours, off_minutes = int(offset_digits[:2]), int(offset_digits[2:] or 0)
        if off_hours > 23 or off_minutes > 59:
            raise Bad(f"cannot coerce {_show(v)} to {name}: offset out of range", path)
        shift = (off_hours * 60 + off_minutes) * 60 * (1 if offset[0] == "+" else -1)
    seconds = days * 86_400 + hour * 3600 + minute * 60 + second - shift
    unit_digits: int = UNIT_DIGITS[t.unit]
    value: int = seconds * 10**unit_digits + int((fraction + "0" * 9)[:unit_digits] or 0)
    if seconds < MIN_SECONDS or not INT64[0] <= value <= INT64[1]:
        raise Bad(f"cannot coerce {_show(v)} to {name}: out of range", path)
    return value


def _coerce_time(v: object, t: pa.DataType, unit: str, path: str) -> int:
    name = type_name(t)
    digits = UNIT_DIGITS[t.unit]
    ticks = _count(v, name, unit, digits, "midnight", path)
    if ticks is None:
        match = TIME_RE.fullmatch(v) if isinstance(v, str) else None
        if match is None:
            raise Bad(f"cannot coerce {_show(v)} to {name}: expected {TIME_FORMAT} ({unit})", path)
        hour, minute, second = int(match["h"]), int(match["m"]), int(match["s"])
        if hour > 23 or minute > 59 or second > 59:
            raise Bad(f"cannot coerce {_show(v)} to {name}: time of day out of range", path)
        fraction = int(((match["f"] or "") + "0" * 9)[:digits] or 0)
        time_ticks: int = ((hour * 60 + minute) * 60 + second) * 10**digits + fraction
        return time_ticks
    if not 0 <= ticks < DAY_SECONDS * 10**digits:
        raise Bad(f"cannot coerce {_show(v)} to {name}: {unit} since midnight out of range [0, 1 day)", path)
    return ticks


def _coerce_date(v: object, unit: str | None, path: str) -> int:
    number = None if isinstance(v, bool) else _numeric(v)
    if number is not None:
        if unit is not None:
            with localcontext() as ctx:
                ctx.prec = 100
                number = number.scaleb(-UNIT_DIGITS[unit]) / DAY_SECONDS
        if number != number.to_integral_value():
            raise Bad(f"cannot coerce {_show(v)} to date: not a whole day (dates are not truncated)", path)
        days = int(number)
        if not MIN_DAYS <= days <= MAX_DAYS:
            since = "days" if unit is None else unit
            raise Bad(f"cannot coerce {_show(v)} to date: {since} since the epoch out of range", path)
        return days
    match = DATE_RE.fullmatch(v) if isinstance(v, str) else None
    if match is None:
        if isinstance(v, str) and TS_RE.fullmatch(v):
            raise Bad(
                f"cannot coerce {_show(v)} to date: expected 'YYYY-MM-DD', found a timestamp "
                "(timestamps are not truncated to dates)",
                path,
            )
        raise Bad(f"cannot coerce {_show(v)} to date: expected 'YYYY-MM-DD' or days since the epoch", path)
    try:
        return date(*(int(g) for g in match.groups())).toordinal() - EPOCH_ORDINAL
    except ValueError as exc:
        raise Bad(f"cannot coerce {_show(v)} to date: {exc}", path) from None


class Oracle:
    """The per-record reference conversion (slow, exact, authoritative)."""

    def __init__(self, schema: pa.Schema, unit: EpochUnit, fold: bool = False) -> None:
        self.schema = schema
        self.unit = unit
        self.fold = rewriter(pa.struct(list(schema)), entries=False, fold=True) if fold else None

    def row(self, value: bytes) -> dict[str, object]:
        doc = load(value)
        if not isinstance(doc, dict):
            raise Bad(f"not a JSON object: found {_kind(doc)}", None)
        if self.fold is not None:
            doc = self.fold(doc)
            assert isinstance(doc, dict)
        return {f.name: _coerce(doc.get(f.name), f, f.name, self.unit) for f in self.schema}
