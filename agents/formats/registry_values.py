"""Values in the schema-registry wire format (``value.converter`` = a registry converter,
icesink/shared/registry_settings.py): :class:`RegistryValues`.

A fetch's values are framed in bulk (:func:`agents.formats.registry_wire.frames`); before the
fetch is decoded, :meth:`RegistryValues.prepare` asks the registry for each schema id not seen
yet (once per id for the life of the replica: the client caches; a registry outage waits there,
with capped backoff, and the fetch with it: no record is lost or skipped). Decoding is then
synchronous, one bulk decode per schema id (:func:`agents.formats.avro.decode_avro`,
:func:`agents.formats.protobuf.decode_protobuf` per schema id and message indexes: the frame's
index list picks the message, :func:`agents.formats.json_schema.decode_json_schema`), the groups'
rows put back in input order in one Arrow table. A Protobuf schema is its ``.proto`` text compiled
by protoc (agents/formats/proto_text.py), its references written by import name.

What each schema id gives is its plan (:func:`agents.formats.avro.avro_plan`) or the reason its
records are rejects: an id the registry does not hold (404), a schema of another type, a schema
that cannot map to a table. A value not in the wire format is a reject saying what was found.
Each reject names the schema id; the dead letters add topic, partition and offset.

Evolution: the plans' Arrow schemas are the records' stated schemas, handed to the record
format's ``grow`` as Connect envelopes' are (agents/evolution.py ``Growth``), so a new schema id
with an added field, a wider type or a field made optional evolves the table, and records of
two versions in one fetch land together.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2
from pyiceberg.schema import Schema

from agents.convert import Converted, Reject
from agents.formats.avro import AvroPlan, avro_plan, decode_avro
from agents.formats.json_schema import JsonSchemaPlan, decode_json_schema, json_schema_plan
from agents.formats.proto_text import compile_proto
from agents.formats.protobuf import ProtobufPlan, decode_protobuf, protobuf_plan
from agents.formats.registry_wire import Frames, RegistrySchemaError, Selector, frames
from agents.formats.apicurio_headers import headers_to_frames
from icesink.shared.registry_settings import ApicurioHeaders, DecodeOptions

Plan = AvroPlan | ProtobufPlan | JsonSchemaPlan
#: A plan's key: (schema id, Protobuf message indexes or Apicurio's Ref name; () for Avro and JSON Schema).
Key = tuple[int, Selector]
#: The registry's type of each decoder's schemas (``schemaType``).
_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json": "JSON"}


class RegisteredLike(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def text(self) -> str: ...

    @property
    def references(self) -> Sequence[ReferenceLike]: ...


class ReferenceLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def schema(self) -> RegisteredLike: ...


#: The registry's answer for a schema id (agents/registry_client.py RegistryClient.schema):
#: None for an id it does not hold; waits and retries through an outage.
SchemaById = Callable[[int], Awaitable["RegisteredLike | None"]]


class RegistryValues:
    """Registry-framed values decoded per schema id; ``schema_of`` asks the registry."""

    def __init__(self, schema_of: SchemaById, kind: str = "avro", options: DecodeOptions | None = None,
                 headers: ApicurioHeaders | None = None) -> None:
        """``headers``: Apicurio's headers mode (ids in record headers; :meth:`framed`)."""
        if kind not in _TYPES:
            raise ValueError(f"registry values: expected a decoder of {', '.join(_TYPES)}, found {kind!r}")
        self.schema_of = schema_of
        self.kind = kind
        self.options = options or DecodeOptions()
        self.headers = headers
        self.plans: dict[Key, Plan | str] = {}  # (schema id, indexes) -> its plan, or why its records are rejects
        self._last: tuple[Sequence[bytes], Frames] | None = None  # a fetch's values are framed once

    def _frames(self, values: Sequence[bytes]) -> Frames:
        if self._last is None or self._last[0] is not values:
            self._last = (values, frames(values, protobuf=self.kind == "protobuf", id_bytes=8 if self.headers else 4,
                                         notes=self.headers is not None))
        return self._last[1]

    def framed(self, values: Sequence[bytes], headers: Sequence[Any]) -> Sequence[bytes]:
        """The values as this decoder reads them: in headers mode each framed from its record's
        ``headers`` in bulk (agents/formats/apicurio_headers.py), else ``values`` themselves."""
        if self.headers is None:
            return values
        return headers_to_frames(values, headers, self.headers)  # type: ignore[return-value]

    async def prepare(self, values: Sequence[bytes]) -> None:
        """Look up the schema ids of ``values`` not seen yet (waiting through a registry outage)."""
        for key in _keys(self._frames(values)):
            if key not in self.plans:
                self.plans[key] = await self._plan(*key)

    async def _plan(self, schema_id: int, indexes: Selector = ()) -> Plan | str:
        found = await self.schema_of(schema_id)
        if found is None:
            hint = (" (an 8-byte Apicurio global id? set the producer's apicurio.registry.as-confluent=true)"
                    if schema_id == 0 else "")
            return f"schema id {schema_id} is unknown to the schema registry{hint}"
        if found.type != _TYPES[self.kind]:
            return f"schema id {schema_id} is a {found.type} schema; value.converter reads {_TYPES[self.kind]}"
        try:
            if self.kind == "protobuf":  # protoc off the event loop (once per schema id: cached)
                main, refs = await asyncio.to_thread(compile_proto, found.text, _reference_pairs(found))
                if isinstance(indexes, str):  # Apicurio's Ref: a top-level message by its simple name
                    names = [m.name for m in descriptor_pb2.FileDescriptorProto.FromString(main).message_type]
                    if indexes not in names:
                        return (f"schema id {schema_id}: the value's Ref names message {indexes!r}, not a top-level "
                                f"message of the schema ({', '.join(names) or 'none'})")
                    indexes = (names.index(indexes),)
                return protobuf_plan(base64.b64encode(main).decode(), indexes,
                                     tuple((n, base64.b64encode(r).decode()) for n, r in refs),
                                     wrapper_for_nullables=self.options.wrapper_for_nullables,
                                     index_for_unions=self.options.index_for_unions,
                                     int_for_enums=self.options.int_for_enums)
            if self.kind == "json":
                return json_schema_plan(found.text, _reference_pairs(found),
                                        optional_for_nonrequired=self.options.optional_for_nonrequired)
            return avro_plan(found.text, _reference_texts(found))
        except RegistrySchemaError as e:
            return f"schema id {schema_id}: {e}"

    def _payloads(self, schema_id: int, payloads: list[bytes]) -> list[bytes]:
        """The payloads of ``schema_id`` as its plan decodes them (a key's may be wrapped: agents/formats/registry_keys.py)."""
        return payloads

    def _known(self, values: Sequence[bytes]) -> list[Plan]:
        keys = _keys(self._frames(values))
        return [p for k in keys if not isinstance(p := self.plans.get(k), str | None)]

    def table_schema(self, values: Sequence[bytes]) -> Schema | None:
        """An auto-created table's value columns: the newest (highest) schema id's (None: no record has one)."""
        plans = self._known(values)
        return plans[-1].iceberg if plans else None

    def wanted(self, values: Sequence[bytes]) -> list[pa.Schema]:
        """The stated schemas of ``values``' schema ids, oldest first (for evolution)."""
        return [p.arrow for p in self._known(values)]

    def _decodable(self, f: Frames, rejects: list[Reject]) -> Iterator[tuple[int, npt.NDArray[np.int64], list[int], Plan]]:
        """Each plan key's records that have a plan: (schema id, rows of ``f``, their input
        positions, plan); the records of keys without one are added to ``rejects`` with the reason."""
        for (schema_id, indexes), rows in _groups(f).items():
            positions = f.positions[rows].tolist()
            plan = self.plans.get((schema_id, indexes))
            if plan is None:  # prepare() was not called for these values: a bug, not a data error
                raise RuntimeError(f"registry values: schema id {schema_id} decoded before it was looked up")
            if isinstance(plan, str):
                rejects += [Reject(p, plan, None) for p in positions]
                continue
            yield schema_id, rows, positions, plan

    def convert(self, values: Sequence[bytes], target: pa.Schema | None) -> Converted:
        """Rows of ``target`` (the table's value columns), in input order; the rest rejects.
        ``target`` None: no table (no record's schema could create one): every record is a reject."""
        if target is None:
            out = self.convert(values, pa.schema([]))
            why = "no table: no record of this fetch has a schema the registry holds and that maps to a table"
            every = [*out.rejects, *(Reject(int(i), why, None) for i in out.indices.to_pylist())]
            return Converted(pa.table({}), pa.array([], pa.int64()), tuple(sorted(every, key=lambda r: r.index)))
        f = self._frames(values)
        rejects: list[Reject] = list(f.rejects)
        parts: list[Converted] = []
        for schema_id, rows, positions, plan in self._decodable(f, rejects):
            out = _decode(self._payloads(schema_id, [f.payload(int(k)) for k in rows]), plan, target,
                          schema_id=schema_id, positions=positions)
            parts.append(out)
            rejects += out.rejects
        return _in_input_order(parts, rejects, target)

    def column(self, values: Sequence[bytes], path: str) -> Converted:
        """The field at dotted ``path`` of every record, as text (a one-column table; null where a
        schema id's records lack it), for routing: each schema id's records decoded in bulk
        against just that field; numbers and enums as their text. Records that do not decode,
        or whose field is not text, a number or a boolean, are rejects naming why."""
        f = self._frames(values)
        rejects: list[Reject] = list(f.rejects)
        parts: list[Converted] = []
        for schema_id, rows, positions, plan in self._decodable(f, rejects):
            projected = _project(plan.arrow, path)
            if projected is None:  # no such field in this version: no route
                parts.append(Converted(pa.table({path: pa.nulls(len(positions), pa.string())}),
                                       pa.array(positions, pa.int64()), ()))
                continue
            got = _decode([f.payload(int(k)) for k in rows], plan, projected, schema_id=schema_id,
                              positions=positions)
            leaf = got.table.column(0).combine_chunks()
            for name in path.split(".")[1:]:
                leaf = pc.struct_field(leaf, name)
            if not (pa.types.is_string(leaf.type) or pa.types.is_integer(leaf.type)
                    or pa.types.is_boolean(leaf.type) or pa.types.is_large_string(leaf.type)):
                reason = f"schema id {schema_id}: field {path} is {leaf.type}, not text or a number"
                rejects += [Reject(p, reason, path) for p in positions]
                continue
            parts.append(Converted(pa.table({path: leaf.cast(pa.string())}), got.indices, ()))
            rejects += got.rejects
        return _in_input_order(parts, rejects, pa.schema([pa.field(path, pa.string())]))


