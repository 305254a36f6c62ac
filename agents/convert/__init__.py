"""Kafka record values (schemaless JSON objects) -> one Arrow table, in bulk.

:func:`decode_json` turns a batch of record values into a :class:`pyarrow.Table` without building
a Python dict per record. Every record ends in exactly one of two places: a row of
``Converted.table`` (with its input position in ``Converted.indices``) or a :class:`Reject`
saying why not. A bad record never fails the batch and is never silently nulled.

How a batch is decoded
----------------------
1. **Wrap and join.** Each value is wrapped as ``{"v":<value>}`` and the batch joined with
   newlines into one buffer (one C-level join). The wrapper makes every record exactly one row:
   a value that is empty, ``null``, not an object or two objects back to back cannot shift the
   rows of its neighbours. Values with a newline or CR inside (pretty-printed JSON) switch the
   reader to ``newlines_in_values``. A UTF-8 BOM at the start of a value is dropped; invalid
   UTF-8 (which pyarrow.json does not check) is found up front and rejected.
2. **Parse in C++.** ``pyarrow.json.read_json`` parses the buffer against a *parse schema*
   derived from the target schema: the JSON kind pyarrow should expect for each field (integers
   as int64, timestamps and dates as strings, ...). Fields the target lacks are ignored.
3. **Convert, vectorised.** pyarrow.compute turns each parsed column into its target type
   (range checks, regex-validated string parsing, ISO-8601 timestamps with offsets, decimal
   scale and precision checks). Each step also yields a mask of rows it cannot convert exactly.
4. **Fall back per record, rarely.** Rows in such a mask, and records pyarrow refuses to parse,
   go to the per-record reference path (``Oracle``, plain Python ``json``), which converts the
   record or returns the :class:`Reject`. The reference path defines the semantics; the bulk
   path only accepts what it converts to the same value.

When the bulk parse fails, the reader adapts instead of giving up: a column whose records carry
numeric strings is parsed as strings; a column that mixes kinds (``42`` and ``"42"``) is made
uniform by quoting its bare numbers and booleans in the raw bytes (harmless: every target type
accepts the quoted form with the same value); integer columns holding ``1.0`` or ``1e3`` are
parsed as wide decimals. A failure that adapting cannot cure and that names a row (bad syntax, a
string where an object belongs) splits the batch there: the rows before it are parsed in bulk,
the bad record goes to the reference path, and reading resumes after it. Failures without a row
are isolated by bisection.

Inference (``schema=None``) parses once with pyarrow's inference to find the schema, then decodes
the batch against that schema as above. Conflicting kinds are resolved in Python by merging the
types of the pieces a failing batch splits into. pyarrow infers each 1 MiB block of a threaded
read on its own, and fails a batch whose later block makes an object or array of a field that
was null all through an earlier one; such a read is done again as one block.

What each column type accepts
-----------------------------
- **timestamp / timestamptz**: ISO-8601 strings ``YYYY-MM-DD[T ]HH:MM:SS[.f{1,9}][Z|+HH[:MM]]``
  (an offset is honoured and the instant stored as UTC; a string without one is a wall time,
  taken as UTC in a timestamptz column), or an epoch count: a JSON number or a string of digits
  counting units since 1970-01-01T00:00:00Z. The unit is the field's metadata
  ``icesink.epoch-unit`` (``s``, ``ms``, ``us``, ``ns``), else ``decode_json``'s ``epoch_unit``
  (the setting ``iceberg.tables.timestamp-unit``, ``ms`` by default as in Kafka Connect). The
  unit is never guessed; a count whose instant falls outside 0001-01-01..9999-12-31 is a reject,
  so microseconds read as milliseconds (year 55000) are rejected, not stored.
- **date**: ``YYYY-MM-DD`` strings, or numbers of days since the epoch; with an
  ``icesink.epoch-unit`` on the field, numbers count that unit and must be whole days.
- **time**: ``HH:MM:SS[.f{1,9}]`` strings, or numbers counting the epoch unit since midnight
  (as for timestamps), within ``[00:00, 24:00)``.
- **Precision finer than the column's** (nanoseconds into a microsecond column, in a string's
  fraction or in a count) is truncated toward the past to the column's unit: the stored value
  is the last tick of the column's unit not after the input, as Iceberg's Java sink and Spark
  do. This is the only lossy step and it is exact; nothing is rounded up.
- **decimal(p, s)**: JSON numbers or numeric strings that need no rounding to scale ``s`` and
  have at most ``p - s`` integer digits. With the field metadata ``icesink.decimal-encoding`` =
  ``connect-bytes``: only base64 strings of the big-endian two's-complement unscaled integer
  (Kafka Connect Decimal).
- **binary / fixed[n]**: standard base64 strings with padding (fixed: exactly ``n`` bytes).
- **uuid**: canonical strings ``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (either case).
- **map<K, V>**: a JSON object; each key/value pair is one entry, in the object's order. The
  key's text is read as a JSON string would be in a column of type K (``"42"`` -> int 42;
  keys that cannot be read, or two keys giving the same value such as ``"1"`` and ``"01"``,
  reject the record); values are read as a column of type V would read them. A reject in a map
  names the entry: ``attrs.<key>`` (``attrs.<key>.n`` inside a struct value). An array of
  ``[key, value]`` pairs is read the same way (``[[1, "a"], [2, "b"]]``): Kafka Connect's
  JsonConverter writes maps whose keys are not strings so; keys there are strings, numbers or
  booleans, read as their JSON text would be.
- Anything else in such a column is a reject naming the field; never a null.

Maps in bulk
------------
pyarrow.json has no map type and keeps no raw JSON text, so for schemas with a map (and only
those) each record is first rewritten by ``rewritten``: one C-level ``json.loads`` and
``json.dumps`` turns every map (object or pairs) into a list ``[{"k": key, "v": value}, ...]`` which the
reader parses as list<struct<k: string, v: V>> and step 3 turns into a map array. Non-integer
numbers (and a bare ``-0``) keep their exact text (a marker string, unquoted again after
dumping). Records the
rewrite cannot reproduce faithfully (malformed, duplicate keys, NaN, a ``\u0000`` escape, a
map in neither form) and rows with keys that could collide (integer keys not written
canonically, other non-string key types) go to the reference path.

Case-insensitive keys
---------------------
With ``fold_case`` (``iceberg.tables.schema-case-insensitive``) an object key fills the field
it names ignoring case, at every level (``{"Customer": {"ZIP": 1}}`` fills
``customer.zip``); if a record spells one field twice, the exact spelling wins unless it is
null, else the first non-null one. The reader matches keys exactly, so one inferring parse of
the batch (in C++) tells whether some key spells a field name in another case; only a batch
that has one is rewritten first, as maps are (the same per-record ``json.loads`` and
``json.dumps``; a schema with maps is folded in its rewrite), and the reference path folds
the parsed record the same way.

Where each step lives
---------------------
Each module imports only the ones listed before it (tests/unit/test_layout.py checks that no
import goes back up and that no module uses a private name of another):

1. Leaves: ``outcome`` (:class:`Reject`, :class:`Converted`), ``limits`` (the bulk reader's
   tuning: short runs, dense failures, block size), ``grammar`` (the text grammars for ``re``
   and RE2, value bounds), ``columns`` (the target column types and metadata, the schema
   checks, field paths), ``arrays`` (row masks, strict casts, struct arrays).
2. ``wrapped``: step 1, the wrapped buffer, per-record rewrites and the pyarrow.json read.
3. ``plan``: step 2, the parse schema and how it adapts.
4. ``vectorised`` (step 3) and ``reference`` (step 4, the per-record path), side by side.
5. ``inference`` (a batch's schema) and ``decoder`` (a batch against a schema).
6. This module: the public API.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from agents.convert.arrays import if_else, struct_array
from agents.convert.columns import (
    DECIMAL_ENCODING, EPOCH_UNIT, EPOCH_UNITS, JSON_TEXT, NUMBERS_FIRST, EpochUnit, Path, check_schema,
    check_supported, has_map, is_list, is_string,
)
from agents.convert.decoder import Decoder
from agents.convert.grammar import TS_OFFSET_PATTERN
from agents.convert.inference import infer, miscased
from agents.convert.outcome import Converted, Reject
from agents.convert.plan import leaves
from agents.convert.wrapped import holds_struct, prepare, rewritten


__all__ = [
    "DECIMAL_ENCODING",
    "EPOCH_UNIT",
    "EPOCH_UNITS",
    "JSON_TEXT",
    "NUMBERS_FIRST",
    "Converted",
    "EpochUnit",
    "Reject",
    "check_schema",
    "decode_json",
    "if_else",
    "infer_schema",
    "struct_array",
    "with_field_metadata",
]


def decode_json(
    values: Sequence[bytes], schema: pa.Schema | None = None, *, epoch_unit: EpochUnit = "ms",
    fold_case: bool = False,
) -> Converted:
    """Decode schemaless JSON objects into one table.

    With ``schema`` (what ``schema_to_pyarrow`` gives for the target table) the table has exactly
    that schema, metadata included. Without it the schema is inferred from ``values`` (see
    :func:`infer_schema`). ``epoch_unit`` is the unit of JSON numbers in timestamp and time
    columns whose field has no ``icesink.epoch-unit`` metadata (see the module docstring).
    Raises :class:`UnsupportedTypeError` for a schema with a type this module cannot fill (a
    time zone other than UTC, map keys that are not scalars, ...) or a field with unknown
    icesink metadata; bad records never raise.

    ``fold_case`` (``iceberg.tables.schema-case-insensitive``): a JSON key fills the field of
    ``schema`` it names ignoring case, at every level (see "Case-insensitive keys" above).
    """
    if epoch_unit not in EPOCH_UNITS:
        raise ValueError(f"epoch_unit: expected one of {EPOCH_UNITS}, found {epoch_unit!r}")
    fold = fold_case and schema is not None and holds_struct(pa.struct(list(schema)))
    if schema is not None:
        check_supported(schema)
    if schema is not None and has_map(schema):
        run, rejects = prepare(rewritten(values, schema, fold=fold))
    else:
        run, rejects = prepare(values)
        if fold and run is not None and miscased(run, values, schema):
            run, rejects = prepare(rewritten(values, schema, fold=True))
    if schema is None:
        schema = infer(run, values)
    return Decoder(values, schema, rejects, epoch_unit, fold=fold).decode(run)


def infer_schema(values: Sequence[bytes], *, timestamp_fields: re.Pattern[str] | None = None) -> pa.Schema:
    """The schema ``decode_json(values)`` would produce (one parse, no conversion).

    JSON strings -> string (timestamp-looking ones too, kept verbatim); true/false -> bool;
    integers -> int64; other numbers, or integers mixed with them -> float64; objects -> struct;
    arrays -> list; null-only -> string; conflicting kinds -> string holding each value's JSON
    text. Every field is nullable; fields are in order of first appearance. Integers beyond
    int64 infer float64 (as pyarrow does); an object that is always empty infers ``struct<>``.

    ``timestamp_fields``: string and integer fields whose dotted path (``order.placed_at``;
    list elements as ``events[].at``) fully matches become ``timestamp[us]`` columns instead:
    ``timestamptz`` (UTC) when the field holds integers (epoch counts are instants) or when
    some string in ``values`` carries an offset or ``Z``, else ``timestamp`` (wall times).
    Values that then do not parse as timestamps are rejects when the batch is decoded.
    """
    run, _ = prepare(values)
    schema = infer(run, values)
    if timestamp_fields is None:
        return schema
    return _timestamp_columns(schema, values, timestamp_fields)


def with_field_metadata(schema: pa.Schema, metadata: dict[str, dict[str, str]]) -> pa.Schema:
    """``schema`` with metadata added to the fields at the given dotted paths (as for
    ``timestamp_fields``; ``a.b`` in structs, ``a[]`` for list elements). Raises ``KeyError``
    naming a path that is not a field of ``schema``."""
    if not metadata:
        return schema
    remaining = dict(metadata)

    def visit(f: pa.Field, name: str) -> pa.Field:
        t = f.type
        if pa.types.is_struct(t):
            t = pa.struct([visit(c, f"{name}.{c.name}") for c in t])
        elif is_list(t):
            element = visit(t.value_field, f"{name}[]")
            t = pa.large_list(element) if pa.types.is_large_list(t) else pa.list_(element)
        elif pa.types.is_map(t):
            t = pa.map_(visit(t.key_field, f"{name}.key"), visit(t.item_field, f"{name}.value"), t.keys_sorted)
        out = f.with_type(t)
        extra = remaining.pop(name, None)
        if extra:
            out = out.with_metadata({**(f.metadata or {}), **{k.encode(): v.encode() for k, v in extra.items()}})
        return out

    out = pa.schema([visit(f, f.name) for f in schema], metadata=schema.metadata)
    if remaining:
        raise KeyError(f"not a field of the schema: {', '.join(sorted(remaining))}")
    return out


def _dotted(path: Path) -> str:
    return "".join(p if p == "[]" else ("." + p if i else p) for i, p in enumerate(path))


def _timestamp_columns(schema: pa.Schema, values: Sequence[bytes], pattern: re.Pattern[str]) -> pa.Schema:
    """``schema`` with string and integer fields whose dotted path matches ``pattern`` as timestamps."""
    chosen: dict[Path, pa.DataType] = {}
    strings: list[Path] = []
    for path, f in leaves(pa.struct(list(schema))):
        if not pattern.fullmatch(_dotted(path)):
            continue
        if pa.types.is_integer(f.type):
            chosen[path] = pa.timestamp("us", tz="UTC")
        elif is_string(f.type):
            strings.append(path)
    if strings:
        decoded = decode_json(values, schema).table
        for path in strings:
            column = _column_at(decoded, path)
            zoned = pc.any(pc.match_substring_regex(column, TS_OFFSET_PATTERN)).as_py()
            chosen[path] = pa.timestamp("us", tz="UTC") if zoned else pa.timestamp("us")
    if not chosen:
        return schema

    def build(f: pa.Field, path: Path) -> pa.Field:
        t = f.type
        if path in chosen:
            return f.with_type(chosen[path])
        if pa.types.is_struct(t):
            return f.with_type(pa.struct([build(c, (*path, c.name)) for c in t]))
        if is_list(t):
            return f.with_type(pa.list_(build(t.value_field, (*path, "[]"))))
        return f

    return pa.schema([build(f, (f.name,)) for f in schema], metadata=schema.metadata)


def _column_at(table: pa.Table, path: Path) -> pa.Array:
    """The leaf values at ``path`` (struct fields, ``[]`` list elements) as one array."""
    arr: pa.Array = table.column(path[0]).combine_chunks() if table.num_rows else pa.array([], pa.string())
    for part in path[1:]:
        if not table.num_rows:
            break
        arr = arr.flatten() if part == "[]" else pc.struct_field(arr, part)
    return arr
