"""Real ``icesink connect`` processes for the integration tests: start one with a config, call
its REST API (http or https, with basic auth or a client certificate), wait for a status."""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ConnectProcess:
    proc: subprocess.Popen[bytes]
    api: int
    metrics: int
    log_path: Path
    scheme: str = "http"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def process_config(tmp_path: Path, bootstrap: str, group: str, **extra: Any) -> dict[str, Any]:
    """A connect process's config for tests: loopback API and metrics on free ports, short
    heartbeats and sessions, and small, quick task defaults (Spark local[1], 15 s shutdowns)."""
    from icesink.app.embedded import free_port

    return {
        "bootstrap.servers": bootstrap, "listeners": f"http://127.0.0.1:{free_port()}",
        "rest.advertised.host.name": "127.0.0.1", "metrics.port": free_port(), "group.id": group,
        "config.storage.topic": f"{group}-configs", "state.dir": str(tmp_path / "state"),
        "heartbeat.interval-ms": 500, "session.timeout-ms": 6000,
        "spark.master": "local[1]", "spark.driver.memory": "1g", "consumer.session-timeout-ms": 6000,
        "shutdown.timeout-ms": 15000, **extra,
    }


def call(port: int, method: str, path: str, body: Any = None, *, host: str = "127.0.0.1", scheme: str = "http",
         auth: tuple[str, str] | None = None, context: ssl.SSLContext | None = None,
         timeout: float = 30) -> tuple[int, Any]:
    """One request (``body``: JSON, or bytes sent as they are); the status and the JSON body
    (None if empty, the text if not JSON)."""
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(f"{scheme}://{host}:{port}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, _body(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _body(exc.read())


def _body(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def start_connect(tmp_path: Path, name: str, config: dict[str, Any], *, env: dict[str, str] | None = None,
                  wait: bool = True, ready: Any = None) -> ConnectProcess:
    """``icesink connect --config <tmp_path/name.json>``, without this process's ICESINK_*
    variables; with ``wait``, until ``ready(process)`` (default: ``GET /`` answers 200)."""
    from icesink.app.embedded import _die_with_parent_hook

    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    log_path = tmp_path / f"{name}.log"
    handle = log_path.open("ab")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ICESINK_")} | (env or {})
    proc = subprocess.Popen([sys.executable, "-m", "icesink", "connect", "--config", str(path)],
                            stdout=handle, stderr=subprocess.STDOUT, env=environ, start_new_session=True,
                            preexec_fn=_die_with_parent_hook())
    listener = str(config.get("listeners", "http://127.0.0.1:8083")).split(",")[0]
    scheme, port = listener.split("://")[0], int(listener.rsplit(":", 1)[1])
    process = ConnectProcess(proc, port, int(config.get("metrics.port", 9400)), log_path, scheme)
    if not wait:
        return process
    check = ready or (lambda p: call(p.api, "GET", "/")[0] == 200)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{process.log[-3000:]}"
        try:
            if check(process):
                return process
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{name} did not serve its API in 60 s:\n{process.log[-3000:]}")


def wait_exit(process: ConnectProcess, timeout_s: float = 60) -> int:
    try:
        return process.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.stop()
        raise AssertionError(f"expected the process to stop, it still ran:\n{process.log[-3000:]}") from None


def wait_status(port: int, name: str, ok: Any, timeout_s: float = 120, **kwargs: Any) -> dict[str, Any]:
    """Poll ``/connectors/{name}/status`` until ``ok(status)``."""
    status: dict[str, Any] = _poll(port, f"/connectors/{name}/status", lambda code, body: code == 200 and ok(body),
                                   f"connector {name}: no status as expected", timeout_s, **kwargs)
    return status


def wait_targets(port: int, n: int, timeout_s: float = 60, **kwargs: Any) -> list[dict[str, Any]]:
    """Poll ``/metrics/targets`` (each answer a 200) until it lists ``n`` target groups. A task
    is listed once its replica's status server says it runs and its process's report has
    reached the answering process through the status topic: seconds after its first rows may
    land."""

    def listed(code: int, groups: Any) -> bool:
        assert code == 200, groups
        return len(groups) == n

    groups: list[dict[str, Any]] = _poll(port, "/metrics/targets", listed,
                                         f"/metrics/targets on port {port}: not {n} groups", timeout_s, **kwargs)
    return groups


def _poll(port: int, path: str, ok: Any, what: str, timeout_s: float, **kwargs: Any) -> Any:
    """GET ``path`` every 0.5 s until ``ok(code, body)``; its body, or an AssertionError saying
    ``what`` with the last answer."""
    deadline = time.monotonic() + timeout_s
    body: Any = None
    while time.monotonic() < deadline:
        code, body = call(port, "GET", path, **kwargs)
        if ok(code, body):
            return body
        time.sleep(0.5)
    raise AssertionError(f"{what} in {timeout_s} s, last: {body}")


def task_states(status: dict[str, Any]) -> list[str]:
    return [t["state"] for t in status["tasks"]]


def make_certs(directory: Path, password: str = "store-pw") -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 (PEM files, a PKCS12 and a JKS keystore of it)
    and a client certificate signed by the CA (PEM), made with openssl and keytool."""
    directory.mkdir(parents=True, exist_ok=True)
    d = {name: directory / name for name in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem",
                                              "server.p12", "server.jks", "client.key", "client.csr",
                                              "client.pem", "ext.cnf")}

    def run(*args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, cwd=directory)

    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=it-ca",
        "-keyout", str(d["ca.key"]), "-out", str(d["ca.pem"]))
    d["ext.cnf"].write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who in ("server", "client"):
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=it-{who}",
            "-keyout", str(d[f"{who}.key"]), "-out", str(d[f"{who}.csr"]))
        run("openssl", "x509", "-req", "-in", str(d[f"{who}.csr"]), "-CA", str(d["ca.pem"]), "-CAkey",
            str(d["ca.key"]), "-CAcreateserial", "-days", "2", "-extfile", str(d["ext.cnf"]),
            "-out", str(d[f"{who}.pem"]))
    run("openssl", "pkcs12", "-export", "-in", str(d["server.pem"]), "-inkey", str(d["server.key"]),
        "-certfile", str(d["ca.pem"]), "-name", "server", "-passout", f"pass:{password}", "-out", str(d["server.p12"]))
    run("keytool", "-importkeystore", "-srckeystore", str(d["server.p12"]), "-srcstoretype", "PKCS12",
        "-srcstorepass", password, "-destkeystore", str(d["server.jks"]), "-deststoretype", "JKS",
        "-deststorepass", password, "-noprompt")
    return d


def client_context(certs: dict[str, Path], *, with_cert: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs["ca.pem"]))
    if with_cert:
        context.load_cert_chain(str(certs["client.pem"]), str(certs["client.key"]))
    return context


def non_loopback_addresses() -> list[str]:
    """This machine's IPv4 addresses outside 127.0.0.0/8 (``hostname -I``)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return [a for a in out if "." in a and not a.startswith("127.")]
