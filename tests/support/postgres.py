"""A private PostgreSQL server for tests, from Debian's ``postgresql`` package (``./dev test``
installs it when missing): its own data directory and a free loopback port, trust auth, user
``icesink``. As root the server runs as the ``postgres`` system user, as PostgreSQL requires.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from icesink.app.embedded import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise FileNotFoundError(
            f"PostgreSQL's {name}: expected /usr/lib/postgresql/<version>/bin/{name}, found none; "
            "install Debian's postgresql package (./dev test does)"
        )
    return found[-1]


class PostgresServer:
    def __init__(self, logical: bool = False) -> None:
        """``logical``: ``wal_level=logical`` with replication slots, a CDC source (Debezium's
        pgoutput); the ``icesink`` user is a superuser, so it may replicate."""
        self.root = Path(tempfile.mkdtemp(prefix="icesink-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = free_port()
        self.logical = logical
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(_bin("initdb"), "-D", str(self.data), "-U", "icesink", "--auth=trust", "-E", "UTF8")

    @property
    def uri(self) -> str:
        return f"postgresql+psycopg2://icesink@127.0.0.1:{self.port}/postgres"

    def _run(self, *cmd: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self._as_postgres else []
        subprocess.run(prefix + list(cmd), check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        if self.logical:
            opts += " -c wal_level=logical -c max_replication_slots=8 -c max_wal_senders=8"
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                  "-o", opts, "start")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if subprocess.run([_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                              capture_output=True).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"PostgreSQL on port {self.port} not ready; log {self.root / 'server.log'}")

    def stop(self, mode: str = "fast") -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
