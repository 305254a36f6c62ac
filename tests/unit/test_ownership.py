"""Partitions a worker holds paused stay paused through Faust's resume after a rebalance
(agents/ownership.py, Ownership._hold_paused_partitions)."""

import asyncio
from types import SimpleNamespace

from faust.types import TP

from agents.buffer import Buffers
from agents.missing import MissingTables
from agents.worker import Worker
from icesink.protocol import Position, Resume, TopicPartition

P0, P1 = TopicPartition("t", 0), TopicPartition("t", 1)


class FaustConsumer:
    """Faust's pause and resume: a set of active partitions that getmany fetches from."""

    def __init__(self) -> None:
        self.active: set[TP] = set()
        self.seeks: list[dict[TP, int]] = []

    def pause_partitions(self, tps):
        self.active.difference_update(tps)

    def resume_partitions(self, tps):
        self.active.update(tps)

    async def seek_wait(self, offsets):
        self.seeks.append(dict(offsets))


def make_worker() -> Worker:
    w = Worker.__new__(Worker)
    w.worker_id = "w1"
    w.generation = 3
    w.buffers = Buffers(10**9)
    w.app = SimpleNamespace(consumer=FaustConsumer())
    w._backpressure = False
    w._rebalanced = asyncio.Event()
    w._claimed_at = {}
    w._open_round = None
    w._missing = MissingTables()
    w._update_paused = lambda: None

    async def supervise() -> None:
        return None

    w._supervise_coordinator = supervise
    for tp in (P0, P1):
        w.buffers.claim(tp, 3)
    w._hold_paused_partitions()
    return w


def faust_resumes_every_assigned_partition(w: Worker) -> None:
    """What Faust's Recovery._resume_streams does right after on_rebalance_complete."""
    w.app.consumer.resume_partitions({TP("t", 0), TP("t", 1)})


def test_claimed_partitions_stay_paused_through_faust_resume_until_the_coordinator_resumes_them():
    """Faust resumed every assigned partition after a rebalance: a claimed partition's records
    were then fetched, parsed and dropped until the coordinator's Resume came (a large part of
    a backlog at start-up; see bench/README.md, ingest_bench)."""
    w = make_worker()

    async def go() -> None:
        await w._on_rebalance_complete(None)
        faust_resumes_every_assigned_partition(w)
        assert w.app.consumer.active == set(), "claimed partitions were resumed before the coordinator said so"
        await w._on_resume(Resume(1, "w1", 3, (Position(P0, 7),)))
        assert w.app.consumer.active == {TP("t", 0)}
        assert w.app.consumer.seeks == [{TP("t", 0): 7}]

    asyncio.run(go())


def test_full_buffers_keep_active_partitions_paused_through_a_rebalance():
    w = make_worker()
    for tp in (P0, P1):
        w.buffers.resume(tp, 0, now=0.0)
    w._backpressure = True

    async def go() -> None:
        await w._on_rebalance_complete(None)
        faust_resumes_every_assigned_partition(w)
        assert w.app.consumer.active == set()
        w._backpressure = False  # what _release_backpressure does before its own resume
        w.app.consumer.resume_partitions([TP("t", 0), TP("t", 1)])
        assert w.app.consumer.active == {TP("t", 0), TP("t", 1)}

    asyncio.run(go())
