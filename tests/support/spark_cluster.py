"""Spark processes for tests, started from the pyspark wheel (its ``bin/`` and ``jars/``): a
standalone cluster (one master, one worker) on free loopback ports, and helpers shared with
the Spark Connect server fixture.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from icesink.app.embedded import free_port


def spark_home() -> str:
    """The pyspark package directory, which is a SPARK_HOME (bin/spark-class, jars/)."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return f"--- {path} ---\n{path.read_text(errors='replace')[-chars:]}"
    except OSError as e:
        return f"--- {path}: {e} ---"


def stop_group(process: subprocess.Popen[Any], timeout: float = 30) -> None:
    """End a process started with start_new_session=True and everything left in its group
    (a worker's executors): SIGTERM, up to ``timeout`` for the leader to exit, then SIGKILL."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is empty
        pass
    process.wait(timeout=timeout)


def stop_classic_spark() -> None:
    """Stop this process's classic SparkContext, if any: a JVM holds one, with one master."""
    from pyspark.core.context import SparkContext
    from pyspark.sql.session import SparkSession

    session = SparkSession._instantiatedSession
    if session is not None:
        session.stop()
    context = SparkContext._active_spark_context
    if context is not None:
        context.stop()


class SparkStandalone:
    """``spark-class ...Master`` and one ``...Worker`` (1 core, 1 GiB for executors), on loopback."""

    def __init__(self, directory: Path, *, start_timeout: float = 90) -> None:
        self.directory = directory
        self.start_timeout = start_timeout
        self.port = free_port()
        self.webui_port = free_port()
        self.worker_webui_port = free_port()
        self.master_log = directory / "master.log"
        self.worker_log = directory / "worker.log"
        self.work_dir = directory / "work"
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def logs(self) -> str:
        executor_logs = sorted(self.work_dir.glob("*/*/stderr"))
        return "\n".join(log_tail(p) for p in [self.master_log, self.worker_log, *executor_logs])

    def _spawn(self, log_path: Path, *args: str) -> None:
        home = spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": home,
            "SPARK_LOCAL_IP": "127.0.0.1",  # master, worker and executors bind and advertise loopback
            "SPARK_DAEMON_MEMORY": "256m",  # master and worker heaps; executors get spark.executor.memory
        }
        with open(log_path, "ab") as log:
            # Own process group: stop_group also ends the executors the worker started.
            self.processes.append(
                subprocess.Popen(
                    [os.path.join(home, "bin", "spark-class"), *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def master_state(self) -> dict[str, Any] | None:
        """The master web UI's JSON (workers, aliveworkers, activeapps...), None if not up yet."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=2) as response:
                state: dict[str, Any] = json.load(response)
                return state
        except (OSError, ValueError):
            return None

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(
            self.master_log, "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.webui_port),
        )
        self._spawn(
            self.worker_log, "org.apache.spark.deploy.worker.Worker", self.url,
            "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
            "--webui-port", str(self.worker_webui_port), "--work-dir", str(self.work_dir),
        )
        deadline = time.monotonic() + self.start_timeout
        while True:
            for name, process in zip(("master", "worker"), self.processes, strict=True):
                if process.poll() is not None:
                    raise RuntimeError(f"Spark {name} exited with {process.returncode}:\n{self.logs()}")
            state = self.master_state()
            if state is not None and state.get("aliveworkers", 0) >= 1:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no Spark worker registered with {self.url} within {self.start_timeout:.0f} s "
                    f"(master state {state}):\n{self.logs()}"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        # Worker first: it stops its executors; then the master.
        for process in reversed(self.processes):
            stop_group(process)
        self.processes.clear()
