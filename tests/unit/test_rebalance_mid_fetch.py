"""A rebalance while a fetch is converted (agents/ingest.py Ingest.buffer awaits the registry, the
catalog and the dead letters on the way): the fetch's records belong to the generation that read
them. Once their partition moved away they are not buffered (a KeyError stopped the replica in
CI, test_sink's restarts on Kafka), and once it came back in a new generation they are not
added to what the new generation resumes from: the new owner reads them again from the
accepted position."""

from __future__ import annotations

import asyncio

from faust.types import TP

from tests.unit.test_backpressure import P, batch, make_parts


def converting_through(w, rebalance) -> None:
    """``rebalance`` runs while the next fetch waits in the decoder's first step."""
    prepare = w.decoder.prepare

    async def prepare_during_a_rebalance(values, messages=()):
        await rebalance()
        return await prepare(values, messages)

    w.decoder.prepare = prepare_during_a_rebalance


def test_a_fetch_of_a_partition_that_moved_away_while_it_was_converted_is_not_buffered():
    w = make_parts(max_bytes=1 << 20)
    w.app.consumer_generation_id = 2

    async def moved_away() -> None:
        await w.ownership.on_revoked(None, {TP(P.topic, P.partition)})
        await w.ownership.on_assigned(None, set())

    async def run():
        await w.ingest.on_fetch(batch(0, 10))
        converting_through(w, moved_away)
        await w.ingest.on_fetch(batch(10, 20))

    asyncio.run(run())
    assert P not in w.buffers.partitions and w.buffers.rows == 0 and w.buffers.nbytes == 0
    assert w.failures == []


def test_a_fetch_of_the_generation_before_is_not_added_to_a_partition_that_came_back():
    w = make_parts(max_bytes=1 << 20)
    w.app.consumer_generation_id = 2

    async def came_back() -> None:
        await w.ownership.on_revoked(None, {TP(P.topic, P.partition)})
        await w.ownership.on_assigned(None, {TP(P.topic, P.partition)})

    async def run():
        await w.ingest.on_fetch(batch(0, 10))
        converting_through(w, came_back)
        await w.ingest.on_fetch(batch(10, 20))
        await asyncio.sleep(0)  # the claim's task

    asyncio.run(run())
    st = w.buffers.partitions[P]
    assert (st.generation, st.active, st.range_start, st.next_offset) == (2, False, 0, 10)
    assert w.buffers.rows == 10 and [c.rows for c in st.chunks] == [10]
    assert w.failures == []
