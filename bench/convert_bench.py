"""Throughput of agents.convert.decode_json on pizza records, against raw pyarrow.json.

    python bench/convert_bench.py [--records N] [--repeat R]

Prints records/s (best of R runs) for:
- raw: ``pyarrow.json.read_json`` on the same values joined with newlines (the ceiling);
- infer: ``decode_json(values)`` (schema inferred, then decoded: two parses);
- coerce: ``decode_json(values, schema)`` with the schema pyiceberg gives an Iceberg table of
  pizzas (large strings, field ids, ``date_ordered`` as a timestamp);
- coerce-mixed: as coerce, but every other record sends ``store_id`` as a numeric string
  (``"42"``), the case that makes the reader quote the column's bare numbers;
- coerce-dirty: as coerce, with 1 record in 1000 malformed and 1 in 1000 with a bad timestamp;
- coerce-maps: as coerce, each record also carrying ``attrs`` (map<string, string>, 3 entries)
  and ``counts`` (map<string, long>, 2 entries): records are rewritten (one ``json.loads`` and
  ``json.dumps`` each) so pyarrow can parse maps as entry lists;
- coerce-maps-reference: the same batch through the per-record reference path alone;
- coerce-ci: as coerce, with ``fold_case`` (schema-case-insensitive) on records whose keys
  are spelt as the columns: the cost of the byte search that finds nothing to fold;
- coerce-ci-folded: as coerce-ci, but every other record spells ``Store_ID`` and
  ``SAUCE``: the batch is rewritten (one ``json.loads`` and ``json.dumps`` per record);
- coerce-price-double / coerce-price-decimal: as coerce, each record also carrying ``price``
  (``12.34``) and ``ratio`` (``1e-05``, a double), price a double or a decimal(9, 2) column: the
  cost of decimals, with the search for numbers Arrow's decimal parse may misread
  (agents/convert/plan.py ``_unsure_numbers``), which must not take ``ratio``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType, DoubleType, IntegerType, LongType, MapType, NestedField, StringType, TimestampType,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.convert import decode_json
from agents.convert.reference import Oracle
from bench.benchlib import best_seconds
from icesink.app.pizzas import pizza_values

PIZZA_SCHEMA = Schema(
    NestedField(1, "order_id", StringType(), required=True),
    NestedField(2, "store_id", IntegerType(), required=True),
    NestedField(3, "sauce", StringType()),
    NestedField(4, "cheese", StringType()),
    NestedField(5, "meats", StringType()),
    NestedField(6, "veggies", StringType()),
    NestedField(7, "date_ordered", TimestampType()),
)
MAP_SCHEMA = Schema(
    *PIZZA_SCHEMA.fields,
    NestedField(8, "attrs", MapType(9, StringType(), 10, StringType())),
    NestedField(11, "counts", MapType(12, StringType(), 13, LongType())),
)
PRICED = {
    kind: Schema(*PIZZA_SCHEMA.fields, NestedField(8, "price", t), NestedField(9, "ratio", DoubleType()))
    for kind, t in (("double", DoubleType()), ("decimal", DecimalType(9, 2)))
}


def best_rates(n: int, repeat: int, paths: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Records/s of each path, best of ``repeat`` interleaved rounds (benchlib.best_seconds)."""
    return {name: n / seconds for name, seconds in best_seconds(paths, repeat).items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n: int = args.records

    values = pizza_values(n, seed=7, spread_days=30)
    schema = schema_to_pyarrow(PIZZA_SCHEMA)
    mixed = [
        v.replace(b'"store_id":', b'"store_id":"', 1).replace(b',"sauce"', b'","sauce"', 1) if i % 2 else v
        for i, v in enumerate(values)
    ]
    dirty = list(values)
    for i in range(0, n, 1000):
        dirty[i] = dirty[i][:-5]
    for i in range(500, n, 1000):
        dirty[i] = dirty[i].replace(b'"date_ordered":"', b'"date_ordered":"x', 1)

    map_schema = schema_to_pyarrow(MAP_SCHEMA)
    maps = [
        v[:-1] + b',"attrs":{"crust":"thin","size":"%d","oven":"stone"},"counts":{"slices":%d,"boxes":1}}' % (i % 3, i % 12)
        for i, v in enumerate(values)
    ]
    oracle = Oracle(map_schema, "ms")
    miscased = [
        v.replace(b'"store_id":', b'"Store_ID":', 1).replace(b'"sauce":', b'"SAUCE":', 1) if i % 2 else v
        for i, v in enumerate(values)
    ]

    priced = [v[:-1] + b',"price":%d.%02d,"ratio":1e-05}' % (i % 100, i % 97) for i, v in enumerate(values)]
    priced_schemas = {kind: schema_to_pyarrow(s) for kind, s in PRICED.items()}

    # Sanity: every path converts what it should.
    for kind, s in priced_schemas.items():
        assert decode_json(priced, s).table.num_rows == n, kind
    assert decode_json(maps, map_schema).table.num_rows == n
    assert decode_json(values, schema).table.num_rows == n
    assert decode_json(mixed, schema).table.num_rows == n
    assert len(decode_json(dirty, schema).rejects) == 2 * len(range(0, n, 1000))
    assert decode_json(values).table.schema.field("date_ordered").type == pa.string()
    assert decode_json(miscased, schema, fold_case=True).table.equals(decode_json(values, schema).table)

    joined = b"\n".join(values)
    rates = best_rates(
        n,
        args.repeat,
        {
            "raw pyarrow.json": lambda: pj.read_json(pa.BufferReader(joined)),
            "infer": lambda: decode_json(values),
            "coerce": lambda: decode_json(values, schema),
            "coerce-mixed": lambda: decode_json(mixed, schema),
            "coerce-dirty": lambda: decode_json(dirty, schema),
            "coerce-maps": lambda: decode_json(maps, map_schema),
            "coerce-maps-reference": lambda: [oracle.row(v) for v in maps],
            "coerce-ci": lambda: decode_json(values, schema, fold_case=True),
            "coerce-ci-folded": lambda: decode_json(miscased, schema, fold_case=True),
            "coerce-price-double": lambda: decode_json(priced, priced_schemas["double"]),
            "coerce-price-decimal": lambda: decode_json(priced, priced_schemas["decimal"]),
        },
    )
    raw = rates["raw pyarrow.json"]
    print(f"{n} pizza records, {len(joined) / n:.0f} bytes each, best of {args.repeat}")
    for name, rate in rates.items():
        print(f"  {name:22s} {rate:>12,.0f} records/s   {rate / raw:6.2f} x raw")


if __name__ == "__main__":
    main()
