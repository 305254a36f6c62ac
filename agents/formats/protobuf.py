"""Schema-registry Protobuf: the Iceberg and Arrow schemas of a registered message
(:func:`protobuf_plan`), and the payloads of one schema id and message decoded in bulk
(:func:`decode_protobuf`). No I/O.

The schema is what the registry serves for ``GET /schemas/ids/{id}?format=serialized``: a base64
``FileDescriptorProto``, its imports given as references (import name -> base64 descriptor) or, for
protobuf's well-known types, taken from protobuf's own descriptors. It is built in a private
``DescriptorPool`` (nothing registered process-wide), and the message is the one the frame's message
indexes name (``[1, 0]``: the file's second message, its first nested one).

The mapping is the one the reference sink gets from Confluent's ProtobufConverter
(``io.confluent.connect.protobuf.ProtobufData.toConnectSchema`` with its default settings, then
Connect to Iceberg): every field is optional; int32, sint32, sfixed32 are int; uint32, fixed32 and
the 64-bit integers long (uint64 above 2^63 - 1 wraps negative, as Java's long); float, double,
bool, string; bytes binary; an enum a string (its symbol; a number the enum lacks is
``UNKNOWN_ENUM_VALUE_<Enum>_<n>``, as Java names it); a message a struct; ``repeated`` a list; a
``map<K, V>`` a map; a ``oneof`` a struct named as the oneof with one field per branch (the one set
filled, the struct null when none is); ``google.protobuf.Timestamp`` a timestamptz; ``Duration``
its struct of seconds and nanos. Where ProtobufData's default differs from what a user expects:
the wrappers (``Int32Value`` etc.) are their primitive, null when unset (ProtobufData gives
``struct<value>`` unless ``wrapper.for.nullables=true``). A proto3 implicit field that is unset is
its default value (0, "", false), as protobuf says; a proto3 ``optional`` field, an unset message
and a wrapper are null. docs/schema-registry.md ("Protobuf types") has the table.

Decoding: each payload is parsed by protobuf's C parser (upb), then every column is built from the
list of messages at once (``map(attrgetter(name), messages)``, one Arrow array per field, nested
messages, lists and maps recursively on the flattened children), never a dict per record. A payload
that does not parse (truncated, garbage, a string that is not UTF-8) is a :class:`Reject` naming
the schema id, the message and the reason; a Timestamp outside what a table can hold rejects its
record naming the field.
"""

from __future__ import annotations

import base64
import binascii
import functools
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter, methodcaller
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from agents.convert.outcome import Converted, Reject
from agents.formats.registry_wire import RegistrySchemaError

_F = FieldDescriptor
#: Protobuf scalar type -> (Iceberg type, Arrow type its values are read as).
_SCALARS: Final[dict[int, tuple[IcebergType, pa.DataType]]] = {
    _F.TYPE_INT32: (IntegerType(), pa.int32()), _F.TYPE_SINT32: (IntegerType(), pa.int32()),
    _F.TYPE_SFIXED32: (IntegerType(), pa.int32()), _F.TYPE_UINT32: (LongType(), pa.int64()),
    _F.TYPE_FIXED32: (LongType(), pa.int64()), _F.TYPE_INT64: (LongType(), pa.int64()),
    _F.TYPE_SINT64: (LongType(), pa.int64()), _F.TYPE_SFIXED64: (LongType(), pa.int64()),
    _F.TYPE_UINT64: (LongType(), pa.uint64()), _F.TYPE_FIXED64: (LongType(), pa.uint64()),
    _F.TYPE_FLOAT: (FloatType(), pa.float32()), _F.TYPE_DOUBLE: (DoubleType(), pa.float64()),
    _F.TYPE_BOOL: (BooleanType(), pa.bool_()), _F.TYPE_STRING: (StringType(), pa.large_string()),
    _F.TYPE_BYTES: (BinaryType(), pa.large_binary()),
}
_WRAPPERS: Final = {
    "google.protobuf.DoubleValue": _F.TYPE_DOUBLE, "google.protobuf.FloatValue": _F.TYPE_FLOAT,
    "google.protobuf.Int64Value": _F.TYPE_INT64, "google.protobuf.UInt64Value": _F.TYPE_UINT64,
    "google.protobuf.Int32Value": _F.TYPE_INT32, "google.protobuf.UInt32Value": _F.TYPE_UINT32,
    "google.protobuf.BoolValue": _F.TYPE_BOOL, "google.protobuf.StringValue": _F.TYPE_STRING,
    "google.protobuf.BytesValue": _F.TYPE_BYTES,
}
_TIMESTAMP: Final = "google.protobuf.Timestamp"
#: Seconds of a Timestamp a timestamp[us] column holds: years 1 to 9999, as protobuf allows.
_MIN_SECONDS: Final = -62_135_596_800
_MAX_SECONDS: Final = 253_402_300_799


