"""``icesink connect``: a Kafka Connect-compatible cluster of icesink processes.

Each process serves the whole REST API (:mod:`icesink.app.connect_api`) and reads the cluster's
config topic (:mod:`icesink.app.connect_state` describes its records) into the same state. A
connector's ``tasks.max`` tasks are spread over the alive processes; each task is an
``icesink worker`` replica (a child process, as ``ReplicaSet`` starts them) in the connector's
sink group (``connect-<name>`` unless its config sets ``group.id``), so everything exactly-once
is as for worker replicas. A process that dies stops heartbeating; after ``session.timeout-ms``
the others take its tasks over (its replicas die with it: they get SIGKILL when their parent
goes). Pause stops a task's process group (SIGSTOP: no consumption, no commits, buffered data
kept in memory) and resume continues it (SIGCONT; its sink group then rejoins and carries on
exactly once, as after any stall).

Prometheus scrapes one ``/metrics`` per process (``metrics.port``, also served on the REST
listener): the metrics of every replica it runs, labelled ``connector`` and ``task``, and the
process's own ``icesink_connect_*`` gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from icesink.config import Settings, build, keys_from_env, read_config_file
from icesink.app.connect_state import (
    FAILED, PAUSED, RUNNING, ClusterState, Connector, assign, connector_key, status_key, status_of, tasks_max,
    worker_key,
)
from icesink.errors import ConfigError
from icesink.app.replicas import Replica, ReplicaSet

log = logging.getLogger(__name__)

#: Settings of the connect process itself (Kafka Connect's names where it has them); every other
#: key of its config (Kafka security, catalog, Spark...) is a default for the connectors' tasks.
CONNECT_DEFAULTS: dict[str, Any] = {
    "listeners": "http://0.0.0.0:8083",
    "rest.advertised.host.name": None,
    "group.id": "icesink-connect",
    "config.storage.topic": "icesink-connect-configs",
    "heartbeat.interval-ms": 2000,
    "session.timeout-ms": 10000,
    "metrics.port": 9400,
    "metrics.host": "0.0.0.0",
    "state.dir": "var",
}
_ENV = {re.sub(r"[.\-]", "_", k).upper(): k for k in CONNECT_DEFAULTS}
#: Keys of a connector's config that name the connector, not the sink.
_CONNECTOR_ONLY = ("name", "tasks.max", "connector.class")


@dataclass(frozen=True)
class ConnectSettings:
    bootstrap_servers: str | None
    listen_host: str
    listen_port: int
    advertised_host: str
    group_id: str
    config_topic: str
    heartbeat_s: float
    session_s: float
    metrics_host: str
    metrics_port: int
    state_dir: Path
    task_defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def worker_id(self) -> str:
        return f"{self.advertised_host}:{self.listen_port}"

    @property
    def url(self) -> str:
        return f"http://{self.worker_id}"

    def sink_settings(self, config: Mapping[str, Any]) -> Settings:
        """A connector's config as ``icesink worker`` settings; ConfigError names a bad key."""
        raw = {**self.task_defaults, **{k: v for k, v in config.items() if k not in _CONNECTOR_ONLY}}
        raw.setdefault("bootstrap.servers", self.bootstrap_servers)
        return build(raw, warn_unknown=False)

    def process_settings(self) -> Settings:
        """The defaults as worker settings (Kafka clients, state dir, secrets to redact) for this
        process's own use; the topic and table only fill required keys."""
        return self.sink_settings({"topics": "-", "iceberg.tables": "icesink.connect", **self.task_defaults})

    def client_kwargs(self) -> dict[str, Any]:
        return dict(self.process_settings().kafka_client_kwargs())


def _int(raw: Mapping[str, Any], key: str, low: int) -> int:
    try:
        value = int(raw[key])
    except (TypeError, ValueError):
        raise ConfigError(key, raw[key], "a whole number") from None
    if value < low:
        raise ConfigError(key, value, f"at least {low}")
    return value


