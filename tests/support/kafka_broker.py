"""A real Apache Kafka broker (KRaft, one node: broker and controller in one JVM) for the tests
and benchmarks, next to the embedded Tansu broker.

Kafka's jars come from Maven Central: ``tests/support/maven/kafka/pom.xml`` lists them and
``mvn dependency:copy-dependencies`` copies them into ``$XDG_CACHE_HOME/icesink/kafka-<digest of
the pom>/lib`` (default ``~/.cache/icesink``; about 45 MB, Maven's own repository in ``~/.m2``).
:func:`resolve_classpath` does that once (``./dev test`` calls it through ``python -m
tests.support.kafka_broker resolve``); with the cache full it only checks a stamp file.

:class:`KafkaBroker` formats a log directory (``kafka.tools.StorageTool format``, what
``kafka-storage.sh format`` runs) and starts ``kafka.Kafka server.properties`` on two free
loopback ports (clients, controller). One broker means the internal topics need replication
factor 1 (``offsets.topic.replication.factor``, ``transaction.state.log.*``), and so does every
topic a client creates: the sink's control topic needs ``iceberg.control.topic.replication-factor=1``.
``group.initial.rebalance.delay.ms=0`` lets a new group form at once, as on Tansu (Kafka's
default holds a new group's first rebalance 3 s).

``python -m tests.support.kafka_broker serve [--dir DIR]`` runs one until interrupted and prints
its address (for benchmarks: 1 GB heap and the full JIT; the tests' brokers take C1 only, which
starts with a third less CPU).
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO

from icesink.app.embedded import _die_with_parent_hook, free_port
from tests.support.logged_process import LoggedProcess, PortTaken, terminate

logger = logging.getLogger(__name__)

POM = Path(__file__).resolve().parent / "maven" / "kafka" / "pom.xml"
_STAMP = "resolved"
_LOG_FILE = "kafka.log"
_READY_LINE = "Kafka Server started"
_PORT_TAKEN = "Address already in use"
_PORT_ATTEMPTS = 3
_BATCH_HEADER = 23  # bytes of a v2 record batch up to its attributes
_CODEC_IDS = ("none", "gzip", "snappy", "lz4", "zstd")

#: Settings of every broker started here; ``KafkaBroker(settings=...)`` adds or overrides.
BROKER_SETTINGS: Mapping[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    # one broker: every internal topic has one replica
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
}

_LOG4J = """\
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
# the full config dumps of every client and server part
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""


class KafkaError(RuntimeError):
    """Kafka's class path could not be resolved, or the broker did not start."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "icesink"


def kafka_home(pom: Path = POM) -> Path:
    """The cache directory for ``pom``'s class path: its name carries the pom's digest."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    return cache_root() / f"kafka-{digest}"


def resolve_classpath(pom: Path = POM, *, expect: str = "kafka_2.13-*.jar", timeout_s: float = 900.0) -> Path:
    """The directory holding ``pom``'s jars (Kafka's by default), copied there from Maven Central
    by ``mvn`` unless a previous run did (a stamp file says it finished); ``expect`` is a jar that
    must be among them. Safe to call from several processes at once (a lock file)."""
    home = kafka_home(pom)
    lib = home / "lib"
    if (home / _STAMP).exists():
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaError("mvn (Apache Maven) is not on PATH: it fetches Kafka's jars from Maven Central "
                         "(`apt-get install maven`; ./dev test installs it)")
    home.mkdir(parents=True, exist_ok=True)
    with (home / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / _STAMP).exists():
            return lib
        partial = home / "lib.partial"
        shutil.rmtree(partial, ignore_errors=True)
        began = time.monotonic()
        cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
               f"-DoutputDirectory={partial}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise KafkaError(f"{' '.join(cmd)}: no result within {timeout_s:.0f} s") from None
        if done.returncode != 0 or not any(partial.glob(expect)):
            raise KafkaError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
        shutil.rmtree(lib, ignore_errors=True)
        partial.rename(lib)
        (home / _STAMP).write_text(" ".join(sorted(p.name for p in lib.glob("*.jar"))) + "\n")
        logger.info("%s resolved into %s in %.1f s", pom, lib, time.monotonic() - began)
    return lib


