"""One Iceberg table commit of a round (blocking; run through Offload).

The commit preconditions are checked against the table's own sink state (the table property
``icesink.<group>.state``, else the snapshot summaries), refreshed on every attempt: a newer
coordinator epoch fences us; state that names another control log stops us (its watermark
does not compare with this log's offsets); responses at or below the table's control
watermark are already in the table and are skipped (replay is idempotent).

The state goes into the snapshot summary and into the table property in one commit (one
pyiceberg transaction: the property update and the snapshot are sent in one request, and
a retried commit keeps the property update), so snapshot expiry by another tool cannot
hide it (docs/commits.md).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    BadRequestError, CommitFailedException, ForbiddenError, NoSuchTableError, UnauthorizedError,
)
from pyiceberg.table import Table

from coordinator.iceberg_ext import MemoTransaction, SpecAwareAppend, check_before_retry, require_installed
from coordinator.mirror import MirrorIndexes, position_deletes
from coordinator.requirements import (
    AssertFieldIds, AssertFilesConfined, applied_watermark, retry_requirements, sink_state_requirements, validate,
    validate_only,
)
from coordinator.state import Accepted, Checkpoint
from icesink.shared.errors import ControlLogError, FencedError, TableChangedError
from icesink.shared.config import MAIN_BRANCH, CommitBranches
from icesink.shared.iceberg import branch_head, ensure_branch, latest_sink_summary, to_data_file
from icesink.shared.protocol import SinkState, TopicPartition, state_property, summary_properties
from icesink.shared.protocol.fences import coordinator_prefix

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableCommit:
    table: str
    snapshot_id: int | None  # None: nothing new for this table
    files: int
    records: int
    watermark: int
    # Whether maintenance has anything to do on the committed table, when the commit's process
    # checked (coordinator/commit_processes.py); None: not checked, the Maintainer looks itself.
    maintenance_due: bool | None = None
    # The commit's own seconds, when a commit process timed it (its wait in that process's queue
    # left out); None: timed by the caller.
    duration_s: float | None = None
    # The sink snapshot the table already held for responses of this batch (an earlier attempt or
    # coordinator committed them, then stopped before announcing it: the caller announces it
    # unless the log has its CommitToTable); None: the table held none of them.
    held: Held | None = None


@dataclass(frozen=True)
class Held:
    """A sink snapshot as a CommitToTable names it: the round that made it and what it added."""

    commit_id: str
    snapshot_id: int | None  # None: expired by another tool
    files: int
    records: int
    watermark: int


def held_commit(table: Table, group: str, branch: str = MAIN_BRANCH) -> Held | None:
    """``group``'s newest commit in ``table`` (None: the group has none), found in the history
    of ``branch``, the one the group commits the table to."""
    state = latest_sink_summary(table, group, branch)
    if state is None:
        return None
    snap = branch_head(table, branch)
    while snap is not None:
        s = snap.summary
        if s is not None and s["icesink.group"] == group and s["icesink.commit-id"] == state.commit_id:
            return Held(state.commit_id, snap.snapshot_id, int(s["added-data-files"] or 0),
                        int(s["added-records"] or 0), state.watermark)
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    return Held(state.commit_id, None, 0, 0, state.watermark)


@dataclass(frozen=True)
class RoundCommit:
    """What a round commits to each of its tables, one value for all of them (it crosses into
    the commit processes pickled: coordinator/commit_processes.py).

    ``checkpoint``: the state the round's CommitComplete will record (kept in the table so a
    coordinator that cannot read its checkpoint recovers from the tables); ``log_id``: the
    control log's identity (None: unknown, not checked); ``adopted``: the operator adopted this
    log (iceberg.control.adopt-log-id), so state of another log counts as nothing on it.
    ``tables_of_round``: :func:`round_tables` of the round's batch, worked out once for all the
    round's table commits (None: by each commit; at 200 tables it was a few percent of each
    commit's CPU)."""

    group: str
    epoch: int
    commit_id: str
    positions: dict[TopicPartition, int]
    valid_through_ms: int | None
    checkpoint: Checkpoint | None = None
    log_id: str | None = None
    adopted: bool = False
    tables_of_round: dict[str, int] | None = None
    #: The branch each table commits to (iceberg.tables.default-commit-branch, docs/commits.md "Branches").
    branches: CommitBranches = field(default_factory=CommitBranches)


