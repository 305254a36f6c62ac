"""Schema-registry JSON Schema: the Iceberg and Arrow schemas of a registered JSON Schema
(:func:`json_schema_plan`), and the payloads of one schema id decoded in bulk
(:func:`decode_json_schema`, the JSON decoder of :mod:`agents.convert`). No I/O.

The mapping is the one the reference sink gets from Confluent's JsonSchemaConverter
(``io.confluent.connect.json.JsonSchemaData.toConnectSchema``, default settings, then Connect to
Iceberg): an object with properties is a struct (fields in ``connect.index`` order, else as
written), ``connect.type: map`` a ``map<string, V>`` of its ``additionalProperties``, an array a
list, boolean a boolean, integer a long and number a double unless ``connect.type`` says int8,
int16, int32 (int), int64, float32 (float) or float64; a string is a string, ``connect.type:
bytes`` binary (base64 in the JSON), an enum or const a string; a ``oneOf``/``anyOf`` (or a
``type`` list) of one schema and null is that schema, optional; ``$ref`` is followed (``#/...``
pointers, or the name of one of the schema's references). The Connect logical types written by
Confluent's converter in ``title`` (``org.apache.kafka.connect.data.Timestamp``, ``Date``,
``Time``, ``Decimal``) are timestamptz (epoch milliseconds), date (days), time (milliseconds) and
decimal (precision from ``connect.parameters``, JSON numbers).

Where JsonSchemaData's default differs from what a user expects (bold in docs/schema-registry.md,
"JSON Schema types"): a property is optional unless ``required`` lists it and it is not nullable
(JsonSchemaData makes every non-nullable property required unless
``use.optional.for.nonrequired=true``; a record leaving out a property its schema allows to be
absent would be a reject); ``format`` ``date-time``, ``date``, ``time`` and ``uuid`` give
timestamptz, date, time and uuid (JsonSchemaData: a string); an object with only
``additionalProperties`` is a map (JsonSchemaData: an empty struct). Refused, naming the place:
unions of two or more non-null branches (JsonSchemaData makes a struct of ``field.N`` branches,
which a JSON value does not say which of to fill), ``allOf``, schemas with no type, recursive
schemas, a root that is not an object.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
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
    TimeType,
    UUIDType,
)

from agents.convert import EPOCH_UNIT, Converted, Reject, decode_json, with_field_metadata
from agents.formats.registry_wire import RegistrySchemaError

_CONNECT: Final = "org.apache.kafka.connect.data."
_MAX_PRECISION: Final = 38
_CONNECT_TYPES: Final[Mapping[str, IcebergType]] = {
    "int8": IntegerType(), "int16": IntegerType(), "int32": IntegerType(), "int64": LongType(),
    "float32": FloatType(), "float64": DoubleType(),
}
_FORMATS: Final[Mapping[str, IcebergType]] = {
    "date-time": TimestamptzType(), "date": DateType(), "time": TimeType(), "uuid": UUIDType(),
}
#: Connect logical name (in ``title``) -> (Iceberg type, epoch unit of its JSON numbers or None).
_LOGICAL: Final[Mapping[str, tuple[IcebergType, str | None]]] = {
    _CONNECT + "Timestamp": (TimestamptzType(), "ms"),
    _CONNECT + "Date": (DateType(), None),
    _CONNECT + "Time": (TimeType(), "ms"),
}


class JsonSchemaError(RegistrySchemaError):
    """A JSON Schema that is malformed or cannot map to a table (its records are data errors)."""


@dataclass(frozen=True)
class JsonSchemaPlan:
    """What one registered JSON Schema gives: the table's columns and how to read its payloads."""

    iceberg: Schema  # the columns of a table for these records
    arrow: pa.Schema  # the same as Arrow (no field ids), with the decoder's field metadata
    metadata: Mapping[str, Mapping[str, str]]  # dotted path -> decode_json field metadata


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Walk:
    """One pass over a JSON Schema giving its Iceberg type and the decoder's field metadata."""

    def __init__(self, root: Any, references: Mapping[str, Any], optional_for_nonrequired: bool = True) -> None:
        self._optional_for_nonrequired = optional_for_nonrequired
        self._root = root
        self._references = references
        self._visiting: list[int] = []  # ids of the object schemas being walked (one met again is a cycle)
        self._ids = itertools.count(1)
        self.metadata: dict[str, dict[str, str]] = {}

    def walk(self, schema: Any, path: str) -> tuple[IcebergType, bool]:
        """(Iceberg type, nullable?) of ``schema`` at ``path``."""
        if not isinstance(schema, dict):
            raise JsonSchemaError(f"JSON Schema: expected a schema object, found {schema!r}", path or None)
        if "$ref" in schema:
            return self.walk(self.ref(schema["$ref"], path), path)
        for key in ("oneOf", "anyOf"):
            if key in schema:
                return self._union(schema[key], key, path)
        if "allOf" in schema:
            raise JsonSchemaError("JSON Schema: allOf is not supported (JsonSchemaData merges it only in narrow "
                                  "cases); write the properties out", path or None)
        kind = schema.get("type")
        if isinstance(kind, list):
            return self._union([{**schema, "type": k} for k in kind], "type", path)
        if "enum" in schema or "const" in schema:
            return StringType(), False
        if kind == "null":
            raise JsonSchemaError("JSON Schema: a null type stands alone (only a union branch may be null)", path or None)
        if kind == "object":
            return self._object(schema, path), False
        if kind == "array":
            if "items" not in schema or not isinstance(schema["items"], dict):
                raise JsonSchemaError("JSON Schema: an array needs 'items' (one schema for every element)", path or None)
            element, nullable = self.walk(schema["items"], f"{path}[]")
            return ListType(next(self._ids), element, element_required=not nullable), False
        return self._primitive(schema, kind, path), False

    def _primitive(self, schema: Mapping[str, Any], kind: Any, path: str) -> IcebergType:
        connect = schema.get("connect.type")
        title = schema.get("title")
        if isinstance(title, str) and title == _CONNECT + "Decimal":
            return _decimal(schema, path)
        if isinstance(title, str) and title in _LOGICAL and kind == "integer":
            t, unit = _LOGICAL[title]
            if unit is not None:
                self.metadata[path] = {EPOCH_UNIT: unit}
            return t
        if kind == "boolean":
            return BooleanType()
        if kind in ("integer", "number"):
            if connect is not None:
                if connect not in _CONNECT_TYPES:
                    raise JsonSchemaError(f"JSON Schema: connect.type {connect!r} on a {kind} (expected one of "
                                          f"{', '.join(_CONNECT_TYPES)})", path or None)
                return _CONNECT_TYPES[connect]
            return LongType() if kind == "integer" else DoubleType()
        if kind == "string":
            if connect == "bytes":
                return BinaryType()
            fmt = schema.get("format")
            return _FORMATS.get(fmt, StringType()) if isinstance(fmt, str) else StringType()
        if kind is None:
            raise JsonSchemaError("JSON Schema: a schema with no type (any value) cannot be a column", path or None)
        raise JsonSchemaError(f"JSON Schema: unknown type {kind!r}", path or None)

    def _object(self, schema: Mapping[str, Any], path: str) -> IcebergType:
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if schema.get("connect.type") == "map" or (not props and isinstance(extra, dict)):
            if not isinstance(extra, dict):
                raise JsonSchemaError("JSON Schema: a map needs an 'additionalProperties' schema", path or None)
            value, nullable = self.walk(extra, f"{path}.value")
            key_id = next(self._ids)
            return MapType(key_id, StringType(), next(self._ids), value, value_required=not nullable)
        if not isinstance(props, dict) or not props:
            raise JsonSchemaError("JSON Schema: an object needs 'properties' (or an 'additionalProperties' "
                                  "schema, a map)", path or None)
        if id(schema) in self._visiting:
            raise JsonSchemaError("JSON Schema: the object contains itself; a table cannot hold a recursive type",
                                  path or None)
        self._visiting.append(id(schema))
        required = set(schema.get("required") or ())
        order = sorted(enumerate(props.items()),
                       key=lambda e: (e[1][1].get("connect.index", e[0]) if isinstance(e[1][1], dict) else e[0]))
        fields = []
        for _, (name, sub) in order:
            t, nullable = self.walk(sub, _join(path, name))
            listed = name in required or not self._optional_for_nonrequired  # JsonSchemaData's rule
            fields.append(NestedField(next(self._ids), name, t, required=listed and not nullable))
        self._visiting.pop()
        return StructType(*fields)

    def _union(self, branches: Any, key: str, path: str) -> tuple[IcebergType, bool]:
        if not isinstance(branches, list) or not branches:
            raise JsonSchemaError(f"JSON Schema: {key} needs a list of schemas", path or None)
        others = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
        if len(others) != 1:
            raise JsonSchemaError(f"JSON Schema: a oneOf/anyOf of {len(others)} non-null branches cannot be one "
                                  "column type (only one schema, or one and null)", path or None)
        t, nullable = self.walk(others[0], path)
        return t, nullable or len(others) < len(branches)

    def ref(self, ref: Any, path: str) -> Any:
        if isinstance(ref, str) and ref in self._references:
            return self._references[ref]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise JsonSchemaError(f"JSON Schema: $ref {ref!r} is neither a '#/...' pointer nor one of the schema's "
                                  f"references ({', '.join(self._references) or 'none'})", path or None)
        target: Any = self._root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise JsonSchemaError(f"JSON Schema: $ref {ref!r} points at nothing", path or None)
            target = target[part]
        return target