def _class_archive(java: str, lib: Path) -> Path:
    """Where the JVM's class-data-sharing archive of Kafka's classes lives (Java's CDS, as for
    Spark in spark_bridge/class_archive.py): one per JDK and class path. A JVM that finds it does
    not fit (an upgraded JDK in place) warns and runs without it."""
    real = Path(java).resolve()
    stat = real.stat()
    key = f"{real}:{stat.st_size}:{stat.st_mtime_ns}:{':'.join(sorted(p.name for p in lib.glob('*.jar')))}"
    return lib.parent / f"classes-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def _cluster_id() -> str:
    """A random id as Kafka writes them (URL-safe base64 of 16 bytes; never starting with '-')."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text



class KafkaBroker(LoggedProcess):
    """One Apache Kafka node (KRaft combined mode) run as a child process on loopback ports.

    ``directory`` holds its ``server.properties``, its log (``kafka.log``, appended to on every
    start) and its data (``data/``, formatted on the first start). A stopped broker may be started
    again on the same ports with its data. The JVM gets SIGKILL when the thread that started it
    exits (as :class:`icesink.app.embedded.EmbeddedBroker`). :attr:`start_seconds` is how long the
    last start took (format included), measured from the first JVM's launch to the log's
    ``Kafka Server started``.
    """

    def __init__(self, directory: str | os.PathLike[str], *, settings: Mapping[str, str] | None = None,
                 heap: str = "512m", quick_start: bool = True, start_timeout_s: float = 120.0,
                 stop_timeout_s: float = 30.0) -> None:
        self._directory = Path(directory)
        self._settings = dict(settings or {})
        self._heap = heap
        self._quick_start = quick_start
        self._dumping: Path | None = None
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._port = free_port()
        self._controller_port = free_port()
        self._ports_fixed = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_handle: IO[bytes] | None = None
        self.start_seconds: float | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self._port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self._directory / _LOG_FILE

    @property
    def data_dir(self) -> Path:
        return self._directory / "data"

    def __repr__(self) -> str:
        return f"KafkaBroker(bootstrap={self.bootstrap!r}, pid={self.pid})"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Format the log directory if new, start the broker, and return once it logged that it
        started (registered and unfenced: it serves produce, fetch and groups). Raises
        :class:`KafkaError` with the end of its log if it exits or does not start in time."""
        if self.running:
            raise KafkaError(f"broker already running (pid {self.pid})")
        self._reap()
        lib = resolve_classpath()
        self._directory.mkdir(parents=True, exist_ok=True)
        (self._directory / "log4j2.properties").write_text(_LOG4J)
        began = time.monotonic()
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self._write_properties()
            if not (self.data_dir / "meta.properties").exists():
                self._format(lib)
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._spawn(lib)
            try:
                self._wait_ready(offset, began + self._start_timeout_s)
            except PortTaken:
                self._kill_now()
                if self._ports_fixed or attempt == _PORT_ATTEMPTS:
                    raise KafkaError(f"broker could not listen on {self.bootstrap} or {self._controller_port}: "
                                     f"port in use. Log {self.log_path}:\n{self.log_tail()}") from None
                self._port, self._controller_port = free_port(), free_port()
                continue
            except BaseException:
                self._kill_now()
                raise
            break
        self._ports_fixed = True  # a restart comes back on the same address
        self.start_seconds = time.monotonic() - began
        logger.info("kafka broker up on %s (pid %s) in %.1f s", self.bootstrap, self.pid, self.start_seconds)

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL after ``stop_timeout_s``. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        terminate(proc, self._stop_timeout_s, "kafka")
        logger.info("kafka broker on %s stopped (exit code %s)", self.bootstrap, proc.returncode)
        self._reap()
        self._keep_archive()

    def _keep_archive(self) -> None:
        """The class-data archive the JVM wrote as it exited becomes the one later brokers map
        (a rename: brokers of other sessions may be starting now)."""
        dumped, self._dumping = self._dumping, None
        if dumped is None or not dumped.exists():
            return
        final = dumped.with_name(dumped.name.split(".jsa.", 1)[0] + ".jsa")
        if final.exists():
            dumped.unlink()
        else:
            dumped.rename(final)
            logger.info("kafka's class-data archive saved in %s: later brokers start in about half the CPU", final)

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def tool_command(self, main: str, *args: str) -> list[str]:
        """The command line of one of Kafka's own tools, the Java class ``main`` (for example
        ``org.apache.kafka.tools.ConsoleProducer``, what ``kafka-console-producer.sh`` runs) with
        ``args``, on this broker's class path and JVM options; it logs to stdout."""
        return self._java(resolve_classpath(), main, *args)

    def batch_codecs(self, topic: str, partition: int = 0) -> list[str]:
        """The codec of each record batch of ``topic``'s ``partition`` as this broker stored it,
        read from its log segments (a v2 batch header's attributes, bits 0-2: Kafka's
        CompressionType ids)."""
        codecs: list[str] = []
        for segment in sorted((self.data_dir / f"{topic}-{partition}").glob("*.log")):
            data = segment.read_bytes()
            at = 0
            while at + _BATCH_HEADER <= len(data):
                (length,) = struct.unpack_from(">i", data, at + 8)  # after the base offset
                magic = data[at + 16]
                (attributes,) = struct.unpack_from(">h", data, at + 21)  # after epoch, magic, crc
                if length <= 0 or magic != 2:
                    raise KafkaError(f"{segment}: no v2 record batch at byte {at} (length {length}, magic {magic})")
                codecs.append(_CODEC_IDS[attributes & 7] if attributes & 7 < len(_CODEC_IDS) else f"unknown {attributes & 7}")
                at += 12 + length
        return codecs

    # ------------------------------------------------------------------ internals

    def _write_properties(self) -> None:
        props = {
            **BROKER_SETTINGS,
            "controller.quorum.voters": f"1@127.0.0.1:{self._controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self._port},CONTROLLER://127.0.0.1:{self._controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self._port}",
            "log.dirs": str(self.data_dir),
            **self._settings,
        }
        text = "".join(f"{k}={v}\n" for k, v in props.items())
        (self._directory / "server.properties").write_text(text)

    def _java(self, lib: Path, main: str, *args: str, dump: bool = False) -> list[str]:
        """The JVM's command line. It maps the class-data archive of an earlier broker when there
        is one; else, with ``dump``, it writes one when it exits (see :meth:`stop`)."""
        java = shutil.which("java")
        if java is None:
            raise KafkaError("java is not on PATH (Kafka needs Java 17; ./dev installs it)")
        archive = _class_archive(java, lib)
        cds: list[str] = []
        if archive.exists():
            cds = [f"-XX:SharedArchiveFile={archive}"]
        elif dump:
            self._dumping = archive.with_name(f"{archive.name}.{os.getpid()}.{id(self)}")
            cds = [f"-XX:ArchiveClassesAtExit={self._dumping}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
        # C1 only: a third of the start's CPU; the tests' traffic is small (benchmarks pass False)
        jit = ["-XX:TieredStopAtLevel=1"] if self._quick_start else []
        classpath = ":".join(str(p) for p in sorted(lib.glob("*.jar")))  # fixed order, as the archive needs
        return [java, f"-Xmx{self._heap}", "-XX:+UseSerialGC", *jit, *cds,
                f"-Dlog4j2.configurationFile={self._directory / 'log4j2.properties'}",
                "-cp", classpath, main, *args]

    def _format(self, lib: Path) -> None:
        cmd = self._java(lib, "kafka.tools.StorageTool", "format", "-t", _cluster_id(),
                         "-c", str(self._directory / "server.properties"))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=self._start_timeout_s, check=False)
        if done.returncode != 0:
            raise KafkaError(f"kafka-storage format of {self.data_dir} failed (exit {done.returncode}):\n"
                             f"{(done.stdout + done.stderr)[-3000:]}")

    def _spawn(self, lib: Path) -> None:
        self._log_handle = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self._java(lib, "kafka.Kafka", str(self._directory / "server.properties"), dump=True),
            stdin=subprocess.DEVNULL, stdout=self._log_handle, stderr=subprocess.STDOUT,
            cwd=self._directory, preexec_fn=_die_with_parent_hook(),
        )

    def _wait_ready(self, offset: int, deadline: float) -> None:
        assert self._proc is not None
        while True:
            text = self._log_since(offset)
            if _READY_LINE in text:
                return
            if _PORT_TAKEN in text:
                raise PortTaken
            code = self._proc.poll()
            if code is not None:
                raise KafkaError(f"kafka exited with code {code} while starting. Log {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise KafkaError(f"kafka did not start within {self._start_timeout_s:.0f} s. "
                                 f"Log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.kafka_broker", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("resolve", help="fetch Kafka's jars into the cache (nothing to do when it is full); print the directory")
    serve = sub.add_parser("serve", help="run one broker until interrupted; print its bootstrap address")
    serve.add_argument("--dir", type=Path, default=None, help="its directory (default: a new temporary one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "resolve":
        print(resolve_classpath())
        return 0
    import tempfile

    directory = args.dir or Path(tempfile.mkdtemp(prefix="icesink-kafka-"))
    broker = KafkaBroker(directory, heap="1g", quick_start=False)  # full JIT for benchmarks
    broker.start()
    print(broker.bootstrap, flush=True)
    try:
        # blocked only now: the JVM, forked before, must not inherit the mask
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        broker.stop()
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
