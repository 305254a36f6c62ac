"""Kafka Connect's ``TimestampConverter$Value``: the top-level ``field`` converted to
``target.type`` (``string`` with ``format``, ``unix`` in ``unix.precision``, ``Date``, ``Time``,
``Timestamp``), as Connect's does, column-wise.

The field is decoded as its JSON text and read as Connect reads a schemaless value: an integer
(a Long) is a Unix time in ``unix.precision``, any other text a string parsed with ``format``
(UTC), a timestamp column's value an instant. Like Connect, everything goes through
milliseconds (finer input is truncated toward zero); ``Date`` is the UTC day, ``Time`` the time of
day, ``unix`` the count in ``unix.precision``. A value Connect cannot convert (a string that
does not match ``format``, a string with no ``format``, a fraction, a boolean) fails its
record: a reject naming the field. A null stays null. Unlike Java's lenient SimpleDateFormat,
the parse is strict: ``2024-13-01`` is a reject, not January 2025, and trailing text is refused.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agents.transforms.cast import Failed
from icesink.shared.conversion_settings import strftime_of
from icesink.shared.transform_settings import TransformSpec

__all__ = ["TimestampConverter"]

_MS_PER = {"seconds": 1000, "milliseconds": 1, "microseconds": -1000, "nanoseconds": -1_000_000}
_DAY_MS = 86_400_000
TARGET_ARROW = {"string": pa.string(), "unix": pa.int64(), "Date": pa.date32(), "Time": pa.time64("us"),
                "Timestamp": pa.timestamp("us", tz="UTC")}


class TimestampConverter:
    def __init__(self, spec: TransformSpec) -> None:
        self.name = spec.name
        self.field = spec.props.get("field", "")
        self.target = spec.props["target.type"]
        self.precision = spec.props.get("unix.precision", "milliseconds")
        fmt = spec.props.get("format", "").strip()
        self.format = strftime_of(spec.props["format"]) if fmt else None

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        return pa.schema([f.with_type(TARGET_ARROW[self.target]) if f.name == self.field else f for f in s])

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        """``t`` with ``field`` as its text; read when ``t`` lacks it too (no such column, or a
        later step drops it), as Connect converts it before any later step or the sink."""
        extra = [pa.field(self.field, pa.string())] if self.field and self.field not in t.names else []
        return pa.schema([*(f.with_type(pa.string()) if f.name == self.field else f for f in t), *extra])

    def apply(self, table: pa.Table, out: pa.Schema) -> pa.Table:
        return self.convert(table, out)[0]

    def millis(self, text: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each text's instant in epoch ms, and which are null, and which cannot be read."""
        null = np.asarray(text.is_null().to_numpy(zero_copy_only=False))
        is_int = np.asarray(pc.fill_null(pc.match_substring_regex(text, r"^-?\d{1,18}$"), False)
                            .to_numpy(zero_copy_only=False))
        ms = np.zeros(len(text), np.int64)
        if is_int.any():
            raw = np.asarray(pc.if_else(pa.array(is_int), text, "0").cast(pa.int64()).to_numpy(zero_copy_only=False))
            per = _MS_PER[self.precision]  # TimeUnit.toMillis: multiply, or divide truncating toward zero
            ms = np.where(is_int, raw * per if per > 0 else np.sign(raw) * (np.abs(raw) // -per), 0)
        bad = ~null & ~is_int
        if self.format is not None and bad.any():
            parsed = pc.strptime(pc.if_else(pa.array(bad), text, None), format=self.format, unit="ms",
                                 error_is_null=True)
            got = np.asarray(parsed.is_valid().to_numpy(zero_copy_only=False))
            ms = np.where(got, np.asarray(parsed.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)), ms)
            bad = bad & ~got
        return ms, null, bad

    def convert(self, table: pa.Table, out: pa.Schema) -> tuple[pa.Table, Failed]:
        arrays, failed = [], []
        why = f"does not match pattern ({self.format})" if self.format else "is not a Unix time (no format)"
        converted = None
        if self.field in table.column_names:  # converted even where no later column takes it
            converted, bad = self._converted(table.column(self.field).combine_chunks())
            for row in np.flatnonzero(bad).tolist():
                failed.append((row, f"TimestampConverter {self.name}: value "
                               f"({table.column(self.field)[row].as_py()}) {why}", self.field))
        for f in out:
            if f.name not in table.column_names:
                arrays.append(pa.nulls(table.num_rows, f.type))
                continue
            col = converted if f.name == self.field and converted is not None else table.column(f.name).combine_chunks()
            arrays.append(col.cast(f.type))
        return pa.Table.from_arrays(arrays, schema=out), failed

    def _converted(self, col: pa.Array) -> tuple[pa.Array, np.ndarray]:
        if pa.types.is_timestamp(col.type):  # an instant already (a Date): to ms, truncating
            ms = np.asarray(col.cast(pa.timestamp("ms", tz=col.type.tz), safe=False).cast(pa.int64())
                            .fill_null(0).to_numpy(zero_copy_only=False))
            null = np.asarray(col.is_null().to_numpy(zero_copy_only=False))
            bad = np.zeros(len(col), np.bool_)
        else:
            ms, null, bad = self.millis(col.cast(pa.string()))
        mask = null | bad
        if self.target == "Timestamp":
            out = pa.array(ms, pa.int64(), mask=mask).cast(pa.timestamp("ms", tz="UTC"))
        elif self.target == "Date":
            out = pa.array(np.floor_divide(ms, _DAY_MS).astype(np.int32), pa.int32(), mask=mask).cast(pa.date32())
        elif self.target == "Time":
            out = pa.array(np.mod(ms, _DAY_MS) * 1000, pa.int64(), mask=mask).cast(pa.time64("us"))
        elif self.target == "unix":
            per = _MS_PER[self.precision]
            count = np.sign(ms) * (np.abs(ms) // per) if per > 0 else ms * -per
            out = pa.array(count, pa.int64(), mask=mask)
        else:
            assert self.format is not None
            secs = np.floor_divide(ms, 1000)  # %S prints whole seconds: SimpleDateFormat's ss
            out = pc.strftime(pa.array(secs, pa.int64(), mask=mask).cast(pa.timestamp("s", tz="UTC")),
                              format=self.format)
        return out, bad
