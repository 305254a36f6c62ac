"""Early rounds besides the interval (docs/commits.md, "When a round starts"): a replica asks
for one when the data no round took yet passes iceberg.control.commit.max-records or
max-bytes, once per round that took data (and again every REQUEST_EVERY_S while none comes);
after an idle round (a CommitComplete that moved no position) the coordinator waits
commit.idle-interval-ms, and the first rows buffered after it ask for a round at once. And
icesink_uncommitted_age_seconds, the age of the oldest row not yet covered by a CommitComplete."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from agents import ingest as ingest_module
from coordinator.service import Coordinator
from icesink.shared.config import build
from icesink.shared.errors import ConfigError
from icesink.shared.protocol import CommitComplete, CommitRequest, DataComplete, Position, TopicPartition
from tests.unit.test_backpressure import TABLE, AwaitingOffload, Files, P, batch, make_parts

OTHER = TopicPartition("other", 0)  # a partition this replica does not hold (no offset commit in the tests)


def settings(**keys):
    return build({"topics": P.topic, "iceberg.tables": TABLE, **keys})


def requests(w) -> list[CommitRequest]:
    return [ev for ev in w.producer.sent if isinstance(ev, CommitRequest)]


def reasons(w) -> dict[str, float]:
    return {s.labels["reason"]: s.value for m in w.metrics.registry.collect()
            if m.name == "icesink_early_commit_requests" for s in m.samples if s.name.endswith("_total")}


def test_max_records_asks_once_per_round_without_pausing(monkeypatch):
    w = make_parts(max_bytes=10**9, settings=settings(**{"iceberg.control.commit.max-records": "10"}))

    async def run():
        await w.ingest.on_fetch(batch(0, 9))
        assert requests(w) == []  # 9 rows: below
        await w.ingest.on_fetch(batch(9, 12))
        assert len(requests(w)) == 1 and not w.replica.backpressure
        assert not any(c[0] == "pause" for c in w.app.consumer.calls)
        await w.ingest.on_fetch(batch(12, 40))
        assert len(requests(w)) == 1  # the same fill: no repeat before a round or REQUEST_EVERY_S
        w.buffers.take(1)  # the round takes the buffers
        await w.ingest.on_fetch(batch(40, 45))
        assert len(requests(w)) == 1
        await w.ingest.on_fetch(batch(45, 55))
        assert len(requests(w)) == 2  # a new fill after a round: asked at once
        monkeypatch.setattr(ingest_module, "REQUEST_EVERY_S", 0.0)
        await w.ingest.housekeep(time.monotonic())  # no round came: asked again, from the housekeeping too
        assert len(requests(w)) == 3

    asyncio.run(run())
    assert reasons(w) == {"max-records": 3.0}


def test_max_bytes_counts_arrow_bytes_also_of_files_written_early():
    w = make_parts(max_bytes=10**9, settings=settings(**{"iceberg.control.commit.max-bytes": "400"}))

    async def run():
        await w.ingest.on_fetch(batch(0, 30))  # 8 Arrow bytes a row: 240
        assert requests(w) == []
        stage = w.buffers.stage(1)  # written ahead of the round: still not in a round
        w.buffers.land(stage, {TABLE: ()})
        assert w.buffers.nbytes == 0 and w.buffers.uncommitted() == (30, 240)
        await w.ingest.on_fetch(batch(30, 60))
        assert len(requests(w)) == 1 and w.buffers.uncommitted() == (60, 480)

    asyncio.run(run())
    assert reasons(w) == {"max-bytes": 1.0}


def test_without_the_keys_no_early_round_below_the_buffer_bound():
    w = make_parts(max_bytes=10**9)

    async def run():
        for i in range(5):
            await w.ingest.on_fetch(batch(i * 100, i * 100 + 100))
        await w.ingest.housekeep(time.monotonic())

    asyncio.run(run())
    assert requests(w) == []


def complete(commit_id: str, offset: int) -> CommitComplete:
    return CommitComplete(1, commit_id, 10, (Position(OTHER, offset),))


def test_rows_after_an_idle_round_ask_for_a_round_at_once():
    w = make_parts(max_bytes=10**9, settings=settings(**{"iceberg.control.commit.idle-interval-ms": "3600000"}))

    async def run():
        await w.control._on_control(1, complete("c1", 5))
        await w.control._on_control(2, complete("c2", 7))
        assert not w.replica.idle  # the second moved a position: not idle
        await w.ingest.on_fetch(batch(0, 3))
        assert requests(w) == []  # rows in a busy group wait for the interval
        w.buffers.take(1)
        await w.control._on_control(3, complete("c3", 7))
        assert w.replica.idle
        await w.ingest.housekeep(time.monotonic())
        assert requests(w) == []  # idle, but nothing arrived since the round's take
        await w.ingest.on_fetch(batch(3, 4))
        assert len(requests(w)) == 1 and not w.replica.idle  # the first row after idle asks, once
        await w.ingest.on_fetch(batch(4, 5))
        assert len(requests(w)) == 1

    asyncio.run(run())
    assert reasons(w) == {"idle": 1.0}


def test_a_replica_answering_behind_a_backlog_asks_for_a_round_once_read_to_the_ends(caplog):
    """iceberg.control.commit.catch-up (on by default): a response that leaves a backlog unread
    (records left, the newest read over BEHIND_MS old) marks the replica behind; once a fetch
    reads every partition to its end it asks for a round, once, instead of leaving the rest of
    the backlog an interval (issue 42: the first round counts from the launch). The log says
    when (bench/ingest_bench.py's timeline shows it)."""
    from agents.rounds import BEHIND_MS

    w = make_parts(max_bytes=10**9)
    hw = {"end": 100}
    w.app.consumer.highwater = lambda tp: hw["end"]

    async def run():
        await w.ingest.on_fetch(batch(0, 40))
        w.buffers.partitions[P].last_record_ms = int(time.time() * 1000) - BEHIND_MS - 5000  # a backlog's record
        w.buffers.take(1)
        assert w.rounds._valid_through_ms() is not None and w.replica.behind  # the response: 60 records left
        await w.ingest.on_fetch(batch(40, 80))
        assert requests(w) == []  # still 20 to read
        await w.ingest.on_fetch(batch(80, 100))
        assert len(requests(w)) == 1 and not w.replica.behind  # read to the end: asked, once
        hw["end"] = 110
        await w.ingest.on_fetch(batch(100, 110))
        assert len(requests(w)) == 1

    caplog.set_level("INFO", logger="agents.ingest")
    asyncio.run(run())
    assert reasons(w) == {"caught-up": 1.0}
    caught_up = [r.getMessage() for r in caplog.records if "read to the ends" in r.getMessage()]
    assert caught_up == ["a backlog read to the ends of this replica's partitions: round requested "
                         "(iceberg.control.commit.catch-up; 60 rows in no round yet)"]


def test_a_backlogs_tail_read_while_the_round_writes_still_asks_for_a_round():
    """The round takes 40 of a backlog's 100 records; while its files are written the consumer
    reads the other 60, to the end. The response must still tell that it left a backlog (its
    valid-through is the backlog's last record read, not now), and the replica asks for a
    round for the tail at once: measured at the send, the partitions looked read to their ends,
    no request was made, and the tail waited a whole interval (a CI run of
    test_the_tail_of_a_backlog_lands_once_read_not_an_interval_later: 24,000 of 30,000)."""
    from agents.rounds import BEHIND_MS

    old_ms = int(time.time() * 1000) - BEHIND_MS - 5000  # a backlog's record

    async def write(tables):
        await w.ingest.on_fetch(batch(40, 100))  # the tail, read during the write
        return [[] for _ in tables]

    w = make_parts(max_bytes=10**9, files=Files(write), offload=AwaitingOffload())
    w.replica.generation = 1
    w.app.consumer.highwater = lambda tp: 100

    async def run():
        w.replica.rebalanced.set()
        w.rounds.spark_ready = asyncio.get_running_loop().create_future()
        w.rounds.spark_ready.set_result(None)
        await w.ingest.on_fetch(batch(0, 40))
        w.buffers.partitions[P].last_record_ms = old_ms
        w.buffers.partitions[P].chunks[0].at -= w.settings.commit_interval_ms / 1000  # past the backlog's hold
        await w.rounds.respond("c1")
        await w.ingest.housekeep(time.monotonic())

    asyncio.run(run())
    done = [ev for ev in w.producer.sent if isinstance(ev, DataComplete)]
    assert w.buffers.rows == 60 and len(requests(w)) == 1 and reasons(w) == {"caught-up": 1.0}
    assert len(done) == 1 and done[0].valid_through_ms == old_ms, done


def test_a_steady_streams_records_in_flight_are_no_backlog_and_the_key_turns_catch_up_off():
    now_ms = int(time.time() * 1000)
    for keys, last_ms, asks in (({}, now_ms - 200, False),  # lagging, but the newest read is fresh
                                ({"iceberg.control.commit.catch-up": "false"}, now_ms - 60_000, False),
                                ({}, now_ms - 60_000, True)):
        w = make_parts(max_bytes=10**9, settings=settings(**keys))
        hw = {"end": 50}
        w.app.consumer.highwater = lambda tp, hw=hw: hw["end"]

        async def run(w=w, hw=hw, last_ms=last_ms):
            await w.ingest.on_fetch(batch(0, 10))
            w.buffers.partitions[P].last_record_ms = last_ms
            w.buffers.take(1)
            w.rounds._valid_through_ms()
            await w.ingest.on_fetch(batch(10, 50))

        asyncio.run(run())
        assert (len(requests(w)) == 1) is asks, (keys, last_ms)


def test_idle_rounds_ask_nothing_without_the_idle_interval():
    w = make_parts(max_bytes=10**9)

    async def run():
        await w.control._on_control(1, complete("c1", 5))
        await w.control._on_control(2, complete("c2", 5))
        assert w.replica.idle
        await w.ingest.on_fetch(batch(0, 3))

    asyncio.run(run())
    assert requests(w) == []


def test_the_first_commit_complete_seen_counts_as_idle():
    """A replica that starts does not know the round before: asking once too often costs one
    early round; not asking could leave its rows an idle interval."""
    assert complete("c", 1).idle_after(None) is False  # the coordinator's side: unknown is not idle
    w = make_parts(max_bytes=10**9)
    asyncio.run(w.control._on_control(1, complete("c1", 5)))
    assert w.replica.idle


def test_uncommitted_age_covers_buffered_taken_and_written_rows_until_a_commit_complete():
    w = make_parts(max_bytes=10**9)
    age = lambda: w.metrics.uncommitted_age._value.get()  # noqa: E731

    async def run():
        w.ingest.update_gauges()
        assert age() == 0.0
        await w.ingest.on_fetch(batch(0, 5))
        w.buffers.partitions[P].chunks[0].at -= 60  # buffered a minute ago
        await w.ingest.on_fetch(batch(5, 10))
        assert 60 <= age() < 120  # the oldest row counts
        w.buffers.land(w.buffers.stage(1), {TABLE: ()})  # written early: still uncommitted
        w.ingest.update_gauges()
        assert 60 <= age() < 120
        w.buffers.take(1)  # in a round: still uncommitted
        w.ingest.update_gauges()
        assert 60 <= age() < 120
        await w.control._on_control(1, complete("c1", 5))  # committed
        w.ingest.update_gauges()
        assert age() == 0.0

    asyncio.run(run())


@pytest.mark.parametrize(("key", "value"), [
    ("iceberg.control.commit.max-records", "0"),
    ("iceberg.control.commit.max-bytes", "-1"),
    ("iceberg.control.commit.max-bytes", "lots"),
    ("iceberg.control.commit.idle-interval-ms", "1000"),  # below commit.interval-ms (300000)
])
def test_bad_values_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError) as err:
        settings(**{key: value})
    assert key in str(err.value)


