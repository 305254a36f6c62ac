"""The acceptance scenario's data: random pizza orders from a chain of 120 stores.

Test, demo and benchmark data, not the sink's hot path. Everything is drawn from a caller's
``random.Random`` so a seed gives the same events every time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType, TimestampType

__all__ = [
    "CHEESES",
    "DATE_FORMAT",
    "DEFAULT_START",
    "MEATS",
    "PIZZA_KEYS",
    "SAUCES",
    "STORE_IDS",
    "VEGGIES",
    "pizza_event",
    "pizza_values",
    "produce",
]

logger = logging.getLogger(__name__)

SAUCES: Final = ("regular", "light", "extra")
CHEESES: Final = ("mozzarella", "three cheese", "vegan")
MEATS: Final = ("ham", "pepperoni", "sausage", "none")
VEGGIES: Final = ("onions & pineapple", "peppers", "olives", "none")
STORE_IDS: Final = range(1, 121)
PIZZA_KEYS: Final = (
    "order_id",
    "store_id",
    "sauce",
    "cheese",
    "meats",
    "veggies",
    "date_ordered",
)
DATE_FORMAT: Final = "%Y-%m-%d %H:%M:%S"

# The Iceberg schema of a pizza table created beforehand: date_ordered as a timestamp (an
# auto-created table keeps it as the string it arrives as).
PIZZA_SCHEMA: Final = Schema(
    NestedField(1, "order_id", StringType(), required=True),
    NestedField(2, "store_id", LongType()),
    NestedField(3, "sauce", StringType()),
    NestedField(4, "cheese", StringType()),
    NestedField(5, "meats", StringType()),
    NestedField(6, "veggies", StringType()),
    NestedField(7, "date_ordered", TimestampType()),
)
#: First day of :func:`pizza_values` orders unless a start is given (fixed, for determinism).
DEFAULT_START: Final = datetime(2026, 11, 1)

_SECONDS_PER_DAY: Final = 86_400
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def pizza_event(
    rng: random.Random, order_id: str | None = None, when: datetime | None = None
) -> dict[str, Any]:
    """One pizza order. ``when`` defaults to now (UTC, naive; seconds precision)."""
    if order_id is None:
        order_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if when is None:
        when = datetime.now(UTC).replace(tzinfo=None)
    return {
        "order_id": order_id,
        "store_id": rng.randint(STORE_IDS.start, STORE_IDS.stop - 1),
        "sauce": rng.choice(SAUCES),
        "cheese": rng.choice(CHEESES),
        "meats": rng.choice(MEATS),
        "veggies": rng.choice(VEGGIES),
        "date_ordered": when.strftime(DATE_FORMAT),
    }


def pizza_values(
    n: int, seed: int = 0, spread_days: int = 0, *, start: datetime | None = None
) -> list[bytes]:
    """``n`` pizza orders as compact UTF-8 JSON, the same for the same arguments.

    Orders fall at random seconds within ``max(spread_days, 1)`` days from ``start`` (midnight of
    :data:`DEFAULT_START` unless given), so ``spread_days > 1`` gives a day-partitioned table
    several partitions.
    """
    if n < 0 or spread_days < 0:
        raise ValueError(f"n and spread_days: expected >= 0, found {n} and {spread_days}")
    rng = random.Random(seed)
    base = (start or DEFAULT_START).replace(hour=0, minute=0, second=0, microsecond=0)
    span = max(spread_days, 1) * _SECONDS_PER_DAY
    out: list[bytes] = []
    append = out.append
    for _ in range(n):
        when = base + timedelta(seconds=rng.randrange(span))
        append(_encode(pizza_event(rng, when=when)).encode())
    return out


async def produce(
    bootstrap: str,
    topic: str,
    values: Sequence[bytes],
    *,
    partitions: int,
    keys: Sequence[bytes] | None = None,
    rate_per_s: float | None = None,
    client_kwargs: Mapping[str, Any] | None = None,
) -> None:
    """Send ``values`` to ``topic``; record ``i`` goes to partition ``i % partitions``.

    Uses a non-idempotent producer (``enable_idempotence=False``: Tansu has no InitProducerId)
    with ``acks="all"``. Without ``rate_per_s`` records are packed into record batches per
    partition (fastest); with it, they are sent one by one at that steady rate. Returns once
    every record is acknowledged; raises the first delivery error.
    """
    if partitions < 1:
        raise ValueError(f"partitions: expected >= 1, found {partitions}")
    if keys is not None and len(keys) != len(values):
        raise ValueError(f"keys: expected {len(values)} keys (one per value), found {len(keys)}")
    if rate_per_s is not None and rate_per_s <= 0:
        raise ValueError(f"rate_per_s: expected > 0 or None, found {rate_per_s}")
    from aiokafka import AIOKafkaProducer

    settings: dict[str, Any] = {
        "acks": "all",
        "linger_ms": 5,
        "max_batch_size": 256 * 1024,
        "max_request_size": 4 * 1024 * 1024,
        **dict(client_kwargs or {}),
        "enable_idempotence": False,
    }
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **settings)
    began = time.monotonic()
    await producer.start()
    try:
        if rate_per_s is None:
            await _produce_batched(producer, topic, values, keys, partitions)
        else:
            await _produce_paced(producer, topic, values, keys, partitions, rate_per_s)
        await producer.flush()
    finally:
        await producer.stop()
    elapsed = time.monotonic() - began
    logger.info(
        "produced %d records to %r in %.3f s (%.0f records/s)",
        len(values),
        topic,
        elapsed,
        len(values) / elapsed if elapsed > 0 else float("inf"),
    )


#: Delivery futures awaited at a time; bounds memory and surfaces errors early.
_MAX_PENDING: Final = 64


async def _produce_batched(
    producer: Any,
    topic: str,
    values: Sequence[bytes],
    keys: Sequence[bytes] | None,
    partitions: int,
) -> None:
    batches: dict[int, Any] = {}
    pending: list[asyncio.Future[Any]] = []

    async def submit(partition: int) -> None:
        batch = batches.pop(partition)
        pending.append(await producer.send_batch(batch, topic, partition=partition))
        if len(pending) >= _MAX_PENDING:
            await asyncio.gather(*pending)
            pending.clear()

    for i, value in enumerate(values):
        partition = i % partitions
        key = keys[i] if keys is not None else None
        batch = batches.get(partition)
        if batch is None:
            batch = batches[partition] = producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None) is None:
            await submit(partition)
            batch = batches[partition] = producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is None:
                raise ValueError(
                    f"record {i}: {len(value)} bytes do not fit in an empty batch; "
                    "raise max_batch_size in client_kwargs"
                )
    for partition in list(batches):
        await submit(partition)
    await asyncio.gather(*pending)


async def _produce_paced(
    producer: Any,
    topic: str,
    values: Sequence[bytes],
    keys: Sequence[bytes] | None,
    partitions: int,
    rate_per_s: float,
) -> None:
    pending: list[asyncio.Future[Any]] = []
    began = time.monotonic()
    for i, value in enumerate(values):
        ahead = began + i / rate_per_s - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
        key = keys[i] if keys is not None else None
        pending.append(await producer.send(topic, value, key=key, partition=i % partitions))
        if len(pending) >= 1024:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
