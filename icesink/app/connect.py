"""``icesink connect``: a Kafka Connect-compatible cluster of icesink processes.

Each process serves the whole REST API (:mod:`icesink.app.connect_api`) and reads the cluster's
config topic (:mod:`icesink.app.connect_state` describes its records) into the same state. A
connector's ``tasks.max`` tasks are spread over the alive processes; each task is an
``icesink worker`` replica (a child process, as ``ReplicaSet`` starts them) in the connector's
sink group (``connect-<name>`` unless its config sets ``group.id``), so everything exactly-once
is as for worker replicas. By default (``connect.spark.shared``) the replicas share one Spark: a
local Spark Connect server this process starts and restarts (:mod:`icesink.app.connect_spark`),
so a host's tasks cost one JVM. The processes are one Kafka consumer group, whose leader places the
tasks (:mod:`icesink.app.connect_group`): a process that dies leaves it when its session
expires (``session.timeout-ms``), one stopped gracefully leaves it at once, and the others take
its tasks over (its replicas die with it: they get SIGKILL when their parent goes). Pause
stops a task's process group (SIGSTOP: no consumption, no commits, buffered data kept in
memory) and resume continues it (SIGCONT; its sink group then rejoins and carries on exactly
once, as after any stall).

The API answers on ``listeners`` only (loopback by default; basic auth and https with client
certificates as Kafka Connect configures them: :mod:`icesink.app.connect_security`). Prometheus
scrapes the process's own ``icesink_connect_*`` gauges on ``metrics.port``, which serves nothing
else but a bare ``/health`` for probes (``/metrics`` is on the API's listeners too, behind their
authentication), and each task's replica on its own metrics port, found through HTTP service
discovery: ``GET /metrics/targets`` on the API lists every running task of the cluster, as the
tasks' status records say where they are (:func:`icesink.app.connect_state.scrape_targets`).
What a connector's
config may hold is :mod:`icesink.app.connect_policy`'s; the tasks are
:mod:`icesink.app.connect_tasks`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import time
from typing import Any

from icesink.app.connect_group import Membership
from icesink.app.connect_policy import unmasked
from icesink.app.connect_settings import CONNECT_DEFAULTS as CONNECT_DEFAULTS  # re-exported
from icesink.app.connect_settings import ConnectSettings
from icesink.app.connect_settings import connect_settings as connect_settings  # re-exported
from icesink.app.connect_settings import load_connect_settings as load_connect_settings  # re-exported
from icesink.app.connect_spark import SharedSpark
from icesink.app.connect_state import (
    RUNNING, ClusterState, Connector, connector_key, scrape_targets, status_key, status_of, tasks_max,
)
from icesink.app.connect_tasks import TaskSupervisor
from icesink.shared.protocol import TopicPartition

log = logging.getLogger(__name__)


class Cluster:
    """One process of an ``icesink connect`` cluster: the API's backend, and the supervisor of
    the tasks the shared assignment gives this process."""

    def __init__(self, settings: ConnectSettings, bootstrap: str) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.worker_id = settings.worker_id
        self.kafka_cluster_id = ""  # the broker's, read at start (GET /)
        self.state = ClusterState()
        directory = settings.state_dir / "connect" / settings.group_id / re.sub(r"[^\w.-]", "_", self.worker_id)
        self.directory = directory
        self.spark = SharedSpark(settings.task_defaults, directory) if settings.spark_shared else None
        self.tasks_here = TaskSupervisor(settings, self.worker_id, bootstrap, directory, self.spark)
        self.membership = Membership(self.worker_id, settings.url, settings.group_id, settings.config_topic,
                                     settings.session_s, settings.heartbeat_s)
        self._producer: Any = None
        self._consumer: Any = None
        self._read = asyncio.Condition()
        self._background: list[asyncio.Task[None]] = []
        self.failure: BaseException | None = None
        self.errors = self.tasks_here.errors  # failed steps by name (icesink_connect_errors_total)
        self._ignored: dict[str, tuple[int, tuple[str, ...]]] = {}  # connector -> (generation, keys let in)

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        from icesink.shared.kafka_admin import cluster_id, end_offsets, ensure_topic

        kwargs = self.settings.client_kwargs()
        self.kafka_cluster_id = await cluster_id(self.bootstrap, client_kwargs=kwargs) or ""
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
        while self.state.position < end:  # the leader places what it has read: all of it, before joining
            await self._read_once()
        if self.spark is not None:  # its JVM starts meanwhile; the tasks that use it wait until it listens
            self.spark.start()
        from agents import kafka

        # The config reader has read: its connections tell whether the broker holds joins (Tansu).
        self.membership.fit_session(kafka.holds_joins(self._consumer), self.settings.session_set)
        await self.membership.start(self.bootstrap, self.state.layout, kwargs)
        loops = [self._read_loop, self._membership_loop, self._reconcile_loop]
        if self.spark is not None:
            loops.append(self.spark.watch)
        self._background = [asyncio.create_task(self._guard(loop()), name=loop.__name__) for loop in loops]
        log.info("connect worker %s joined cluster %s (config topic %s, %d connectors)", self.worker_id,
                 self.settings.group_id, self.settings.config_topic, len(self.state.connectors))

    async def stop(self) -> None:
        """Stop every task (graceful, bounded), say goodbye so the others take over at once."""
        for t in self._background:
            t.cancel()
        for t in self._background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.tasks_here.stop_all()
        if self.spark is not None:  # after the tasks: they write with it until they stop
            await self.spark.stop()
        with contextlib.suppress(Exception):
            await self.membership.stop()  # LeaveGroup: the others take this process's tasks at once
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

    async def _read_once(self) -> None:
        batches = await self._consumer.getmany(timeout_ms=200)
        async with self._read:
            for records in batches.values():
                for r in records:
                    self.state.apply(r.offset, r.key, r.value)
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

    async def _membership_loop(self) -> None:
        await self._forever("keeping the group membership", self.membership.poll, 0)

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
        return status_of(self.state, name, self.membership.placement, self._notes(name))

    def _notes(self, name: str) -> list[str]:
        """The keys config.unknown-keys=warn let the connector start with, for its status (built
        once a config generation; each task's log says it too)."""
        c = self.state.connectors[name]
        seen = self._ignored.get(name)
        if seen is None or seen[0] != c.generation:
            try:
                keys = self.settings.check(name, c.config, self.bootstrap).ignored_keys
            except Exception:  # a config that no longer builds: its tasks' status says why
                keys = ()
            seen = self._ignored[name] = (c.generation, keys)
        return [f"unknown settings ignored (config.unknown-keys=warn): {', '.join(seen[1])}"] if seen[1] else []

    def check(self, name: str, config: dict[str, str]) -> dict[str, str]:
        """The config to store (masked secrets PUT back replaced by the stored ones), checked as
        its tasks will be; ConfigError names what is wrong."""
        old = self.state.connectors.get(name)
        config = unmasked(config, None if old is None else old.config)
        self.settings.check(name, config, self.bootstrap)
        return config

    async def put(self, name: str, config: dict[str, str]) -> bool:
        old = self.state.connectors.get(name)
        if old is not None and old.config == config:
            return False
        # A new connector's generation is a clock reading, so that statuses left from an older
        # connector of the same name never match it.
        target, generation = (old.target, old.generation + 1) if old else (RUNNING, time.time_ns() // 1000)
        partitions = await self._partitions(config)
        await self._write(connector_key(name), {"config": config, "target": target, "generation": generation,
                                                **({"partitions": partitions} if partitions else {})})
        return old is None

    async def _partitions(self, config: dict[str, str]) -> int | None:
        """The partitions of the connector's topics if fewer than its ``tasks.max`` (then only
        that many tasks run), else None (also when a topic does not exist yet: it may be
        created with more)."""
        from icesink.shared.kafka_admin import partition_counts

        counts = await partition_counts(self.bootstrap, client_kwargs=self.settings.client_kwargs())
        topics = [t.strip() for t in config.get("topics", "").split(",") if t.strip()]
        if config.get("topics.regex"):
            pattern = re.compile(config["topics.regex"])
            topics += [t for t in counts if pattern.fullmatch(t)]
        if not topics or any(t not in counts for t in topics):
            return None
        total = sum(counts[t] for t in set(topics))
        return total if 0 < total < tasks_max(config) else None

    async def _rewrite(self, c: Connector, **changes: Any) -> None:
        record = {"config": c.config, "target": c.target, "generation": c.generation,
                  "restarts": {str(k): v for k, v in c.restarts.items()},
                  **({"partitions": c.partitions} if c.partitions else {})}
        await self._write(connector_key(c.name), {**record, **changes})

    async def set_target(self, name: str, target: str) -> None:
        c = self.state.connectors[name]
        if c.target != target:
            await self._rewrite(c, target=target)

    async def restart(self, name: str, tasks: tuple[int, ...]) -> None:
        """Restart these tasks of the connector (each is stopped and started again); the
        connector itself is its config only, nothing runs to restart."""
        c = self.state.connectors[name]
        if tasks:
            restarts = {**c.restarts, **{t: c.restart_of(t) + 1 for t in tasks}}
            await self._rewrite(c, restarts={str(k): v for k, v in restarts.items()})

    async def delete(self, name: str) -> None:
        tasks = self.state.connectors[name].max_tasks
        await self._write(connector_key(name), None)
        for i in range(tasks):
            await self._producer.send_and_wait(self.settings.config_topic, key=status_key(name, i), value=None)

    async def offsets(self, name: str) -> list[dict[str, Any]]:
        """The connector's committed offsets, read from its tables (off the event loop)."""
        from icesink.app.connect_offsets import committed_offsets

        settings = self.settings.sink_settings({**self.state.connectors[name].config, "name": name})
        return await asyncio.to_thread(committed_offsets, settings)

    async def change_offsets(self, name: str, offsets: dict[TopicPartition, int | None] | None,
                             allow_duplicates: bool) -> None:
        """Move a stopped connector's positions (icesink/app/connect_offsets.py)."""
        from icesink.app.connect_offsets import change_offsets

        settings = self.settings.sink_settings({**self.state.connectors[name].config, "name": name})
        await change_offsets(settings, settings.bootstrap_servers or self.bootstrap, offsets, allow_duplicates, name)

    # --- running this process's tasks ------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        await self._forever("running tasks", self.reconcile, 0.5)

    def wanted(self) -> dict[tuple[str, int], Connector]:
        """The tasks the group's latest placement gives this process, of the connectors as
        this process has read them (a deleted connector's tasks stop at once, new ones wait
        for the rebalance the leader asks for)."""
        placement = self.membership.placement
        out = {}
        for c in self.state.connectors.values():
            for i, owner in enumerate(placement.owners(c.name, c.tasks)):
                if owner == self.worker_id:
                    out[(c.name, i)] = c
        return out

    async def reconcile(self) -> None:
        self.membership.follow(self.state.layout())
        await self.tasks_here.reconcile(self.wanted(), self._report)

    async def _report(self, name: str, task: int, status: dict[str, Any]) -> None:
        await self._producer.send_and_wait(self.settings.config_topic, key=status_key(name, task),
                                           value=json.dumps(status).encode())

    # --- metrics ---------------------------------------------------------------------------

    def scrape_targets(self) -> list[dict[str, Any]]:
        """Prometheus HTTP service discovery's answer: every running task of the cluster
        (:func:`~icesink.app.connect_state.scrape_targets`)."""
        return scrape_targets(self.state, self.membership.placement)

    def metrics_text(self) -> bytes:
        """This process's own metrics (its tasks serve theirs, found through :meth:`scrape_targets`)."""
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        tasks = GaugeMetricFamily("icesink_connect_tasks", "Tasks this process runs, by connector and state",
                                  labels=["connector", "state"])
        counts: dict[tuple[str, str], int] = {}
        for lt in self.tasks_here.local.values():
            counts[(lt.name, lt.state)] = counts.get((lt.name, lt.state), 0) + 1
        for (name, state), n in sorted(counts.items()):
            tasks.add_metric([name, state], n)
        alive = GaugeMetricFamily("icesink_connect_workers", "Members of this connect cluster's group")
        alive.add_metric([], len(self.membership.placement.workers))
        connectors = GaugeMetricFamily("icesink_connect_connectors", "Connectors of this connect cluster")
        connectors.add_metric([], len(self.state.connectors))
        skipped = GaugeMetricFamily("icesink_connect_config_records_skipped",
                                    "Unreadable config-topic records skipped by this process")
        skipped.add_metric([], self.state.skipped)
        errors = CounterMetricFamily("icesink_connect_errors", "Failed steps of this process, retried",
                                     labels=["step"])
        for step in ("reading the config topic", "keeping the group membership", "running tasks", "starting tasks",
                     "watching tasks", "restarting tasks", "stopping tasks"):
            errors.add_metric([step], self.errors.get(step, 0))
        everything = [tasks, alive, connectors, skipped, errors]
        if self.spark is not None:
            up = GaugeMetricFamily("icesink_connect_spark_up", "Whether the shared Spark Connect server runs")
            up.add_metric([], 1 if self.spark.up else 0)
            restarts = CounterMetricFamily("icesink_connect_spark_restarts",
                                           "Times the shared Spark Connect server was started again after it exited")
            restarts.add_metric([], self.spark.restarts)
            everything += [up, restarts]

        class _All:
            def collect(self) -> Any:
                return everything

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_All())
        return bytes(generate_latest(registry))


async def run_connect(settings: ConnectSettings, bootstrap: str) -> int:
    """Serve the API and run tasks until SIGTERM or SIGINT (0) or a failed background loop (1)."""
    from aiohttp import web

    from icesink.app.connect_api import app, metrics_app

    cluster = Cluster(settings, bootstrap)
    await cluster.start()
    application = app(cluster, settings.security.users)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=cluster.metrics_text(), content_type="text/plain", charset="utf-8")

    async def targets(_: web.Request) -> web.Response:
        return web.json_response(cluster.scrape_targets())

    application.router.add_get("/metrics", metrics)  # behind the API's authentication
    application.router.add_get("/metrics/targets", targets)  # Prometheus http_sd_configs, likewise
    only_metrics = metrics_app(cluster, metrics)  # /metrics and an unauthenticated /health for probes
    runners = [web.AppRunner(application, access_log=None)]
    if settings.metrics_port:
        runners.append(web.AppRunner(only_metrics, access_log=None))
    for runner in runners:
        await runner.setup()
    security = settings.security
    sites = [web.TCPSite(runners[0], listener.host or None, listener.port,
                         ssl_context=security.tls if listener.scheme == "https" else None)
             for listener in settings.listeners]
    if settings.metrics_port:
        sites.append(web.TCPSite(runners[1], settings.metrics_host, settings.metrics_port))
    for site in sites:
        await site.start()
    listening = ", ".join(f"{x.scheme}://{x.host or '*'}:{x.port}" for x in settings.listeners)
    log.info("connect REST API on %s (advertised as %s; basic auth %s, client certificates %s), metrics only on "
             "%s:%s", listening, settings.url, "on" if security.users else "off", security.client_auth,
             settings.metrics_host, settings.metrics_port or "(off)")
    exposed = [x for x in settings.listeners if not x.loopback]
    if exposed and not security.authenticated:
        log.warning("the REST API listens beyond loopback (%s) without authentication: anyone who reaches it can "
                    "create connectors, which run on this host. Require basic auth (rest.extension.classes) or "
                    "client certificates (ssl.client.auth=required), or listen on 127.0.0.1 behind a proxy that "
                    "authenticates", ", ".join(f"{x.host or '*'}:{x.port}" for x in exposed))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set() and cluster.failure is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
    finally:
        for runner in runners:
            await runner.cleanup()
        await cluster.stop()
    return 1 if cluster.failure is not None else 0
