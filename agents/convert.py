"""Kafka record values (schemaless JSON objects) -> one Arrow table, in bulk.

:func:`decode_json` turns a batch of record values into a :class:`pyarrow.Table` without building
a Python dict per record. Every record ends in exactly one of two places: a row of
``Converted.table`` (with its input position in ``Converted.indices``) or a :class:`Reject`
saying why not. A bad record never fails the batch and is never silently nulled.

How a batch is decoded
----------------------
1. **Wrap and join.** Each value is wrapped as ``{"v":<value>}`` and the batch joined with
   newlines into one buffer (one C-level join). The wrapper makes every record exactly one row:
   a value that is empty, ``null``, not an object or two objects back to back cannot shift the
   rows of its neighbours. Values with a newline or CR inside (pretty-printed JSON) switch the
   reader to ``newlines_in_values``. A UTF-8 BOM at the start of a value is dropped; invalid
   UTF-8 (which pyarrow.json does not check) is found up front and rejected.
2. **Parse in C++.** ``pyarrow.json.read_json`` parses the buffer against a *parse schema*
   derived from the target schema: the JSON kind pyarrow should expect for each field (integers
   as int64, timestamps and dates as strings, ...). Fields the target lacks are ignored.
3. **Convert, vectorised.** pyarrow.compute turns each parsed column into its target type
   (range checks, regex-validated string parsing, ISO-8601 timestamps with offsets, decimal
   scale and precision checks). Each step also yields a mask of rows it cannot convert exactly.
4. **Fall back per record, rarely.** Rows in such a mask, and records pyarrow refuses to parse,
   go to the per-record reference path (``_Oracle``, plain Python ``json``), which converts the
   record or returns the :class:`Reject`. The reference path defines the semantics; the bulk
   path only accepts what it converts to the same value.

When the bulk parse fails, the reader adapts instead of giving up: a column whose records carry
numeric strings is parsed as strings; a column that mixes kinds (``42`` and ``"42"``) is made
uniform by quoting its bare numbers and booleans in the raw bytes (harmless: every target type
accepts the quoted form with the same value); integer columns holding ``1.0`` or ``1e3`` are
parsed as wide decimals. A failure that adapting cannot cure and that names a row (bad syntax, a
string where an object belongs) splits the batch there: the rows before it are parsed in bulk,
the bad record goes to the reference path, and reading resumes after it. Failures without a row
are isolated by bisection.

Inference (``schema=None``) parses once with pyarrow's inference to find the schema, then decodes
the batch against that schema as above. Conflicting kinds are resolved in Python by merging the
types of the pieces a failing batch splits into. pyarrow infers each 1 MiB block of a threaded
read on its own, and fails a batch whose later block makes an object or array of a field that
was null all through an earlier one; such a read is done again as one block.

What each column type accepts
-----------------------------
- **timestamp / timestamptz**: ISO-8601 strings ``YYYY-MM-DD[T ]HH:MM:SS[.f{1,9}][Z|+HH[:MM]]``
  (an offset is honoured and the instant stored as UTC; a string without one is a wall time,
  taken as UTC in a timestamptz column), or an epoch count: a JSON number or a string of digits
  counting units since 1970-01-01T00:00:00Z. The unit is the field's metadata
  ``icesink.epoch-unit`` (``s``, ``ms``, ``us``, ``ns``), else ``decode_json``'s ``epoch_unit``
  (the setting ``iceberg.tables.timestamp-unit``, ``ms`` by default as in Kafka Connect). The
  unit is never guessed; a count whose instant falls outside 0001-01-01..9999-12-31 is a reject,
  so microseconds read as milliseconds (year 55000) are rejected, not stored.
- **date**: ``YYYY-MM-DD`` strings, or numbers of days since the epoch; with an
  ``icesink.epoch-unit`` on the field, numbers count that unit and must be whole days.
- **time**: ``HH:MM:SS[.f{1,9}]`` strings, or numbers counting the epoch unit since midnight
  (as for timestamps), within ``[00:00, 24:00)``.
- **Precision finer than the column's** (nanoseconds into a microsecond column, in a string's
  fraction or in a count) is truncated toward the past to the column's unit: the stored value
  is the last tick of the column's unit not after the input, as Iceberg's Java sink and Spark
  do. This is the only lossy step and it is exact; nothing is rounded up.
- **decimal(p, s)**: JSON numbers or numeric strings that need no rounding to scale ``s`` and
  have at most ``p - s`` integer digits. With the field metadata ``icesink.decimal-encoding`` =
  ``connect-bytes``: only base64 strings of the big-endian two's-complement unscaled integer
  (Kafka Connect Decimal).
- **binary / fixed[n]**: standard base64 strings with padding (fixed: exactly ``n`` bytes).
- **uuid**: canonical strings ``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (either case).
- **map<K, V>**: a JSON object; each key/value pair is one entry, in the object's order. The
  key's text is read as a JSON string would be in a column of type K (``"42"`` -> int 42;
  keys that cannot be read, or two keys giving the same value such as ``"1"`` and ``"01"``,
  reject the record); values are read as a column of type V would read them. A reject in a map
  names the entry: ``attrs.<key>`` (``attrs.<key>.n`` inside a struct value). An array of
  ``[key, value]`` pairs is read the same way (``[[1, "a"], [2, "b"]]``): Kafka Connect's
  JsonConverter writes maps whose keys are not strings so; keys there are strings, numbers or
  booleans, read as their JSON text would be.
- Anything else in such a column is a reject naming the field; never a null.

Maps in bulk
------------
pyarrow.json has no map type and keeps no raw JSON text, so for schemas with a map (and only
those) each record is first rewritten by ``_rewritten``: one C-level ``json.loads`` and
``json.dumps`` turns every map (object or pairs) into a list ``[{"k": key, "v": value}, ...]`` which the
reader parses as list<struct<k: string, v: V>> and step 3 turns into a map array. Non-integer
numbers (and a bare ``-0``) keep their exact text (a marker string, unquoted again after
dumping). Records the
rewrite cannot reproduce faithfully (malformed, duplicate keys, NaN, a ``\u0000`` escape, a
map in neither form) and rows with keys that could collide (integer keys not written
canonically, other non-string key types) go to the reference path.

Case-insensitive keys
---------------------
With ``fold_case`` (``iceberg.tables.schema-case-insensitive``) an object key fills the field
it names ignoring case, at every level (``{"Customer": {"ZIP": 1}}`` fills
``customer.zip``); if a record spells one field twice, the exact spelling wins unless it is
null, else the first non-null one. The reader matches keys exactly, so one inferring parse of
the batch (in C++) tells whether some key spells a field name in another case; only a batch
that has one is rewritten first, as maps are (the same per-record ``json.loads`` and
``json.dumps``; a schema with maps is folded in its rewrite), and the reference path folds
the parsed record the same way.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_FLOOR, Context, Decimal, InvalidOperation, localcontext
from functools import reduce
from typing import Final, Literal, TypeAlias, get_args

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from icesink.errors import UnsupportedTypeError

__all__ = [
    "DECIMAL_ENCODING",
    "EPOCH_UNIT",
    "EPOCH_UNITS",
    "Converted",
    "EpochUnit",
    "Reject",
    "check_schema",
    "decode_json",
    "infer_schema",
    "with_field_metadata",
]

Mask: TypeAlias = npt.NDArray[np.bool_]
Path: TypeAlias = tuple[str, ...]
EpochUnit: TypeAlias = Literal["s", "ms", "us", "ns"]

#: Field metadata key: the unit of JSON numbers in a timestamp, time or date column.
EPOCH_UNIT: Final = "icesink.epoch-unit"
EPOCH_UNITS: Final[tuple[EpochUnit, ...]] = get_args(EpochUnit)
#: Field metadata key: ``connect-bytes`` for decimals sent as Kafka Connect Decimal bytes.
DECIMAL_ENCODING: Final = "icesink.decimal-encoding"
_CONNECT_BYTES: Final = "connect-bytes"


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


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


def _unsupported(field: str, type_: pa.DataType) -> UnsupportedTypeError:
    """The target schema has a type that decode_json cannot fill from JSON."""
    return UnsupportedTypeError(
        field, type_, "decode_json cannot fill",
        "int8..int64, float32, float64, decimal128, string, large_string, bool, "
        "timestamp (no time zone or UTC), date32, time32, time64, binary, large_binary, "
        "fixed_size_binary, uuid, struct, list, large_list, map (keys of those scalar types)",
        "change the table schema or the record format",
    )


def decode_json(
    values: Sequence[bytes], schema: pa.Schema | None = None, *, epoch_unit: EpochUnit = "ms",
    fold_case: bool = False,
) -> Converted:
    """Decode schemaless JSON objects into one table.

    With ``schema`` (what ``schema_to_pyarrow`` gives for the target table) the table has exactly
    that schema, metadata included. Without it the schema is inferred from ``values`` (see
    :func:`infer_schema`). ``epoch_unit`` is the unit of JSON numbers in timestamp and time
    columns whose field has no ``icesink.epoch-unit`` metadata (see the module docstring).
    Raises :class:`UnsupportedTypeError` for a schema with a type this module cannot fill (a
    time zone other than UTC, map keys that are not scalars, ...) or a field with unknown
    icesink metadata; bad records never raise.

    ``fold_case`` (``iceberg.tables.schema-case-insensitive``): a JSON key fills the field of
    ``schema`` it names ignoring case, at every level (see "Case-insensitive keys" above).
    """
    if epoch_unit not in EPOCH_UNITS:
        raise ValueError(f"epoch_unit: expected one of {EPOCH_UNITS}, found {epoch_unit!r}")
    fold = fold_case and schema is not None and _holds_struct(pa.struct(list(schema)))
    if schema is not None:
        _check_supported(schema)
    if schema is not None and _has_map(schema):
        run, rejects = _prepare(_rewritten(values, schema, fold=fold))
    else:
        run, rejects = _prepare(values)
        if fold and run is not None and _miscased(run, values, schema):  # type: ignore[arg-type]
            run, rejects = _prepare(_rewritten(values, schema, fold=True))  # type: ignore[arg-type]
    if schema is None:
        schema = _infer(run, values)
    decoder = _Decoder(values, schema, rejects, epoch_unit, fold=fold)
    if run is not None:
        decoder.scan(run, 0, run.size, threaded=True)
    return decoder.result()


def infer_schema(values: Sequence[bytes], *, timestamp_fields: re.Pattern[str] | None = None) -> pa.Schema:
    """The schema ``decode_json(values)`` would produce (one parse, no conversion).

    JSON strings -> string (timestamp-looking ones too, kept verbatim); true/false -> bool;
    integers -> int64; other numbers, or integers mixed with them -> float64; objects -> struct;
    arrays -> list; null-only -> string; conflicting kinds -> string holding each value's JSON
    text. Every field is nullable; fields are in order of first appearance. Integers beyond
    int64 infer float64 (as pyarrow does); an object that is always empty infers ``struct<>``.

    ``timestamp_fields``: string and integer fields whose dotted path (``order.placed_at``;
    list elements as ``events[].at``) fully matches become ``timestamp[us]`` columns instead:
    ``timestamptz`` (UTC) when the field holds integers (epoch counts are instants) or when
    some string in ``values`` carries an offset or ``Z``, else ``timestamp`` (wall times).
    Values that then do not parse as timestamps are rejects when the batch is decoded.
    """
    run, _ = _prepare(values)
    schema = _infer(run, values)
    if timestamp_fields is None:
        return schema
    return _timestamp_columns(schema, values, timestamp_fields)


def with_field_metadata(schema: pa.Schema, metadata: dict[str, dict[str, str]]) -> pa.Schema:
    """``schema`` with metadata added to the fields at the given dotted paths (as for
    ``timestamp_fields``; ``a.b`` in structs, ``a[]`` for list elements). Raises ``KeyError``
    naming a path that is not a field of ``schema``."""
    if not metadata:
        return schema
    remaining = dict(metadata)

    def visit(f: pa.Field, name: str) -> pa.Field:
        t = f.type
        if pa.types.is_struct(t):
            t = pa.struct([visit(c, f"{name}.{c.name}") for c in t])
        elif _is_list(t):
            element = visit(t.value_field, f"{name}[]")
            t = pa.large_list(element) if pa.types.is_large_list(t) else pa.list_(element)
        elif pa.types.is_map(t):
            t = pa.map_(visit(t.key_field, f"{name}.key"), visit(t.item_field, f"{name}.value"), t.keys_sorted)
        out = f.with_type(t)
        extra = remaining.pop(name, None)
        if extra:
            out = out.with_metadata({**(f.metadata or {}), **{k.encode(): v.encode() for k, v in extra.items()}})
        return out

    out = pa.schema([visit(f, f.name) for f in schema], metadata=schema.metadata)
    if remaining:
        raise KeyError(f"not a field of the schema: {', '.join(sorted(remaining))}")
    return out


# --------------------------------------------------------------------------------------------
# Constants and small helpers
# --------------------------------------------------------------------------------------------

_PREFIX: Final = b'{"v":'
_SEP: Final = b'}\n{"v":'
_BOM: Final = b"\xef\xbb\xbf"
_WRAP_OVERHEAD: Final = len(_PREFIX) + 1  # the closing "}"

#: At most this many records go straight to the reference path instead of another bulk read
#: (a pyarrow read costs ~60-300 us of fixed overhead; the reference path ~5-15 us a record).
_SMALL_RUN: Final = 16
#: After this many failures in a row within ``_DENSE_GAP`` records of each other, the next
#: ``_DENSE_WINDOW`` records go to the reference path (pathological batches stay O(n)).
_DENSE_LIMIT: Final = 3
_DENSE_GAP: Final = 16
_DENSE_WINDOW: Final = 256
_MAX_SINGLE_BLOCK: Final = 2**31 - 2
#: The block a threaded read parses at a time (pyarrow's default). Inferring, pyarrow types
#: each block from that block alone and cannot carry a field that was null all through one
#: block into a later block where it is an object or an array (ArrowNotImplementedError "JSON
#: conversion to struct<...> is not supported"): an inferring read that fails so is read again
#: as one block (see :data:`_INFER_FAILURES`). Tests make it small to cross blocks in small batches.
_BLOCK_SIZE: Final = 1 << 20
#: What a failed inferring read raises: both send the scan to its fallbacks (one block, then
#: splitting at the row named or bisecting), never out of decode_json. A read against an
#: explicit schema fails only with ArrowInvalid; anything else there is a bug in the parse schema.
_INFER_FAILURES: Final = (pa.ArrowInvalid, pa.ArrowNotImplementedError)

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
_NUM_RE: Final = re.compile(_NUM_TEXT, re.ASCII)
_TS_RE: Final = re.compile(_TS_TEXT, re.ASCII)
_DATE_RE: Final = re.compile(_DATE_TEXT, re.ASCII)
_TIME_RE: Final = re.compile(_TIME_TEXT, re.ASCII)
_B64_RE: Final = re.compile(_B64_TEXT, re.ASCII)
_UUID_RE: Final = re.compile(_UUID_TEXT, re.ASCII)
_NUM_PATTERN: Final = f"^{_NUM_TEXT}$"
_TS_PATTERN: Final = f"^{_TS_TEXT}$"
_TS_OFFSET_PATTERN: Final = f"^{_TS_BASE}{_OFFSET_TEXT}$"
_DATE_PATTERN: Final = f"^{_DATE_TEXT}$"
_TIME_PATTERN: Final = f"^{_TIME_TEXT}$"
_B64_PATTERN: Final = f"^{_B64_TEXT}$"
_UUID_PATTERN: Final = f"^{_UUID_TEXT}$"
_OFFSET_PATTERN: Final = f"{_OFFSET_TEXT}$"
#: Epoch counts the bulk path reads as int64 (the strict cast flags those beyond int64).
_COUNT_PATTERN: Final = r"^-?[0-9]{1,19}$"
#: Integers written one way only (map keys in bulk cannot then collide: "1" and "01" can).
_CANONICAL_INT_PATTERN: Final = r"^(?:0|-?[1-9][0-9]*)$"
#: Integers that always fit int64 and that Arrow's string->int cast reads exactly.
_INT_PATTERN: Final = r"^-?[0-9]{1,18}$"
_TS_FORMAT: Final = (
    "an ISO-8601 timestamp 'YYYY-MM-DD[T ]HH:MM:SS[.fffffffff][Z|+HH:MM]' or a count since the epoch"
)
_TIME_FORMAT: Final = "'HH:MM:SS[.fffffffff]' or a count since midnight"
_UNIT_DIGITS: Final = {"s": 0, "ms": 3, "us": 6, "ns": 9}
_UTC_NAMES: Final = frozenset({"UTC", "Etc/UTC", "+00:00", "Z"})
_CONSTANTS: Final = frozenset({"NaN", "Infinity", "-Infinity"})
_EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()
_MIN_DAYS: Final = date(1, 1, 1).toordinal() - _EPOCH_ORDINAL
_MIN_SECONDS: Final = _MIN_DAYS * 86_400
_MAX_DAYS: Final = date(9999, 12, 31).toordinal() - _EPOCH_ORDINAL
_MAX_SECONDS: Final = (_MAX_DAYS + 1) * 86_400 - 1
_DAY_SECONDS: Final = 86_400
#: Decimal arithmetic that never rounds the values this module handles (at most ~80 digits).
_EXACT: Final = Context(prec=100)
_INT64: Final = (-(2**63), 2**63 - 1)
#: Wide decimal that integer columns fall back to when a value is not a plain integer token.
_WIDE_INT: Final = pa.decimal128(38, 18)

_KIND_ERROR: Final = re.compile(r"Column\((?P<path>.*)\) changed from (?P<old>\w+) to (?P<new>\w+)")
_ROW: Final = re.compile(r" in row (\d+)\s*$")
_NUMBER_OR_BOOL: Final = rb"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false)"


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _is_uuid(t: pa.DataType) -> bool:
    return isinstance(t, pa.BaseExtensionType) and t.extension_name == "arrow.uuid"


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


def _is_temporal(t: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(t) or pa.types.is_date32(t) or pa.types.is_time(t))


def _meta(f: pa.Field, key: str) -> str | None:
    value = (f.metadata or {}).get(key.encode())
    return None if value is None else value.decode()


def _connect_bytes(f: pa.Field) -> bool:
    return pa.types.is_decimal(f.type) and _meta(f, DECIMAL_ENCODING) == _CONNECT_BYTES


def _strict_text(f: pa.Field) -> bool:
    """Columns that take only JSON strings: a quoted number would mean something else there."""
    return _is_binary(f.type) or _is_uuid(f.type) or _connect_bytes(f)


def _unit_digits(f: pa.Field, default: EpochUnit) -> int:
    """Decimal digits of the epoch unit of numbers in temporal field ``f``."""
    return _UNIT_DIGITS[_meta(f, EPOCH_UNIT) or default]


def _ts_bounds(digits: int) -> tuple[int, int]:
    """Counts of ``10**-digits`` s that are instants in 0001-01-01..9999-12-31 and fit int64."""
    scale = 10**digits
    return max(_MIN_SECONDS * scale, _INT64[0]), min((_MAX_SECONDS + 1) * scale - 1, _INT64[1])


def _is_null_mask(arr: pa.Array) -> Mask | None:
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)


def _false_mask(ok: pa.Array) -> Mask | None:
    """Rows where a boolean check is False (null means 'no value', not a failure)."""
    failed = pc.invert(ok).fill_null(False)
    if not pc.any(failed).as_py():
        return None
    return np.asarray(failed.to_numpy(zero_copy_only=False), dtype=np.bool_)


def _or(a: Mask | None, b: Mask | None) -> Mask | None:
    if a is None:
        return b
    if b is None:
        return a
    return a | b


def if_else(cond: pa.Array, a: pa.Array, b: pa.Array) -> pa.Array:
    """``pc.if_else`` for columns of any type: pyarrow has no kernel for extension types (uuid),
    at any depth, so those go through their storage type."""
    storage = _storage_field(pa.field("x", a.type)).type
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
    return pa.StructArray.from_buffers(t, length, [None if valid is None else _validity(valid)], children=[])


def _null_where(arr: pa.Array, bad: Mask | None) -> pa.Array:
    if bad is None:
        return arr
    return pc.if_else(pa.array(bad), pa.scalar(None, arr.type), arr)


def _strict_cast(arr: pa.Array, to: pa.DataType) -> tuple[pa.Array, Mask | None]:
    """Cast; values the cast refuses (Feb 30, hour 24...) become null and are flagged."""
    try:
        return pc.cast(arr, to), None
    except pa.ArrowInvalid:
        if len(arr) == 1:
            return pa.nulls(1, to), np.ones(1, dtype=np.bool_)
    mid = len(arr) // 2
    left, left_bad = _strict_cast(arr.slice(0, mid), to)
    right, right_bad = _strict_cast(arr.slice(mid), to)
    bad = np.zeros(len(arr), dtype=np.bool_)
    if left_bad is not None:
        bad[:mid] = left_bad
    if right_bad is not None:
        bad[mid:] = right_bad
    return pa.concat_arrays([left, right]), bad


def _int_bounds(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_signed_integer(t):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def _type_name(t: pa.DataType) -> str:
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
    if _is_string(t):
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
    if _is_uuid(t):
        return "uuid"
    if pa.types.is_fixed_size_binary(t):
        return f"fixed[{t.byte_width}]"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_struct(t):
        return "struct"
    if _is_list(t):
        return "list"
    if pa.types.is_map(t):
        return "map"
    return str(t)


def check_schema(schema: pa.Schema) -> None:
    """Raise :class:`UnsupportedTypeError` naming the field when ``decode_json`` cannot fill
    ``schema``: a type it has no conversion for, or unknown or misplaced icesink metadata."""
    _check_supported(schema)


def _has_map(schema: pa.Schema) -> bool:
    return any(_holds_map(f.type) for f in schema)


def _holds_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_holds_map(c.type) for c in t)
    return _is_list(t) and _holds_map(t.value_type)


def _check_supported(schema: pa.Schema) -> None:
    def check(f: pa.Field, path: str) -> None:
        t = f.type
        _check_metadata(f, path)
        if pa.types.is_struct(t):
            for child in t:
                check(child, f"{path}.{child.name}")
        elif _is_list(t):
            check(t.value_field, f"{path}[]")
        elif pa.types.is_map(t):
            key = t.key_type
            if pa.types.is_struct(key) or _is_list(key) or pa.types.is_map(key):
                raise _unsupported(f"{path}.key", key)  # JSON object keys are text
            check(t.key_field, f"{path}.key")
            check(t.item_field, f"{path}.value")
        elif pa.types.is_timestamp(t):
            if t.tz is not None and t.tz not in _UTC_NAMES:
                raise _unsupported(path, t)
        elif not (
            pa.types.is_integer(t)
            or pa.types.is_float32(t)
            or pa.types.is_float64(t)
            or pa.types.is_decimal128(t)
            or _is_string(t)
            or pa.types.is_boolean(t)
            or pa.types.is_date32(t)
            or pa.types.is_time(t)
            or _is_binary(t)
            or _is_uuid(t)
        ):
            raise _unsupported(path, t)

    for f in schema:
        check(f, f.name)


def _check_metadata(f: pa.Field, path: str) -> None:
    unit = _meta(f, EPOCH_UNIT)
    if unit is not None and (unit not in EPOCH_UNITS or not _is_temporal(f.type)):
        raise UnsupportedTypeError(
            path, f.type, f"field metadata {EPOCH_UNIT}={unit!r} on",
            f"{', '.join(EPOCH_UNITS)} on a timestamp, date or time field",
            "fix the metadata the schema was built with",
        )
    encoding = _meta(f, DECIMAL_ENCODING)
    if encoding is not None and (encoding != _CONNECT_BYTES or not pa.types.is_decimal(f.type)):
        raise UnsupportedTypeError(
            path, f.type, f"field metadata {DECIMAL_ENCODING}={encoding!r} on",
            f"{_CONNECT_BYTES} on a decimal field", "fix the metadata the schema was built with",
        )


# --------------------------------------------------------------------------------------------
# Step 1: the wrapped buffer
# --------------------------------------------------------------------------------------------


def _wrap(parts: list[bytes]) -> bytes:
    """``{"v":a}\\n{"v":b}...`` in one join (``parts`` is modified)."""
    if len(parts) == 1:
        return _PREFIX + parts[0] + b"}"
    parts[0] = _PREFIX + parts[0]
    parts[-1] = parts[-1] + b"}"
    return _SEP.join(parts)


def _utf8_ok(buf: bytes) -> bool:
    offsets = np.array([0, len(buf)], dtype=np.int64)
    arr = pa.Array.from_buffers(
        pa.large_string(), 1, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(buf)]
    )
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


@dataclass(frozen=True)
class _Run:
    """Records as one wrapped buffer: record ``k`` is ``buf[starts[k] : starts[k + 1] - 1]``."""

    buf: bytes
    starts: npt.NDArray[np.int64]  # len size + 1; starts[size] == len(buf) + 1
    positions: npt.NDArray[np.int64]  # input index of each record
    multiline: bool  # some value holds a newline or CR: the reader must not split on them
    keys: frozenset[str] = frozenset()  # keys whose bare numbers and booleans are quoted

    @property
    def size(self) -> int:
        return len(self.positions)

    def view(self, lo: int, hi: int) -> pa.Buffer:
        start = int(self.starts[lo])
        return pa.py_buffer(self.buf).slice(start, int(self.starts[hi]) - 1 - start)

    def quoted(self, lo: int, hi: int, keys: frozenset[str]) -> _Run:
        """Records ``[lo, hi)`` with bare numbers and booleans of ``keys`` quoted as strings.

        ``"k": 42`` becomes ``"k": "42"`` wherever key ``k`` appears. Only whole values followed
        by ``,`` or ``}`` are touched, so valid JSON stays valid and means the same to every
        target type (each accepts the quoted form with the same value).
        """
        names = b"|".join(re.escape(k.encode()) for k in sorted(keys))
        pattern = re.compile(rb'("(?:' + names + rb')"\s*:\s*)' + _NUMBER_OR_BOOL + rb"(?=\s*[,}])")

        def quote(text: bytes) -> bytes:
            pieces = pattern.split(text)  # text, key, value, text, key, value, ..., text
            pieces[2::3] = [b'"' + value + b'"' for value in pieces[2::3]]
            return b"".join(pieces)

        if not self.multiline:
            buf = quote(self.view(lo, hi).to_pybytes())
            newlines = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 0x0A)
            starts = np.concatenate(([0], newlines + 1, [len(buf) + 1])).astype(np.int64)
            return _Run(buf, starts, self.positions[lo:hi], False, keys)
        whole = self.buf
        parts = [
            quote(whole[int(self.starts[k]) + len(_PREFIX) : int(self.starts[k + 1]) - 2])
            for k in range(lo, hi)
        ]
        return _Run(_wrap(list(parts)), _starts(parts), self.positions[lo:hi], True, keys)


_ENTRY_KEY: Final = "k"
_ENTRY_VALUE: Final = "v"
#: A JSON number kept as text through ``json.loads``/``json.dumps``: a string marked with NUL.
_MARK: Final = "\x00"
_MARKED: Final = re.compile(r'"\\u0000([^"]*)"')


def _mark_number(text: str) -> str:
    return _MARK + text


def _no_constant(text: str) -> object:
    raise ValueError(f"constant {text}")  # NaN, Infinity: the reference path decides


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key")  # the reference path names it
    return out


def _int_keeping_minus_zero(text: str) -> object:
    return _MARK + text if text == "-0" else int(text)  # -0 is not 0 for a float or string column


_ENTRIES_DECODER: Final = json.JSONDecoder(
    parse_float=_mark_number, parse_constant=_no_constant, object_pairs_hook=_unique
)
#: For records that may hold a bare ``-0`` (rare): json.loads would read it as the int 0.
_MINUS_ZERO_DECODER: Final = json.JSONDecoder(
    parse_float=_mark_number, parse_int=_int_keeping_minus_zero, parse_constant=_no_constant,
    object_pairs_hook=_unique,
)
_MINUS_ZERO: Final = re.compile(rb"[:\[,]\s*-0\s*[,\]}]")
_ENTRIES_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)
_Rewrite: TypeAlias = Callable[[object], object]


def _rewritten(values: Sequence[bytes], schema: pa.Schema, *, fold: bool) -> list[bytes]:
    """``values`` as the bulk reader can parse them for ``schema``: every map (a JSON object or
    an array of ``[key, value]`` pairs) as a list of entries ``[{"k": key text, "v": value},
    ...]`` in its order, and with ``fold`` every object key that names a field in another case
    spelt as the field is.

    pyarrow.json has no map type, keeps no JSON text and matches keys exactly, so this is one
    C-level ``json.loads``/``json.dumps`` per record (non-integer numbers keep their exact text
    through a marker). A record this cannot rewrite faithfully (malformed JSON, a duplicate key,
    a NUL escape, NaN, a map that is neither form) becomes ``null``, which sends it to the
    reference path with its original bytes; tombstones stay as they are."""
    rewrite = _rewriter(pa.struct(list(schema)), entries=True, fold=fold)
    decode, careful, encode = _ENTRIES_DECODER.decode, _MINUS_ZERO_DECODER.decode, _ENTRIES_ENCODER.encode
    out: list[bytes] = []
    for value in values:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            out.append(value)
            continue
        raw = bytes(value)
        if raw[:3] == _BOM:
            raw = raw[3:]
        try:
            if b"\\u0000" in raw:
                raise ValueError("NUL escape")  # the number marker would be ambiguous
            minus_zero = b"-0" in raw and _MINUS_ZERO.search(raw) is not None
            doc = (careful if minus_zero else decode)(raw.decode("utf-8"))
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            text = encode(rewrite(doc))
            if "\\u0000" in text:
                text = _MARKED.sub(r"\1", text)
            out.append(text.encode("utf-8"))
        except (ValueError, UnicodeError, RecursionError):
            out.append(b"null")
    return out


def _holds_struct(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return True
    if pa.types.is_map(t):
        return _holds_struct(t.item_type)
    return _is_list(t) and _holds_struct(t.value_type)


def _map_items(v: object) -> list[tuple[object, object]] | None:
    """The entries of a JSON map: an object, or an array of ``[key, value]`` pairs (what Kafka
    Connect's JsonConverter writes for maps whose keys are not strings); None for other kinds."""
    if isinstance(v, dict):
        return list(v.items())
    if isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
        return [(p[0], p[1]) for p in v]
    return None


def _key_text(k: object) -> str:
    """A map key parsed by ``_ENTRIES_DECODER`` as the text the reader's key column holds."""
    if isinstance(k, str):
        return k[1:] if k[:1] == _MARK else k  # a marked non-integer number: its text
    if isinstance(k, bool):
        return "true" if k else "false"
    if isinstance(k, int):
        return str(k)  # (-0 came marked, as its text)
    raise ValueError("a map key that is not a scalar")  # the reference path names it


def _rewriter(t: pa.DataType, *, entries: bool, fold: bool) -> _Rewrite:
    """A function rewriting parsed JSON of type ``t`` in place where it can: with ``entries``
    maps become entry lists (ValueError for a map in neither JSON form), with ``fold`` object
    keys naming a field in another case are renamed to the field. Kinds that do not fit ``t``
    are left for the reader or the reference path to refuse."""

    def needed(c: pa.DataType) -> bool:
        return (entries and _holds_map(c)) or (fold and _holds_struct(c))

    if pa.types.is_map(t):
        item = _rewriter(t.item_type, entries=entries, fold=fold) if needed(t.item_type) else None

        def map_(v: object) -> object:
            if v is None:
                return None
            items = _map_items(v)
            if items is None:
                if entries:
                    raise ValueError("a map that is neither an object nor an array of pairs")
                return v
            if entries:
                out = [{_ENTRY_KEY: _key_text(k), _ENTRY_VALUE: item(x) if item else x} for k, x in items]
                if isinstance(v, list) and len({e[_ENTRY_KEY] for e in out}) != len(out):
                    raise ValueError("a key twice")  # the reference path names it (objects: _unique)
                return out
            if item is None:
                return v
            if isinstance(v, dict):
                return {k: item(x) for k, x in items}
            return [[k, item(x)] for k, x in items]

        return map_
    if _is_list(t):
        element = _rewriter(t.value_type, entries=entries, fold=fold)
        return lambda v: [element(x) for x in v] if isinstance(v, list) else v
    children = [(c.name, _rewriter(c.type, entries=entries, fold=fold)) for c in t if needed(c.type)]
    names = frozenset(c.name for c in t)
    canon = {c.name.lower(): c.name for c in reversed(list(t))} if fold else {}

    def struct_(v: object) -> object:
        if isinstance(v, dict):
            if canon:
                v = _fold_keys(v, names, canon)
            for name, rewrite in children:
                if name in v:
                    v[name] = rewrite(v[name])
        return v

    return struct_


def _fold_keys(v: dict[str, object], names: frozenset[str], canon: dict[str, str]) -> dict[str, object]:
    """``v`` with keys that name a field of ``names`` in another case renamed to it. Two
    spellings of one field: the exact one wins unless null, else the first non-null."""
    if all(k in names or k.lower() not in canon for k in v):
        return v
    out: dict[str, object] = {}
    for k, x in v.items():
        target = k if k in names else canon.get(k.lower(), k)
        if target not in out or out[target] is None or (k == target and x is not None):
            out[target] = x
    return out


def _miscased(run: _Run, values: Sequence[bytes], schema: pa.Schema) -> bool:
    """Whether some record of ``run`` may spell a field of ``schema`` in another case: one
    inferring parse (fast, in C++) tells the keys at every level."""
    return _miscased_type(pa.struct(list(schema)), _Inference(values).scan(run, 0, run.size, threaded=True))


def _miscased_type(t: pa.DataType, seen: pa.DataType) -> bool:
    """Whether JSON of inferred type ``seen`` may hold an object key naming a field of ``t`` in
    another case. True when inference cannot tell: kinds that conflicted (inferred as
    string) where ``t`` has fields, or a map written as pairs; a false positive only costs
    the rewrite."""
    if pa.types.is_null(seen) or not _holds_struct(t):
        return False
    if pa.types.is_struct(t):
        if not pa.types.is_struct(seen):
            return _is_string(seen)
        exact = {c.name: c.type for c in t}
        lower = {c.name.lower() for c in t}
        return any(
            s.name.lower() in lower if s.name not in exact else _miscased_type(exact[s.name], s.type) for s in seen
        )
    if _is_list(t):
        return _miscased_type(t.value_type, seen.value_type) if _is_list(seen) else _is_string(seen)
    if pa.types.is_struct(seen):  # a map written as an object: its keys are data
        return any(_miscased_type(t.item_type, s.type) for s in seen)
    return True


def _starts(parts: list[bytes]) -> npt.NDArray[np.int64]:
    """Where each wrapped part starts in ``_wrap(parts)`` (and one past the end)."""
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    starts = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths + _WRAP_OVERHEAD + 1, out=starts[1:])
    return starts


