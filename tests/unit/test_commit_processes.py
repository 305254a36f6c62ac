"""Table commits in processes of their own (iceberg.control.commit.processes), with real
processes and a real SQLite catalog: a round commits exactly as on threads, a table keeps its
process, a killed process is replaced by the retry, and fencing crosses the process boundary."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import time
from typing import Any

import pytest
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError

from coordinator import round_commit
from coordinator.commit_processes import CommitProcessError, CommitProcesses, table_batch
from coordinator.committer import RoundCommit
from coordinator.round_commit import RoundCommits, commit_processes
from coordinator.state import Accepted, CoordinatorState
from icesink.shared.config import load_settings
from icesink.shared.retry import Backoff
from icesink.shared.errors import ControlLogError, FencedError, TableChangedError, is_retriable
from icesink.shared.protocol import (
    Claim, CommitComplete, DataComplete, DataWritten, OffsetRange, Position, Resume, StartCommit, TopicPartition,
)
from tests.unit.test_coordinator_commit import FlakyProducer, data_file, round_commits, rows

TP = TopicPartition("src", 0)


def settings_for(tmp_path, processes: int = 2, **extra: str) -> Any:
    """Settings whose catalog is the ``two_tables`` fixture's, so a commit process opens it too."""
    return load_settings(None, None, {
        "topics": "src", "iceberg.tables": "db.a,db.b", "iceberg.catalog": "t", "iceberg.catalog.type": "sql",
        "iceberg.catalog.uri": f"sqlite:///{tmp_path}/cat.db", "iceberg.catalog.warehouse": f"file://{tmp_path}/wh",
        "state.dir": str(tmp_path / "state"), "iceberg.control.commit.processes": str(processes), **extra})


def coordinator(tmp_path, catalog, producer, round_id: str, ids: list[int], start: int, processes: Any = None,
                **extra: str) -> RoundCommits:
    """A round's commit holding one accepted response of ``round_id`` that writes ``ids`` to both
    tables, on ``processes`` (None: commit processes of its own, not started yet)."""
    settings = settings_for(tmp_path, **extra)
    files = {t: data_file(catalog.load_table(t), f"{t}-{round_id}", ids) for t in ("db.a", "db.b")}
    st = CoordinatorState()
    log = [Claim("w1", 1, (TP,)), Resume(1, "w1", 1, (Position(TP, start),)), StartCommit(1, round_id),
           DataWritten(round_id, "x", "w1", "db.a", (files["db.a"],)),
           DataWritten(round_id, "x", "w1", "db.b", (files["db.b"],)),
           DataComplete(round_id, "x", "w1", 1, (OffsetRange(TP, start, start + len(ids)),), 2, None)]
    for off, ev in enumerate(log, start=100 * start):
        st.apply(off, ev)
    return round_commits(settings, producer, catalog, st, processes or commit_processes(settings))


