"""agents/formats/protobuf.py: registered Protobuf schemas (the base64 FileDescriptorProto the registry
serves with ``?format=serialized``) to Iceberg as the reference sink maps them (Confluent's
ProtobufData with its defaults, then Connect to Iceberg), and payloads decoded in bulk. The payloads
are written by protobuf's own message classes built from the same descriptors (what generated code
is); tests/integration/test_schema_registry.py decodes ProtobufSerializer's bytes."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    message_factory,
    timestamp_pb2,
    wrappers_pb2,
)
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

from agents.formats.protobuf import ProtobufSchemaError, decode_protobuf, protobuf_plan

F = descriptor_pb2.FieldDescriptorProto
OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
WELL_KNOWN = ("google/protobuf/timestamp.proto", "google/protobuf/duration.proto", "google/protobuf/wrappers.proto")
SCALARS = [  # (field, proto type, Iceberg type)
    ("i32", F.TYPE_INT32, IntegerType()), ("s32", F.TYPE_SINT32, IntegerType()),
    ("sf32", F.TYPE_SFIXED32, IntegerType()), ("u32", F.TYPE_UINT32, LongType()),
    ("f32", F.TYPE_FIXED32, LongType()), ("i64", F.TYPE_INT64, LongType()), ("s64", F.TYPE_SINT64, LongType()),
    ("sf64", F.TYPE_SFIXED64, LongType()), ("u64", F.TYPE_UINT64, LongType()), ("f64", F.TYPE_FIXED64, LongType()),
    ("fl", F.TYPE_FLOAT, FloatType()), ("db", F.TYPE_DOUBLE, DoubleType()), ("b", F.TYPE_BOOL, BooleanType()),
    ("s", F.TYPE_STRING, StringType()), ("raw", F.TYPE_BYTES, BinaryType()),
]
WRAPPERS = [("w_i32", "Int32Value", IntegerType()), ("w_u32", "UInt32Value", LongType()),
            ("w_i64", "Int64Value", LongType()), ("w_u64", "UInt64Value", LongType()),
            ("w_fl", "FloatValue", FloatType()), ("w_db", "DoubleValue", DoubleType()),
            ("w_b", "BoolValue", BooleanType()), ("w_s", "StringValue", StringType()),
            ("w_raw", "BytesValue", BinaryType())]


def everything_file() -> descriptor_pb2.FileDescriptorProto:
    """One .proto file with every type the mapping covers; ``Everything`` is its second message."""
    fdp = descriptor_pb2.FileDescriptorProto(name="icesink/everything.proto", package="icesink.test",
                                             syntax="proto3", dependency=list(WELL_KNOWN))
    fdp.enum_type.add(name="Color").value.extend([
        descriptor_pb2.EnumValueDescriptorProto(name="RED", number=0),
        descriptor_pb2.EnumValueDescriptorProto(name="GREEN", number=1),
        descriptor_pb2.EnumValueDescriptorProto(name="BLUE", number=7)])
    address = fdp.message_type.add(name="Address")
    address.field.add(name="street", number=1, type=F.TYPE_STRING, label=OPT)
    address.field.add(name="zip", number=2, type=F.TYPE_INT32, label=OPT)
    m = fdp.message_type.add(name="Everything")
    n = iter(range(1, 1000))
    for name, kind, _ in SCALARS:
        m.field.add(name=name, number=next(n), type=kind, label=OPT)
    m.field.add(name="color", number=next(n), type=F.TYPE_ENUM, label=OPT, type_name=".icesink.test.Color")
    m.field.add(name="address", number=next(n), type=F.TYPE_MESSAGE, label=OPT, type_name=".icesink.test.Address")
    m.field.add(name="tags", number=next(n), type=F.TYPE_STRING, label=REP)
    m.field.add(name="homes", number=next(n), type=F.TYPE_MESSAGE, label=REP, type_name=".icesink.test.Address")
    m.field.add(name="colors", number=next(n), type=F.TYPE_ENUM, label=REP, type_name=".icesink.test.Color")
    entry = m.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=OPT)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=OPT)
    m.field.add(name="attrs", number=next(n), type=F.TYPE_MESSAGE, label=REP,
                type_name=".icesink.test.Everything.AttrsEntry")
    entry = m.nested_type.add(name="PlacesEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_INT32, label=OPT)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=OPT, type_name=".icesink.test.Address")
    m.field.add(name="places", number=next(n), type=F.TYPE_MESSAGE, label=REP,
                type_name=".icesink.test.Everything.PlacesEntry")
    m.oneof_decl.add(name="choice")
    m.field.add(name="pick_n", number=next(n), type=F.TYPE_INT64, label=OPT, oneof_index=0)
    m.field.add(name="pick_s", number=next(n), type=F.TYPE_STRING, label=OPT, oneof_index=0)
    m.field.add(name="pick_a", number=next(n), type=F.TYPE_MESSAGE, label=OPT, oneof_index=0,
                type_name=".icesink.test.Address")
    m.oneof_decl.add(name="_maybe")  # proto3 optional: a synthetic oneof
    m.field.add(name="maybe", number=next(n), type=F.TYPE_INT32, label=OPT, oneof_index=1, proto3_optional=True)
    m.field.add(name="at", number=next(n), type=F.TYPE_MESSAGE, label=OPT, type_name=".google.protobuf.Timestamp")
    m.field.add(name="took", number=next(n), type=F.TYPE_MESSAGE, label=OPT, type_name=".google.protobuf.Duration")
    for name, wrapper, _ in WRAPPERS:
        m.field.add(name=name, number=next(n), type=F.TYPE_MESSAGE, label=OPT, type_name=f".google.protobuf.{wrapper}")
    return fdp


FILE = everything_file()
SERIALIZED = base64.b64encode(FILE.SerializeToString()).decode()  # what ?format=serialized answers


def message_class(fdp: descriptor_pb2.FileDescriptorProto, name: str) -> Any:
    pool = descriptor_pool.DescriptorPool()
    for wk in (timestamp_pb2, duration_pb2, wrappers_pb2):
        pool.AddSerializedFile(wk.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


Everything = message_class(FILE, "icesink.test.Everything")
T0 = dt.datetime(2026, 11, 29, 6, 30, 15, 123456, tzinfo=dt.UTC)


def message(k: int) -> Any:
    """The k-th test message: values vary with k, and odd k leave the optional parts unset."""
    m = Everything(i32=-k - 1, s32=-2 * k, sf32=k, u32=4_000_000_000 + k, f32=k, i64=-(2**40) - k,
                   s64=-k, sf64=k, u64=2**64 - 1 - k, f64=k, fl=0.5 + k, db=k / 3, b=k % 2 == 0, s=f"s{k}é",
                   raw=bytes([k, 0, 255]), color=[0, 1, 7][k % 3], tags=[f"t{j}" for j in range(k % 3)],
                   colors=[1, 7, 0][: k % 4])
    m.attrs.update({f"a{j}": j * k for j in range(k % 3)})
    for j in range(k % 2 + 1):
        m.homes.add(street=f"h{j}", zip=j)
        m.places[j + 10].street = f"p{j}"
    if k % 2 == 0:
        m.address.street, m.address.zip = "Main", 12345 + k
        m.maybe = 0  # set to its default: still present
        m.at.FromDatetime(T0 + dt.timedelta(seconds=k))
        m.took.seconds, m.took.nanos = 90 + k, 5
        for name, _, _ in WRAPPERS:
            getattr(m, name).SetInParent()
            getattr(m, name).value = {"w_s": "w", "w_raw": b"w", "w_b": True}.get(name, 0)  # present, default value
    [lambda: setattr(m, "pick_n", k), lambda: setattr(m, "pick_s", f"p{k}"),
     lambda: m.pick_a.MergeFrom(m.address), lambda: None][k % 4]()
    return m


def expected(k: int) -> dict[str, Any]:
    m = message(k)
    even = k % 2 == 0
    row: dict[str, Any] = {name: getattr(m, name) for name, _, _ in SCALARS}
    row["u64"] = row["u64"] - 2**64 if row["u64"] >= 2**63 else row["u64"]  # Java's long, as Connect has it
    row["fl"] = float(pa.scalar(row["fl"], pa.float32()).as_py())
    row |= {
        "color": ["RED", "GREEN", "BLUE"][k % 3],
        "address": {"street": "Main", "zip": 12345 + k} if even else None,
        "tags": [f"t{j}" for j in range(k % 3)],
        "homes": [{"street": f"h{j}", "zip": j} for j in range(k % 2 + 1)],
        "colors": ["GREEN", "BLUE", "RED"][: k % 4],
        "attrs": sorted((f"a{j}", j * k) for j in range(k % 3)),
        "places": sorted((j + 10, {"street": f"p{j}", "zip": 0}) for j in range(k % 2 + 1)),
        "choice": [{"pick_n": k, "pick_s": None, "pick_a": None},
                   {"pick_n": None, "pick_s": f"p{k}", "pick_a": None},
                   {"pick_n": None, "pick_s": None, "pick_a": {"street": "Main", "zip": 12345 + k} if even else
                    {"street": "", "zip": 0}}, None][k % 4],
        "maybe": 0 if even else None,
        "at": T0 + dt.timedelta(seconds=k) if even else None,
        "took": {"seconds": 90 + k, "nanos": 5} if even else None,
    }
    for name, _, _ in WRAPPERS:
        row[name] = {"w_s": "w", "w_raw": b"w", "w_b": True}.get(name, 0) if even else None
    return row


def sort_maps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "attrs": sorted(r["attrs"]), "places": sorted(r["places"], key=lambda e: e[0])} for r in rows]


def field_types(t: StructType) -> dict[str, IcebergType]:
    return {f.name: f.field_type for f in t.fields}


def test_the_message_is_picked_by_its_message_indexes() -> None:
    assert [f.name for f in protobuf_plan(SERIALIZED, (0,)).iceberg.fields] == ["street", "zip"]
    assert protobuf_plan(SERIALIZED, (1,)).name == "icesink.test.Everything"
    assert [f.name for f in protobuf_plan(SERIALIZED, (1, 0)).iceberg.fields] == ["key", "value"]  # AttrsEntry
    with pytest.raises(ProtobufSchemaError, match=r"message indexes \[2\].*2 messages"):
        protobuf_plan(SERIALIZED, (2,))


@pytest.mark.parametrize(("name", "iceberg"), [(n, t) for n, _, t in SCALARS + WRAPPERS], ids=lambda v: str(v))
def test_scalars_and_wrappers_map_as_protobufdata(name: str, iceberg: IcebergType) -> None:
    field = protobuf_plan(SERIALIZED, (1,)).iceberg.find_field(name)
    assert (field.field_type, field.required) == (iceberg, False)


def test_messages_repeated_maps_enums_oneofs_and_well_known_types_map_to_nested_types() -> None:
    types = field_types(protobuf_plan(SERIALIZED, (1,)).iceberg.as_struct())

    def shape(t: IcebergType) -> Any:  # the type without field ids
        if isinstance(t, StructType):
            return {f.name: (shape(f.field_type), f.required) for f in t.fields}
        if isinstance(t, ListType):
            return ["list", shape(t.element_type), t.element_required]
        if isinstance(t, MapType):
            return ["map", shape(t.key_type), shape(t.value_type), t.value_required]
        return t

    address = {"street": (StringType(), False), "zip": (IntegerType(), False)}
    assert shape(types["color"]) == StringType()
    assert shape(types["address"]) == address
    assert shape(types["tags"]) == ["list", StringType(), False]
    assert shape(types["homes"]) == ["list", address, False]
    assert shape(types["colors"]) == ["list", StringType(), False]
    assert shape(types["attrs"]) == ["map", StringType(), LongType(), False]
    assert shape(types["places"]) == ["map", IntegerType(), address, False]
    assert shape(types["choice"]) == {"pick_n": (LongType(), False), "pick_s": (StringType(), False),
                                      "pick_a": (address, False)}
    assert "pick_n" not in types and "_maybe" not in types
    assert shape(types["maybe"]) == IntegerType()
    assert shape(types["at"]) == TimestamptzType()
    assert shape(types["took"]) == {"seconds": (LongType(), False), "nanos": (IntegerType(), False)}
    plan = protobuf_plan(SERIALIZED, (1,))
    assert list(plan.arrow.names) == [f.name for f in plan.iceberg.fields]


def test_every_type_decodes_value_for_value() -> None:
    plan = protobuf_plan(SERIALIZED, (1,))
    payloads = [message(k).SerializeToString() for k in range(8)]
    out = decode_protobuf(payloads, plan, plan.arrow, schema_id=5)
    out.validate()
    assert out.rejects == ()
    assert out.indices.to_pylist() == list(range(8))
    assert out.table.schema == plan.arrow
    assert sort_maps(out.table.to_pylist()) == sort_maps([expected(k) for k in range(8)])


def test_a_payload_that_does_not_parse_is_a_reject_by_index_and_the_rest_are_rows() -> None:
    plan = protobuf_plan(SERIALIZED, (1,))
    good = [message(k).SerializeToString() for k in range(4)]
    bad_utf8 = Everything(s="x").SerializeToString().replace(b"x", b"\xff")
    payloads = [good[0], good[1][:-3], good[2], b"\xff\xff\xff", bad_utf8, good[3]]
    out = decode_protobuf(payloads, plan, plan.arrow, schema_id=9, positions=[10, 11, 12, 13, 14, 15])
    out.validate()
    assert out.indices.to_pylist() == [10, 12, 15]
    assert sort_maps(out.table.to_pylist()) == sort_maps([expected(k) for k in (0, 2, 3)])
    assert [r.index for r in out.rejects] == [11, 13, 14]
    assert all("Protobuf payload of schema id 9 (icesink.test.Everything) does not parse" in r.reason
               for r in out.rejects), out.rejects


def test_an_empty_payload_is_the_default_message_and_an_empty_batch_an_empty_table() -> None:
    plan = protobuf_plan(SERIALIZED, (0,))
    out = decode_protobuf([b""], plan, plan.arrow, schema_id=1)
    assert out.table.to_pylist() == [{"street": "", "zip": 0}]
    assert decode_protobuf([], plan, plan.arrow, schema_id=1).table.num_rows == 0


def test_rows_fill_the_tables_columns_by_name() -> None:
    """A table whose columns differ (evolved: a wider type, a column more, one fewer) gets each
    record's fields by name; columns the message lacks are null."""
    plan = protobuf_plan(SERIALIZED, (0,))
    target = pa.schema([pa.field("zip", pa.int64()), pa.field("extra", pa.large_string())])
    address = message_class(FILE, "icesink.test.Address")(street="x", zip=3)
    out = decode_protobuf([address.SerializeToString()], plan, target, schema_id=1)
    assert out.table.schema == target
    assert out.table.to_pylist() == [{"zip": 3, "extra": None}]


