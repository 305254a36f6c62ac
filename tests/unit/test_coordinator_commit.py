"""The coordinator's commit of a round against a real SQLite catalog, with the control topic
faked: a failure half-way (a control send after one table committed) keeps the accepted
responses pending and is retried until every table holds them; fencing stops the commit."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from coordinator import round_commit
from coordinator.committer import TableCache
from coordinator.maintainer import Maintainer
from coordinator.maintenance import TableLocks
from coordinator.parking import ParkedTables
from coordinator.round_commit import RoundCommits
from coordinator.service import Coordinator
from coordinator.session import Session
from coordinator.state import Accepted, CoordinatorState
from icesink.shared.config import load_settings
from icesink.shared.errors import FencedError
from icesink.shared.protocol import (
    Claim, CommitComplete, CommitToTable, DataComplete, DataWritten, FileInfo, OffsetRange, Position,
    Resume, StartCommit, TopicPartition,
)
from icesink.shared.metrics import Metrics
from icesink.shared.offload import Offload
from prometheus_client import CollectorRegistry

TP = TopicPartition("src", 0)


class FlakyProducer:
    """Control sends: the first ``fail`` sends of ``fail_type`` time out, as when the broker is
    unreachable for longer than the producer's request timeout."""

    keyring = None  # unsigned (icesink/shared/signing.py)

    def __init__(self, fail_type: type, fail: int) -> None:
        self.sent: list[Any] = []
        self.fail_type, self.fail = fail_type, fail

    async def send(self, event: Any) -> int:
        if isinstance(event, self.fail_type) and self.fail:
            self.fail -= 1
            raise TimeoutError("control send timed out (broker unreachable)")
        self.sent.append(event)
        return 1000 + len(self.sent)


class FakeReader:
    def __init__(self) -> None:
        self.commits: list[int] = []

    async def commit(self, offset: int) -> None:
        self.commits.append(offset)

    async def end_offset(self) -> int:
        return 0


async def no_in_flight(at: int | None) -> Any:
    raise AssertionError("no orphan sweep in these tests")


def round_commits(settings: Any, producer: Any, catalog: Any, state: CoordinatorState,
                  processes: Any = None) -> RoundCommits:
    """A round's commit (coordinator/round_commit.py) at epoch 1 holding ``state``, the control
    reader faked (FakeReader); the maintainer, parking, table locks and table cache real."""
    metrics = Metrics(CollectorRegistry())
    session = Session(state=state, epoch=1)
    locks, tables = TableLocks(), TableCache()
    maintainer = Maintainer(settings, catalog, metrics, session.status, locks, None, no_in_flight, tables=tables)
    return RoundCommits(settings, session, producer, FakeReader(), catalog, Offload(2), metrics, maintainer,
                        ParkedTables(metrics, session.status), locks, tables, processes=processes)


def coordinator_of(settings: Any, producer: Any, catalog: Any, state: CoordinatorState) -> Coordinator:
    """A coordinator (for its control loop: claims, admission, rounds, a stop) at epoch 1 holding
    ``state``; its round commits' control reader faked (FakeReader)."""
    async def make() -> Coordinator:  # aiokafka builds its (unused) control consumer on a loop
        return Coordinator(settings, "127.0.0.1:9", producer, catalog, Offload(2), Metrics(CollectorRegistry()))

    coord = asyncio.run(make())
    coord.session.epoch, coord.session.state = 1, state
    coord._rounds._reader = FakeReader()
    return coord


def data_file(table: Any, name: str, ids: list[int]) -> FileInfo:
    path = f"{table.location()}/data/{name}.parquet"
    local = path.removeprefix("file://")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    field = pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"1"})
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}, schema=pa.schema([field])), local)
    return FileInfo(path=path, record_count=len(ids), size_bytes=1, spec_id=0)


def coordinator_with_round(tmp_path, catalog, producer) -> RoundCommits:
    settings = load_settings(None, None, {"topics": "src", "iceberg.tables": "db.a,db.b",
                                          "iceberg.catalog.type": "sql", "state.dir": str(tmp_path / "state")})
    files = {t: data_file(catalog.load_table(t), t, [1, 2, 3]) for t in ("db.a", "db.b")}
    st = CoordinatorState()
    log = [Claim("w1", 1, (TP,)), Resume(1, "w1", 1, (Position(TP, 0),)), StartCommit(1, "r1"),
           DataWritten("r1", "x", "w1", "db.a", (files["db.a"],)),
           DataWritten("r1", "x", "w1", "db.b", (files["db.b"],)),
           DataComplete("r1", "x", "w1", 1, (OffsetRange(TP, 0, 3),), 2, None)]
    for off, ev in enumerate(log):
        st.apply(off, ev)
    return round_commits(settings, producer, catalog, st)


