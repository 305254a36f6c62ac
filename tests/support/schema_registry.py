"""A real schema-registry server (the Confluent Schema Registry REST API) for the tests: AxonOps
Schema Registry, an Apache-2.0 server written in Go, run as a child process on a loopback port.

It is a Go module on the Go module proxy. :func:`resolve_binary` downloads it there (``go mod
download``, checked against the checksum database like any module) and builds its
``cmd/schema-registry`` with the machine's Go into ``$XDG_CACHE_HOME/icesink/schema-registry-<version>/bin``
(default ``~/.cache/icesink``; Go's own module and build caches under ``~/go`` and
``~/.cache/go-build``). The first build takes about two minutes on two cores; afterwards it only checks a
stamp file. ``.ci/run`` calls it before the suite (``python3 -m tests.support.schema_registry resolve``);
a test that finds no binary builds it itself. No code of the server is in this repository.

:class:`SchemaRegistry` starts the binary with in-memory storage (everything is lost when it stops)
and basic auth on: a bootstrap super-admin user from the environment, every request but ``GET /``
needing it (what a client sets with ``basic.auth.user.info``). ``docs/schema-registry.md`` says what
it supports and which other servers were tried and why they failed.

``python -m tests.support.schema_registry serve`` runs one until interrupted and prints its URL and
credentials.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any


from icesink.app.embedded import _die_with_parent_hook, free_port
from tests.support.logged_process import LoggedProcess, PortTaken, terminate

logger = logging.getLogger(__name__)

MODULE = "github.com/axonops/axonops-schema-registry"
#: The one version of the module the Go module proxy serves here (it refuses v0.2.0 and the v0.3/v0.4 tags).
VERSION = "v0.2.1"
_STAMP = "built"
_LOG_FILE = "schema-registry.log"
_PORT_TAKEN = "address already in use"
_PORT_ATTEMPTS = 3
_GO_CANDIDATES = ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")


class SchemaRegistryError(RuntimeError):
    """The server could not be built, or did not start."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "icesink"


def registry_home(version: str = VERSION) -> Path:
    return cache_root() / f"schema-registry-{version}"


def _go() -> str:
    found = shutil.which("go") or next((p for p in _GO_CANDIDATES if Path(p).is_file()), None)
    if found is None:
        raise SchemaRegistryError(
            "go (the Go toolchain, 1.26 or newer) is not on PATH nor in /usr/local/go/bin: it builds the "
            f"schema registry ({MODULE}@{VERSION}) from the Go module proxy")
    return found


