"""Schema inference for agents.convert: one inferring parse per run, conflicting kinds merged
in Python (:class:`_Inference`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

import pyarrow as pa

from agents.convert import limits, wrapped
from agents.convert.columns import is_list, is_string
from agents.convert.grammar import INT64
from agents.convert.limits import DENSE_WINDOW, INFER_FAILURES, MAX_SINGLE_BLOCK
from agents.convert.reference import Bad, Number, load
from agents.convert.wrapped import Pacer, Run, error_row, holds_struct


def miscased(run: Run, values: Sequence[bytes], schema: pa.Schema) -> bool:
    """Whether some record of ``run`` may spell a field of ``schema`` in another case: one
    inferring parse (fast, in C++) tells the keys at every level."""
    return _miscased_type(pa.struct(list(schema)), _Inference(values).scan(run, 0, run.size, threaded=True))


def _miscased_type(t: pa.DataType, seen: pa.DataType) -> bool:
    """Whether JSON of inferred type ``seen`` may hold an object key naming a field of ``t`` in
    another case. True when inference cannot tell: kinds that conflicted (inferred as
    string) where ``t`` has fields, or a map written as pairs; a false positive only costs
    the rewrite."""
    if pa.types.is_null(seen) or not holds_struct(t):
        return False
    if pa.types.is_struct(t):
        if not pa.types.is_struct(seen):
            return is_string(seen)
        exact = {c.name: c.type for c in t}
        lower = {c.name.lower() for c in t}
        return any(
            s.name.lower() in lower if s.name not in exact else _miscased_type(exact[s.name], s.type) for s in seen
        )
    if is_list(t):
        return _miscased_type(t.value_type, seen.value_type) if is_list(seen) else is_string(seen)
    if pa.types.is_struct(seen):  # a map written as an object: its keys are data
        return any(_miscased_type(t.item_type, s.type) for s in seen)
    return True


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
    if is_list(t):
        return pa.list_(_as_inferred(t.value_type))
    return t


def _finish(t: pa.DataType) -> pa.DataType:
    """Null-only fields (and empty-list elements) become strings."""
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _finish(f.type)) for f in t])
    if is_list(t):
        return pa.list_(_finish(t.value_type))
    return t


def _type_of(v: object) -> pa.DataType:
    if v is None:
        return pa.null()
    if isinstance(v, bool):
        return pa.bool_()
    if isinstance(v, str):
        return pa.string()
    if isinstance(v, Number):
        if v.is_int and len(v.text) <= 20 and INT64[0] <= int(v.text) <= INT64[1]:
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

    def slow(self, run: Run, lo: int, hi: int) -> pa.DataType:
        out: pa.DataType = pa.null()
        for k in range(lo, hi):
            try:
                doc = load(self.values[int(run.positions[k])])
            except Bad:
                continue  # rejected when the batch is decoded
            if isinstance(doc, dict):
                out = _merge(out, _type_of(doc))
        return out

    def scan(self, run: Run, lo: int, hi: int, threaded: bool) -> pa.DataType:
        out: pa.DataType = pa.null()
        pacer = Pacer()
        while lo < hi:
            if hi - lo <= limits.SMALL_RUN:
                return _merge(out, self.slow(run, lo, hi))
            view = run.view(lo, hi)
            single = not threaded and view.size <= MAX_SINGLE_BLOCK
            try:
                table = wrapped.read_buffer(view, None, run.multiline, single=single, longest=run.longest(lo, hi))
            except INFER_FAILURES as exc:
                if threaded:
                    threaded = False
                    continue
                row = error_row(str(exc)) if single else None
                if row is None or row >= hi - lo:
                    mid = (lo + hi) // 2
                    out = _merge(out, self.scan(run, lo, mid, threaded=False))
                    return _merge(out, self.scan(run, mid, hi, threaded=False))
                if row:
                    out = _merge(out, self.scan(run, lo, lo + row, threaded=False))
                out = _merge(out, self.slow(run, lo + row, lo + row + 1))
                lo += row + 1
                if pacer.failed_at(row):
                    window = min(DENSE_WINDOW, hi - lo)
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


def infer(run: Run | None, values: Sequence[bytes]) -> pa.Schema:
    if run is None:
        return pa.schema([])
    found = _finish(_Inference(values).scan(run, 0, run.size, threaded=True))
    return pa.schema(list(found)) if pa.types.is_struct(found) else pa.schema([])