def rows(catalog, name: str) -> int:
    return catalog.load_table(name).scan().to_arrow().num_rows


def test_a_failed_control_send_after_one_table_committed_keeps_the_round_pending_and_retries(
        tmp_path, two_tables, monkeypatch):
    monkeypatch.setattr(round_commit, "RETRY_BASE_S", 0.01)
    producer = FlakyProducer(CommitToTable, fail=2)
    coord = coordinator_with_round(tmp_path, two_tables, producer)
    asyncio.run(coord.commit("r1", partial=False))
    assert rows(two_tables, "db.a") == 3 and rows(two_tables, "db.b") == 3
    assert not coord.session.state.pending
    [done] = [e for e in producer.sent if isinstance(e, CommitComplete)]
    assert done.positions == (Position(TP, 3),)
    assert coord.metrics.round_failures._value.get() == 2
    assert coord._reader.commits  # type: ignore[attr-defined]


def test_a_failed_commit_complete_send_keeps_the_round_pending_until_it_is_sent(tmp_path, two_tables, monkeypatch):
    monkeypatch.setattr(round_commit, "RETRY_BASE_S", 0.01)
    producer = FlakyProducer(CommitComplete, fail=1)
    coord = coordinator_with_round(tmp_path, two_tables, producer)
    asyncio.run(coord.commit("r1", partial=False))
    assert rows(two_tables, "db.a") == 3 and rows(two_tables, "db.b") == 3  # no table twice
    assert not coord.session.state.pending
    assert sum(isinstance(e, CommitComplete) for e in producer.sent) == 1


def test_a_fenced_commit_stops_the_coordinator_and_keeps_the_round_pending(tmp_path, two_tables, monkeypatch):
    producer = FlakyProducer(CommitToTable, fail=0)
    coord = coordinator_with_round(tmp_path, two_tables, producer)

    def fenced(*_: Any, **__: Any) -> Any:
        raise FencedError("table db.a: expected coordinator epoch <= 1, found 2")

    monkeypatch.setattr(round_commit, "commit_table", fenced)
    coord = coordinator_of(coord.settings, producer, two_tables, coord.session.state)  # type: ignore[assignment]

    async def go() -> None:
        coord._commit_task = asyncio.create_task(coord._rounds.commit("r1", partial=False))
        await asyncio.wait([coord._commit_task])
        coord._reap_commit_task()

    with pytest.raises(FencedError):
        asyncio.run(go())
    assert coord.session.status["phase"] == "fenced" and len(coord.session.state.pending) == 1


def test_a_commit_error_no_retry_mends_stops_the_round_loudly_and_a_transient_one_is_retried(
        tmp_path, two_tables, monkeypatch):
    """Retry loops branch on ``retriable``: a catalog conflict or outage is retried with capped
    backoff; an error that says no retry mends it (here a sink state property edited by hand)
    stops the coordinator after one attempt, surfaced in /status, the round kept pending."""
    from pyiceberg.exceptions import CommitFailedException

    from icesink.shared.errors import ProtocolError

    monkeypatch.setattr(round_commit, "RETRY_BASE_S", 0.01)
    real = round_commit.commit_table
    calls: list[str] = []

    def conflicts_once(catalog: Any, table: str, *a: Any, **k: Any) -> Any:
        calls.append(table)
        if calls.count(table) == 1:
            raise CommitFailedException("requirement failed: branch main has changed")
        return real(catalog, table, *a, **k)

    monkeypatch.setattr(round_commit, "commit_table", conflicts_once)
    coord = coordinator_with_round(tmp_path, two_tables, FlakyProducer(CommitToTable, fail=0))
    asyncio.run(coord.commit("r1", partial=False))
    assert rows(two_tables, "db.a") == 3 and not coord.session.state.pending and sorted(calls).count("db.a") == 2

    unreadable: list[str] = []

    def hand_edited(catalog: Any, table: str, *a: Any, **k: Any) -> Any:
        unreadable.append(table)
        raise ProtocolError(f"table {table} property icesink.g.state: expected icesink sink state JSON, found 'x'")

    monkeypatch.setattr(round_commit, "commit_table", hand_edited)
    coord = coordinator_with_round(tmp_path / "2", two_tables, FlakyProducer(CommitToTable, fail=0))
    with pytest.raises(ProtocolError):
        asyncio.run(asyncio.wait_for(coord.commit("r1", partial=False), 10))
    assert unreadable == ["db.a"]  # the round's first table (committed alone, first), once, not again
    assert coord.session.status["phase"] == "round-failed" and coord.session.status["retriable"] is False
    assert "expected icesink sink state JSON" in coord.session.status["error"] and len(coord.session.state.pending) == 1


