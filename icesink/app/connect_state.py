"""What an ``icesink connect`` cluster knows, as read from its config topic (pure, no I/O).

Every process of a cluster reads the whole config topic (one partition, compacted) into a
:class:`ClusterState` and acts on it; nothing else is shared. Records (key -> JSON value):

- ``connector/<name>``: ``{"config": {...}, "target": "RUNNING"|"PAUSED"|"STOPPED", "generation": n,
  "restarts": {"<task>": n}, "partitions": n}``; a tombstone (no value) deletes the connector.
  ``generation`` grows on every config change: the tasks of an older generation are stopped and
  started again; a task's ``restarts`` count grows when that task alone is restarted (POST
  .../restart?includeTasks=true, .../tasks/<id>/restart). A STOPPED connector keeps its config
  and runs no task. ``partitions``: the partitions of its topics when its config was written,
  if fewer than ``tasks.max`` (then only that many tasks run, and the status says so).
- ``worker/<id>``: heartbeats of older icesink versions, ignored (membership is now Kafka's
  group protocol, below).
- ``status/<name>/<task>``: ``{"state", "worker_id", "generation", "restart", "trace"}``, written by the
  process running the task whenever the task's state changes (RESTARTING: its start-up failed
  and it is started again after a backoff; the trace says why).

Membership is Kafka's group protocol (:mod:`icesink.app.connect_group`): the processes form
the consumer group ``group.id``; each member's metadata carries its id and REST URL; the group's
leader computes the :class:`Placement` from the members and the connectors it has read, and
every member receives the whole placement in its assignment's user data. Task ``i`` of connector
``C`` runs on ``members[(crc32(C) + i) % len(members)]`` of the sorted member ids, so a
connector's tasks spread over the processes. A process killed -9 leaves the group when its
session (``session.timeout-ms``) expires; one stopped with SIGTERM sends LeaveGroup and its
tasks move at once. A config change that changes which tasks exist makes the leader rejoin,
so the group places them; until then every member places them by the same rule over the
placement's members (:meth:`Placement.owners`).
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from icesink.shared.errors import ConfigError

log = logging.getLogger(__name__)

RUNNING, PAUSED, FAILED, UNASSIGNED = "RUNNING", "PAUSED", "FAILED", "UNASSIGNED"
STOPPED = "STOPPED"
RESTARTING = "RESTARTING"  # a task whose start-up failed, started again after a backoff
TARGETS = (RUNNING, PAUSED, STOPPED)
#: The version a status shows for the connector and its tasks (Kafka Connect 4 shows the plugin's).
PLUGIN_VERSION = "0.1.0"


@dataclass(frozen=True)
class Connector:
    name: str
    config: dict[str, str]
    target: str = RUNNING
    generation: int = 0
    restarts: dict[int, int] = field(default_factory=dict)
    partitions: int | None = None

    @property
    def max_tasks(self) -> int:
        return tasks_max(self.config)

    @property
    def tasks(self) -> int:
        """The tasks that run: none while STOPPED, at most one per partition of its topics."""
        if self.target == STOPPED:
            return 0
        return min(self.max_tasks, self.partitions) if self.partitions else self.max_tasks

    def restart_of(self, task: int) -> int:
        return self.restarts.get(task, 0)


def tasks_max(config: dict[str, str]) -> int:
    raw = config.get("tasks.max", "1")
    try:
        n = int(raw)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise ConfigError("tasks.max", raw, "a whole number of at least 1 (the replicas of the connector)")
    return n


def connector_key(name: str) -> bytes:
    return f"connector/{name}".encode()


def status_key(name: str, task: int) -> bytes:
    return f"status/{name}/{task}".encode()


@dataclass
class ClusterState:
    """The cluster as the config topic describes it up to ``position``."""

    connectors: dict[str, Connector] = field(default_factory=dict)
    statuses: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    position: int = 0
    skipped: int = 0

    def apply(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        """Apply one record. A record that cannot be read is skipped and logged with its
        offset, never fatal: the topic is input."""
        self.position = offset + 1
        try:
            self._apply(key, value)
        except (ValueError, KeyError, TypeError, AttributeError, ConfigError) as exc:
            self.skipped += 1
            log.warning("config topic offset %d: skipped an unreadable record (key %r): %s", offset, key, exc)

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            raise ValueError("a record without a key")
        kind, _, rest = key.decode().partition("/")
        data = None if value is None else json.loads(value)
        if data is not None and not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        if kind == "connector":
            if data is None:
                self.connectors.pop(rest, None)
                self.statuses = {k: v for k, v in self.statuses.items() if k[0] != rest}
                return
            config, target, generation = data["config"], data.get("target", RUNNING), data.get("generation", 0)
            if not isinstance(config, dict) or not all(isinstance(v, str) for v in config.values()):
                raise ValueError("field config: expected an object of strings")
            if target not in TARGETS or not isinstance(generation, int):
                raise ValueError(f"field target {target!r} or generation {generation!r} is not valid")
            tasks_max(config)
            restarts = {int(k): int(v) for k, v in dict(data.get("restarts") or {}).items()}
            partitions = data.get("partitions")
            if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
                raise ValueError(f"field partitions {partitions!r} is not a positive whole number")
            self.connectors[rest] = Connector(rest, dict(config), target, generation, restarts, partitions)
        elif kind == "worker":
            return  # an older version's heartbeat: membership is the consumer group's now
        elif kind == "status":
            name, _, task = rest.rpartition("/")
            if data is None:
                self.statuses.pop((name, int(task)), None)
            else:
                if data.get("state") not in (RUNNING, PAUSED, FAILED, UNASSIGNED, RESTARTING):
                    raise ValueError(f"field state: {data.get('state')!r} is not a task state")
                self.statuses[(name, int(task))] = data
        else:
            raise ValueError(f"unknown record kind {kind!r}")

    def layout(self) -> dict[str, int]:
        """The tasks each connector runs: what the placement depends on."""
        return {name: c.tasks for name, c in sorted(self.connectors.items())}


def assign(name: str, tasks: int, alive: list[str]) -> list[str | None]:
    """The process of each task of connector ``name`` (None while no process is alive)."""
    if not alive:
        return [None] * tasks
    start = zlib.crc32(name.encode())
    return [alive[(start + i) % len(alive)] for i in range(tasks)]


@dataclass(frozen=True)
class Placement:
    """Where everything runs, as the group's leader computed it (the user data of every
    member's assignment): the members (worker id -> REST URL), each connector's owner and the
    owner of each of its tasks, the layout it was computed from, and the leader's token."""

    workers: dict[str, str] = field(default_factory=dict)
    connectors: dict[str, str] = field(default_factory=dict)
    tasks: dict[str, list[str]] = field(default_factory=dict)
    layout: dict[str, int] = field(default_factory=dict)
    leader: str = ""

    @classmethod
    def compute(cls, workers: Mapping[str, str], layout: Mapping[str, int], leader: str) -> Placement:
        members = sorted(workers)
        return cls(dict(workers), {n: o for n in layout if (o := assign(n, 1, members)[0]) is not None},
                   {n: [o for o in assign(n, k, members) if o is not None] for n, k in layout.items()},
                   dict(layout), leader)

    def owners(self, name: str, tasks: int) -> list[str | None]:
        """The process of each task: the leader's, or for tasks it has not placed yet (a
        connector it had not read) the same rule over the same members, so that every member
        agrees without waiting for a rebalance (Tansu answers a rejoin that changes no member
        with the previous assignment)."""
        placed = self.tasks.get(name, [])
        if len(placed) >= tasks:
            return list(placed[:tasks])
        return assign(name, tasks, sorted(self.workers))

    def connector_owner(self, name: str) -> str | None:
        return self.connectors.get(name) or assign(name, 1, sorted(self.workers))[0]

    def encode(self) -> bytes:
        return json.dumps({"version": 1, "workers": self.workers, "connectors": self.connectors, "tasks": self.tasks,
                           "layout": self.layout, "leader": self.leader}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Placement:
        """Raises ValueError for anything but an encoded placement."""
        try:
            d = json.loads(data)
            out = cls({str(k): str(v) for k, v in d["workers"].items()},
                      {str(k): str(v) for k, v in d["connectors"].items()},
                      {str(k): [str(o) for o in v] for k, v in d["tasks"].items()},
                      {str(k): int(v) for k, v in d["layout"].items()}, str(d["leader"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a connect group placement: {exc}") from exc
        return out


def status_of(state: ClusterState, name: str, placement: Placement, notes: Sequence[str] = ()) -> dict[str, Any]:
    """Kafka Connect's ``/connectors/{name}/status`` JSON (UNASSIGNED: no member yet, or no
    report from the task's process for its current generation). ``notes``: what the connector's
    ``trace`` says besides (settings its config.unknown-keys=warn let in)."""
    c = state.connectors[name]
    owners = placement.owners(name, c.tasks)
    tasks = []
    for i, owner in enumerate(owners):
        seen = _current(state, c, i, owner)
        if owner is None or seen is None:
            tasks.append({"id": i, "state": UNASSIGNED, "worker_id": owner or "", "version": PLUGIN_VERSION})
            continue
        entry = {"id": i, "state": seen["state"], "worker_id": owner, "version": PLUGIN_VERSION}
        if seen["state"] in (FAILED, RESTARTING):
            entry["trace"] = str(seen.get("trace", ""))
        tasks.append(entry)
    leader = placement.connector_owner(name)
    connector: dict[str, Any] = {"state": UNASSIGNED if leader is None else c.target, "worker_id": leader or "",
                                 "version": PLUGIN_VERSION}
    said = list(notes)
    if c.target != STOPPED and c.partitions and c.max_tasks > c.partitions:
        said.insert(0, f"tasks.max={c.max_tasks} is above the {c.partitions} partitions of the connector's "
                       f"topics: {c.tasks} tasks run (a task without a partition would only hold memory)")
    if said:
        connector["trace"] = "; ".join(said)
    return {"name": name, "connector": connector, "tasks": tasks, "type": "sink"}


def _current(state: ClusterState, c: Connector, task: int, owner: str | None) -> dict[str, Any] | None:
    """Task ``task``'s status record if its owner wrote it for the connector's current generation
    and restart (else it is stale: UNASSIGNED)."""
    seen = state.statuses.get((c.name, task))
    if owner is None or seen is None or seen.get("worker_id") != owner or seen.get("generation") != c.generation \
            or seen.get("restart", 0) != c.restart_of(task):
        return None
    return seen


def scrape_targets(state: ClusterState, placement: Placement) -> list[dict[str, Any]]:
    """Prometheus HTTP service discovery's JSON (``http_sd_configs``) for the cluster's running
    tasks, as their processes reported them: one target group per task, its metrics endpoint on
    its process's advertised host, labelled ``connector``, ``task`` and ``instance`` (the
    process's advertised host and ``metrics.port``: a task's series keep the ``(job, instance,
    connector, task)`` identity the dashboard and the rules join on, and a task started again on
    another port keeps its series). Any process answers for the whole cluster."""
    out = []
    for name in sorted(state.connectors):
        c = state.connectors[name]
        for i, owner in enumerate(placement.owners(name, c.tasks)):
            seen = _current(state, c, i, owner)
            metrics = seen.get("metrics") if seen is not None and seen["state"] == RUNNING else None
            if isinstance(metrics, dict) and metrics.get("target") and metrics.get("instance"):
                out.append({"targets": [str(metrics["target"])],
                            "labels": {"instance": str(metrics["instance"]), "connector": name, "task": str(i)}})
    return out
