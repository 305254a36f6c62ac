"""Where a recovering coordinator starts, from its checkpoint or from the tables' sink state.
Pure: no I/O (the service reads the checkpoint, the log bounds and the tables).

Rules (docs/commits.md, "Recovery"):
- The control log's identity: a table whose state names another log (a different topic id), or
  whose watermark is at or past the log's end (the log is shorter than the state it produced:
  deleted and created again, or emptied), stops the coordinator (:class:`ControlLogError`).
- The checkpoint (the CommitComplete the coordinator group's offset points to) is the base when
  it can be read and the log still holds every event from its ``replay_from`` on.
- Otherwise the tables are the truth: a table's state is a checkpoint too (through, positions,
  owners, replay_from). The base is the newest state of a completed round: the newest state,
  unless its round is in doubt (a table of that round lacks it: the coordinator died between
  two table commits), then the oldest state of a table that lacks it, so replay re-accepts the
  round's responses and rolls that table forward. If the log no longer holds the events from the
  base on: a round in doubt cannot be rolled forward (refused); without one, the lost events
  only name data that is in no table, which the workers read again from the positions.
- No table state and no checkpoint: a first start; replay the whole log.
"""

from __future__ import annotations

from dataclasses import dataclass

from icesink.shared.errors import ControlLogError
from icesink.shared.protocol import CommitComplete, Owner, Position, TopicPartition
from icesink.shared.protocol import SinkState


def check_log_identity(
    states: dict[str, SinkState], log_id: str | None, log_end: int, topic: str, adopt: str | None = None
) -> bool:
    """Refuse a control log the tables' state did not come from, unless it is the one the
    operator adopted (``iceberg.control.adopt-log-id``): then True (see :func:`adopt_log`)."""
    adopting = False
    for table, st in sorted(states.items()):
        if st.log_id == log_id and log_id is not None:
            continue
        foreign = log_id is not None and st.log_id is not None and st.log_id != log_id
        if (foreign or st.watermark >= log_end) and adopt is not None and adopt == log_id:
            adopting = True
            continue
        if foreign:
            raise ControlLogError(
                f"control topic {topic!r}: expected the log the sink state of table {table} came from "
                f"(topic id {st.log_id}, watermark {st.watermark}), found topic id {log_id}: the topic was "
                "deleted and created again. Its offsets do not compare with the tables' watermarks, so "
                "nothing is committed. What to do: " + _REMEDY
            )
        if st.watermark >= log_end:
            raise ControlLogError(
                f"control topic {topic!r}: expected a log reaching past offset {st.watermark} (the watermark "
                f"of table {table}), found its end at offset {log_end}: the topic was deleted and created "
                "again or emptied. Nothing is committed. What to do: " + _REMEDY
            )
    return adopting


_REMEDY = (
    "restore the original control topic; if it is lost for good, set iceberg.control.adopt-log-id to the "
    "topic id of the new one (shown in /status as control_log_id) and restart: the group starts over on it "
    "from the positions in the tables (docs/commits.md, \"The control log's identity\")."
)


@dataclass(frozen=True)
class Base:
    """Where replay starts: a checkpoint to seed the state with (None: empty state, first start),
    the offset to read from, and what is told in the log."""

    checkpoint: CommitComplete | None
    start: int
    reason: str


def doubt(states: dict[str, SinkState]) -> tuple[str, SinkState, dict[str, SinkState], list[str]]:
    """The newest state, the tables of its round that lack it (with a state), and those that
    have no state of the group at all."""
    newest_table, newest = max(states.items(), key=lambda kv: (_through(kv[1]), kv[1].watermark))
    doubtful = {
        t: states[t] for t, needed in newest.round_tables.items()
        if t in states and states[t].watermark < needed
    }
    missing = sorted(t for t in newest.round_tables if t not in states)
    return newest_table, newest, doubtful, missing