# Tables of a round committed at once (iceberg.control.commit.threads) --------------------

def round_of_tables(tmp_path, producer, names: list[str], threads: int, processes: Any = None) -> RoundCommits:
    settings = load_settings(None, None, {"topics": "src", "iceberg.tables": ",".join(names),
                                          "iceberg.catalog.type": "sql", "state.dir": str(tmp_path / "state"),
                                          "iceberg.control.commit.threads": str(threads)})
    st = CoordinatorState()
    log: list[Any] = [Claim("w1", 1, (TP,)), Resume(1, "w1", 1, (Position(TP, 0),)), StartCommit(1, "r1")]
    log += [DataWritten("r1", "x", "w1", t, (FileInfo(f"file:///wh/{t}/data/f.parquet", 3, 1, 0),)) for t in names]
    log.append(DataComplete("r1", "x", "w1", 1, (OffsetRange(TP, 0, 3),), len(names), None))
    for off, ev in enumerate(log):
        st.apply(off, ev)
    return round_commits(settings, producer, None, st, processes)


class SlowCommits:
    """A fake ``commit_table`` that takes 0.2 s and records how many ran at once and in what order."""

    def __init__(self, fenced: str | None = None) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.events: list[str] = []
        self.rounds_tables: list[Any] = []
        self.fenced = fenced

    def __call__(self, catalog: Any, table: str, batch: list[Any], round: Any, **kw: Any) -> Any:
        from coordinator.committer import TableCommit

        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.events.append(f"start {table}")
            self.rounds_tables.append(round.tables_of_round)
        time.sleep(0.2)
        with self.lock:
            self.running -= 1
            self.events.append(f"end {table}")
        if table == self.fenced:
            raise FencedError(f"table {table}: expected coordinator epoch <= 1, found 2")
        return TableCommit(table, 7, 1, 3, max(a.offset for a in batch))


def test_the_tables_of_a_round_are_committed_at_once_after_the_first(tmp_path, monkeypatch):
    commits = SlowCommits()
    monkeypatch.setattr(round_commit, "commit_table", commits)
    producer = FlakyProducer(CommitToTable, fail=0)
    names = [f"db.t{i}" for i in range(7)]
    coord = round_of_tables(tmp_path, producer, names, threads=3)
    asyncio.run(coord.commit("r1", partial=False))
    assert commits.events[:2] == ["start db.t0", "end db.t0"]  # alone: the between-tables crash point follows it
    assert commits.most == 3  # iceberg.control.commit.threads at a time
    announced = [e.table for e in producer.sent if isinstance(e, CommitToTable)]
    assert sorted(announced) == names
    assert isinstance(producer.sent[-1], CommitComplete)  # only once every table holds the round
    assert not coord.session.state.pending


def test_the_tables_of_a_round_are_worked_out_once_for_all_its_table_commits(tmp_path, monkeypatch):
    """Each table's sink state names every table of its round (recovery reads it); at 200 tables,
    working that out again in each commit was a few percent of the commit's CPU."""
    commits = SlowCommits()
    monkeypatch.setattr(round_commit, "commit_table", commits)
    worked_out: list[object] = []
    real = round_commit.round_tables
    monkeypatch.setattr(round_commit, "round_tables", lambda batch: worked_out.append(batch) or real(batch))
    names = [f"db.t{i}" for i in range(5)]
    coord = round_of_tables(tmp_path, FlakyProducer(CommitToTable, fail=0), names, threads=3)
    asyncio.run(coord.commit("r1", partial=False))
    assert len(worked_out) == 1
    assert commits.rounds_tables == [dict.fromkeys(names, commits.rounds_tables[0][names[0]])] * len(names)


def test_commit_threads_default_to_twice_the_cores():
    settings = load_settings(None, None, {"topics": "src", "iceberg.tables": "db.a"})
    assert settings.table_commit_threads == 2 * (os.cpu_count() or 1)


def test_a_failed_announcement_of_one_table_lets_the_others_finish_and_the_round_retries(tmp_path, monkeypatch):
    monkeypatch.setattr(round_commit, "RETRY_BASE_S", 0.01)
    commits = SlowCommits()
    monkeypatch.setattr(round_commit, "commit_table", commits)
    producer = FlakyProducer(CommitToTable, fail=0)
    send = producer.send
    failed: list[str] = []

    async def t2_fails_once(event: Any) -> int:
        if isinstance(event, CommitToTable) and event.table == "db.t2" and not failed:
            failed.append(event.table)
            raise TimeoutError("control send timed out (broker unreachable)")
        return await send(event)

    producer.send = t2_fails_once  # type: ignore[method-assign]
    names = [f"db.t{i}" for i in range(4)]
    coord = round_of_tables(tmp_path, producer, names, threads=4)
    asyncio.run(coord.commit("r1", partial=False))
    first = commits.events[:commits.events.index("start db.t0", 1)]  # the first attempt
    assert sorted(e for e in first if e.startswith("end")) == [f"end {t}" for t in names]
    first_sent = [e.table for e in producer.sent if isinstance(e, CommitToTable)][:3]
    assert sorted(first_sent) == ["db.t0", "db.t1", "db.t3"]  # the others were announced all the same
    assert coord.metrics.round_failures._value.get() == 1
    assert sum(isinstance(e, CommitComplete) for e in producer.sent) == 1 and not coord.session.state.pending


