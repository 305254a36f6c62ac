"""The state a worker replica's mixins share (agents/worker.py), declared for the type checker.

:class:`agents.worker.Worker` sets every attribute (in ``__init__``, ``run`` and
``_make_app``); its mixins (agents/faust_app.py, agents/ownership.py, agents/ingest.py,
agents/rounds.py) read them and call each other's methods. This base only says so: it has no
state or behaviour of its own at run time (annotations, and method signatures under
``TYPE_CHECKING``), and it comes last in the worker's method resolution order.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

if TYPE_CHECKING:
    import faust
    from pyiceberg.catalog import Catalog

    from agents.buffer import Buffers, Chunk, PartitionState
    from agents.deadletter import DeadLetters
    from agents.decode import BatchDecoder
    from agents.debezium import DebeziumTransform
    from agents.evolution import Evolver
    from agents.file_writer import FileWriter
    from agents.formats import RecordFormat
    from agents.ingest import StallProbe
    from agents.missing import MissingTables
    from agents.ownership import Ownership
    from agents.parts import Replica
    from agents.rounds import Rounds
    from agents.routing import Router
    from agents.kafka import Fetched
    from agents.tables import Target
    from agents.tasks import TaskOwner
    from icesink.shared.config import Settings
    from icesink.shared.control import ControlProducer, ControlReader
    from icesink.shared.group_secret import SecretLoader
    from icesink.shared.protocol import TopicPartition
    from icesink.shared.metrics import Metrics
    from icesink.shared.offload import Offload


class WorkerState:
    """Mixed into :class:`agents.worker.Worker` through its mixins, last: declarations only."""

    settings: Settings
    bootstrap: str
    metrics: Metrics
    worker_id: str
    offload: Offload
    buffers: Buffers
    targets: dict[str, Target]
    _missing: MissingTables  # tables waited for (agents/missing.py)
    format: RecordFormat
    deadletters: DeadLetters
    debezium: DebeziumTransform | None
    router: Router
    evolver: Evolver | None
    spark: FileWriter  # Spark's (icesink/app/files.py)
    status: dict[str, Any]
    replica: Replica  # generation, backpressure, ... (agents/parts.py)
    ownership: Ownership
    rounds: Rounds
    app: faust.App
    producer: ControlProducer
    reader: ControlReader
    secret: SecretLoader  # the group's key (icesink/shared/group_secret.py)
    catalog: Catalog
    _stop: asyncio.Event
    _owner: TaskOwner
    _faust_worker: faust.Worker | None
    _progress: dict[TopicPartition, StallProbe]  # stall probes (ingest)
    decoder: BatchDecoder  # agents/decode.py
    _last_request: float

    if TYPE_CHECKING:
        # agents/worker.py
        def fail(self, exc: Exception, exit_code: int = 2) -> None: ...
        def update_gauges(self) -> None: ...
        def update_paused(self) -> None: ...

        # agents/ingest.py
        async def on_fetch(self, fetched: Fetched) -> None: ...
        def _check_stalls(self, now: float) -> None: ...
        async def _evolution_ready(self) -> Callable[[Chunk], bool] | None: ...
        async def _release_backpressure(self) -> None: ...
        async def _check_backpressure(self) -> None: ...
        async def _reseek_and_resume(self, st: PartitionState) -> None: ...
        def _wait_for(self, name: str) -> None: ...
        async def _group_has_run(self) -> bool: ...
        async def _committed_tables(self) -> set[str] | None: ...
        async def _look_for_missing(self) -> None: ...
