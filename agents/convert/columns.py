"""The target columns: the types and icesink field metadata agents.convert can fill (the schema
checks), type predicates and names, a field's path, the epoch unit of its numbers. No I/O.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias, get_args

import pyarrow as pa

from agents.convert.grammar import UNIT_DIGITS
from icesink.shared.errors import UnsupportedTypeError


Path: TypeAlias = tuple[str, ...]


EpochUnit: TypeAlias = Literal["s", "ms", "us", "ns"]


#: Field metadata key: the unit of JSON numbers in a timestamp, time or date column.
EPOCH_UNIT: Final = "icesink.epoch-unit"


EPOCH_UNITS: Final[tuple[EpochUnit, ...]] = get_args(EpochUnit)


#: Field metadata key: ``connect-bytes`` for decimals sent as Kafka Connect Decimal bytes.
DECIMAL_ENCODING: Final = "icesink.decimal-encoding"


_CONNECT_BYTES: Final = "connect-bytes"


#: Field metadata key: ``numbers-first`` on a string field read as each value's JSON text (Cast's
#: fields, agents/transforms/cast.py): parsed as integers while the batch's values are all
#: integers (their digits are the text), as text otherwise; the same text either way.
JSON_TEXT: Final = "icesink.json-text"


NUMBERS_FIRST: Final = "numbers-first"


def unsupported(field: str, type_: pa.DataType) -> UnsupportedTypeError:
    """The target schema has a type that decode_json cannot fill from JSON."""
    return UnsupportedTypeError(
        field, type_, "decode_json cannot fill",
        "int8..int64, float32, float64, decimal128, string, large_string, bool, "
        "timestamp (no time zone or UTC), date32, time32, time64, binary, large_binary, "
        "fixed_size_binary, uuid, struct, list, large_list, map (keys of those scalar types)",
        "change the table schema or the record format",
    )


_UTC_NAMES: Final = frozenset({"UTC", "Etc/UTC", "+00:00", "Z"})


def is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def is_uuid(t: pa.DataType) -> bool:
    return isinstance(t, pa.BaseExtensionType) and t.extension_name == "arrow.uuid"


def is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


def is_temporal(t: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(t) or pa.types.is_date32(t) or pa.types.is_time(t))


def meta(f: pa.Field, key: str) -> str | None:
    value = (f.metadata or {}).get(key.encode())
    return None if value is None else value.decode()


def connect_bytes(f: pa.Field) -> bool:
    return pa.types.is_decimal(f.type) and meta(f, DECIMAL_ENCODING) == _CONNECT_BYTES


def numbers_first(f: pa.Field) -> bool:
    return is_string(f.type) and meta(f, JSON_TEXT) == NUMBERS_FIRST


def strict_text(f: pa.Field) -> bool:
    """Columns that take only JSON strings: a quoted number would mean something else there."""
    return is_binary(f.type) or is_uuid(f.type) or connect_bytes(f)


def epoch_digits(f: pa.Field, default: EpochUnit) -> int:
    """Decimal digits of the epoch unit of numbers in temporal field ``f``."""
    return UNIT_DIGITS[meta(f, EPOCH_UNIT) or default]


def int_bounds(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_signed_integer(t):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def type_name(t: pa.DataType) -> str:
    """Iceberg-style name of a column type, for reject reasons."""
    if pa.types.is_int32(t):
        return "int"
    if pa.types.is_int64(t):
        return "long"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision}, {t.scale})"
    if is_string(t):
        return "string"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_timestamp(t):
        name = "timestamptz" if t.tz is not None else "timestamp"
        return name if t.unit == "us" else f"{name}_{t.unit}"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_time(t):
        return "time" if t.unit == "us" else f"time_{t.unit}"
    if is_uuid(t):
        return "uuid"
    if pa.types.is_fixed_size_binary(t):
        return f"fixed[{t.byte_width}]"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_struct(t):
        return "struct"
    if is_list(t):
        return "list"
    if pa.types.is_map(t):
        return "map"
    return str(t)


def check_schema(schema: pa.Schema) -> None:
    """Raise :class:`UnsupportedTypeError` naming the field when ``decode_json`` cannot fill
    ``schema``: a type it has no conversion for, or unknown or misplaced icesink metadata."""
    check_supported(schema)


def has_map(schema: pa.Schema) -> bool:
    return any(holds_map(f.type) for f in schema)


def holds_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(holds_map(c.type) for c in t)
    return is_list(t) and holds_map(t.value_type)


def check_supported(schema: pa.Schema) -> None:
    def check(f: pa.Field, path: str) -> None:
        t = f.type
        _check_metadata(f, path)
        if pa.types.is_struct(t):
            for child in t:
                check(child, f"{path}.{child.name}")
        elif is_list(t):
            check(t.value_field, f"{path}[]")
        elif pa.types.is_map(t):
            key = t.key_type
            if pa.types.is_struct(key) or is_list(key) or pa.types.is_map(key):
                raise unsupported(f"{path}.key", key)  # JSON object keys are text
            check(t.key_field, f"{path}.key")
            check(t.item_field, f"{path}.value")
        elif pa.types.is_timestamp(t):
            if t.tz is not None and t.tz not in _UTC_NAMES:
                raise unsupported(path, t)
        elif not (
            pa.types.is_integer(t)
            or pa.types.is_float32(t)
            or pa.types.is_float64(t)
            or pa.types.is_decimal128(t)
            or is_string(t)
            or pa.types.is_boolean(t)
            or pa.types.is_date32(t)
            or pa.types.is_time(t)
            or is_binary(t)
            or is_uuid(t)
        ):
            raise unsupported(path, t)

    for f in schema:
        check(f, f.name)


def _check_metadata(f: pa.Field, path: str) -> None:
    unit = meta(f, EPOCH_UNIT)
    if unit is not None and (unit not in EPOCH_UNITS or not is_temporal(f.type)):
        raise UnsupportedTypeError(
            path, f.type, f"field metadata {EPOCH_UNIT}={unit!r} on",
            f"{', '.join(EPOCH_UNITS)} on a timestamp, date or time field",
            "fix the metadata the schema was built with",
        )
    encoding = meta(f, DECIMAL_ENCODING)
    if encoding is not None and (encoding != _CONNECT_BYTES or not pa.types.is_decimal(f.type)):
        raise UnsupportedTypeError(
            path, f.type, f"field metadata {DECIMAL_ENCODING}={encoding!r} on",
            f"{_CONNECT_BYTES} on a decimal field", "fix the metadata the schema was built with",
        )
    text = meta(f, JSON_TEXT)
    if text is not None and not numbers_first(f):
        raise UnsupportedTypeError(
            path, f.type, f"field metadata {JSON_TEXT}={text!r} on",
            f"{NUMBERS_FIRST} on a string field", "fix the metadata the schema was built with",
        )


def storage_field(f: pa.Field) -> pa.Field:
    t = f.type
    if isinstance(t, pa.BaseExtensionType):
        return f.with_type(t.storage_type)
    if pa.types.is_struct(t):
        return f.with_type(pa.struct([storage_field(c) for c in t]))
    if is_list(t):
        element = storage_field(t.value_field)
        return f.with_type(pa.large_list(element) if pa.types.is_large_list(t) else pa.list_(element))
    if pa.types.is_map(t):
        return f.with_type(pa.map_(storage_field(t.key_field), storage_field(t.item_field), t.keys_sorted))
    return f
