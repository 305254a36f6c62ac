"""Worker replicas as separate processes on this host: used by the demo, tests and benchmarks.

Each replica is ``python -m icesink worker --config FILE`` with its own metrics port and
worker id given through ``ICESINK_*`` environment variables, logging to its own file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from icesink.app.embedded import _die_with_parent_hook, free_port


def write_fast_config(
    path: Path, *, topics: str, tables: str, bootstrap: str, catalog_name: str,
    catalog_props: Mapping[str, str], state_dir: Path, group: str, **extra: Any,
) -> Path:
    """A worker config for short-lived local groups (fault tests, chaos runs): 2 s rounds,
    6 s sessions, 15 s shutdown bound, a small Spark. ``extra`` keys override."""
    config = {
        "topics": topics,
        "iceberg.tables": tables,
        "iceberg.catalog": catalog_name,
        **{f"iceberg.catalog.{k}": v for k, v in catalog_props.items()},
        "iceberg.tables.auto-create-enabled": "true",
        "iceberg.control.topic": f"{group}-control",
        "iceberg.control.commit.interval-ms": 2000,
        "iceberg.control.commit.timeout-ms": 15000,
        "consumer.session-timeout-ms": 6000,
        "group.id": group,
        "bootstrap.servers": bootstrap,
        "spark.master": "local[1]",
        "spark.driver.memory": "1g",
        "shutdown.timeout-ms": 15000,
        "state.dir": str(state_dir),
        **extra,
    }
    path.write_text(json.dumps(config))
    return path


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int
    log_handle: IO[bytes] = field(repr=False)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class ReplicaSet:
    def __init__(self, config: Path, directory: Path, env: Mapping[str, str] | None = None, *,
                 inherit_settings: bool = True) -> None:
        self.config = config
        self.inherit_settings = inherit_settings
        self.directory = directory
        self.env = dict(env or {})
        self.replicas: dict[str, Replica] = {}
        self._count = 0

    def start(self, name: str | None = None, extra_env: Mapping[str, str] | None = None,
              config: Path | None = None) -> Replica:
        """Start a replica with the set's config file (or ``config``). Unless the set was made
        with ``inherit_settings=False``, it also reads this process's ``ICESINK_*`` variables."""
        self._count += 1
        name = name or f"w{self._count}"
        port = free_port()
        log_path = self.directory / f"{name}.log"
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = log_path.open("ab")
        inherited = {k: v for k, v in os.environ.items() if self.inherit_settings or not k.startswith("ICESINK_")}
        env = {**inherited, **self.env, **(extra_env or {}),
               "ICESINK_METRICS_PORT": str(port), "ICESINK_WORKER_ID": name}
        proc = subprocess.Popen(
            [sys.executable, "-m", "icesink", "worker", "--config", str(config or self.config)],
            stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=_die_with_parent_hook(),  # never outlive the test or demo that started it
        )
        replica = Replica(name, proc, log_path, port, handle)
        self.replicas[name] = replica
        return replica

    def stop(self, name: str, timeout_s: float = 60.0) -> int:
        """Graceful stop (SIGTERM); SIGKILL only if it does not stop in time."""
        r = self.replicas.pop(name)
        if r.alive:
            r.proc.send_signal(signal.SIGTERM)
            try:
                r.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(r.proc.pid, signal.SIGKILL)
                r.proc.wait()
        r.log_handle.close()
        return int(r.proc.returncode)

    def kill(self, name: str) -> None:
        r = self.replicas.pop(name)
        if r.alive:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()
        r.log_handle.close()

    def stop_all(self, timeout_s: float = 60.0) -> None:
        names = list(self.replicas)
        for n in names:
            if self.replicas[n].alive:
                self.replicas[n].proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for n in names:
            r = self.replicas[n]
            try:
                r.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(r.proc.pid, signal.SIGKILL)
                r.proc.wait()
            r.log_handle.close()
        self.replicas.clear()

    def check_alive(self) -> None:
        for r in self.replicas.values():
            if not r.alive:
                tail = r.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"replica {r.name} exited with {r.proc.returncode}:\n{tail}")
