"""One Iceberg table commit of a round (blocking; run through Offload).

The commit preconditions are checked against the table's own snapshot summary, refreshed on
every attempt: a newer coordinator epoch fences us; responses at or below the table's
control watermark are already in the table and are skipped (replay is idempotent).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyiceberg.catalog import Catalog

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
    summary = latest_sink_summary(table, group)
    if summary is not None and summary.epoch > epoch:
        raise FencedError(
            f"table {table_name}: expected coordinator epoch <= {epoch}, found {summary.epoch} "
            "(a newer coordinator owns the group)"
        )
    applied = summary.watermark if summary is not None else -1
    todo = [a for a in batch if a.offset > applied and a.files.get(table_name)]
    watermark = max((a.offset for a in batch), default=applied)
    files = [f for a in todo for f in a.files[table_name]]
    if not files:
        return TableCommit(table_name, None, 0, 0, applied)
    props = summary_properties(group, commit_id, watermark, positions, epoch, valid_through_ms)
    with table.transaction() as tx:
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