def _run_go(go: str, args: list[str], cwd: Path | None, timeout_s: float) -> str:
    env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false", "CGO_ENABLED": "0"}
    cmd = [go, *args]
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SchemaRegistryError(f"{' '.join(cmd)}: no result within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise SchemaRegistryError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def resolve_binary(version: str = VERSION, *, timeout_s: float = 900.0) -> Path:
    """The server's binary, built from ``MODULE@version`` unless a previous run did (a stamp file
    says it finished). Safe to call from several processes at once (a lock file)."""
    home = registry_home(version)
    binary = home / "bin" / "schema-registry"
    if (home / _STAMP).exists() and binary.is_file():
        return binary
    home.mkdir(parents=True, exist_ok=True)
    with (home / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / _STAMP).exists() and binary.is_file():
            return binary
        go = _go()
        began = time.monotonic()
        # `go install MODULE/cmd/...@VERSION` would ask the proxy for the module's version list, which
        # it refuses (403); download the pinned version and build inside it instead.
        info = json.loads(_run_go(go, ["mod", "download", "-json", f"{MODULE}@{version}"], None, timeout_s))
        source = Path(info["Dir"])
        partial = home / "bin" / "schema-registry.partial"
        partial.parent.mkdir(exist_ok=True)
        _run_go(go, ["build", "-trimpath", "-ldflags", f"-X main.version={version}", "-o", str(partial),
                     "./cmd/schema-registry"], source, timeout_s)
        partial.rename(binary)
        (home / _STAMP).write_text(f"{MODULE}@{version} {info.get('Sum', '')}\n")
        logger.info("schema registry %s built into %s in %.1f s", version, binary, time.monotonic() - began)
    return binary


class SchemaRegistry(LoggedProcess):
    """One AxonOps Schema Registry process on ``127.0.0.1:<free port>`` with in-memory storage.

    ``directory`` holds its ``config.yaml`` and its log (``schema-registry.log``, JSON lines, one
    per request). With ``auth`` (the default) every API call needs basic auth as :attr:`user` /
    :attr:`password` (a bootstrap super-admin; the password is random per instance unless given).
    The process gets SIGKILL when the thread that started it exits.
    """

    def __init__(self, directory: str | os.PathLike[str], *, auth: bool = True, user: str = "icesink",
                 password: str | None = None, start_timeout_s: float = 30.0, stop_timeout_s: float = 10.0) -> None:
        self._directory = Path(directory)
        self._auth = auth
        self.user = user
        self.password = password or secrets.token_urlsafe(16)
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_handle: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def auth(self) -> bool:
        return self._auth

    @property
    def user_info(self) -> str:
        """The value of a client's ``basic.auth.user.info``."""
        return f"{self.user}:{self.password}"

    def client_config(self) -> dict[str, str]:
        """A confluent-kafka ``SchemaRegistryClient`` configuration for this server."""
        conf = {"url": self.url}
        if self._auth:
            conf["basic.auth.user.info"] = self.user_info
        return conf

    @property
    def log_path(self) -> Path:
        return self._directory / _LOG_FILE

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        return f"SchemaRegistry(url={self.url!r}, auth={self._auth})"

    def start(self) -> None:
        """Start the server and return once ``GET /`` answers 200; raises
        :class:`SchemaRegistryError` with the end of its log if it exits or does not answer in time."""
        if self.running:
            raise SchemaRegistryError(f"schema registry already running at {self.url}")
        binary = resolve_binary()
        self._directory.mkdir(parents=True, exist_ok=True)
        def spawn() -> None:
            self._write_config()  # names the port
            self._spawn(binary)

        self._start_on_a_free_port(
            spawn,
            lambda offset: self._wait_ready(offset, time.monotonic() + self._start_timeout_s),
            self._next_port,
            lambda: SchemaRegistryError(f"schema registry could not listen on {self.url}: port in use. "
                                        f"Log {self.log_path}:\n{self.log_tail()}"),
            _PORT_ATTEMPTS)
        logger.info("schema registry up at %s", self.url)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout_s``. Idempotent."""
        if self._proc is not None:
            terminate(self._proc, self._stop_timeout_s, "schema registry")
        self._reap()

    def __enter__(self) -> SchemaRegistry:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def get(self, path: str, *, auth: bool = True) -> tuple[int, Any]:
        """``GET path`` on the server (with this instance's credentials unless ``auth`` is false):
        the status and the decoded JSON body (the text when it is not JSON)."""
        request = urllib.request.Request(self.url + path, headers={"Accept": "application/vnd.schemaregistry.v1+json"})
        if auth and self._auth:
            token = base64.b64encode(self.user_info.encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body.decode(errors="replace")

    # ------------------------------------------------------------------ internals

    def _write_config(self) -> None:
        # JSON is YAML: the server reads this with its YAML loader.
        config: dict[str, Any] = {
            "server": {"host": "127.0.0.1", "port": self._port},
            "storage": {"type": "memory"},
            "compatibility": {"default_level": "BACKWARD"},
            "logging": {"level": "info", "format": "json"},
            "security": {"auth": {"enabled": self._auth, "methods": ["basic"], "bootstrap": {"enabled": self._auth},
                                  "rbac": {"enabled": self._auth, "default_role": "readonly"}}},
        }
        (self._directory / "config.yaml").write_text(json.dumps(config, indent=2) + "\n")

    def _next_port(self) -> None:
        self._port = free_port()

    def _spawn(self, binary: Path) -> None:
        # Only these variables: the server reads every SCHEMA_REGISTRY_* of its environment as config.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
        if self._auth:
            env["SCHEMA_REGISTRY_BOOTSTRAP_USERNAME"] = self.user
            env["SCHEMA_REGISTRY_BOOTSTRAP_PASSWORD"] = self.password
        self._log_handle = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            [str(binary), "-config", str(self._directory / "config.yaml")],
            stdin=subprocess.DEVNULL, stdout=self._log_handle, stderr=subprocess.STDOUT, env=env,
            cwd=self._directory, preexec_fn=_die_with_parent_hook(),
        )

    def _wait_ready(self, offset: int, deadline: float) -> None:
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            if _PORT_TAKEN in self._log_since(offset).lower():
                raise PortTaken
            if code is not None:
                raise SchemaRegistryError(f"schema registry exited with code {code} while starting. "
                                          f"Log {self.log_path}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise SchemaRegistryError(f"schema registry did not answer at {self.url} within "
                                          f"{self._start_timeout_s:.0f} s. Log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.schema_registry",
                                     description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("resolve", help=f"build {MODULE}@{VERSION} into the cache (nothing to do once there); print the binary")
    serve = sub.add_parser("serve", help="run one server until interrupted; print its URL and credentials")
    serve.add_argument("--dir", type=Path, default=None, help="its directory (default: a new temporary one)")
    serve.add_argument("--no-auth", action="store_true", help="serve without basic auth")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "resolve":
        print(resolve_binary())
        return 0
    import tempfile

    directory = args.dir or Path(tempfile.mkdtemp(prefix="icesink-schema-registry-"))
    with SchemaRegistry(directory, auth=not args.no_auth) as server:
        print(server.url, server.user_info if server.auth else "(no auth)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
