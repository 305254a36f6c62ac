"""Schema-registry formats decoded in bulk, on the same events: plain JSON (decode_json), Avro
(decode_avro), Protobuf (decode_protobuf) and JSON Schema (decode_json_schema), issue 36.

The 10-field order of bench/avro_bench.py (a timestamp, a decimal, a nested record, an array, a
map...) written as each format's serializer writes its payload: json.dumps for JSON and JSON
Schema, fastavro's schemaless_writer for Avro, the message's SerializeToString for Protobuf (the
payload after the wire header and message indexes). Each decodes into its own schema's Arrow
columns (Protobuf has no decimal: ``total`` is a string there). Prints records/s and CPU
us/record of each, and the ratios to plain JSON; checks every path gives every row.

    .venv/bin/python bench/formats_bench.py [--records 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

import fastavro
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents.convert import decode_json
from agents.formats.avro import avro_plan, decode_avro
from agents.formats.json_schema import decode_json_schema, json_schema_plan
from agents.formats.protobuf import decode_protobuf, protobuf_plan
from bench.avro_bench import SCHEMA, as_json, events, measure

JSON_SCHEMA = {
    "type": "object", "title": "Order",
    "properties": {
        "order_id": {"type": "integer"}, "customer": {"type": "string"},
        "quantity": {"type": "integer", "connect.type": "int32"}, "price": {"type": "number"},
        "paid": {"type": "boolean"}, "placed": {"type": "string", "format": "date-time"},
        "total": {"type": "number", "title": "org.apache.kafka.connect.data.Decimal", "connect.type": "bytes",
                  "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"}},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string"}}},
        "tags": {"type": "array", "items": {"type": "string"}},
        "attrs": {"type": "object", "connect.type": "map", "additionalProperties": {"type": "integer"}},
    },
}


def order_proto() -> descriptor_pb2.FileDescriptorProto:
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="bench/order.proto", package="bench", syntax="proto3",
                                             dependency=["google/protobuf/timestamp.proto"])
    address = fdp.message_type.add(name="Address")
    address.field.add(name="street", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    address.field.add(name="zip", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    order = fdp.message_type.add(name="Order")
    for n, (name, kind) in enumerate([("order_id", F.TYPE_INT64), ("customer", F.TYPE_STRING),
                                      ("quantity", F.TYPE_INT32), ("price", F.TYPE_DOUBLE), ("paid", F.TYPE_BOOL),
                                      ("total", F.TYPE_STRING)], start=1):
        order.field.add(name=name, number=n, type=kind, label=F.LABEL_OPTIONAL)
    order.field.add(name="placed", number=7, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".google.protobuf.Timestamp")
    order.field.add(name="address", number=8, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".bench.Address")
    order.field.add(name="tags", number=9, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    entry = order.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    order.field.add(name="attrs", number=10, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                    type_name=".bench.Order.AttrsEntry")
    return fdp


def protobuf_payloads(recs: list[dict[str, Any]], fdp: descriptor_pb2.FileDescriptorProto) -> list[bytes]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Order"))
    out = []
    for r in recs:
        m = cls(order_id=r["order_id"], customer=r["customer"], quantity=r["quantity"], price=r["price"],
                paid=r["paid"], total=str(r["total"]), address=r["address"], tags=r["tags"], attrs=r["attrs"])
        m.placed.FromDatetime(r["placed"])
        out.append(m.SerializeToString())
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.records
    recs = events(n)
    parsed = fastavro.parse_schema(SCHEMA)
    avro = []
    for r in recs:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        avro.append(buf.getvalue())
    jsons = [as_json(r) for r in recs]
    fdp = order_proto()
    proto = protobuf_payloads(recs, fdp)
    a_plan = avro_plan(json.dumps(SCHEMA))
    p_plan = protobuf_plan(base64.b64encode(fdp.SerializeToString()).decode(), (1,))
    j_plan = json_schema_plan(json.dumps(JSON_SCHEMA))

    print(f"{n:,} records; bytes each: JSON {sum(map(len, jsons)) / n:.0f}, Avro {sum(map(len, avro)) / n:.0f}, "
          f"Protobuf {sum(map(len, proto)) / n:.0f}")
    a = measure("(a) decode_json (plain JSON, the baseline)", lambda: decode_json(jsons, a_plan.arrow), n, args.repeat)
    b = measure("(b) decode_avro", lambda: decode_avro(avro, a_plan, a_plan.arrow, schema_id=1), n, args.repeat)
    c = measure("(c) decode_protobuf", lambda: decode_protobuf(proto, p_plan, p_plan.arrow, schema_id=2), n, args.repeat)
    d = measure("(d) decode_json_schema", lambda: decode_json_schema(jsons, j_plan, j_plan.arrow, schema_id=3),
                n, args.repeat)
    for name, (_, _, out) in zip("abcd", (a, b, c, d), strict=True):
        assert out.table.num_rows == n and not out.rejects, (name, out.rejects[:3])
    assert c[2].table.column("placed").to_pylist() == [r["placed"] for r in recs]
    assert d[2].table.column("total").to_pylist() == [r["total"] for r in recs]
    print(f"CPU ratios to (a): Avro {b[1] / a[1]:.2f}, Protobuf {c[1] / a[1]:.2f}, JSON Schema {d[1] / a[1]:.2f}")


if __name__ == "__main__":
    main()
