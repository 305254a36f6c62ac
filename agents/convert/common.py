"""Shared by every step of agents.convert: the outcome types (:class:`Reject`, :class:`Converted`),
constants, the grammars (one text for Python's ``re`` and RE2), schema checks and small Arrow
helpers. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Context
from typing import Final, Literal, TypeAlias, get_args

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from icesink.errors import UnsupportedTypeError


Mask: TypeAlias = npt.NDArray[np.bool_]


Path: TypeAlias = tuple[str, ...]


EpochUnit: TypeAlias = Literal["s", "ms", "us", "ns"]


#: Field metadata key: the unit of JSON numbers in a timestamp, time or date column.
EPOCH_UNIT: Final = "icesink.epoch-unit"


EPOCH_UNITS: Final[tuple[EpochUnit, ...]] = get_args(EpochUnit)


#: Field metadata key: ``connect-bytes`` for decimals sent as Kafka Connect Decimal bytes.
DECIMAL_ENCODING: Final = "icesink.decimal-encoding"


_CONNECT_BYTES: Final = "connect-bytes"


@dataclass(frozen=True)
class Reject:
    """A record that could not be converted. A data error: dead-letter it and keep going."""

    index: int  # position of the record in the input ``values``
    reason: str  # what was wrong, e.g. "cannot coerce 'abc' to long"
    field: str | None  # dotted path of the field at fault ("customer.address.zip", "items[2].qty")


@dataclass(frozen=True)
class Converted:
    """The outcome of one batch: the good records, in input order, and the rejects."""

    table: pa.Table  # the good records, in input order
    indices: pa.Array  # int64: for each row of ``table``, its index in the input ``values``
    rejects: tuple[Reject, ...]  # sorted by index

    def validate(self) -> None:
        """Raise ``ValueError`` when the parts do not fit together (a bug, not a data error)."""
        if len(self.indices) != self.table.num_rows:
            raise ValueError(
                f"indices: expected one per table row ({self.table.num_rows}), found {len(self.indices)}"
            )
        if self.indices.type != pa.int64():
            raise ValueError(f"indices: expected int64, found {self.indices.type}")
        taken = set(self.indices.to_pylist())
        for reject in self.rejects:
            if reject.index in taken:
                raise ValueError(f"record {reject.index}: expected a row or a reject, found both")


def unsupported(field: str, type_: pa.DataType) -> UnsupportedTypeError:
    """The target schema has a type that decode_json cannot fill from JSON."""
    return UnsupportedTypeError(
        field, type_, "decode_json cannot fill",
        "int8..int64, float32, float64, decimal128, string, large_string, bool, "
        "timestamp (no time zone or UTC), date32, time32, time64, binary, large_binary, "
        "fixed_size_binary, uuid, struct, list, large_list, map (keys of those scalar types)",
        "change the table schema or the record format",
    )


PREFIX: Final = b'{"v":'


SEP: Final = b'}\n{"v":'


BOM: Final = b"\xef\xbb\xbf"


WRAP_OVERHEAD: Final = len(PREFIX) + 1  # the closing "}"


#: At most this many records go straight to the reference path instead of another bulk read
#: (a pyarrow read has a fixed overhead that a short run does not repay; see bench/README.md,
#: convert_bench).
SMALL_RUN: Final = 16


#: After this many failures in a row within ``DENSE_GAP`` records of each other, the next
#: ``DENSE_WINDOW`` records go to the reference path (pathological batches stay O(n)).
DENSE_LIMIT: Final = 3


DENSE_GAP: Final = 16


DENSE_WINDOW: Final = 256


MAX_SINGLE_BLOCK: Final = 2**31 - 2


#: The block a threaded read parses at a time (pyarrow's default). Inferring, pyarrow types
#: each block from that block alone and cannot carry a field that was null all through one
#: block into a later block where it is an object or an array (ArrowNotImplementedError "JSON
#: conversion to struct<...> is not supported"): an inferring read that fails so is read again
#: as one block (see :data:`INFER_FAILURES`). Tests make it small to cross blocks in small batches.
BLOCK_SIZE: Final = 1 << 20


#: What a failed inferring read raises: both send the scan to its fallbacks (one block, then
#: splitting at the row named or bisecting), never out of decode_json. A read against an
#: explicit schema fails only with ArrowInvalid; anything else there is a bug in the parse schema.
INFER_FAILURES: Final = (pa.ArrowInvalid, pa.ArrowNotImplementedError)


# Each grammar is written once: Python's ``re`` (per-record path) and RE2 (pyarrow.compute)
# read the same text.
#: JSON numbers and the numeric strings numeric columns accept ("42", "-3.5", "1e3", ".5").
_NUM_TEXT: Final = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"


_OFFSET_TEXT: Final = r"(Z|[+-][0-9]{2}(?::?[0-9]{2})?)"


#: ISO-8601 timestamps: "T" or space, optional fraction (up to ns), optional offset.
_TS_BASE: Final = (
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
)


_TS_TEXT: Final = _TS_BASE + _OFFSET_TEXT + "?"


_DATE_TEXT: Final = r"([0-9]{4})-([0-9]{2})-([0-9]{2})"


_TIME_TEXT: Final = r"(?P<h>[0-9]{2}):(?P<m>[0-9]{2}):(?P<s>[0-9]{2})(?:\.(?P<f>[0-9]{1,9}))?"


#: Standard base64 with padding (what Kafka Connect's JsonConverter writes for bytes).
_B64_TEXT: Final = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"


_UUID_TEXT: Final = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"


NUM_RE: Final = re.compile(_NUM_TEXT, re.ASCII)


TS_RE: Final = re.compile(_TS_TEXT, re.ASCII)


DATE_RE: Final = re.compile(_DATE_TEXT, re.ASCII)


TIME_RE: Final = re.compile(_TIME_TEXT, re.ASCII)


B64_RE: Final = re.compile(_B64_TEXT, re.ASCII)


UUID_RE: Final = re.compile(_UUID_TEXT, re.ASCII)


NUM_PATTERN: Final = f"^{_NUM_TEXT}$"


TS_PATTERN: Final = f"^{_TS_TEXT}$"


TS_OFFSET_PATTERN: Final = f"^{_TS_BASE}{_OFFSET_TEXT}$"


DATE_PATTERN: Final = f"^{_DATE_TEXT}$"


TIME_PATTERN: Final = f"^{_TIME_TEXT}$"


B64_PATTERN: Final = f"^{_B64_TEXT}$"


UUID_PATTERN: Final = f"^{_UUID_TEXT}$"


OFFSET_PATTERN: Final = f"{_OFFSET_TEXT}$"


#: Epoch counts the bulk path reads as int64 (the strict cast flags those beyond int64).
COUNT_PATTERN: Final = r"^-?[0-9]{1,19}$"


#: Integers written one way only (map keys in bulk cannot then collide: "1" and "01" can).
CANONICAL_INT_PATTERN: Final = r"^(?:0|-?[1-9][0-9]*)$"


#: Integers that always fit int64 and that Arrow's string->int cast reads exactly.
INT_PATTERN: Final = r"^-?[0-9]{1,18}$"


TS_FORMAT: Final = (
    "an ISO-8601 timestamp 'YYYY-MM-DD[T ]HH:MM:SS[.fffffffff][Z|+HH:MM]' or a count since the epoch"
)


TIME_FORMAT: Final = "'HH:MM:SS[.fffffffff]' or a count since midnight"


UNIT_DIGITS: Final = {"s": 0, "ms": 3, "us": 6, "ns": 9}


_UTC_NAMES: Final = frozenset({"UTC", "Etc/UTC", "+00:00", "Z"})


CONSTANTS: Final = frozenset({"NaN", "Infinity", "-Infinity"})


EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()


MIN_DAYS: Final = date(1, 1, 1).toordinal() - EPOCH_ORDINAL


MIN_SECONDS: Final = MIN_DAYS * 86_400


MAX_DAYS: Final = date(9999, 12, 31).toordinal() - EPOCH_ORDINAL


MAX_SECONDS: Final = (MAX_DAYS + 1) * 86_400 - 1


DAY_SECONDS: Final = 86_400


#: Decimal arithmetic that never rounds the values this module handles (at most ~80 digits).
EXACT: Final = Context(prec=100)


INT64: Final = (-(2**63), 2**63 - 1)


#: Wide decimal that integer columns fall back to when a value is not a plain integer token.
WIDE_INT: Final = pa.decimal128(38, 18)


KIND_ERROR: Final = re.compile(r"Column\((?P<path>.*)\) changed from (?P<old>\w+) to (?P<new>\w+)")


ROW: Final = re.compile(r" in row (\d+)\s*$")


NUMBER_OR_BOOL: Final = rb"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false)"


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


def strict_text(f: pa.Field) -> bool:
    """Columns that take only JSON strings: a quoted number would mean something else there."""
    return is_binary(f.type) or is_uuid(f.type) or connect_bytes(f)


def epoch_digits(f: pa.Field, default: EpochUnit) -> int:
    """Decimal digits of the epoch unit of numbers in temporal field ``f``."""
    return UNIT_DIGITS[meta(f, EPOCH_UNIT) or default]


def ts_bounds(digits: int) -> tuple[int, int]:
    """Counts of ``10**-digits`` s that are instants in 0001-01-01..9999-12-31 and fit int64."""
    scale = 10**digits
    return max(MIN_SECONDS * scale, INT64[0]), min((MAX_SECONDS + 1) * scale - 1, INT64[1])


def is_null_mask(arr: pa.Array) -> Mask | None:
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)


def false_mask(ok: pa.Array) -> Mask | None:
    """Rows where a boolean check is False (null means 'no value', not a failure)."""
    failed = pc.invert(ok).fill_null(False)
    if not pc.any(failed).as_py():
        return None
    return np.asarray(failed.to_numpy(zero_copy_only=False), dtype=np.bool_)


def or_mask(a: Mask | None, b: Mask | None) -> Mask | None:
    if a is None:
        return b
    if b is None:
        return a
    return a | b


def if_else(cond: pa.Array, a: pa.Array, b: pa.Array) -> pa.Array:
    """``pc.if_else`` for columns of any type: pyarrow has no kernel for extension types (uuid),
    at any depth, so those go through their storage type."""
    storage = storage_field(pa.field("x", a.type)).type
    if storage == a.type:
        return pc.if_else(cond, a, b)
    return pc.if_else(cond, a.cast(storage), b.cast(storage)).cast(a.type)


def struct_array(
    children: Sequence[pa.Array], t: pa.StructType, length: int, mask: pa.Array | None = None,
) -> pa.StructArray:
    """A struct array of ``length`` rows of type ``t`` from its ``children`` (``mask``: True
    where the struct itself is null). Every struct built from parts goes through here.

    ``pa.StructArray.from_arrays`` counts rows from the children, or the mask when there is
    one, so a ``struct<>`` (a JSON object that is always empty; a Debezium row image routing
    only needs to be there) without nulls came back with no rows and failed the whole batch."""
    if t.num_fields:
        if any(len(c) != length for c in children):
            raise ValueError(f"struct {t}: expected {length} rows in every child, found {[len(c) for c in children]}")
        return pa.StructArray.from_arrays(list(children), fields=list(t), mask=mask)
    if mask is not None and len(mask) != length:
        raise ValueError(f"struct {t}: expected a null mask of {length} rows, found {len(mask)}")
    valid = None if mask is None else ~np.asarray(mask.to_numpy(zero_copy_only=False), dtype=np.bool_)
    return pa.StructArray.from_buffers(t, length, [None if valid is None else validity(valid)], children=[])


def null_where(arr: pa.Array, bad: Mask | None) -> pa.Array:
    if bad is None:
        return arr
    return pc.if_else(pa.array(bad), pa.scalar(None, arr.type), arr)


def strict_cast(arr: pa.Array, to: pa.DataType) -> tuple[pa.Array, Mask | None]:
    """Cast; values the cast refuses (Feb 30, hour 24...) become null and are flagged."""
    try:
        return pc.cast(arr, to), None
    except pa.ArrowInvalid:
        if len(arr) == 1:
            return pa.nulls(1, to), np.ones(1, dtype=np.bool_)
    mid = len(arr) // 2
    left, left_bad = strict_cast(arr.slice(0, mid), to)
    right, right_bad = strict_cast(arr.slice(mid), to)
    bad = np.zeros(len(arr), dtype=np.bool_)
    if left_bad is not None:
        bad[:mid] = left_bad
    if right_bad is not None:
        bad[mid:] = right_bad
    return pa.concat_arrays([left, right]), bad


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


def validity(valid: Mask) -> pa.Buffer | None:
    """An Arrow validity bitmap for ``valid`` (None when every row is valid)."""
    return None if valid.all() else pa.array(valid).buffers()[1]


def utf8_reason(exc: UnicodeDecodeError) -> str:
    return f"malformed JSON: invalid UTF-8 at byte {exc.start} ({exc.reason})"


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
