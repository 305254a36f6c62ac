"""How far the coordinator may truncate its control log (docs/maintenance.md, "Control log").

The truncator (icesink/shared/control.py) never deletes past the replay start of the group's
checkpoint. But the checkpoint can become unusable (expired group offsets, its record lost), and
a recovery then starts from the tables' sink state (coordinator/recovery.py): a table that lacks
a round (a parked table, or a round in doubt) needs the log from its own, older replay start, or
recovery is refused for good. So the coordinator's truncation also stops at the earliest replay
start of every such table (:func:`replay_floor`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from coordinator.recovery import doubt
from icesink.shared.control import ControlLogTruncator
from icesink.shared.offload import Offload
from icesink.shared.protocol import SinkState


def replay_floor(states: dict[str, SinkState], parked: Iterable[str]) -> tuple[int, str] | None:
    """The lowest control offset a recovery from ``states`` (each table's sink state of the group)
    may need, with the table that needs it; None if none limits the truncation. A parked table,
    and a table lacking the newest round, needs the log from its state's replay start; one with
    no state at all (its first round, or dropped), the whole log."""
    need = [(_start(states[t]), t) if t in states else (0, t) for t in sorted(parked)]
    if states:
        _table, _newest, doubtful, missing = doubt(states)
        need += [(0, t) for t in missing] + [(_start(st), t) for t, st in doubtful.items()]
    return min(need) if need else None


def _start(st: SinkState) -> int:
    return st.replay_from if st.replay_from is not None else st.watermark + 1


class GuardedTruncation:
    """The coordinator's control-log truncation (the maintainer calls it), held at
    :func:`replay_floor` of the tables' states (read on ``offload``: the catalog blocks)."""

    def __init__(self, truncator: ControlLogTruncator, offload: Offload,
                 states: Callable[[Iterable[str]], dict[str, SinkState]], parked: Callable[[], set[str]]) -> None:
        self.truncator, self._offload, self._states, self._parked = truncator, offload, states, parked

    async def __call__(self) -> dict[str, Any]:
        parked = self._parked()
        floor = replay_floor(await self._offload.run(self._states, parked), parked)
        return await self.truncator.truncate(floor)