def test_timestamps_out_of_the_tables_range_are_rejects_naming_the_field() -> None:
    plan = protobuf_plan(SERIALIZED, (1,))
    far = Everything()
    far.at.seconds = 2**62
    out = decode_protobuf([far.SerializeToString(), message(0).SerializeToString()], plan, plan.arrow, schema_id=2)
    assert out.indices.to_pylist() == [1]
    assert [(r.index, r.field) for r in out.rejects] == [(0, "at")]
    assert "out of range" in out.rejects[0].reason


def test_references_and_unknown_imports() -> None:
    """An import is resolved from the schema's references (by import name) or, for the well-known
    types, from protobuf's own; an import neither names is refused saying which."""
    # Registries name the files they serialize as they like (AxonOps: every one "schema.proto"): a
    # reference is the file its import names.
    dep = descriptor_pb2.FileDescriptorProto(name="schema.proto", package="icesink.dep", syntax="proto3")
    dep.message_type.add(name="Where").field.add(name="city", number=1, type=F.TYPE_STRING, label=OPT)
    main = descriptor_pb2.FileDescriptorProto(name="schema.proto", package="icesink.main", syntax="proto3",
                                              dependency=["icesink/address.proto"])
    main.message_type.add(name="Order").field.add(name="to", number=1, type=F.TYPE_MESSAGE, label=OPT,
                                                  type_name=".icesink.dep.Where")
    text = base64.b64encode(main.SerializeToString()).decode()
    ref = ("icesink/address.proto", base64.b64encode(dep.SerializeToString()).decode())
    plan = protobuf_plan(text, (0,), (ref,))
    assert field_types(plan.iceberg.as_struct())["to"] == StructType(NestedField(2, "city", StringType(), required=False))
    with pytest.raises(ProtobufSchemaError, match="imports icesink/address.proto.*no reference"):
        protobuf_plan(text, (0,))


