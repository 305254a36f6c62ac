"""Kafka Connect's ``$Key`` transforms on the key column (``iceberg.tables.key-column``):
``ReplaceField$Key``, ``HoistField$Key``, ``InsertField$Key``, ``Cast$Key`` and
``TimestampConverter$Key``, column-wise on the key column as Connect acts on the record key. They
act after the chain's last ValueToKey (a key transform before it changes a key that ValueToKey
then replaces).

A struct key (ValueToKey's) is handled as a table of its fields, by the ``$Value`` steps
(agents/transforms/replace_field.py, hoist_field.py, cast.py, timestamp_converter.py); a
primitive key (the key's text or bytes as consumed) as a one-column table named :data:`WHOLE`.
``HoistField$Key`` wraps either into a struct of one field; ``Cast$Key`` casts fields of a struct
key or (a spec without ``:``) the whole primitive key, ``TimestampConverter$Key`` its ``field``
or (none) the whole primitive key; ``InsertField$Key`` adds the record's metadata to a struct
key. :meth:`KeyChain.in_type` maps the table's key column type back to the key as built,
:meth:`KeyChain.out_type` forward (an auto-created table's column), and :meth:`KeyChain.apply`
maps a key column; a key that Cast or TimestampConverter cannot convert fails its record."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from agents.convert import struct_array
from agents.transforms.cast import Cast, Failed
from agents.transforms.hoist_field import HoistField
from agents.transforms.replace_field import ReplaceField
from agents.transforms.timestamp_converter import TimestampConverter
from icesink.shared.errors import ConfigError
from icesink.shared.transform_settings import TransformSpec

__all__ = ["KeyChain", "KEY_KINDS", "WHOLE"]

#: The kinds built here (the other $Key transforms are refused at start with a key column).
KEY_KINDS = ("replace-field-key", "hoist-field-key", "cast-key", "timestamp-converter-key", "insert-field-key")
#: InsertField's sources and the types of the fields they add (as InsertField$Value's columns).
INSERT_TYPES = {"topic": pa.string(), "partition": pa.int32(), "offset": pa.int64(),
                "timestamp": pa.timestamp("us", tz="UTC"), "static": pa.string()}
#: The one column of a primitive key seen as a table.
WHOLE = "\x00key"


def _as_schema(t: pa.DataType) -> pa.Schema:
    return pa.schema(list(t)) if pa.types.is_struct(t) else pa.schema([pa.field(WHOLE, t)])


def _as_type(s: pa.Schema) -> pa.DataType:
    return s.field(WHOLE).type if s.names == [WHOLE] else pa.struct(list(s))


def _as_table(arr: pa.Array) -> pa.Table:
    if pa.types.is_struct(arr.type):
        return pa.Table.from_arrays([arr.field(i) for i in range(arr.type.num_fields)], schema=_as_schema(arr.type))
    return pa.Table.from_arrays([arr], schema=_as_schema(arr.type))


def _as_array(table: pa.Table, null: pa.Array | None = None) -> pa.Array:
    """``table`` as the key; ``null``: where a struct key is null (its fields then are too)."""
    t = _as_type(table.schema)
    if not pa.types.is_struct(t):
        return table.column(0).combine_chunks()
    return struct_array([c.combine_chunks() for c in table.columns], t, table.num_rows, mask=null)


def _fit(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """``arr`` as ``t`` (no cast when it is: Arrow refuses to view a struct with null rows and a
    required field as its own type)."""
    return arr if arr.type.equals(t) else arr.cast(t)


class _HoistKey(HoistField):
    """The key (struct or primitive) as the one field ``field`` of a struct."""

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        return pa.schema([pa.field(self.field, _as_type(s))])

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        if self.field not in t.names:
            raise ConfigError("iceberg.tables.key-column", str(t), f"a struct key column with the field {self.field!r} "
                              "that HoistField$Key makes")
        return _as_schema(t.field(self.field).type)

    def apply(self, table: pa.Table, out: pa.Schema, null: pa.Array | None = None) -> pa.Table:
        return pa.Table.from_arrays([_fit(_as_array(table, null), out.field(0).type)], schema=out)


class _InsertKey:
    """InsertField$Key: a struct key with the record's topic, partition, offset, timestamp and a
    static value appended as fields, in Connect's order (``!``: required; ``?``, the default: optional)."""

    def __init__(self, spec: TransformSpec) -> None:
        self.fields: list[tuple[pa.Field, str]] = []  # (field, source)
        for what in INSERT_TYPES:
            raw = spec.props.get(f"{what}.field")
            if raw:
                f = pa.field(raw.rstrip("!?"), INSERT_TYPES[what], nullable=not raw.endswith("!"))
                self.fields.append((f, f"static:{spec.props['static.value']}" if what == "static" else what))
        self.names = {f.name for f, _ in self.fields}

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        return pa.schema([*s, *(f for f, _ in self.fields)])

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        return pa.schema([f for f in t if f.name not in self.names])

    def apply(self, table: pa.Table, out: pa.Schema, meta: Mapping[str, pa.Array]) -> pa.Table:
        added: dict[str, pa.Array] = {}
        for f, source in self.fields:
            if source.startswith("static:"):
                added[f.name] = pa.repeat(pa.scalar(source[len("static:"):], pa.string()), table.num_rows)
            elif source == "timestamp":  # epoch ms, null where the record has none
                added[f.name] = meta[source].cast(pa.timestamp("ms", tz="UTC"))
            else:
                added[f.name] = meta[source]
        arrays = [_fit(added[f.name], f.type) if f.name in added
                  else _fit(table.column(f.name).combine_chunks(), f.type) if f.name in table.column_names
                  else pa.nulls(table.num_rows, f.type) for f in out]
        return pa.Table.from_arrays(arrays, schema=out)


