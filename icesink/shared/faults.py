"""Fault injection for the fault tests: ``fault.crash-at=<point>[,<point>...]`` makes a replica kill itself
with SIGKILL (as ``kill -9`` would) at an instant that random kills rarely hit, such as between
two table commits of one round.

``fault.hold-at=<point>`` makes the replica that reaches the point first create
``hold-<point>.reached`` in ``state.dir`` and wait (without blocking its event loop) until the test
creates ``hold-<point>.release``: the test can then break the broker at exactly that instant.

Each point fires once per ``state.dir``: the first replica to reach it creates a marker file
``fault-<point>.fired`` there and dies; replicas restarted with the same setting carry on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path

from icesink.shared.config import Settings

log = logging.getLogger(__name__)


def should_crash(settings: Settings, point: str) -> bool:
    """True once per state dir for the configured point (and claims it)."""
    if point not in settings.fault_crash_at:
        return False
    marker = settings.state_dir / f"fault-{point}.fired"
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def die(point: str) -> None:
    log.error("fault injection: SIGKILL at %s", point)
    for h in logging.getLogger().handlers:
        h.flush()
    if os.getpgid(0) == os.getpid():  # a session leader (as replicas are): take Spark's JVM too
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def crash_point(settings: Settings, point: str) -> None:
    if should_crash(settings, point):
        die(point)


def _claim_hold(settings: Settings, point: str) -> Path | None:
    """The release file to wait for, if this replica is the first to reach ``point``."""
    if point not in settings.fault_hold_at:
        return None
    reached = settings.state_dir / f"hold-{point}.reached"
    reached.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(reached, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return None
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    release = reached.with_suffix(".release")
    log.warning("fault injection: holding at %s until %s exists", point, release.name)
    return release


async def hold_point(settings: Settings, point: str) -> None:
    release = _claim_hold(settings, point)
    while release is not None and not release.exists():
        await asyncio.sleep(0.2)


def hold_point_blocking(settings: Settings, point: str) -> None:
    """:func:`hold_point` for a thread of blocking work (never the event loop): it stands for
    a blocking call that takes long, such as a Spark session starting on a loaded host."""
    release = _claim_hold(settings, point)
    while release is not None and not release.exists():
        time.sleep(0.2)
