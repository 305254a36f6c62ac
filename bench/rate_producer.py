"""Records at a steady rate from a librdkafka producer in a process of its own (ingest_bench --rate).

The earlier producer (aiokafka, one send per record, in the benchmark's own process and event
loop) delivered about 16.6k records/s when asked for 60k, and the report still printed the rate
asked for. This one runs confluent-kafka's Producer in a forked child, so its Python work shares
neither the benchmark's interpreter nor its loop: each tick it hands librdkafka every record
due by then (``rate * elapsed``), in order, record ``i`` to partition ``i % partitions``, and
reports what was acknowledged and when. The caller prints the rate delivered beside the rate asked.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TICK_S = 0.005  # how often records due are handed to librdkafka (a 60k/s rate: 300 a tick)


@dataclass(frozen=True)
class Delivered:
    """What the producer delivered: records acknowledged, and the seconds from its first send to
    its last acknowledgement (after ``flush``). ``failed``: the first delivery errors."""

    asked_rate: float
    records: int
    seconds: float
    failed: tuple[str, ...] = ()

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        return (f"{self.records:,} records acknowledged in {self.seconds:.1f} s: {self.rate:,.0f} records/s "
                f"delivered ({self.rate / self.asked_rate:.0%} of the {self.asked_rate:,.0f} asked)"
                + (f"; {len(self.failed)} delivery errors, e.g. {self.failed[0]}" if self.failed else ""))


def due(rate: float, elapsed_s: float, total: int) -> int:
    """How many records should have been handed over ``elapsed_s`` into a run at ``rate``."""
    return min(total, int(rate * elapsed_s) + 1) if elapsed_s >= 0 else 0


def _produce(bootstrap: str, topic: str, values: Sequence[bytes], partitions: int, rate: float, linger_ms: int,
             conn: Any) -> None:
    from confluent_kafka import Producer

    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": linger_ms, "enable.idempotence": False,
        "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1 << 20,
    })
    acked = 0
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        nonlocal acked
        if err is None:
            acked += 1
        elif len(failed) < 5:
            failed.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    produce, poll = producer.produce, producer.poll
    sent, total = 0, len(values)
    began = time.monotonic()
    while sent < total:
        target = due(rate, time.monotonic() - began, total)
        while sent < target:
            try:
                produce(topic, values[sent], partition=sent % partitions, on_delivery=delivered)
            except BufferError:  # librdkafka's queue is full: let it send, then go on
                poll(0.01)
                continue
            sent += 1
        poll(0)  # delivery callbacks
        if sent < total:
            time.sleep(TICK_S)
    left = producer.flush(120)
    seconds = time.monotonic() - began
    conn.send(Delivered(rate, acked, seconds, tuple(failed + ([f"{left} records unsent after flush"] if left else []))))
    conn.close()


def produce_at_rate(bootstrap: str, topic: str, values: Sequence[bytes], *, partitions: int, rate: float,
                    linger_ms: int = 50) -> Delivered:
    """Send ``values`` at ``rate`` records/s from a forked child; return what it delivered.
    Blocks until the child has flushed (or raise if it died)."""
    ctx = multiprocessing.get_context("fork")  # the child reads ``values`` without a copy through a pipe
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_produce, args=(bootstrap, topic, values, partitions, rate, linger_ms, child),
                       name="rate-producer", daemon=True)
    proc.start()
    child.close()
    try:
        result: Delivered = parent.recv()
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"the rate producer died (exit code {proc.exitcode}) before reporting") from None
    proc.join(30)
    return result
