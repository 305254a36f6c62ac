"""One Spark for every task of an ``icesink connect`` process (``connect.spark.shared=true``).

Each task is a worker replica; alone, each would start its own local Spark JVM (0.7-1.6 GB).
Shared, the connect process starts one local Spark Connect server
(``org.apache.spark.sql.connect.service.SparkConnectServer`` from pyspark's own jars, through
``spark-submit``) with the conf a local session gets (spark_bridge/session.py
``startup_conf``: driver memory, icesink's local file system jar, the JVM options, the SQL
confs) built from the process's ``spark.*`` task defaults, and hands every task ``spark.remote``
pointing at it instead of those defaults. Each task then has its own Spark Connect session (its
own runtime confs) in the one JVM. A connector whose own config sets ``spark.master`` or
``spark.remote`` keeps its own Spark, as it asked.

Security: the server binds 127.0.0.1 only, and requires a random token
(``SPARK_CONNECT_AUTHENTICATE_TOKEN`` in its environment, never on its command line) that the
tasks get inside their ``spark.remote`` URL (``sc://localhost:PORT/;token=...``), in their
config file (mode 0600); every log redactor masks a URL's token, and nothing logs the URL.

The process serves its API while the server's JVM starts; a task that uses the shared Spark is
started once the server listens (until then it is not yet started, so UNASSIGNED).

Supervision: a server that exits (also during its start-up) is started again on the same port and token after a capped
backoff (1 s, doubling, at most a minute; back to 1 s once it ran for a minute), counted in
``icesink_connect_spark_restarts_total`` and ``icesink_connect_spark_up``, logged with the end of
its log. Meanwhile the tasks' writes fail and are retried by their write-failure path
(agents/write_failures.py: buffered data kept, a round not answered is answered by a later one);
a session the restarted server does not know is replaced by a new one
(spark_bridge/session.py). A task whose writes keep failing past ``write.failure-limit`` stops
loudly, as any replica does: never silently for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from icesink.app.embedded import _die_with_parent_hook, free_port

log = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: Keys of a connector's own config that give it its own Spark instead of the shared one.
OWN_SPARK_KEYS = ("spark.master", "spark.remote")
_BACKOFF_S, _MAX_BACKOFF_S, _STEADY_S = 1.0, 60.0, 60.0


def server_conf(defaults: Mapping[str, Any]) -> dict[str, str]:
    """The shared server's startup conf: what a local session would start with (ours, then the
    process's ``spark.*`` defaults), bound to loopback."""
    from spark_bridge.session import SparkSessionOwner, SparkSettings

    master = str(defaults.get("spark.master", "local[*]"))
    conf = {k: str(v) for k, v in defaults.items() if k.startswith("spark.") and k not in OWN_SPARK_KEYS}
    out = SparkSessionOwner(SparkSettings(master=master, conf=conf)).startup_conf()
    out.update({"spark.master": master, "spark.connect.grpc.binding.address": "127.0.0.1"})
    return out


class SharedSpark:
    """The connect process's Spark Connect server: started, watched, restarted, stopped."""

    def __init__(self, defaults: Mapping[str, Any], directory: Path) -> None:
        self.conf = server_conf(defaults)
        self.directory = directory
        self.port = 0
        self._token = secrets.token_urlsafe(32)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.restarts = 0
        self.started_at = 0.0
        self._backoff_s = _BACKOFF_S
        self._stopping = False
        self.ready = False  # it listens (watch() saw it)

    @property
    def log_path(self) -> Path:
        return self.directory / "spark-connect.log"

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def remote(self) -> str:
        """The tasks' ``spark.remote`` (a secret: it holds the token). ``localhost``, not an
        address: pyspark sends a token without TLS only to a host of that name."""
        return f"sc://localhost:{self.port}/;token={self._token}"

    def task_config(self, config: dict[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
        """A task's config with the shared Spark: the process's ``spark.*`` defaults (the
        server's) replaced by ``spark.remote``; the connector's own ``spark.*`` keys stay (they
        must be runtime confs). ``config`` unchanged when the connector chose its own Spark."""
        if any(k in own for k in OWN_SPARK_KEYS):
            return config
        out = {k: v for k, v in config.items() if not k.startswith("spark.") or k in own}
        out["spark.remote"] = self.remote()
        return out

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server's JVM; :meth:`watch` says when it listens (:attr:`ready`)."""
        self.port = self.port or free_port()
        self._spawn()

    def waits(self, own: Mapping[str, Any]) -> bool:
        """Whether a task of a connector with config ``own`` must wait to start: it uses the
        shared Spark, which does not listen yet (starting, or starting again)."""
        return not self.ready and not any(k in own for k in OWN_SPARK_KEYS)

    def _spawn(self) -> None:
        from pyspark.find_spark_home import _find_spark_home

        home = os.environ.get("SPARK_HOME") or _find_spark_home()
        self.directory.mkdir(parents=True, exist_ok=True)
        props = self.directory / "spark-connect.properties"
        props.touch(mode=0o600)
        lines = [f"{k}={_escape(v)}" for k, v in {**self.conf, "spark.connect.grpc.binding.port": str(self.port)}.items()]
        props.write_text("\n".join(lines) + "\n")
        if self._log is not None:
            self._log.close()
        self._log = self.log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
        env.update({"SPARK_HOME": home, "SPARK_CONNECT_AUTHENTICATE_TOKEN": self._token})
        # spark-submit execs the JVM: the server is this process's child, and dies with it.
        self.proc = subprocess.Popen(
            [os.path.join(home, "bin", "spark-submit"), "--class", SERVER_CLASS, "--properties-file", str(props),
             "spark-internal"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            preexec_fn=_die_with_parent_hook(),
        )
        self.started_at = time.monotonic()

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-3000:]
        return ""

    async def watch(self) -> None:
        """Note when the server listens; start it again whenever it exits (capped backoff).
        Runs until cancelled."""
        while not self._stopping:
            if self.up:
                if not self.ready and await asyncio.to_thread(_listens, self.port):
                    self.ready = True
                    log.info("shared Spark Connect server runs on 127.0.0.1:%d (pid %d, master %s, up in %.1f s): "
                             "every task without its own spark.master uses it", self.port,
                             self.proc.pid if self.proc else 0, self.conf["spark.master"],
                             time.monotonic() - self.started_at)
                if self.ready and time.monotonic() - self.started_at > _STEADY_S:
                    self._backoff_s = _BACKOFF_S
                await asyncio.sleep(0.5)
                continue
            self.ready = False
            code = self.proc.returncode if self.proc else None
            log.warning("the shared Spark Connect server exited with code %s; starting it again in %.0f s (the "
                        "tasks' writes fail and are retried meanwhile). The end of its log:\n%s", code,
                        self._backoff_s, self._tail())
            await asyncio.sleep(self._backoff_s)
            self._backoff_s = min(self._backoff_s * 2, _MAX_BACKOFF_S)
            self.restarts += 1
            try:
                self.start()  # on the event loop's thread: the die-with-parent signal is tied to the forking thread
            except Exception:  # noqa: BLE001 - logged; the next pass tries again after the backoff
                log.exception("the shared Spark Connect server could not be started again (attempt %d)", self.restarts)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server (after the tasks: they may still be writing)."""
        self._stopping = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout_s)
            except TimeoutError:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        if self._log is not None:
            self._log.close()


def _escape(value: str) -> str:
    """A Java properties value: backslashes and line ends escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False
