"""A worker's record format (:class:`RecordFormat`): plain JSON, Connect envelopes, string or
bytes values or a transform's values, plus the key and metadata columns, per its settings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import NestedField

from agents.convert import Converted, EpochUnit, Reject, check_schema, decode_json, infer_schema
from agents.formats.connect_schema import ConnectSchemaError, connect_arrow_schema, connect_iceberg_schema
from agents.formats.envelopes import Envelopes, decode_envelopes, split_envelope
from agents.formats.extras import Extras, assemble, metadata_arrays
from agents.formats.raw import RawValues
from agents.formats.registry_keys import RegistryKeys
from agents.formats.registry_values import RegistryValues
from agents.transforms.keys import KeyChain
from agents.transforms.values import ValueChain
from icesink.shared.config import BYTES_CONVERTER, JSON_CONVERTER, Settings
from icesink.shared.errors import ConfigError
from icesink.shared.registry_settings import is_registry_converter
from icesink.shared.schema_changes import iceberg_schema
from icesink.shared.transform_settings import inserted_fields
from icesink.shared.writable_types import arrow_only_column


#: Schema-driven evolution (agents.evolution.Growth): the stated schemas of a batch's record
#: groups -> the table schema to decode the batch against.
Grow: TypeAlias = Callable[[Sequence[pa.Schema]], pa.Schema]
#: Decodes the value columns of a batch against a schema, growing it first if given a Grow.
ValueDecoder: TypeAlias = Callable[[pa.Schema, "Grow | None"], Converted]


class RecordFormat:
    """How a worker turns a partition's messages into rows of one table, per its settings."""

    def __init__(self, settings: Settings, *, registry: RegistryValues | None = None,
                 keys: RegistryKeys | None = None) -> None:
        """``registry``: the schema-registry values' decoder, for a registry converter; ``keys``:
        the registry keys' decoder, for a registry key converter with a key column."""
        if (registry is None) == is_registry_converter(settings.value_converter):
            raise ValueError(f"record format: a registry decoder is for a registry converter "
                             f"({settings.value_converter}: {'none' if registry is None else 'one'} given)")
        # JSON values, or text values that JsonToMapTransform reads as JSON
        json = settings.value_converter == JSON_CONVERTER or any(t.kind == "json-to-map" for t in settings.transform_chain)
        self.envelope = json and settings.value_converter_schemas_enable
        #: Schema-registry values (agents/formats/registry_values.py), decoded per schema id.
        self.registry = registry
        #: String or bytes values (None: JSON or registry values), in one column.
        self.raw = None if json or registry is not None else RawValues(
            settings.value_column, settings.value_converter == BYTES_CONVERTER)
        metadata, nested, headers = settings.metadata_columns or (None, False, False)
        self.extras = Extras(settings.key_column, settings.key_converter == BYTES_CONVERTER, metadata, nested,
                             registry_keys=keys, headers=headers, inserted=inserted_fields(settings.transform_chain),
                             key_from_value=any(t.kind == "value-to-key" for t in settings.transform_chain))
        self.keys = keys
        #: Value transforms (ReplaceField, CopyValue, ...: agents/transforms/values.py) on the decoded
        #: columns; ValueToKey's key column with them.
        self.values = ValueChain(settings.transform_chain, schemas=self.envelope or registry is not None,
                                 key_column=settings.key_column)
        #: The $Key transforms on the key column (agents/transforms/keys.py), after the last ValueToKey.
        self.key_chain = KeyChain(settings.transform_chain) if settings.key_column else KeyChain(())
        self.plain = json and not self.envelope and not self.extras.names() and not self.values
        self.fold_case = settings.schema_case_insensitive
        self._envelopes = Envelopes()

    def table_schema(
        self, values: Sequence[bytes], *, timestamp_fields: re.Pattern[str] | None = None
    ) -> pa.Schema | Schema | None:
        """The schema of an auto-created table for these records (None: no record tells it).
        ``timestamp_fields``: a regex of JSON string fields to create as timestamps."""
        if self.plain:
            return infer_schema(values, timestamp_fields=timestamp_fields)
        if self.raw is not None:
            return self.with_extras(self.raw.schema())
        if self.registry is not None:
            found = self.registry.table_schema(values)
            return None if found is None else self.with_extras(found)
        if self.envelope:
            schema = None
            for value in values:
                parts = split_envelope(value)
                if isinstance(parts, str):
                    continue
                try:
                    schema = connect_iceberg_schema(parts[0])
                    break
                except ConnectSchemaError:
                    continue  # that record is a reject
            if schema is None:
                return None
            return self.with_extras(schema, values)
        else:
            inferred = infer_schema(values, timestamp_fields=timestamp_fields)
            schema = inferred if self.values else iceberg_schema(inferred)  # the transforms map Arrow types
        return self.with_extras(schema)

    def with_extras(self, schema: pa.Schema | Schema, values: Sequence[bytes] = ()) -> Schema:
        """An auto-created table's schema: the value columns, then the key and metadata columns.
        Raises UnsupportedTypeError naming a column that cannot be filled or written. ``values``:
        the records', for a transform whose types are in them (MongoDebeziumTransform)."""
        extras = self.extras.iceberg_fields()
        if self.values:  # the value's fields after the transforms
            arrow = schema_to_pyarrow(schema, include_field_ids=False) if isinstance(schema, Schema) else schema
            key = self.values.key_struct(arrow)
            if key is not None:  # ValueToKey's key column: a struct of value fields
                t = iceberg_schema(pa.schema([pa.field("key", self.key_chain.out_type(key))])).fields[0].field_type
                extras = [NestedField(0, f.name, t) if f.name == self.values.key_column else f for f in extras]
            schema = self.values.out_schema(arrow, values)
        if self.key_chain and self.values.key_column is None:  # the key as consumed, through the $Key transforms
            built = pa.binary() if self.extras.key_binary else pa.string()
            if self.extras.registry_keys is not None:  # the key schema's type
                found = next(f.field_type for f in extras if f.name == self.extras.key_column)
                one = assign_fresh_schema_ids(Schema(NestedField(0, "key", found, required=False)))
                built = schema_to_pyarrow(one, include_field_ids=False).field(0).type
            t = iceberg_schema(pa.schema([pa.field("key", self.key_chain.out_type(built))])).fields[0].field_type
            extras = [NestedField(0, f.name, t) if f.name == self.extras.key_column else f for f in extras]
        schema = iceberg_schema(schema)
        check_schema(schema_to_pyarrow(schema))  # raises UnsupportedTypeError naming the column
        schema = assign_fresh_schema_ids(Schema(*schema.fields, *extras))
        arrow_only_column(schema)  # likewise for types no writer can write (Spark or pyarrow)
        return schema

    def convert(
        self, messages: Sequence[Any], values: Sequence[bytes], target: pa.Schema | None, *,
        epoch_unit: EpochUnit = "ms", grow: Grow | None = None, decode_values: ValueDecoder | None = None,
    ) -> Converted:
        """Rows of ``target`` (a table's Arrow schema) for ``messages``; the rest are rejects.
        ``target`` None: the table does not exist and no record could create it.

        ``grow`` (schema-driven evolution, envelope or registry values, or ``decode_values``): given the
        stated schemas of the value columns, returns the table schema to decode against.
        ``decode_values``: decodes the value columns instead of this format (a transform such
        as Debezium's); the key and metadata columns are added to its rows all the same."""
        if self.plain and decode_values is None:
            assert target is not None
            return decode_json(values, target, epoch_unit=epoch_unit, fold_case=self.fold_case)
        extra = self.extras.names()
        real, full = target, self._built(target)  # real: with the key column after the $Key transforms

        def values_of(schema: pa.Schema) -> pa.Schema:
            """The columns to decode for ``schema``'s value columns (before the value transforms)."""
            own = pa.schema([f for f in schema if f.name not in extra], metadata=schema.metadata) if extra else schema
            return self.values.in_schema(own, self._key_type(schema)) if self.values else own

        def grow_values(wanted: Sequence[pa.Schema]) -> pa.Schema:
            nonlocal full, real
            assert grow is not None
            # the key and metadata columns never evolve: not in the values
            full = real = grow([self.values.out_schema(w) for w in wanted] if self.values else wanted)
            full = self._built(real)
            assert full is not None
            return values_of(full)

        value_schema = values_of(full) if full is not None else None
        if decode_values is not None:
            assert value_schema is not None
            converted = decode_values(value_schema, grow_values if grow is not None else None)
        elif self.raw is not None:
            assert value_schema is not None
            converted = self.raw.convert(values, value_schema)
        elif self.registry is not None:
            if grow is not None and value_schema is not None:
                value_schema = grow_values(self.registry.wanted(values))
            converted = self.registry.convert(values, value_schema)  # None: no table, every record a reject
        elif self.envelope:
            groups, rejects = self._envelopes.group([m.value for m in messages])
            if grow is not None and value_schema is not None:
                value_schema = grow_values([w for g in groups if (w := connect_arrow_schema(g.schema)) is not None])
            converted = decode_envelopes(groups, rejects, value_schema, fold_case=self.fold_case)
        else:
            assert value_schema is not None
            converted = decode_json(self.values.wrap(values), value_schema, epoch_unit=epoch_unit, fold_case=self.fold_case)
        if self.values and full is not None:
            own = pa.schema([f for f in full if f.name not in extra], metadata=full.metadata)
            converted = self.values.apply(converted, own, self._key_type(full),
                                          [m.key for m in messages] if self.values.needs_keys else ())
        if full is None or not extra:
            return converted
        columns, key_rejects = self.extras.columns(messages, full)
        assert real is not None
        return self._key_transforms(assemble(converted, columns, key_rejects, full), real, messages)

    def _built(self, target: pa.Schema | None) -> pa.Schema | None:
        """``target`` with its key column as the key is built before the $Key transforms."""
        name = self.extras.key_column
        if not self.key_chain or target is None or name not in target.names:
            return target
        i = target.get_field_index(name)
        built = target.set(i, target.field(i).with_type(self.key_chain.in_type(target.field(i).type)))
        return built.with_metadata(target.metadata) if target.metadata else built

    def _key_transforms(self, converted: Converted, target: pa.Schema, messages: Sequence[Any]) -> Converted:
        """``converted`` with its key column through the $Key transforms; a key Cast fails is a reject."""
        name = self.extras.key_column
        if not self.key_chain or name is None or name not in converted.table.column_names:
            return converted
        table = converted.table
        i = table.schema.get_field_index(name)
        wanted = self.key_chain.metadata()
        meta = {k: v.take(converted.indices) for k, v in metadata_arrays(messages, wanted).items()} if wanted else {}
        keys, failed = self.key_chain.apply(table.column(i).combine_chunks(), target.field(name).type, meta)
        table = table.set_column(i, target.field(name), keys)
        rejects, indices = list(converted.rejects), converted.indices
        if failed:
            at = indices.to_numpy(zero_copy_only=False)
            first: dict[int, tuple[str, str]] = {}
            for row, reason, field in failed:
                first.setdefault(row, (f"record key: {reason}", f"{name}.{field}" if field else name))
            rejects = sorted(rejects + [Reject(int(at[r]), why, col) for r, (why, col) in first.items()],
                             key=lambda r: r.index)
            keep = np.ones(table.num_rows, np.bool_)
            keep[list(first)] = False
            table, indices = table.filter(pa.array(keep)), indices.filter(pa.array(keep))
        return Converted(table if table.schema.equals(target) else table.cast(target), indices, tuple(rejects))

    def _key_type(self, schema: pa.Schema) -> pa.StructType | None:
        """ValueToKey's key column type in a table of ``schema`` (None: no ValueToKey or column)."""
        name = self.values.key_column
        if name is None or name not in schema.names:
            return None
        t = schema.field(name).type
        if not pa.types.is_struct(t):
            raise ConfigError("iceberg.tables.key-column", name, f"a struct column for ValueToKey's key (the table has {t})")
        return t