def _prepare(values: Sequence[bytes]) -> tuple[_Run | None, list[Reject]]:
    """The wrapped buffer of every value worth parsing, and the values rejected up front."""
    parts = list(values)
    rejects: list[Reject] = []
    positions = np.arange(len(parts), dtype=np.int64)
    if not parts:
        return None, rejects
    try:
        buf = _wrap(list(parts))
    except TypeError:  # None (a tombstone) or another non-bytes value
        keep: list[int] = []
        for i, value in enumerate(parts):
            if isinstance(value, (bytes, bytearray, memoryview)):
                keep.append(i)
            else:
                found = "null (a tombstone)" if value is None else type(value).__name__
                rejects.append(Reject(i, f"not a JSON object: the record value is {found}", None))
        positions = np.array(keep, dtype=np.int64)
        parts = [bytes(parts[i]) for i in keep]
        if not parts:
            return None, rejects
        buf = _wrap(list(parts))
    if _BOM[:1] in buf and _PREFIX + _BOM in buf:  # memchr first: most batches are ASCII
        parts = [p[3:] if p[:3] == _BOM else p for p in parts]
        buf = _wrap(list(parts))
    if not _utf8_ok(buf):
        keep_mask = np.ones(len(parts), dtype=np.bool_)
        for k, part in enumerate(parts):
            try:
                part.decode("utf-8")
            except UnicodeDecodeError as exc:
                keep_mask[k] = False
                rejects.append(Reject(int(positions[k]), _utf8_reason(exc), None))
        parts = [p for p, keep_it in zip(parts, keep_mask, strict=True) if keep_it]
        positions = positions[keep_mask]
        if not parts:
            return None, rejects
        buf = _wrap(list(parts))
    newlines = int(np.count_nonzero(np.frombuffer(buf, dtype=np.uint8) == 0x0A))
    multiline = newlines != len(parts) - 1 or b"\r" in buf
    return _Run(buf, _starts(parts), positions, multiline), rejects