class ProtobufSchemaError(RegistrySchemaError):
    """A Protobuf schema that is malformed or cannot map to a table (its records are data errors)."""


# The reading plan: one node per Protobuf type, built once per message.
@dataclass(frozen=True)
class _Scalar:
    arrow: pa.DataType


@dataclass(frozen=True)
class _Enum:
    name: str
    numbers: pa.Array  # int32: the enum's numbers
    symbols: pa.Array  # string: their names, in the same order


@dataclass(frozen=True)
class _Wrapper:
    arrow: pa.DataType


@dataclass(frozen=True)
class _Timestamp:
    pass


@dataclass(frozen=True)
class _List:
    element: _Type


@dataclass(frozen=True)
class _Map:
    key: _Type
    value: _Type


@dataclass(frozen=True)
class _Field:
    name: str
    type: _Type
    presence: bool  # null when unset (a proto3 optional scalar, a message)

    @property
    def column(self) -> str:
        return self.name


@dataclass(frozen=True)
class _Oneof:
    name: str  # the oneof's
    branches: tuple[_Field, ...]
    column: str  # its struct's field: ``<name>_<index>`` with generate.index.for.unions


@dataclass(frozen=True)
class _Message:
    fields: tuple[_Field | _Oneof, ...]


_Type = _Scalar | _Enum | _Wrapper | _Timestamp | _List | _Map | _Message


