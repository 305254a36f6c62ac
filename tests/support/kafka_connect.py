"""The reference sink: Apache Kafka Connect running the Apache Iceberg Kafka Connect sink, the
connector icesink is a drop-in for, for the side-by-side benchmark (bench/versus_reference.py)
and its test.

Nothing here is committed as a jar. Two poms list the class paths and ``mvn
dependency:copy-dependencies`` copies them from Maven Central into ``~/.cache/icesink``
(:func:`tests.support.kafka_broker.resolve_classpath`, once; a stamp file after):

- ``tests/support/maven/kafka-connect/pom.xml``: the worker (``connect-runtime``, ``connect-json``,
  ``connect-transforms``, log4j2), its class path;
- ``tests/support/maven/iceberg-kafka-connect/pom.xml``: the sink (``iceberg-kafka-connect`` with
  its events and transforms, iceberg-core/-data/-parquet, hadoop-common as Iceberg's own
  distribution trims it, PostgreSQL's JDBC driver), a plugin directory on ``plugin.path``,
  loaded in its own class loader as Connect runs every plugin.

:class:`KafkaConnect` runs one standalone worker (``ConnectStandalone worker.properties
connector.properties``: the connector starts with the worker) with the JVM options of Kafka's
``connect-standalone.sh`` (2 GB heap, G1), its REST API on a free loopback port, and waits until
the connector and all its tasks are RUNNING. The Iceberg sink reads the worker's properties file
for its own Kafka clients (``IcebergSinkConfig.loadWorkerProps``), so ``bootstrap.servers`` is
set once. On one Kafka broker its control topic needs replication factor 1: create it first
(:func:`icesink.shared.kafka_admin.ensure_topic`), or the broker's default of 1 applies.

It needs a real Kafka broker: on the embedded Tansu broker (tried 2026-11-28) its task is
RUNNING and the Java client's transactional InitProducerId succeeds, but the sink's leader
election (``CommitterImpl``: DescribeConsumerGroups, the member holding the first partition)
finds no partitions assigned to any member, so no task starts the commit coordinator and
nothing is ever committed (one WARN "cannot determine leader").

``python -m tests.support.kafka_connect resolve`` fetches both class paths and prints them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from icesink.app.embedded import _die_with_parent_hook, free_port
from tests.support.kafka_broker import KafkaError, resolve_classpath
from tests.support.logged_process import terminate

logger = logging.getLogger(__name__)

_MAVEN = Path(__file__).resolve().parent / "maven"
WORKER_POM = _MAVEN / "kafka-connect" / "pom.xml"
PLUGIN_POM = _MAVEN / "iceberg-kafka-connect" / "pom.xml"
CONNECTOR_CLASS = "org.apache.iceberg.connect.IcebergSinkConnector"
_LOG_FILE = "connect.log"

#: What Kafka's bin/connect-standalone.sh and kafka-run-class.sh give the JVM (KAFKA_HEAP_OPTS,
#: KAFKA_JVM_PERFORMANCE_OPTS): the reference as it is run out of the box.
JVM_OPTIONS: tuple[str, ...] = (
    "-Xms256M", "-Xmx2G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent", "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
)

_LOG4J = """\
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
# the full config dumps of every client, worker and connector
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""


def resolve() -> tuple[Path, Path]:
    """(the worker's jar directory, the directory to give ``plugin.path``: it holds the sink's
    plugin directory ``lib/``), fetched from Maven Central unless the cache holds them."""
    worker = resolve_classpath(WORKER_POM, expect="connect-runtime-*.jar")
    plugin = resolve_classpath(PLUGIN_POM, expect="iceberg-kafka-connect-[0-9]*.jar")
    return worker, plugin.parent