def from_tables(states: dict[str, SinkState], log_start: int, topic: str) -> Base:
    """The base when the checkpoint cannot be used (see the module docstring)."""
    if not states:
        return Base(None, log_start, "no checkpoint and no table state: first start, replaying the whole log")
    newest_table, newest, doubtful, missing = doubt(states)
    if missing:
        # A table of the round in doubt has no state of this group at all (the round was its
        # first): only the whole log can roll it forward.
        if log_start > 0:
            raise ControlLogError(
                f"control topic {topic!r}: table(s) {', '.join(missing)} lack round {newest.commit_id} that "
                f"table {newest_table} holds and have no sink state; rolling them forward needs the whole log, "
                f"but it starts at {log_start} (deleted by retention or truncated). Nothing is committed. "
                "What to do: restore the control log, or repair the tables by hand; keep retention.ms=-1 "
                "on the control topic."
            )
        return Base(None, 0, f"round {newest.commit_id} in doubt for {', '.join(missing)}: replaying the whole log")
    base_table, base = (min(doubtful.items(), key=lambda kv: _through(kv[1])) if doubtful
                        else (newest_table, newest))
    replay_from = base.replay_from if base.replay_from is not None else base.watermark + 1
    if log_start > replay_from:
        if doubtful:
            raise ControlLogError(
                f"control topic {topic!r}: table(s) {', '.join(sorted(doubtful))} lack round {newest.commit_id} "
                f"that table {newest_table} holds, and rolling them forward needs the log from offset "
                f"{replay_from}, but it starts at {log_start} (deleted by retention or truncated). Nothing is "
                "committed. What to do: restore the control log, or repair the tables by hand; keep "
                "retention.ms=-1 on the control topic."
            )
        reason = (f"control log starts at {log_start}, past offset {replay_from} of the state of {base_table}; "
                  "the events lost name no data of any table (their records are read again)")
    else:
        reason = f"state of table {base_table}" + (f" (round {newest.commit_id} in doubt)" if doubtful else "")
    return Base(as_checkpoint(base), max(log_start, replay_from), reason)


def adopt_states(states: dict[str, SinkState], log_id: str, log_start: int) -> dict[str, SinkState]:
    """Start the group over on a new control log the operator adopted: a table state of another
    log becomes a state of this one as of its start, with each partition at its position in
    the tables (the truth) and nothing applied from this log yet (accepted but uncommitted
    responses of the old log are read again from the source). States of this log (written since
    the adoption) stay as they are. Refused while a round of the old log is in doubt: a table
    that lacks it could only be rolled forward from the old log."""
    old = {t: st for t, st in states.items() if st.log_id != log_id}
    if not old:
        return states
    newest_table, newest, doubtful, missing = doubt(old)
    if doubtful or missing:
        raise ControlLogError(
            f"cannot adopt control log {log_id}: table(s) {', '.join(sorted([*doubtful, *missing]))} lack round "
            f"{newest.commit_id} that table {newest_table} holds, and only the old log names its files. "
            "Restore the old control topic, or repair the tables by hand."
        )
    positions = table_positions(old)
    adopted = {
        t: SinkState(None, f"adopt-{log_id}", -1, positions, st.epoch, st.valid_through_ms, log_id=log_id,
                     through=log_start - 1, replay_from=log_start, source=st.source)
        for t, st in old.items()
    }
    return {**states, **adopted}


def _through(st: SinkState) -> int:
    return st.through if st.through is not None else st.watermark


def as_checkpoint(st: SinkState) -> CommitComplete:
    """A table's sink state as the CommitComplete of its round."""
    return CommitComplete(
        epoch=st.epoch,
        commit_id=st.commit_id,
        through=_through(st),
        positions=tuple(Position(tp, off) for tp, off in sorted(st.positions.items())),
        owners=tuple(Owner(tp, w, g) for tp, (w, g) in sorted(st.owners.items())),
        valid_through_ms=st.valid_through_ms,
        replay_from=st.replay_from if st.replay_from is not None else st.watermark + 1,
    )


def table_positions(states: dict[str, SinkState]) -> dict[TopicPartition, int]:
    """Every partition's position in the tables: the newest state (by watermark) wins."""
    out: dict[TopicPartition, int] = {}
    for st in sorted(states.values(), key=lambda s: s.watermark):
        out.update(st.positions)
    return out