def test_fencing_of_one_table_among_parallel_commits_stops_the_round(tmp_path, monkeypatch):
    commits = SlowCommits(fenced="db.t2")
    monkeypatch.setattr(round_commit, "commit_table", commits)
    producer = FlakyProducer(CommitToTable, fail=0)
    coord = round_of_tables(tmp_path, producer, [f"db.t{i}" for i in range(4)], threads=4)
    with pytest.raises(FencedError):
        asyncio.run(coord.commit("r1", partial=False))
    assert coord.session.status["phase"] == "fenced" and len(coord.session.state.pending) == 1
    assert not any(isinstance(e, CommitComplete) for e in producer.sent)


# Files the coordinator may commit and delete (coordinator/files.py) --------------------------

def test_paths_are_confined_to_the_table_location_and_write_data_path(two_tables, tmp_path):
    from coordinator.files import confined, data_roots

    table = two_tables.load_table("db.a")
    roots = data_roots(table)
    loc = table.location()
    assert confined(f"{loc}/data/x.parquet", roots)
    assert confined(f"{loc.removeprefix('file://')}/data/x.parquet", roots)  # one spelling per file
    assert not confined(f"{loc}/../b/data/x.parquet", roots)
    assert not confined(f"{loc}-evil/data/x.parquet", roots)
    assert not confined("file:///etc/passwd", roots)
    assert not confined(two_tables.load_table("db.b").location() + "/data/x.parquet", roots)
    with table.transaction() as tx:
        tx.set_properties({"write.data.path": f"file://{tmp_path}/elsewhere"})
    assert confined(f"file://{tmp_path}/elsewhere/x.parquet", data_roots(two_tables.load_table("db.a")))


def test_deletion_keeps_committed_foreign_and_accepted_files(tmp_path, two_tables):
    from coordinator.files import delete_uncommitted
    from coordinator.state import TableFile

    table = two_tables.load_table("db.a")
    committed = data_file(table, "committed", [1])
    with table.transaction() as tx:
        tx.add_files([committed.path])
    orphan, accepted = data_file(table, "orphan", [2]), data_file(table, "accepted", [3])
    foreign = tmp_path / "foreign.parquet"
    foreign.write_text("not the sink's")
    files = [TableFile("db.a", f) for f in (committed, orphan, accepted)]
    files += [TableFile("db.a", FileInfo(f"file://{foreign}", 1, 1, 0)), TableFile("db.nope", orphan)]
    from coordinator.gc import normalize
    done = delete_uncommitted(two_tables, files, {normalize(accepted.path)}, {})
    assert done == {"deleted": 1, "committed": 1, "accepted": 1, "outside-table": 1, "no-table": 1}
    assert not os.path.exists(orphan.path.removeprefix("file://"))
    for kept in (committed, accepted):
        assert os.path.exists(kept.path.removeprefix("file://"))
    assert foreign.exists()
    assert rows(two_tables, "db.a") == 1


def test_a_data_written_naming_files_outside_its_table_is_refused_and_nothing_is_deleted(
        tmp_path, two_tables, monkeypatch):
    """A forged response (a DataWritten naming a file elsewhere, then a DataComplete) is neither
    committed nor deleted: the DataWritten is refused, the response is rejected as incomplete."""
    producer = FlakyProducer(CommitToTable, fail=0)
    rounds = coordinator_with_round(tmp_path, two_tables, producer)
    coord = coordinator_of(rounds.settings, producer, two_tables, rounds.session.state)
    victim = tmp_path / "victim.parquet"
    victim.write_text("someone else's file")
    forged = [DataWritten("r1", "f", "w1", "db.a", (FileInfo(f"file://{victim}", 1, 1, 0),)),
              DataComplete("r1", "f", "w1", 1, (OffsetRange(TP, 3, 4),), 1, None)]

    async def go() -> None:
        for off, ev in enumerate(forged, start=100):
            if await coord._admit(off, ev):
                coord.session.state.apply(off, ev)
        for rej in coord.session.state.take_rejected():
            await coord.delete_files(rej.files)
        await coord._rounds.commit("r1", partial=False)

    asyncio.run(go())
    assert victim.exists()
    assert rows(two_tables, "db.a") == 3  # the real response only
    assert coord.metrics.control_events_refused.labels(reason="file-outside-table")._value.get() == 1


