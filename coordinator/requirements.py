"""The preconditions of a table commit, as pyiceberg writes its own (``AssertTableUUID``,
``AssertRefSnapshotId``, ... in ``pyiceberg.table.update``): small frozen values, built once per
commit, each with a ``validate`` that raises saying what it expected and what it found.

They are checked against the table's sink state for the group (read once per check:
:func:`validate`): before the commit plans, and again on every retry pyiceberg makes by itself
(:func:`coordinator.iceberg_ext.check_before_retry`), on the refreshed table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from coordinator.files import confined, data_roots, field_id_mismatch
from icesink.shared.errors import ControlLogError, FencedError, TableChangedError
from icesink.shared.config import MAIN_BRANCH
from icesink.shared.iceberg import latest_sink_summary
from icesink.shared.protocol import SinkState


class TableRequirement(Protocol):
    """A precondition of a commit to ``table``; ``state``: the group's sink state in it."""

    def validate(self, table: Table, state: SinkState | None) -> None: ...


def validate(requirements: Sequence[TableRequirement], table: Table, group: str,
             branch: str = MAIN_BRANCH) -> SinkState | None:
    """Validate ``requirements`` in order against ``table``; returns the group's sink state
    (``branch``: the one the group commits the table to, whose history holds its state)."""
    state = latest_sink_summary(table, group, branch)
    for r in requirements:
        r.validate(table, state)
    return state


def validate_only(requirements: Sequence[TableRequirement], table: Table, group: str,
                  branch: str = MAIN_BRANCH) -> None:
    """:func:`validate`, for a hook that takes no result (pyiceberg's retry)."""
    validate(requirements, table, group, branch)


def applied_watermark(state: SinkState | None, log_id: str | None, adopted: bool) -> int:
    """The control watermark ``state`` holds for this log (-1: none; the state of an old log the
    operator adopted this one over counts as none)."""
    if state is None or (adopted and state.log_id != log_id):
        return -1
    return state.watermark


@dataclass(frozen=True)
class AssertEpoch:
    """No newer coordinator committed to the table: else this one is fenced."""

    table_name: str
    epoch: int

    def validate(self, table: Table, state: SinkState | None) -> None:
        if state is not None and state.epoch > self.epoch:
            raise FencedError(
                f"table {self.table_name}: expected coordinator epoch <= {self.epoch}, found {state.epoch} "
                "(a newer coordinator owns the group)"
            )


@dataclass(frozen=True)
class AssertControlLog:
    """The table's sink state names this control log (``log_id`` None: unknown, not checked;
    ``adopted``: the operator adopted this log, so the state of another counts as none)."""

    table_name: str
    log_id: str | None
    adopted: bool = False

    def validate(self, table: Table, state: SinkState | None) -> None:
        if state is None or (self.adopted and state.log_id != self.log_id):
            return
        if self.log_id is not None and state.log_id is not None and state.log_id != self.log_id:
            raise ControlLogError(
                f"table {self.table_name}: expected sink state of control log {self.log_id}, found state of log "
                f"{state.log_id} (watermark {state.watermark}); the control topic was deleted and created "
                "again, so its offsets do not compare with the table's. Nothing is committed. See docs/commits.md "
                "(\"The control log's identity\")"
            )


@dataclass(frozen=True)
class AssertWatermark:
    """The table's control watermark is still the one the commit was planned against: another
    icesink commit landed meanwhile otherwise (the plan is stale: re-planned)."""

    table_name: str
    applied: int
    log_id: str | None
    adopted: bool = False

    def validate(self, table: Table, state: SinkState | None) -> None:
        now = applied_watermark(state, self.log_id, self.adopted)
        if now != self.applied:
            raise CommitFailedException(
                f"table {self.table_name}: control watermark moved from {self.applied} to {now} during the commit "
                "(another icesink commit landed); re-planning"
            )


@dataclass(frozen=True)
class AssertNoOtherCommit:
    """Nothing landed since the commit's snapshot: a mirror table's position deletes were planned
    against it (checked on pyiceberg's retry, so it always fails there)."""

    table_name: str

    def validate(self, table: Table, state: SinkState | None) -> None:
        raise CommitFailedException(
            f"table {self.table_name}: another commit landed during a mirror commit; its position deletes are "
            "re-planned against the new snapshot")


@dataclass(frozen=True)
class AssertFilesConfined:
    """Every file lies under the table's location: the coordinator admits files of a table that
    does not exist when they are read (dropped; coordinator/service.py), so they are judged here.
    A table recreated elsewhere stays parked, its files kept, until it is back where they are."""

    table_name: str
    paths: tuple[str, ...]

    def validate(self, table: Table, state: SinkState | None) -> None:
        roots = data_roots(table)
        outside = [p for p in self.paths if not confined(p, roots)]
        if outside:
            raise TableChangedError(
                f"table {self.table_name}: expected its {len(self.paths)} accepted data files under its location "
                f"({' or '.join(roots)}), found {len(outside)} outside it (e.g. {outside[0]}): it was recreated "
                "elsewhere (or the files were named by someone outside the group). Nothing is committed or deleted; "
                "recreate the table at the location the files are in and the commit goes through")


@dataclass(frozen=True)
class AssertFieldIds:
    """Every file's field ids name the columns the table's schema gives them, checked when the
    table holds no state of the group: files accepted for a table that was dropped and created
    again (auto-created from other records, numbered anew) would have their columns read as
    other columns. Refused like a table recreated elsewhere: parked, nothing committed or deleted."""

    table_name: str
    paths: tuple[str, ...]

    def validate(self, table: Table, state: SinkState | None) -> None:
        found = field_id_mismatch(table, list(self.paths))
        if found is not None:
            raise TableChangedError(
                f"table {self.table_name}: expected its accepted data files written with its schema's field ids, "
                f"found {found}: it was dropped and created again with another schema. Nothing is committed or "
                "deleted; recreate it with the schema the files were written with (or restore it) and the commit "
                "goes through")


def sink_state_requirements(table_name: str, epoch: int, log_id: str | None = None,
                            adopted: bool = False) -> tuple[TableRequirement, ...]:
    """Fencing and the control log's identity, checked before a commit plans."""
    return (AssertEpoch(table_name, epoch), AssertControlLog(table_name, log_id, adopted))


def retry_requirements(table_name: str, epoch: int, applied: int, log_id: str | None = None,
                       adopted: bool = False, replan: bool = False) -> tuple[TableRequirement, ...]:
    """What pyiceberg's own retry of a conflicting commit re-checks on the refreshed table first:
    if another coordinator committed meanwhile (newer epoch: fenced; moved watermark: the plan is
    stale), stop, so the caller re-plans from the table. ``replan``: stop on any conflict (a
    mirror table's position deletes were planned against the snapshot the commit expected)."""
    if replan:
        return (AssertNoOtherCommit(table_name),)
    return (*sink_state_requirements(table_name, epoch, log_id, adopted),
            AssertWatermark(table_name, applied, log_id, adopted))
