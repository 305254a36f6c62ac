"""An active partition behind its high watermark that takes no record for STALL_S is sought
again at its next offset and resumed (a fetch dropped in a rebalance or a broker restart must
not hold a partition that went quiet for ever). Records taken after that probe make it a stall
(warned, counted); none mean the offsets were no records (transaction markers), and the
partition is not probed again until its high watermark moves."""

from __future__ import annotations

import asyncio

from agents.ingest import STALL_S
from tests.unit.test_backpressure import FP, P, batch, make_parts

T0 = 1000.0


def stalled_worker(hw: int):
    w = make_parts(max_bytes=1 << 20)
    w.app.consumer.highwater = lambda tp: hw
    w.replica.generation = 1
    return w


def seeks(w) -> list:
    return [c for c in w.app.consumer.calls if c[0] in ("seek", "resume")]


def stalls(w) -> float:
    return w.metrics.partition_stalls.labels(topic="t", partition="0")._value.get()


def test_a_partition_behind_its_high_watermark_that_takes_nothing_is_probed_and_a_recovery_counts():
    w = stalled_worker(hw=100)

    async def run():
        await w.ingest.on_fetch(batch(0, 20))
        w.ingest.check_stalls(T0)
        w.ingest.check_stalls(T0 + STALL_S - 1)
        assert seeks(w) == []  # not yet
        w.ingest.check_stalls(T0 + STALL_S)
        await asyncio.sleep(0.01)
        assert seeks(w) == [("seek", {FP: 20}), ("resume", [FP])]
        assert not w.buffers.partitions[P].reseeking and stalls(w) == 0
        await w.ingest.on_fetch(batch(20, 100))  # the probe brought the records back: it was a stall
        w.ingest.check_stalls(T0 + STALL_S + 2)
        assert stalls(w) == 1

    asyncio.run(run())
    assert w.failures == []


def test_offsets_that_are_no_records_are_probed_once_until_the_high_watermark_moves():
    hw = [21]  # offset 20 is a transaction marker: no record will ever come for it
    w = stalled_worker(hw=0)
    w.app.consumer.highwater = lambda tp: hw[0]

    async def run():
        await w.ingest.on_fetch(batch(0, 20))
        w.ingest.check_stalls(T0)
        w.ingest.check_stalls(T0 + STALL_S)
        await asyncio.sleep(0.01)
        assert len(seeks(w)) == 2  # one probe
        for k in range(2, 10):
            w.ingest.check_stalls(T0 + k * STALL_S)
        await asyncio.sleep(0.01)
        assert len(seeks(w)) == 2 and stalls(w) == 0  # not probed again, nothing counted
        hw[0] = 40  # new records arrive but are not taken: probe again after STALL_S
        w.ingest.check_stalls(T0 + 10 * STALL_S)
        w.ingest.check_stalls(T0 + 11 * STALL_S)
        await asyncio.sleep(0.01)
        assert len(seeks(w)) == 4

    asyncio.run(run())


def test_a_partition_taking_records_or_caught_up_is_left_alone():
    w = stalled_worker(hw=100)

    async def run():
        await w.ingest.on_fetch(batch(0, 20))
        w.ingest.check_stalls(T0)
        await w.ingest.on_fetch(batch(20, 40))
        w.ingest.check_stalls(T0 + STALL_S)  # progress since: the clock starts again
        await asyncio.sleep(0.01)
        assert seeks(w) == []
        w.app.consumer.highwater = lambda tp: 40  # caught up
        w.ingest.check_stalls(T0 + 3 * STALL_S)
        w.ingest.check_stalls(T0 + 5 * STALL_S)
        await asyncio.sleep(0.01)
        assert seeks(w) == [] and stalls(w) == 0

    asyncio.run(run())


def test_no_stall_is_seen_while_the_buffers_are_full():
    w = stalled_worker(hw=100)

    async def run():
        await w.ingest.on_fetch(batch(0, 20))
        w.replica.backpressure = True
        w.ingest.check_stalls(T0)
        w.ingest.check_stalls(T0 + 2 * STALL_S)
        await asyncio.sleep(0.01)
        assert seeks(w) == []

    asyncio.run(run())