def test_keys_are_read():
    s = settings(**{"iceberg.control.commit.max-records": "1000", "iceberg.control.commit.max-bytes": "1048576",
                    "iceberg.control.commit.interval-ms": "1000", "iceberg.control.commit.idle-interval-ms": "60000"})
    assert (s.commit_max_records, s.commit_max_bytes, s.commit_idle_interval_ms) == (1000, 1048576, 60000)


def coordinator(idle: bool, idle_ms: int | None) -> SimpleNamespace:
    """The parts of a Coordinator its round timing reads (its methods run on it)."""
    from coordinator.state import CoordinatorState

    fake = SimpleNamespace(settings=SimpleNamespace(commit_idle_interval_ms=idle_ms), _idle_until=None,
                           session=SimpleNamespace(idle=idle, round_started_at=100.0, state=CoordinatorState()))
    fake._idle_wait = lambda now: Coordinator._idle_wait(fake, now)  # type: ignore[arg-type]
    Coordinator._after_round(fake)  # type: ignore[arg-type]
    return fake


@pytest.mark.parametrize(("idle", "idle_ms", "waits"), [
    (True, 60_000, True),  # an idle round: the next one idle-interval after its start
    (False, 60_000, False),  # data moved: the interval
    (True, None, False),  # no idle interval: the interval
])
def test_the_coordinator_waits_the_idle_interval_after_an_idle_round(idle, idle_ms, waits):
    c = coordinator(idle, idle_ms)
    assert c._idle_wait(130.0) is waits
    assert c._idle_wait(160.0) is False  # idle-interval after the idle round's start


