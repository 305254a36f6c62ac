"""Writes that fail in a row, and when to stop trying (no I/O).

A worker's writes (a round's, an early one) that fail are retried: the data stays buffered.
:class:`WriteFailures` counts the failures since the last write that succeeded, holds the next
attempt back with a capped exponential backoff (:meth:`WriteFailures.wait_s`: an early write
waits, a round in the backoff is not answered, its data kept for the next), and says when the
count reaches ``write.failure-limit``: then the replica stops loudly (agents/rounds.py) instead of
retrying for ever. A failure a retry mends (the storage was away for a moment) resets the count
at the next success; a failure that returns every time (a directory Spark cannot make, a broken
staging path) stops the replica after ``limit`` attempts spread over at least
``backoff_s * (2 ** (limit - 1) - 1)`` seconds (75 s for the defaults), and in rounds at least
``limit`` rounds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from icesink.shared.retry import Backoff

BACKOFF_S = 5.0
BACKOFF_CAP_S = 300.0


class WriteFailures:
    def __init__(self, limit: int, *, backoff_s: float = BACKOFF_S, backoff_cap_s: float = BACKOFF_CAP_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.backoff_s = backoff_s
        self.backoff_cap_s = backoff_cap_s
        self.clock = clock
        self._backoff = Backoff(backoff_s, backoff_cap_s, clock=clock)  # counts the failures in a row
        self._first_at = 0.0
        self._last = ""
        self._checking = False  # the last failure was an existence check (see succeeded)

    @property
    def in_a_row(self) -> int:
        """Failed writes since the last that succeeded."""
        return self._backoff.attempts

    def wait_s(self) -> float:
        """Seconds until the next write may be attempted (0: now)."""
        return self._backoff.wait_s()

    def failed(self, exc: BaseException, *, check: bool = False) -> bool:
        """Record a failed write (``check``: a failed existence check of files written early);
        True when it is the ``limit``-th in a row: give up."""
        now = self.clock()
        self._checking = check
        if not self.in_a_row:
            self._first_at = now
        self._backoff.next()
        self._last = _without_frames(f"{type(exc).__name__}: {exc}")[:2000]
        return self.in_a_row >= self.limit

    def succeeded(self, *, check: bool = False) -> None:
        """A write (or, ``check``, an existence check) succeeded. A write does not clear a failing
        check: a storage that takes writes but refuses the check would otherwise be retried for
        ever, each round's write resetting the count."""
        if self._checking and not check:
            return
        self._backoff.reset()
        self._checking = False

    def status(self) -> dict[str, Any] | None:
        """For /status while writes fail (None when the last write succeeded)."""
        if not self.in_a_row:
            return None
        return {"in_a_row": self.in_a_row, "limit": self.limit, "next_attempt_in_s": round(self.wait_s(), 1),
                "last_error": self._last}

    def reason(self) -> str:
        return (f"writing files failed {self.in_a_row} times in a row over {self.clock() - self._first_at:.0f} s "
                f"(write.failure-limit={self.limit}), the last with {self._last}")


_FRAME = re.compile(r"^\s+(at |\.\.\. \d+ more)")


def _without_frames(text: str) -> str:
    """An error's text without the JVM's stack frames (a Spark failure holds dozens): what it
    says, and its causes."""
    return "\n".join(line for line in text.splitlines() if not _FRAME.match(line))
