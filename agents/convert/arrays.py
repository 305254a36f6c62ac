"""Small pyarrow helpers shared by the steps: row masks, null-where, strict casts, ``if_else`` over
extension types, struct arrays built from parts. No I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from agents.convert.columns import storage_field


Mask: TypeAlias = npt.NDArray[np.bool_]


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


def validity(valid: Mask) -> pa.Buffer | None:
    """An Arrow validity bitmap for ``valid`` (None when every row is valid)."""
    return None if valid.all() else pa.array(valid).buffers()[1]