def test_schemas_that_cannot_map_are_refused_saying_why() -> None:
    node = descriptor_pb2.FileDescriptorProto(name="tree.proto", package="t", syntax="proto3")
    node.message_type.add(name="Node").field.add(name="child", number=1, type=F.TYPE_MESSAGE, label=OPT,
                                                  type_name=".t.Node")
    with pytest.raises(ProtobufSchemaError, match=r"t\.Node contains itself.*\(at child\)"):
        protobuf_plan(base64.b64encode(node.SerializeToString()).decode())
    with pytest.raises(ProtobufSchemaError, match="not a base64 FileDescriptorProto"):
        protobuf_plan("syntax = \"proto3\"; message A {}")
    empty = descriptor_pb2.FileDescriptorProto(name="e.proto", syntax="proto3")
    with pytest.raises(ProtobufSchemaError, match="no message"):
        protobuf_plan(base64.b64encode(empty.SerializeToString()).decode())


def test_nested_columns_fill_by_name_too() -> None:
    """A table whose nested struct has a field more (and lacks one the message has), in lists and
    maps as well: the record's fields go where their names say, the others are null."""
    plan = protobuf_plan(SERIALIZED, (1,))
    address = pa.struct([pa.field("zip", pa.int64()), pa.field("floor", pa.int32())])
    target = pa.schema([pa.field("address", address), pa.field("homes", pa.large_list(address)),
                        pa.field("places", pa.map_(pa.int32(), address))])
    out = decode_protobuf([message(0).SerializeToString()], plan, target, schema_id=1)
    assert out.table.schema == target
    assert out.table.to_pylist() == [{"address": {"zip": 12345, "floor": None},
                                      "homes": [{"zip": 0, "floor": None}],
                                      "places": [(10, {"zip": 0, "floor": None})]}]
