"""Decoding a batch against a schema: bulk reads of runs of the wrapped buffer, split at the
row a failure names or bisected, with the rows the bulk path cannot take sent to the
reference path (:class:`Decoder`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agents.convert import limits, wrapped
from agents.convert.arrays import is_null_mask, or_mask
from agents.convert.columns import EpochUnit, storage_field
from agents.convert.limits import DENSE_WINDOW, MAX_SINGLE_BLOCK
from agents.convert.outcome import Converted, Reject
from agents.convert.plan import Plan
from agents.convert.reference import Bad, Oracle
from agents.convert.vectorised import convert_children
from agents.convert.wrapped import Pacer, Run, error_row


class Decoder:
    """Collects converted pieces, reference-path rows and rejects for one batch."""

    def __init__(
        self, values: Sequence[bytes], schema: pa.Schema, rejects: list[Reject], unit: EpochUnit, *, fold: bool = False,
    ) -> None:
        self.values = values
        self.schema = schema
        self.fields = list(schema)
        self.unit = unit
        self.oracle = Oracle(schema, unit, fold)
        self.plan = Plan.of(self.fields)
        self.batches: list[pa.RecordBatch] = []
        self.batch_indices: list[npt.NDArray[np.int64]] = []
        self.slow_rows: list[dict[str, object]] = []
        self.slow_indices: list[int] = []
        self.rejects = rejects

    # -- per record --------------------------------------------------------------------------

    def slow(self, index: int) -> None:
        try:
            row = self.oracle.row(self.values[index])
        except Bad as bad:
            self.rejects.append(Reject(index, bad.reason, bad.field))
            return
        self.slow_rows.append(row)
        self.slow_indices.append(index)

    def slow_range(self, run: Run, lo: int, hi: int) -> None:
        for k in range(lo, hi):
            self.slow(int(run.positions[k]))

    # -- in bulk -----------------------------------------------------------------------------

    def decode(self, run: Run | None) -> Converted:
        """The batch's result: every record of ``run`` (None: no record to read) decoded."""
        if run is not None:
            self.scan(run, 0, run.size, threaded=True)
        return self.result()

    def scan(self, run: Run, lo: int, hi: int, threaded: bool) -> None:
        """Decode records ``[lo, hi)`` of ``run``: each ends in a batch, a slow row or a reject."""
        pacer = Pacer()
        while lo < hi:
            if hi - lo <= limits.SMALL_RUN:
                self.slow_range(run, lo, hi)
                return
            if not self.plan.quoted <= run.keys:
                run, lo, hi = run.quoted(lo, hi, self.plan.quoted), 0, hi - lo
            view = run.view(lo, hi)
            single = not threaded and view.size <= MAX_SINGLE_BLOCK
            try:
                table = wrapped.read_buffer(view, self.plan.parse_schema, run.multiline, single=single,
                                      longest=run.longest(lo, hi))
            except pa.ArrowInvalid as exc:
                message = str(exc)
                adapted = self.plan.adapt(message)
                if adapted is not None:
                    self.plan = adapted
                    continue
                if threaded:  # read again as one block: the error then names the row
                    threaded = False
                    continue
                row = error_row(message) if single else None
                if row is None or row >= hi - lo:
                    self._bisect(run, lo, hi)
                    return
                if row:
                    self.scan(run, lo, lo + row, threaded=False)
                self.slow(int(run.positions[lo + row]))
                lo += row + 1
                if pacer.failed_at(row):
                    window = min(DENSE_WINDOW, hi - lo)
                    self.slow_range(run, lo, lo + window)
                    lo += window
                continue
            if table.num_rows != hi - lo:  # a value held two objects: find it
                self._bisect(run, lo, hi)
                return
            self._accept(table, run, lo)
            return

    def _bisect(self, run: Run, lo: int, hi: int) -> None:
        mid = (lo + hi) // 2
        self.scan(run, lo, mid, threaded=False)
        self.scan(run, mid, hi, threaded=False)

    def _accept(self, table: pa.Table, run: Run, lo: int) -> None:
        start = lo
        for chunk in table.column(0).chunks:
            n = len(chunk)
            arrays, bad = convert_children(chunk, self.fields, self.unit)
            bad = or_mask(bad, is_null_mask(chunk))  # the value was JSON null
            if self.plan.unsure_numbers is not None:  # numbers the reader's decimal parse may misread
                bad = or_mask(bad, run.matching(start, start + n, self.plan.unsure_numbers))
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
    storage = pa.schema([storage_field(f) for f in schema], metadata=schema.metadata)
    if storage.equals(schema, check_metadata=True):
        return pa.Table.from_pylist(rows, schema=schema)
    return pa.Table.from_pylist(rows, schema=storage).cast(schema)


def _batch(arrays: list[pa.Array], schema: pa.Schema, rows: int) -> pa.RecordBatch:
    if arrays:
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    # No columns (an inferred schema of empty objects): keep the row count.
    empty = pa.StructArray.from_buffers(pa.struct([]), rows, [None], children=[])
    return pa.RecordBatch.from_struct_array(empty)