def _read(data: pa.Buffer, schema: pa.Schema | None, multiline: bool, single: bool) -> pa.Table:
    """One pyarrow.json read. ``single``: one block, no threads, so errors name the row."""
    if schema is None:
        parse = pj.ParseOptions(newlines_in_values=multiline)
    else:
        parse = pj.ParseOptions(
            explicit_schema=schema, newlines_in_values=multiline, unexpected_field_behavior="ignore"
        )
    if single:
        read = pj.ReadOptions(use_threads=False, block_size=max(data.size + 1, 1 << 16))
    else:
        read = pj.ReadOptions(use_threads=True, block_size=_BLOCK_SIZE)
    return pj.read_json(pa.BufferReader(data), read_options=read, parse_options=parse)


def _error_row(message: str) -> int | None:
    match = _ROW.search(message)
    return int(match.group(1)) if match else None


class _Pacer:
    """Notices failures that come thick and fast, so a scan can switch to per-record work."""

    def __init__(self) -> None:
        self.dense = 0

    def failed_at(self, row: int) -> bool:
        """Record a failure ``row`` records into the current read; True when it is time to stop."""
        self.dense = self.dense + 1 if row < _DENSE_GAP else 0
        if self.dense >= _DENSE_LIMIT:
            self.dense = 0
            return True
        return False


