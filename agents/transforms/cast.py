"""Kafka Connect's ``Cast$Value``: top-level fields (``spec`` = ``field:type,...``) cast to int8,
int16, int32, int64, float32, float64, boolean or string, as Connect's Cast does, column-wise.

The field is decoded as its JSON text (a number as written, ``true``/``false``, a string's
content) and cast from that: an integer text as Connect casts a Long (``Number.byteValue()``:
narrowing wraps; boolean: not 0), a text with a fraction or exponent as a Double (truncated
toward zero, saturated to int or long first as Java's cast is), ``true``/``false`` as a Boolean
(1/0), any other text as Connect parses a String (``Float.parseFloat``; ``Boolean.parseBoolean``:
anything but ``true`` in any case is false). To string: a Long's digits, a Double as Java's
``Double.toString`` writes it (``1.0E7``), the rest as is. A value Connect cannot cast (a text
that is no number for a number type, an object or array) fails its record: a reject naming the
field, dead-lettered; the others flow. A null stays null.

In bulk, cheaply in the common case: the decode parses a value Cast's field as a JSON integer while
the batch's values of it are all integers (``icesink.json-text``, agents/convert/columns.py: their
text is their digits) and as text otherwise; and a text column that is all integer texts is read
as Longs in one Arrow cast, the regular expressions only for a batch that holds anything else.
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agents.convert import JSON_TEXT, NUMBERS_FIRST
from icesink.shared.conversion_settings import cast_spec
from icesink.shared.transform_settings import TransformSpec

__all__ = ["Cast", "CAST_ARROW", "Failed", "java_double"]

CAST_ARROW = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
              "float32": pa.float32(), "float64": pa.float64(), "boolean": pa.bool_(), "string": pa.string()}
_INT = r"^-?\d+$"
_FLOAT = r"^-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"  # JSON's numbers (and Java's plain ones)
_JAVA_FLOAT = r"^\s*[+-]?(NaN|Infinity|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)[fFdD]?\s*$"
#: Rows of a step that failed: (row of the table, reason, field).
Failed = list[tuple[int, str, str]]


def java_double(x: float) -> str:
    """``x`` as Java's ``Double.toString`` writes it (shortest digits, as JDK 19+)."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if str(x).startswith("-") else "0.0"
    if 1e-3 <= abs(x) < 1e7:
        r = repr(x)
        return r if "." in r else f"{r}.0"
    sign, digits, exp = Decimal(repr(x)).normalize().as_tuple()
    ds = "".join(map(str, digits))
    e = int(exp) + len(ds) - 1
    return f"{'-' if sign else ''}{ds[0]}.{ds[1:] or '0'}E{e}"


def _wrap(values: pa.Array, t: pa.DataType) -> pa.Array:
    """int64 values narrowed as Java's ``Number.byteValue()``/``shortValue()``/``intValue()``."""
    return values.cast(t, safe=False)


def _from_double(d: pa.Array, t: pa.DataType) -> pa.Array:
    """float64 values as Java narrows a Double: truncate, saturate to int (long for int64), wrap."""
    a = np.trunc(np.nan_to_num(d.to_numpy(zero_copy_only=False), nan=0.0, posinf=np.inf, neginf=-np.inf))
    wide = np.iinfo(np.int64 if t == pa.int64() else np.int32)
    high, low = a >= float(wide.max), a <= float(wide.min)  # 2**63 - 1 is no double: compare, then place
    out = np.where(high | low, 0.0, a).astype(np.int64)
    out = np.where(high, wide.max, np.where(low, wide.min, out))
    return _wrap(pa.array(out, pa.int64()), t)


def _all_longs(text: pa.Array) -> pa.Array | None:
    """``text`` as int64 when each text is an integer within Long's range (nulls stay null), else None."""
    try:
        long = pc.cast(text, pa.int64())  # "-?[0-9]+" and Arrow's hex, "0x1F": ruled out below
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return None if pc.any(pc.match_substring(text, "x", ignore_case=True)).as_py() else long


def _cast_longs(text: pa.Array, long: pa.Array, to: str) -> pa.Array:
    """Integer texts (``long``: their values) cast to ``to`` as a Long is; none can fail."""
    t = CAST_ARROW[to]
    if to == "string":
        return long.cast(pa.string())  # Long.toString: no leading zeros, "-0" is "0"
    if to == "boolean":
        return pc.not_equal(long, 0)
    if to.startswith("int"):
        return _wrap(long, t)
    out = long.cast(pa.float64(), safe=False)  # as the text path: the text's nearest double, then float32
    if pc.any(pc.starts_with(text, "-0")).as_py():  # Float.parseFloat("-0") is -0.0
        out = pc.if_else(pc.and_(pc.equal(long, 0), pc.starts_with(text, "-")), -0.0, out)
    return out.cast(t)