@dataclass(frozen=True)
class ProtobufPlan:
    """What one registered message gives: the table's columns and how to read its payloads."""

    iceberg: Schema  # the columns of a table for these records
    arrow: pa.Schema  # the same as Arrow (no field ids): what the payloads decode into
    name: str  # the message's full name
    message: type[Message]  # its class, in a pool of its own
    reader: _Message


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Walk:
    """One pass over a message descriptor giving its Iceberg type and its reading plan."""

    def __init__(self, proto3_optional: frozenset[str], wrappers_as_primitives: bool = True,
                 index_for_unions: bool = False, int_for_enums: bool = False) -> None:
        self._optional = proto3_optional  # full names of proto3 optional fields
        self._primitive_wrappers = wrappers_as_primitives  # wrapper.for.nullables (else struct<value>)
        self._index_for_unions = index_for_unions  # generate.index.for.unions: a oneof's column is name_index
        self._int_for_enums = int_for_enums  # int.for.enums: an enum is its number (int)
        self._visiting: list[str] = []
        self._ids = itertools.count(1)

    def message(self, d: Descriptor, path: str) -> tuple[StructType, _Message]:
        if d.full_name in self._visiting:
            raise ProtobufSchemaError(f"Protobuf schema: {d.full_name} contains itself; a table cannot hold a "
                                      "recursive type", path or None)
        self._visiting.append(d.full_name)
        fields: list[NestedField] = []
        plan: list[_Field | _Oneof] = []
        for oneof in d.oneofs:  # ProtobufData: the real oneofs first, each a struct of its branches
            members = [f for f in oneof.fields if f.full_name not in self._optional]
            if not members:
                continue
            column = f"{oneof.name}_{oneof.index}" if self._index_for_unions else oneof.name
            branches = [self.field(f, _join(path, column), presence=True) for f in members]
            fields.append(NestedField(next(self._ids), column, StructType(*(n for n, _ in branches)),
                                      required=False))
            plan.append(_Oneof(oneof.name, tuple(p for _, p in branches), column))
        for f in d.fields:
            if f.containing_oneof is not None and f.full_name not in self._optional:
                continue
            presence = f.full_name in self._optional or (f.type == _F.TYPE_MESSAGE and not f.is_repeated)
            field, p = self.field(f, path, presence=presence)
            fields.append(field)
            plan.append(p)
        self._visiting.pop()
        return StructType(*fields), _Message(tuple(plan))

    def field(self, f: FieldDescriptor, path: str, *, presence: bool) -> tuple[NestedField, _Field]:
        at = _join(path, f.name)
        if f.is_repeated and f.type == _F.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            kt, kp = self.single(k, f"{at}.key")
            vt, vp = self.single(v, f"{at}.value")
            key_id = next(self._ids)
            t: IcebergType = MapType(key_id, kt, next(self._ids), vt, value_required=False)
            plan: _Type = _Map(kp, vp)
        elif f.is_repeated:
            et, ep = self.single(f, f"{at}[]")
            t, plan = ListType(next(self._ids), et, element_required=False), _List(ep)
        else:
            t, plan = self.single(f, at)
        return NestedField(next(self._ids), f.name, t, required=False), _Field(f.name, plan, presence)

    def single(self, f: FieldDescriptor, path: str) -> tuple[IcebergType, _Type]:
        if f.type == _F.TYPE_ENUM and self._int_for_enums:
            return IntegerType(), _Scalar(pa.int32())
        if f.type == _F.TYPE_ENUM:
            values = f.enum_type.values
            return StringType(), _Enum(f.enum_type.name, pa.array([v.number for v in values], pa.int32()),
                                       pa.array([v.name for v in values], pa.large_string()))
        if f.type in _SCALARS:
            iceberg, arrow = _SCALARS[f.type]
            return iceberg, _Scalar(arrow)
        if f.type != _F.TYPE_MESSAGE:  # proto2 groups
            raise ProtobufSchemaError(f"Protobuf schema: field type {f.type} (a group) is not supported", path)
        name = f.message_type.full_name
        if name == _TIMESTAMP:
            return TimestamptzType(), _Timestamp()
        if name in _WRAPPERS and self._primitive_wrappers:
            iceberg, arrow = _SCALARS[_WRAPPERS[name]]
            return iceberg, _Wrapper(arrow)
        return self.message(f.message_type, path)


def _descriptor_proto(text: str | bytes, what: str) -> descriptor_pb2.FileDescriptorProto:
    try:
        raw = base64.b64decode(text, validate=True)
        return descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError) as e:
        raise ProtobufSchemaError(f"Protobuf schema {what}: not a base64 FileDescriptorProto (the registry's "
                                  f"?format=serialized form): {type(e).__name__}: {e}") from None


