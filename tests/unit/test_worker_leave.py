"""Workers stop without LeaveGroup (Worker._install_no_leave_group)."""

import asyncio
import inspect
from types import SimpleNamespace

from aiokafka.consumer.group_coordinator import GroupCoordinator

from agents.worker import Worker


def test_aiokafka_still_leaves_through_the_patched_method():
    # The patch replaces GroupCoordinator._maybe_leave_group on the instance; it only works
    # while close() (and the poll-timeout path) go through that method.
    assert "self._maybe_leave_group()" in inspect.getsource(GroupCoordinator.close)


def test_stopping_sends_no_leave_group_and_resets_the_generation():
    sent = []

    class Coordinator:
        generation = 7

        async def _maybe_leave_group(self):
            sent.append("LeaveGroup")

        def reset_generation(self):
            self.generation = -1

    coordinator = Coordinator()
    worker = Worker.__new__(Worker)
    worker.app = SimpleNamespace(consumer=SimpleNamespace(
        _thread=SimpleNamespace(_consumer=SimpleNamespace(_coordinator=coordinator))))
    worker._install_no_leave_group()
    asyncio.run(coordinator._maybe_leave_group())
    assert sent == [] and coordinator.generation == -1
