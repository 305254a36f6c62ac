"""A worker's handling of fetches routed to many tables of one schema, in process:
``python bench/fanout_bench.py [--tables 200] [--fetch 300] [--records 60000] [--repeat 7]``.

Feeds ``--records`` pizza events, each with a route field naming one of ``--tables`` dynamic
tables (as ``ingest_bench.py --tables`` does; Kafka metadata columns on), through
``Ingest.buffer`` (agents/ingest.py) in fetches of ``--fetch`` records, with the tables already created: once as
the worker does it (a fan-out decoded once and routed by the decoded column,
``agents/decode.py``, ``BatchDecoder.decode_fanout``) and once the usual way (the router reads every record
for its route field, then one shared decode), alternating; then the round's rows per table are
taken as a round takes them (``Snapshot.tables``). Prints the process CPU per record of each run
and the medians. No broker, Spark or catalog: the rows are only counted. Nothing is asserted;
the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry
from pyiceberg.io.pyarrow import schema_to_pyarrow

from agents.buffer import Buffers
from agents.deadletter import DeadLetters
from agents.decode import BatchDecoder
from agents.formats import RecordFormat
from agents.ingest import Ingest
from agents.missing import MissingTables
from agents.parts import Replica
from agents.routing import Router
from agents.tasks import TaskOwner
from bench.ingest_bench import ROUTE_FIELD, routed
from icesink.app.pizzas import pizza_values
from icesink.shared.config import build
from icesink.shared.metrics import Metrics
from icesink.shared.protocol import TopicPartition

TP = TopicPartition("pizzas", 0)


class Message:
    """The fields of a consumed record that ``_buffer`` reads."""

    __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(self, offset: int, value: bytes) -> None:
        self.offset, self.value, self.key, self.headers = offset, value, None, []
        self.topic, self.partition, self.timestamp = TP.topic, TP.partition, 1_700_000_000_000


class Tables:
    """The replica's tables (agents/table_lookup.py TableLookup), all created already."""

    def __init__(self, targets: dict[str, Any]) -> None:
        self.targets = targets

    async def target(self, name: str, values: list[bytes]) -> Any:
        return self.targets.get(name)

    async def held_back(self, tp: TopicPartition, names: Any) -> list[str]:
        return []

    async def look_for_missing(self) -> list[TopicPartition]:
        return []


async def _no_send(event: Any) -> None:
    raise AssertionError(f"nothing is sent: {event!r}")


def worker(tables: int, sample: list[bytes], read_once: bool) -> Ingest:
    """A worker's ingest without clients (only what ``Ingest.buffer`` uses), its ``tables`` tables created."""
    settings = build({
        "topics": TP.topic, "iceberg.tables": "", "iceberg.tables.route-field": ROUTE_FIELD,
        "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.kafka-metadata-enabled": "true",
        "state.dir": tempfile.mkdtemp(prefix="fanout-bench-"), "group.id": "bench",
    })
    metrics = Metrics(CollectorRegistry())
    fmt = RecordFormat(settings)
    schema = fmt.table_schema(sample)
    assert schema is not None
    target = SimpleNamespace(arrow_schema=schema_to_pyarrow(schema), keys=None)
    targets: dict[str, Any] = {f"bench.t{i:03d}": target for i in range(tables)}
    decoder = BatchDecoder(settings, fmt, Router(settings), None, None, targets, _no_send)
    if not read_once:
        decoder.decode_fanout = lambda *_: None
    buffers = Buffers(1 << 40)
    ingest = Ingest(settings, metrics, Replica("bench", {}), buffers, MissingTables(), decoder,
                    DeadLetters(settings, metrics, "w1"), Tables(targets), SimpleNamespace(), None,
                    TaskOwner(lambda exc: None), _no_send, lambda: None)
    buffers.claim(TP, 1)
    buffers.resume(TP, 0, now=0.0)
    return ingest


def cpu_per_record(w: Ingest, messages: list[Message], fetch: int) -> float:
    state = w.buffers.partitions[TP]

    async def feed() -> None:
        for start in range(0, len(messages), fetch):
            await w.buffer(state, messages[start:start + fetch])

    began = time.process_time()
    asyncio.run(feed())
    assert w.buffers.rows == len(messages), f"{w.buffers.rows} of {len(messages)} rows buffered"
    tables = w.buffers.take(1).tables()  # the round's rows per table
    spent = time.process_time() - began
    assert sum(t.num_rows for t in tables.values()) == len(messages)
    return spent / len(messages) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--fetch", type=int, default=300, help="records per fetch of one partition")
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    values = routed(pizza_values(args.records, seed=2), args.tables)
    messages = [Message(i, v) for i, v in enumerate(values)]
    runs: dict[str, list[float]] = {"the usual way": [], "read once": []}
    for _ in range(args.repeat):
        for label in runs:
            runs[label].append(cpu_per_record(worker(args.tables, values[:50], label == "read once"), messages,
                                              args.fetch))
    print(f"{args.records:,} records routed to {args.tables} tables, fetches of {args.fetch}, CPU us per record:")
    for label, xs in runs.items():
        print(f"  {label:>13}: median {statistics.median(xs):5.1f} ({', '.join(f'{x:.1f}' for x in xs)})")


if __name__ == "__main__":
    main()
