"""``icesink offsets`` and ``icesink rewind`` (docs/rewind.md).

``offsets``: the Kafka positions (topic, partition, next offset) each snapshot of a table holds
for the sink group, read from the snapshot summaries every icesink commit writes
(:mod:`icesink.shared.protocol.summary`). A snapshot another writer made holds the positions of
the newest sink snapshot below it.

``rewind``: with the sink stopped, take a table back to before given offsets and make the group
read again from there, so each record is in the table once. When the rows carry their offsets
(:func:`offset_columns`) the rows at or past them are deleted (:func:`delete_past`); else the
table is rolled back to the newest snapshot of its commit branch whose positions are all at or
below the offsets asked (a snapshot holds exactly the records below its positions). Either is
one catalog commit with the group's state property set to the new positions; then the group's positions are altered as
``icesink connect``'s offsets PATCH alters them (:func:`icesink.app.connect_offsets.change_offsets`:
a signed ``alter-positions`` event on the control log, then the consumer-group hint).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from icesink.shared.protocol import TopicPartition
from icesink.shared.protocol.summary import COMMIT_ID, GROUP, POSITIONS, flat_positions

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icesink.shared.config import Settings

#: The summary key of icesink's own maintenance snapshots (coordinator/maintenance.py): they
#: rewrite rows, they add or remove none, so rolling one back loses nothing.
MAINTENANCE_KEY = "icesink.maintenance"


def pending_property(group: str) -> str:
    """The table property a rewind sets in its table commit and removes once the group's
    positions are altered: while it is there, a rewind was interrupted between the two, and the
    group's workers and coordinator refuse to start (:func:`icesink.shared.iceberg.refuse_pending_rewind`)."""
    from icesink.shared.protocol.summary import rewind_pending_property

    return rewind_pending_property(group)


def pending_rewind(table: Table, group: str) -> str | None:
    """The ``--to`` of an interrupted rewind of ``group`` (None: none)."""
    return table.metadata.properties.get(pending_property(group))


def format_targets(to: Mapping[TopicPartition, int]) -> str:
    return ",".join(f"{tp.topic}:{tp.partition}:{off}" for tp, off in sorted(to.items()))


class RewindRefused(Exception):
    """A rewind refused before anything changed; the message is the one line to print."""


@dataclass(frozen=True)
class SnapshotPositions:
    """One snapshot of a table's commit branch and the positions it holds for the group."""

    snapshot_id: int
    timestamp_ms: int
    operation: str
    writer: str  # "sink" (this group's round), "maintenance", or who else wrote it
    commit_id: str | None
    positions: dict[TopicPartition, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "timestamp_ms": self.timestamp_ms, "operation": self.operation,
                "writer": self.writer, "commit_id": self.commit_id,
                "positions": [{"topic": tp.topic, "partition": tp.partition, "offset": off}
                              for tp, off in sorted(self.positions.items())]}


def _writer(summary: Mapping[str, Any], group: str) -> str:
    g = summary.get(GROUP)
    if g == group and summary.get(COMMIT_ID) is not None:
        return "sink"
    if g is not None:
        return f"sink group {g}"
    if summary.get(MAINTENANCE_KEY) is not None:
        return "maintenance"
    return "other writer"


def snapshot_positions(table: Table, group: str, branch: str) -> list[SnapshotPositions]:
    """The snapshots of ``branch``'s ancestry, newest first, each with the positions it holds
    for ``group`` (a snapshot not of the group: those of its newest ancestor that is)."""
    from icesink.shared.iceberg import branch_head

    chain = []
    snap = branch_head(table, branch)
    while snap is not None:
        chain.append(snap)
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    out: list[SnapshotPositions] = []
    held: dict[TopicPartition, int] = {}
    for snap in reversed(chain):
        summary = dict(snap.summary.additional_properties) if snap.summary is not None else {}
        writer = _writer(summary, group)
        if writer == "sink":
            held = {tp: int(v) for tp, v in flat_positions(json.loads(summary.get(POSITIONS) or "{}")).items()}
        op = snap.summary.operation.value if snap.summary is not None else "?"
        out.append(SnapshotPositions(snap.snapshot_id, snap.timestamp_ms, op, writer,
                                     summary.get(COMMIT_ID) if writer == "sink" else None, dict(held)))
    return out[::-1]