def _decimal(schema: Mapping[str, Any], path: str) -> DecimalType:
    params = schema.get("connect.parameters") or {}
    try:
        scale = int(params.get("scale", 0))
        precision = int(params.get("connect.decimal.precision", _MAX_PRECISION))
    except (TypeError, ValueError, AttributeError):
        raise JsonSchemaError(f"JSON Schema: a Decimal needs integer connect.parameters, found {params!r}",
                              path or None) from None
    if not 0 <= scale <= precision <= _MAX_PRECISION:
        raise JsonSchemaError(f"JSON Schema: Decimal precision {precision} and scale {scale} do not fit "
                              f"0 <= scale <= precision <= {_MAX_PRECISION}", path or None)
    return DecimalType(precision, scale)


def _load(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise JsonSchemaError(f"JSON Schema {what}: not valid JSON ({e})") from None


@functools.lru_cache(maxsize=256)
def json_schema_plan(text: str, references: tuple[tuple[str, str], ...] = (), *,
                     optional_for_nonrequired: bool = True) -> JsonSchemaPlan:
    """The plan of a registered JSON Schema (``references``: (name, schema text) pairs, as the schema's
    ``$ref`` names them). ``optional_for_nonrequired`` (``use.optional.for.nonrequired``): a property
    ``required`` does not list is optional; false (JsonSchemaData's default): required unless nullable,
    so a record without it is a reject. Raises :class:`JsonSchemaError` for a schema that is not valid JSON, whose
    root is not an object, or that cannot map to a table."""
    root = _load(text, "text")
    refs = {name: _load(ref, f"reference {name}") for name, ref in references}
    walk = _Walk(root, refs, optional_for_nonrequired)
    top = walk.ref(root["$ref"], "") if isinstance(root, dict) and "$ref" in root else root
    kind = top.get("type") if isinstance(top, dict) else type(top).__name__
    if kind != "object":
        raise JsonSchemaError(f"JSON Schema: the value schema is {kind!r}; a table row needs an object")
    t, _ = walk.walk(top, "")
    if not isinstance(t, StructType):
        raise JsonSchemaError("JSON Schema: the value schema is a map; a table row needs an object with properties")
    iceberg = assign_fresh_schema_ids(Schema(*t.fields))
    arrow = with_field_metadata(schema_to_pyarrow(iceberg, include_field_ids=False), walk.metadata)
    return JsonSchemaPlan(iceberg, arrow, walk.metadata)


def decode_json_schema(
    payloads: Sequence[bytes], plan: JsonSchemaPlan, target: pa.Schema, *, schema_id: int,
    positions: Sequence[int] | None = None,
) -> Converted:
    """The payloads of one schema id (JSON text, the wire header removed) as rows of ``target`` (the
    table's columns; absent ones null), read with :func:`agents.convert.decode_json` and the plan's
    encodings (epoch milliseconds for Connect Timestamp and Time). ``positions``: each payload's
    index in the batch (default 0..n-1), carried into :attr:`Converted.indices` and the rejects."""
    where = list(range(len(payloads))) if positions is None else list(positions)
    if len(where) != len(payloads):
        raise ValueError(f"positions: expected one per payload ({len(payloads)}), found {len(where)}")
    names = set(target.names)
    metadata = {path: m for path, m in plan.metadata.items() if path.split(".", 1)[0].split("[", 1)[0] in names}
    try:
        schema = with_field_metadata(target, {p: dict(m) for p, m in metadata.items()})
    except KeyError:  # the table's column at that path is another shape: decode it as the table says
        schema = target
    out = decode_json(payloads, _required_as_planned(schema, plan.arrow))
    rejects = tuple(Reject(where[r.index], f"JSON Schema record of schema id {schema_id}: {r.reason}", r.field)
                    for r in out.rejects)
    indices = pa.array([where[i] for i in out.indices.to_pylist()], pa.int64())
    return Converted(out.table.cast(target) if out.table.schema != target else out.table, indices, rejects)


def _required_as_planned(schema: pa.Schema, planned: pa.Schema) -> pa.Schema:
    """``schema`` (the table's columns) with the columns the plan requires not nullable, so that a
    record without one is a reject (the table's own columns may be optional)."""
    required = {f.name for f in planned if not f.nullable}
    if not required:
        return schema
    return pa.schema([f.with_nullable(False) if f.name in required else f for f in schema], metadata=schema.metadata)