class _StructOnly:
    """ReplaceField$Key and Cast$Key of fields need a struct key (Connect fails any other)."""

    def __init__(self, step: ReplaceField | Cast | TimestampConverter | _InsertKey, name: str) -> None:
        self.step, self.name = step, name

    def _check(self, s: pa.Schema) -> None:
        if s.names == [WHOLE]:
            raise ConfigError(f"transforms.{self.name}.type", "$Key", "a struct key here (a ValueToKey or "
                              "HoistField$Key before it): Kafka Connect fails every record with another key")

    def out_schema(self, s: pa.Schema) -> pa.Schema:
        self._check(s)
        return self.step.out_schema(s)

    def in_schema(self, t: pa.Schema) -> pa.Schema:
        return self.step.in_schema(t)


class KeyChain:
    """The $Key transforms after the chain's last ValueToKey, in order."""

    def __init__(self, specs: Sequence[TransformSpec]) -> None:
        last = max((i for i, s in enumerate(specs) if s.kind == "value-to-key"), default=-1)
        self.steps: list[_HoistKey | _StructOnly | Cast | TimestampConverter] = []
        for s in specs[last + 1:]:
            if s.kind == "hoist-field-key":
                self.steps.append(_HoistKey(s))
            elif s.kind == "replace-field-key":
                self.steps.append(_StructOnly(ReplaceField(s), s.name))
            elif s.kind == "cast-key":
                cast = Cast(s, numbers_first=False)  # the key's fields are not decoded from JSON here
                whole = ":" not in s.props["spec"]
                if whole:
                    cast.casts = {WHOLE: s.props["spec"].strip().lower()}
                self.steps.append(cast if whole else _StructOnly(cast, s.name))
            elif s.kind == "insert-field-key":
                self.steps.append(_StructOnly(_InsertKey(s), s.name))
            elif s.kind == "timestamp-converter-key":
                conv = TimestampConverter(s)
                conv.field = conv.field or WHOLE
                self.steps.append(conv if conv.field == WHOLE else _StructOnly(conv, s.name))

    def __bool__(self) -> bool:
        return bool(self.steps)

    def metadata(self) -> set[str]:
        """The Kafka metadata InsertField$Key adds (topic, partition, offset, timestamp)."""
        return {source for step in self.steps if isinstance(step, _StructOnly) and isinstance(step.step, _InsertKey)
                for _, source in step.step.fields if not source.startswith("static:")}

    def out_type(self, t: pa.DataType) -> pa.DataType:
        """The key column's type for a key built as ``t``."""
        s = _as_schema(t)
        for step in self.steps:
            s = step.out_schema(s)
        return _as_type(s)

    def _schemas(self, t: pa.DataType) -> list[pa.Schema]:
        out = [_as_schema(t)]
        for step in reversed(self.steps):
            out.insert(0, step.in_schema(out[0]))
        return out

    def in_type(self, t: pa.DataType) -> pa.DataType:
        """The key to build for a table whose key column is ``t``."""
        return _as_type(self._schemas(t)[0])

    def apply(self, keys: pa.Array, t: pa.DataType,
              meta: Mapping[str, pa.Array] | None = None) -> tuple[pa.Array, Failed]:
        """``keys`` (built as :meth:`in_type` of ``t``) as the key column ``t``; the rows Cast or
        TimestampConverter could not convert (row, reason, field of the key; "" for the whole
        key). ``meta``: :meth:`metadata`'s arrays for the rows of ``keys``."""
        table = _as_table(keys)
        # a null struct key stays null through ReplaceField, InsertField, Cast and TimestampConverter
        # (Connect passes a null key); HoistField makes it a struct of one null field
        null = keys.is_null() if pa.types.is_struct(keys.type) and keys.null_count else None
        failed: Failed = []
        for step, out in zip(self.steps, self._schemas(t)[1:], strict=True):
            inner = step.step if isinstance(step, _StructOnly) else step
            if isinstance(inner, (Cast, TimestampConverter)):
                table, bad = inner.convert(table, out)
                failed += [(row, reason, "" if name == WHOLE else name) for row, reason, name in bad]
            elif isinstance(inner, _InsertKey):
                table = inner.apply(table, out, meta or {})
            elif isinstance(inner, _HoistKey):
                table, null = inner.apply(table, out, null), None
            else:
                table = inner.apply(table, out)
        return _as_array(table, null), failed
