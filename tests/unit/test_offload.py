"""icesink.shared.offload: the executor for blocking work, and its detached calls."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest

from icesink.shared.offload import Offload


def test_a_detached_call_returns_its_result_and_raises_its_error_in_a_daemon_thread():
    seen: list[threading.Thread] = []

    def answer() -> int:
        seen.append(threading.current_thread())
        return 42

    def broken() -> None:
        raise ValueError("the session did not start")

    async def main() -> None:
        offload = Offload()
        assert await offload.run_detached(answer) == 42
        with pytest.raises(ValueError, match="did not start"):
            await offload.run_detached(broken)
        offload.close()

    asyncio.run(main())
    assert seen[0].daemon and seen[0] is not threading.main_thread()


def test_a_detached_call_still_running_holds_neither_its_cancelled_waiter_nor_the_process_exit():
    """What a stop during a slow Spark start relies on: the process exits at once (a pool's
    thread would hold the exit until the call returned)."""
    script = """
import asyncio, time
from icesink.shared.offload import Offload

async def main():
    offload = Offload()
    waiter = asyncio.ensure_future(offload.run_detached(lambda: time.sleep(60)))
    await asyncio.sleep(0.1)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    offload.close()
    print("stopped")

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr


def test_a_detached_call_cancelled_before_its_thread_runs_is_skipped_without_an_error(monkeypatch):
    started: list[threading.Thread] = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self))  # the thread lags behind
    errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    ran: list[bool] = []

    async def main() -> None:
        offload = Offload()
        task = asyncio.ensure_future(offload.run_detached(lambda: ran.append(True)))
        await asyncio.sleep(0)  # the task now awaits the call
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        offload.close()

    asyncio.run(main())
    assert len(started) == 1
    monkeypatch.setattr(threading.Thread, "start", real_start)
    started[0].start()
    started[0].join(5)
    assert ran == [] and errors == []
