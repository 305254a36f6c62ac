"""One Iceberg table commit of a round (blocking; run through Offload).

The commit preconditions are checked against the table's own snapshot summary, refreshed on
every attempt: a newer coordinator epoch fences us; responses at or below the table's
control watermark are already in the table and are skipped (replay is idempotent).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table, Transaction

from coordinator.state import Accepted
from icesink.errors import FencedError
from icesink.events import TopicPartition
from icesink.iceberg import latest_sink_summary, summary_properties, to_data_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableCommit:
    table: str
    snapshot_id: int | None  # None: nothing new for this table
    files: int
    records: int
    watermark: int


def commit_table(
    catalog: Catalog,
    table_name: str,
    batch: list[Accepted],
    *,
    group: str,
    epoch: int,
    commit_id: str,
    positions: dict[TopicPartition, int],
    valid_through_ms: int | None,
) -> TableCommit:
    table = catalog.load_table(table_name)
    applied = _applied_watermark(table, table_name, group, epoch)
    todo = [a for a in batch if a.offset > applied and a.files.get(table_name)]
    watermark = max((a.offset for a in batch), default=applied)
    files = [f for a in todo for f in a.files[table_name]]
    if not files:
        return TableCommit(table_name, None, 0, 0, applied)
    props = summary_properties(group, commit_id, watermark, positions, epoch, valid_through_ms)
    with table.transaction() as tx:
        _recheck_on_retry(tx, table_name, group, epoch, applied)
        with tx.update_snapshot(snapshot_properties=props).fast_append() as append:
            for f in files:
                append.append_data_file(to_data_file(f, table))
    snap = table.current_snapshot()
    return TableCommit(
        table_name,
        snap.snapshot_id if snap else None,
        len(files),
        sum(f.record_count for f in files),
        watermark,
    )


def _applied_watermark(table: Table, table_name: str, group: str, epoch: int) -> int:
    """The control watermark the table holds for ``group``; fences an older coordinator."""
    summary = latest_sink_summary(table, group)
    if summary is not None and summary.epoch > epoch:
        raise FencedError(
            f"table {table_name}: expected coordinator epoch <= {epoch}, found {summary.epoch} "
            "(a newer coordinator owns the group)"
        )
    return summary.watermark if summary is not None else -1


def _recheck_on_retry(tx: Transaction, table_name: str, group: str, epoch: int, applied: int) -> None:
    """pyiceberg retries a conflicting commit by itself, re-applying the same files on the
    refreshed table. Re-check icesink's preconditions first: if another coordinator committed
    meanwhile (newer epoch: fenced; moved watermark: the plan is stale), stop, so the caller
    re-plans from the table. Pinned to pyiceberg 0.12's Transaction._rebuild_snapshot_updates
    (pyproject.toml); tests/integration/test_commit_race.py fails if that hook is not called."""
    rebuild = tx._rebuild_snapshot_updates

    def checked_rebuild() -> None:
        now = _applied_watermark(tx._table, table_name, group, epoch)
        if now != applied:
            raise CommitFailedException(
                f"table {table_name}: control watermark moved from {applied} to {now} during the commit "
                "(another icesink commit landed); re-planning"
            )
        rebuild()

    tx._rebuild_snapshot_updates = checked_rebuild  # type: ignore[method-assign]
