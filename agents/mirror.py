"""Mirror tables (CDC), the worker's half: one round's change rows of a table collapsed by key,
in bulk. No I/O.

A mirror table holds one row per live key with the values of its latest change. Within a
round, the changes of one key (in source order: offset order within a partition, and Debezium
keys its events by primary key, so one key's changes stay in one partition) collapse to what the
round does to the table:

- the row to write: the last change of the key, unless that change is a delete;
- whether the key's committed row (if any) must be deleted first: yes when any change of the key
  in the round is an update or a delete, or an insert in upsert mode
  (``iceberg.tables.upsert-mode-enabled``). A key deleted and inserted again in one round is
  therefore replaced, whatever the mode.

The operation is read from ``iceberg.tables.cdc-field`` (a dotted path, ``_cdc.op`` with the
Debezium transform): its first character upper-cased, ``U`` update, ``D`` delete, anything else
insert. A change without a key value or with no readable operation is a reject naming the field.
Rows superseded within the round are never written; the coordinator turns the deleted keys
into position deletes of the rows they had.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agents.convert import Converted, Reject

__all__ = ["Collapsed", "collapse", "column_at", "operations", "screen"]

_INDEX = "__icesink_index"
_DELETES = "__icesink_deletes"


@dataclass(frozen=True)
class Collapsed:
    rows: pa.Table  # the row each key ends the round with (no deleted key), in source order of that change
    deleted_keys: pa.Table  # key columns of every key whose committed row goes (updated, deleted or replaced)
    rejects: tuple[Reject, ...]  # by input index


def column_at(table: pa.Table, path: str) -> pa.Array | None:
    """The column at a dotted path (``_cdc.op``: field ``op`` of struct column ``_cdc``), or
    None when the table has no such field."""
    first, *rest = path.split(".")
    if first not in table.column_names:
        return None
    arr: pa.Array = table.column(first).combine_chunks()
    for part in rest:
        if not pa.types.is_struct(arr.type) or arr.type.get_field_index(part) < 0:
            return None
        arr = pc.struct_field(arr, part)
    return arr


def operations(changes: pa.Table, keys: Sequence[str], cdc_field: str | None) -> tuple[pa.Array, list[Reject]]:
    """The operation of each change (``U``, ``D``, or anything else: an insert; every change
    an insert without ``cdc_field``) and the changes that have none or lack a key value, as
    rejects by row index. Raises ``ValueError`` when the rows lack a key column or the field
    altogether (a setting that does not fit the table, not a bad record)."""
    if not keys:
        raise ValueError("expected key columns, found none")
    missing = [k for k in keys if k not in changes.column_names]
    if missing:
        raise ValueError(f"expected key columns {list(keys)}, the rows lack {missing}")
    n = changes.num_rows
    if cdc_field is None:
        ops: pa.Array = pa.array(["I"] * n, pa.string()) if n else pa.array([], pa.string())
    else:
        op_column = column_at(changes, cdc_field)
        if op_column is None:
            raise ValueError(f"expected the operation field {cdc_field!r} in the rows, found columns "
                             f"{', '.join(changes.column_names)}")
        if not pa.types.is_string(op_column.type):
            try:
                op_column = pc.cast(op_column, pa.string())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(f"expected the operation field {cdc_field!r} to hold text, "
                                 f"found {op_column.type}") from exc
        ops = pc.utf8_upper(pc.utf8_slice_codeunits(op_column, 0, 1))
    bad_op = _mask(pc.or_kleene(pc.is_null(ops), pc.equal(ops, "")), n)
    bad_key = np.zeros(n, dtype=bool)
    for k in keys:
        bad_key |= _mask(pc.is_null(changes.column(k)), n)
    rejects = [Reject(int(i), f"change without a value for key column {_first_null(changes, keys, int(i))}",
                      _first_null(changes, keys, int(i))) for i in np.flatnonzero(bad_key)]
    rejects += [Reject(int(i), f"operation field {cdc_field} holds no operation", cdc_field)
                for i in np.flatnonzero(bad_op & ~bad_key)]
    return ops, sorted(rejects, key=lambda r: r.index)


def screen(converted: Converted, keys: Sequence[str], cdc_field: str | None) -> Converted:
    """``converted`` without the changes :func:`operations` rejects (added to its rejects, by
    input index): checked as records arrive, so they are dead-lettered with the rest."""
    _, bad = operations(converted.table, keys, cdc_field)
    if not bad:
        return converted
    keep = np.ones(converted.table.num_rows, dtype=bool)
    keep[[r.index for r in bad]] = False
    mask = pa.array(keep)
    indices = converted.indices.to_numpy(zero_copy_only=False)
    moved = [Reject(int(indices[r.index]), r.reason, r.field) for r in bad]
    return Converted(converted.table.filter(mask), converted.indices.filter(mask),
                     tuple(sorted((*converted.rejects, *moved), key=lambda r: r.index)))


def collapse(changes: pa.Table, keys: Sequence[str], cdc_field: str | None, *, upsert: bool) -> Collapsed:
    """Collapse ``changes`` (one table's change rows of a round, in source order) by ``keys``
    (top-level column names). See the module docstring."""
    try:
        ops, rejects = operations(changes, keys, cdc_field)
    except ValueError as exc:
        raise ValueError(f"collapse: {exc}") from None
    n = changes.num_rows
    bad = np.zeros(n, dtype=bool)
    bad[[r.index for r in rejects]] = True
    good = ~bad
    # Every operation replaces the committed row in upsert mode (inserts included); else only
    # updates and deletes do.
    deletes_old = pa.array(np.ones(n, dtype=bool)) if upsert else pc.is_in(ops, pa.array(["U", "D"]))
    keyed = pa.table({**{k: changes.column(k) for k in keys},
                      _INDEX: pa.array(np.arange(n, dtype=np.int64)),
                      _DELETES: pc.fill_null(deletes_old, False)}).filter(pa.array(good))
    grouped = keyed.group_by(list(keys), use_threads=False).aggregate([(_INDEX, "max"), (_DELETES, "any")])
    last = pc.sort_indices(grouped.column(f"{_INDEX}_max"))
    grouped = grouped.take(last)
    last_index = grouped.column(f"{_INDEX}_max")
    last_ops = pc.take(ops, last_index)
    kept = pc.invert(pc.equal(last_ops, "D"))
    rows = changes.take(last_index).filter(kept)
    deleted = grouped.filter(grouped.column(f"{_DELETES}_any")).select(list(keys))
    return Collapsed(rows, deleted, tuple(rejects))


def _mask(arr: pa.Array, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype=bool)
    return np.asarray(pc.fill_null(arr, True).to_numpy(zero_copy_only=False), dtype=bool)


def _first_null(changes: pa.Table, keys: Sequence[str], i: int) -> str:
    return next(k for k in keys if not changes.column(k)[i].is_valid)