def connect_settings(raw: Mapping[str, Any]) -> ConnectSettings:
    merged = {**CONNECT_DEFAULTS, **raw}
    url = urlsplit(str(merged["listeners"]).split(",")[0].strip())
    if url.scheme != "http" or not url.hostname or url.port is None:
        raise ConfigError("listeners", merged["listeners"], "an http://HOST:PORT address (https is not served)")
    host = merged["rest.advertised.host.name"] or (socket.gethostname() if url.hostname in ("0.0.0.0", "::") else url.hostname)
    defaults = {k: v for k, v in raw.items() if k not in CONNECT_DEFAULTS or k in ("state.dir",)}
    defaults.pop("bootstrap.servers", None)
    settings = ConnectSettings(
        bootstrap_servers=raw.get("bootstrap.servers") or None,
        listen_host=url.hostname, listen_port=url.port, advertised_host=str(host),
        group_id=str(merged["group.id"]), config_topic=str(merged["config.storage.topic"]),
        heartbeat_s=_int(merged, "heartbeat.interval-ms", 100) / 1000,
        session_s=_int(merged, "session.timeout-ms", 1000) / 1000,
        metrics_host=str(merged["metrics.host"]), metrics_port=_int(merged, "metrics.port", 0),
        state_dir=Path(str(merged["state.dir"])).resolve(), task_defaults=defaults,
    )
    if settings.session_s <= 2 * settings.heartbeat_s:
        raise ConfigError("session.timeout-ms", merged["session.timeout-ms"],
                          "more than twice heartbeat.interval-ms")
    settings.client_kwargs()  # the Kafka client settings must be valid too
    return settings


def load_connect_settings(path: Path | None, environ: Mapping[str, str], overrides: Mapping[str, Any]) -> ConnectSettings:
    raw: dict[str, Any] = dict(read_config_file(path)) if path is not None else {}
    env = {k: v for k, v in environ.items() if k.startswith("ICESINK_")}
    own = {name: value for name, value in env.items() if name[len("ICESINK_"):] in _ENV}
    raw.update({_ENV[name[len("ICESINK_"):]]: value for name, value in own.items()})
    raw.update(keys_from_env({k: v for k, v in env.items() if k not in own}))
    raw.update(overrides)
    return connect_settings(raw)


@dataclass
class LocalTask:
    """A task this process runs: one worker replica."""

    name: str
    task: int
    generation: int
    digest: str
    replica: Replica
    stop_bound_s: float
    paused: bool = False
    failed: str | None = None
    reported: tuple[str, str] | None = None  # (state, worker id) last written to the topic


