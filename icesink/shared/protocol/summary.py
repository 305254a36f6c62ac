"""What icesink writes into Iceberg next to the data: the snapshot-summary keys of every
commit, the table property holding a sink group's state, and that state (:class:`SinkState`).

Leaf module of the protocol package: plain values and JSON, no table access
(:func:`icesink.shared.iceberg.latest_sink_summary` reads the state back from a table).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from icesink.shared.errors import ProtocolError
from icesink.shared.protocol.events import TopicPartition

COMMIT_ID = "icesink.commit-id"
WATERMARK = "icesink.control-watermark"
POSITIONS = "icesink.positions"
EPOCH = "icesink.epoch"
VALID_THROUGH = "icesink.valid-through-ms"
GROUP = "icesink.group"

# Sink state: snapshot summaries and a table property ------------------------------------------

LOG_ID = "icesink.control-log-id"
STATE_VERSION = 1


def state_property(group: str) -> str:
    """The table property holding ``group``'s sink state (one key per sink group)."""
    return f"icesink.{group}.state"


def rewind_pending_property(group: str) -> str:
    """The table property ``icesink rewind`` sets in its table commit (the ``--to`` asked) and
    removes once the group's new positions are on the control log: while it is there, the log
    still says to read on from the old positions, and the group must not start (docs/rewind.md)."""
    return f"icesink.{group}.rewind-pending"


@dataclass(frozen=True)
class SinkState:
    """icesink's exactly-once state for one sink group in one table (design "Durable state").

    Written atomically with the data files twice: in the snapshot summary (readable per
    snapshot) and in the table property :func:`state_property` (which snapshot expiry by
    another tool cannot remove). Fields after ``valid_through_ms`` are None/empty in state
    written by versions before the property existed."""

    snapshot_id: int | None  # the snapshot whose summary it was read from (None: the property)
    commit_id: str
    watermark: int
    positions: dict[TopicPartition, int]
    epoch: int
    valid_through_ms: int | None
    log_id: str | None = None  # identity of the control log the offsets belong to
    through: int | None = None  # the checkpoint this commit establishes (CommitComplete.through)
    replay_from: int | None = None
    owners: dict[TopicPartition, tuple[str, int]] = field(default_factory=dict)
    # The round's tables: each with the highest control offset of a response naming it. A table
    # of the round whose watermark is below its entry lacks the round (a round in doubt).
    round_tables: dict[str, int] = field(default_factory=dict)
    source: str = "summary"

    def properties(self, group: str) -> dict[str, str]:
        return summary_properties(
            group, self.commit_id, self.watermark, self.positions, self.epoch, self.valid_through_ms,
            log_id=self.log_id,
        )

    def to_json(self) -> str:
        body: dict[str, Any] = {
            "v": STATE_VERSION,
            "commit-id": self.commit_id,
            "watermark": self.watermark,
            "epoch": self.epoch,
            "positions": _nested(self.positions),
            "valid-through-ms": self.valid_through_ms,
            "log-id": self.log_id,
            "through": self.through,
            "replay-from": self.replay_from,
            "owners": _nested({tp: [w, g] for tp, (w, g) in self.owners.items()}),
            "round-tables": dict(sorted(self.round_tables.items())),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, where: str) -> SinkState:
        try:
            parsed = _parse_state(text)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ProtocolError(
                f"{where}: expected icesink sink state JSON (version {STATE_VERSION}), found {text[:200]!r} ({exc}). "
                "Was the property edited by hand? Remove it to fall back to the snapshot summaries."
            ) from None
        # The parsed state is shared by every caller of the same text: each gets its own dicts.
        return replace(parsed, positions=dict(parsed.positions), owners=dict(parsed.owners),
                       round_tables=dict(parsed.round_tables))


@functools.lru_cache(maxsize=32)
def _parse_state(text: str) -> SinkState:
    """:meth:`SinkState.from_json` without the error's context, kept for texts seen lately: the
    tables of a round hold the same state, and each of the round's table commits reads its
    table's state again (at 200 tables, 200 parses of one text a round)."""
    body = json.loads(text)
    if not isinstance(body, dict) or body.get("v") != STATE_VERSION:
        raise ValueError(f"expected a JSON object with v={STATE_VERSION}")
    owners = {tp: (str(v[0]), int(v[1])) for tp, v in flat_positions(body.get("owners") or {}).items()}
    return SinkState(
        snapshot_id=None,
        commit_id=str(body["commit-id"]),
        watermark=int(body["watermark"]),
        positions={tp: int(v) for tp, v in flat_positions(body["positions"]).items()},
        epoch=int(body["epoch"]),
        valid_through_ms=_opt_int(body.get("valid-through-ms")),
        log_id=body.get("log-id"),
        through=_opt_int(body.get("through")),
        replay_from=_opt_int(body.get("replay-from")),
        owners=owners,
        round_tables={str(k): int(v) for k, v in (body.get("round-tables") or {}).items()},
        source="property",
    )


def _nested(values: Mapping[TopicPartition, Any]) -> dict[str, dict[str, Any]]:
    nested: dict[str, dict[str, Any]] = {}
    for tp, v in sorted(values.items()):
        nested.setdefault(tp.topic, {})[str(tp.partition)] = v
    return nested


def flat_positions(nested: Mapping[str, Mapping[str, Any]]) -> dict[TopicPartition, Any]:
    """``{topic: {partition: value}}`` (as the summaries hold positions) by TopicPartition."""
    return {TopicPartition(topic, int(p)): v for topic, parts in nested.items() for p, v in parts.items()}


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def summary_properties(
    group: str,
    commit_id: str,
    watermark: int,
    positions: dict[TopicPartition, int],
    epoch: int,
    valid_through_ms: int | None,
    *,
    log_id: str | None = None,
) -> dict[str, str]:
    props = {
        GROUP: group,
        COMMIT_ID: commit_id,
        WATERMARK: str(watermark),
        POSITIONS: json.dumps(_nested(positions), sort_keys=True, separators=(",", ":")),
        EPOCH: str(epoch),
    }
    if valid_through_ms is not None:
        props[VALID_THROUGH] = str(valid_through_ms)
    if log_id is not None:
        props[LOG_ID] = log_id
    return props


__all__ = [
    "COMMIT_ID", "WATERMARK", "POSITIONS", "EPOCH", "VALID_THROUGH", "GROUP", "LOG_ID", "STATE_VERSION",
    "state_property", "rewind_pending_property", "SinkState", "summary_properties", "flat_positions",
]
