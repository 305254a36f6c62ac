"""What the parts of a worker replica share (agents/worker.py builds and wires them).

The replica's parts are objects, each built with the few collaborators it uses:
:class:`agents.ownership.Ownership` (rebalances, claims, Resume, Rewind) and the worker's
other parts. State several of them read lives in one :class:`Replica`, handed to those that
need it; what one part needs of another is a small Protocol in the module that uses it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import socket
import uuid
from typing import Any


def default_worker_id() -> str:
    """A replica's id when ``worker.id`` is not set: host, process and a random part, as a plain
    name (icesink.shared.config.WORKER_ID): it names the replica's directories and files."""
    default = re.sub(r"[^A-Za-z0-9._-]", "_", f"{socket.gethostname()[:100]}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    return default if default[0].isalnum() else f"w{default}"


@dataclasses.dataclass(eq=False)
class Replica:
    """Who this replica is and where it stands in the group: its id, the generation it holds
    partitions in (and its member id there), whether that assignment is settled (between a
    rebalance's assignment and its completion it is not), whether its buffers are full
    (backpressure: every partition paused), the stop requested, and its /status."""

    worker_id: str
    status: dict[str, Any]
    generation: int = -1
    member_id: str | None = None
    backpressure: bool = False
    # The last CommitComplete moved no position (the group is idle, agents/control_loop.py): the
    # first row buffered asks for a round (iceberg.control.commit.idle-interval-ms, agents/ingest.py).
    idle: bool = False
    # Its last response left a backlog unread (agents/rounds.py): read to the ends, it asks for a
    # round rather than wait an interval (iceberg.control.commit.catch-up, agents/ingest.py).
    behind: bool = False
    rebalanced: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    stop: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