# --------------------------------------------------------------------------------------------
# Step 2: parse schemas and how they adapt
# --------------------------------------------------------------------------------------------


def _default_parse_type(f: pa.Field) -> pa.DataType:
    t = f.type
    if _connect_bytes(f):
        return pa.string()
    if pa.types.is_integer(t):
        return pa.int64()
    if pa.types.is_floating(t):
        return pa.float64()
    if pa.types.is_decimal(t):
        # Wider than the column, so too many decimals or digits show up as a row mask later
        # instead of failing the whole read.
        scale = max(t.scale, min(18, 37 - (t.precision - t.scale)))
        return pa.decimal128(38, scale)
    if pa.types.is_large_string(t):
        return pa.large_string()
    if pa.types.is_boolean(t):
        return pa.bool_()
    return pa.string()  # string, timestamp, date, time, binary, uuid (temporal ones adapt)


def _leaves(t: pa.DataType, path: Path = ()) -> Iterator[tuple[Path, pa.Field]]:
    """The leaf fields of struct/list type ``t`` with their paths (``[]`` for list elements)."""
    children = list(t) if pa.types.is_struct(t) else [t.value_field]
    for child in children:
        child_path = (*path, child.name if pa.types.is_struct(t) else "[]")
        if pa.types.is_struct(child.type) or _is_list(child.type):
            yield from _leaves(child.type, child_path)
        else:
            yield child_path, child


def _leaf_at(t: pa.DataType, path: Path) -> pa.Field | None:
    f: pa.Field | None = None
    for part in path:
        if pa.types.is_struct(t):
            index = t.get_field_index(part)
            if index < 0:
                return None
            f = t.field(index)
        elif _is_list(t) and part == "[]":
            f = t.value_field
        else:
            return None
        t = f.type
    if f is None or pa.types.is_struct(t) or _is_list(t):
        return None
    return f


def _parse_form(f: pa.Field) -> pa.Field:
    """``f`` as the bulk reader parses it: maps as lists of ``{"k": key text, "v": value}``."""
    t = f.type
    if pa.types.is_struct(t):
        return f.with_type(pa.struct([_parse_form(c) for c in t]))
    if _is_list(t):
        return f.with_type(pa.list_(_parse_form(t.value_field)))
    if pa.types.is_map(t):
        key = pa.field(_ENTRY_KEY, pa.string(), nullable=False)
        return f.with_type(pa.list_(pa.struct([key, _parse_form(t.item_field.with_name(_ENTRY_VALUE))])))
    return f


@dataclass(frozen=True)
class _Plan:
    """How to parse: a JSON parse type per leaf (default or adapted), keys whose values are quoted."""

    target: pa.StructType
    overrides: tuple[tuple[Path, pa.DataType], ...] = ()
    quoted: frozenset[str] = frozenset()

    def parse_type(self, path: Path, leaf: pa.Field) -> pa.DataType:
        for p, t in self.overrides:
            if p == path:
                return t
        return _default_parse_type(leaf)

    def schema(self) -> pa.Schema:
        def build(f: pa.Field, path: Path) -> pa.DataType:
            t = f.type
            if pa.types.is_struct(t):
                return pa.struct([pa.field(c.name, build(c, (*path, c.name))) for c in t])
            if _is_list(t):
                return pa.list_(build(t.value_field, (*path, "[]")))
            return self.parse_type(path, f)

        return pa.schema([pa.field("v", build(pa.field("v", self.target), ()))])

    def _with(self, changes: dict[Path, pa.DataType], quote: frozenset[str] = frozenset()) -> _Plan:
        kept = tuple((p, t) for p, t in self.overrides if p not in changes)
        return _Plan(self.target, kept + tuple(changes.items()), self.quoted | quote)

    def adapt(self, message: str) -> _Plan | None:
        """A plan that avoids the failure in ``message``, or None when none does."""
        kind = _KIND_ERROR.search(message)
        if kind is not None:
            return self._adapt_kind(kind.group("path"), kind.group("new"))
        if "Failed to convert JSON to int64" in message:
            wide = {
                p: _WIDE_INT
                for p, f in _leaves(self.target)
                if (pa.types.is_integer(f.type) or _is_temporal(f.type)) and self.parse_type(p, f) == pa.int64()
            }
            return self._with(wide) if wide else None
        if "decimal" in message:
            # A numeric column parsed as a decimal met a value the decimal cannot hold: parse
            # those columns as (quoted) strings; the string path flags the rows instead.
            paths = [p for p, f in _leaves(self.target) if pa.types.is_decimal(self.parse_type(p, f))]
            if not paths:
                return None
            keys = frozenset(p[-1] for p in paths if p[-1] != "[]" and self._quotable(p[-1]))
            return self._with({p: pa.string() for p in paths}, keys)
        return None

    def _quotable(self, key: str) -> bool:
        """Whether quoting bare numbers of ``key`` keeps their meaning in every column so named."""
        return not any(p[-1] == key and _strict_text(f) for p, f in _leaves(self.target))

    def _adapt_kind(self, arrow_path: str, found: str) -> _Plan | None:
        parts = arrow_path.split("/")
        if parts[:2] != ["", "v"] or len(parts) < 3:
            return None
        path = tuple(parts[2:])
        leaf = _leaf_at(self.target, path)
        if leaf is None:
            return None
        current = self.parse_type(path, leaf)
        t = leaf.type
        if found == "string" and not _is_string(current) and not pa.types.is_decimal(current):
            if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or _is_temporal(t):
                return self._with({path: pa.string()})
            return None
        if found == "number" and _is_temporal(t) and _is_string(current) and path not in dict(self.overrides):
            return self._with({path: pa.int64()})  # epoch counts: parse them as numbers
        if found in ("number", "boolean") and _is_string(current):
            key = path[-1]
            if key == "[]" or key in self.quoted or not self._quotable(key):
                return None
            return self._with({}, frozenset({key}))
        return None


# --------------------------------------------------------------------------------------------
# Step 3: vectorised conversion of parsed columns
# --------------------------------------------------------------------------------------------


def _convert_children(
    arr: pa.StructArray, fields: Sequence[pa.Field], unit: EpochUnit
) -> tuple[list[pa.Array], Mask | None]:
    """Children of a parsed struct converted to ``fields``; bad = rows to re-check per record.
    ``unit``: the epoch unit of temporal fields without their own."""
    valid: Mask | None = None
    if arr.null_count:
        valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    out: list[pa.Array] = []
    bad: Mask | None = None
    for i, f in enumerate(fields):
        child = pc.struct_field(arr, [i])  # applies the parent's nulls
        converted, child_bad = _convert(child, f, unit)
        if not f.nullable:
            missing = _is_null_mask(converted)
            if missing is not None and valid is not None:
                missing = missing & valid
            child_bad = _or(child_bad, missing)
        out.append(converted)
        bad = _or(bad, child_bad)
    return out, bad


def _convert(arr: pa.Array, f: pa.Field, unit: EpochUnit) -> tuple[pa.Array, Mask | None]:
    """One parsed column -> field ``f``'s type. Rows that are not certainly right are flagged."""
    t = f.type
    if pa.types.is_struct(t):
        children, bad = _convert_children(arr, list(t), unit)
        mask = arr.is_null() if arr.null_count else None
        if mask is not None:  # required children are null under null parents
            children = [c if f.nullable else _unmasked(c) for c, f in zip(children, t, strict=True)]
        return struct_array(children, t, len(arr), mask), bad
    if _is_list(t):
        return _convert_list(arr, t, unit)
    if pa.types.is_map(t):
        return _convert_map(arr, t, unit)
    if pa.types.is_integer(t):
        return _to_integer(arr, t)
    if pa.types.is_floating(t):
        return _to_float(arr, t)
    if _connect_bytes(f):
        return _to_connect_decimal(arr, t)
    if pa.types.is_decimal(t):
        return _to_decimal(arr, t)
    if _is_string(t):
        return pc.cast(arr, t), None
    if pa.types.is_boolean(t):
        return _to_bool(arr)
    if pa.types.is_timestamp(t):
        return _to_timestamp(arr, t, _unit_digits(f, unit))
    if pa.types.is_date32(t):
        unit_meta = _meta(f, EPOCH_UNIT)
        return _to_date(arr, None if unit_meta is None else _UNIT_DIGITS[unit_meta])
    if pa.types.is_time(t):
        return _to_time(arr, t, _unit_digits(f, unit))
    if _is_uuid(t):
        return _to_uuid(arr)
    if _is_binary(t):
        return _to_binary(arr, t)
    raise _unsupported("?", t)  # _check_supported rules this out