def test_a_response_waiting_ends_the_idle_wait():
    """A round closed on its timeout before a slow worker answered commits nothing and looks
    idle; the late answer is accepted after it and must not wait for the idle interval."""
    from coordinator.state import Accepted

    c = coordinator(True, 60_000)
    assert c._idle_wait(130.0)
    c.session.state.pending.append(Accepted.__new__(Accepted))
    assert not c._idle_wait(130.0)
    c.session.state.pending.clear()
    c.session.state.partial["r1"] = object()  # an answer partly read
    assert not c._idle_wait(130.0)


def held(w) -> float:
    return next(s.value for m in w.metrics.registry.collect() if m.name == "icesink_rounds_held"
                for s in m.samples if s.name.endswith("_total"))


def backlog_round(keys: dict[str, str] | None = None, *, age_s: float = 0.0, last_ms: int | None = None,
                  end: int = 100, backpressure: bool = False) -> SimpleNamespace:
    """A replica that has read 40 records of a partition ending at ``end`` (the newest read
    ``last_ms``, by default a backlog's: over a minute old; buffered ``age_s`` ago) answers a
    round; the rows it wrote are in ``w.wrote``."""
    from agents.rounds import BEHIND_MS

    wrote: list[int] = []

    async def write(tables):
        wrote.extend(t.num_rows for t in tables)
        return [[] for _ in tables]

    w = make_parts(max_bytes=10**9, settings=settings(**(keys or {})), files=Files(write), offload=AwaitingOffload())
    w.wrote = wrote
    w.replica.generation = 1
    w.app.consumer.highwater = lambda tp: end

    async def run():
        w.replica.rebalanced.set()
        w.rounds.spark_ready = asyncio.get_running_loop().create_future()
        w.rounds.spark_ready.set_result(None)
        await w.ingest.on_fetch(batch(0, 40))
        st = w.buffers.partitions[P]
        st.last_record_ms = int(time.time() * 1000) - BEHIND_MS - 60_000 if last_ms is None else last_ms
        st.chunks[0].at -= age_s
        w.replica.backpressure = backpressure
        await w.rounds.respond("c1")

    asyncio.run(run())
    return w


