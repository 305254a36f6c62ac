"""Step 3 of agents.convert: parsed columns converted to their target types with
pyarrow.compute, each step with a mask of the rows it cannot convert exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from agents.convert.arrays import (
    Mask, false_mask, is_null_mask, null_where, or_mask, strict_cast, struct_array, validity,
)
from agents.convert.columns import (
    EPOCH_UNIT, EpochUnit, connect_bytes, epoch_digits, int_bounds, is_binary, is_list, is_string, is_uuid,
    meta, unsupported,
)
from agents.convert.grammar import (
    B64_PATTERN, CANONICAL_INT_PATTERN, COUNT_PATTERN, DATE_PATTERN, DAY_SECONDS, DECIMAL_DIGITS, INT64, INT_PATTERN,
    MAX_DAYS, MIN_DAYS, MIN_SECONDS, NUM_PATTERN, OFFSET_PATTERN, PLAIN_NUM_PATTERN, TIME_PATTERN, TS_PATTERN,
    UNIT_DIGITS, UUID_PATTERN, ts_bounds,
)
from agents.convert.plan import default_parse_type
from agents.convert.wrapped import ENTRY_KEY, ENTRY_VALUE


def convert_children(
    arr: pa.StructArray, fields: Sequence[pa.Field], unit: EpochUnit
) -> tuple[list[pa.Array], Mask | None]:
    """Children of a parsed struct converted to ``fields``; bad = rows to re-check per record.
    ``unit``: the epoch unit of temporal fields without their own."""
    valid: Mask | None = None
    if arr.null_count:
        valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    # Every column first, then their masks: each step stays with its own helpers.
    pieces = [_convert(pc.struct_field(arr, [i]), f, unit) for i, f in enumerate(fields)]  # applies the parent's nulls
    bad: Mask | None = None
    for f, (converted, child_bad) in zip(fields, pieces, strict=True):
        if not f.nullable:
            missing = is_null_mask(converted)
            if missing is not None and valid is not None:
                missing = missing & valid
            child_bad = or_mask(child_bad, missing)
        bad = or_mask(bad, child_bad)
    return [converted for converted, _ in pieces], bad


def _convert(arr: pa.Array, f: pa.Field, unit: EpochUnit) -> tuple[pa.Array, Mask | None]:
    """One parsed column -> field ``f``'s type. Rows that are not certainly right are flagged."""
    t = f.type
    if pa.types.is_struct(t):
        children, bad = convert_children(arr, list(t), unit)
        mask = arr.is_null() if arr.null_count else None
        if mask is not None:  # required children are null under null parents
            children = [c if f.nullable else _unmasked(c) for c, f in zip(children, t, strict=True)]
        return struct_array(children, t, len(arr), mask), bad
    if is_list(t):
        return _convert_list(arr, t, unit)
    if pa.types.is_map(t):
        return _convert_map(arr, t, unit)
    if pa.types.is_integer(t):
        return _to_integer(arr, t)
    if pa.types.is_floating(t):
        return _to_float(arr, t)
    if connect_bytes(f):
        return _to_connect_decimal(arr, t)
    if pa.types.is_decimal(t):
        return _to_decimal(arr, t)
    if is_string(t):
        return pc.cast(arr, t), None
    if pa.types.is_boolean(t):
        return _to_bool(arr)
    if pa.types.is_timestamp(t):
        return _to_timestamp(arr, t, epoch_digits(f, unit))
    if pa.types.is_date32(t):
        unit_meta = meta(f, EPOCH_UNIT)
        return _to_date(arr, None if unit_meta is None else UNIT_DIGITS[unit_meta])
    if pa.types.is_time(t):
        return _to_time(arr, t, epoch_digits(f, unit))
    if is_uuid(t):
        return _to_uuid(arr)
    if is_binary(t):
        return _to_binary(arr, t)
    raise unsupported("?", t)  # check_supported rules this out


