"""CPU per record of a worker's decode with and without value transforms, in process.

    python bench/transforms_bench.py [--records N] [--batch B] [--repeat R]

The same pizza records (``icesink.app.pizzas``) go through ``RecordFormat.convert`` (what a
worker runs on each fetched batch: the JSON decode, the value transforms, InsertField's columns)
against the table each configuration auto-creates, in batches of ``--batch``. Prints process
CPU us/record, best of ``--repeat`` rounds (rounds interleave the configurations, so a machine
whose load changes skews them alike), for: no transforms; each of the three transforms of
issue 39's chain alone (``c`` = ``Cast$Value`` ``spec=store_id:int32``, ``r`` =
``ReplaceField$Value`` ``renames=sauce:sauce_kind``, ``i`` = ``InsertField$Value``
``static.field=src``, ``static.value=bench``); the chain ``c,r,i``; and the Cast on records
whose ``store_id`` is a numeric string (``"42"``, Cast's other common input) and on a mix (every
other record a string).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.formats import RecordFormat
from bench.benchlib import best_seconds
from icesink.app.pizzas import pizza_values
from icesink.shared.config import build

C = "org.apache.kafka.connect.transforms."
CAST = {"transforms.c.type": f"{C}Cast$Value", "transforms.c.spec": "store_id:int32"}
RENAME = {"transforms.r.type": f"{C}ReplaceField$Value", "transforms.r.renames": "sauce:sauce_kind"}
INSERT = {"transforms.i.type": f"{C}InsertField$Value", "transforms.i.static.field": "src",
          "transforms.i.static.value": "bench"}
CONFIGS: dict[str, dict[str, str]] = {
    "none": {},
    "c (Cast)": {"transforms": "c", **CAST},
    "r (ReplaceField)": {"transforms": "r", **RENAME},
    "i (InsertField)": {"transforms": "i", **INSERT},
    "c,r,i": {"transforms": "c,r,i", **CAST, **RENAME, **INSERT},
}


@dataclass
class Msg:
    """A consumed record as the decoders read it."""

    value: bytes | None
    offset: int = 0
    headers: Any = ()
    topic: str = "pizzas"
    partition: int = 0
    timestamp: int | None = 0
    key: bytes | None = None


def runner(keys: dict[str, str], values: list[bytes], batch: int) -> Callable[[], int]:
    """A function converting ``values`` in batches as a worker does; returns the rows it made."""
    fmt = RecordFormat(build({"topics": "pizzas", "iceberg.tables": "db.pizzas", **keys}))
    created = fmt.table_schema(values[:batch])
    assert created is not None
    target = created if isinstance(created, pa.Schema) else schema_to_pyarrow(created, include_field_ids=False)
    batches = [(values[i : i + batch], [Msg(v, offset=i + k) for k, v in enumerate(values[i : i + batch])])
               for i in range(0, len(values), batch)]

    def run() -> int:
        rows = 0
        for vs, ms in batches:
            out = fmt.convert(ms, vs, target)
            assert not out.rejects, out.rejects[:3]
            rows += out.table.num_rows
        return rows

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n: int = args.records
    values = pizza_values(n, seed=7, spread_days=30)
    quoted = [v.replace(b'"store_id":', b'"store_id":"', 1).replace(b',"sauce"', b'","sauce"', 1) for v in values]
    mixed = [q if i % 2 else v for i, (v, q) in enumerate(zip(values, quoted, strict=True))]
    paths = {name: runner(keys, values, args.batch) for name, keys in CONFIGS.items()}
    paths["c, store_id strings"] = runner(CONFIGS["c (Cast)"], quoted, args.batch)
    paths["c, half strings"] = runner(CONFIGS["c (Cast)"], mixed, args.batch)
    for name, fn in paths.items():  # sanity, and warm
        assert fn() == n, name
    best = best_seconds(paths, args.repeat, time.process_time)
    base = best["none"]
    print(f"{n} pizza records in batches of {args.batch}, CPU best of {args.repeat}")
    for name, seconds in best.items():
        print(f"  {name:22s} {seconds / n * 1e6:7.2f} us/record   {seconds / base:5.2f} x none")


if __name__ == "__main__":
    main()
