"""What the real servers the tests start (tests/support/kafka_broker.py, schema_registry.py,
apicurio.py) share: one child process writing to one log file, its log read back for failure
messages, a start that tries another port when the one given was taken, and its end
(:class:`LoggedProcess`, :func:`terminate`, :class:`PortTaken`)."""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)


class PortTaken(Exception):
    """The child could not listen on the port it was given: start it again on another."""


def terminate(proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL after ``timeout_s``; returns once it has exited."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        logger.warning("%s pid %d ignored SIGTERM for %.0f s: SIGKILL", what, proc.pid, timeout_s)
        proc.kill()
        proc.wait(10)


class LoggedProcess:
    """A child process and its log file; subclasses start it and say where the log is."""

    _proc: subprocess.Popen[bytes] | None = None
    _log_handle: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        raise NotImplementedError

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _start_on_a_free_port(self, spawn: Callable[[], None], wait_ready: Callable[[int], None],
                              next_port: Callable[[], None], gave_up: Callable[[], Exception], attempts: int = 3) -> None:
        """``spawn`` the child and ``wait_ready(log offset)``; a child that could not listen
        (PortTaken) is killed and spawned again after ``next_port``, ``attempts`` times at most,
        then ``gave_up()`` is raised. Anything else kills the child and is raised."""
        for attempt in range(1, attempts + 1):
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            spawn()
            try:
                wait_ready(offset)
            except PortTaken:
                self._kill_now()
                if attempt == attempts:
                    raise gave_up() from None
                next_port()
                continue
            except BaseException:
                self._kill_now()
                raise
            return

    def _kill_now(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        self._reap()

    def _reap(self) -> None:
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        self._proc = None