def test_a_round_leaves_a_backlogs_rows_to_the_round_its_end_asks_for(caplog):
    """Under a backlog (records left to read, the newest read over a second old) a round takes
    none of a partition's rows buffered less than an interval ago: they go, with the rest of the
    backlog, into the round the backlog's end asks for (commit.catch-up), in one write instead of
    two. The response covers an empty range and promises no valid-through (older records than
    the newest read are not in it)."""
    caplog.set_level("INFO", logger="agents.rounds")
    w = backlog_round()
    done = [ev for ev in w.producer.sent if isinstance(ev, DataComplete)]
    assert w.wrote == [] and w.buffers.rows == 40 and held(w) == 1.0
    assert len(done) == 1 and [(r.start, r.end) for r in done[0].ranges] == [(0, 0)]
    assert done[0].valid_through_ms is None
    assert any("1 partitions reading a backlog keep their rows" in r.getMessage() for r in caplog.records)

    async def rest():  # the backlog's end: one request, and its round takes all 100
        await w.ingest.on_fetch(batch(40, 100))
        await w.ingest.housekeep(time.monotonic())
        assert reasons(w) == {"caught-up": 1.0}
        await w.rounds.respond("c2")

    asyncio.run(rest())
    done = [ev for ev in w.producer.sent if isinstance(ev, DataComplete)]
    assert w.wrote == [100] and w.buffers.rows == 0 and [(r.start, r.end) for r in done[-1].ranges] == [(0, 100)]


@pytest.mark.parametrize("case", ["an interval old", "read to its end", "a steady stream", "catch-up off",
                                  "max-records", "max-bytes", "idle interval", "backpressure"])
def test_a_backlogs_hold_is_bounded(case):
    """Rows buffered an interval ago are taken, backlog or not (no row waits more than one
    interval longer than without the hold); so are a partition's read to its end and a steady
    stream's (the newest read is fresh). No hold with catch-up off, with a size trigger or an
    idle interval set (their rounds are asked for what they count), or under backpressure."""
    keys = {"catch-up off": {"iceberg.control.commit.catch-up": "false"},
            "max-records": {"iceberg.control.commit.max-records": "1000"},
            "max-bytes": {"iceberg.control.commit.max-bytes": "100000"},
            "idle interval": {"iceberg.control.commit.idle-interval-ms": "600000"}}.get(case)
    w = backlog_round(keys, age_s=300.0 if case == "an interval old" else 0.0,
                      end=40 if case == "read to its end" else 100,
                      last_ms=int(time.time() * 1000) - 200 if case == "a steady stream" else None,
                      backpressure=case == "backpressure")
    assert w.wrote == [40] and w.buffers.rows == 0 and held(w) == 0.0
