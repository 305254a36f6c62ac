"""Avro decoding in bulk (agents/formats/avro.py) against the JSON path, on the same events.

100k records of a 10-field record (a timestamp, a decimal, a nested record, an array, a map, ...),
written with fastavro's schemaless_writer and as JSON. Three ways, each into the same Arrow target:
  (a) decode_json on the JSON events (the baseline: today's path),
  (b) per record: a BytesIO + fastavro.schemaless_reader per payload in Python (with decode_avro's
      own writer schema, so only the loop differs), then from_pylist,
  (c) decode_avro: one in-memory object container, one block per payload, fastavro's reader loop.
Prints records/s and CPU us/record of each, and the ratios to (a); checks (b) and (c) give the
same table and (a) the same row count.

    .venv/bin/python bench/avro_bench.py [--records 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import io
import json
import time
from collections.abc import Callable
from typing import Any

import fastavro
import pyarrow as pa

from agents.convert import decode_json
from agents.formats.avro import avro_plan, decode_avro

SCHEMA = {
    "type": "record", "name": "Order", "namespace": "bench",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "paid", "type": "boolean"},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "street", "type": "string"}, {"name": "zip", "type": "string"}]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
    ],
}
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def events(n: int) -> list[dict[str, Any]]:
    return [{
        "order_id": i, "customer": f"customer-{i % 977}", "quantity": i % 13, "price": i * 0.25,
        "paid": i % 2 == 0, "placed": EPOCH + dt.timedelta(microseconds=i * 1_000_003),
        "total": decimal.Decimal(i * 7) / 100, "address": {"street": f"{i} Main St", "zip": f"{i % 99999:05d}"},
        "tags": ["a", "b", str(i % 5)], "attrs": {"x": i, "y": -i},
    } for i in range(n)]


def as_json(e: dict[str, Any]) -> bytes:
    return json.dumps({**e, "placed": e["placed"].isoformat(), "total": str(e["total"])}).encode()


def measure(name: str, run: Callable[[], Any], n: int, repeat: int) -> tuple[float, float, Any]:
    best_wall, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        out = run()
        best_wall, best_cpu = min(best_wall, time.perf_counter() - w), min(best_cpu, time.process_time() - c)
    print(f"{name:<44} {n / best_wall:>12,.0f} records/s {best_cpu / n * 1e6:>8.2f} CPU us/record")
    return best_wall, best_cpu, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.records
    recs = events(n)
    parsed = fastavro.parse_schema(SCHEMA)
    payloads = []
    for r in recs:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        payloads.append(buf.getvalue())
    jsons = [as_json(r) for r in recs]
    plan = avro_plan(json.dumps(SCHEMA))
    target = plan.arrow

    def per_record() -> pa.Table:
        rows = [fastavro.schemaless_reader(io.BytesIO(p), plan.parsed, None) for p in payloads]
        return pa.Table.from_pylist(rows, schema=target)

    print(f"{n:,} records, {sum(map(len, payloads)) / n:.0f} Avro bytes and {sum(map(len, jsons)) / n:.0f} JSON bytes each")
    a = measure("(a) decode_json (JSON, the baseline)", lambda: decode_json(jsons, target), n, args.repeat)
    b = measure("(b) schemaless_reader per record", per_record, n, args.repeat)
    c = measure("(c) decode_avro (one container, C loop)",
                lambda: decode_avro(payloads, plan, target, schema_id=1), n, args.repeat)
    assert a[2].table.num_rows == n and not a[2].rejects, a[2].rejects[:3]
    assert c[2].table.equals(b[2]) and not c[2].rejects, "decode_avro and schemaless_reader disagree"
    assert c[2].table.column("total").to_pylist() == [r["total"] for r in recs]
    print(f"CPU ratios to (a): (b) {b[1] / a[1]:.2f}, (c) {c[1] / a[1]:.2f}; (c) against (b): {c[1] / b[1]:.2f}")


if __name__ == "__main__":
    main()
