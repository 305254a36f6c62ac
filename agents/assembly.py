"""The parts of a replica that convert, route, write and answer rounds, built once its group
join is asked for.

Their modules import pyiceberg's catalogs and IO, pandas, ``pyarrow.compute``, the converters and
the registry clients: about a second and a half of a 2-core machine's start-up, which used to come
before the replica asked to join its group. :class:`agents.worker.Worker` now asks first and
imports this module in a thread while the broker answers the join (Tansu holds each JoinGroup for
half the session timeout; Kafka holds a new group's first join for
``group.initial.rebalance.delay.ms``), then calls :func:`build` on its event loop. Claims and the
coordinator wait for it (agents/ownership.py ``OwnershipHooks.started``), not the rebalance
signals themselves: aiokafka sends no heartbeat while its rebalance listener runs. See bench/README.md, "The
group join asked for before the heavy imports".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agents.control_loop import ControlLoop
from agents.deadletter import DeadLetters
from agents.debezium import DebeziumTransform
from agents.decode import BatchDecoder
from agents.evolution import Evolver
from agents.file_writer import FileWriter, FileWritingFactory, RewriteFiles
from agents.formats import RecordFormat
from agents.ingest import Ingest
from agents.registry_client import RegistryClient
from agents.registry_source import registry_keys, registry_values
from agents.rounds import Rounds
from agents.routing import Router
from agents.table_lookup import GroupHistory, TableLookup
from agents.tasks import TaskOwner
from agents.transforms.values import mongo_before_debezium
from icesink.shared.group_secret import SecretLoader

if TYPE_CHECKING:
    from agents.worker import Worker


@dataclass(frozen=True)
class Parts:
    """What :func:`build` makes; the worker keeps each as an attribute of the same name."""

    deadletters: DeadLetters
    spark: FileWriter  # the writer the app chose (icesink/app/files.py)
    rewrite_files: RewriteFiles
    registry_clients: list[RegistryClient]
    secret: SecretLoader  # the group's key (icesink/shared/group_secret.py)
    history: GroupHistory
    tables: TableLookup
    rounds: Rounds
    control: ControlLoop
    ingest: Ingest


def build(w: Worker, files: FileWritingFactory, tasks: TaskOwner) -> Parts:
    """The parts, wired to the worker's light ones (its buffers, tables written to, ownership,
    Faust app) and to the worker itself for what they ask of the rest (its hooks)."""
    settings, metrics, status = w.settings, w.metrics, w.status
    deadletters = DeadLetters(settings, metrics, w.worker_id)
    evolver = Evolver(  # (case folding alone is the record format's and the transform's)
        w.worker_id, evolve=True, case_insensitive=settings.schema_case_insensitive,
    ) if settings.evolve_schema else None
    writing = files(settings, w.worker_id)
    registry = registry_values(settings, metrics, status)  # registry converters: schemas by id
    keys = registry_keys(settings, metrics, status)  # registry key converter with a key column
    clients = [r[1] for r in (registry, keys) if r is not None]
    record_format = RecordFormat(settings, registry=None if registry is None else registry[0],
                                 keys=None if keys is None else keys[0])
    pattern = settings.debezium_target_pattern
    debezium = None if pattern is None else DebeziumTransform(  # registry values: Debezium's Avro events
        pattern, settings.value_converter_schemas_enable, settings.schema_case_insensitive, record_format.registry,
        mongo=mongo_before_debezium(settings.transform_chain))
    history = GroupHistory(settings, w.bootstrap, w.keyring, w.missing, w.targets, w.offload)
    tables = TableLookup(settings, metrics, w.targets, w.missing, history, w.offload, record_format, debezium,
                         evolver, w.send, w.fail)
    router = Router(settings, debezium, record_format.registry)  # registry values: routed on their rows
    decoder = BatchDecoder(settings, record_format, router, debezium, evolver, w.targets, tables.propose)
    rounds = Rounds(settings, metrics, w.replica, w.buffers, w.targets, evolver, writing.writer, w.offload,
                    deadletters, w.app, w, tasks, w.ownership, hooks=w)
    control = ControlLoop(metrics, w.replica, w.buffers, w.app, w.missing, tasks, w.ownership, rounds)
    ingest = Ingest(settings, metrics, w.replica, w.buffers, w.missing, decoder, deadletters, tables, w.app,
                    w.ownership, tasks, w.send, rounds.maybe_write_early)
    secret = SecretLoader(settings, w.bootstrap, w.keyring, metrics, status)
    return Parts(deadletters, writing.writer, writing.rewrite, clients, secret, history, tables, rounds, control, ingest)