def _pool(main: descriptor_pb2.FileDescriptorProto, references: dict[str, descriptor_pb2.FileDescriptorProto],
          ) -> descriptor_pool.DescriptorPool:
    """A private pool holding ``main`` and every file it imports, dependencies first."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(fdp: descriptor_pb2.FileDescriptorProto, chain: tuple[str, ...]) -> None:
        if fdp.name in added:
            return
        if fdp.name in chain:
            raise ProtobufSchemaError(f"Protobuf schema: {fdp.name} imports itself through {' -> '.join(chain)}")
        for dep in fdp.dependency:
            if dep in references:
                add(references[dep], (*chain, fdp.name))
                continue
            try:
                known = descriptor_pool.Default().FindFileByName(dep)
            except KeyError:
                raise ProtobufSchemaError(f"Protobuf schema: {fdp.name} imports {dep}, which no reference of the "
                                          "schema names and which is not a protobuf well-known type") from None
            add(descriptor_pb2.FileDescriptorProto.FromString(known.serialized_pb), (*chain, fdp.name))
        try:
            pool.Add(fdp)
        except (TypeError, ValueError, KeyError) as e:
            raise ProtobufSchemaError(f"Protobuf schema: {fdp.name} does not build: {e}") from None
        added.add(fdp.name)

    add(main, ())
    return pool


def _pick(fdp: descriptor_pb2.FileDescriptorProto, indexes: tuple[int, ...]) -> str:
    """The full name of the message the indexes name."""
    names: list[str] = []
    level: Sequence[descriptor_pb2.DescriptorProto] = fdp.message_type
    for depth, i in enumerate(indexes):
        if not 0 <= i < len(level):
            where = "the file" if depth == 0 else ".".join(names)
            raise ProtobufSchemaError(f"Protobuf message indexes {list(indexes)}: index {i} at depth {depth}, "
                                      f"but {where} has {len(level)} messages")
        names.append(level[i].name)
        level = level[i].nested_type
    return ".".join([fdp.package, *names] if fdp.package else names)


def _proto3_optional(files: Iterable[descriptor_pb2.FileDescriptorProto]) -> frozenset[str]:
    out: set[str] = set()

    def visit(prefix: str, messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
        for m in messages:
            out.update(f"{prefix}.{m.name}.{f.name}".lstrip(".") for f in m.field if f.proto3_optional)
            visit(f"{prefix}.{m.name}", m.nested_type)

    for fdp in files:
        visit(fdp.package, fdp.message_type)
    return frozenset(out)


@functools.lru_cache(maxsize=256)
def protobuf_plan(serialized: str, indexes: tuple[int, ...] = (0,),
                  references: tuple[tuple[str, str], ...] = (), *, wrapper_for_nullables: bool = True,
                  index_for_unions: bool = False, int_for_enums: bool = False) -> ProtobufPlan:
    """The plan of the message ``indexes`` names in a registered Protobuf schema (``serialized``: the
    base64 FileDescriptorProto; ``references``: (import name, base64 FileDescriptorProto) pairs, the
    references' own included). ``wrapper_for_nullables``: the wrappers (``Int32Value``...) are their
    primitive, null when unset; false: ``struct<value>`` as ProtobufData's default.
    ``index_for_unions`` (``generate.index.for.unions``, true by ProtobufData's default): a oneof's
    column is ``<name>_<index>``. ``int_for_enums``: an enum is its number (int). Raises
    :class:`ProtobufSchemaError` for a schema that does not build, indexes that name no message, or a
    message that cannot map to a table."""
    main = _descriptor_proto(serialized, "text")
    refs = {name: _descriptor_proto(text, f"reference {name}") for name, text in references}
    for name, fdp in refs.items():
        fdp.name = name  # imported by this name (registries name the files they serialize as they like)
    if not main.message_type:
        raise ProtobufSchemaError(f"Protobuf schema {main.name}: the file has no message")
    name = _pick(main, tuple(indexes) or (0,))
    pool = _pool(main, refs)
    descriptor = pool.FindMessageTypeByName(name)
    walk = _Walk(_proto3_optional([main, *refs.values()]), wrapper_for_nullables, index_for_unions, int_for_enums)
    struct, reader = walk.message(descriptor, "")
    iceberg = assign_fresh_schema_ids(Schema(*struct.fields))
    return ProtobufPlan(iceberg, schema_to_pyarrow(iceberg, include_field_ids=False), name,
                        message_factory.GetMessageClass(descriptor), reader)


class _Columns:
    """The columns of a list of messages, built field by field; rows that cannot be held are
    collected in ``bad`` (record index -> (reason, field))."""

    def __init__(self) -> None:
        self.bad: dict[int, tuple[str, str]] = {}

    def message(self, t: _Message, msgs: list[Any], rows: npt.NDArray[np.int64], path: str) -> list[pa.Array]:
        out = []
        for f in t.fields:
            if isinstance(f, _Oneof):
                out.append(self.oneof(f, msgs, rows, _join(path, f.column)))
            else:
                valid = _has(msgs, f.name) if f.presence else None
                out.append(self.values(f.type, list(map(attrgetter(f.name), msgs)), valid, rows, _join(path, f.name)))
        return out

    def oneof(self, f: _Oneof, msgs: list[Any], rows: npt.NDArray[np.int64], path: str) -> pa.Array:
        which = pa.array(list(map(methodcaller("WhichOneof", f.name), msgs)), pa.string())
        children = []
        for b in f.branches:
            chosen = np.asarray(pc.fill_null(pc.equal(which, b.name), False), dtype=np.bool_)
            children.append(self.values(b.type, list(map(attrgetter(b.name), msgs)), chosen, rows, _join(path, b.name)))
        return pa.StructArray.from_arrays(children, [b.name for b in f.branches],
                                          mask=pa.array(np.asarray(which.is_null(), dtype=np.bool_)))

    def values(self, t: _Type, values: list[Any], valid: npt.NDArray[np.bool_] | None,
               rows: npt.NDArray[np.int64], path: str) -> pa.Array:
        mask = None if valid is None else pa.array(~valid)
        match t:
            case _Scalar(arrow):
                return _scalars(values, arrow, mask)
            case _Wrapper(arrow):
                return _scalars(list(map(attrgetter("value"), values)), arrow, mask)
            case _Enum():
                return _enums(t, values, mask)
            case _Timestamp():
                return self.timestamps(values, valid, rows, path)
            case _Message():
                children = self.message(t, values, rows, path)
                names = [f.column for f in t.fields]
                if not names:
                    return pa.StructArray.from_arrays([pa.nulls(len(values))], ["_"], mask=mask).cast(pa.struct([]))
                return pa.StructArray.from_arrays(children, names, mask=mask)
            case _List(element):
                lengths = np.fromiter(map(len, values), np.int64, len(values))
                flat = list(itertools.chain.from_iterable(values))
                inner = self.values(element, flat, None, np.repeat(rows, lengths), f"{path}[]")
                return pa.LargeListArray.from_arrays(_offsets(lengths), inner)
            case _Map(key, value):
                lengths = np.fromiter(map(len, values), np.int64, len(values))
                pairs = list(itertools.chain.from_iterable(map(methodcaller("items"), values)))
                inner_rows = np.repeat(rows, lengths)
                keys = self.values(key, [p[0] for p in pairs], None, inner_rows, f"{path}.key")
                items = [p[1] for p in pairs]
                vals = self.values(value, items, None, inner_rows, f"{path}.value")
                return pa.MapArray.from_arrays(_offsets(lengths, np.int32), keys, vals)
        raise AssertionError(t)

    def timestamps(self, values: list[Any], valid: npt.NDArray[np.bool_] | None, rows: npt.NDArray[np.int64],
                   path: str) -> pa.Array:
        n = len(values)
        seconds = np.fromiter(map(attrgetter("seconds"), values), np.int64, n)
        nanos = np.fromiter(map(attrgetter("nanos"), values), np.int64, n)
        ok = (seconds >= _MIN_SECONDS) & (seconds <= _MAX_SECONDS) & (nanos >= 0) & (nanos < 1_000_000_000)
        if valid is not None:
            ok |= ~valid
        for k in np.flatnonzero(~ok):
            self.bad.setdefault(int(rows[k]), (
                f"Timestamp {int(seconds[k])} s {int(nanos[k])} ns out of range (years 1 to 9999, 0 <= nanos < 1e9)",
                path))
        micros = np.where(ok, seconds * 1_000_000 + nanos // 1000, 0)
        return pa.array(micros, pa.timestamp("us", tz="UTC"), mask=None if valid is None else ~valid)


def _has(msgs: list[Any], name: str) -> npt.NDArray[np.bool_]:
    return np.fromiter(map(methodcaller("HasField", name), msgs), np.bool_, len(msgs))


def _offsets(lengths: npt.NDArray[np.int64], kind: type[np.integer[Any]] = np.int64) -> pa.Array:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return pa.array(out.astype(kind))


def _scalars(values: list[Any], arrow: pa.DataType, mask: pa.Array | None) -> pa.Array:
    arr = pa.array(values, arrow, mask=mask)
    if arrow == pa.uint64():  # Java's long: the bits of the uint64
        return arr.view(pa.int64())
    return arr


def _enums(t: _Enum, values: list[Any], mask: pa.Array | None) -> pa.Array:
    numbers = pa.array(values, pa.int32())
    at = pc.index_in(numbers, value_set=t.numbers)
    names = pc.take(t.symbols, at)
    unknown = pc.and_(pc.is_null(at), pc.is_valid(numbers))
    if pc.any(unknown).as_py():  # open enums: a number the schema lacks, named as Java names it
        big = pa.large_string()
        text = pc.binary_join_element_wise(pa.scalar(f"UNKNOWN_ENUM_VALUE_{t.name}_", big),
                                           pc.cast(numbers, big), pa.scalar("", big))
        names = pc.if_else(unknown, text, names)
    return names if mask is None else pc.if_else(mask, pa.scalar(None, pa.large_string()), names)


def _parse(payloads: Sequence[bytes], plan: ProtobufPlan, schema_id: int, failed: dict[int, str]) -> list[Any]:
    """Each payload parsed (upb); one that does not parse goes to ``failed``."""
    parse = plan.message.FromString
    try:
        return list(map(parse, payloads))
    except (DecodeError, ValueError, RuntimeError):
        pass
    out = []
    for k, p in enumerate(payloads):
        try:
            out.append(parse(p))
        except (DecodeError, ValueError, RuntimeError) as e:
            failed[k] = f"Protobuf payload of schema id {schema_id} ({plan.name}) does not parse: {type(e).__name__}: {e}"
    return out


def decode_protobuf(
    payloads: Sequence[bytes], plan: ProtobufPlan, target: pa.Schema, *, schema_id: int,
    positions: Sequence[int] | None = None,
) -> Converted:
    """The payloads of one schema id and message (each a serialized message, the wire header and
    message indexes removed) as rows of ``target`` (the table's columns: fields by name, cast to
    the column's type; absent ones null). ``positions``: each payload's index in the batch (default
    0..n-1), carried into :attr:`Converted.indices` and the rejects."""
    where = list(range(len(payloads))) if positions is None else list(positions)
    if len(where) != len(payloads):
        raise ValueError(f"positions: expected one per payload ({len(payloads)}), found {len(where)}")
    failed: dict[int, str] = {}
    msgs = _parse(payloads, plan, schema_id, failed)
    kept = np.array([k for k in range(len(payloads)) if k not in failed], dtype=np.int64)
    columns = _Columns()
    arrays = columns.message(plan.reader, msgs, np.arange(len(msgs), dtype=np.int64), "")
    names = [f.column for f in plan.reader.fields]
    table = pa.Table.from_arrays(arrays, names=names) if names else pa.table({"_": pa.nulls(len(msgs))})
    rejects = [Reject(where[k], reason, None) for k, reason in failed.items()]
    if columns.bad:
        good = np.ones(len(msgs), dtype=np.bool_)
        for row, (reason, field) in columns.bad.items():
            good[row] = False
            rejects.append(Reject(where[int(kept[row])],
                                  f"Protobuf record of schema id {schema_id} ({plan.name}): {reason}", field))
        table, kept = table.filter(pa.array(good)), kept[good]
    rejects.sort(key=lambda r: r.index)
    out = _conform(table, target)
    return Converted(out, pa.array([where[int(k)] for k in kept], pa.int64()), tuple(rejects))


def _conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table``'s columns as ``target`` names and types them (absent ones null)."""
    have = set(table.column_names)
    cols = [table.column(f.name).cast(f.type) if f.name in have else pa.nulls(table.num_rows, f.type)
            for f in target]
    return pa.Table.from_arrays(cols, schema=target)
