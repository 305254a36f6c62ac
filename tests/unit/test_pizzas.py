from __future__ import annotations

import asyncio
import json
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from icesink.app.pizzas import (
    CHEESES,
    DATE_FORMAT,
    DEFAULT_START,
    MEATS,
    PIZZA_KEYS,
    SAUCES,
    VEGGIES,
    pizza_event,
    pizza_values,
    produce,
)


def _check_event(event: dict[str, object]) -> None:
    assert set(event) == set(PIZZA_KEYS)
    order_id = event["order_id"]
    assert isinstance(order_id, str)
    parsed = uuid.UUID(order_id)
    assert parsed.version == 4 and str(parsed) == order_id
    store_id = event["store_id"]
    assert type(store_id) is int and 1 <= store_id <= 120
    assert event["sauce"] in SAUCES
    assert event["cheese"] in CHEESES
    assert event["meats"] in MEATS
    assert event["veggies"] in VEGGIES
    date_ordered = event["date_ordered"]
    assert isinstance(date_ordered, str) and len(date_ordered) == 19
    datetime.strptime(date_ordered, DATE_FORMAT)


def test_event_has_exact_keys_and_domains() -> None:
    rng = random.Random(7)
    events = [pizza_event(rng) for _ in range(5000)]
    for event in events:
        _check_event(event)
    # The whole domain is used, not a corner of it.
    assert {e["store_id"] for e in events} == set(range(1, 121))
    assert {e["sauce"] for e in events} == set(SAUCES)
    assert {e["cheese"] for e in events} == set(CHEESES)
    assert {e["meats"] for e in events} == set(MEATS)
    assert {e["veggies"] for e in events} == set(VEGGIES)


def test_event_defaults_to_now_and_takes_overrides() -> None:
    before = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    event = pizza_event(random.Random(1))
    after = datetime.now(UTC).replace(tzinfo=None)
    assert before <= datetime.strptime(str(event["date_ordered"]), DATE_FORMAT) <= after

    when = datetime(2024, 2, 29, 23, 59, 58, 123456)
    event = pizza_event(random.Random(1), order_id="order-1", when=when)
    assert event["order_id"] == "order-1"
    assert event["date_ordered"] == "2024-02-29 23:59:58"


def test_event_is_deterministic_for_an_rng_seed() -> None:
    when = datetime(2026, 1, 1)
    first = [pizza_event(random.Random(3), when=when) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    assert pizza_event(random.Random(4), when=when) != first[0]


def test_values_are_compact_json_events() -> None:
    values = pizza_values(2000, seed=11)
    assert len(values) == 2000
    for value in values:
        assert isinstance(value, bytes)
        assert b'": ' not in value and b'", "' not in value
        event = json.loads(value)
        _check_event(event)
        assert list(event) == list(PIZZA_KEYS)


def test_values_are_deterministic_per_seed() -> None:
    assert pizza_values(3000, seed=5) == pizza_values(3000, seed=5)
    assert pizza_values(3000, seed=5, spread_days=3) == pizza_values(3000, seed=5, spread_days=3)
    assert pizza_values(100, seed=5) != pizza_values(100, seed=6)
    # A prefix of a longer run is the shorter run.
    assert pizza_values(500, seed=9)[:200] == pizza_values(200, seed=9)


def test_order_ids_are_unique() -> None:
    ids = [json.loads(v)["order_id"] for v in pizza_values(50_000, seed=0)]
    assert len(set(ids)) == len(ids)
    # Different seeds do not repeat each other's ids either.
    other = {json.loads(v)["order_id"] for v in pizza_values(1000, seed=1)}
    assert not other & set(ids)


def _days(values: list[bytes]) -> set[str]:
    return {json.loads(v)["date_ordered"][:10] for v in values}


def test_spread_days_gives_that_many_days() -> None:
    start = DEFAULT_START
    expected = {(start + timedelta(days=d)).strftime("%Y-%m-%d") for d in range(7)}
    assert _days(pizza_values(5000, seed=2, spread_days=7)) == expected
    assert _days(pizza_values(5000, seed=2, spread_days=0)) == {start.strftime("%Y-%m-%d")}
    assert _days(pizza_values(5000, seed=2, spread_days=1)) == {start.strftime("%Y-%m-%d")}
    # Times are spread over the day, not all at midnight.
    times = {json.loads(v)["date_ordered"][11:] for v in pizza_values(1000, seed=2)}
    assert len(times) > 900


def test_values_take_a_start_day() -> None:
    days = _days(pizza_values(2000, seed=2, spread_days=2, start=datetime(2025, 12, 31, 15, 30)))
    assert days == {"2025-12-31", "2026-01-01"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"partitions": 0}, "partitions"),
        ({"partitions": 2, "keys": [b"k"]}, "keys"),
        ({"partitions": 2, "rate_per_s": 0.0}, "rate_per_s"),
    ],
)
def test_produce_rejects_bad_arguments_before_connecting(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        # The bootstrap address is never contacted: validation comes first.
        asyncio.run(produce("127.0.0.1:1", "t", [b"a", b"b"], **kwargs))  # type: ignore[arg-type]
