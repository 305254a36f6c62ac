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
- ``worker/<id>``: ``{"url": "http://host:port"}``, a heartbeat every ``heartbeat.interval-ms``;
  a process is alive while its heartbeats arrive within ``session.timeout-ms`` (measured on the
  reader's clock, when it reads them); a tombstone says it left.
- ``status/<name>/<task>``: ``{"state", "worker_id", "generation", "restart", "trace"}``, written by the
  process running the task whenever the task's state changes (RESTARTING: its start-up failed
  and it is started again after a backoff; the trace says why).

Task ``i`` of connector ``C`` runs on ``alive[(crc32(C) + i) % len(alive)]`` of the sorted alive
processes: every process computes the same assignment from the same records, so no leader is
needed, and a connector's tasks spread over the processes.
"""

from __future__ import annotations

import json
import logging
import zlib
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


def worker_key(worker_id: str) -> bytes:
    return f"worker/{worker_id}".encode()


def status_key(name: str, task: int) -> bytes:
    return f"status/{name}/{task}".encode()


@dataclass
class ClusterState:
    """The cluster as the config topic describes it up to ``position``."""

    connectors: dict[str, Connector] = field(default_factory=dict)
    #: worker id -> (local monotonic time its last heartbeat was read, its REST url)
    workers: dict[str, tuple[float, str]] = field(default_factory=dict)
    statuses: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    position: int = 0
    skipped: int = 0

    def apply(self, offset: int, key: bytes | None, value: bytes | None, now: float, *, live: bool = True) -> None:
        """Apply one record. ``live`` is false while replaying history: old heartbeats then say
        nothing about who is alive now. A record that cannot be read is skipped and logged with
        its offset, never fatal: the topic is input."""
        self.position = offset + 1
        try:
            self._apply(key, value, now, live)
        except (ValueError, KeyError, TypeError, AttributeError, ConfigError) as exc:
            self.skipped += 1
            log.warning("config topic offset %d: skipped an unreadable record (key %r): %s", offset, key, exc)

    def _apply(self, key: bytes | None, value: bytes | None, now: float, live: bool) -> None:
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
            if data is None:
                self.workers.pop(rest, None)
            elif live:
                self.workers[rest] = (now, str(data["url"]))
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

    def alive(self, now: float, session_s: float) -> list[str]:
        return sorted(w for w, (seen, _) in self.workers.items() if now - seen <= session_s)

    def url_of(self, worker_id: str) -> str | None:
        seen = self.workers.get(worker_id)
        return seen[1] if seen else None


def assign(name: str, tasks: int, alive: list[str]) -> list[str | None]:
    """The process of each task of connector ``name`` (None while no process is alive)."""
    if not alive:
        return [None] * tasks
    start = zlib.crc32(name.encode())
    return [alive[(start + i) % len(alive)] for i in range(tasks)]


def status_of(state: ClusterState, name: str, now: float, session_s: float) -> dict[str, Any]:
    """Kafka Connect's ``/connectors/{name}/status`` JSON."""
    c = state.connectors[name]
    alive = state.alive(now, session_s)
    owners = assign(name, c.tasks, alive)
    tasks = []
    for i, owner in enumerate(owners):
        seen = state.statuses.get((name, i))
        if owner is None or seen is None or seen.get("worker_id") != owner or seen.get("generation") != c.generation \
                or seen.get("restart", 0) != c.restart_of(i):
            tasks.append({"id": i, "state": UNASSIGNED, "worker_id": owner or "", "version": PLUGIN_VERSION})
            continue
        entry = {"id": i, "state": seen["state"], "worker_id": owner, "version": PLUGIN_VERSION}
        if seen["state"] in (FAILED, RESTARTING):
            entry["trace"] = str(seen.get("trace", ""))
        tasks.append(entry)
    leader = assign(name, 1, alive)[0]
    connector: dict[str, Any] = {"state": UNASSIGNED if leader is None else c.target, "worker_id": leader or "",
                                 "version": PLUGIN_VERSION}
    if c.target != STOPPED and c.partitions and c.max_tasks > c.partitions:
        connector["trace"] = (f"tasks.max={c.max_tasks} is above the {c.partitions} partitions of the connector's "
                              f"topics: {c.tasks} tasks run (a task without a partition would only hold memory)")
    return {"name": name, "connector": connector, "tasks": tasks, "type": "sink"}