def _convert_list(arr: pa.ListArray, t: pa.DataType, unit: EpochUnit) -> tuple[pa.Array, Mask | None]:
    values = arr.flatten()  # values of non-null lists, honouring the array's offset
    converted, value_bad = _convert(values, t.value_field, unit)
    if not t.value_field.nullable:
        value_bad = _or(value_bad, _is_null_mask(converted))
    lengths = np.asarray(pc.list_value_length(arr).fill_null(0).to_numpy(), dtype=np.int64)
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    mask = arr.is_null() if arr.null_count else None
    if pa.types.is_large_list(t):
        out = pa.LargeListArray.from_arrays(pa.array(offsets), converted, type=t, mask=mask)
    else:
        out = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), converted, type=t, mask=mask)
    return out, _parents(value_bad, lengths)


def _parents(bad: Mask | None, lengths: npt.NDArray[np.int64]) -> Mask | None:
    """Rows of a list array holding an element flagged in ``bad`` (rows have ``lengths`` elements)."""
    if bad is None or not bad.any():
        return None
    out = np.zeros(len(lengths), dtype=np.bool_)
    out[np.repeat(np.arange(len(lengths)), lengths)[bad]] = True
    return out


def _convert_map(arr: pa.ListArray, t: pa.MapType, unit: EpochUnit) -> tuple[pa.Array, Mask | None]:
    """Parsed entries ``[{"k": key text, "v": value}, ...]`` (see :func:`_rewritten`) -> map ``t``.

    Keys are converted as strings of the key type would be. Only keys that cannot collide go
    in bulk: string keys, and integer keys written canonically ("42", not "042" or "+42");
    rows with other keys are flagged (the reference path converts them or finds duplicates)."""
    entries = pa.list_(pa.struct([t.key_field.with_name(_ENTRY_KEY), t.item_field.with_name(_ENTRY_VALUE)]))
    listed, bad = _convert_list(arr, entries, unit)
    lengths = np.diff(np.asarray(listed.offsets, dtype=np.int64))
    if not _is_string(t.key_type):
        text = pc.struct_field(arr.flatten(), [0])
        if pa.types.is_integer(t.key_type):
            key_bad = _false_mask(pc.match_substring_regex(text, _CANONICAL_INT_PATTERN))
        else:
            key_bad = np.ones(len(text), dtype=np.bool_)
        bad = _or(bad, _parents(key_bad, lengths))
    pairs = listed.values
    mask = arr.is_null() if arr.null_count else None
    out = pa.MapArray.from_arrays(listed.offsets, _unmasked(pairs.field(0)), pairs.field(1), type=t, mask=mask)
    return out, bad


def _unmasked(arr: pa.Array) -> pa.Array:
    """``arr`` without nulls, for a non-nullable field (Arrow refuses nulls there, even under a
    null parent). Only slots under a null parent, or in rows flagged and dropped, are null in
    such a field, so whatever those slots then hold never reaches a table."""
    if not arr.null_count:
        return arr
    if isinstance(arr, pa.ExtensionArray):
        return pa.ExtensionArray.from_storage(arr.type, _unmasked(arr.storage))
    t = arr.type
    if pa.types.is_struct(t):
        return struct_array([arr.field(i) for i in range(t.num_fields)], t, len(arr))
    if pa.types.is_map(t):
        return pa.MapArray.from_arrays(arr.offsets, arr.keys, arr.items, type=t)
    if _is_list(t):
        cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        return cls.from_arrays(arr.offsets, arr.values, type=t)
    return pa.Array.from_buffers(t, len(arr), [None, *arr.buffers()[1:]], offset=arr.offset)


