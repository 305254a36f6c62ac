"""Partitions a worker holds paused stay paused through Faust's resume after a rebalance
(agents/ownership.py, Ownership.hold_paused_partitions)."""

import asyncio
from types import SimpleNamespace

from faust.types import TP

from agents.buffer import Buffers
from agents.missing import MissingTables
from agents.ownership import Ownership
from agents.parts import Replica
from agents.tasks import TaskOwner
from icesink.shared.protocol import Position, Resume, TopicPartition

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


class Hooks:
    """What ownership asks of the rest of the replica (agents/ownership.py, OwnershipHooks)."""

    async def started(self) -> bool:
        return True

    def settle_voided(self) -> None:
        return None

    def answer_open_round(self) -> None:
        return None

    async def supervise_coordinator(self) -> None:
        return None

    def update_paused(self) -> None:
        return None


async def no_send(event) -> None:
    raise AssertionError(f"nothing is sent here: {event}")


def make_ownership() -> Ownership:
    replica = Replica("w1", {}, generation=3)
    buffers = Buffers(10**9)
    app = SimpleNamespace(consumer=FaustConsumer())
    own = Ownership(["t"], replica, buffers, MissingTables(), app, no_send, TaskOwner(lambda exc: None), Hooks())
    for tp in (P0, P1):
        buffers.claim(tp, 3)
    own.hold_paused_partitions()
    return own


def faust_resumes_every_assigned_partition(w: Ownership) -> None:
    """What Faust's Recovery._resume_streams does right after on_rebalance_complete."""
    w.app.consumer.resume_partitions({TP("t", 0), TP("t", 1)})


def test_claimed_partitions_stay_paused_through_faust_resume_until_the_coordinator_resumes_them():
    """Faust resumed every assigned partition after a rebalance: a claimed partition's records
    were then fetched, parsed and dropped until the coordinator's Resume came (a large part of
    a backlog at start-up; see bench/README.md, ingest_bench)."""
    w = make_ownership()

    async def go() -> None:
        await w.on_rebalance_complete(None)
        faust_resumes_every_assigned_partition(w)
        assert w.app.consumer.active == set(), "claimed partitions were resumed before the coordinator said so"
        await w.on_resume(Resume(1, "w1", 3, (Position(P0, 7),)))
        assert w.app.consumer.active == {TP("t", 0)}
        assert w.app.consumer.seeks == [{TP("t", 0): 7}]

    asyncio.run(go())


def test_full_buffers_keep_active_partitions_paused_through_a_rebalance():
    w = make_ownership()
    for tp in (P0, P1):
        w.buffers.resume(tp, 0, now=0.0)
    w.replica.backpressure = True

    async def go() -> None:
        await w.on_rebalance_complete(None)
        faust_resumes_every_assigned_partition(w)
        assert w.app.consumer.active == set()
        w.replica.backpressure = False  # what _release_backpressure does before its own resume
        w.app.consumer.resume_partitions([TP("t", 0), TP("t", 1)])
        assert w.app.consumer.active == {TP("t", 0), TP("t", 1)}

    asyncio.run(go())


class Starting(Hooks):
    """A replica still starting: its parts are built while the group join is answered (agents/assembly.py)."""

    def __init__(self) -> None:
        self.ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.supervised = 0

    async def started(self) -> bool:
        return await asyncio.shield(self.ready)

    async def supervise_coordinator(self) -> None:
        self.supervised += 1


def test_claims_and_the_coordinator_wait_for_the_start_up_but_the_rebalance_signals_do_not():
    """The join is asked for before the group's key and the catalog are loaded: a claim sent then
    would go unsigned, and a coordinator would start without its catalog. The signals still return
    at once: aiokafka sends no heartbeat while its rebalance listener runs, and a start-up longer
    than the session would have the member evicted. Claimed partitions stay paused meanwhile. After
    a failed start-up nothing is claimed."""

    async def go(outcome: bool) -> tuple[list[object], list[TopicPartition], int]:
        sent: list[object] = []

        async def send(event) -> None:
            sent.append(event)

        hooks = Starting()
        app = SimpleNamespace(consumer=FaustConsumer(), consumer_generation_id=4,
                              consumer_group_member_id="m")
        own = Ownership(["t"], Replica("w1", {}), Buffers(10**9), MissingTables(), app, send,
                        TaskOwner(lambda exc: None), hooks)
        own.hold_paused_partitions()
        await asyncio.wait_for(own.on_assigned(None, {TP("t", 0)}), 1)
        await asyncio.wait_for(own.on_rebalance_complete(None), 1)
        app.consumer.resume_partitions({TP("t", 0)})  # Faust's resume after the rebalance
        await asyncio.sleep(0.05)
        assert sent == [] and hooks.supervised == 0 and app.consumer.active == set()
        hooks.ready.set_result(outcome)
        await asyncio.sleep(0.05)  # the claim is sent in a task of its own
        return sent, list(own.buffers.partitions), hooks.supervised

    sent, claimed, supervised = asyncio.run(go(True))
    assert [type(e).__name__ for e in sent] == ["Claim"] and claimed == [P0] and supervised == 1
    sent, claimed, supervised = asyncio.run(go(False))
    assert sent == [] and supervised == 0


def test_a_start_up_that_ends_inside_a_later_rebalance_claims_and_leads_with_the_new_assignment_only():
    """The old assignment is being replaced: a claim of it (or a coordinator started on it, while
    Faust still says this replica leads) would act on partitions that are moving."""

    async def go() -> tuple[list[object], int]:
        sent: list[object] = []

        async def send(event) -> None:
            sent.append(event)

        hooks = Starting()
        app = SimpleNamespace(consumer=FaustConsumer(), consumer_generation_id=4, consumer_group_member_id="m")
        own = Ownership(["t"], Replica("w1", {}), Buffers(10**9), MissingTables(), app, send,
                        TaskOwner(lambda exc: None), hooks)
        await own.on_assigned(None, {TP("t", 0), TP("t", 1)})
        await own.on_rebalance_complete(None)
        await own.on_revoked(None, {TP("t", 0), TP("t", 1)})  # generation 5 begins
        hooks.ready.set_result(True)
        await asyncio.sleep(0.05)
        assert sent == [] and hooks.supervised == 0
        app.consumer_generation_id = 5
        await own.on_assigned(None, {TP("t", 1)})
        await own.on_rebalance_complete(None)
        await asyncio.sleep(0.05)
        return sent, hooks.supervised

    sent, supervised = asyncio.run(go())
    assert [(e.generation, e.partitions) for e in sent] == [(5, (P1,))] and supervised == 1
