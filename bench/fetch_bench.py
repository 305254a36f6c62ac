"""What a fetched record costs a worker's Python before it is decoded, in ns per record.

    python bench/fetch_bench.py [--records N] [--repeat R]

Builds one fetch of pizza events as a broker returns it (aiokafka's own batch builder, 200
records a batch, uncompressed; N defaults to ``consumer.max-batch``, the most records a fetch
hands over) and times, best of R rounds, each path over all of it, with the worker's garbage
collector settings (icesink/shared/gc_tuning.py):

- aiokafka: what aiokafka's fetch does with them (``PartitionRecords``: the CRC check, the
  read_committed bookkeeping, one ``ConsumerRecord`` per record, in Faust's consumer thread);
- aiokafka-no-crc: the same with ``check_crcs`` off;
- record-batches: what the source consumer does now, a batch at a time
  (``agents.kafka.record_batches.take``: the same checks, a ``SourceRecord`` per record built in one
  list comprehension per batch);
- batches: iterating the batches' records only (aiokafka's C extension, no per-record Python):
  the floor of any reader that would take whole batches (the issue's "take whole fetched
  record batches"); what such a reader must still do per batch is the CRC check and the
  read_committed bookkeeping;
- serialized-bytes: the drain's raw-byte count of a fetch (``serialized_bytes``, the buffers'
  bound);
- screen: tombstones and oversized values dropped (``agents.deadletter.screen``).

A benchmark command, not a test: it prints figures and asserts only that every path saw
every record.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

from aiokafka.consumer.fetcher import READ_COMMITTED, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.deadletter import screen
from agents.kafka.record_batches import take
from agents.kafka.source_consumer import serialized_bytes
from bench.convert_bench import best_rates
from icesink.shared import gc_tuning
from icesink.app.pizzas import pizza_values

BATCH = 200


def record_batches(values: list[bytes]) -> bytes:
    """``values`` as consecutive v2 record batches from offset 0, as a fetch response holds them."""
    out = bytearray()
    for base in range(0, len(values), BATCH):
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
        for i, value in enumerate(values[base:base + BATCH]):
            builder.append(i, timestamp=1_700_000_000_000 + base + i, key=None, value=value, headers=[])
        batch = builder.build()
        batch[0:8] = struct.pack(">q", base)  # the batch's base offset
        out += batch
    return bytes(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    n: int = args.records
    raw = record_batches(pizza_values(n, seed=7, spread_days=30))
    tp = TopicPartition("pizzas", 0)

    def aiokafka(check_crcs: bool = True) -> list[object]:
        return list(PartitionRecords(tp, MemoryRecords(raw), [], 0, None, None, check_crcs, READ_COMMITTED))

    def batch_wise() -> list[object]:
        return take(PartitionRecords(tp, MemoryRecords(raw), [], 0, None, None, True, READ_COMMITTED), None)[0]

    def batches() -> list[object]:
        records, out = MemoryRecords(raw), []
        while records.has_next():
            out.extend(records.next_batch())
        return out

    consumer_records = aiokafka()
    assert len(consumer_records) == len(batches()) == len(batch_wise()) == n
    gc_tuning.tune()
    gc_tuning.freeze_start_up()
    rates = best_rates(n, args.repeat, {
        "aiokafka": aiokafka,
        "aiokafka-no-crc": lambda: aiokafka(check_crcs=False),
        "record-batches": batch_wise,
        "batches": batches,
        "serialized-bytes": lambda: serialized_bytes(consumer_records),
        "screen": lambda: screen(consumer_records, 1 << 24),
    })
    print(f"{n:,} pizza records in batches of {BATCH}, {len(raw) / n:.0f} bytes each, best of {args.repeat}")
    for name, rate in rates.items():
        print(f"  {name:18s} {1e9 / rate:8.0f} ns/record")


if __name__ == "__main__":
    main()