def test_a_commit_computes_the_staged_metadata_once_per_change_and_equal_to_pyicebergs(
    tmp_path, two_tables, monkeypatch
):
    """pyiceberg 0.12 recomputes a transaction's staged metadata (all updates re-applied, then
    a deep copy) on every read; a fast append reads it about sixteen times per commit. The
    committer's transaction computes it once per staged change, without the deep copy, and
    what it returns equals what pyiceberg's own property returns (apart from the clock)."""
    from pyiceberg.table import Transaction

    from coordinator import committer
    from coordinator.iceberg_ext import snapshots

    calls: list[int] = []
    real = snapshots.staged_metadata

    def counted(base, updates, *a, **k):
        calls.append(len(updates))
        return real(base, updates, *a, **k)

    seen: list[tuple[Any, Any]] = []
    memo_property = snapshots.MemoTransaction.table_metadata

    def checked(self):
        mine = memo_property.fget(self)
        seen.append((mine, Transaction.table_metadata.fget(self)))
        return mine

    monkeypatch.setattr(snapshots, "staged_metadata", counted)
    monkeypatch.setattr(snapshots.MemoTransaction, "table_metadata", property(checked))
    table = two_tables.load_table("db.a")
    acc = Accepted(offset=5, commit_id="r1", worker="w1", ranges=(), valid_through_ms=None,
                           files={"db.a": (data_file(table, "m", [1, 2]),)})
    committer.commit_table(two_tables, "db.a", [acc], committer.RoundCommit(group="g", epoch=1, commit_id="r1",
                           positions={TP: 2}, valid_through_ms=None))
    assert len(seen) > 8  # pyiceberg reads it many times per commit
    # equal apart from the clock: pyiceberg stamps last_updated_ms with "now" on every read
    # (the catalog stamps the committed metadata itself)
    assert all(mine.model_copy(update={"last_updated_ms": 0}) == theirs.model_copy(update={"last_updated_ms": 0})
               for mine, theirs in seen)
    assert len(calls) <= 4, calls  # once per staged change, not once per read
    assert rows(two_tables, "db.a") == 2


def _accepted(table: Any, offset: int, name: str, ids: list[int]) -> Any:
    return Accepted(offset=offset, commit_id=f"r{offset}", worker="w1", ranges=(), valid_through_ms=None,
                            files={"db.a": (data_file(table, name, ids),)})


def test_the_table_cache_saves_the_load_and_a_stale_entry_still_commits_exactly(two_tables, monkeypatch):
    """A round's commit starts from the table the coordinator's last commit left (no load);
    after another writer committed, the cached table is stale: the catalog refuses, pyiceberg
    refreshes and re-applies, and the rows are exact."""
    from coordinator import committer

    cache = committer.TableCache()
    loads: list[str] = []
    real_load = two_tables.load_table
    monkeypatch.setattr(two_tables, "load_table", lambda name: (loads.append(name), real_load(name))[1])
    table = real_load("db.a")

    def commit(offset: int, ids: list[int]) -> None:
        committer.commit_table(two_tables, "db.a", [_accepted(table, offset, f"f{offset}", ids)],
                               committer.RoundCommit(group="g", epoch=1, commit_id=f"r{offset}", positions={TP: offset},
                                                     valid_through_ms=None), tables=cache)

    ours = lambda: [n for n in loads if n == "db.a"]  # noqa: E731 - the SQL catalog's own loads name a tuple
    commit(1, [1, 2])
    assert ours() == ["db.a"]
    commit(2, [3])
    assert ours() == ["db.a"]  # the second commit started from the cached table
    other = real_load("db.a")  # another writer: a property change moves the metadata
    with other.transaction() as tx:
        tx.set_properties({"owner": "someone"})
    commit(3, [4, 5])  # the cached table is stale: refused, refreshed, re-applied
    assert ours() == ["db.a"]
    assert rows(two_tables, "db.a") == 5
    assert real_load("db.a").properties["owner"] == "someone"