class Cluster:
    """One process of an ``icesink connect`` cluster: the API's backend, and the supervisor of
    the tasks the shared assignment gives this process."""

    def __init__(self, settings: ConnectSettings, bootstrap: str) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.worker_id = settings.worker_id
        self.state = ClusterState()
        self.local: dict[tuple[str, int], LocalTask] = {}
        directory = settings.state_dir / "connect" / settings.group_id / re.sub(r"[^\w.-]", "_", self.worker_id)
        self.directory = directory
        # A task's settings are all in its config file: this process's ICESINK_* are not inherited.
        self.replicas = ReplicaSet(directory / "task.json", directory / "logs", inherit_settings=False)
        self._producer: Any = None
        self._consumer: Any = None
        self._read = asyncio.Condition()
        self._background: list[asyncio.Task[None]] = []
        self.failure: BaseException | None = None
        self.errors: dict[str, int] = {}

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        from icesink.kafka_admin import end_offsets, ensure_topic

        kwargs = self.settings.client_kwargs()
        await ensure_topic(self.bootstrap, self.settings.config_topic, 1,
                           configs={"cleanup.policy": "compact"}, client_kwargs=kwargs)
        self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", **kwargs)
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                          enable_auto_commit=False, **kwargs)
        await self._consumer.start()
        tp = TopicPartition(self.settings.config_topic, 0)
        self._consumer.assign([tp])
        await self._consumer.seek_to_beginning(tp)
        end = (await end_offsets(self.bootstrap, self.settings.config_topic, client_kwargs=kwargs))[0]
        while self.state.position < end:  # history: old heartbeats do not make anyone alive
            await self._read_once(live=False)
        await self._heartbeat()
        self._background = [asyncio.create_task(self._guard(loop()), name=loop.__name__)
                            for loop in (self._read_loop, self._heartbeat_loop, self._reconcile_loop)]
        log.info("connect worker %s joined cluster %s (config topic %s, %d connectors)", self.worker_id,
                 self.settings.group_id, self.settings.config_topic, len(self.state.connectors))

    async def stop(self) -> None:
        """Stop every task (graceful, bounded), say goodbye so the others take over at once."""
        for t in self._background:
            t.cancel()
        for t in self._background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await asyncio.gather(*(self._stop_task(key) for key in list(self.local)), return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._producer.send_and_wait(self.settings.config_topic, key=worker_key(self.worker_id), value=None)
        for client in (self._producer, self._consumer):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.stop()

    async def _guard(self, coro: Any) -> None:
        """A background loop that fails stops the process loudly (see ``run``)."""
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("connect worker %s: a background loop failed", self.worker_id)
            self.failure = exc

    # --- the config topic ------------------------------------------------------------------

    async def _read_once(self, *, live: bool = True) -> None:
        batches = await self._consumer.getmany(timeout_ms=200)
        now = time.monotonic()
        async with self._read:
            for records in batches.values():
                for r in records:
                    self.state.apply(r.offset, r.key, r.value, now, live=live)
            if batches:
                self._read.notify_all()

    async def _read_loop(self) -> None:
        await self._forever("reading the config topic", self._read_once, 0)

    async def _forever(self, what: str, step: Any, interval_s: float) -> None:
        """Run ``step`` every ``interval_s``; a failed step (broker away, a child that cannot
        start) is logged, counted in ``icesink_connect_errors_total`` and retried with capped
        backoff, and the tasks already running keep running meanwhile."""
        backoff = 0.5
        while True:
            try:
                await step()
                backoff = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried, logged and counted
                self.errors[what] = self.errors.get(what, 0) + 1
                log.warning("connect worker %s: %s failed (retrying in %.1f s): %s", self.worker_id, what, backoff,
                            exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            await asyncio.sleep(interval_s)

    async def _write(self, key: bytes, value: dict[str, Any] | None) -> None:
        """Write a record and wait until this process has read it (read-your-writes for the API)."""
        body = None if value is None else json.dumps(value).encode()
        meta = await self._producer.send_and_wait(self.settings.config_topic, key=key, value=body)
        async with self._read:
            await asyncio.wait_for(self._read.wait_for(lambda: self.state.position > meta.offset), 30)

    async def _heartbeat(self) -> None:
        await self._producer.send_and_wait(self.settings.config_topic, key=worker_key(self.worker_id),
                                           value=json.dumps({"url": self.settings.url}).encode())

    async def _heartbeat_loop(self) -> None:
        await asyncio.sleep(self.settings.heartbeat_s)
        await self._forever("heartbeating", self._heartbeat, self.settings.heartbeat_s)

    # --- the API's backend -----------------------------------------------------------------

    async def sync(self) -> None:
        """Wait until this process has read the config topic up to its end as of now."""
        from aiokafka import TopicPartition

        tp = TopicPartition(self.settings.config_topic, 0)
        end = int((await self._consumer.end_offsets([tp]))[tp])
        async with self._read:
            await asyncio.wait_for(self._read.wait_for(lambda: self.state.position >= end), 30)

    def names(self) -> list[str]:
        return list(self.state.connectors)

    def config(self, name: str) -> dict[str, str] | None:
        c = self.state.connectors.get(name)
        return None if c is None else dict(c.config)

    def tasks(self, name: str) -> int:
        return self.state.connectors[name].tasks

    def status(self, name: str) -> dict[str, Any]:
        return status_of(self.state, name, time.monotonic(), self.settings.session_s)

    def check(self, name: str, config: dict[str, str]) -> None:
        tasks_max(config)
        self.settings.sink_settings(config)

    async def put(self, name: str, config: dict[str, str]) -> bool:
        old = self.state.connectors.get(name)
        if old is not None and old.config == config:
            return False
        # A new connector's generation is a clock reading, so that statuses left from an older
        # connector of the same name never match it.
        target, generation = (old.target, old.generation + 1) if old else (RUNNING, time.time_ns() // 1000)
        await self._write(connector_key(name), {"config": config, "target": target, "generation": generation})
        return old is None

    async def set_target(self, name: str, target: str) -> None:
        c = self.state.connectors[name]
        if c.target != target:
            await self._write(connector_key(name), {"config": c.config, "target": target, "generation": c.generation})

    async def restart(self, name: str) -> None:
        c = self.state.connectors[name]
        await self._write(connector_key(name), {"config": c.config, "target": c.target, "generation": c.generation + 1})

    async def delete(self, name: str) -> None:
        tasks = self.state.connectors[name].tasks
        await self._write(connector_key(name), None)
        for i in range(tasks):
            await self._producer.send_and_wait(self.settings.config_topic, key=status_key(name, i), value=None)

    # --- running this process's tasks ------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        await asyncio.sleep(self.settings.heartbeat_s * 1.5)  # let the others' heartbeats arrive
        await self._forever("running tasks", self.reconcile, 0.5)

    def wanted(self) -> dict[tuple[str, int], Connector]:
        alive = self.state.alive(time.monotonic(), self.settings.session_s)
        if self.worker_id not in alive:
            return {}
        out = {}
        for c in self.state.connectors.values():
            for i, owner in enumerate(assign(c.name, c.tasks, alive)):
                if owner == self.worker_id:
                    out[(c.name, i)] = c
        return out

    async def reconcile(self) -> None:
        wanted = self.wanted()
        for key, lt in list(self.local.items()):
            c = wanted.get(key)
            if c is None or c.generation != lt.generation or _digest(c.config) != lt.digest:
                await self._stop_task(key)
        for key, c in wanted.items():
            if key not in self.local:
                self._start_task(c, key[1])
        for key, lt in self.local.items():
            c = wanted[key]
            if lt.failed is None and not lt.replica.alive:
                code = lt.replica.proc.returncode
                tail = lt.replica.log_path.read_text(errors="replace")[-4000:]
                lt.failed = f"the worker replica exited with code {code}; the end of its log:\n{tail}"
                log.error("connector %s task %d failed: replica exited with code %s", c.name, key[1], code)
            elif lt.failed is None and (c.target == PAUSED) != lt.paused:
                lt.paused = c.target == PAUSED
                os.killpg(lt.replica.proc.pid, signal.SIGSTOP if lt.paused else signal.SIGCONT)
                log.info("connector %s task %d %s", c.name, key[1], "paused" if lt.paused else "resumed")
            state = FAILED if lt.failed else PAUSED if lt.paused else RUNNING
            if lt.reported != (state, self.worker_id):
                await self._producer.send_and_wait(
                    self.settings.config_topic, key=status_key(c.name, key[1]),
                    value=json.dumps({"state": state, "worker_id": self.worker_id, "generation": lt.generation,
                                      "trace": lt.failed or ""}).encode())
                lt.reported = (state, self.worker_id)

    def _start_task(self, c: Connector, task: int) -> None:
        """Start a replica (on the event loop's thread: its die-with-parent signal is tied to
        the thread that forks it)."""
        name = re.sub(r"[^\w.-]", "_", f"{c.name}-{task}-{self.worker_id}")
        config = {**self.settings.task_defaults, **{k: v for k, v in c.config.items() if k not in _CONNECTOR_ONLY}}
        config.setdefault("group.id", f"connect-{c.name}")
        config["bootstrap.servers"] = self.bootstrap
        config.setdefault("state.dir", str(self.settings.state_dir))
        path = self.directory / "tasks" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)  # it may hold credentials
        path.write_text(json.dumps(config))
        replica = self.replicas.start(name, config=path)
        bound_s = int(config.get("shutdown.timeout-ms", 30_000)) / 1000 + 10
        self.local[(c.name, task)] = LocalTask(c.name, task, c.generation, _digest(c.config), replica, bound_s)
        log.info("connector %s task %d started as replica %s (generation %d, pid %d)", c.name, task, name,
                 c.generation, replica.proc.pid)

    async def _stop_task(self, key: tuple[str, int]) -> None:
        lt = self.local.pop(key)
        replica = lt.replica
        self.replicas.replicas.pop(replica.name, None)
        if replica.alive:
            if lt.paused:
                os.killpg(replica.proc.pid, signal.SIGCONT)
            replica.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(replica.proc.wait), lt.stop_bound_s)
            except TimeoutError:
                os.killpg(replica.proc.pid, signal.SIGKILL)
                await asyncio.to_thread(replica.proc.wait)
        replica.log_handle.close()
        log.info("connector %s task %d stopped (replica %s, exit code %s)", key[0], key[1], replica.name,
                 replica.proc.returncode)

    # --- metrics ---------------------------------------------------------------------------

    async def metrics_text(self) -> bytes:
        """Every local replica's metrics labelled by connector and task, and the cluster's own."""
        import aiohttp
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        from prometheus_client.parser import text_string_to_metric_families

        families: dict[str, Any] = {}

        async def scrape(session: aiohttp.ClientSession, lt: LocalTask) -> None:
            if lt.paused or not lt.replica.alive:
                return
            try:
                url = f"http://127.0.0.1:{lt.replica.metrics_port}/metrics"
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError):
                return  # a replica still starting has no metrics yet
            for fam in text_string_to_metric_families(text):
                labelled = [s._replace(labels={**s.labels, "connector": lt.name, "task": str(lt.task)})
                            for s in fam.samples]
                if fam.name in families:
                    families[fam.name].samples.extend(labelled)
                else:
                    fam.samples = labelled
                    families[fam.name] = fam

        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(scrape(session, lt) for lt in list(self.local.values())))
        tasks = GaugeMetricFamily("icesink_connect_tasks", "Tasks this process runs, by connector and state",
                                  labels=["connector", "state"])
        counts: dict[tuple[str, str], int] = {}
        for lt in self.local.values():
            state = FAILED if lt.failed else PAUSED if lt.paused else RUNNING
            counts[(lt.name, state)] = counts.get((lt.name, state), 0) + 1
        for (name, state), n in sorted(counts.items()):
            tasks.add_metric([name, state], n)
        alive = GaugeMetricFamily("icesink_connect_workers", "Alive processes of this connect cluster")
        alive.add_metric([], len(self.state.alive(time.monotonic(), self.settings.session_s)))
        connectors = GaugeMetricFamily("icesink_connect_connectors", "Connectors of this connect cluster")
        connectors.add_metric([], len(self.state.connectors))
        skipped = GaugeMetricFamily("icesink_connect_config_records_skipped",
                                    "Unreadable config-topic records skipped by this process")
        skipped.add_metric([], self.state.skipped)
        errors = CounterMetricFamily("icesink_connect_errors", "Failed steps of this process, retried",
                                     labels=["step"])
        for step in ("reading the config topic", "heartbeating", "running tasks"):
            errors.add_metric([step], self.errors.get(step, 0))
        everything = [*families.values(), tasks, alive, connectors, skipped, errors]

        class _All:
            def collect(self) -> Any:
                return everything

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_All())
        return bytes(generate_latest(registry))


def _digest(config: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(config), sort_keys=True).encode()).hexdigest()[:16]


async def run_connect(settings: ConnectSettings, bootstrap: str) -> int:
    """Serve the API and run tasks until SIGTERM or SIGINT (0) or a failed background loop (1)."""
    from aiohttp import web

    from icesink.app.connect_api import app

    cluster = Cluster(settings, bootstrap)
    await cluster.start()
    application = app(cluster)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=await cluster.metrics_text(), content_type="text/plain", charset="utf-8")

    application.router.add_get("/metrics", metrics)
    runner = web.AppRunner(application, access_log=None)
    await runner.setup()
    sites = [web.TCPSite(runner, settings.listen_host, settings.listen_port)]
    if settings.metrics_port and settings.metrics_port != settings.listen_port:
        sites.append(web.TCPSite(runner, settings.metrics_host, settings.metrics_port))
    for site in sites:
        await site.start()
    log.info("connect REST API on %s (advertised as %s), metrics on port %s", settings.listen_port,
             settings.url, settings.metrics_port or settings.listen_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set() and cluster.failure is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
    finally:
        await runner.cleanup()
        await cluster.stop()
    return 1 if cluster.failure is not None else 0
