"""Partition expressions: parse them, build an Iceberg partition spec, compute partition values.

Pure module: no Spark, no I/O. The expression syntax is the one of the Iceberg Kafka Connect
sink's ``iceberg.tables.default-partition-by``:

    col | identity(col) | year(col) | years(col) | month(col) | months(col)
        | day(col) | days(col) | hour(col) | hours(col) | bucket(col, N) | truncate(col, W)

Spark's argument order ``bucket(N, col)`` / ``truncate(W, col)`` is accepted too, since the
integer argument is unambiguous. Nested columns are written with dots (``payload.ts``).

Partition values are computed vectorised with pyiceberg's ``Transform.pyarrow_transform``
(backed by pyiceberg-core), so they are exactly what Iceberg stores in a data file's partition
tuple: ``day`` gives days since the epoch, ``hour`` hours since the epoch, ``bucket`` the
Murmur3 bucket of the Iceberg spec, ``truncate`` the truncated value, ``identity`` the value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.partitioning import PARTITION_FIELD_ID_START, PartitionField, PartitionSpec
from pyiceberg.schema import Schema, index_by_name
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import BinaryType, NestedField, StructType

from icesink.shared.errors import ConfigError

__all__ = [
    "PARTITION_BY_KEY",
    "VALID_FORMS",
    "PartitionExpr",
    "build_partition_spec",
    "parse_partition_by",
    "parse_partition_expr",
    "partition_values",
]

PARTITION_BY_KEY = "partition-by"

VALID_FORMS = (
    "col, identity(col), year(col)/years(col), month(col)/months(col), day(col)/days(col), "
    "hour(col)/hours(col), bucket(col, N), truncate(col, W) (or bucket(N, col), truncate(W, col)), "
    "with N and W positive integers and nested columns written with dots (payload.ts)"
)

# Transform names accepted in the text -> canonical name.
_TRANSFORM_NAMES: dict[str, str] = {
    "identity": "identity",
    "year": "year",
    "years": "year",
    "month": "month",
    "months": "month",
    "day": "day",
    "days": "day",
    "hour": "hour",
    "hours": "hour",
    "bucket": "bucket",
    "truncate": "truncate",
}
_WITH_ARG = frozenset({"bucket", "truncate"})

# Suffix Iceberg (Java) gives the partition field name: `<column>_<suffix>`.
_NAME_SUFFIX: dict[str, str] = {
    "year": "year",
    "month": "month",
    "day": "day",
    "hour": "hour",
    "bucket": "bucket",
    "truncate": "trunc",
}

_CALL_RE = re.compile(r"^([A-Za-z_]+)\s*\((.*)\)$", re.DOTALL)
# A column reference: dotted path of names without whitespace, parentheses or commas.
_COLUMN_RE = re.compile(r"^[^\s(),.]+(\.[^\s(),.]+)*$")
_INT_RE = re.compile(r"^[+]?\d+$")


@dataclass(frozen=True)
class PartitionExpr:
    """One parsed partition expression. ``arg`` is N for bucket, W for truncate, else None."""

    transform: str
    column: str
    arg: int | None

    def validate(self) -> None:
        if self.transform not in _NAME_SUFFIX and self.transform != "identity":
            raise _config_error(str(self), f"unknown transform {self.transform!r}")
        if (self.arg is not None) != (self.transform in _WITH_ARG):
            raise _config_error(str(self), "an integer argument is for bucket and truncate only, and required there")
        if self.arg is not None and self.arg < 1:
            raise _config_error(str(self), f"the integer argument must be positive, found {self.arg}")
        if not _COLUMN_RE.match(self.column):
            raise _config_error(str(self), f"{self.column!r} is not a column name")

    def __str__(self) -> str:
        if self.transform == "identity":
            return self.column
        if self.arg is not None:
            return f"{self.transform}({self.column}, {self.arg})"
        return f"{self.transform}({self.column})"


class _Problem(Exception):
    """What is wrong with one expression; turned into a ConfigError naming the whole setting."""


def _config_error(text: str, problem: str) -> ConfigError:
    return ConfigError(PARTITION_BY_KEY, text, f"partition expressions ({problem}); valid forms: {VALID_FORMS}")


def _parse_one(text: str) -> PartitionExpr:
    stripped = text.strip()
    if not stripped:
        raise _Problem("an expression is empty")
    call = _CALL_RE.match(stripped)
    if call is None:
        if any(c in stripped for c in "()"):
            raise _Problem(f"unbalanced or misplaced parentheses in {stripped!r}")
        if not _COLUMN_RE.match(stripped):
            raise _Problem(f"{stripped!r} is not a column name")
        return PartitionExpr("identity", stripped, None)

    name, inner = call.group(1), call.group(2)
    transform = _TRANSFORM_NAMES.get(name.lower())
    if transform is None:
        raise _Problem(f"unknown transform {name!r}")
    if any(c in inner for c in "()"):
        raise _Problem(f"nested parentheses in {stripped!r}")
    args = [a.strip() for a in inner.split(",")]

    if transform in _WITH_ARG:
        if len(args) != 2:
            raise _Problem(
                f"{transform} takes a column and a positive integer, found {len(args)} argument(s) in {stripped!r}"
            )
        first_int, second_int = bool(_INT_RE.match(args[0])), bool(_INT_RE.match(args[1]))
        if first_int == second_int:
            raise _Problem(f"{transform} takes exactly one column and one positive integer, found {stripped!r}")
        column, number = (args[1], args[0]) if first_int else (args[0], args[1])
        arg = int(number)
        if arg < 1:
            raise _Problem(f"{transform} needs a positive integer, found {arg}")
    else:
        if len(args) != 1:
            raise _Problem(f"{transform} takes one column, found {len(args)} arguments in {stripped!r}")
        column, arg = args[0], None

    if not _COLUMN_RE.match(column):
        raise _Problem(f"{column!r} is not a column name")
    return PartitionExpr(transform, column, arg)


def parse_partition_expr(text: str) -> PartitionExpr:
    """Parse one partition expression. Raises :class:`ConfigError` naming the valid forms."""
    try:
        return _parse_one(text)
    except _Problem as problem:
        raise _config_error(text, str(problem)) from None


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise _Problem("a ')' without its '('")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise _Problem("a '(' without its ')'")
    parts.append("".join(current))
    return parts


def parse_partition_by(text: str) -> tuple[PartitionExpr, ...]:
    """Parse a comma-separated list of partition expressions. Blank text means unpartitioned."""
    if not text.strip():
        return ()
    try:
        return tuple(_parse_one(part) for part in _split_top_level(text))
    except _Problem as problem:
        raise _config_error(text, str(problem)) from None


def _make_transform(expr: PartitionExpr) -> Transform[Any, Any]:
    match expr.transform:
        case "identity":
            return IdentityTransform()
        case "year":
            return YearTransform()
        case "month":
            return MonthTransform()
        case "day":
            return DayTransform()
        case "hour":
            return HourTransform()
        case "bucket":
            assert expr.arg is not None
            return BucketTransform(expr.arg)
        case "truncate":
            assert expr.arg is not None
            return TruncateTransform(expr.arg)
        case _:
            raise _config_error(str(expr), f"unknown transform {expr.transform!r}")


def build_partition_spec(exprs: Sequence[PartitionExpr], schema: Schema) -> PartitionSpec:
    """Build the Iceberg partition spec: field ids from 1000, names as Iceberg (Java) names them."""
    fields: list[PartitionField] = []
    names: set[str] = set()
    schema_names = set(index_by_name(schema))
    for position, expr in enumerate(exprs):
        expr.validate()
        try:
            source = schema.find_field(expr.column, case_sensitive=True)
        except ValueError:
            raise ConfigError(
                PARTITION_BY_KEY,
                str(expr),
                f"a column of the table schema; column {expr.column!r} was not found "
                f"(columns: {', '.join(sorted(index_by_name(schema)))})",
            ) from None
        try:
            schema.accessor_for_field(source.field_id)
        except ValueError:
            raise ConfigError(
                PARTITION_BY_KEY,
                str(expr),
                f"a column reachable through structs only; column {expr.column!r} is inside a list or map",
            ) from None
        transform = _make_transform(expr)
        if not transform.can_transform(source.field_type):
            raise ConfigError(
                PARTITION_BY_KEY,
                str(expr),
                f"a transform that applies to the type of column {expr.column!r} ({source.field_type}); "
                f"{expr.transform} does not",
            )
        column_name = schema.find_column_name(source.field_id) or expr.column
        name = column_name if expr.transform == "identity" else f"{column_name}_{_NAME_SUFFIX[expr.transform]}"
        if name in names:
            raise ConfigError(PARTITION_BY_KEY, str(expr), f"partition fields with distinct names; {name!r} repeats")
        if expr.transform != "identity" and name in schema_names:
            raise ConfigError(
                PARTITION_BY_KEY,
                str(expr),
                f"a partition field name that is not a table column; {name!r} is a column of the table",
            )
        names.add(name)
        fields.append(
            PartitionField(
                source_id=source.field_id,
                field_id=PARTITION_FIELD_ID_START + position,
                transform=transform,
                name=name,
            )
        )
    return PartitionSpec(*fields)


def _struct_path(struct: StructType, field_id: int) -> list[str] | None:
    """Names from the schema root to the field, through structs only."""
    for child in struct.fields:
        if child.field_id == field_id:
            return [child.name]
        if isinstance(child.field_type, StructType):
            below = _struct_path(child.field_type, field_id)
            if below is not None:
                return [child.name, *below]
    return None


def _source_array(data: pa.Table, schema: Schema, source: NestedField) -> pa.ChunkedArray | pa.Array:
    path = _struct_path(schema.as_struct(), source.field_id)
    if path is None:
        raise ValueError(f"partition source field {source.field_id} ({source.name}) is not reachable through structs")
    array: pa.ChunkedArray | pa.Array = data.column(path[0])
    for name in path[1:]:
        # struct_field keeps the parent's validity: a null struct gives a null child.
        array = pc.struct_field(array, [name])
    if isinstance(array, pa.ChunkedArray) and array.num_chunks == 0:
        array = pa.array([], type=array.type)
    return array


def _storage(array: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """An extension array (identity of a uuid column) as its storage (fixed_size_binary(16)):
    Arrow's unique/index_in/group_by have no kernels for extension types."""
    if not isinstance(array.type, pa.BaseExtensionType):
        return array
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([c.storage for c in array.chunks], type=array.type.storage_type)
    return array.storage


def partition_values(data: pa.Table, spec: PartitionSpec, schema: Schema) -> pa.Table:
    """One column per partition field (named like the field), computed vectorised."""
    columns: list[pa.ChunkedArray | pa.Array] = []
    names: list[str] = []
    for field in spec.fields:
        source = schema.find_field(field.source_id)
        array = _source_array(data, schema, source)
        if isinstance(field.transform, TruncateTransform) and isinstance(source.field_type, BinaryType):
            # pyiceberg-core 0.10 cannot truncate large_binary; the spec's truncate of binary is
            # its first W bytes.
            result = pc.binary_slice(array, 0, field.transform.width)
        else:
            result = field.transform.pyarrow_transform(source.field_type)(array)
        columns.append(_storage(result))
        names.append(field.name)
    return pa.Table.from_arrays(columns, names=names)