def test_a_table_commit_leaves_no_reference_cycle_for_the_collector(two_tables):
    """The check run before pyiceberg's retry referred to its transaction from the transaction
    itself: every table commit left a cycle holding two table metadata and their lists for the
    cyclic collector (bench/history_bench.py, 200 tables: young collections of 20,000 to 60,000
    objects, 80-190 ms each). Freed by reference counting, a commit leaves nothing to collect,
    and a stale cached table is still refused, checked, refreshed and re-applied."""
    import gc

    from coordinator import committer

    cache = committer.TableCache()
    table = two_tables.load_table("db.a")

    def commit(offset: int, ids: list[int]) -> None:
        committer.commit_table(two_tables, "db.a", [_accepted(table, offset, f"f{offset}", ids)],
                               committer.RoundCommit(group="g", epoch=1, commit_id=f"r{offset}", positions={TP: offset},
                                                     valid_through_ms=None), tables=cache)

    commit(1, [1])
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        commit(2, [2, 3])
        with two_tables.load_table("db.a").transaction() as tx:  # another writer: the cache is stale
            tx.set_properties({"owner": "someone"})
        commit(3, [4])
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert "MemoTransaction" not in left and "TableMetadataV2" not in left, left
    assert rows(two_tables, "db.a") == 4


def test_a_stale_cached_table_is_still_fenced_by_a_newer_coordinator(two_tables):
    from coordinator import committer

    cache = committer.TableCache()
    table = two_tables.load_table("db.a")
    committer.commit_table(two_tables, "db.a", [_accepted(table, 1, "f1", [1])], committer.RoundCommit(group="g", epoch=1,
                           commit_id="r1", positions={TP: 1}, valid_through_ms=None), tables=cache)
    # a newer coordinator (epoch 2) commits behind this one's cached table
    committer.commit_table(two_tables, "db.a", [_accepted(table, 5, "f5", [2])], committer.RoundCommit(group="g", epoch=2,
                           commit_id="r5", positions={TP: 5}, valid_through_ms=None))
    with pytest.raises(FencedError):
        committer.commit_table(two_tables, "db.a", [_accepted(table, 9, "f9", [3])], committer.RoundCommit(group="g", epoch=1,
                               commit_id="r9", positions={TP: 9}, valid_through_ms=None), tables=cache)
    assert cache.get("db.a") is None  # a failure drops the entry
    assert rows(two_tables, "db.a") == 2


def test_a_commit_writes_its_manifests_in_its_own_thread(two_tables, monkeypatch):
    """pyiceberg 0.12 writes an append's manifest and reads the parent's manifest list on its
    executor and waits: hand-offs that each wait for the GIL again in a busy worker. The
    committer's append does both in the committing thread, with the same snapshot."""
    from pyiceberg.utils import concurrent as pyiceberg_concurrent

    from coordinator import committer

    def no_executor() -> None:
        raise AssertionError("the commit handed work to pyiceberg's executor")

    table = two_tables.load_table("db.a")
    committer.commit_table(two_tables, "db.a", [_accepted(table, 1, "f1", [1, 2])], committer.RoundCommit(group="g", epoch=1,
                           commit_id="r1", positions={TP: 1}, valid_through_ms=None))
    monkeypatch.setattr(pyiceberg_concurrent.ExecutorFactory, "get_or_create", staticmethod(no_executor))
    committer.commit_table(two_tables, "db.a", [_accepted(table, 2, "f2", [3])], committer.RoundCommit(group="g", epoch=1,
                           commit_id="r2", positions={TP: 2}, valid_through_ms=None))  # a parent to carry over
    monkeypatch.undo()
    now = two_tables.load_table("db.a")
    manifests = now.current_snapshot().manifests(now.io)
    assert sorted(m.added_snapshot_id for m in manifests) == sorted(s.snapshot_id for s in now.snapshots())
    assert rows(two_tables, "db.a") == 3 and sorted(now.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]



def test_a_tables_commit_duration_leaves_out_its_wait_for_a_commit_thread(tmp_path, monkeypatch):
    """One commit thread, four tables: the last waits for three commits before its own. Each
    commit takes 10 s of a fake clock; each table's icesink_commit_duration_seconds must be its
    own 10 s. Timed on the event loop, from the call to its return, it was 10, 30, 30, 30: the
    wait for the thread, and for the loop to see the result, counted as commit time."""
    clock = [0.0]
    lock = threading.Lock()

    def commits(catalog: Any, table: str, batch: list[Any], round: Any, **kw: Any) -> Any:
        from coordinator.committer import TableCommit

        with lock:
            clock[0] += 10.0
        return TableCommit(table, 7, 1, 3, max(a.offset for a in batch))

    monkeypatch.setattr(round_commit, "commit_table", commits)
    monkeypatch.setattr(round_commit, "_now", lambda: clock[0])
    names = [f"db.t{i}" for i in range(4)]
    coord = round_of_tables(tmp_path, FlakyProducer(CommitToTable, fail=0), names, threads=1)
    asyncio.run(coord.commit("r1", partial=False))
    registry = coord.metrics.registry
    for t in names:
        assert registry.get_sample_value("icesink_commit_duration_seconds_count", {"table": t}) == 1
        assert registry.get_sample_value("icesink_commit_duration_seconds_sum", {"table": t}) == 10.0, t


