"""String and bytes values (``value.converter`` = StringConverter or ByteArrayConverter): each
record's whole value in one column (:class:`RawValues`), a string for the String converter
(UTF-8 text; a value that is not is a reject) and binary for the ByteArray converter.

Kafka Connect's converters hand the reference sink a String or a byte[], which it cannot write
without a transform that wraps it in a struct (HoistField); here the column is
``iceberg.tables.value-column`` (``value``), nullable, as HoistField's struct field would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import BinaryType, NestedField, StringType

from agents.convert import Converted
from agents.formats.extras import bytes_column
from icesink.shared.errors import ConfigError


@dataclass(frozen=True)
class RawValues:
    """The value column of string (``binary`` False) or bytes values."""

    column: str
    binary: bool

    def schema(self) -> Schema:
        """An auto-created table's value columns: the one column."""
        return Schema(NestedField(1, self.column, BinaryType() if self.binary else StringType(), required=False))

    def convert(self, values: Sequence[bytes], target: pa.Schema) -> Converted:
        """``target``'s rows (its value column filled, its other columns null); values that
        are not UTF-8 text for a string column are rejects."""
        index = target.get_field_index(self.column)
        t = target.field(index).type if index >= 0 else None
        if t is None or not (pa.types.is_string(t) or pa.types.is_large_string(t)
                             or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            raise ConfigError("iceberg.tables.value-column", self.column,
                              f"a string or binary column of the table (it has {t or 'no such column'})")
        required = [f.name for f in target if f.name != self.column and not f.nullable]
        if required:
            raise ConfigError("iceberg.tables.value-column", self.column,
                              f"the table's only required column: {required[0]!r} cannot be filled from "
                              "a string or bytes value")
        column, rejects = bytes_column(values, t, "record value", self.column)
        rows = np.arange(len(values), dtype=np.int64)
        if rejects:
            keep = np.ones(len(values), dtype=np.bool_)
            keep[[r.index for r in rejects]] = False
            column, rows = column.filter(pa.array(keep)), rows[keep]
        arrays = [column if f.name == self.column else pa.nulls(len(column), f.type) for f in target]
        return Converted(pa.Table.from_arrays(arrays, schema=target), pa.array(rows), tuple(rejects))
