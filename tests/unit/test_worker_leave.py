"""A stopping worker sends LeaveGroup, except as the group's leader on a broker that keeps a
departed leader (Tansu, recognised by its ApiVersions answer): agents/faust_app.py install_leave_group."""

import asyncio
import inspect
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.consumer.group_coordinator import GroupCoordinator

from agents.kafka import OFFSET_FOR_LEADER_EPOCH
from agents.faust_app import install_leave_group


def test_aiokafka_still_leaves_and_assigns_through_the_patched_methods() -> None:
    # The patch replaces _maybe_leave_group and _perform_assignment on the instance; it only
    # works while close() and the leader's join go through those attributes.
    assert "self._maybe_leave_group()" in inspect.getsource(GroupCoordinator.close)
    assert hasattr(GroupCoordinator, "_perform_assignment")


class Coordinator:
    generation = 7
    _group_subscription: Any = None

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def _maybe_leave_group(self) -> None:
        self.sent.append("LeaveGroup")
        self.reset_generation()

    async def _perform_assignment(self, response: Any) -> dict[str, bytes]:
        return {}

    def reset_generation(self) -> None:
        self.generation = -1


def _stop(apis: set[int], *, leader: bool, leader_at_install: bool = False) -> Coordinator:
    coordinator = Coordinator()
    if leader_at_install:
        coordinator._group_subscription = {"src"}
    conn = SimpleNamespace(_versions={api: (0, 4) for api in apis})
    consumer = SimpleNamespace(_coordinator=coordinator, _client=SimpleNamespace(_conns={("b", 1): conn}))
    install_leave_group(SimpleNamespace(consumer=SimpleNamespace(_thread=SimpleNamespace(_consumer=consumer))))  # type: ignore[arg-type]
    if leader:
        asyncio.run(coordinator._perform_assignment(SimpleNamespace(generation_id=7)))
    asyncio.run(coordinator._maybe_leave_group())
    assert coordinator.generation == -1
    return coordinator


KAFKA, TANSU = {0, 1, 3, 11, OFFSET_FOR_LEADER_EPOCH}, {0, 1, 3, 11}


@pytest.mark.parametrize("leader", [False, True])
def test_on_kafka_every_member_sends_leave_group(leader: bool) -> None:
    assert _stop(KAFKA, leader=leader).sent == ["LeaveGroup"]


def test_on_tansu_a_follower_sends_leave_group() -> None:
    assert _stop(TANSU, leader=False).sent == ["LeaveGroup"]


@pytest.mark.parametrize("at_install", [False, True])
def test_on_tansu_the_leader_stops_without_leave_group(at_install: bool) -> None:
    # Also when it was elected before the patch was installed (it then holds the group's subscription).
    assert _stop(TANSU, leader=not at_install, leader_at_install=at_install).sent == []
