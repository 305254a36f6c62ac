"""A second real schema-registry server for the tests, Apicurio Registry 2.4.2 (Apache-2.0, Java,
Quarkus), and its Java serializer (issue 36 point 7): Avro produced by Apicurio's own
``AvroKafkaSerializer`` in Confluent's wire format, read by icesink through Apicurio's
Confluent-compatible API (``/apis/ccompat/v6``).

Everything comes from Maven Central and is built by :func:`resolve` into
``$XDG_CACHE_HOME/icesink/apicurio-<digest of the inputs>`` (default ``~/.cache/icesink``):

- ``tests/support/maven/apicurio-config-index-deployment``: the one build-time piece of the server
  that Central lacks (a Quarkus build step, one class copied from Apicurio's sources), installed
  into the local Maven repository (``mvn install``) under the coordinates Quarkus asks for;
- ``tests/support/maven/apicurio-registry``: Quarkus's build of the published application jar
  (``io.apicurio:apicurio-registry-app``) into a runnable ``apicurio-registry-1-runner.jar``
  beside its ``lib/`` (``mvn package``);
- ``tests/support/maven/apicurio-serdes``: the serializers' class path (Avro, JSON Schema), and
  ``tests/support/java/ApicurioProduce.java`` compiled against it with ``javac``.

Newer releases do not resolve there (docs/schema-registry.md, "What was tried and failed"). The
first build takes about two minutes on two cores; afterwards it only checks a stamp file.
``./dev chaos`` (so ``.ci/run``) calls it before the chaos suite (``python3 -m
tests.support.apicurio resolve``); a test that finds no build makes it.

:class:`ApicurioRegistry` runs the server with its default storage, H2 in memory (everything is
lost when it stops), no authentication, on a free loopback port. ``python -m tests.support.apicurio
serve`` runs one until interrupted and prints its URL.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from icesink.app.embedded import _die_with_parent_hook, free_port
from tests.support.logged_process import LoggedProcess, PortTaken, terminate

logger = logging.getLogger(__name__)

_SUPPORT = Path(__file__).resolve().parent
SHIM = _SUPPORT / "maven" / "apicurio-config-index-deployment"
APP_POM = _SUPPORT / "maven" / "apicurio-registry" / "pom.xml"
SERDES_POM = _SUPPORT / "maven" / "apicurio-serdes" / "pom.xml"
PRODUCER = _SUPPORT / "java" / "ApicurioProduce.java"
_STAMP = "built"
_LOG_FILE = "apicurio-registry.log"
_PORT_ATTEMPTS = 3
#: Quarkus's words when its HTTP port is taken.
_PORT_TAKEN = ("already in use", "seems to be in use")


class ApicurioError(RuntimeError):
    """The server or the producer could not be built, did not start, or failed."""


@dataclass(frozen=True)
class Build:
    """What :func:`resolve` made."""

    home: Path

    @property
    def runner(self) -> Path:
        return self.home / "app" / "target" / "apicurio-registry-1-runner.jar"

    @property
    def serdes(self) -> Path:
        return self.home / "serdes"

    @property
    def classes(self) -> Path:
        return self.home / "classes"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "icesink"


def _inputs() -> list[Path]:
    return [*sorted(p for p in SHIM.rglob("*") if p.is_file()), APP_POM, SERDES_POM, PRODUCER]


def apicurio_home() -> Path:
    """The cache directory of this build: its name carries a digest of every input file."""
    digest = hashlib.sha256()
    for path in _inputs():
        digest.update(path.relative_to(_SUPPORT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return cache_root() / f"apicurio-{digest.hexdigest()[:16]}"


def _tool(name: str, why: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ApicurioError(f"{name} is not on PATH: {why} (./dev test installs Maven; Java 17 comes with it)")
    return found


def _run(cmd: list[str], cwd: Path | None, timeout_s: float) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ApicurioError(f"{' '.join(cmd)}: no result within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise ApicurioError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    return done.stdout


def resolve(*, timeout_s: float = 1200.0) -> Build:
    """The server's runner jar, the serializer's class path and the compiled producer, built unless
    a previous run did (a stamp file says it finished). Safe to call from several processes at
    once (a lock file)."""
    build = Build(apicurio_home())
    if (build.home / _STAMP).exists():
        return build
    mvn = _tool("mvn", "it builds Apicurio Registry from Maven Central")
    javac = _tool("javac", "it compiles the Java producer")
    build.home.mkdir(parents=True, exist_ok=True)
    with (build.home / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (build.home / _STAMP).exists():
            return build
        began = time.monotonic()
        # mvn writes target/ beside the pom: build copies inside the cache, never in the tree
        for name, source in (("shim", SHIM), ("app", APP_POM.parent)):
            shutil.rmtree(build.home / name, ignore_errors=True)
            shutil.copytree(source, build.home / name)
        _run([mvn, "-q", "-B", "install"], build.home / "shim", timeout_s)
        _run([mvn, "-q", "-B", "package"], build.home / "app", timeout_s)
        if not build.runner.is_file():
            raise ApicurioError(f"mvn package in {build.home / 'app'} made no {build.runner.name}")
        partial = build.home / "serdes.partial"
        shutil.rmtree(partial, ignore_errors=True)
        _run([mvn, "-q", "-B", "-f", str(SERDES_POM), "dependency:copy-dependencies", "-DincludeScope=runtime",
              f"-DoutputDirectory={partial}"], None, timeout_s)
        shutil.rmtree(build.serdes, ignore_errors=True)
        partial.rename(build.serdes)
        shutil.rmtree(build.classes, ignore_errors=True)
        _run([javac, "-d", str(build.classes), "-cp", f"{build.serdes}/*", str(PRODUCER)], None, timeout_s)
        (build.home / _STAMP).write_text(" ".join(sorted(p.name for p in build.serdes.glob("*.jar"))) + "\n")
        logger.info("Apicurio Registry built into %s in %.1f s", build.home, time.monotonic() - began)
    return build


def produce(bootstrap: str, topic: str, registry_url: str, schema_file: Path | None, first: int, count: int,
            *, kind: str = "avro", headers: bool = False, keyed: bool = False,
            timeout_s: float = 120.0) -> list[tuple[int, int]]:
    """Records ``first .. first+count-1`` sent to partition 0 of ``topic`` by ApicurioProduce (the
    Java serializer of ``kind``, avro, json or protobuf, at ``registry_url``, Apicurio's own
    ``/apis/registry/v2``; avro registers ``schema_file``, json finds the latest schema of subject
    ``<topic>-value``, registered beforehand; protobuf registers ``schema_file``, a serialized
    FileDescriptorProto, and writes Apicurio's own frame): their (offset, id) pairs. ``headers``:
    avro and protobuf with Apicurio 2.4's serde defaults, headers on (the global id in record
    headers, the value bare). ``keyed`` (protobuf): the key is the same message, by Apicurio's
    serializer as a key serializer."""
    build = resolve()
    java = _tool("java", "it runs the Java producer")
    out = _run([java, "-cp", f"{build.classes}:{build.serdes}/*", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "ApicurioProduce", kind, bootstrap, topic, registry_url, str(schema_file or "-"), str(first), str(count),
                *(["headers"] if headers else []), *(["keyed"] if keyed else [])],
               None, timeout_s)
    pairs = [tuple(int(x) for x in line.split()) for line in out.splitlines() if line.strip()]
    return [(p[0], p[1]) for p in pairs]


class ApicurioRegistry(LoggedProcess):
    """One Apicurio Registry process on ``127.0.0.1:<free port>``, storage in memory, no auth.

    ``directory`` holds its log (``apicurio-registry.log``). The process gets SIGKILL when the
    thread that started it exits.
    """

    def __init__(self, directory: str | os.PathLike[str], *, start_timeout_s: float = 120.0,
                 stop_timeout_s: float = 15.0) -> None:
        self._directory = Path(directory)
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API: a Confluent client's ``schema.registry.url``."""
        return self.url + "/apis/ccompat/v6"

    @property
    def registry_url(self) -> str:
        """Apicurio's own API, the one its serializers speak (``apicurio.registry.url``)."""
        return self.url + "/apis/registry/v2"

    @property
    def log_path(self) -> Path:
        return self._directory / _LOG_FILE

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        return f"ApicurioRegistry(url={self.url!r})"

    def start(self) -> None:
        """Start the server and return once its Confluent-compatible API answers; raises
        :class:`ApicurioError` with the end of its log if it exits or does not answer in time."""
        if self.running:
            raise ApicurioError(f"Apicurio Registry already running at {self.url}")
        build = resolve()
        java = _tool("java", "it runs Apicurio Registry")
        self._directory.mkdir(parents=True, exist_ok=True)
        self._start_on_a_free_port(
            lambda: self._spawn(java, build),
            lambda offset: self._wait_ready(offset, time.monotonic() + self._start_timeout_s),
            self._next_port,
            lambda: ApicurioError(f"Apicurio Registry could not listen on {self.url}: port in use. "
                                  f"Log {self.log_path}:\n{self.log_tail()}"),
            _PORT_ATTEMPTS)
        logger.info("Apicurio Registry up at %s", self.url)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout_s``. Idempotent."""
        if self._proc is not None:
            terminate(self._proc, self._stop_timeout_s, "Apicurio Registry")
        self._reap()

    def __enter__(self) -> ApicurioRegistry:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _next_port(self) -> None:
        self._port = free_port()

    def _spawn(self, java: str, build: Build) -> None:
        self._log_handle = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            [java, "-Xmx512m", "-XX:TieredStopAtLevel=1", f"-Dquarkus.http.port={self._port}",
             "-Dquarkus.http.host=127.0.0.1", "-Dquarkus.datasource.jdbc.min-size=2",
             "-Dquarkus.datasource.jdbc.initial-size=2", "-jar", str(build.runner)],
            stdin=subprocess.DEVNULL, stdout=self._log_handle, stderr=subprocess.STDOUT,
            cwd=self._directory, preexec_fn=_die_with_parent_hook(),
        )

    def _wait_ready(self, offset: int, deadline: float) -> None:
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            since = self._log_since(offset).lower()
            if any(words in since for words in _PORT_TAKEN):
                raise PortTaken
            if code is not None:
                raise ApicurioError(f"Apicurio Registry exited with code {code} while starting. "
                                    f"Log {self.log_path}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.ccompat_url + "/subjects", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ApicurioError(f"Apicurio Registry did not answer at {self.url} within "
                                    f"{self._start_timeout_s:.0f} s. Log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.apicurio",
                                     description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("resolve", help="build the server, the serializer's class path and the producer into the "
                                   "cache (nothing to do once there); print the directory")
    serve = sub.add_parser("serve", help="run one server until interrupted; print its URL")
    serve.add_argument("--dir", type=Path, default=None, help="its directory (default: a new temporary one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "resolve":
        print(resolve().home)
        return 0
    import tempfile

    directory = args.dir or Path(tempfile.mkdtemp(prefix="icesink-apicurio-"))
    with ApicurioRegistry(directory) as server:
        print(server.url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