def test_a_tables_commit_duration_leaves_out_its_wait_in_its_commit_process(tmp_path, monkeypatch):
    """Four commit threads, one commit process, four tables: each waits in the process's queue
    for the commits ahead of it. Each commit takes 10 s of a fake clock in the process, which
    reports it (TableCommit.duration_s); timed from the thread's call to the process's answer
    it was 10, 10, 20, 30 (the first table is committed alone): the queue counted as commit time."""
    from coordinator.committer import TableCommit

    clock = [0.0]
    queue = threading.Lock()  # the process: one commit at a time
    together = threading.Barrier(3)  # the round's other three tables are all sent before any is done

    class OneProcess:
        def commit(self, table: str, batch: list[Any], round: Any) -> TableCommit:
            if table != "db.t0":  # the first table is committed alone
                together.wait(timeout=10)
            with queue:
                clock[0] += 10.0
                return TableCommit(table, 7, 1, 3, max(a.offset for a in batch), duration_s=10.0)

        def pids(self) -> list[int]:
            return []

    monkeypatch.setattr(round_commit, "_now", lambda: clock[0])
    names = [f"db.t{i}" for i in range(4)]
    coord = round_of_tables(tmp_path, FlakyProducer(CommitToTable, fail=0), names, threads=4, processes=OneProcess())
    asyncio.run(coord.commit("r1", partial=False))
    registry = coord.metrics.registry
    for t in names:
        assert registry.get_sample_value("icesink_commit_duration_seconds_count", {"table": t}) == 1
        assert registry.get_sample_value("icesink_commit_duration_seconds_sum", {"table": t}) == 10.0, t


def test_a_table_loaded_to_admit_its_first_files_is_the_one_its_commit_starts_from(tmp_path, two_tables, monkeypatch):
    """The coordinator loads a table it does not know yet to check a DataWritten's files
    against the table's location; the round's commit starts from that table (its TableCache)
    instead of loading it again: a first round of 200 new tables loaded each one twice, one
    after the other, between the workers' answers and the first commit (issue 42 target 3)."""
    producer = FlakyProducer(CommitToTable, fail=0)
    rounds = coordinator_with_round(tmp_path, two_tables, producer)
    coord = coordinator_of(rounds.settings, producer, two_tables, rounds.session.state)
    written = coord.session.state.pending[0].files
    loads: list[str] = []
    real_load = two_tables.load_table
    monkeypatch.setattr(two_tables, "load_table", lambda name: (loads.append(name), real_load(name))[1])

    async def go() -> None:
        for name in ("db.a", "db.b"):
            assert await coord._admit(10, DataWritten("r1", "x", "w1", name, written[name]))
        await coord._rounds.commit("r1", partial=False)

    asyncio.run(go())
    # by name: the coordinator's loads (pyiceberg's own SQL catalog loads by identifier in its commit)
    assert sorted(n for n in loads if isinstance(n, str)) == ["db.a", "db.b"]
    assert rows(two_tables, "db.a") == 3 and rows(two_tables, "db.b") == 3


def test_the_new_tables_of_a_batch_of_responses_are_loaded_side_by_side(tmp_path, two_tables, monkeypatch):
    """A REST catalog answers a load in tens of milliseconds: a first round of 200 new tables
    admitted one DataWritten after another waited for 200 loads in a row. The tables a batch of
    control events names that the coordinator does not know yet are loaded at once."""
    producer = FlakyProducer(CommitToTable, fail=0)
    rounds = coordinator_with_round(tmp_path, two_tables, producer)
    coord = coordinator_of(rounds.settings, producer, two_tables, rounds.session.state)
    written = coord.session.state.pending[0].files
    lock, running, most = threading.Lock(), [0], [0]
    real_load = two_tables.load_table

    def slow_load(name):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return real_load(name)

    monkeypatch.setattr(two_tables, "load_table", slow_load)
    batch = [(10 + i, DataWritten("r1", "x", "w1", name, written[name])) for i, name in enumerate(("db.a", "db.b"))]
    asyncio.run(coord._load_roots(batch))
    assert most[0] == 2 and coord._roots.known("db.a") and coord._roots.known("db.b")


