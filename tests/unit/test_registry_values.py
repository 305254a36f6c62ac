"""Registry-framed Avro values through the record format (issue 36 point 2), with a fake
registry: one Arrow batch per schema id, evolution across ids, rejects naming the id."""

from __future__ import annotations

import asyncio
import io
import json
import struct
from dataclasses import dataclass, field
from typing import Any

import fastavro
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow

from agents.evolution import Evolver
from agents.formats import RecordFormat
from agents.formats.registry_values import RegistryValues
from icesink.shared.config import build
from tests.unit.test_raw_values import Msg  # a message as Faust hands it

V1 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "item", "type": {"type": "record", "name": "Item", "fields": [{"name": "sku", "type": "string"}]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}


@dataclass
class Registered:
    type: str
    text: str
    references: tuple[Any, ...] = ()


@dataclass
class FakeRegistry:
    schemas: dict[int, Any]
    asked: list[int] = field(default_factory=list)

    async def __call__(self, schema_id: int) -> Registered | None:
        self.asked.append(schema_id)
        s = self.schemas.get(schema_id)
        return None if s is None else Registered("AVRO", json.dumps(s))


def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">i", schema_id) + out.getvalue()


def fmt(registry: Any) -> RecordFormat:
    s = build({"topics": "t", "iceberg.tables": "db.t", "value.converter": "io.confluent.connect.avro.AvroConverter",
               "value.converter.schema.registry.url": "http://127.0.0.1:1"})
    return RecordFormat(s, registry=RegistryValues(registry))


def test_two_schema_ids_in_one_batch_evolve_the_table_and_land_together() -> None:
    registry = FakeRegistry({1: V1, 2: V2})
    f = fmt(registry)
    r1 = {"id": 1, "item": {"sku": "a"}, "tags": ["x"]}
    r2 = {"id": 2, "item": {"sku": "b"}, "tags": [], "note": "hi"}
    values = [framed(1, V1, r1), framed(2, V2, r2), framed(1, V1, {**r1, "id": 3})]
    asyncio.run(f.registry.prepare(values))  # type: ignore[union-attr]
    asyncio.run(f.registry.prepare(values))  # type: ignore[union-attr]
    assert registry.asked == [1, 2]  # once per id
    created = f.table_schema(values[:1])
    assert created is not None and [c.name for c in created.columns] == ["id", "item", "tags"]
    table = schema_to_pyarrow(created)
    growth = Evolver("w", evolve=True, case_insensitive=False).growth("db.t", table)
    out = growth.done(f.convert([Msg(v) for v in values], values, growth.schema, grow=growth))
    assert out.proposal is not None  # the table grows by the v2 field
    got = out.converted.table
    assert got.column_names == ["id", "item", "tags", "note"]
    assert got.to_pylist() == [
        {"id": 1, "item": {"sku": "a"}, "tags": ["x"], "note": None},
        {"id": 2, "item": {"sku": "b"}, "tags": [], "note": "hi"},
        {"id": 3, "item": {"sku": "a"}, "tags": ["x"], "note": None},
    ]
    assert out.converted.indices.to_pylist() == [0, 1, 2]


def test_bad_frames_unknown_ids_and_garbage_payloads_are_rejects_naming_the_id_and_the_rest_land() -> None:
    f = fmt(FakeRegistry({1: V1}))
    good = framed(1, V1, {"id": 7, "item": {"sku": "s"}, "tags": []})
    values = [b'{"id": 1}', good, framed(99, V1, {"id": 8, "item": {"sku": "s"}, "tags": []}),
              b"\x00\x00\x00\x00\x01\xff\xff\xff", good]
    asyncio.run(f.registry.prepare(values))  # type: ignore[union-attr]
    schema = f.table_schema(values)
    assert schema is not None
    out = f.convert([Msg(v) for v in values], values, schema_to_pyarrow(schema))
    assert out.table.column("id").to_pylist() == [7, 7]
    assert out.indices.to_pylist() == [1, 4]
    reasons = {r.index: r.reason for r in out.rejects}
    assert sorted(reasons) == [0, 2, 3]
    assert "magic byte 0x7b" in reasons[0]
    assert "schema id 99 is unknown" in reasons[2]
    assert "schema id 1" in reasons[3] and "does not decode" in reasons[3]


def test_with_no_registry_record_the_table_is_not_created() -> None:
    f = fmt(FakeRegistry({}))
    values = [framed(5, V1, {"id": 1, "item": {"sku": "a"}, "tags": []})]
    asyncio.run(f.registry.prepare(values))  # type: ignore[union-attr]
    assert f.table_schema(values) is None
    out = f.convert([Msg(v) for v in values], values, pa.schema([pa.field("id", pa.int64())]))
    assert out.table.num_rows == 0 and "schema id 5 is unknown" in out.rejects[0].reason


@dataclass
class Ref:
    schema: Registered


def test_a_schema_with_references_decodes_with_the_referenced_types() -> None:
    money = {"type": "record", "name": "Money", "namespace": "shop", "fields": [{"name": "cents", "type": "long"}]}
    customer = {"type": "record", "name": "Customer", "namespace": "shop",
                "fields": [{"name": "name", "type": "string"}, {"name": "credit", "type": "shop.Money"}]}
    order = {"type": "record", "name": "Order", "namespace": "shop",
             "fields": [{"name": "id", "type": "long"}, {"name": "customer", "type": "shop.Customer"}]}
    whole = {**order, "fields": [order["fields"][0], {"name": "customer", "type": {**customer, "fields": [
        customer["fields"][0], {"name": "credit", "type": money}]}}]}

    async def schema_of(schema_id: int) -> Registered:
        money_ref = Ref(Registered("AVRO", json.dumps(money)))
        customer_ref = Ref(Registered("AVRO", json.dumps(customer), (money_ref,)))
        return Registered("AVRO", json.dumps(order), (customer_ref,))

    f = fmt(schema_of)
    values = [framed(3, whole, {"id": 1, "customer": {"name": "a", "credit": {"cents": 5}}})]
    asyncio.run(f.registry.prepare(values))  # type: ignore[union-attr]
    schema = f.table_schema(values)
    assert schema is not None
    out = f.convert([Msg(v) for v in values], values, schema_to_pyarrow(schema))
    assert not out.rejects, out.rejects
    assert out.table.to_pylist() == [{"id": 1, "customer": {"name": "a", "credit": {"cents": 5}}}]