def _in_input_order(parts: Sequence[Converted], rejects: list[Reject], schema: pa.Schema) -> Converted:
    """The schema ids' rows (``parts``) as one table in input order, with all the rejects."""
    rejects.sort(key=lambda r: r.index)
    if not parts:
        return Converted(schema.empty_table(), pa.array([], pa.int64()), tuple(rejects))
    table = pa.concat_tables([p.table for p in parts])
    index = pa.concat_arrays([p.indices for p in parts]) if len(parts) > 1 else parts[0].indices
    if len(parts) > 1:  # the groups' rows back in input order
        order = pa.array(np.argsort(index.to_numpy(zero_copy_only=False), kind="stable"))
        table, index = table.take(order), index.take(order)
    return Converted(table, index, tuple(rejects))


def _project(schema: pa.Schema, path: str) -> pa.Schema | None:
    """The one field at dotted ``path`` of ``schema``, with its structs around it (None: no such field)."""
    first, *rest = path.split(".")
    if schema.get_field_index(first) < 0:
        return None
    fields = [schema.field(first)]
    for name in rest:
        t = fields[-1].type
        if not pa.types.is_struct(t) or t.get_field_index(name) < 0:
            return None
        fields.append(t.field(name))
    inner = fields[-1]
    for outer in reversed(fields[:-1]):
        inner = outer.with_type(pa.struct([inner]))
    return pa.schema([inner])