def iceberg_sink_config(name: str, topics: str, catalog: Mapping[str, str], *, tasks: int = 1,
                        interval_ms: int = 10_000, control_topic: str = "control-iceberg",
                        tables: str | None = None, route_field: str | None = None,
                        extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Iceberg sink's connector config for schemaless JSON values, auto-creating its
    tables: ``tables`` names one table, or ``route_field`` routes each record to the table its
    value names (``iceberg.tables.dynamic-enabled``). ``catalog`` holds the ``iceberg.catalog.*``
    keys without the prefix (``catalog`` itself: the catalog's name)."""
    if (tables is None) == (route_field is None):
        raise ValueError("iceberg_sink_config: give exactly one of tables and route_field")
    config = {
        "name": name,
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": str(tasks),
        "topics": topics,
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "iceberg.tables.auto-create-enabled": "true",
        "iceberg.control.topic": control_topic,
        "iceberg.control.commit.interval-ms": str(interval_ms),
    }
    if tables is not None:
        config["iceberg.tables"] = tables
    else:
        config |= {"iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": str(route_field)}
    for key, value in catalog.items():
        config["iceberg.catalog" if key == "catalog" else f"iceberg.catalog.{key}"] = value
    config.update(extra or {})
    return config


def jdbc_catalog(name: str, host: str, port: int, user: str, warehouse: Path, database: str = "postgres") -> dict[str, str]:
    """``iceberg.catalog.*`` of Iceberg's JDBC catalog on PostgreSQL (for :func:`iceberg_sink_config`):
    the layout pyiceberg's SQL catalog reads (``iceberg_tables``, schema version V0, the default)."""
    return {"catalog": name, "type": "jdbc", "uri": f"jdbc:postgresql://{host}:{port}/{database}",
            "jdbc.user": user, "warehouse": f"file://{warehouse}"}


class KafkaConnect:
    """One standalone Kafka Connect worker (a JVM child process) running one connector.

    ``directory`` holds ``worker.properties``, ``connector.properties``, the worker's offsets
    file and its log (``connect.log``). The JVM gets SIGKILL when the thread that started it
    exits (as :class:`tests.support.kafka_broker.KafkaBroker`). :attr:`start_seconds`: from the
    JVM's launch until the connector and its tasks were RUNNING.
    """

    def __init__(self, directory: str | os.PathLike[str], bootstrap: str, connector: Mapping[str, str], *,
                 worker: Mapping[str, str] | None = None, jvm_options: tuple[str, ...] = JVM_OPTIONS,
                 start_timeout_s: float = 180.0, stop_timeout_s: float = 30.0) -> None:
        if "name" not in connector:
            raise ValueError("KafkaConnect: the connector config needs a 'name'")
        self._directory = Path(directory)
        self._bootstrap = bootstrap
        self._connector = dict(connector)
        self._worker = dict(worker or {})
        self._jvm_options = jvm_options
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self.rest_port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_handle: IO[bytes] | None = None
        self.start_seconds: float | None = None

    @property
    def name(self) -> str:
        return self._connector["name"]

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self._directory / _LOG_FILE

    def __repr__(self) -> str:
        return f"KafkaConnect(connector={self.name!r}, rest_port={self.rest_port}, pid={self.pid})"

    def spawn(self) -> None:
        """Write the properties and launch the JVM; returns at once (:meth:`wait_running`)."""
        if self.running:
            raise KafkaError(f"Kafka Connect already running (pid {self.pid})")
        lib, plugin_path = resolve()
        java = shutil.which("java")
        if java is None:
            raise KafkaError("java is not on PATH (Kafka Connect needs Java 17; ./dev installs it)")
        self._directory.mkdir(parents=True, exist_ok=True)
        (self._directory / "log4j2.properties").write_text(_LOG4J)
        worker = {
            "bootstrap.servers": self._bootstrap,
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.storage.file.filename": str(self._directory / "connect.offsets"),
            "plugin.path": str(plugin_path),
            "listeners": f"http://127.0.0.1:{self.rest_port}",
            **self._worker,
        }
        _write_properties(self._directory / "worker.properties", worker)
        _write_properties(self._directory / "connector.properties", self._connector)
        classpath = ":".join(str(p) for p in sorted(lib.glob("*.jar")))
        # The sink finds the worker's properties as the first argument after the main class
        # (IcebergSinkConfig.loadWorkerProps): keep that order.
        cmd = [java, *self._jvm_options, f"-Dlog4j2.configurationFile={self._directory / 'log4j2.properties'}",
               "-cp", classpath, "org.apache.kafka.connect.cli.ConnectStandalone",
               str(self._directory / "worker.properties"), str(self._directory / "connector.properties")]
        self._log_handle = self.log_path.open("ab")
        self._began = time.monotonic()
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_handle,
                                      stderr=subprocess.STDOUT, cwd=self._directory,
                                      preexec_fn=_die_with_parent_hook())

    def wait_running(self) -> None:
        """Until the connector and every task it has are RUNNING; raises :class:`KafkaError`
        with the end of the log if one FAILED, the JVM exited, or it takes longer than the
        start timeout."""
        deadline = self._began + self._start_timeout_s
        while True:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise KafkaError(f"Kafka Connect exited with code {code}. Log {self.log_path}:\n{self.log_tail()}")
            status = self.status()
            if status is not None:
                states = [status["connector"]["state"], *(t["state"] for t in status.get("tasks", []))]
                if "FAILED" in states:
                    raise KafkaError(f"connector {self.name} failed: {json.dumps(status)[:3000]}\n{self.log_tail()}")
                if status.get("tasks") and all(s == "RUNNING" for s in states):
                    self.start_seconds = time.monotonic() - self._began
                    logger.info("Kafka Connect running %s with %d tasks in %.1f s", self.name,
                                len(status["tasks"]), self.start_seconds)
                    return
            if time.monotonic() > deadline:
                raise KafkaError(f"connector {self.name} not running within {self._start_timeout_s:.0f} s "
                                 f"(status {status}). Log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.2)

    def start(self) -> None:
        self.spawn()
        try:
            self.wait_running()
        except BaseException:
            self.stop()
            raise

    def status(self) -> dict[str, Any] | None:
        """``GET /connectors/<name>/status``, or None while the REST API or the connector is not up."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}/connectors/{self.name}/status",
                                        timeout=5) as resp:
                body: dict[str, Any] = json.loads(resp.read())
                return body
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def stop(self) -> None:
        """SIGTERM (the worker stops its tasks), then SIGKILL after the stop timeout. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        terminate(proc, self._stop_timeout_s, "Kafka Connect")
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        self._proc = None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> KafkaConnect:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _write_properties(path: Path, props: Mapping[str, str]) -> None:
    """A Java properties file; values are plain (no newlines), ':' '=' and '\\' escaped."""
    def esc(text: str) -> str:
        return text.replace("\\", "\\\\").replace("=", "\\=").replace(":", "\\:")

    for key, value in props.items():
        if "\n" in key or "\n" in str(value):
            raise ValueError(f"{path.name}: {key!r}: a property may not hold a newline")
    path.write_text("".join(f"{esc(k)}={esc(str(v))}\n" for k, v in props.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.kafka_connect", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("resolve", help="fetch Kafka Connect's and the Iceberg sink's jars into the cache; print both")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "resolve":
        for path in resolve():
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
