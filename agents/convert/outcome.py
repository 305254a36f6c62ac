"""What decoding a batch gives: :class:`Reject` (a record that could not be converted, and why)
and :class:`Converted` (the table of good records and the rejects). Imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


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