def cast_text(text: pa.Array, to: str) -> tuple[pa.Array, np.ndarray]:
    """``text`` (a field's JSON text) cast to ``to`` as Connect's Cast; and where it cannot be."""
    t = CAST_ARROW[to]
    text = text.cast(pa.string())
    long = _all_longs(text)
    if long is not None:
        return _cast_longs(text, long, to), np.zeros(len(text), np.bool_)
    null = np.asarray(text.is_null().to_numpy(zero_copy_only=False))
    is_int = pc.fill_null(pc.match_substring_regex(text, _INT), False)
    is_float = pc.and_(pc.fill_null(pc.match_substring_regex(text, _FLOAT), False), pc.invert(is_int))
    is_bool = pc.fill_null(pc.is_in(text, pa.array(["true", "false"])), False)
    nested = pc.fill_null(pc.or_(pc.starts_with(text, "{"), pc.starts_with(text, "[")), False)
    ints = pc.if_else(is_int, text, None)
    floats = pc.if_else(is_float, text, None)
    bad = np.asarray(nested.to_numpy(zero_copy_only=False)).copy()
    if to == "string":
        digits = pc.replace_substring_regex(pc.replace_substring_regex(text, r"^(-?)0+(\d)", r"\1\2"), "^-0$", "0")
        out = pc.if_else(is_int, digits, text)
        if pc.any(is_float).as_py():
            found = pc.unique(floats.drop_null())
            written = pa.array([java_double(float(v)) for v in found.to_pylist()], pa.string())
            out = pc.if_else(is_float, pc.take(written, pc.index_in(text, found)), out)
        return pc.if_else(nested, None, out), bad
    long = _long(ints)
    over = np.asarray(pc.and_(is_int, long.is_null()).to_numpy(zero_copy_only=False))
    one = pc.if_else(pc.equal(text, "true"), 1, 0).cast(pa.int64())
    if to == "boolean":
        from_text = pc.equal(pc.utf8_lower(text), "true")
        from_float = pc.not_equal(_from_double(pc.cast(floats, pa.float64()), pa.int64()), 0)
        out = pc.if_else(is_int, pc.not_equal(long, 0), pc.if_else(is_float, from_float, from_text))
        return pc.if_else(pa.array(bad), None, out), bad | over
    if to.startswith("int"):
        from_float = _from_double(pc.fill_null(pc.cast(floats, pa.float64()), 0.0), t)
        out = pc.if_else(is_int, _wrap(pc.fill_null(long, 0), t), pc.if_else(is_float, from_float, _wrap(one, t)))
        other = ~(np.asarray(pc.or_(pc.or_(is_int, is_float), is_bool).to_numpy(zero_copy_only=False)) | null)
        bad = bad | over | other
        return pc.if_else(pa.array(bad | null), None, out), bad
    # float32, float64: Float.parseFloat / Double.parseDouble of any other text
    java = pc.fill_null(pc.match_substring_regex(text, _JAVA_FLOAT), False)
    cleaned = pc.replace_substring_regex(pc.utf8_trim_whitespace(text), r"[fFdD]$", "")
    parsed = pc.if_else(java, cleaned, None).cast(pa.float64())
    out = pc.if_else(is_bool, one.cast(pa.float64()), parsed).cast(t)
    bad = bad | ~(np.asarray(pc.or_(java, is_bool).to_numpy(zero_copy_only=False)) | null)
    return pc.if_else(pa.array(bad), None, out), bad


def _long(ints: pa.Array) -> pa.Array:
    """Integer texts as int64; null where one is out of Long's range (Connect: not a Long)."""
    fits = pc.less_equal(pc.utf8_length(pc.replace_substring_regex(ints, r"^-?0*", "")), 18)
    safe = pc.if_else(fits, ints, None).cast(pa.int64())
    rest = pc.and_(pc.invert(fits), pc.is_valid(ints))
    if not pc.any(rest).as_py():
        return safe
    wide = [None if v is None else (int(v) if -2**63 <= int(v) < 2**63 else None)
            for v in pc.if_else(rest, ints, None).to_pylist()]  # 19+ digits: rare
    return pc.if_else(rest, pa.array(wide, pa.int64()), safe)


class Cast:
    def __init__(self, spec: TransformSpec, *, numbers_first: bool = True) -> None:
        """``numbers_first``: mark the fields of :meth:`in_schema` to be parsed as integers first
        (values; the key's fields are built otherwise)."""
        self.name = spec.name
        self.numbers_first = numbers_first
        self.casts = {k: v for k, v in cast_spec(spec.props["spec"]).items() if k is not None}

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        return pa.schema([f.with_type(CAST_ARROW[self.casts[f.name]]) if f.name in self.casts else f for f in s])

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        """``t`` with the cast fields as their text; one ``t`` lacks (no such column, or a later
        step drops it) is still read, as Connect casts it before any later step or the sink."""
        extra = [self._text(pa.field(n, pa.string())) for n in self.casts if n not in t.names]
        return pa.schema([*(self._text(f) if f.name in self.casts else f for f in t), *extra])

    def _text(self, f: pa.Field) -> pa.Field:
        f = f.with_type(pa.string())
        return f.with_metadata({**(f.metadata or {}), JSON_TEXT: NUMBERS_FIRST}) if self.numbers_first else f

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table:
        return self.convert(table, out)[0]

    def convert(self, table: pa.Table, out: pa.Schema) -> tuple[pa.Table, Failed]:
        arrays, failed = [], []
        for f in out:
            if f.name not in table.column_names:
                arrays.append(pa.nulls(table.num_rows, f.type))
                continue
            col = table.column(f.name).combine_chunks()
            if f.name in self.casts:
                to = self.casts[f.name]
                col, bad = cast_text(col, to)
                for row in np.flatnonzero(bad).tolist():
                    failed.append((row, f"Cast {self.name}: value ({table.column(f.name)[row].as_py()}) cannot be "
                                   f"cast to {to}", f.name))
            arrays.append(col.cast(f.type))
        for name in (self.casts.keys() - set(out.names)) & set(table.column_names):  # read only to fail as Connect
            _, bad = cast_text(table.column(name).combine_chunks(), self.casts[name])
            for row in np.flatnonzero(bad).tolist():
                failed.append((row, f"Cast {self.name}: value ({table.column(name)[row].as_py()}) cannot be "
                               f"cast to {self.casts[name]}", name))
        return pa.Table.from_arrays(arrays, schema=out), failed
