"""One capped exponential backoff for every retry loop (a leaf module: no I/O).

A :class:`Backoff` counts the failures in a row and says how long to wait before the next
attempt: ``first_s`` after the first failure, times ``factor`` after each further one, never more
than ``cap_s``. ``reset()`` after a success. With ``deadline_s``, :meth:`Backoff.allows` says
whether a wait still ends before the deadline (counted from the backoff's creation), so a loop
that must give up at some point says so with the same value. The loop keeps its own metrics,
/status and logs; the backoff only counts and times::

    backoff = Backoff(first_s=1.0, cap_s=30.0)
    while True:
        try:
            return attempt()
        except TransientError:
            await asyncio.sleep(backoff.next())  # 1, 2, 4, ... 30, 30
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: Exponents above this add nothing (any cap is reached long before) and would overflow a float.
_MAX_EXPONENT = 60


@dataclass
class Backoff:
    first_s: float
    cap_s: float
    factor: float = 2.0
    deadline_s: float | None = None  # None: retried as long as the loop wants
    clock: Callable[[], float] = time.monotonic
    attempts: int = field(default=0, init=False)  # failures in a row
    retry_at: float = field(default=0.0, init=False)  # on ``clock``: when the next attempt may start
    _deadline: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.first_s <= self.cap_s or self.factor < 1:
            raise ValueError(f"backoff: expected 0 <= first_s <= cap_s and factor >= 1, found first_s={self.first_s}, "
                             f"cap_s={self.cap_s}, factor={self.factor}")
        if self.deadline_s is not None:
            self._deadline = self.clock() + self.deadline_s

    def delay(self, attempt: int) -> float:
        """The wait after the ``attempt``-th failure in a row (1: the first)."""
        return min(self.cap_s, self.first_s * self.factor ** min(max(attempt - 1, 0), _MAX_EXPONENT))

    def next(self, *, longest: bool = False) -> float:
        """Count a failure; the wait before the next attempt (``longest``: the cap at once, for an
        error no retry soon mends). Sets :attr:`retry_at`."""
        self.attempts += 1
        delay = self.cap_s if longest else self.delay(self.attempts)
        self.retry_at = self.clock() + delay
        return delay

    def wait_s(self) -> float:
        """Seconds until the next attempt may start (0: now, or no failure)."""
        return max(0.0, self.retry_at - self.clock()) if self.attempts else 0.0

    def allows(self, delay: float) -> bool:
        """Whether waiting ``delay`` from now still ends by the deadline (always, without one)."""
        return self._deadline is None or self.clock() + delay <= self._deadline

    def reset(self) -> None:
        """A success: the next failure waits ``first_s`` again."""
        self.attempts = 0
        self.retry_at = 0.0
