"""The pizza events of ``icesink pizzas`` in a schema-registry format, for ``ingest_bench.py
--format avro|protobuf|json-schema``: the same events as the JSON run, each framed as Confluent's
serializers frame them (magic byte, the schema id the real registry gave, Protobuf's message
index, the payload), and the worker settings that read them.

The schemas are registered with confluent-kafka's SchemaRegistryClient in a real registry
(tests/support/schema_registry.py, started by the bench); the payloads are written by fastavro's
schemaless_writer (Avro), the message's SerializeToString (Protobuf) or the JSON text itself (JSON
Schema), what AvroSerializer, ProtobufSerializer and JSONSerializer put after the header. All
fields keep the JSON run's types (``date_ordered`` a string, ``store_id`` a long).
"""

from __future__ import annotations

import io
import json
import struct
from typing import Any

FIELDS = ("order_id", "sauce", "cheese", "meats", "veggies", "date_ordered")
AVRO: dict[str, Any] = {"type": "record", "name": "Pizza", "namespace": "bench", "fields": [
    {"name": "order_id", "type": "string"}, {"name": "store_id", "type": "long"},
    *({"name": f, "type": "string"} for f in FIELDS[1:])]}
PROTO = """syntax = "proto3";
package bench;
message Pizza {
  string order_id = 1; int64 store_id = 2; string sauce = 3; string cheese = 4; string meats = 5;
  string veggies = 6; string date_ordered = 7;
}
"""
JSON_SCHEMA: dict[str, Any] = {"type": "object", "title": "Pizza", "properties": {
    "order_id": {"type": "string"}, "store_id": {"type": "integer"},
    **{f: {"type": "string"} for f in FIELDS[1:]}}, "required": ["order_id", "store_id", *FIELDS[1:]]}
#: Format -> (schema text, the registry's schemaType).
SCHEMAS = {"avro": (json.dumps(AVRO), "AVRO"), "protobuf": (PROTO, "PROTOBUF"),
           "json-schema": (json.dumps(JSON_SCHEMA), "JSON")}
CONVERTERS = {"avro": "io.confluent.connect.avro.AvroConverter",
              "protobuf": "io.confluent.connect.protobuf.ProtobufConverter",
              "json-schema": "io.confluent.connect.json.JsonSchemaConverter"}


def encode(values: list[bytes], fmt: str, registry: Any, topic: str) -> tuple[list[bytes], dict[str, str]]:
    """``values`` (pizza JSON) in ``fmt``, framed with the id ``registry`` gives its schema, and the
    worker's converter settings."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    if fmt not in CONVERTERS:
        raise ValueError(f"format: expected one of {', '.join(CONVERTERS)}, found {fmt!r}")
    client = SchemaRegistryClient(registry.client_config())
    schema_id = client.register_schema(f"{topic}-value", Schema(*SCHEMAS[fmt]))
    settings = {"value.converter": CONVERTERS[fmt], "value.converter.schema.registry.url": registry.url,
                "value.converter.basic.auth.credentials.source": "USER_INFO",
                "value.converter.basic.auth.user.info": registry.user_info}
    return framed(values, fmt, schema_id), settings


def framed(values: list[bytes], fmt: str, schema_id: int) -> list[bytes]:
    """``values`` (pizza JSON) as ``fmt``'s serializer frames them for ``schema_id``."""
    head = b"\x00" + struct.pack(">i", schema_id)
    if fmt == "avro":
        payloads = _avro(values)
    elif fmt == "protobuf":
        payloads = _protobuf(values)
        head += b"\x00"  # message indexes [0]: one zero byte
    else:
        payloads = values
    return [head + p for p in payloads]


def _avro(values: list[bytes]) -> list[bytes]:
    import fastavro

    parsed = fastavro.parse_schema(AVRO)
    out = []
    for v in values:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, json.loads(v))
        out.append(buf.getvalue())
    return out


def _protobuf(values: list[bytes]) -> list[bytes]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    from agents.formats.proto_text import compile_proto

    main, _ = compile_proto(PROTO, ())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(main))
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Pizza"))
    return [cls(**json.loads(v)).SerializeToString() for v in values]