def test_the_new_tables_of_a_batch_of_responses_are_loaded_by_one_query_of_icesinks_sql_catalog(
    tmp_path, two_tables, monkeypatch
):
    """On a SQL catalog each load was a query of its own (about 1.5 ms of ORM on SQLite, before
    its metadata file is read): a first round of 200 new tables spent 0.7 s loading them between
    the answer and its first commit (issue 42 target 3). icesink's SQL catalog loads them all
    with one query; each table goes on to its first commit (the round commits' cache)."""
    from sqlalchemy import event

    from coordinator.iceberg_ext.catalogs import SqlCatalog

    ours = SqlCatalog("t", **two_tables.properties)
    producer = FlakyProducer(CommitToTable, fail=0)
    rounds = coordinator_with_round(tmp_path, two_tables, producer)
    coord = coordinator_of(rounds.settings, producer, ours, rounds.session.state)
    written = coord.session.state.pending[0].files
    queries: list[str] = []
    event.listen(ours.engine, "before_cursor_execute", lambda *a: queries.append(a[2]))
    monkeypatch.setattr(ours, "load_table", lambda name: pytest.fail(f"{name} loaded on its own"))
    batch = [(10 + i, DataWritten("r1", "x", "w1", name, written[name])) for i, name in enumerate(("db.a", "db.b"))]
    asyncio.run(coord._load_roots(batch))
    assert coord._roots.known("db.a") and coord._roots.known("db.b")
    assert len([q for q in queries if "iceberg_tables" in q]) == 1, queries
    assert {n: coord._rounds._tables.get(n).metadata_location for n in ("db.a", "db.b")} == {
        n: two_tables.load_table(n).metadata_location for n in ("db.a", "db.b")}
    monkeypatch.undo()
    asyncio.run(coord._rounds.commit("r1", partial=False))
    assert rows(ours, "db.a") == 3 and rows(ours, "db.b") == 3


def test_loading_tables_together_leaves_out_the_missing_and_the_unnamable(tmp_path, two_tables):
    from coordinator.iceberg_ext.catalogs import SqlCatalog

    ours = SqlCatalog("t", **two_tables.properties)
    ours.create_namespace("other")
    ours.create_table("other.a", schema=two_tables.load_table("db.a").schema())
    loaded = ours.load_tables(["db.a", "db.gone", "nodots", "other.a", "db.b", "db.a"])
    assert sorted(loaded) == ["db.a", "db.b", "other.a"]
    assert {n: t.metadata_location for n, t in loaded.items()} == {
        n: ours.load_table(n).metadata_location for n in loaded}
    assert [t.name() for t in loaded.values()] == [ours.load_table(n).name() for n in loaded]


@pytest.mark.parametrize("processes", [0, 2])
def test_a_table_loaded_to_admit_files_is_cached_only_when_this_process_commits(tmp_path, two_tables, processes):
    """With commit processes the rounds commit elsewhere and never refresh this process's table
    cache, which maintenance reads as the table's state: a table the admission loaded and left
    there stayed as it was at its first files, and maintenance judged nothing due for ever (CI:
    test_commit_processes saw no compaction nor expiry)."""
    producer = FlakyProducer(CommitToTable, fail=0)
    rounds = coordinator_with_round(tmp_path, two_tables, producer)
    settings = rounds.settings.model_copy(update={"commit_processes": processes})
    coord = coordinator_of(settings, producer, two_tables, rounds.session.state)
    written = coord.session.state.pending[0].files
    assert asyncio.run(coord._admit(10, DataWritten("r1", "x", "w1", "db.a", written["db.a"])))
    assert (coord._rounds._tables.get("db.a") is not None) is (processes == 0)


class LogReader:
    """The coordinator's control reader: ``batches`` of (offset, event), then nothing."""

    def __init__(self, batches: list[list[tuple[int, Any]]]) -> None:
        self.batches, self.next = batches, 0

    async def read(self, timeout_s: float) -> list[tuple[int, Any]]:
        if not self.batches:
            await asyncio.sleep(timeout_s)
            return []
        batch = self.batches.pop(0)
        self.next = batch[-1][0] + 1
        return batch

    async def position(self) -> int:
        return self.next


def test_a_coordinator_that_reads_a_newer_epoch_on_the_control_log_is_fenced(tmp_path, two_tables):
    """Both replicas' sessions expired at once (CI, test_connect on Kafka): the other replica led
    the next generation and started coordinator epoch 2, then this one led again without ever
    seeing itself lose the lead, so its epoch-1 coordinator ran on. Every replica ignored its
    rounds and Resumes as stale, for ever. A coordinator now stops once the log holds a newer
    epoch than its own (FencedError); the replica starts a new one if it still leads."""
    producer = FlakyProducer(CommitToTable, fail=0)
    rounds = coordinator_with_round(tmp_path, two_tables, producer)
    coord = coordinator_of(rounds.settings, producer, two_tables, rounds.session.state)
    coord._reader = LogReader([[(50, Claim("w2", 4, (TP,)))], [(51, StartCommit(2, "r-of-epoch-2"))]])

    async def go() -> None:
        await asyncio.wait_for(coord._loop(), 10)

    with pytest.raises(FencedError, match="epoch 2"):
        asyncio.run(go())
    assert coord.session.status["phase"] == "fenced"