def _to_integer(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    lo, hi = _int_bounds(t)
    bad: Mask | None = None
    if _is_string(arr.type):  # numeric strings: plain integers here, the rest per record
        ok = pc.match_substring_regex(arr, _INT_PATTERN)
        bad = _false_mask(ok)
        arr = pc.cast(_null_where(arr, bad), pa.int64())
    elif pa.types.is_decimal(arr.type):  # 1.0, 1e3, numbers beyond int64
        low = pa.scalar(Decimal(lo), arr.type)
        high = pa.scalar(Decimal(hi), arr.type)
        ok = pc.and_(
            pc.equal(pc.round(arr, 0), arr),
            pc.and_(pc.greater_equal(arr, low), pc.less_equal(arr, high)),
        )
        bad = _false_mask(ok)
        return pc.cast(_null_where(arr, bad), t), bad
    if not pa.types.is_int64(t):
        ok = pc.and_(pc.greater_equal(arr, max(lo, _INT64[0])), pc.less_equal(arr, min(hi, _INT64[1])))
        out_of_range = _false_mask(ok)
        bad = _or(bad, out_of_range)
        arr = pc.cast(_null_where(arr, out_of_range), t)
    return arr, bad


def _to_float(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    bad: Mask | None = None
    if _is_string(arr.type):
        bad = _false_mask(pc.match_substring_regex(arr, _NUM_PATTERN))
        arr = pc.cast(_null_where(arr, bad), pa.float64())
    # An infinity is either an overflow ("1e400") or the literal Infinity: the record decides.
    bad = _or(bad, _false_mask(pc.invert(pc.is_inf(arr))))
    if pa.types.is_float32(t):
        arr = pc.cast(arr, pa.float32(), safe=False)
        bad = _or(bad, _false_mask(pc.invert(pc.is_inf(arr))))
    return arr, bad


def _to_decimal(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    bad: Mask | None = None
    wide = _default_parse_type(pa.field("d", t))
    if _is_string(arr.type):
        bad = _false_mask(pc.match_substring_regex(arr, _NUM_PATTERN))
        arr, cast_bad = _strict_cast(_null_where(arr, bad), wide)
        bad = _or(bad, cast_bad)
    if arr.type.scale > t.scale:
        bad = _or(bad, _false_mask(pc.equal(pc.round(arr, t.scale), arr)))
    bad = _or(bad, _too_many_digits(arr, t))
    return pc.cast(_null_where(arr, bad), t), bad


def _too_many_digits(arr: pa.Array, t: pa.DataType) -> Mask | None:
    """Rows of decimal ``arr`` with more integer digits than ``t`` holds."""
    if t.precision - t.scale >= 38 - arr.type.scale:  # every value of arr fits
        return None
    limit = pa.scalar(Decimal(10) ** (t.precision - t.scale), arr.type)
    return _false_mask(pc.less(pc.abs(arr), limit))


def _to_bool(arr: pa.Array) -> tuple[pa.Array, Mask | None]:
    if pa.types.is_boolean(arr.type):
        return arr, None
    true = pc.equal(arr, "true")
    ok = pc.or_(true, pc.equal(arr, "false"))
    return true, _false_mask(ok)


@dataclass(frozen=True)
class _Counts:
    """A parsed temporal column split into epoch counts and text."""

    counts: pa.Array | None  # int64 counts (null elsewhere), None when there are none
    text: pa.Array | None  # strings that are not counts (null elsewhere), None when none
    is_count: pa.Array | None  # where counts come from, when both kinds occur
    bad: Mask | None


def _split_counts(arr: pa.Array) -> _Counts:
    """Numbers arrive as int64 (or wide decimals after ``1.5`` or ``1e3``); in a string column,
    strings of digits are counts and the rest is left to the text parser."""
    if not _is_string(arr.type):
        if pa.types.is_decimal(arr.type):
            counts, bad = _to_integer(arr, pa.int64())
            return _Counts(counts, None, None, bad)
        return _Counts(arr, None, None, None)
    is_count = pc.match_substring_regex(arr, _COUNT_PATTERN)
    count_rows = _true_mask(is_count)
    if count_rows is None:
        return _Counts(None, arr, None, None)
    counts, bad = _strict_cast(_null_where(arr, ~count_rows), pa.int64())
    return _Counts(counts, _null_where(arr, count_rows), is_count, bad)


def _merge_parts(split: _Counts, from_counts: pa.Array | None, from_text: pa.Array | None) -> pa.Array:
    if from_text is None:
        assert from_counts is not None
        return from_counts
    if from_counts is None:
        return from_text
    return pc.if_else(split.is_count, from_counts, from_text)


def _rescale(counts: pa.Array, from_digits: int, to_digits: int, lo: int, hi: int) -> tuple[pa.Array, Mask | None]:
    """Counts of ``10**-from_digits`` -> ``10**-to_digits``, floored; bad outside ``[lo, hi]``."""
    bad: Mask | None = None
    if from_digits > to_digits:
        k = 10 ** (from_digits - to_digits)
        q = pc.divide(counts, k)  # truncates toward zero: step negative remainders down
        counts = pc.subtract(q, pc.cast(pc.less(counts, pc.multiply(q, k)), pa.int64()))
    elif from_digits < to_digits:
        k = 10 ** (to_digits - from_digits)
        limit = _INT64[1] // k
        bad = _false_mask(pc.and_(pc.greater_equal(counts, -limit), pc.less_equal(counts, limit)))
        counts = pc.multiply(_null_where(counts, bad), k)
    bad = _or(bad, _false_mask(pc.and_(pc.greater_equal(counts, lo), pc.less_equal(counts, hi))))
    return _null_where(counts, bad), bad


def _to_timestamp(arr: pa.Array, t: pa.DataType, unit_digits: int) -> tuple[pa.Array, Mask | None]:
    digits = _UNIT_DIGITS[t.unit]
    split = _split_counts(arr)
    bad = split.bad
    from_counts = from_text = None
    if split.counts is not None:
        ticks, tick_bad = _rescale(split.counts, unit_digits, digits, *_ts_bounds(digits))
        from_counts, bad = ticks.cast(pa.timestamp(t.unit, tz="UTC")), _or(bad, tick_bad)
    if split.text is not None:
        from_text, text_bad = _iso_timestamps(split.text, t)
        bad = _or(bad, text_bad)
    return _merge_parts(split, from_counts, from_text).cast(t), bad


def _iso_timestamps(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    """ISO-8601 strings -> timestamp[t.unit, UTC]."""
    bad = _false_mask(pc.match_substring_regex(arr, _TS_PATTERN))
    text = _null_where(arr, bad)
    digits = _UNIT_DIGITS[t.unit]
    text = _truncate_fraction(text, digits)
    utc = pa.timestamp(t.unit, tz="UTC")
    try:  # the common case: naive wall times, kept as they are (and taken as UTC for tz columns)
        parsed, cast_bad = pc.cast(text, pa.timestamp(t.unit)).cast(utc), None
    except pa.ArrowInvalid:  # offsets (or impossible dates): offsets honoured, converted to UTC
        has_offset = pc.match_substring_regex(text, _OFFSET_PATTERN)
        if not pc.all(has_offset).as_py():
            text = pc.if_else(has_offset, text, pc.binary_join_element_wise(text, "Z", ""))
        parsed, cast_bad = _strict_cast(text, utc)
    bad = _or(bad, cast_bad)
    if _MIN_SECONDS * 10**digits >= _INT64[0]:  # year 1 is representable in this unit
        floor = pa.scalar(_MIN_SECONDS * 10**digits, pa.int64()).cast(utc)
        bad = _or(bad, _false_mask(pc.greater_equal(parsed, floor)))
    return parsed, bad


def _truncate_fraction(text: pa.Array, digits: int) -> pa.Array:
    """Drop fraction digits beyond ``digits`` (truncation toward the past)."""
    too_fine = rf"\.[0-9]{{{digits + 1},}}"
    if digits >= 9 or not pc.any(pc.match_substring_regex(text, too_fine)).as_py():
        return text
    if digits == 0:
        return pc.replace_substring_regex(text, r"\.[0-9]+", "")
    return pc.replace_substring_regex(text, rf"(\.[0-9]{{{digits}}})[0-9]+", r"\1")


def _to_date(arr: pa.Array, unit_digits: int | None) -> tuple[pa.Array, Mask | None]:
    """Dates from 'YYYY-MM-DD' or counts: days, or ``unit_digits`` units that make whole days."""
    split = _split_counts(arr)
    bad = split.bad
    from_counts = from_text = None
    if split.counts is not None:
        counts = split.counts
        if unit_digits is not None:
            k = _DAY_SECONDS * 10**unit_digits
            days = pc.divide(counts, k)
            bad = _or(bad, _false_mask(pc.equal(pc.multiply(days, k), counts)))
            counts = days
        days, day_bad = _rescale(_null_where(counts, bad), 0, 0, _MIN_DAYS, _MAX_DAYS)
        bad = _or(bad, day_bad)
        from_counts = days.cast(pa.int32()).cast(pa.date32())
    if split.text is not None:
        text_bad = _false_mask(pc.match_substring_regex(split.text, _DATE_PATTERN))
        from_text, cast_bad = _strict_cast(_null_where(split.text, text_bad), pa.date32())
        floor = pa.scalar(_MIN_DAYS, pa.int32()).cast(pa.date32())
        bad = _or(bad, _or(_or(text_bad, cast_bad), _false_mask(pc.greater_equal(from_text, floor))))
    return _merge_parts(split, from_counts, from_text), bad


def _to_time(arr: pa.Array, t: pa.DataType, unit_digits: int) -> tuple[pa.Array, Mask | None]:
    """Times of day from 'HH:MM:SS[.f]' or counts of the epoch unit since midnight."""
    digits = _UNIT_DIGITS[t.unit]
    split = _split_counts(arr)
    bad = split.bad
    from_counts = from_text = None
    if split.counts is not None:
        from_counts, tick_bad = _rescale(split.counts, unit_digits, digits, 0, _DAY_SECONDS * 10**digits - 1)
        bad = _or(bad, tick_bad)
    if split.text is not None:
        text = split.text
        text_bad = _false_mask(pc.match_substring_regex(text, _TIME_PATTERN))
        text = _null_where(text, text_bad)
        parts = pc.extract_regex(text, _TIME_PATTERN)
        h, m, s = (pc.cast(pc.struct_field(parts, name), pa.int64()) for name in "hms")
        ok = pc.and_(pc.less(h, 24), pc.and_(pc.less(m, 60), pc.less(s, 60)))
        text_bad = _or(text_bad, _false_mask(ok))
        fraction = pc.utf8_rpad(pc.struct_field(parts, "f").fill_null(""), width=9, padding="0")
        sub = pc.cast(pc.utf8_slice_codeunits(fraction, 0, digits), pa.int64()) if digits else 0
        seconds = pc.add(pc.multiply(pc.add(pc.multiply(h, 60), m), 60), s)
        from_text = _null_where(pc.add(pc.multiply(seconds, 10**digits), sub), text_bad)
        bad = _or(bad, text_bad)
    storage = pa.int32() if pa.types.is_time32(t) else pa.int64()
    return _merge_parts(split, from_counts, from_text).cast(storage).cast(t), bad


def _true_mask(ok: pa.Array) -> Mask | None:
    """Rows where a boolean check is True (null counts as False)."""
    return _false_mask(pc.invert(ok))


def _validity(valid: Mask) -> pa.Buffer | None:
    """An Arrow validity bitmap for ``valid`` (None when every row is valid)."""
    return None if valid.all() else pa.array(valid).buffers()[1]


def _bytes_of(arr: pa.Array) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """The bytes of a large_string/large_binary array without nulls, and offsets from 0."""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    chars = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    return chars[offsets[0] : offsets[-1]], offsets - offsets[0]


_B64_VALUES: Final = np.zeros(256, dtype=np.uint32)
_B64_VALUES[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", dtype=np.uint8)] = (
    np.arange(64, dtype=np.uint32)
)
_HEX_VALUES: Final = np.zeros(256, dtype=np.uint8)
_HEX_VALUES[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX_VALUES[np.frombuffer(b"ABCDEF", dtype=np.uint8)] = np.arange(10, 16, dtype=np.uint8)
_UUID_HEX_COLUMNS: Final = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])
_NIL_UUID: Final = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class _Decoded:
    """Base64 strings decoded in bulk: value ``i`` is ``data[offsets[i]:offsets[i + 1]]``."""

    data: npt.NDArray[np.uint8]
    offsets: npt.NDArray[np.int64]
    valid: Mask  # rows with a value (not null, not bad)
    bad: Mask | None

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        return np.diff(self.offsets)

    def binary(self) -> pa.Array:
        n = len(self.valid)
        buffers = [_validity(self.valid), pa.py_buffer(self.offsets), pa.py_buffer(self.data)]
        return pa.Array.from_buffers(pa.large_binary(), n, buffers)


def _from_base64(arr: pa.Array) -> _Decoded:
    bad = _false_mask(pc.match_substring_regex(arr, _B64_PATTERN))
    text = _null_where(arr, bad)
    valid = np.asarray(pc.is_valid(text).to_numpy(zero_copy_only=False), dtype=np.bool_)
    chars, offsets = _bytes_of(pc.cast(text.fill_null(""), pa.large_string()))
    if not len(chars):
        return _Decoded(np.zeros(0, dtype=np.uint8), np.zeros(len(arr) + 1, dtype=np.int64), valid, bad)
    quads = _B64_VALUES[chars].reshape(-1, 4)
    decoded = np.empty((len(quads), 3), dtype=np.uint32)
    decoded[:, 0] = (quads[:, 0] << 2) | (quads[:, 1] >> 4)
    decoded[:, 1] = ((quads[:, 1] & 15) << 4) | (quads[:, 2] >> 2)
    decoded[:, 2] = ((quads[:, 2] & 3) << 6) | quads[:, 3]
    flat = (decoded & 0xFF).astype(np.uint8).ravel()
    lengths = np.diff(offsets)
    ends = offsets[1:]
    some = lengths > 0
    pad1 = some & (chars[np.maximum(ends - 1, 0)] == ord("="))
    pad2 = some & (chars[np.maximum(ends - 2, 0)] == ord("="))
    byte_ends = ends // 4 * 3
    keep = np.ones(len(flat), dtype=np.bool_)
    keep[byte_ends[pad1] - 1] = False
    keep[byte_ends[pad2] - 2] = False
    out_offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(lengths // 4 * 3 - pad1 - pad2, out=out_offsets[1:])
    return _Decoded(flat[keep], out_offsets, valid, bad)


def _to_binary(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    decoded = _from_base64(arr)
    out, bad = decoded.binary(), decoded.bad
    if pa.types.is_fixed_size_binary(t):
        wrong = decoded.valid & (decoded.lengths != t.byte_width)
        if wrong.any():
            bad = _or(bad, wrong)
            out = _null_where(out, wrong)
    return out.cast(t), bad


def _to_uuid(arr: pa.Array) -> tuple[pa.Array, Mask | None]:
    bad = _false_mask(pc.match_substring_regex(arr, _UUID_PATTERN))
    text = _null_where(arr, bad)
    valid = np.asarray(pc.is_valid(text).to_numpy(zero_copy_only=False), dtype=np.bool_)
    chars, _ = _bytes_of(pc.cast(text.fill_null(_NIL_UUID), pa.large_string()))
    nibbles = _HEX_VALUES[chars.reshape(-1, 36)[:, _UUID_HEX_COLUMNS]]
    raw = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    storage = pa.Array.from_buffers(pa.binary(16), len(arr), [_validity(valid), pa.py_buffer(raw.tobytes())])
    return pa.ExtensionArray.from_storage(pa.uuid(), storage), bad


def _to_connect_decimal(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    """Kafka Connect Decimal: base64 of the big-endian two's-complement unscaled integer."""
    decoded = _from_base64(arr)
    lengths = decoded.lengths
    n = len(arr)
    # Up to 15 bytes (< 2**119 < 10**38) fit decimal128 without overflow; the rest go per record.
    ok = decoded.valid & (lengths > 0) & (lengths < 16)
    bad = _or(decoded.bad, decoded.valid & ~ok)
    grid = np.zeros((n, 16), dtype=np.uint8)  # little-endian, as decimal128 stores it
    if len(decoded.data):
        first = decoded.data[np.minimum(decoded.offsets[:-1], len(decoded.data) - 1)]
        grid[ok & (first >= 0x80)] = 0xFF  # sign extension
        byte_ok = np.repeat(ok, lengths)
        rows = np.repeat(np.arange(n), lengths)[byte_ok]
        within = (np.arange(len(decoded.data)) - np.repeat(decoded.offsets[:-1], lengths))[byte_ok]
        grid[rows, np.repeat(lengths, lengths)[byte_ok] - 1 - within] = decoded.data[byte_ok]
    wide = pa.Array.from_buffers(pa.decimal128(38, t.scale), n, [_validity(ok), pa.py_buffer(grid.tobytes())])
    bad = _or(bad, _too_many_digits(wide, t))
    return pc.cast(_null_where(wide, bad), t), bad


# --------------------------------------------------------------------------------------------
# Step 4: the per-record reference path
# --------------------------------------------------------------------------------------------


class _Bad(Exception):
    def __init__(self, reason: str, field: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


class _Number:
    """A JSON number token, kept as its text so every conversion is exact."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    @property
    def is_int(self) -> bool:
        return not any(c in self.text for c in ".eE") and self.text not in _CONSTANTS


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Bad(f"malformed JSON: duplicate key {key!r}", None)
            seen.add(key)
    return out


def _utf8_reason(exc: UnicodeDecodeError) -> str:
    return f"malformed JSON: invalid UTF-8 at byte {exc.start} ({exc.reason})"


def _check_text(value: object) -> None:
    """Strings must be encodable: JSON escapes can spell lone surrogates ("\\ud800")."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise _Bad("malformed JSON: a string holds an unpaired surrogate escape", None) from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _load(value: bytes | bytearray | memoryview) -> object:
    """One record, parsed as the bulk reader would; raises _Bad for malformed JSON."""
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(_utf8_reason(exc), None) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip(" \t\r\n"):
        raise _Bad("malformed JSON: empty record", None)
    try:
        doc = json.loads(
            text,
            object_pairs_hook=_object,
            parse_int=_Number,
            parse_float=_Number,
            parse_constant=_Number,
        )
    except json.JSONDecodeError as exc:
        raise _Bad(f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", None) from None
    except RecursionError:
        raise _Bad("malformed JSON: nested too deeply", None) from None
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
    if isinstance(v, _Number):
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
    if isinstance(v, _Number):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _numeric(v: object) -> Decimal | None:
    """The exact value of a JSON number or numeric string (None for NaN, Infinity, others)."""
    if isinstance(v, _Number):
        return None if v.text in _CONSTANTS else Decimal(v.text)
    if isinstance(v, str) and _NUM_RE.fullmatch(v):
        return Decimal(v)
    return None


def _coerce(v: object, f: pa.Field, path: str, unit: EpochUnit) -> object:
    """A parsed JSON value -> a Python value pyarrow stores as field ``f``; raises _Bad.
    ``unit``: the epoch unit of temporal fields without their own."""
    t = f.type
    if v is None:
        if not f.nullable:
            raise _Bad("required field is null or missing", path)
        return None
    if pa.types.is_struct(t):
        if not isinstance(v, dict):
            raise _Bad(f"cannot coerce {_show(v)} to struct: expected a JSON object", path)
        return {c.name: _coerce(v.get(c.name), c, f"{path}.{c.name}", unit) for c in t}
    if _is_list(t):
        if not isinstance(v, list):
            raise _Bad(f"cannot coerce {_show(v)} to list: expected a JSON array", path)
        element = t.value_field
        return [_coerce(x, element, f"{path}[{i}]", unit) for i, x in enumerate(v)]
    if pa.types.is_map(t):
        return _coerce_map(v, t, path, unit)
    if _is_string(t):
        return v if isinstance(v, str) else _json_text(v)
    if pa.types.is_boolean(t):
        if isinstance(v, bool):
            return v
        if v in ("true", "false"):
            return v == "true"
        raise _Bad(f"cannot coerce {_show(v)} to boolean", path)
    if pa.types.is_integer(t):
        return _coerce_integer(v, t, path)
    if pa.types.is_floating(t):
        return _coerce_float(v, t, path)
    if _connect_bytes(f):
        return _coerce_connect_decimal(v, t, path)
    if pa.types.is_decimal(t):
        return _coerce_decimal(v, t, path)
    if pa.types.is_timestamp(t):
        return _coerce_timestamp(v, t, _meta(f, EPOCH_UNIT) or unit, path)
    if pa.types.is_date32(t):
        return _coerce_date(v, _meta(f, EPOCH_UNIT), path)
    if pa.types.is_time(t):
        return _coerce_time(v, t, _meta(f, EPOCH_UNIT) or unit, path)
    if _is_uuid(t):
        return _coerce_uuid(v, path)
    if _is_binary(t):
        return _coerce_binary(v, t, path)
    raise _unsupported(path, t)


def _coerce_map(v: object, t: pa.MapType, path: str, unit: EpochUnit) -> list[tuple[object, object]]:
    """A JSON object or an array of ``[key, value]`` pairs -> map entries in their order; keys
    are coerced to the key type (an object's key as its text), values as a column of the value
    type would be."""
    items = _map_items(v)
    if items is None:
        raise _Bad(
            f"cannot coerce {_show(v)} to map: expected a JSON object or an array of [key, value] pairs", path,
        )
    entries: list[tuple[object, object]] = []
    seen: dict[object, str] = {}
    for i, (k, x) in enumerate(items):
        if k is None or isinstance(k, (list, dict)):
            raise _Bad(f"map key: expected a string, number or boolean, found {_kind(k)}", f"{path}[{i}]")
        k = k if isinstance(k, str) else _json_text(k)
        at = f"{path}.{k}"
        try:
            key = _coerce(k, t.key_field, at, unit)
        except _Bad as bad:
            raise _Bad(f"map key: {bad.reason}", at) from None
        if key in seen:
            raise _Bad(f"map key {k!r} is the same {_type_name(t.key_type)} as key {seen[key]!r}", at)
        seen[key] = k
        entries.append((key, _coerce(x, t.item_field, at, unit)))
    return entries


def _coerce_integer(v: object, t: pa.DataType, path: str) -> int:
    name = _type_name(t)
    number = None if isinstance(v, bool) else _numeric(v)
    if number is None:
        raise _Bad(f"cannot coerce {_show(v)} to {name}", path)
    lo, hi = _int_bounds(t)
    if number.adjusted() > 40:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: out of range [{lo}, {hi}]", path)
    if number != number.to_integral_value():
        raise _Bad(f"cannot coerce {_show(v)} to {name}: it has a fractional part", path)
    value = int(number)
    if not lo <= value <= hi:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: out of range [{lo}, {hi}]", path)
    return value


def _coerce_float(v: object, t: pa.DataType, path: str) -> float:
    name = _type_name(t)
    if isinstance(v, _Number):
        value = float(v.text)
        literal = v.text in _CONSTANTS
    elif isinstance(v, str) and _NUM_RE.fullmatch(v):
        value = float(v)
        literal = False
    else:
        raise _Bad(f"cannot coerce {_show(v)} to {name}", path)
    overflow = value in (float("inf"), float("-inf")) and not literal
    if not overflow and pa.types.is_float32(t):
        try:
            struct.pack("<f", value)
        except OverflowError:
            overflow = True
    if overflow:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: out of range", path)
    return value


def _coerce_decimal(v: object, t: pa.DataType, path: str) -> Decimal:
    name = _type_name(t)
    number = None if isinstance(v, bool) else _numeric(v)
    if number is None:
        raise _Bad(f"cannot coerce {_show(v)} to {name}", path)
    return _exact_decimal(v, number, t, path)


def _exact_decimal(v: object, number: Decimal, t: pa.DataType, path: str) -> Decimal:
    name = _type_name(t)
    digits = t.precision - t.scale
    if number and number.adjusted() >= digits:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: more than {digits} integer digits", path)
    with localcontext() as ctx:
        ctx.prec = 80
        try:
            exact = number.quantize(Decimal(1).scaleb(-t.scale))
        except InvalidOperation:
            exact = None
    if exact is None or exact != number:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: more than {t.scale} decimal places", path)
    return exact


def _coerce_connect_decimal(v: object, t: pa.DataType, path: str) -> Decimal:
    raw = _base64(v, f"{_type_name(t)} (Kafka Connect Decimal bytes)", path)
    if not raw:
        raise _Bad(f"cannot coerce {_show(v)} to {_type_name(t)}: no bytes", path)
    number = Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-t.scale, _EXACT)
    return _exact_decimal(v, number, t, path)


def _base64(v: object, name: str, path: str) -> bytes:
    if not isinstance(v, str) or not _B64_RE.fullmatch(v):
        raise _Bad(f"cannot coerce {_show(v)} to {name}: expected a base64 string (standard, padded)", path)
    return base64.b64decode(v)


def _coerce_binary(v: object, t: pa.DataType, path: str) -> bytes:
    name = _type_name(t)
    raw = _base64(v, name, path)
    if pa.types.is_fixed_size_binary(t) and len(raw) != t.byte_width:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: found {len(raw)} bytes", path)
    return raw


def _coerce_uuid(v: object, path: str) -> bytes:
    if not isinstance(v, str) or not _UUID_RE.fullmatch(v):
        raise _Bad(f"cannot coerce {_show(v)} to uuid: expected 'xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx'", path)
    return uuid.UUID(v).bytes


def _count(v: object, name: str, unit: str, to_digits: int, since: str, path: str) -> int | None:
    """A JSON number or numeric string counting ``unit`` -> ticks of ``10**-to_digits`` s,
    floored; None when ``v`` is not numeric."""
    number = None if isinstance(v, bool) else _numeric(v)
    if number is None:
        return None
    if number and number.adjusted() > 40:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: out of range ({unit} since {since})", path)
    with localcontext() as ctx:
        ctx.prec = 100
        return int(number.scaleb(to_digits - _UNIT_DIGITS[unit]).to_integral_value(rounding=ROUND_FLOOR))


def _coerce_timestamp(v: object, t: pa.DataType, unit: str, path: str) -> int:
    name = _type_name(t)
    digits = _UNIT_DIGITS[t.unit]
    ticks = _count(v, name, unit, digits, "the epoch", path)
    if ticks is not None:
        lo, hi = _ts_bounds(digits)
        if not lo <= ticks <= hi:
            raise _Bad(
                f"cannot coerce {_show(v)} to {name}: {unit} since the epoch is out of range "
                f"(0001-01-01 to 9999-12-31); is the unit right? set {EPOCH_UNIT} or the "
                "table's timestamp-unit",
                path,
            )
        return ticks
    match = _TS_RE.fullmatch(v) if isinstance(v, str) else None
    if match is None:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: expected {_TS_FORMAT} ({unit})", path)
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    fraction, offset = match.group(7) or "", match.group(8)
    try:
        days = date(year, month, day).toordinal() - _EPOCH_ORDINAL
    except ValueError as exc:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: {exc}", path) from None
    if hour > 23 or minute > 59 or second > 59:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: time of day out of range", path)
    shift = 0
    if offset and offset != "Z":
        digits = offset[1:].replace(":", "")
        off_hours, off_minutes = int(digits[:2]), int(digits[2:] or 0)
        if off_hours > 23 or off_minutes > 59:
            raise _Bad(f"cannot coerce {_show(v)} to {name}: offset out of range", path)
        shift = (off_hours * 60 + off_minutes) * 60 * (1 if offset[0] == "+" else -1)
    seconds = days * 86_400 + hour * 3600 + minute * 60 + second - shift
    unit_digits: int = _UNIT_DIGITS[t.unit]
    value: int = seconds * 10**unit_digits + int((fraction + "0" * 9)[:unit_digits] or 0)
    if seconds < _MIN_SECONDS or not _INT64[0] <= value <= _INT64[1]:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: out of range", path)
    return value


def _coerce_time(v: object, t: pa.DataType, unit: str, path: str) -> int:
    name = _type_name(t)
    digits = _UNIT_DIGITS[t.unit]
    ticks = _count(v, name, unit, digits, "midnight", path)
    if ticks is None:
        match = _TIME_RE.fullmatch(v) if isinstance(v, str) else None
        if match is None:
            raise _Bad(f"cannot coerce {_show(v)} to {name}: expected {_TIME_FORMAT} ({unit})", path)
        hour, minute, second = int(match["h"]), int(match["m"]), int(match["s"])
        if hour > 23 or minute > 59 or second > 59:
            raise _Bad(f"cannot coerce {_show(v)} to {name}: time of day out of range", path)
        fraction = int(((match["f"] or "") + "0" * 9)[:digits] or 0)
        return ((hour * 60 + minute) * 60 + second) * 10**digits + fraction
    if not 0 <= ticks < _DAY_SECONDS * 10**digits:
        raise _Bad(f"cannot coerce {_show(v)} to {name}: {unit} since midnight out of range [0, 1 day)", path)
    return ticks


def _coerce_date(v: object, unit: str | None, path: str) -> int:
    number = None if isinstance(v, bool) else _numeric(v)
    if number is not None:
        if unit is not None:
            with localcontext() as ctx:
                ctx.prec = 100
                number = number.scaleb(-_UNIT_DIGITS[unit]) / _DAY_SECONDS
        if number != number.to_integral_value():
            raise _Bad(f"cannot coerce {_show(v)} to date: not a whole day (dates are not truncated)", path)
        days = int(number)
        if not _MIN_DAYS <= days <= _MAX_DAYS:
            since = "days" if unit is None else unit
            raise _Bad(f"cannot coerce {_show(v)} to date: {since} since the epoch out of range", path)
        return days
    match = _DATE_RE.fullmatch(v) if isinstance(v, str) else None
    if match is None:
        if isinstance(v, str) and _TS_RE.fullmatch(v):
            raise _Bad(
                f"cannot coerce {_show(v)} to date: expected 'YYYY-MM-DD', found a timestamp "
                "(timestamps are not truncated to dates)",
                path,
            )
        raise _Bad(f"cannot coerce {_show(v)} to date: expected 'YYYY-MM-DD' or days since the epoch", path)
    try:
        return date(*(int(g) for g in match.groups())).toordinal() - _EPOCH_ORDINAL
    except ValueError as exc:
        raise _Bad(f"cannot coerce {_show(v)} to date: {exc}", path) from None


class _Oracle:
    """The per-record reference conversion (slow, exact, authoritative)."""

    def __init__(self, schema: pa.Schema, unit: EpochUnit, fold: bool = False) -> None:
        self.schema = schema
        self.unit = unit
        self.fold = _rewriter(pa.struct(list(schema)), entries=False, fold=True) if fold else None

    def row(self, value: bytes) -> dict[str, object]:
        doc = _load(value)
        if not isinstance(doc, dict):
            raise _Bad(f"not a JSON object: found {_kind(doc)}", None)
        if self.fold is not None:
            doc = self.fold(doc)
            assert isinstance(doc, dict)
        return {f.name: _coerce(doc.get(f.name), f, f.name, self.unit) for f in self.schema}


# --------------------------------------------------------------------------------------------
# Decoding against a schema
# --------------------------------------------------------------------------------------------


class _Decoder:
    """Collects converted pieces, reference-path rows and rejects for one batch."""

    def __init__(
        self, values: Sequence[bytes], schema: pa.Schema, rejects: list[Reject], unit: EpochUnit, *, fold: bool = False,
    ) -> None:
        self.values = values
        self.schema = schema
        self.fields = list(schema)
        self.unit = unit
        self.oracle = _Oracle(schema, unit, fold)
        self.plan = _Plan(pa.struct([_parse_form(f) for f in self.fields]))
        self.batches: list[pa.RecordBatch] = []
        self.batch_indices: list[npt.NDArray[np.int64]] = []
        self.slow_rows: list[dict[str, object]] = []
        self.slow_indices: list[int] = []
        self.rejects = rejects

    # -- per record --------------------------------------------------------------------------

    def slow(self, index: int) -> None:
        try:
            row = self.oracle.row(self.values[index])
        except _Bad as bad:
            self.rejects.append(Reject(index, bad.reason, bad.field))
            return
        self.slow_rows.append(row)
        self.slow_indices.append(index)

    def slow_range(self, run: _Run, lo: int, hi: int) -> None:
        for k in range(lo, hi):
            self.slow(int(run.positions[k]))

    # -- in bulk -----------------------------------------------------------------------------

    def scan(self, run: _Run, lo: int, hi: int, threaded: bool) -> None:
        """Decode records ``[lo, hi)`` of ``run``: each ends in a batch, a slow row or a reject."""
        pacer = _Pacer()
        while lo < hi:
            if hi - lo <= _SMALL_RUN:
                self.slow_range(run, lo, hi)
                return
            if not self.plan.quoted <= run.keys:
                run, lo, hi = run.quoted(lo, hi, self.plan.quoted), 0, hi - lo
            view = run.view(lo, hi)
            single = not threaded and view.size <= _MAX_SINGLE_BLOCK
            try:
                table = _read(view, self.plan.schema(), run.multiline, single=single)
            except pa.ArrowInvalid as exc:
                message = str(exc)
                adapted = self.plan.adapt(message)
                if adapted is not None:
                    self.plan = adapted
                    continue
                if threaded:  # read again as one block: the error then names the row
                    threaded = False
                    continue
                row = _error_row(message) if single else None
                if row is None or row >= hi - lo:
                    self._bisect(run, lo, hi)
                    return
                if row:
                    self.scan(run, lo, lo + row, threaded=False)
                self.slow(int(run.positions[lo + row]))
                lo += row + 1
                if pacer.failed_at(row):
                    window = min(_DENSE_WINDOW, hi - lo)
                    self.slow_range(run, lo, lo + window)
                    lo += window
                continue
            if table.num_rows != hi - lo:  # a value held two objects: find it
                self._bisect(run, lo, hi)
                return
            self._accept(table, run, lo)
            return

    def _bisect(self, run: _Run, lo: int, hi: int) -> None:
        mid = (lo + hi) // 2
        self.scan(run, lo, mid, threaded=False)
        self.scan(run, mid, hi, threaded=False)

    def _accept(self, table: pa.Table, run: _Run, lo: int) -> None:
        start = lo
        for chunk in table.column(0).chunks:
            n = len(chunk)
            arrays, bad = _convert_children(chunk, self.fields, self.unit)
            bad = _or(bad, _is_null_mask(chunk))  # the value was JSON null
            indices = run.positions[start : start + n]
            if bad is not None and bad.any():
                for k in np.flatnonzero(bad):
                    self.slow(int(indices[k]))
                keep = pa.array(~bad)
                arrays = [a.filter(keep) for a in arrays]
                indices = indices[~bad]
            if len(indices):
                self.batches.append(_batch(arrays, self.schema, len(indices)))
                self.batch_indices.append(indices)
            start += n

    def result(self) -> Converted:
        rejects = tuple(sorted(self.rejects, key=lambda r: r.index))
        if not self.fields:  # Arrow drops the row count of column-less tables when combining
            indices = np.sort(
                np.concatenate([*self.batch_indices, np.array(self.slow_indices, dtype=np.int64)])
            )
            table = pa.Table.from_batches([_batch([], self.schema, len(indices))])
            return Converted(table, pa.array(indices, type=pa.int64()), rejects)
        parts: list[pa.Table] = []
        if self.batches:
            parts.append(pa.Table.from_batches(self.batches, schema=self.schema))
        if self.slow_rows:  # rare: records the bulk path handed over
            parts.append(_from_pylist(self.slow_rows, self.schema))
        table = pa.concat_tables(parts) if parts else pa.Table.from_batches([], schema=self.schema)
        indices = np.concatenate([*self.batch_indices, np.array(self.slow_indices, dtype=np.int64)])
        if self.slow_rows:  # bulk pieces come in input order; slow rows go back between them
            order = np.argsort(indices, kind="stable")
            if not np.array_equal(order, np.arange(len(order))):
                table = table.take(pa.array(order))
                indices = indices[order]
        return Converted(table, pa.array(indices, type=pa.int64()), rejects)


def _from_pylist(rows: list[dict[str, object]], schema: pa.Schema) -> pa.Table:
    """Rows of the reference path as a table (pyarrow cannot build nested uuid columns directly)."""
    storage = pa.schema([_storage_field(f) for f in schema], metadata=schema.metadata)
    if storage.equals(schema, check_metadata=True):
        return pa.Table.from_pylist(rows, schema=schema)
    return pa.Table.from_pylist(rows, schema=storage).cast(schema)


def _storage_field(f: pa.Field) -> pa.Field:
    t = f.type
    if isinstance(t, pa.BaseExtensionType):
        return f.with_type(t.storage_type)
    if pa.types.is_struct(t):
        return f.with_type(pa.struct([_storage_field(c) for c in t]))
    if _is_list(t):
        element = _storage_field(t.value_field)
        return f.with_type(pa.large_list(element) if pa.types.is_large_list(t) else pa.list_(element))
    if pa.types.is_map(t):
        return f.with_type(pa.map_(_storage_field(t.key_field), _storage_field(t.item_field), t.keys_sorted))
    return f


def _batch(arrays: list[pa.Array], schema: pa.Schema, rows: int) -> pa.RecordBatch:
    if arrays:
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    # No columns (an inferred schema of empty objects): keep the row count.
    empty = pa.StructArray.from_buffers(pa.struct([]), rows, [None], children=[])
    return pa.RecordBatch.from_struct_array(empty)


# --------------------------------------------------------------------------------------------
# Inference
# --------------------------------------------------------------------------------------------


def _merge(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """The type holding values of both: int+float -> double; other conflicts -> string."""
    if a.equals(b):
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    if {a, b} == {pa.int64(), pa.float64()}:
        return pa.float64()
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        merged = {f.name: f.type for f in a}
        for f in b:
            merged[f.name] = _merge(merged[f.name], f.type) if f.name in merged else f.type
        return pa.struct([pa.field(name, t) for name, t in merged.items()])
    if pa.types.is_list(a) and pa.types.is_list(b):
        return pa.list_(_merge(a.value_type, b.value_type))
    return pa.string()


def _as_inferred(t: pa.DataType) -> pa.DataType:
    """pyarrow's inferred type in this module's terms: timestamps stay strings."""
    if pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _as_inferred(f.type)) for f in t])
    if _is_list(t):
        return pa.list_(_as_inferred(t.value_type))
    return t


def _finish(t: pa.DataType) -> pa.DataType:
    """Null-only fields (and empty-list elements) become strings."""
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _finish(f.type)) for f in t])
    if _is_list(t):
        return pa.list_(_finish(t.value_type))
    return t


def _type_of(v: object) -> pa.DataType:
    if v is None:
        return pa.null()
    if isinstance(v, bool):
        return pa.bool_()
    if isinstance(v, str):
        return pa.string()
    if isinstance(v, _Number):
        if v.is_int and len(v.text) <= 20 and _INT64[0] <= int(v.text) <= _INT64[1]:
            return pa.int64()
        return pa.float64()
    if isinstance(v, list):
        return pa.list_(reduce(_merge, map(_type_of, v), pa.null()))
    if isinstance(v, dict):
        return pa.struct([pa.field(k, _type_of(x)) for k, x in v.items()])
    raise TypeError(f"not a parsed JSON value: {type(v).__name__}")


class _Inference:
    def __init__(self, values: Sequence[bytes]) -> None:
        self.values = values

    def slow(self, run: _Run, lo: int, hi: int) -> pa.DataType:
        out: pa.DataType = pa.null()
        for k in range(lo, hi):
            try:
                doc = _load(self.values[int(run.positions[k])])
            except _Bad:
                continue  # rejected when the batch is decoded
            if isinstance(doc, dict):
                out = _merge(out, _type_of(doc))
        return out

    def scan(self, run: _Run, lo: int, hi: int, threaded: bool) -> pa.DataType:
        out: pa.DataType = pa.null()
        pacer = _Pacer()
        while lo < hi:
            if hi - lo <= _SMALL_RUN:
                return _merge(out, self.slow(run, lo, hi))
            view = run.view(lo, hi)
            single = not threaded and view.size <= _MAX_SINGLE_BLOCK
            try:
                table = _read(view, None, run.multiline, single=single)
            except _INFER_FAILURES as exc:
                if threaded:
                    threaded = False
                    continue
                row = _error_row(str(exc)) if single else None
                if row is None or row >= hi - lo:
                    mid = (lo + hi) // 2
                    out = _merge(out, self.scan(run, lo, mid, threaded=False))
                    return _merge(out, self.scan(run, mid, hi, threaded=False))
                if row:
                    out = _merge(out, self.scan(run, lo, lo + row, threaded=False))
                out = _merge(out, self.slow(run, lo + row, lo + row + 1))
                lo += row + 1
                if pacer.failed_at(row):
                    window = min(_DENSE_WINDOW, hi - lo)
                    out = _merge(out, self.slow(run, lo, lo + window))
                    lo += window
                continue
            if table.num_rows != hi - lo:
                mid = (lo + hi) // 2
                out = _merge(out, self.scan(run, lo, mid, threaded=False))
                return _merge(out, self.scan(run, mid, hi, threaded=False))
            found = table.schema.field(0).type if table.num_columns else pa.null()
            return _merge(out, _as_inferred(found) if pa.types.is_struct(found) else pa.null())
        return out


def _infer(run: _Run | None, values: Sequence[bytes]) -> pa.Schema:
    if run is None:
        return pa.schema([])
    found = _finish(_Inference(values).scan(run, 0, run.size, threaded=True))
    return pa.schema(list(found)) if pa.types.is_struct(found) else pa.schema([])


def _dotted(path: Path) -> str:
    return "".join(p if p == "[]" else ("." + p if i else p) for i, p in enumerate(path))


def _timestamp_columns(schema: pa.Schema, values: Sequence[bytes], pattern: re.Pattern[str]) -> pa.Schema:
    """``schema`` with string and integer fields whose dotted path matches ``pattern`` as timestamps."""
    chosen: dict[Path, pa.DataType] = {}
    strings: list[Path] = []
    for path, f in _leaves(pa.struct(list(schema))):
        if not pattern.fullmatch(_dotted(path)):
            continue
        if pa.types.is_integer(f.type):
            chosen[path] = pa.timestamp("us", tz="UTC")
        elif _is_string(f.type):
            strings.append(path)
    if strings:
        decoded = decode_json(values, schema).table
        for path in strings:
            column = _column_at(decoded, path)
            zoned = pc.any(pc.match_substring_regex(column, _TS_OFFSET_PATTERN)).as_py()
            chosen[path] = pa.timestamp("us", tz="UTC") if zoned else pa.timestamp("us")
    if not chosen:
        return schema

    def build(f: pa.Field, path: Path) -> pa.Field:
        t = f.type
        if path in chosen:
            return f.with_type(chosen[path])
        if pa.types.is_struct(t):
            return f.with_type(pa.struct([build(c, (*path, c.name)) for c in t]))
        if _is_list(t):
            return f.with_type(pa.list_(build(t.value_field, (*path, "[]"))))
        return f

    return pa.schema([build(f, (f.name,)) for f in schema], metadata=schema.metadata)


def _column_at(table: pa.Table, path: Path) -> pa.Array:
    """The leaf values at ``path`` (struct fields, ``[]`` list elements) as one array."""
    arr: pa.Array = table.column(path[0]).combine_chunks() if table.num_rows else pa.array([], pa.string())
    for part in path[1:]:
        if not table.num_rows:
            break
        arr = arr.flatten() if part == "[]" else pc.struct_field(arr, part)
    return arr
