"""Record keys in the schema-registry wire format (``key.converter`` = a registry converter with
``iceberg.tables.key-column``): :class:`RegistryKeys`, the key column of a fetch decoded in bulk
as values are (:class:`agents.formats.registry_values.RegistryValues`, one decode per schema id).

The key column's type is the key schema's: a record (Avro), a message (Protobuf) or an object
(JSON Schema) is a struct of its fields; a primitive schema (Avro ``"string"``, ``"long"``, an
enum...; JSON Schema ``{"type": "string"}``...) is that scalar. A primitive schema is planned as a
one-field record named as the key column: Avro's binary encoding of such a record is the field's
own, so the payloads decode unchanged; a JSON Schema key's payloads are wrapped in one object in
bulk (Arrow's binary join). An auto-created table takes the newest key schema id seen so far.

A null key is a null key column (Kafka's keyless records). A key that does not decode (a bad
frame, an id the registry does not hold, a payload that does not match) makes its record a reject
naming the key column and why.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import IcebergType, StructType

from agents.convert import Reject, struct_array
from agents.formats.registry_values import ReferenceLike, RegisteredLike, RegistryValues, SchemaById
from icesink.shared.registry_settings import ApicurioHeaders, DecodeOptions


@dataclass(frozen=True)
class _Wrapped:
    """A primitive key schema, as a one-field record (or object) named as the key column."""

    type: str
    text: str
    references: Sequence[ReferenceLike]


class RegistryKeys(RegistryValues):
    """Registry-framed keys decoded per schema id into one key column named ``column``."""

    def __init__(self, schema_of: SchemaById, column: str, kind: str = "avro",
                 options: DecodeOptions | None = None, headers: ApicurioHeaders | None = None) -> None:
        """``headers``: Apicurio's headers mode, the keys' ids in ``apicurio.key.*`` record headers."""
        self.key_name = column
        self._key_schema_of = schema_of
        self.scalar: set[int] = set()  # schema ids of primitive key schemas (planned wrapped)
        super().__init__(self._wrapped_schema, kind, options, headers)

    async def _wrapped_schema(self, schema_id: int) -> RegisteredLike | None:
        found = await self._key_schema_of(schema_id)
        if found is None or self.kind == "protobuf":
            return found
        try:
            root: Any = json.loads(found.text)
        except ValueError:
            return found  # its plan says why it is not valid
        if self.kind == "avro" and not (isinstance(root, dict) and root.get("type") in ("record", "error")):
            self.scalar.add(schema_id)
            text = json.dumps({"type": "record", "name": "icesink_key",
                               "fields": [{"name": self.key_name, "type": root}]})
            return _Wrapped(found.type, text, found.references)
        if self.kind == "json" and isinstance(root, dict) and "$ref" not in root and root.get("type") != "object":
            self.scalar.add(schema_id)
            inner = {k: v for k, v in root.items() if k not in ("$schema", "$id")}
            text = json.dumps({"type": "object", "properties": {self.key_name: inner}, "required": [self.key_name]})
            return _Wrapped(found.type, text, found.references)
        return found

    def _payloads(self, schema_id: int, payloads: list[bytes]) -> list[bytes]:
        if self.kind != "json" or schema_id not in self.scalar:
            return payloads
        head = pa.scalar(b'{' + json.dumps(self.key_name).encode() + b':', pa.binary())
        wrapped = pc.binary_join_element_wise(head, pa.array(payloads, pa.binary()),
                                              pa.scalar(b"}", pa.binary()), pa.scalar(b"", pa.binary()))
        return wrapped.to_pylist()  # type: ignore[no-any-return]

    def key_type(self) -> IcebergType | None:
        """The key column's Iceberg type: the newest key schema id's seen so far (None: none yet)."""
        known = [(k, p) for k, p in self.plans.items() if not isinstance(p, str)]
        if not known:
            return None
        (schema_id, _), plan = max(known, key=lambda kp: kp[0])
        if schema_id in self.scalar:
            return plan.iceberg.fields[0].field_type
        return StructType(*plan.iceberg.fields)

    def key_column(self, keys: Sequence[bytes | None], t: pa.DataType) -> tuple[pa.Array, list[Reject]]:
        """The keys as a column of type ``t`` (the table's key column), null where a key is null;
        keys that do not decode are rejects naming the column."""
        n = len(keys)
        null = np.fromiter((k is None for k in keys), np.bool_, n)
        present = np.flatnonzero(~null)
        struct = pa.types.is_struct(t)
        target = pa.schema(list(t)) if struct else pa.schema([pa.field(self.key_name, t)])
        got = self.convert([keys[i] for i in present.tolist()], target)  # type: ignore[misc]
        rows = present[got.indices.to_numpy(zero_copy_only=False)] if len(got.indices) else np.array([], np.int64)
        rejects = [Reject(int(present[r.index]), f"record key: {r.reason}", self.key_name) for r in got.rejects]
        table = got.table
        if struct:
            values: pa.Array = struct_array([table.column(f.name).combine_chunks() for f in t], t, table.num_rows)
        else:
            values = table.column(0).combine_chunks() if table.num_rows else pa.array([], t)
        # scatter the decoded rows into n slots (nulls elsewhere): take with an index that is null where none
        where = np.full(n, -1, np.int64)
        where[rows] = np.arange(len(rows))
        index = pa.array(where, mask=where < 0)
        return values.take(index), rejects

