"""The one backoff every retry loop uses (icesink/shared/retry.py)."""

import pytest

from icesink.shared.retry import Backoff


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_delays_double_from_the_first_and_stop_at_the_cap():
    b = Backoff(first_s=1.0, cap_s=30.0)
    assert [b.next() for _ in range(8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert b.attempts == 8
    assert Backoff(0.05, 1.0).delay(5) == 0.8 and Backoff(0.05, 1.0).delay(6) == 1.0
    assert Backoff(2.0, 60.0, factor=3.0).delay(3) == 18.0
    assert Backoff(1.0, 300.0).delay(10_000) == 300.0  # no overflow however long it failed


def test_reset_starts_again_from_the_first_delay():
    clock = Clock()
    b = Backoff(5.0, 300.0, clock=clock)
    b.next()
    b.next()
    assert b.wait_s() == 10.0
    b.reset()
    assert b.attempts == 0 and b.wait_s() == 0.0 and b.next() == 5.0


def test_wait_counts_down_on_the_clock_and_longest_waits_the_cap_at_once():
    clock = Clock()
    b = Backoff(1.0, 300.0, clock=clock)
    assert b.wait_s() == 0.0  # no failure: now
    assert b.next() == 1.0 and b.retry_at == 101.0
    clock.now += 0.25
    assert b.wait_s() == 0.75
    clock.now += 5
    assert b.wait_s() == 0.0
    assert b.next(longest=True) == 300.0 and b.attempts == 2 and b.retry_at == clock.now + 300.0


def test_a_deadline_allows_only_waits_that_end_before_it():
    clock = Clock()
    b = Backoff(1.0, 30.0, deadline_s=10.0, clock=clock)
    assert b.allows(b.next())  # 1 s: ends at 101 <= 110
    clock.now = 108.0
    assert b.allows(2.0) and not b.allows(2.5)
    assert Backoff(1.0, 30.0).allows(1e9)  # no deadline


def test_a_backoff_that_would_not_back_off_is_refused():
    with pytest.raises(ValueError, match="expected 0 <= first_s <= cap_s and factor >= 1"):
        Backoff(first_s=5.0, cap_s=1.0)
    with pytest.raises(ValueError, match="factor"):
        Backoff(1.0, 2.0, factor=0.5)


def test_creating_a_topic_backs_off_from_50_ms_doubling_to_one_second(monkeypatch):
    """icesink/shared/kafka_admin.py's CreateTopics loop: a retriable refusal (a timeout) is sent again
    after 0.05 s, doubling, capped at 1 s; the topic is then created."""
    import asyncio
    from types import SimpleNamespace

    from icesink.shared import kafka_admin

    slept: list[float] = []
    answers = iter([7] * 7 + [0])  # REQUEST_TIMED_OUT (retriable) seven times, then created

    class Admin:
        async def create_topics(self, topics):
            return SimpleNamespace(topic_errors=[("t", next(answers), None)])

    async def sleep(s):
        slept.append(s)

    monkeypatch.setattr(kafka_admin.asyncio, "sleep", sleep)
    assert asyncio.run(kafka_admin._create_topic(Admin(), "t", 1, 1, {}, "topic.replication.factor")) is True
    assert slept == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