def _convert_list(arr: pa.ListArray, t: pa.DataType, unit: EpochUnit) -> tuple[pa.Array, Mask | None]:
    values = arr.flatten()  # values of non-null lists, honouring the array's offset
    converted, value_bad = _convert(values, t.value_field, unit)
    if not t.value_field.nullable:
        value_bad = or_mask(value_bad, is_null_mask(converted))
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
    """Parsed entries ``[{"k": key text, "v": value}, ...]`` (see :func:`rewritten`) -> map ``t``.

    Keys are converted as strings of the key type would be. Only keys that cannot collide go
    in bulk: string keys, and integer keys written canonically ("42", not "042" or "+42");
    rows with other keys are flagged (the reference path converts them or finds duplicates)."""
    entries = pa.list_(pa.struct([t.key_field.with_name(ENTRY_KEY), t.item_field.with_name(ENTRY_VALUE)]))
    listed, bad = _convert_list(arr, entries, unit)
    offsets: npt.NDArray[np.int64] = np.asarray(listed.offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    if not is_string(t.key_type):
        text = pc.struct_field(arr.flatten(), [0])
        if pa.types.is_integer(t.key_type):
            key_bad = false_mask(pc.match_substring_regex(text, CANONICAL_INT_PATTERN))
        else:
            key_bad = np.ones(len(text), dtype=np.bool_)
        bad = or_mask(bad, _parents(key_bad, lengths))
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
    if is_list(t):
        cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        return cls.from_arrays(arr.offsets, arr.values, type=t)
    return pa.Array.from_buffers(t, len(arr), [None, *arr.buffers()[1:]], offset=arr.offset)


def _to_integer(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    lo, hi = int_bounds(t)
    bad: Mask | None = None
    if is_string(arr.type):  # numeric strings: plain integers here, the rest per record
        ok = pc.match_substring_regex(arr, INT_PATTERN)
        bad = false_mask(ok)
        arr = pc.cast(null_where(arr, bad), pa.int64())
    elif pa.types.is_decimal(arr.type):  # 1.0, 1e3, numbers beyond int64
        low = pa.scalar(Decimal(lo), arr.type)
        high = pa.scalar(Decimal(hi), arr.type)
        ok = pc.and_(
            pc.equal(pc.round(arr, 0), arr),
            pc.and_(pc.greater_equal(arr, low), pc.less_equal(arr, high)),
        )
        bad = false_mask(ok)
        return pc.cast(null_where(arr, bad), t), bad
    if not pa.types.is_int64(t):
        ok = pc.and_(pc.greater_equal(arr, max(lo, INT64[0])), pc.less_equal(arr, min(hi, INT64[1])))
        out_of_range = false_mask(ok)
        bad = or_mask(bad, out_of_range)
        arr = pc.cast(null_where(arr, out_of_range), t)
    return arr, bad


def _to_float(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    bad: Mask | None = None
    if is_string(arr.type):
        bad = false_mask(pc.match_substring_regex(arr, NUM_PATTERN))
        arr = pc.cast(null_where(arr, bad), pa.float64())
    # An infinity is either an overflow ("1e400") or the literal Infinity: the record decides.
    bad = or_mask(bad, false_mask(pc.invert(pc.is_inf(arr))))
    if pa.types.is_float32(t):
        arr = pc.cast(arr, pa.float32(), safe=False)
        bad = or_mask(bad, false_mask(pc.invert(pc.is_inf(arr))))
    return arr, bad


def _to_decimal(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    bad: Mask | None = None
    wide = default_parse_type(pa.field("d", t))
    if is_string(arr.type):  # what Arrow may misread goes to the record, as what is no number
        plain = pc.and_(pc.match_substring_regex(arr, PLAIN_NUM_PATTERN),
                        pc.less_equal(pc.count_substring_regex(arr, "[0-9]"), DECIMAL_DIGITS))
        bad = false_mask(plain)
        arr, cast_bad = strict_cast(null_where(arr, bad), wide)
        bad = or_mask(bad, cast_bad)
    if arr.type.scale > t.scale:
        bad = or_mask(bad, false_mask(pc.equal(pc.round(arr, t.scale), arr)))
    bad = or_mask(bad, _too_many_digits(arr, t))
    return pc.cast(null_where(arr, bad), t), bad


def _too_many_digits(arr: pa.Array, t: pa.DataType) -> Mask | None:
    """Rows of decimal ``arr`` with more integer digits than ``t`` holds."""
    if t.precision - t.scale >= 38 - arr.type.scale:  # every value of arr fits
        return None
    limit = pa.scalar(Decimal(10) ** (t.precision - t.scale), arr.type)
    return false_mask(pc.less(pc.abs(arr), limit))


def _to_bool(arr: pa.Array) -> tuple[pa.Array, Mask | None]:
    if pa.types.is_boolean(arr.type):
        return arr, None
    true = pc.equal(arr, "true")
    ok = pc.or_(true, pc.equal(arr, "false"))
    return true, false_mask(ok)


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
    if not is_string(arr.type):
        if pa.types.is_decimal(arr.type):
            counts, bad = _to_integer(arr, pa.int64())
            return _Counts(counts, None, None, bad)
        return _Counts(arr, None, None, None)
    is_count = pc.match_substring_regex(arr, COUNT_PATTERN)
    count_rows = _true_mask(is_count)
    if count_rows is None:
        return _Counts(None, arr, None, None)
    counts, bad = strict_cast(null_where(arr, ~count_rows), pa.int64())
    return _Counts(counts, null_where(arr, count_rows), is_count, bad)


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
        limit = INT64[1] // k
        bad = false_mask(pc.and_(pc.greater_equal(counts, -limit), pc.less_equal(counts, limit)))
        counts = pc.multiply(null_where(counts, bad), k)
    bad = or_mask(bad, false_mask(pc.and_(pc.greater_equal(counts, lo), pc.less_equal(counts, hi))))
    return null_where(counts, bad), bad


def _to_timestamp(arr: pa.Array, t: pa.DataType, unit_digits: int) -> tuple[pa.Array, Mask | None]:
    digits = UNIT_DIGITS[t.unit]
    split = _split_counts(arr)
    bad = split.bad
    from_counts = from_text = None
    if split.counts is not None:
        ticks, tick_bad = _rescale(split.counts, unit_digits, digits, *ts_bounds(digits))
        from_counts, bad = ticks.cast(pa.timestamp(t.unit, tz="UTC")), or_mask(bad, tick_bad)
    if split.text is not None:
        from_text, text_bad = _iso_timestamps(split.text, t)
        bad = or_mask(bad, text_bad)
    return _merge_parts(split, from_counts, from_text).cast(t), bad


def _iso_timestamps(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    """ISO-8601 strings -> timestamp[t.unit, UTC]."""
    bad = false_mask(pc.match_substring_regex(arr, TS_PATTERN))
    text = null_where(arr, bad)
    digits = UNIT_DIGITS[t.unit]
    text = _truncate_fraction(text, digits)
    utc = pa.timestamp(t.unit, tz="UTC")
    try:  # the common case: naive wall times, kept as they are (and taken as UTC for tz columns)
        parsed, cast_bad = pc.cast(text, pa.timestamp(t.unit)).cast(utc), None
    except pa.ArrowInvalid:  # offsets (or impossible dates): offsets honoured, converted to UTC
        has_offset = pc.match_substring_regex(text, OFFSET_PATTERN)
        if not pc.all(has_offset).as_py():
            text = pc.if_else(has_offset, text, pc.binary_join_element_wise(text, "Z", ""))
        parsed, cast_bad = strict_cast(text, utc)
    bad = or_mask(bad, cast_bad)
    if MIN_SECONDS * 10**digits >= INT64[0]:  # year 1 is representable in this unit
        floor = pa.scalar(MIN_SECONDS * 10**digits, pa.int64()).cast(utc)
        bad = or_mask(bad, false_mask(pc.greater_equal(parsed, floor)))
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
            k = DAY_SECONDS * 10**unit_digits
            days = pc.divide(counts, k)
            bad = or_mask(bad, false_mask(pc.equal(pc.multiply(days, k), counts)))
            counts = days
        days, day_bad = _rescale(null_where(counts, bad), 0, 0, MIN_DAYS, MAX_DAYS)
        bad = or_mask(bad, day_bad)
        from_counts = days.cast(pa.int32()).cast(pa.date32())
    if split.text is not None:
        text_bad = false_mask(pc.match_substring_regex(split.text, DATE_PATTERN))
        from_text, cast_bad = strict_cast(null_where(split.text, text_bad), pa.date32())
        floor = pa.scalar(MIN_DAYS, pa.int32()).cast(pa.date32())
        bad = or_mask(bad, or_mask(or_mask(text_bad, cast_bad), false_mask(pc.greater_equal(from_text, floor))))
    return _merge_parts(split, from_counts, from_text), bad


def _to_time(arr: pa.Array, t: pa.DataType, unit_digits: int) -> tuple[pa.Array, Mask | None]:
    """Times of day from 'HH:MM:SS[.f]' or counts of the epoch unit since midnight."""
    digits = UNIT_DIGITS[t.unit]
    split = _split_counts(arr)
    bad = split.bad
    from_counts = from_text = None
    if split.counts is not None:
        from_counts, tick_bad = _rescale(split.counts, unit_digits, digits, 0, DAY_SECONDS * 10**digits - 1)
        bad = or_mask(bad, tick_bad)
    if split.text is not None:
        text = split.text
        text_bad = false_mask(pc.match_substring_regex(text, TIME_PATTERN))
        text = null_where(text, text_bad)
        parts = pc.extract_regex(text, TIME_PATTERN)
        h, m, s = (pc.cast(pc.struct_field(parts, name), pa.int64()) for name in "hms")
        ok = pc.and_(pc.less(h, 24), pc.and_(pc.less(m, 60), pc.less(s, 60)))
        text_bad = or_mask(text_bad, false_mask(ok))
        fraction = pc.utf8_rpad(pc.struct_field(parts, "f").fill_null(""), width=9, padding="0")
        sub = pc.cast(pc.utf8_slice_codeunits(fraction, 0, digits), pa.int64()) if digits else 0
        seconds = pc.add(pc.multiply(pc.add(pc.multiply(h, 60), m), 60), s)
        from_text = null_where(pc.add(pc.multiply(seconds, 10**digits), sub), text_bad)
        bad = or_mask(bad, text_bad)
    storage = pa.int32() if pa.types.is_time32(t) else pa.int64()
    return _merge_parts(split, from_counts, from_text).cast(storage).cast(t), bad


def _true_mask(ok: pa.Array) -> Mask | None:
    """Rows where a boolean check is True (null counts as False)."""
    return false_mask(pc.invert(ok))


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
        buffers = [validity(self.valid), pa.py_buffer(self.offsets), pa.py_buffer(self.data)]
        return pa.Array.from_buffers(pa.large_binary(), n, buffers)


def _from_base64(arr: pa.Array) -> _Decoded:
    bad = false_mask(pc.match_substring_regex(arr, B64_PATTERN))
    text = null_where(arr, bad)
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
            bad = or_mask(bad, wrong)
            out = null_where(out, wrong)
    return out.cast(t), bad


def _to_uuid(arr: pa.Array) -> tuple[pa.Array, Mask | None]:
    bad = false_mask(pc.match_substring_regex(arr, UUID_PATTERN))
    text = null_where(arr, bad)
    valid = np.asarray(pc.is_valid(text).to_numpy(zero_copy_only=False), dtype=np.bool_)
    chars, _ = _bytes_of(pc.cast(text.fill_null(_NIL_UUID), pa.large_string()))
    nibbles = _HEX_VALUES[chars.reshape(-1, 36)[:, _UUID_HEX_COLUMNS]]
    raw = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    storage = pa.Array.from_buffers(pa.binary(16), len(arr), [validity(valid), pa.py_buffer(raw.tobytes())])
    return pa.ExtensionArray.from_storage(pa.uuid(), storage), bad


def _to_connect_decimal(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, Mask | None]:
    """Kafka Connect Decimal: base64 of the big-endian two's-complement unscaled integer."""
    decoded = _from_base64(arr)
    lengths = decoded.lengths
    n = len(arr)
    # Up to 15 bytes (< 2**119 < 10**38) fit decimal128 without overflow; the rest go per record.
    ok = decoded.valid & (lengths > 0) & (lengths < 16)
    bad = or_mask(decoded.bad, decoded.valid & ~ok)
    grid = np.zeros((n, 16), dtype=np.uint8)  # little-endian, as decimal128 stores it
    if len(decoded.data):
        first = decoded.data[np.minimum(decoded.offsets[:-1], len(decoded.data) - 1)]
        grid[ok & (first >= 0x80)] = 0xFF  # sign extension
        byte_ok = np.repeat(ok, lengths)
        rows = np.repeat(np.arange(n), lengths)[byte_ok]
        within = (np.arange(len(decoded.data)) - np.repeat(decoded.offsets[:-1], lengths))[byte_ok]
        grid[rows, np.repeat(lengths, lengths)[byte_ok] - 1 - within] = decoded.data[byte_ok]
    wide = pa.Array.from_buffers(pa.decimal128(38, t.scale), n, [validity(ok), pa.py_buffer(grid.tobytes())])
    bad = or_mask(bad, _too_many_digits(wide, t))
    return pc.cast(null_where(wide, bad), t), bad