def format_offsets(rows: Iterable[SnapshotPositions]) -> str:
    """The plain table of ``icesink offsets``: one line per snapshot and partition."""
    from datetime import UTC, datetime

    lines = [f"{'SNAPSHOT':<20} {'COMMITTED (UTC)':<20} {'WRITER':<14} {'TOPIC':<24} {'PARTITION':>9} "
             f"{'NEXT_OFFSET':>11}"]
    for r in rows:
        when = datetime.fromtimestamp(r.timestamp_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        cells = [(tp.topic, str(tp.partition), str(off)) for tp, off in sorted(r.positions.items())]
        for topic, part, nxt in cells or [("-", "-", "-")]:
            lines.append(f"{r.snapshot_id:<20} {when:<20} {r.writer:<14} {topic:<24} {part:>9} {nxt:>11}")
    return "\n".join(lines)


def parse_targets(text: str) -> dict[TopicPartition, int]:
    """``topic:partition:offset[,...]`` (a topic may hold ':'; the last two fields are numbers)."""
    out: dict[TopicPartition, int] = {}
    for item in (t.strip() for t in text.split(",")):
        topic, _, rest = item.rpartition(":")
        topic, _, part = topic.rpartition(":")
        if not topic or not part.isdigit() or not rest.isdigit():
            raise RewindRefused(f"--to: expected topic:partition:offset[,...], found {item!r}")
        tp = TopicPartition(topic, int(part))
        if tp in out:
            raise RewindRefused(f"--to: partition {tp} given twice")
        out[tp] = int(rest)
    return out


@dataclass(frozen=True)
class RewindPlan:
    target: SnapshotPositions
    lost: tuple[SnapshotPositions, ...]  # this group's (and maintenance) snapshots rolled back

    @property
    def rollback(self) -> bool:
        return bool(self.lost)


def plan_rewind(table_name: str, rows: list[SnapshotPositions], to: Mapping[TopicPartition, int]) -> RewindPlan:
    """The snapshot to roll back to: the newest whose positions are at or below ``to`` for
    every partition asked (it holds no record at or past them). Refused when a snapshot above it
    is another writer's: a rollback would lose its changes."""
    for i, row in enumerate(rows):
        if all(row.positions.get(tp, 0) <= off for tp, off in to.items()):
            foreign = [r for r in rows[:i] if r.writer not in ("sink", "maintenance")]
            if foreign:
                raise RewindRefused(
                    f"Refusing to rewind {table_name}: rolling back to snapshot {row.snapshot_id} would lose snapshot(s) "
                    f"{', '.join(f'{r.snapshot_id} ({r.writer}, {r.operation})' for r in foreign)} made by another "
                    "writer; remove or redo their changes by hand, or rewind to offsets at or above the positions they hold")
            return RewindPlan(row, tuple(rows[:i]))
    asked = ", ".join(f"{tp}@{off}" for tp, off in sorted(to.items()))
    oldest = rows[-1].snapshot_id if rows else None
    raise RewindRefused(f"Refusing to rewind {table_name}: no snapshot holds positions at or below {asked} "
                        f"(oldest snapshot: {oldest}); the table holds records below those offsets in every snapshot "
                        "it has left (expired snapshots cannot be restored)")


def new_positions(plan: RewindPlan, current: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
    """Where the group reads again: the target snapshot's positions for every partition the
    table's state knows (None: a partition the target holds nothing of, read from its beginning)."""
    parts = set(current) | set(plan.target.positions)
    return {tp: plan.target.positions.get(tp) for tp in sorted(parts, key=lambda tp: (tp.topic, tp.partition))}


def _state(state: Any, positions: Mapping[TopicPartition, int], watermark: int | None) -> Any:
    """The group's state with ``positions``, its control watermark raised to ``watermark`` (the
    log's last offset when the rewind planned): every response the log accepted before the
    rewind counts as held by the table, so recovery commits none of those it did not commit
    (their records start at the old positions, read again after the rewind)."""
    raised = state.watermark if watermark is None else max(state.watermark, watermark)
    return replace(state, positions=dict(positions), watermark=raised)


def roll_back(table: Table, branch: str, group: str, snapshot_id: int, positions: Mapping[TopicPartition, int],
              pending: str | None = None, watermark: int | None = None) -> None:
    """One catalog commit: ``branch`` back to ``snapshot_id`` and the group's state property
    holding ``positions`` (epoch, log identity as they were; the watermark raised to
    ``watermark``: see :func:`_state`). The branch's head is asserted, so a commit that landed
    meanwhile fails this one (nothing changes) instead of being lost. Blocking."""
    from pyiceberg.table.refs import MAIN_BRANCH
    from pyiceberg.table.update.snapshot import ManageSnapshots

    from icesink.shared.iceberg import latest_sink_summary
    from icesink.shared.protocol import state_property

    state = latest_sink_summary(table, group, branch)
    tx = table.transaction()
    if branch == MAIN_BRANCH:
        ManageSnapshots(tx).set_current_snapshot(snapshot_id=snapshot_id)
    else:
        ManageSnapshots(tx).remove_branch(branch).create_branch(snapshot_id, branch)
    if state is not None:
        tx.set_properties({state_property(group): _state(state, positions, watermark).to_json()})
    if pending is not None:
        tx.set_properties({pending_property(group): pending})
    tx.commit_transaction()


def offset_columns(table: Table) -> tuple[str, str, str] | None:
    """The top-level ``<f>_topic``, ``<f>_partition``, ``<f>_offset`` columns of the table (the
    Kafka metadata columns of ``iceberg.tables.kafka-metadata-enabled`` or the
    KafkaMetadataTransform, not nested), when every row has them and the table has no delete
    files (pyiceberg's copy-on-write delete reads no equality deletes): then the rows at or past
    an offset can be deleted exactly. None: the rewind rolls back instead."""
    from pyiceberg.expressions import IsNull, Or

    names = {f.name for f in table.schema().fields}
    prefixes = sorted(n.removesuffix("_offset") for n in names if n.endswith("_offset")
                      and {n.removesuffix("_offset") + "_topic", n.removesuffix("_offset") + "_partition"} <= names)
    snap = table.current_snapshot()
    deletes = snap.summary["total-delete-files"] if snap is not None and snap.summary is not None else None
    if not prefixes or snap is None or int(deletes or 0) > 0:
        return None
    p = prefixes[0]
    cols = (f"{p}_topic", f"{p}_partition", f"{p}_offset")
    if table.scan(row_filter=Or(IsNull(term=cols[1]), Or(IsNull(term=cols[0]), IsNull(term=cols[2]))),
                  selected_fields=cols[2:],
                  limit=1).to_arrow().num_rows:
        return None  # rows written before the columns were added: their offsets are unknown
    return cols


def delete_past(table: Table, branch: str, group: str, cols: tuple[str, str, str], to: Mapping[TopicPartition, int],
                positions: Mapping[TopicPartition, int], pending: str | None = None, watermark: int | None = None) -> None:
    """One catalog commit: the rows of each partition of ``to`` at or past its offset deleted
    (copy-on-write), the snapshot(s) carrying the group's summary with ``positions`` and the
    group's state property too. Run again, it deletes nothing more. Blocking."""
    from functools import reduce

    from pyiceberg.expressions import And, BooleanExpression, EqualTo, GreaterThanOrEqual, Or

    from icesink.shared.iceberg import latest_sink_summary
    from icesink.shared.protocol import state_property

    topic, part, off = cols
    match: list[BooleanExpression] = [
        And(EqualTo(term=topic, value=tp.topic), And(EqualTo(term=part, value=tp.partition),
                                                     GreaterThanOrEqual(term=off, value=o)))
        for tp, o in sorted(to.items())]
    state = latest_sink_summary(table, group, branch)
    lowered = _state(state, positions, watermark) if state is not None else None
    import warnings

    tx = table.transaction()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "did not match any records": a run again after the commit
        tx.delete(reduce(Or, match), snapshot_properties=lowered.properties(group) if lowered else {}, branch=branch)
    if lowered is not None:
        tx.set_properties({state_property(group): lowered.to_json()})
    if pending is not None:
        tx.set_properties({pending_property(group): pending})
    tx.commit_transaction()


async def check_stopped(settings: Settings, bootstrap: str, out: Any) -> None:
    """Refuse while the sink group's consumer group has members: its coordinator would commit
    rounds across the rollback and its workers would read on from the old positions. Members of
    replicas just stopped may stay listed until their session times out: waits that long (twice
    consumer.session-timeout-ms), then refuses."""
    import asyncio
    import time

    from aiokafka.admin import AIOKafkaAdminClient

    deadline = time.monotonic() + 2 * settings.session_timeout_ms / 1000 + 5
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **settings.kafka_client_kwargs())
    await admin.start()
    try:
        while True:
            described = await admin.describe_consumer_groups([settings.group_id])
            members = [m for response in described for group in getattr(response, "groups", [])
                       for m in (group[5] if len(group) > 5 else [])]
            if not members:
                return
            if time.monotonic() > deadline:
                raise RewindRefused(
                    f"Refusing to rewind: sink group {settings.group_id} has {len(members)} running member(s); stop "
                    "every replica of the sink (or the connector: PUT /connectors/NAME/stop) and run the rewind again "
                    "(--assume-stopped if the broker lists members of stopped replicas: Tansu does)")
            print(f"sink group {settings.group_id}: waiting for {len(members)} member(s) to leave or expire",
                  file=out, flush=True)
            await asyncio.sleep(2)
    finally:
        await admin.close()


async def rewind(settings: Settings, bootstrap: str, table_name: str, to: dict[TopicPartition, int],
                 out: Any, assume_stopped: bool = False) -> dict[TopicPartition, int]:
    """The whole rewind, each step safe to repeat (docs/rewind.md); prints what it does."""
    import asyncio

    from icesink.app.connect_offsets import change_offsets, table_states
    from icesink.shared.faults import crash_point
    from icesink.shared.iceberg import latest_sink_summary, load_catalog
    from icesink.shared.kafka_admin import end_offsets

    if not assume_stopped:
        await check_stopped(settings, bootstrap, out)
    states = await asyncio.to_thread(table_states, settings)
    others = sorted(t for t in states if t != table_name)
    if others:
        raise RewindRefused(f"Refusing to rewind {table_name}: sink group {settings.group_id} also writes "
                            f"{', '.join(others)}, which would read the records again too (rewind of several "
                            "tables at once is not built)")
    catalog = await asyncio.to_thread(load_catalog, settings)
    table = await asyncio.to_thread(catalog.load_table, table_name)
    branch = settings.commit_branch(table_name)
    rows = snapshot_positions(table, settings.group_id, branch)
    state = latest_sink_summary(table, settings.group_id, branch)
    current = state.positions if state is not None else {}
    cols = await asyncio.to_thread(offset_columns, table)
    client = settings.control_client_kwargs()
    last = (await end_offsets(bootstrap, settings.control_topic, client_kwargs=client)).get(0, 0) - 1
    if cols is not None:
        concrete = {tp: min(off, current.get(tp, off)) for tp, off in to.items()}
        print(f"{table_name}: deleting the rows at or past {', '.join(f'{tp}@{o}' for tp, o in sorted(to.items()))} "
              f"by their offset columns {', '.join(cols)} (copy-on-write, no rollback)", file=out)
        await asyncio.to_thread(delete_past, table, branch, settings.group_id, cols, to, {**current, **concrete},
                                format_targets(to), last)
        crash_point(settings, "rewind.after-table-commit")
    else:
        plan = plan_rewind(table_name, rows, to)
        wanted = new_positions(plan, current)
        begin = await _beginnings(settings, bootstrap, [tp for tp, off in wanted.items() if off is None])
        concrete = {tp: begin[tp] if off is None else off for tp, off in wanted.items()}
        if plan.rollback:
            print(f"{table_name}: rollback of {branch} to snapshot {plan.target.snapshot_id} (removing "
                  f"{len(plan.lost)} snapshot(s): {', '.join(str(r.snapshot_id) for r in plan.lost)})", file=out)
            await asyncio.to_thread(roll_back, table, branch, settings.group_id, plan.target.snapshot_id, concrete,
                                    format_targets(to), last)
            crash_point(settings, "rewind.after-table-commit")
        else:
            print(f"{table_name}: snapshot {plan.target.snapshot_id} ({branch}'s head) holds nothing at or past the "
                  "offsets: no rollback needed", file=out)
            # still void what the log accepted and no table holds: its ranges start at the positions read again
            await asyncio.to_thread(_void_accepted, table, settings.group_id, branch, concrete, format_targets(to), last)
    new = await change_offsets(settings, bootstrap, dict(concrete), True, f"rewind of {table_name}",
                               reason=f"rewind of {table_name} by icesink rewind")
    crash_point(settings, "rewind.after-alter")
    await asyncio.to_thread(_clear_pending, catalog, table_name, settings.group_id)
    print(f"{table_name}: sink group {settings.group_id} reads again from "
          f"{', '.join(f'{tp}@{off}' for tp, off in new.items())}; start the sink", file=out)
    return new


def _void_accepted(table: Table, group: str, branch: str, positions: Mapping[TopicPartition, int], pending: str,
                   watermark: int) -> None:
    """A property-only commit: the group's state with ``positions`` and its watermark raised
    (:func:`_state`), and the pending marker; nothing if the state already says so."""
    from icesink.shared.iceberg import latest_sink_summary
    from icesink.shared.protocol import state_property

    state = latest_sink_summary(table, group, branch)
    if state is None:
        return
    new = _state(state, positions, watermark)
    if new == state and pending_rewind(table, group) == pending:
        return
    tx = table.transaction()
    tx.set_properties({state_property(group): new.to_json(), pending_property(group): pending})
    tx.commit_transaction()


def _clear_pending(catalog: Any, table_name: str, group: str) -> None:
    table = catalog.load_table(table_name)
    if pending_rewind(table, group) is not None:
        tx = table.transaction()
        tx.remove_properties(pending_property(group))
        tx.commit_transaction()


async def _beginnings(settings: Settings, bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    if not tps:
        return {}
    from aiokafka import AIOKafkaConsumer, TopicPartition as KafkaTP

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                **settings.kafka_client_kwargs())
    await consumer.start()
    try:
        found = await consumer.beginning_offsets([KafkaTP(tp.topic, tp.partition) for tp in tps])
    finally:
        await consumer.stop()
    return {TopicPartition(k.topic, k.partition): int(v) for k, v in found.items()}
