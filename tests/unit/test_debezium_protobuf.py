"""Debezium's change events in Protobuf (issue 36 leftovers, point 3): the event shape (``before``
and ``after`` messages of the row, ``source``, ``op``, ``ts_ms``) as a Protobuf message, framed as
ProtobufSerializer frames it, through the Debezium transform with registry values: the same
change rows as the Avro and JSON forms (tests/unit/test_debezium_avro.py). Protobuf has no
``connect.name`` annotations: Debezium's temporal types arrive as their plain numbers and strings."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from agents.debezium import DebeziumTransform
from agents.formats.proto_text import compile_proto
from agents.formats.registry_values import RegistryValues

PROTO = """syntax = "proto3";
package dbserver1.public.accounts;
message Value { int32 id = 1; optional string name = 2; optional int64 updated = 3; }
message Source {
  string version = 1; string connector = 2; string name = 3; int64 ts_ms = 4; string snapshot = 5;
  string db = 6; string schema = 7; string table = 8; int64 txId = 9; int64 lsn = 10;
}
message Envelope { Value before = 1; Value after = 2; Source source = 3; string op = 4; int64 ts_ms = 5; }
"""


@dataclass
class Registered:
    type: str
    text: str
    references: tuple[Any, ...] = ()


async def schema_of(schema_id: int) -> Registered | None:
    return Registered("PROTOBUF", PROTO) if schema_id == 8 else None


def envelope_class() -> Any:
    main, _ = compile_proto(PROTO, ())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(main))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("dbserver1.public.accounts.Envelope"))


def event(cls: Any, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, lsn: int) -> bytes:
    source = {"version": "3.6.0", "connector": "postgresql", "name": "dbserver1", "ts_ms": 1_771_999_999_000 + lsn,
              "snapshot": "false", "db": "shop", "schema": "public", "table": "accounts", "txId": 7, "lsn": lsn}
    m = cls(op=op, ts_ms=1_772_000_000_000 + lsn, source=source, before=before, after=after)
    return b"\x00" + struct.pack(">i", 8) + b"\x02\x04" + m.SerializeToString()  # message indexes [2]: Envelope


def test_protobuf_change_events_give_the_change_rows_of_the_avro_and_json_forms() -> None:
    cls = envelope_class()
    values = [
        event(cls, "r", None, {"id": 1, "name": "a", "updated": 5}, 100),
        event(cls, "c", None, {"id": 2, "name": "b"}, 101),
        event(cls, "u", {"id": 1, "name": "a"}, {"id": 1, "name": "a2", "updated": 6}, 102),
        event(cls, "d", {"id": 2}, None, 103),
    ]
    registry = RegistryValues(schema_of, "protobuf")
    asyncio.run(registry.prepare(values))
    t = DebeziumTransform("mirror.{db}_{table}", registry=registry)
    schema = t.infer_schema(values)
    assert schema.names == ["id", "name", "updated", "_cdc"]
    out = t.apply(values, list(range(10, 14)), schema)
    got = out.table.to_pylist()
    assert not out.rejects
    assert [(r["id"], r["name"], r["updated"], r["_cdc"]["op"], r["_cdc"]["offset"], r["_cdc"]["target"])
            for r in got] == [(1, "a", 5, "I", 10, "mirror.public_accounts"), (2, "b", None, "I", 11, "mirror.public_accounts"),
                              (1, "a2", 6, "U", 12, "mirror.public_accounts"), (2, None, None, "D", 13, "mirror.public_accounts")]
