"""An active partition behind its high watermark that takes no record for STALL_S is sought
again at its next offset and resumed (a fetch dropped in a rebalance or a broker restart must
not hold a partition that went quiet for ever)."""

from __future__ import annotations

import asyncio

from agents.ingest import STALL_S
from agents.tasks import TaskOwner
from tests.unit.test_backpressure import FP, P, batch, make_worker


def stalled_worker(hw: int):
    w = make_worker(max_bytes=1 << 20)
    w.app.consumer.highwater = lambda tp: hw
    w._progress = {}
    w.generation = 1
    w.failures = []
    w._owner = TaskOwner(w.failures.append)
    return w


def seeks(w) -> list:
    return [c for c in w.app.consumer.calls if c[0] in ("seek", "resume")]


def test_a_partition_behind_its_high_watermark_that_takes_nothing_is_sought_again():
    w = stalled_worker(hw=100)

    async def run():
        await w.on_fetch(batch(0, 20))
        w._check_stalls(1000.0)
        w._check_stalls(1000.0 + STALL_S - 1)
        assert seeks(w) == []  # not yet
        w._check_stalls(1000.0 + STALL_S)
        await asyncio.sleep(0.01)
        assert seeks(w) == [("seek", {FP: 20}), ("resume", [FP])]
        assert not w.buffers.partitions[P].reseeking
        w._check_stalls(1000.0 + STALL_S + 1)  # the clock starts again after a seek
        await asyncio.sleep(0.01)
        assert len(seeks(w)) == 2

    asyncio.run(run())
    assert w.failures == []
    assert w.metrics.partition_stalls.labels(topic="t", partition="0")._value.get() == 1


def test_a_partition_taking_records_or_caught_up_is_left_alone():
    w = stalled_worker(hw=100)

    async def run():
        await w.on_fetch(batch(0, 20))
        w._check_stalls(1000.0)
        await w.on_fetch(batch(20, 40))
        w._check_stalls(1000.0 + STALL_S)  # progress since: the clock starts again
        await asyncio.sleep(0.01)
        assert seeks(w) == []
        w.app.consumer.highwater = lambda tp: 40  # caught up
        w._check_stalls(1000.0 + 3 * STALL_S)
        w._check_stalls(1000.0 + 5 * STALL_S)
        await asyncio.sleep(0.01)
        assert seeks(w) == []

    asyncio.run(run())


def test_no_stall_is_seen_while_the_buffers_are_full():
    w = stalled_worker(hw=100)

    async def run():
        await w.on_fetch(batch(0, 20))
        w._backpressure = True
        w._check_stalls(1000.0)
        w._check_stalls(1000.0 + 2 * STALL_S)
        await asyncio.sleep(0.01)
        assert seeks(w) == []

    asyncio.run(run())
