"""What the real servers the tests start (tests/support/kafka_broker.py, schema_registry.py) share:
one child process writing to one log file, its log read back for failure messages, and its
end (:class:`LoggedProcess`, :func:`terminate`, :class:`PortTaken`)."""

from __future__ import annotations

import logging
import signal
import subprocess
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
