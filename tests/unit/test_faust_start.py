"""Faust's start holds nothing the replica does not use: its TableManager waits a second for
tables to be registered (faust/tables/manager.py ``on_start``), and icesink registers none (its
state is the Iceberg snapshot and the control topic), so the app's manager starts at once
(agents/kafka/tables.py). A second of every replica's start-up and every failover."""

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mode import Service
from prometheus_client import CollectorRegistry

from agents.buffer import Buffers
from agents.faust_app import FaustApp
from agents.parts import Replica
from icesink.shared.config import build
from icesink.shared.metrics import Metrics


class Hooks:
    async def on_fetch(self, fetched: Any) -> None: ...

    def fail(self, exc: Exception, exit_code: int = 2) -> None: ...

    def hold_paused_partitions(self) -> None: ...


def app(tmp_path: Path) -> Any:
    settings = build({"topics": "src", "iceberg.tables": "db.a", "state.dir": str(tmp_path), "group.id": "g"})
    return FaustApp(settings, "127.0.0.1:9", Replica("w1", {}), Buffers(1 << 20), Metrics(CollectorRegistry()),
                    hooks=Hooks()).app


def start(tables: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], list[str]]:
    """Run the manager's on_start with Faust's sleep, channel update and recovery recorded."""
    slept: list[float] = []
    steps: list[str] = []

    async def sleep(self: Any, n: float, *args: Any, **kwargs: Any) -> None:
        slept.append(n)

    async def update_channels() -> None:
        steps.append("channels")

    async def start_recovery() -> None:
        steps.append("recovery")

    monkeypatch.setattr(Service, "sleep", sleep)
    monkeypatch.setattr(tables, "_update_channels", update_channels)
    monkeypatch.setattr(type(tables), "recovery", property(lambda self: type("R", (), {"start": staticmethod(start_recovery)})()))
    asyncio.run(tables.on_start())
    return slept, steps


def test_the_table_manager_starts_without_waiting_for_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept, steps = start(app(tmp_path).tables, monkeypatch)
    assert slept == []
    assert steps == ["channels", "recovery"]  # what Faust's own on_start does after its wait


def test_a_registered_table_keeps_fausts_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Should the app ever register a Faust table, the wait is for it: Faust's own start.
    faust_app = app(tmp_path)
    faust_app.Table("counts", default=int)
    slept, steps = start(faust_app.tables, monkeypatch)
    assert slept == [1.0]
    assert steps == ["channels", "recovery"]