def commit_table(
    catalog: Catalog,
    table_name: str,
    batch: list[Accepted],
    round: RoundCommit,
    *,
    mirrors: MirrorIndexes | None = None,
    tables: TableCache | None = None,
) -> TableCommit:
    """``round``'s commit of ``batch`` to ``table_name``.
    ``mirrors``: the key indexes of mirror tables (None: the sink makes none); a mirror
    table's snapshot also deletes, by position, the rows the round's changes replace.
    ``tables``: the coordinator's :class:`TableCache` (None: load the table every time)."""
    require_installed()  # the composition root installed coordinator/iceberg_ext/ in this process
    table = tables.get(table_name) if tables is not None else None
    if table is None or not _fits(table, table_name, batch) or (mirrors is not None and mirrors.keys(table_name, table)):
        table = _load_table(catalog, table_name, batch)  # mirror tables plan deletes: always the newest snapshot
    try:
        out = _commit(table, table_name, batch, round, mirrors,
                      round_tables(batch) if round.tables_of_round is None else round.tables_of_round)
    except NoSuchTableError:
        if tables is not None:
            tables.drop(table_name)
        _load_table(catalog, table_name, batch)  # a cached table was dropped: raises TableChangedError saying so
        raise
    except BaseException:
        if tables is not None:
            tables.drop(table_name)
        raise
    if tables is not None:
        tables.put(table_name, table)  # pyiceberg updated it with the committed metadata
    return out


def _commit(
    table: Table, table_name: str, batch: list[Accepted], round: RoundCommit, mirrors: MirrorIndexes | None,
    tables_of_round: dict[str, int],
) -> TableCommit:
    group, epoch, commit_id, log_id, adopted = round.group, round.epoch, round.commit_id, round.log_id, round.adopted
    checkpoint = round.checkpoint
    branch = round.branches.of(table_name)
    sink_state = validate(sink_state_requirements(table_name, epoch, log_id, adopted), table, group, branch)
    applied = applied_watermark(sink_state, log_id, adopted)
    todo = [a for a in batch if a.offset > applied and (a.files.get(table_name) or a.deleted_keys.get(table_name))]
    watermark = max((a.offset for a in batch), default=applied)
    files = [f for a in todo for f in a.files.get(table_name, ())]
    paths = tuple(f.path for f in files)
    for r in (AssertFilesConfined(table_name, paths),
              # no state of the group: a fresh table, or one dropped and created again
              *((AssertFieldIds(table_name, paths),) if applied < 0 else ())):
        r.validate(table, sink_state)
    naming = [a.offset for a in batch if a.files.get(table_name) or a.deleted_keys.get(table_name)]
    held = held_commit(table, group, branch) if naming and min(naming) <= applied else None
    if not todo:
        return TableCommit(table_name, None, 0, 0, applied, held=held)
    ensure_branch(table, table_name, branch)  # before a mirror table's deletes are planned on its head
    props = summary_properties(group, commit_id, watermark, round.positions, epoch, round.valid_through_ms,
                               log_id=log_id)
    state = SinkState(
        snapshot_id=None, commit_id=commit_id, watermark=watermark, positions=dict(round.positions), epoch=epoch,
        valid_through_ms=round.valid_through_ms, log_id=log_id,
        through=checkpoint.through if checkpoint else None,
        replay_from=checkpoint.replay_from if checkpoint else None,
        owners=dict(checkpoint.owners) if checkpoint else {},
        round_tables=tables_of_round,
    )
    keys = mirrors.keys(table_name, table) if mirrors is not None else None
    index = mirrors.take(table_name, table, keys) if mirrors is not None and keys is not None else None
    deletes = (position_deletes(table, table_name, index, todo, coordinator_prefix(group, epoch, "delete"))
               if index is not None else [])
    try:
        with MemoTransaction(table) as tx:
            # pyiceberg retries a conflicting commit by itself, re-applying the same files on the refreshed
            # table: icesink's preconditions are re-checked there first (tests/integration/test_commit_race.py
            # fails if they are not)
            again = retry_requirements(table_name, epoch, applied, log_id, adopted, replan=index is not None)
            check_before_retry(tx, lambda refreshed: validate_only(again, refreshed, group, branch))
            tx.set_properties({state_property(group): state.to_json()})
            with SpecAwareAppend.of(tx, props, deletes, branch=branch) as append:
                for f in files:
                    append.append_data_file(to_data_file(f, table))
    except _REFUSED:
        for d in deletes:  # this commit surely did not go through (an unknown outcome: gc judges the file)
            _delete_quietly(table, d.file_path)
        raise
    snap = branch_head(table, branch)
    if mirrors is not None and index is not None:  # the index now describes the new snapshot (a failure above dropped it)
        mirrors.keep(table_name, snap.snapshot_id if snap else None, index)
    return TableCommit(
        table_name,
        snap.snapshot_id if snap else None,
        len(files),
        sum(f.record_count for f in files),
        watermark,
        held=held,
    )