def _reference_texts(schema: RegisteredLike) -> tuple[str, ...]:
    """The texts of the schemas ``schema`` references, each after those it references."""
    out: list[str] = []

    def walk(s: RegisteredLike) -> None:
        for ref in s.references:
            walk(ref.schema)
            if ref.schema.text not in out:
                out.append(ref.schema.text)

    walk(schema)
    return tuple(out)


def _keys(f: Frames) -> list[Key]:
    """The plan keys of ``f``'s values, ascending (the last: the newest schema id)."""
    if f.indexes is None:
        return [(int(i), ()) for i in np.unique(f.ids).tolist()]
    return sorted(set(zip(f.ids.tolist(), f.indexes, strict=True)))


def _groups(f: Frames) -> dict[Key, npt.NDArray[np.int64]]:
    """Kept values by plan key (row numbers into ``f``'s arrays, ascending)."""
    by_id = f.groups()
    if f.indexes is None:
        return {(i, ()): rows for i, rows in by_id.items()}
    out: dict[Key, list[int]] = {}
    for i, rows in by_id.items():
        for r in rows.tolist():
            out.setdefault((i, f.indexes[r]), []).append(r)
    return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}


def _decode(payloads: Sequence[bytes], plan: Plan, target: pa.Schema, *, schema_id: int,
            positions: Sequence[int]) -> Converted:
    if isinstance(plan, ProtobufPlan):
        return decode_protobuf(payloads, plan, target, schema_id=schema_id, positions=positions)
    if isinstance(plan, JsonSchemaPlan):
        return decode_json_schema(payloads, plan, target, schema_id=schema_id, positions=positions)
    return decode_avro(payloads, plan, target, schema_id=schema_id, positions=positions)


def _reference_pairs(schema: RegisteredLike) -> tuple[tuple[str, str], ...]:
    """(import name, text) of the schemas ``schema`` references, transitively, each after those it references."""
    out: dict[str, str] = {}

    def walk(s: RegisteredLike) -> None:
        for ref in s.references:
            walk(ref.schema)
            out.setdefault(ref.name, ref.schema.text)

    walk(schema)
    return tuple(out.items())
