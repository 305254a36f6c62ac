"""The tasks one ``icesink connect`` process runs: a worker replica each, supervised one by one.

Whatever a connector's config holds, it fails only its own tasks: every step for a task (its
checks, its files, its replica, a signal) is guarded, and a task that cannot start is FAILED
with the reason while the others are started, paused, resumed and stopped as usual.

A replica that exits during start-up (before its ``/status`` said it runs) with anything but a
config error (exit code 2) is started again after a backoff (``tasks.start.retry.backoff-ms``,
doubling, at most a minute), at most ``tasks.start.retries`` times; meanwhile the task is
RESTARTING with the last failure as its trace, and only then FAILED (a catalog not reachable
yet, a directory not mounted yet). A replica that exits after it ran is FAILED at once, as a
Kafka Connect task that fails (POST restart starts it again).

Stopping a replica (a deleted connector, a changed config, a lost assignment) waits up to its
shutdown bound: it runs beside the supervision, which goes on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icesink.app.connect_policy import replica_name
from icesink.app.connect_settings import ConnectSettings
from icesink.app.connect_spark import SharedSpark
from icesink.app.connect_state import FAILED, PAUSED, RESTARTING, RUNNING, Connector
from icesink.app.replicas import Replica, ReplicaSet
from icesink.app.start_failures import cause_in_log
from icesink.shared.errors import ConfigError

log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 60.0
#: Exit code of a replica stopped by a config error (icesink/app/cli.py): no retry mends it.
CONFIG_ERROR_EXIT = 2


@dataclass
class LocalTask:
    """A task this process runs: one worker replica (None if it could not be started)."""

    name: str
    task: int
    generation: int
    digest: str
    replica: Replica | None
    restart: int = 0  # the connector's restart count of this task when it was started
    stop_bound_s: float = 40.0
    paused: bool = False
    failed: str | None = None
    running: bool = False  # its replica's /status said it runs: start-up is over
    attempts: int = 1
    retry_at: float | None = None
    last_error: str = ""
    reported: tuple[str, str, str, int] | None = None  # (state, worker id, trace, metrics port) last written

    @property
    def state(self) -> str:
        return FAILED if self.failed else RESTARTING if self.retry_at is not None else PAUSED if self.paused else RUNNING

    @property
    def trace(self) -> str:
        return self.failed or (self.last_error if self.retry_at is not None else "")


Report = Callable[[str, int, dict[str, Any]], Awaitable[None]]


def digest(config: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(config), sort_keys=True).encode()).hexdigest()[:16]


class TaskSupervisor:
    """Starts, watches, pauses and stops this process's tasks; reports their states."""

    def __init__(self, settings: ConnectSettings, worker_id: str, bootstrap: str, directory: Path,
                 shared_spark: SharedSpark | None = None) -> None:
        self.settings = settings
        self.shared_spark = shared_spark
        self.worker_id = worker_id
        self.bootstrap = bootstrap
        self.directory = directory
        # A task's settings are all in its config file: this process's ICESINK_* are not inherited.
        self.replicas = ReplicaSet(directory / "task.json", directory / "logs", inherit_settings=False)
        self.local: dict[tuple[str, int], LocalTask] = {}
        self._stopping: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.errors: dict[str, int] = {}
        self._session: Any = None

    async def reconcile(self, wanted: Mapping[tuple[str, int], Connector], report: Report) -> None:
        """One pass: stop what is not wanted (in the background), start what is, watch the rest."""
        for key, lt in list(self.local.items()):
            c = wanted.get(key)
            if c is None or c.generation != lt.generation or digest(c.config) != lt.digest or \
                    c.restart_of(lt.task) != lt.restart:
                self._stop_in_background(key)
        for key, c in wanted.items():
            if self.shared_spark is not None and self.shared_spark.waits(c.config):
                continue  # started by a pass once the shared Spark listens
            if key not in self.local and key not in self._stopping:
                self.local[key] = self._start(c, key[1])
        for key, lt in list(self.local.items()):
            try:
                await self._watch(wanted[key], lt)
            except Exception as exc:  # noqa: BLE001 - this task only: FAILED with the reason
                self._count("watching tasks")
                log.exception("connector %s task %d: supervising it failed", lt.name, lt.task)
                lt.failed = f"icesink connect could not supervise the task: {type(exc).__name__}: {exc}"
            # listed for Prometheus once its endpoint answers (its /status said it runs)
            port = lt.replica.metrics_port if lt.replica is not None and lt.state == RUNNING and lt.running else 0
            if lt.reported != (lt.state, self.worker_id, lt.trace, port):
                status = {"state": lt.state, "worker_id": self.worker_id, "generation": lt.generation,
                          "restart": lt.restart, "trace": lt.trace}
                if port:  # where Prometheus scrapes it (GET /metrics/targets on any process)
                    status["metrics"] = {"target": self.settings.metrics_target(port),
                                         "instance": self.settings.metrics_instance}
                await report(lt.name, lt.task, status)
                lt.reported = (lt.state, self.worker_id, lt.trace, port)

    # --- starting ----------------------------------------------------------------------------

    def _start(self, c: Connector, task: int) -> LocalTask:
        """A task started as a replica, or FAILED with the reason it could not be (a config that
        was never checked by this version's API, a file that cannot be written...). On the event
        loop's thread: a replica's die-with-parent signal is tied to the thread that forks it."""
        lt = LocalTask(c.name, task, c.generation, digest(c.config), None, c.restart_of(task))
        try:
            settings = self.settings.check(c.name, c.config, self.bootstrap)
            lt.stop_bound_s = settings.shutdown_timeout_ms / 1000 + 10
            lt.replica = self._spawn(c, task)
        except ConfigError as exc:
            lt.failed = f"Connector configuration is invalid: {exc}"
            log.error("connector %s task %d not started: %s", c.name, task, exc)
        except Exception as exc:  # noqa: BLE001 - this task only: FAILED with the reason
            self._count("starting tasks")
            log.exception("connector %s task %d could not be started", c.name, task)
            lt.failed = f"icesink connect could not start the task: {type(exc).__name__}: {exc}"
        return lt

    def _spawn(self, c: Connector, task: int) -> Replica:
        name = replica_name(c.name, task, self.worker_id)
        config = self.settings.task_config(c.name, c.config, self.bootstrap)
        if self.shared_spark is not None:
            config = self.shared_spark.task_config(config, c.config)
        path = self.directory / "tasks" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)  # it may hold credentials
        path.write_text(json.dumps(config))
        replica = self.replicas.start(name, config=path)
        log.info("connector %s task %d started as replica %s (generation %d, pid %d)", c.name, task, name,
                 c.generation, replica.proc.pid)
        return replica

    # --- watching ----------------------------------------------------------------------------

    async def _watch(self, c: Connector, lt: LocalTask) -> None:
        if lt.failed is not None or lt.replica is None:
            return
        if lt.retry_at is not None:
            if time.monotonic() >= lt.retry_at:
                self._close(lt.replica)
                lt.retry_at, lt.paused = None, False
                lt.attempts += 1
                lt.replica = self._spawn(c, lt.task)
            return
        replica = lt.replica
        if not replica.alive:
            self._exited(lt, replica)
            return
        if not lt.running and not lt.paused:
            lt.running = await self._runs(replica)
        if (c.target == PAUSED) != lt.paused:
            lt.paused = c.target == PAUSED
            with contextlib.suppress(ProcessLookupError):  # it just exited: the next pass sees it
                os.killpg(replica.proc.pid, signal.SIGSTOP if lt.paused else signal.SIGCONT)
            log.info("connector %s task %d %s", c.name, lt.task, "paused" if lt.paused else "resumed")

    def _exited(self, lt: LocalTask, replica: Replica) -> None:
        code = replica.proc.returncode
        tail = replica.log_path.read_text(errors="replace")[-4000:]
        during = "during start-up " if not lt.running else ""
        # The trace's first line is the cause the replica logged (its one start-failure line), not
        # the first of its log's tail (Spark's and the JVM's own lines); the tail follows.
        cause = cause_in_log(tail)
        first = f"{cause}\n" if cause else ""
        reason = f"the worker replica exited {during}with code {code}; the end of its log:\n{tail}"
        retries = self.settings.start_retries
        if not lt.running and code != CONFIG_ERROR_EXIT and lt.attempts <= retries:
            backoff = min(self.settings.start_backoff_s * 2 ** (lt.attempts - 1), _MAX_BACKOFF_S)
            lt.retry_at = time.monotonic() + backoff
            lt.last_error = f"{first}attempt {lt.attempts} of {retries + 1} failed, restarting in {backoff:.1f} s: {reason}"
            self._count("restarting tasks")
            log.warning("connector %s task %d: replica exited during start-up with code %s; restarting in "
                        "%.1f s (attempt %d of %d)", lt.name, lt.task, code, backoff, lt.attempts + 1, retries + 1)
            return
        attempts = f" ({lt.attempts} attempts)" if lt.attempts > 1 else ""
        lt.failed = f"{first}the worker replica exited {during}with code {code}{attempts}; the end of its log:\n{tail}"
        log.error("connector %s task %d failed: replica exited with code %s%s", lt.name, lt.task, code, attempts)

    async def _runs(self, replica: Replica) -> bool:
        """Whether the replica's /status says it runs (its start-up is over)."""
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1))
        try:
            host = self.settings.metrics_local_host
            url = f"http://{f'[{host}]' if ':' in host else host}:{replica.metrics_port}/status"
            async with self._session.get(url) as resp:
                return resp.status == 200 and bool((await resp.json()).get("phase") == "running")
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False  # still starting: no status server yet

    def _count(self, step: str) -> None:
        self.errors[step] = self.errors.get(step, 0) + 1

    # --- stopping ----------------------------------------------------------------------------

    def _stop_in_background(self, key: tuple[str, int]) -> None:
        lt = self.local.pop(key)
        if lt.replica is None:
            return
        self.replicas.replicas.pop(lt.replica.name, None)
        self._stopping[key] = asyncio.create_task(self._stop(lt, lt.replica), name=f"stopping {key}")
        self._stopping[key].add_done_callback(lambda _: self._stopping.pop(key, None))

    async def _stop(self, lt: LocalTask, replica: Replica) -> None:
        try:
            if replica.alive:
                with contextlib.suppress(ProcessLookupError):
                    if lt.paused:
                        os.killpg(replica.proc.pid, signal.SIGCONT)
                    replica.proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(asyncio.to_thread(replica.proc.wait), lt.stop_bound_s)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(replica.proc.pid, signal.SIGKILL)
                    await asyncio.to_thread(replica.proc.wait)
            log.info("connector %s task %d stopped (replica %s, exit code %s)", lt.name, lt.task, replica.name,
                     replica.proc.returncode)
        except Exception:  # noqa: BLE001 - logged; the next pass starts the task again if wanted
            self._count("stopping tasks")
            log.exception("connector %s task %d: stopping its replica failed", lt.name, lt.task)
        finally:
            self._close(replica)

    @staticmethod
    def _close(replica: Replica) -> None:
        with contextlib.suppress(OSError):
            replica.log_handle.close()

    async def stop_all(self) -> None:
        """Stop every task (graceful, bounded) and wait for the stops under way."""
        for key in list(self.local):
            self._stop_in_background(key)
        await asyncio.gather(*list(self._stopping.values()), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