def test_a_round_commits_in_processes_of_their_own_exactly_once(tmp_path, two_tables, monkeypatch):
    """The parent's commit_table is never called (a commit process has its own interpreter),
    the rows are exact, and each table stays with its process from one round to the next."""
    def not_here(*_: Any, **__: Any) -> Any:
        raise AssertionError("committed in the replica's process")

    monkeypatch.setattr(round_commit, "commit_table", not_here)
    producer = FlakyProducer(CommitComplete, fail=0)
    coord = coordinator(tmp_path, two_tables, producer, "r1", [1, 2, 3], start=0)
    answers: list[Any] = []  # each table's TableCommit, as its process answered it
    assert coord._processes is not None
    commit = coord._processes.commit

    def noting(*args: Any, **kwargs: Any) -> Any:
        answers.append(commit(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(coord._processes, "commit", noting)
    try:
        asyncio.run(coord.commit("r1", partial=False))
        assert rows(two_tables, "db.a") == 3 and rows(two_tables, "db.b") == 3
        # Each table's commit_duration is the commit as its process timed it, without the
        # round trip to the process or a wait in its queue.
        assert sorted(a.table for a in answers) == ["db.a", "db.b"]
        for a in answers:
            assert a.duration_s is not None and a.duration_s > 0
            assert coord.metrics.registry.get_sample_value(
                "icesink_commit_duration_seconds_sum", {"table": a.table}) == pytest.approx(a.duration_s)
        assert not coord.session.state.pending
        assert coord._processes is not None
        pids = coord._processes.pids()
        assert pids and os.getpid() not in pids
        assert coord.session.status["commit_processes"] == pids
        [done] = [e for e in producer.sent if isinstance(e, CommitComplete)]
        assert done.positions == (Position(TP, 3),)
        # A second round on the same processes: no new process, the rows exact again.
        second = coordinator(tmp_path, two_tables, producer, "r2", [4, 5], start=3, processes=coord._processes)
        asyncio.run(second.commit("r2", partial=False))
        assert rows(two_tables, "db.a") == 5 and rows(two_tables, "db.b") == 5
        assert coord._processes.pids() == pids
        # Replayed (a coordinator that did not see its own CommitComplete): the watermark skips it.
        again = coordinator(tmp_path, two_tables, producer, "r2", [4, 5], start=3, processes=coord._processes)
        asyncio.run(again.commit("r2", partial=False))
        assert rows(two_tables, "db.a") == 5 and rows(two_tables, "db.b") == 5
    finally:
        if coord._processes is not None:
            coord._processes.close()


def test_a_killed_commit_process_fails_the_attempt_retriably_and_the_retry_starts_a_new_one(
        tmp_path, two_tables, monkeypatch):
    monkeypatch.setattr(round_commit, "RETRY_BASE_S", 0.01)
    producer = FlakyProducer(CommitComplete, fail=0)
    first = coordinator(tmp_path, two_tables, producer, "r1", [1, 2], start=0)
    processes = first._processes
    assert processes is not None
    try:
        asyncio.run(first.commit("r1", partial=False))
        killed = set(processes.pids())
        assert killed  # db.a and db.b share process 0 of 2
        _kill(killed)
        # Through the coordinator's retry loop: the first attempt finds its process gone, the
        # retry starts a new one, and the round commits exactly.
        second = coordinator(tmp_path, two_tables, producer, "r2", [3, 4], start=2, processes=processes)
        asyncio.run(asyncio.wait_for(second.commit("r2", partial=False), 60))
        assert rows(two_tables, "db.a") == 4 and rows(two_tables, "db.b") == 4
        assert second.metrics.commit_failures.labels(table="db.a")._value.get() == 1  # its first attempt
        assert processes.pids() and not killed & set(processes.pids())
        # Straight on the processes: the error is retriable and names the table.
        _kill(set(processes.pids()))
        batch = coordinator(tmp_path / "x", two_tables, producer, "r9", [9], start=4).session.state.plan_commit()[0]
        with pytest.raises(CommitProcessError) as raised:
            processes.commit("db.a", batch, RoundCommit(group="icesink", epoch=1, commit_id="r9", positions={TP: 5},
                             valid_through_ms=None))
        assert is_retriable(raised.value) and "table db.a" in str(raised.value)
        assert rows(two_tables, "db.a") == 4
    finally:
        processes.close()


def _kill(pids: set[int]) -> None:
    for p in pids:
        os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") and _alive(p) for p in pids):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


def test_fencing_and_a_conflict_cross_the_process_boundary_as_themselves(tmp_path, two_tables):
    """A newer coordinator's epoch in the table fences a commit made in a commit process: the
    parent sees FencedError (which is never retried), not a wrapped error."""
    producer = FlakyProducer(CommitComplete, fail=0)
    newer = coordinator(tmp_path, two_tables, producer, "r1", [1], start=0)
    newer.session.epoch = 2
    try:
        asyncio.run(newer.commit("r1", partial=False))
    finally:
        assert newer._processes is not None
        newer._processes.close()
    older = coordinator(tmp_path, two_tables, producer, "r2", [2], start=1)
    try:
        with pytest.raises(FencedError):
            asyncio.run(asyncio.wait_for(older.commit("r2", partial=False), 60))
        assert older.session.status["phase"] == "fenced"
    finally:
        assert older._processes is not None
        older._processes.close()
    for exc in (FencedError("x"), ControlLogError("x"), TableChangedError("x"), CommitFailedException("x"),
                NoSuchTableError("x"), CommitProcessError("x")):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == "x" and is_retriable(back) == is_retriable(exc)


def test_a_table_always_goes_to_the_same_process_and_takes_only_its_files(tmp_path):
    processes = CommitProcesses(settings_for(tmp_path, processes=3), 3)
    names = [f"db.t{i}" for i in range(60)]
    assert [processes.process_of(n) for n in names] == [processes.process_of(n) for n in names]
    assert set(processes.process_of(n) for n in names) == {0, 1, 2}
    a = Accepted(offset=7, commit_id="r", worker="w", ranges=(), valid_through_ms=None,
                 files={"db.a": ("fa",), "db.b": ("fb",)}, deleted_keys={"db.b": ("kb",)})  # type: ignore[dict-item]
    b = Accepted(offset=9, commit_id="r", worker="v", ranges=(), valid_through_ms=None, files={"db.b": ("fb2",)})  # type: ignore[dict-item]
    assert [(x.offset, x.files, x.deleted_keys) for x in table_batch([a, b], "db.a")] == [
        (7, {"db.a": ("fa",)}, {}), (9, {}, {})]
    assert [(x.files, x.deleted_keys) for x in table_batch([a, b], "db.b")] == [
        ({"db.b": ("fb",)}, {"db.b": ("kb",)}), ({"db.b": ("fb2",)}, {})]


def test_the_setting_and_where_it_does_not_apply(tmp_path, caplog):
    assert commit_processes(settings_for(tmp_path, processes=0)) is None
    assert isinstance(commit_processes(settings_for(tmp_path, processes=2)), CommitProcesses)
    with pytest.raises(Exception, match="commit.processes"):
        settings_for(tmp_path, processes=-1)
    # Mirror tables keep their key indexes in the coordinator: their commits stay on threads.
    mirror = settings_for(tmp_path, processes=2, **{"iceberg.tables.upsert-mode-enabled": "true",
                                                    "iceberg.tables.default-id-columns": "id"})
    assert mirror.mirror
    assert commit_processes(mirror) is None
    assert "ignored: mirror tables" in caplog.text


def test_maintenance_is_judged_on_the_table_the_commit_left(tmp_path, two_tables):
    """After a commit in a process the replica has no view of the table; the process says
    whether expiry or compaction has work there, so a round of 200 tables does not load 200
    tables to find nothing due. A table it does not hold counts as due."""
    from coordinator.commit_processes import maintenance_due
    from coordinator.committer import TableCache, commit_table
    from coordinator.maintenance import MaintenanceSettings

    cache = TableCache()
    table = two_tables.load_table("db.a")
    for offset in (1, 2, 3):
        commit_table(two_tables, "db.a", [Accepted(offset=offset, commit_id=f"r{offset}", worker="w", ranges=(),
                                                   valid_through_ms=None,
                                                   files={"db.a": (data_file(table, f"m{offset}", [offset]),)})],
                     RoundCommit(group="g", epoch=1, commit_id=f"r{offset}", positions={TP: offset}, valid_through_ms=None),
                     tables=cache)
    quiet = MaintenanceSettings(snapshot_max_age_ms=3_600_000, retain_last=1, min_input_files=16)
    assert maintenance_due(cache, "db.a", quiet, True, {}) is False
    assert maintenance_due(cache, "db.b", quiet, True, {}) is True  # not at hand: the Maintainer looks
    aged = MaintenanceSettings(snapshot_max_age_ms=0, retain_last=1, min_input_files=16)
    assert maintenance_due(cache, "db.a", aged, True, {}) is True  # two snapshots past the newest one
    small = MaintenanceSettings(snapshot_max_age_ms=3_600_000, retain_last=10, min_input_files=3)
    assert maintenance_due(cache, "db.a", small, True, {}) is True  # three small files: a compaction step
    assert maintenance_due(cache, "db.a", small, False, {}) is False  # no compaction on this replica


def test_a_round_in_processes_leaves_clear_tables_out_of_the_maintenance_pass(tmp_path, two_tables):
    producer = FlakyProducer(CommitComplete, fail=0)
    coord = coordinator(tmp_path, two_tables, producer, "r1", [1, 2, 3], start=0)
    try:
        coord._maintainer._retry["db.b"] = Backoff(2.0, 300.0)  # its last step failed: retried as planned
        asyncio.run(coord.commit("r1", partial=False))
        assert coord._maintainer._due == {"db.b"}
        assert coord.metrics.maintenance_last.labels(table="db.a")._value.get() > 0
        assert coord.session.status["maintenance"]["db.a"]["error"] is None  # /status shows the pass, as on threads
        assert coord.session.status["maintenance"]["db.a"]["expired_snapshots"] == 0
        assert set(coord._maintainer._orphans_at) == {"db.a", "db.b"}  # sweeps still planned for both
    finally:
        assert coord._processes is not None
        coord._processes.close()


def test_a_process_killed_after_its_commit_went_through_is_not_committed_twice(tmp_path, two_tables, monkeypatch):
    """The outcome a coordinator cannot know: the table took the commit, its process died
    before answering. The retry, in a new process, finds the round in the table (watermark)
    and skips it; the other table commits; every row is there once."""
    monkeypatch.setattr(round_commit, "RETRY_BASE_S", 0.01)
    point = "coordinator.commit-process.after-commit"
    producer = FlakyProducer(CommitComplete, fail=0)

    coord = coordinator(tmp_path, two_tables, producer, "r1", [1, 2, 3], start=0, **{"fault.crash-at": point})
    try:
        asyncio.run(asyncio.wait_for(coord.commit("r1", partial=False), 60))
        assert (tmp_path / "state" / f"fault-{point}.fired").exists()  # it did die after committing db.a
        assert rows(two_tables, "db.a") == 3 and rows(two_tables, "db.b") == 3
        assert len(two_tables.load_table("db.a").metadata.snapshots) == 1
        assert coord.metrics.commit_failures.labels(table="db.a")._value.get() == 1
        assert not coord.session.state.pending
    finally:
        assert coord._processes is not None
        coord._processes.close()


def test_a_failed_maintenance_look_does_not_fail_the_commit_that_went_through(tmp_path, two_tables, monkeypatch):
    from coordinator import commit_processes
    from coordinator.maintenance import MaintenanceSettings

    def unreadable(*_: Any, **__: Any) -> Any:
        raise OSError("manifest unreadable")

    monkeypatch.setattr(commit_processes, "_catalog", two_tables)
    monkeypatch.setattr(commit_processes, "_settings", settings_for(tmp_path))
    monkeypatch.setattr(commit_processes, "_replica", os.getpid())
    monkeypatch.setattr(commit_processes, "plan_compaction", unreadable)
    batch = coordinator(tmp_path / "x", two_tables, FlakyProducer(CommitComplete, fail=0), "r1", [1, 2],
                        start=0).session.state.plan_commit()[0]
    out = commit_processes._commit_here(  # in this process: the commit process's own function
        "db.a", table_batch(batch, "db.a"),
        RoundCommit(group="icesink", epoch=1, commit_id="r1", positions={TP: 2}, valid_through_ms=None),
        (MaintenanceSettings(snapshot_max_age_ms=3_600_000), True))
    assert out.snapshot_id is not None and out.maintenance_due is None  # not judged: the Maintainer looks
    assert rows(two_tables, "db.a") == 2


def test_an_error_that_would_not_unpickle_crosses_as_itself_in_kind():
    """A broken pool reads as a dead process, which is retried: an error that cannot unpickle
    must not turn a final error into endless retries."""
    from coordinator.commit_processes import CommitProcessFailure, _crossable
    from icesink.shared.errors import PreconditionFailed

    fenced = FencedError("table db.a: epoch")
    assert _crossable(fenced) is fenced
    final = _crossable(PreconditionFailed("the range start", 3, 5))
    assert isinstance(final, CommitProcessFailure) and not is_retriable(final)
    assert "PreconditionFailed" in str(final) and "the range start" in str(final)
    back = pickle.loads(pickle.dumps(final))
    assert str(back) == str(final) and not is_retriable(back)
    transient = pickle.loads(pickle.dumps(_crossable(_Unpicklable("catalog timed out"))))
    assert isinstance(transient, CommitProcessFailure) and is_retriable(transient)


class _Unpicklable(Exception):
    def __init__(self, message: str, extra: int = 0) -> None:
        super().__init__(message)
        self.lock = __import__("threading").Lock()  # cannot pickle


def test_commit_processes_exit_when_their_replica_is_killed(tmp_path):
    """A replica killed with SIGKILL cannot close its pool; its commit processes must not live
    on (and commit late): they watch the replica and exit."""
    import subprocess
    import sys

    script = f"""
import time
from coordinator.commit_processes import CommitProcesses
from tests.unit.test_commit_processes import settings_for
from pathlib import Path
p = CommitProcesses(settings_for(Path({str(tmp_path)!r})), 2)
p.start(wait=True)  # each process has imported pyiceberg and opened the catalog
print(*p.pids(), flush=True)
time.sleep(600)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    # A bound on "never", not a timing: at a load average of 16 on two cores the processes took
    # just over 15 s to notice (each watches its replica every WATCH_S, once its start-up is done).
    deadline = time.monotonic() + 60
    while any(os.path.exists(f"/proc/{p}") and _alive(p) for p in pids):
        assert time.monotonic() < deadline, "commit processes outlived their replica"
        time.sleep(0.1)