#: Errors that say a commit surely did not go through (its position delete files are removed): a
#: conflict, a fence, a refusal by icesink or by the catalog (the table dropped, no permission, a
#: request it rejects: a parked table writes its deletes again at every attempt).
_REFUSED = (CommitFailedException, FencedError, ControlLogError, TableChangedError, NoSuchTableError,
            ForbiddenError, UnauthorizedError, BadRequestError)


def round_tables(batch: list[Accepted]) -> dict[str, int]:
    """Each table of a round with the highest control offset of a response naming it."""
    out: dict[str, int] = {}
    for a in batch:
        for t in {*a.files, *a.deleted_keys}:
            if a.files.get(t) or a.deleted_keys.get(t):
                out[t] = max(out.get(t, -1), a.offset)
    return out


class TableCache:
    """The tables as the coordinator's last successful commits left them, so a round's commit
    starts from there instead of loading each table again (a fifth of a commit's CPU; a round
    of 200 tables loads 200). A stale entry (another writer committed since) is safe: the
    catalog refuses the commit (its metadata location and the main branch's snapshot are
    required), pyiceberg refreshes the table and re-applies the append, and
    the commit's retry requirements (coordinator/requirements.py) are re-checked on the refreshed table first.
    Any failure drops the entry; maintenance puts the table its commit left, and the load
    that admits a table's first files (coordinator/files.py TableRoots) offers its own; mirror
    tables, whose deletes are planned against the current snapshot, are always loaded."""

    def __init__(self) -> None:
        self._tables: dict[str, Table] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Table | None:
        with self._lock:
            return self._tables.get(name)

    def put(self, name: str, table: Table) -> None:
        with self._lock:
            self._tables[name] = table

    def drop(self, name: str) -> None:
        with self._lock:
            self._tables.pop(name, None)

    def offer(self, name: str, table: Table) -> None:
        """``table`` as just loaded (to check a response's files): kept unless one is cached."""
        with self._lock:
            self._tables.setdefault(name, table)


def _fits(table: Table, table_name: str, batch: list[Accepted]) -> bool:
    """Whether every file of ``batch`` names a partition spec the (cached) table knows."""
    specs = table.metadata.specs()
    return all(f.spec_id in specs for a in batch for f in a.files.get(table_name, ()))


# Tables changed by other writers ---------------------------------------------------------


def _load_table(catalog: Catalog, table_name: str, batch: list[Accepted]) -> Table:
    """The table, or a :class:`TableChangedError` that says it was dropped (retried: accepted
    files are never dropped, and commit once the table is back)."""
    try:
        return catalog.load_table(table_name)
    except NoSuchTableError as exc:
        waiting = sum(len(a.files.get(table_name, ())) for a in batch)
        raise TableChangedError(
            f"table {table_name}: expected it in catalog {catalog.name}, found none ({exc}): another "
            f"writer dropped or renamed it; {waiting} accepted data files wait for it. Recreate it with "
            "the same schema and partition spec (or restore it) and the commit goes through; the "
            "coordinator retries until then"
        ) from exc


def _delete_quietly(table: Table, path: str) -> None:
    try:
        table.io.delete(path)
    except Exception as exc:  # noqa: BLE001 - an orphan for icesink gc
        log.warning("could not delete unused position delete file %s (icesink gc will): %s", path, exc)


